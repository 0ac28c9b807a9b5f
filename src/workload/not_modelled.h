// By about how much a flag memsim does not model changes one rank's memory (issue 32, "What a
// result must say"): the caveat printed next to a verdict and in the JSON report. Each estimate
// is a closed form over the rank's dims and static sizes, cited to the framework code or
// document that describes the feature; flags without one get no amount (about_bytes 0) and
// only their direction. Not a model: the simulation never uses these numbers.
#pragma once

#include <string>
#include <vector>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::workload {

struct NotModelledEstimate {
  config::NotModelled flag;
  Bytes about_bytes = 0;  // per device of the rank, at its peak; 0 = no estimate
  std::string basis;      // how about_bytes follows from the run ("" when 0)
  bool operator==(const NotModelledEstimate&) const = default;
};

// One entry per setup.not_modelled, in order. REQUIRES: a Setup that config/ validated and
// 0 <= pipeline_rank < pipeline_model_parallel_size.
std::vector<NotModelledEstimate> EstimateNotModelled(const config::Setup& setup,
                                                     int pipeline_rank);

}  // namespace memsim::workload
