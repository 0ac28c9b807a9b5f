// What the file exports (exports.h) need beyond the Timeline of `memsim run`: the bytes of every
// category at each sample, every op as a slice of time on its stream, and the allocator's own
// events (alloc::TraceEvent) tagged with the op and tensor that caused them. Collected by
// simulating one pipeline stage once more with an observer of its own (as `explain` does), so
// the engine and RunAllStages stay as they are; the simulation is deterministic, so the numbers
// are those of the run. Times in µs from the start of the run, bytes as int64.
#pragma once

#include <string>
#include <vector>

#include "alloc/allocator.h"
#include "config/setup.h"
#include "core/categories.h"
#include "engine/simulator.h"
#include "engine/stages.h"
#include "timeline/span_summary.h"
#include "timeline/timeline.h"

namespace memsim::exports {

// One sample of the Timeline (same rule: after an op's allocations, after its frees) with the
// allocated bytes split by category (they sum to allocated_bytes).
struct CategorySample {
  SimTimeUs time_us = 0;
  int iteration = 0;
  Phase phase = Phase::kInit;
  Bytes allocated_bytes = 0;
  Bytes reserved_bytes = 0;
  Bytes active_bytes = 0;
  Bytes device_bytes = 0;
  CategoryBytes by_category{};
};

// One op of the Program: [start_us, end_us] on its stream (workload::kComputeStream or
// kCommStream).
struct OpSlice {
  std::string name;
  int stream = 0;
  SimTimeUs start_us = 0;
  SimTimeUs end_us = 0;
  int iteration = 0;
  Phase phase = Phase::kInit;
  int micro_batch = -1;
};

// An allocator event at the time of the op boundary it belongs to; `op` indexes
// RunDetail::ops (-1: none), `tensor` names the tensor whose malloc or free caused it ("" for
// segment events and for frees the allocator completes later).
struct AllocatorEvent {
  alloc::TraceEvent event;
  SimTimeUs time_us = 0;
  int op = -1;
  std::string tensor;
  Category category = Category::kOther;
};

struct RunDetail {
  int pipeline_rank = 0;
  alloc::Backend backend = alloc::Backend::kCuda;
  std::vector<CategorySample> samples;
  std::vector<OpSlice> ops;  // in the order they started
  std::vector<AllocatorEvent> allocator_events;  // empty unless asked for
  std::vector<timeline::Marker> markers;         // init, iterations, phases (engine::Recorder)
  std::vector<timeline::SpanSummary> spans;
};

// Receives every CategorySample as the simulation produces it (`run --csv`, streamed to its
// file instead of held).
class CategorySampleSink {
 public:
  virtual ~CategorySampleSink() = default;
  virtual void OnSample(const CategorySample& sample) = 0;
};

struct DetailOptions {
  bool allocator_events = false;  // the snapshot export needs them; they cost memory
  bool keep_samples = true;       // RunDetail::samples (false: only `sample_sink` sees them)
  bool keep_ops = true;           // RunDetail::ops (always kept with allocator_events)
  CategorySampleSink* sample_sink = nullptr;  // not owned; null: none
  engine::SimulateOptions simulate;
};

// Simulates pipeline stage `pipeline_rank` of `setup` once more and keeps its detail.
// REQUIRES: 0 <= pipeline_rank < setup.training.pipeline_model_parallel_size.
RunDetail CollectRunDetail(const config::Setup& setup, int pipeline_rank,
                           const DetailOptions& options);

// Every stage of `run` (by pipeline rank), without allocator events: what the HTML report's
// stage selector shows. Over the iterations `run` simulated (engine::SimulatedSetup), not the
// whole train_iters of a long run.
std::vector<RunDetail> CollectStageDetails(const config::Setup& setup,
                                           const engine::RunResult& run);

// A RunDetail holding only the curves of `timeline` (a saved `run --csv`, read back by
// `compare --simulated`): no categories, ops or spans; unknown values as 0.
RunDetail DetailFromTimeline(const timeline::Timeline& timeline);

}  // namespace memsim::exports
