#include "device/communicators.h"

#include <algorithm>
#include <string>

#include <fmt/core.h>

#include "core/units.h"

namespace memsim::device {
namespace {

// NVIDIA/nccl constants (src/include/device.h, src/include/comm.h, src/init.cc).
constexpr Bytes kSteps = 8;                                   // NCCL_STEPS
constexpr Bytes kLlBytes = 8 * 512 * kSteps * 16;             // LL lines × threads × steps × line
constexpr Bytes kLl128Bytes = 120 * 640 * kSteps * 8;         // LL128 elements × threads × steps × 8 B
constexpr Bytes kConnHeaderBytes = 4096;                      // ncclSendMem / ncclRecvMem (MEM_ALIGN)
constexpr Bytes kIpcAlign = Bytes{2} << 20;                   // CUDA_IPC_MIN
constexpr Bytes kSharedSteps = 16;                            // NCCL_SHARED_STEPS (transport/net.cc)
constexpr Bytes kNvlChunk = Bytes{512} << 10;                 // NCCL_P2P_NVL_CHUNKSIZE
constexpr Bytes kPciChunk = Bytes{128} << 10;                 // NCCL_P2P_PCI_CHUNKSIZE
constexpr Bytes kNvlsMemAlign = Bytes{2} << 20;               // NVLS_MEM_ALIGN_SIZE
constexpr int kMaxP2pChannels = 32;                           // MAXCHANNELS

int NextPow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Distinct peer connections of one rank on one channel (ring + chain tree).
struct Connections {
  int sends = 0;
  int recvs = 0;
};

Connections ConnectionsOf(int ranks, NcclRankPosition position) {
  if (ranks <= 1) return {};
  if (ranks == 2) return {1, 1};  // ring and tree reach the same peer: shared connections
  return position == NcclRankPosition::kRoot ? Connections{1, 2} : Connections{2, 2};
}

}  // namespace

Bytes NcclSendConnectionBytes(const config::NcclTopology& t, Bytes buffsize) {
  return RoundUp(kConnHeaderBytes + (t.p2p_read ? buffsize : 0), kIpcAlign);
}

Bytes NcclRecvConnectionBytes(const config::NcclTopology& t, Bytes buffsize) {
  return RoundUp(kConnHeaderBytes + kLlBytes + kLl128Bytes + (t.p2p_read ? 0 : buffsize), kIpcAlign);
}

Bytes NcclProxySharedBytes(const config::NcclTopology& t) {
  const int p2p_channels = NextPow2(std::min(t.coll_channels, kMaxP2pChannels));
  return p2p_channels * kSharedSteps * (t.all_nvlink ? kNvlChunk : kPciChunk);
}

Bytes NcclCommunicatorBytes(const config::NcclTopology& t, Bytes buffsize, int ranks,
                            NcclRankPosition position) {
  if (ranks <= 1) return 0;
  const Connections c = ConnectionsOf(ranks, position);
  const Bytes per_channel = c.sends * NcclSendConnectionBytes(t, buffsize) +
                            c.recvs * NcclRecvConnectionBytes(t, buffsize);
  Bytes total = t.coll_channels * per_channel + NcclProxySharedBytes(t);
  if (ranks > 2) total += t.nvls_channels * 2 * (buffsize + kNvlsMemAlign);
  return total;
}

Bytes HcclCommunicatorBytes(Bytes buffsize) { return 2 * buffsize; }

Bytes CommunicatorBytes(const config::DevicePreset& device, const config::JobEnvironment& env,
                        std::string_view group, int ranks) {
  if (ranks <= 1) return 0;
  if (device.allocator_backend == alloc::Backend::kNpu) {
    const auto it = env.hccl_group_buffer.find(std::string(group));
    return HcclCommunicatorBytes(it != env.hccl_group_buffer.end() ? it->second : env.hccl_buffsize);
  }
  if (device.nccl.coll_channels == 0) return device.communicator_buffer_bytes;
  config::NcclTopology t = device.nccl;
  if (!env.nccl_nvls_enable) t.nvls_channels = 0;
  return NcclCommunicatorBytes(t, env.nccl_buffsize, ranks);
}

Bytes ContextBytes(const config::Setup& setup) {
  if (setup.training.env.cuda_module_loading_eager && setup.device.context_eager_bytes > 0) {
    return setup.device.context_eager_bytes;
  }
  return setup.device.context_bytes;
}

Bytes UserbufferBytes(const config::Setup& setup) {
  const config::TrainingConfig& c = setup.training;
  if (!c.tp_comm_overlap || c.tensor_model_parallel_size <= 1) return 0;
  constexpr Bytes kBuffers = 10;  // qkv/proj/fc1/fc2 fprop and dgrad, qkv/fc1 wgrad (bulk)
  constexpr Bytes kBf16 = 2;
  return kBuffers * Bytes{c.seq_length} * c.micro_batch_size * setup.model.hidden_size * kBf16;
}

std::vector<std::string> DescribeOutsideAllocator(const config::Setup& setup,
                                                  const std::map<std::string, int>& groups) {
  const auto mib = [](Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); };
  const config::DevicePreset& d = setup.device;
  const config::JobEnvironment& env = setup.training.env;
  std::vector<std::string> out;
  const bool eager = env.cuda_module_loading_eager && d.context_eager_bytes > 0;
  out.push_back(fmt::format("runtime context {:.0f} MiB ({})", mib(ContextBytes(setup)),
                            d.allocator_backend == alloc::Backend::kNpu ? "per-process residual"
                            : eager ? "CUDA_MODULE_LOADING=EAGER"
                                    : "lazy module loading"));
  for (const auto& [group, ranks] : groups) {
    const Bytes bytes = CommunicatorBytes(d, env, group, ranks);
    if (bytes == 0) continue;
    std::string how;
    if (d.allocator_backend == alloc::Backend::kNpu) {
      how = fmt::format("HCCL: 2 × buffer of {:.0f} MiB", mib(bytes / 2));
    } else if (d.nccl.coll_channels == 0) {
      how = "the preset's communicator_buffer_bytes";
    } else {
      const Connections c = ConnectionsOf(ranks, NcclRankPosition::kInside);
      how = fmt::format(
          "NCCL: {} channels × ({} send × {:.0f} + {} receive × {:.0f} MiB) + proxy P2P buffer "
          "{:.0f} MiB{}, NCCL_BUFFSIZE {:.0f} MiB",
          d.nccl.coll_channels, c.sends, mib(NcclSendConnectionBytes(d.nccl, env.nccl_buffsize)),
          c.recvs, mib(NcclRecvConnectionBytes(d.nccl, env.nccl_buffsize)),
          mib(NcclProxySharedBytes(d.nccl)),
          ranks > 2 && env.nccl_nvls_enable && d.nccl.nvls_channels > 0 ? " + NVLS buffers" : "",
          mib(env.nccl_buffsize));
    }
    out.push_back(fmt::format("communicator \"{}\" of {} ranks {:.0f} MiB ({})", group, ranks,
                              mib(bytes), how));
  }
  if (const Bytes ub = UserbufferBytes(setup); ub > 0) {
    out.push_back(fmt::format("Transformer Engine userbuffers (--tp-comm-overlap) {:.0f} MiB "
                              "(10 × [s·b, h] bf16)",
                              mib(ub)));
  }
  return out;
}

}  // namespace memsim::device
