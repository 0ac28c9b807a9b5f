// compare/diagnose: says why a measured run may differ from the simulation (issue 15). For each
// aligned iteration it names the categories the simulation holds at the compared moment and,
// when the profile holds less, the one category whose size matches the gap; then it reads what a
// Megatron log says about its own run (LogStatements: skipped iterations, the per-rank parameter
// count, the printed theoretical memory) and flags each disagreement with the simulated config as
// a likely cause. A pure function: the CLI gathers the simulated side (SimulatedSide) from the
// engine and workload/. It never changes the verdict of the comparison (Report::failed).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compare/compare.h"
#include "core/categories.h"
#include "timeline/timeline.h"

namespace memsim::compare {

// What the simulation of the compared stage knows beyond its Timeline.
struct SimulatedSide {
  struct Iteration {
    int iteration = 0;
    CategoryBytes at_peak{};  // allocated by category at the span's allocated peak
    CategoryBytes at_end{};   // after the span's last op
  };
  std::vector<Iteration> iterations;
  int pipeline_rank = 0;
  bool fp16 = false;  // the loss scaler may skip steps
  std::int64_t parameters_on_rank = 0;     // Ψ of (tensor 0, pipeline_rank), workload::StaticSizes
  Bytes closed_form_weight_and_optimizer_bytes = 0;  // Megatron's formula for this config
  Bytes optimizer_state_bytes = 0;         // created by the first optimizer step
};

// One finding, printed as a paragraph under "diagnosis:".
struct Finding {
  bool likely_cause = false;  // a disagreement that would explain the gap
  std::string text;
};

std::vector<Finding> Diagnose(const Report& report, const timeline::LogStatements& log,
                              const SimulatedSide& simulated);

// "diagnosis:" and the findings wrapped at `width` columns ("" when there are none).
std::string FormatDiagnosis(const std::vector<Finding>& findings, int width);

}  // namespace memsim::compare
