// The discrete-event engine (docs/architecture.md, engine/): replays a Program through an Allocator
// and a DeviceModel over two streams (compute, communication) on a simulated clock, and notifies an
// Observer. It never reads the wall clock and never prints.
//
// Timing rules (memsim's own; the real overlap depends on kernels and the network):
// - compute ops run back to back in issue order;
// - a communication op is issued when the compute op before it (in issue order) ends, and
//   starts when it is issued and the communication stream is free;
// - an op with `synchronize` starts when every stream is idle.
// Each op becomes two events, start (record_streams, then allocs in order) and end (frees in
// order), processed in (time, sequence) order, sequence = issue order.
// Streaming (docs/architecture.md, engine/): ops are issued one at a time (Simulation::Issue) and
// kept only until their end event is processed; every event of op i is at or after the compute
// stream's free time when i is issued (that time never decreases), so the events at or before it
// can be processed before op i's own: the order is the one of sorting all events of the Program.
// Stream events (docs/allocator-rules.md, 'Convention: stream events'): when a stream becomes idle,
// every event recorded on it so far is complete (Allocator::CompleteStream). A collective issued on
// the compute stream (a blocking P2P) waits for its own communication, so the communication stream
// is also idle at its end when no communication-stream op is still running.
// Out of memory (docs/interfaces.md, 'Capacity and out of memory'): the allocator's capacity is the
// usable memory minus the device's outside-allocator bytes at that moment. The first malloc that
// still fails after the allocator's out-of-memory path is reported once (OnOom); the simulation
// then continues with an unbounded device, so the report still shows what the job would need.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "alloc/allocator.h"
#include "config/setup.h"
#include "core/categories.h"
#include "core/units.h"
#include "workload/program.h"

namespace memsim::engine {

// The state after an op boundary (its allocations at start, or its frees at end).
struct OpBoundary {
  SimTimeUs time_us = 0;
  const workload::Op* op = nullptr;  // valid during the callback only
  bool at_start = true;
  Bytes allocated_bytes = 0;
  Bytes reserved_bytes = 0;
  Bytes active_bytes = 0;
  Bytes device_bytes = 0;
  // Allocated bytes (block sizes, so they sum to allocated_bytes) by tensor category.
  const CategoryBytes* allocated_by_category = nullptr;
};

struct OomEvent {
  SimTimeUs time_us = 0;
  int iteration = 0;
  Phase phase = Phase::kInit;
  std::string op_name;
  std::string tensor_label;
  Bytes request_bytes = 0;
  Bytes allocated_bytes = 0;  // at the failed request
  Bytes reserved_bytes = 0;
  Bytes usable_memory_bytes = 0;
  Bytes capacity_bytes = 0;   // what the allocator could reserve then (usable − outside)
  bool operator==(const OomEvent&) const = default;
};

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void OnOpBoundary(const OpBoundary& boundary) = 0;
  // A communicator was created by the first collective of `group`.
  virtual void OnCommunicatorCreated(SimTimeUs /*time_us*/, const std::string& /*group*/) {}
  virtual void OnOom(const OomEvent& /*oom*/) {}
  // `tensor` got a block of `block_bytes` (the increase of allocated bytes: the request rounded
  // and padded, plus any remainder the allocator did not split off).
  virtual void OnTensorAllocated(const workload::Op& /*op*/, const workload::TensorAlloc& /*tensor*/,
                                 Bytes /*block_bytes*/) {}
  // Where the allocator's own events go (segments, blocks, frees; alloc::TraceEvent), asked once
  // before the run; nullptr (default) records none. Events of an op arrive before its
  // OnTensorAllocated / OnOpBoundary calls.
  virtual alloc::TraceSink* AllocatorTraceSink() { return nullptr; }
};

struct SimulateOptions {
  // Replaces the device preset's usable_memory_bytes (`--capacity`).
  std::optional<Bytes> usable_memory_bytes;
  // Keep the engine's state at the start of every iteration (SimulateResult::iteration_states).
  bool record_iteration_states = false;
  // Called every kProgressEvents events with the fraction of the iterations begun (0 to 1);
  // empty = never.
  std::function<void(double)> progress;
};
inline constexpr std::size_t kProgressEvents = std::size_t{1} << 16;

// The engine's state just before an iteration's first op starts, in a form that compares equal
// exactly when the rest of the run would behave alike given alike ops (alloc::Allocator's
// CanonicalState, the places of the live tensors in the order of their ids, the bytes outside
// the allocator, the out-of-memory mode). Iterations k and k + 1 of a Program whose iterations
// repeat are identical, and so are all after them, iff the states at their starts are equal.
using EngineState = std::vector<std::int64_t>;

struct SimulateResult {
  alloc::AllocatorStats allocator_stats;  // at the end of the run
  std::optional<OomEvent> first_oom;
  SimTimeUs end_time_us = 0;
  int num_communicators = 0;
  Bytes outside_allocator_bytes = 0;      // at the end: context + communicator buffers
  // With record_iteration_states: [k] = the state at the start of iteration k (k >= 1; [0] is
  // empty), and one more entry, the state after the last op.
  std::vector<EngineState> iteration_states;
};

// Replays `program` for the device and allocator options of `setup`. Deterministic.
SimulateResult Simulate(const workload::Program& program, const config::Setup& setup,
                        const SimulateOptions& options, Observer& observer);

// The same replay fed one op at a time, in issue order, so that a Program need not be held
// whole: memory holds the ops whose end event is still ahead, not the run. Issuing the ops of a
// Program one by one and then calling Finish gives what Simulate gives, callback for callback.
// `setup`, `options` and `observer` must outlive the Simulation.
class Simulation final : public workload::OpSink {
 public:
  Simulation(const config::Setup& setup, const SimulateOptions& options, Observer& observer);
  ~Simulation() override;
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  // The next op in issue order. REQUIRES: Finish not called yet.
  void OnOp(workload::Op&& op) override;
  workload::Op TakeSpareOp() override;
  // Processes the remaining events. REQUIRES: called once.
  SimulateResult Finish();

 private:
  class Engine;
  std::unique_ptr<Engine> engine_;
};

}  // namespace memsim::engine
