#include "engine/stages.h"

#include "core/check.h"
#include "workload/build.h"

namespace memsim::engine {

const timeline::SpanSummary* StageResult::Span(int iteration) const {
  for (const timeline::SpanSummary& s : spans) {
    if (s.iteration == iteration) return &s;
  }
  return nullptr;
}

RunResult RunAllStages(const config::Setup& setup, const RunOptions& options) {
  const int p = setup.training.pipeline_model_parallel_size;
  MEMSIM_CHECK(p >= 1);
  MEMSIM_CHECK(!options.pipeline_rank || (*options.pipeline_rank >= 0 && *options.pipeline_rank < p));
  RunResult result;
  result.reported_stage_chosen = options.pipeline_rank.has_value();
  result.usable_memory_bytes = options.usable_memory_bytes.value_or(setup.device.usable_memory_bytes);
  SimulateOptions sim_options;
  sim_options.usable_memory_bytes = options.usable_memory_bytes;
  Bytes worst_device = -1;
  for (int r = 0; r < p; ++r) {
    const workload::Program program = workload::Build(setup, r);
    // Keep samples only for a stage that may be reported; the worst stage is only known after
    // all ran, so without --pipeline-rank keep the current worst (replaced when beaten).
    const bool keep = options.keep_timeline && (!options.pipeline_rank || *options.pipeline_rank == r);
    timeline::Recorder recorder(keep);
    StageResult stage;
    stage.pipeline_rank = r;
    stage.simulation = Simulate(program, setup, sim_options, recorder);
    recorder.Finish();
    stage.spans = recorder.spans();
    for (const timeline::SpanSummary& s : stage.spans) {
      if (s.peak_allocated_bytes > stage.peak_allocated_bytes) {
        stage.peak_allocated_bytes = s.peak_allocated_bytes;
        stage.by_category_at_peak = s.by_category_at_peak;
      }
      stage.peak_reserved_bytes = std::max(stage.peak_reserved_bytes, s.peak_reserved_bytes);
      stage.peak_device_bytes = std::max(stage.peak_device_bytes, s.peak_device_bytes);
    }
    if (stage.simulation.first_oom) {
      const OomEvent& oom = *stage.simulation.first_oom;
      if (!result.first_oom || oom.time_us < result.first_oom->oom.time_us) {
        result.first_oom = StagedOomEvent{r, oom};
      }
    }
    const bool chosen = options.pipeline_rank ? *options.pipeline_rank == r
                                              : stage.peak_device_bytes > worst_device;
    if (chosen) {
      result.reported_stage = r;
      worst_device = stage.peak_device_bytes;
      if (keep) result.timeline = recorder.TakeTimeline();
    }
    result.stages.push_back(std::move(stage));
  }
  return result;
}

}  // namespace memsim::engine
