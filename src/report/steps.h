// The run report over many steps of varying shape (data of varying sample lengths, config/setup.h
// SampleData; docs/config.md, 'Sample lengths'): the distribution of the per-step peaks (max,
// p99, median), the step where the peak happened and the lengths of its micro-batches, reserved
// memory's growth over the steps, and fragmentation -- reserved minus allocated -- at each step.
// Pure functions of the run's per-iteration summaries (timeline/span_summary.h) and of the
// deterministic micro-batch lengths (workload/batch_lengths.h); the CLI writes the text.
// Not reported: the allocator's inactive split bytes per step (only the run's end has them).
#pragma once

#include <string>
#include <vector>

#include "config/setup.h"
#include "engine/stages.h"

namespace memsim::report {

// The per-step facts of the reported stage, iterations 1..N.
struct StepStats {
  int steps = 0;
  Bytes max_peak_allocated = 0;
  int max_step = 0;                 // the first step with max_peak_allocated
  int max_micro_batch = -1;         // where in it allocated peaked (-1: outside a micro-batch)
  Bytes p99_peak_allocated = 0;     // nearest rank: the ceil(0.99·N)-th smallest
  Bytes median_peak_allocated = 0;  // nearest rank: the ceil(0.5·N)-th smallest
  Bytes max_peak_reserved = 0;
  int reserved_last_grew = 0;       // the last step whose reserved peak exceeded every earlier one
  // reserved − allocated: at each step's end (cached, unused between steps), and the peaks' gap
  // (peak reserved − peak allocated of a step).
  Bytes max_end_gap = 0;
  int max_end_gap_step = 0;
  Bytes last_end_gap = 0;
  Bytes max_peak_gap = 0;
  int max_peak_gap_step = 0;
};

// REQUIRES: run.Reported().spans holds init and iterations 1..N in order.
StepStats ComputeStepStats(const engine::RunResult& run);

// The nearest-rank percentile `pct` (0 < pct <= 100) of `values`: the ceil(pct/100 · N)-th
// smallest (1-based). REQUIRES: values non-empty.
Bytes NearestRankPercentile(std::vector<Bytes> values, double pct);

// A few lines: peaks over the steps, the peak step and its micro-batches' lengths, reserved
// growth at steps 1, 10, 100, 1000 and the last, fragmentation. "" unless the data's lengths vary.
std::string FormatSteps(const engine::RunResult& run, const config::Setup& setup);

// `run --steps-csv`: one row per step, "step,max_length,lengths,peak_allocated_bytes,
// peak_reserved_bytes,end_allocated_bytes,end_reserved_bytes,end_gap_bytes,peak_gap_bytes"
// (lengths: the micro-batches' padded lengths joined by ';'; max_length and lengths empty when
// the data's lengths do not vary).
std::string FormatStepsCsv(const engine::RunResult& run, const config::Setup& setup);

}  // namespace memsim::report
