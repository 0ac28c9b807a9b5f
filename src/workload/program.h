// Program: the allocation stream of one rank as plain data (docs/architecture.md). The
// generator (workload/build.h) decides all policy; the engine only replays. Ops are in issue
// order. Each op, at its start, records `record_streams` and allocates `allocs` in order on
// its stream; at its end it frees `frees` in order. An op on the communication stream runs
// concurrently with compute ops issued after it; an op with `synchronize` starts only when
// every stream is idle. Tensors are referred to by id, never by pointer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/categories.h"
#include "core/units.h"

namespace memsim::workload {

using TensorId = std::uint64_t;

inline constexpr int kComputeStream = 0;
inline constexpr int kCommStream = 1;

struct TensorAlloc {
  TensorId id = 0;       // unique within a Program
  Bytes size_bytes = 0;  // the request as the framework makes it (before any rounding)
  Category category = Category::kOther;
  std::string
      label;  // e.g. "layer3.attn.qkv_out" (docs/training-memory.md, 'Saved tensors of a layer')
  bool operator==(const TensorAlloc&) const = default;
};

struct Op {
  std::string name;   // e.g. "fwd.layer3.attn"
  int iteration = 0;  // 0 = init, 1..train_iters = training iterations
  Phase phase = Phase::kInit;
  int micro_batch = -1;  // -1 = not inside a micro-batch
  int layer = -1;        // global transformer-layer index, -1 = none
  int stream = kComputeStream;
  double duration_us = 0.0;         // estimated from FLOPs and bytes moved (device preset)
  std::vector<TensorAlloc> allocs;  // at op start, in order
  std::vector<TensorId> frees;      // at op end, in order
  std::vector<std::pair<TensorId, int>> record_streams;  // (tensor, other stream), at op start
  // Non-empty for a collective: the communicator group by memsim's name ("dp", "tp", "pp", "cp",
  // "embd", ...; core/comm_group.h).
  // The first collective of each group creates its communicator (device-level buffers).
  std::string collective_group;
  int collective_ranks = 0;  // the group's size (ranks of its communicator)
  bool synchronize = false;  // wait for all streams before starting
  bool empty_cache = false;  // torch.cuda.empty_cache() after the op
  // CUDA unified memory (cudaMallocManaged) this op adds at its start, outside the caching
  // allocator: bitsandbytes' paged optimizer state (workload/optimizer.h BnbStateBytes). Not in
  // allocated or reserved; nvidia-smi counts its pages while they are resident on the device
  // (device/device_model.h).
  Bytes managed_bytes = 0;
  bool operator==(const Op&) const = default;

  // Back to a default Op, keeping the capacity of its strings and vectors, so that a spent op
  // can carry the next one without new heap blocks (OpSink::TakeSpareOp).
  // Every field is reset here (tests/workload/program_test.cc sets each and checks).
  void Clear() {
    name.clear();
    iteration = 0;
    phase = Phase::kInit;
    micro_batch = -1;
    layer = -1;
    stream = kComputeStream;
    duration_us = 0.0;
    allocs.clear();
    frees.clear();
    record_streams.clear();
    collective_group.clear();
    collective_ranks = 0;
    synchronize = false;
    empty_cache = false;
    managed_bytes = 0;
  }
};

// Where a generator hands its ops, one at a time in issue order (the engine's Simulation, or a
// Program being collected).
class OpSink {
 public:
  virtual ~OpSink() = default;
  virtual void OnOp(Op&& op) = 0;
  // An empty Op (equal to Op{}) for the generator to fill: one the sink is done with, cleared
  // (Op::Clear), when it has one, so that its buffers are reused.
  virtual Op TakeSpareOp() { return Op{}; }
};

struct Program {
  int pipeline_rank = 0;
  int num_iterations = 0;
  std::vector<Op> ops;
  bool operator==(const Program&) const = default;
};

}  // namespace memsim::workload
