#include "config/iterations.h"

#include <algorithm>

namespace memsim::config {

int FirstRepeatingIteration(const Setup& /*setup*/) { return 2; }

int MaxSimulatedIterations(const Setup& setup) {
  const int bound = std::max(kMinSimulatedIterations,
                             FirstRepeatingIteration(setup) + kSteadySearchIterations);
  return std::min(setup.training.train_iters, bound);
}

}  // namespace memsim::config
