// Emitter: the only writer of a Program (program.h). Every other part of workload/ describes
// what the framework does by calling it: Begin an op, Alloc and Free tensors in it, record a
// collective or a stream use, add FLOPs or bytes moved. It also owns the duration model (a
// roofline estimate per op) and the reference counts of tensors that several Python names keep
// alive. It decides no policy: which tensors exist and when they die is the callers' business.
//
// Units: sizes in bytes, durations in microseconds. Tensor ids start at 1; 0 means "none" and
// is ignored by Free, Ref and Unref. Ops carry the context set with SetContext (iteration,
// phase, micro-batch) and the current name prefix ("recompute." inside a recompute).
//
// Duration of an op: max(flops / (peak · 0.5), bytes / (bandwidth · 0.8)) + collective time,
// at least 1 us; bytes are the op's allocations and frees plus MovedBytes. A collective takes
// 10 us plus its bus bytes over an estimated link bandwidth (TP 100 GB/s, other groups
// 20 GB/s), with NCCL's bus-bandwidth factors (all-reduce 2(n-1)/n, all-gather and
// reduce-scatter (n-1)/n, point-to-point 1; NCCL docs "Performance reported by NCCL tests").
// 0.5, 0.8, the link bandwidths, the 10 us and the 1 us floor are estimates, not measurements:
// durations shape the x-axis of the curves only, never memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "config/setup.h"
#include "core/check.h"
#include "core/comm_group.h"
#include "core/id_table.h"
#include "core/units.h"
#include "workload/program.h"

namespace memsim::workload {

// Kinds of collective, for the bus-bandwidth factor.
enum class Coll { kAllReduce, kGather, kP2P };

class Emitter {
 public:
  // Peak FLOP/s for the setup's precision and memory bandwidth come from the device preset
  // (with estimated fallbacks when a preset leaves them 0). With a `sink`, each op is handed to
  // it when it closes and not kept (memory does not grow with the ops emitted); without, the
  // ops are collected into the Program Finish returns. The sink must outlive the Emitter.
  Emitter(const config::Setup& setup, int pipeline_rank, int num_iterations,
          OpSink* sink = nullptr);

  // The context stamped on ops begun from now on.
  void SetContext(int iteration, Phase phase, int micro_batch);
  void SetPhase(Phase phase) { phase_ = phase; }
  void SetMicroBatch(int micro_batch) { micro_batch_ = micro_batch; }
  int iteration() const { return iteration_; }
  // The phase of the ops begun from now on (Phase::kBackward in a recompute's re-forward).
  Phase phase() const { return phase_; }
  // A prefix for op names ("recompute."); "" for none.
  void SetPrefix(std::string prefix) { prefix_ = std::move(prefix); }

  // Closes the open op (fixing its duration) and opens a new one.
  void Begin(std::string_view name, int layer = -1, int stream = kComputeStream);
  // The open op. REQUIRES: an op was begun.
  Op& Cur();

  // A new tensor allocated at the start of the open op. REQUIRES: an open op, size_bytes >= 0.
  TensorId Alloc(Bytes size_bytes, Category category, std::string label);
  // Frees `id` at the end of the open op (0: nothing).
  void Free(TensorId id);
  // Shared ownership: each holder takes a reference; the last Unref frees the tensor in the
  // open op. REQUIRES for Unref: the tensor holds a reference.
  void Ref(TensorId id);
  void Unref(TensorId id);
  // Holders of a referenced tensor (0 if none); tensors with references outstanding.
  int Refs(TensorId id) const;
  std::size_t ReferencedTensors() const { return refs_.size(); }
  // REQUIRES: `id` allocated and not freed by an op closed before.
  Bytes SizeOf(TensorId id) const {
    const Bytes* size = sizes_.Find(id);
    MEMSIM_CHECK(size != nullptr);
    return *size;
  }

  void Flops(double flops) { flops_ += flops; }
  void MovedBytes(double bytes) { extra_bytes_ += bytes; }
  void RecordStream(TensorId id, int stream);
  // A collective of `message_bytes` on `group` of `size` ranks, in the open op; the op records
  // the group by its name (core/comm_group.h). Groups of one rank create no communicator and are
  // skipped.
  void Collective(CommGroup group, int size, double message_bytes, Coll kind);
  void Synchronize() { Cur().synchronize = true; }
  void EmptyCache() { Cur().empty_cache = true; }
  // `size_bytes` of CUDA unified memory allocated at the start of the open op, outside the
  // caching allocator (Op::managed_bytes); never freed before the process ends.
  void Managed(Bytes size_bytes) { Cur().managed_bytes += size_bytes; }

  // Closes the open op and hands over the Program (without ops when they went to a sink).
  Program Finish();

 private:
  void FinishOp();

  Program program_;  // with a sink: at most the open op
  OpSink* sink_ = nullptr;
  // Sizes of the tensors not freed by a closed op (lookup only; bounded by the live tensors).
  IdTable<Bytes> sizes_;
  TensorId next_id_ = 1;
  std::map<TensorId, int> refs_;  // holders of the tensors managed by Ref/Unref
  double peak_flops_ = 0, bandwidth_ = 0;
  int iteration_ = 0;
  Phase phase_ = Phase::kInit;
  int micro_batch_ = -1;
  std::string prefix_;
  bool open_ = false;
  double flops_ = 0, extra_bytes_ = 0, comm_us_ = 0;
};

}  // namespace memsim::workload
