#include "workload/emitter.h"

#include <algorithm>

#include "core/check.h"

namespace memsim::workload {
namespace {

// Duration model (emitter.h): estimates of achieved efficiency and link bandwidths.
constexpr double kComputeEfficiency = 0.5;     // estimate: typical large-GEMM MFU
constexpr double kBandwidthEfficiency = 0.8;   // estimate: streaming kernels
constexpr double kTpLinkBytesPerS = 100e9;     // estimate: intra-node NVLink / HCCS class
constexpr double kOtherLinkBytesPerS = 20e9;   // estimate: inter-node RDMA class
constexpr double kCollectiveLatencyUs = 10.0;  // estimate
constexpr double kFallbackFlops = 100e12;      // estimate when the preset has no peak
constexpr double kFallbackBandwidth = 1e12;    // estimate when the preset has no bandwidth
constexpr double kMinOpUs = 1.0;               // kernel-launch granularity (estimate)

}  // namespace

Emitter::Emitter(const config::Setup& setup, int pipeline_rank, int num_iterations,
                 OpSink* sink)
    : sink_(sink) {
  program_.pipeline_rank = pipeline_rank;
  program_.num_iterations = num_iterations;
  const config::DevicePreset& dev = setup.device;
  const config::Precision precision = setup.training.precision;
  const double peak = precision == config::Precision::kFp32   ? dev.peak_flops_fp32
                      : precision == config::Precision::kFp16 ? dev.peak_flops_fp16
                                                              : dev.peak_flops_bf16;
  peak_flops_ = peak > 0 ? peak : dev.peak_flops_bf16 > 0 ? dev.peak_flops_bf16 : kFallbackFlops;
  bandwidth_ =
      dev.memory_bandwidth_bytes_per_s > 0 ? dev.memory_bandwidth_bytes_per_s : kFallbackBandwidth;
}

void Emitter::SetContext(int iteration, Phase phase, int micro_batch) {
  iteration_ = iteration;
  phase_ = phase;
  micro_batch_ = micro_batch;
}

void Emitter::Begin(std::string_view name, int layer, int stream) {
  FinishOp();
  Op op = sink_ != nullptr ? sink_->TakeSpareOp() : Op{};
  op.name.assign(prefix_).append(name);
  op.iteration = iteration_;
  op.phase = phase_;
  op.micro_batch = micro_batch_;
  op.layer = layer;
  op.stream = stream;
  program_.ops.push_back(std::move(op));
  open_ = true;
  flops_ = 0;
  extra_bytes_ = 0;
  comm_us_ = 0;
}

Op& Emitter::Cur() {
  MEMSIM_CHECK(!program_.ops.empty());
  return program_.ops.back();
}

void Emitter::FinishOp() {
  if (!open_) return;
  Op& op = Cur();
  double bytes = extra_bytes_;
  for (const TensorAlloc& a : op.allocs) bytes += static_cast<double>(a.size_bytes);
  for (TensorId id : op.frees) bytes += static_cast<double>(SizeOf(id));
  const double compute_us = flops_ / (peak_flops_ * kComputeEfficiency) * 1e6;
  const double memory_us = bytes / (bandwidth_ * kBandwidthEfficiency) * 1e6;
  op.duration_us = std::max(kMinOpUs, std::max(compute_us, memory_us) + comm_us_);
  open_ = false;
  for (TensorId id : op.frees) sizes_.Erase(id);
  if (sink_ != nullptr) {
    sink_->OnOp(std::move(op));
    program_.ops.pop_back();
  }
}

TensorId Emitter::Alloc(Bytes size_bytes, Category category, std::string label) {
  MEMSIM_CHECK(open_ && size_bytes >= 0);
  const TensorId id = next_id_++;
  sizes_.Insert(id, size_bytes);
  Cur().allocs.push_back({id, size_bytes, category, std::move(label)});
  return id;
}

void Emitter::Free(TensorId id) {
  if (id == 0) return;
  MEMSIM_CHECK(open_);
  Cur().frees.push_back(id);
}

void Emitter::Ref(TensorId id) {
  if (id != 0) ++refs_[id];
}

void Emitter::Unref(TensorId id) {
  if (id == 0) return;
  auto it = refs_.find(id);
  MEMSIM_CHECK(it != refs_.end() && it->second > 0);
  if (--it->second == 0) {
    refs_.erase(it);
    Free(id);
  }
}

int Emitter::Refs(TensorId id) const {
  auto it = refs_.find(id);
  return it == refs_.end() ? 0 : it->second;
}

void Emitter::RecordStream(TensorId id, int stream) {
  Cur().record_streams.emplace_back(id, stream);
}

void Emitter::Collective(CommGroup group, int size, double message_bytes, Coll kind) {
  if (size <= 1) return;
  Op& op = Cur();
  if (op.collective_group.empty()) {
    op.collective_group = CommGroupName(group);
    op.collective_ranks = size;
  }
  const double n = size;
  const double factor = kind == Coll::kAllReduce ? 2 * (n - 1) / n
                        : kind == Coll::kGather  ? (n - 1) / n
                                                 : 1.0;
  const double link = group == CommGroup::kTp ? kTpLinkBytesPerS : kOtherLinkBytesPerS;
  comm_us_ += kCollectiveLatencyUs + message_bytes * factor / link * 1e6;
}

Program Emitter::Finish() {
  FinishOp();
  return std::move(program_);
}

}  // namespace memsim::workload
