// The outputs of `memsim run` (docs/interfaces.md, 'JSON report'): the per-iteration table, the
// Megatron `report_memory` lines and the JSON report (schema_version 1). Pure functions from
// results to text; the CLI writes them. (`run --csv` is an export: export/exports.h.)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config/setup.h"
#include "engine/stages.h"
#include "report/format.h"
#include "timeline/span_summary.h"

namespace memsim::report {

// What the run report's "at ... peak vs ..." line compares for `span`, given the span before it:
// for an iteration after the first, the allocated split at the peak of the phase where `span`
// peaked, against the previous iteration's peak of that same phase (`against_previous`);
// otherwise (iteration 1 after init, or a phase the previous iteration lacks) the split at the
// span's peak against its own start. reserved_change_bytes: peak reserved against the previous
// span's peak reserved, or against the span's start.
struct PeakComparison {
  Phase phase = Phase::kInit;
  bool against_previous = false;
  CategoryBytes before{};
  CategoryBytes after{};
  Bytes reserved_change_bytes = 0;
};
PeakComparison CompareAtSameMoment(const timeline::SpanSummary& prev,
                                   const timeline::SpanSummary& span);

// Iterations in a row that repeat the one before them (the same columns, no change at the
// like-for-like peak, nothing kept) are printed as one line when there are at least this many:
// "   5..34: 30 iterations, each as iteration 4 (no change)".
inline constexpr size_t kMinRepeatedRows = 3;

// One line of text per iteration of the reported stage plus the change from the previous span by
// category, fitting `width` columns (80 or more); kMinRepeatedRows or more repeated iterations
// in a row share one line. max_rows > 0: init and the first iterations up to that many rows,
// then one line counting the iterations left out (report/steps.h summarises them).
std::string FormatIterationTable(const engine::RunResult& run, int width, size_t max_rows = 0);

// The line Megatron's report_memory would print after each iteration of the reported stage
// (NVIDIA/Megatron-LM megatron/training/utils.py report_memory;
// docs/profile-formats.md, 'Megatron report_memory'):
// "[Rank R] (after N iterations) memory (MB) | allocated: A | max allocated: B | reserved: C |
// max reserved: D" with MB = MiB and two decimals; "max" = peak since the process started
// (init and iterations 1..N). R is the global rank of (tp 0, dp 0, this stage) = stage × TP × DP
// under Megatron's default rank order (tp fastest, then dp, then pp) -- an assumption stated
// here, since the order is configurable.
// The lines are preceded by Megatron's "Theoretical memory footprints: weight and optimizer=W MB,
// activation=A MB, total=T MB" for the reported stage (workload::ComputeClosedFormEstimate), so
// the classic estimate sits next to the simulated numbers.
std::string FormatMegatronLines(const engine::RunResult& run, const config::Setup& setup);

// The header lines: what was simulated and which stage is reported.
std::string FormatRunHeader(const engine::RunResult& run, const config::Setup& setup);

// A long run (RunResult::IsLongRun): how many iterations were simulated and from which one on
// they repeat; "" otherwise.
std::string FormatLongRun(const engine::RunResult& run);

// The OOM notice ("" when none).
std::string FormatOom(const engine::RunResult& run);

// Next to an OOM notice: the flags warned not modelled (config::Setup::not_modelled), each with
// which way memsim errs and, where workload/not_modelled.h estimates it, by about how much on the
// stage that ran out of memory, then the sums. "" without an OOM or without such flags.
std::string FormatNotModelledCaveat(const engine::RunResult& run, const config::Setup& setup);

// setup.warnings, each not-modelled flag's warning ending in its estimate on pipeline stage 0
// ("; by about 1.2 GiB: <basis>") where workload/not_modelled.h has one.
std::vector<std::string> WarningsWithEstimates(const config::Setup& setup);

// docs/interfaces.md, 'JSON report' (schema_version 1), pretty-printed, ending in a newline. A
// long run adds "train_iters" and "steady_state_from" (null when none was found), and
// "steady_state_period" when the iterations repeat with a period above 1; "iterations" holds the
// simulated ones. A run with flags warned not modelled adds "not_modelled": one object per flag
// (what, flag, memsim_errs "high" / "low" / "either way", about_bytes or null, basis, stage: the
// OOM's stage, else the reported one).
std::string RunReportJson(const engine::RunResult& run, const config::Setup& setup);

}  // namespace memsim::report
