// Memory outside the caching allocator, mechanism by mechanism (issue 19): NCCL and HCCL
// communicator buffers, the CUDA context by module-loading mode, and Transformer Engine's
// userbuffers for tensor-parallel communication overlap. Each size is derived from the
// parameters of the code that allocates it; docs/device-memory.md, 'Outside the allocator by
// mechanism', sets the results beside public measurements. Sizes in bytes.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::device {

// NVIDIA/nccl, the buffers one rank allocates for one communicator at init
// (init.cc initTransportsRank, connecting ring and tree on every collective channel, as NCCL does
// before runtime connection, 2.22):
//   - per channel and per distinct peer connection (transport/p2p.cc p2pSendSetup /
//     p2pRecvSetup): the sender allocates struct ncclSendMem (one 4 KiB page, comm.h MEM_ALIGN),
//     plus the Simple buffer when P2P read is used; the receiver allocates struct ncclRecvMem plus
//     the LL, LL128 and (without read) Simple buffers; each rounded up to CUDA_IPC_MIN = 2 MiB
//     (comm.h). Buffer sizes (init.cc computeBuffSizes, device.h): Simple = NCCL_BUFFSIZE
//     (4 MiB default), LL = 8 lines × 512 threads × 8 steps × 16 B = 512 KiB, LL128 = 120 elements
//     × 640 threads × 8 steps × 8 B = 4,915,200 B. P2P read is chosen for NVLink between two
//     sm_80 GPUs (graph/paths.cc ncclTopoCheckP2p).
//   - connections per channel: ring (send to next, receive from previous) and the intra-node
//     chain tree (send and receive to parent and child); a connection to the same peer is shared
//     (transport.cc ncclTransportP2pConnect masks). A 2-rank communicator has 1 send + 1 receive;
//     with more ranks a rank inside the chain has 2 + 2, the chain's root 1 send + 2 receives.
//   - the proxy's shared P2P buffer (init.cc "Connect to local net proxy" → transport/net.cc
//     sharedNetBuffersInit, device memory): p2p channels × NCCL_SHARED_STEPS (16) × the P2P chunk
//     size, where p2p channels = next power of 2 of min(collective channels, 32)
//     (graph/paths.cc ncclTopoComputeP2pChannels) and the chunk is NCCL_P2P_NVL_CHUNKSIZE
//     (512 KiB) on an all-NVLink node, NCCL_P2P_PCI_CHUNKSIZE (128 KiB) otherwise (init.cc).
//   - NVLS (NVSwitch multicast, transport/nvls.cc ncclNvlsSetup, only with more than 2 GPUs):
//     nvls channels × 2 × (Simple buffer + NVLS_MEM_ALIGN_SIZE 2 MiB) per head; one head assumed.
// Not modelled: NCCL ≥ 2.22's runtime connection (only the algorithms used are connected, so the
// figure is an upper bound there), CollNet, send/recv-only P2P connections, the few small device
// structures per channel (each a 2 MiB granule under cuMem from 2.19).
enum class NcclRankPosition { kInside, kRoot };
Bytes NcclSendConnectionBytes(const config::NcclTopology& t, Bytes buffsize);
Bytes NcclRecvConnectionBytes(const config::NcclTopology& t, Bytes buffsize);
Bytes NcclProxySharedBytes(const config::NcclTopology& t);
Bytes NcclCommunicatorBytes(const config::NcclTopology& t, Bytes buffsize, int ranks,
                            NcclRankPosition position = NcclRankPosition::kInside);

// HCCL (Ascend CANN): a send and a receive buffer of HCCL_BUFFSIZE each per communicator
// (CANN environment-variable reference envref_07_0080), 200 MiB by default; MindSpeed
// --hccl-group-buffer ("dp:200;tp:300", MiB) sets one group's size
// (Ascend/MindSpeed docs/features/hccl-group-buffer-set.md).
Bytes HcclCommunicatorBytes(Bytes buffsize);

// The bytes of the communicator created at the first collective of `group` (`ranks` ranks) on
// `device` under the launch environment `env`: NCCL from the preset's topology when it has one, HCCL from HCCL_BUFFSIZE
// (or the group's --hccl-group-buffer) on an NPU preset, else the preset's flat
// communicator_buffer_bytes. 0 for a group of one rank (no communicator is made).
Bytes CommunicatorBytes(const config::DevicePreset& device, const config::JobEnvironment& env,
                        std::string_view group, int ranks);

// The CUDA context: context_bytes with lazy module loading (CUDA_MODULE_LOADING=LAZY, PyTorch's
// default since 1.13), context_eager_bytes with EAGER when the preset gives it.
Bytes ContextBytes(const config::Setup& setup);

// Transformer Engine userbuffers for --tp-comm-overlap (Megatron
// megatron/training/initialize.py _initialize_tp_communicators → transformer_engine/pytorch/
// module/base.py initialize_ub): one buffer per overlapped GEMM, registered outside PyTorch's
// allocator. Every buffer is [seq_length × micro_batch_size, hidden] (Megatron's input_shape),
// bf16; a reduce-scatter method (proj_fprop, fc2_fprop) or an all-gather one (qkv_fprop,
// fc1_fprop, proj_dgrad, fc2_dgrad) holds the full tensor, the bulk methods (qkv_dgrad,
// qkv_wgrad, fc1_dgrad, fc1_wgrad) likewise; 10 buffers in all. 0 without tp_comm_overlap or at
// TP 1.
Bytes UserbufferBytes(const config::Setup& setup);

// One line per mechanism for `memsim explain`: the context, each communicator of `groups`
// (name → ranks) with the parameters its size comes from, and the userbuffers when present.
std::vector<std::string> DescribeOutsideAllocator(const config::Setup& setup,
                                                  const std::map<std::string, int>& groups);

}  // namespace memsim::device
