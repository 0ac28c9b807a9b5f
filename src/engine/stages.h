// Runs the engine once per pipeline stage (docs/interfaces.md, 'Command line') and
// picks the stage the report shows: the one with the highest peak device bytes, or the one the
// user names (--pipeline-rank). Used by `run`, `check` and `compare`.
#pragma once

#include <optional>
#include <vector>

#include "config/setup.h"
#include "engine/simulator.h"
#include "timeline/recorder.h"
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

  // The span of `iteration` (0 = init), or nullptr.
  const timeline::SpanSummary* Span(int iteration) const;
};

struct StagedOomEvent {
  int pipeline_rank = 0;
  OomEvent oom;
};

struct RunResult {
  std::vector<StageResult> stages;  // by pipeline rank
  int reported_stage = 0;
  bool reported_stage_chosen = false;  // by --pipeline-rank, not as the worst
  Bytes usable_memory_bytes = 0;       // the device preset's, or --capacity
  timeline::Timeline timeline;      // of the reported stage (empty unless keep_timeline)
  std::optional<StagedOomEvent> first_oom;  // earliest in time over all stages (lowest rank on ties)

  const StageResult& Reported() const { return stages[reported_stage]; }
};

struct RunOptions {
  std::optional<int> pipeline_rank;  // REQUIRES: in [0, pipeline_model_parallel_size)
  std::optional<Bytes> usable_memory_bytes;  // --capacity
  bool keep_timeline = true;
};

RunResult RunAllStages(const config::Setup& setup, const RunOptions& options);

}  // namespace memsim::engine
