// Runs the engine once per pipeline stage (docs/interfaces.md, 'Command line') and
// picks the stage the report shows: the one with the highest peak device bytes, or the one the
// user names (--pipeline-rank). Used by `run`, `check` and `compare`.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "config/setup.h"
#include "engine/recorder.h"
#include "engine/simulator.h"
#include "timeline/span_summary.h"
#include "timeline/timeline.h"

namespace memsim::engine {

struct StageResult {
  int pipeline_rank = 0;
  std::vector<timeline::SpanSummary> spans;  // init (iteration 0), then iterations 1..N
  SimulateResult simulation;
  Bytes peak_allocated_bytes = 0;  // over all spans
  Bytes peak_reserved_bytes = 0;
  Bytes peak_device_bytes = 0;
  CategoryBytes by_category_at_peak{};  // at the stage's allocated peak
  // A long run (fewer iterations simulated than train_iters): the first iteration k >=
  // config::FirstRepeatingIteration from which the stage repeats with the shortest period P
  // (1 to kMaxSteadyPeriod): the states (engine::EngineState) at the starts of k and k + P are
  // equal, and iterations k..k+P-1 and k+P..k+2P-1 were simulated and came out alike. P = 1:
  // identical consecutive iterations; P = 2: the allocator alternates between two block
  // layouts (seen under 1F1B on some pipeline stages). Absent when none.
  std::optional<int> steady_state_from;
  int steady_state_period = 1;

  // The span of `iteration` (0 = init), or nullptr.
  const timeline::SpanSummary* Span(int iteration) const;
};

// The longest repeating period StageResult::steady_state_from looks for.
inline constexpr int kMaxSteadyPeriod = 4;

struct StagedOomEvent {
  int pipeline_rank = 0;
  OomEvent oom;
};

struct RunResult {
  std::vector<StageResult> stages;  // by pipeline rank
  int reported_stage = 0;
  bool reported_stage_chosen = false;  // by --pipeline-rank, not as the worst
  bool reported_stage_default = false;  // compare's stage 0, --pipeline-rank not given
  Bytes usable_memory_bytes = 0;       // the device preset's, or --capacity
  timeline::Timeline timeline;      // of the reported stage (empty unless keep_timeline)
  std::optional<StagedOomEvent> first_oom;  // earliest in time over all stages (lowest rank on ties)
  int train_iters = 0;           // the Setup's
  int simulated_iterations = 0;  // train_iters, or fewer for a long run (config/iterations.h)
  // A long run: every stage repeats itself identically from this iteration on (the latest of
  // the stages' steady_state_from); absent when train_iters were all simulated, or when no
  // steady state showed within config::MaxSimulatedIterations.
  std::optional<int> steady_state_from;
  // Every stage repeats with a period dividing this (the least common multiple of the stages').
  int steady_state_period = 1;

  // Fewer iterations simulated than the run trains.
  bool IsLongRun() const { return simulated_iterations < train_iters; }

  const StageResult& Reported() const { return stages[reported_stage]; }
};

struct RunProgress {
  int stages = 1;
  int iterations = 0;      // simulated in this pass
  double stages_done = 0;  // in [0, stages]: the stages' parts done, summed (several run at once)
};

struct RunOptions {
  std::optional<int> pipeline_rank;  // REQUIRES: in [0, pipeline_model_parallel_size)
  std::optional<Bytes> usable_memory_bytes;  // --capacity
  bool keep_timeline = true;  // at bounded resolution (kMaxKeptSamples, engine/recorder.h)
  // Called now and then while stages are simulated (for a progress line); empty = never. Called
  // from the threads that simulate stages, never two calls at once.
  std::function<void(const RunProgress&)> progress;
  // Stages simulated at once, each on a thread of its own (core/parallel.h), merged in rank
  // order: 0 = one per CPU this process may use (AvailableCpus), 1 = one after another on the
  // calling thread. The result is the same whatever the number (the stages are independent
  // simulations); at most this many stages' kept curves wait in memory, besides the reported one.
  int threads = 0;
};

// Simulates every stage over init and train_iters iterations. A long run (train_iters above
// max(kMinSimulatedIterations, FirstRepeatingIteration + 1), config/iterations.h) simulates that
// many first and, while some stage has no steady state yet, twice as many (at most
// config::MaxSimulatedIterations), each time from the start. Exceptions of a stage's
// simulation (bad input found while generating its work) reach the caller as they would one stage
// after another: those of the lowest rank that throws.
RunResult RunAllStages(const config::Setup& setup, const RunOptions& options);

// `setup` with train_iters = run.simulated_iterations: what a second simulation of a stage of
// `run` (the exports, export/detail.h; `explain`, report/explain.h) replays, so that it covers
// the iterations `run` reported and no more. For a long run the later iterations repeat the
// steady state (docs/config.md, 'Long runs'); simulating all of them again would take time and
// memory growing with train_iters (a launch script's `--train-iters 2000` held the whole
// Program and every sample of 2000 iterations). RunAllStages simulates each pass the same way
// (train_iters set to the pass's iterations), so the iterations replayed are the run's.
config::Setup SimulatedSetup(const config::Setup& setup, const RunResult& run);

}  // namespace memsim::engine
