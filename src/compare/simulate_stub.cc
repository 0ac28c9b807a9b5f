// Placeholder until the engine lands: delete this file when SimulateForCompare is implemented.
#include "compare/simulate.h"

#include "core/error.h"

namespace memsim::compare {

timeline::Timeline SimulateForCompare(const std::string& config_path, int pipeline_rank) {
  (void)config_path;
  (void)pipeline_rank;
  throw UnsupportedError(
      "compare CONFIG needs the simulation engine, which this build lacks; pass the simulated "
      "timeline with --simulated FILE (memsim-csv, as written by `memsim run --csv`)");
}

}  // namespace memsim::compare
