// The one hook between `memsim compare` and the engine: simulate a training config and return
// the Timeline of one pipeline stage. Declared here so compare/ and cli/compare.cc build before
// the engine exists; the engine owner implements it (src/compare/simulate_stub.cc is the
// placeholder to delete then).
#pragma once

#include <string>

#include "timeline/timeline.h"

namespace memsim::compare {

// Simulates the training config at `config_path` (design.md "Files") and returns the Timeline
// of pipeline stage `pipeline_rank`: samples labelled with iteration (0 = init) and phase.
// Throws InputError for a bad config or a pipeline rank out of range.
timeline::Timeline SimulateForCompare(const std::string& config_path, int pipeline_rank);

}  // namespace memsim::compare
