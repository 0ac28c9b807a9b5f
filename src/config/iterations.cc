#include "config/iterations.h"

#include <algorithm>

namespace memsim::config {

// Iteration skipped_iterations + 1 runs the first real optimizer.step() (the skipped ones return
// before the inner step: megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer.step;
// workload/training_loop.h), so the one after it is the first that repeats.
int FirstRepeatingIteration(const Setup& setup) {
  return setup.training.skipped_iterations + 2;
}

int MaxSimulatedIterations(const Setup& setup) {
  const int bound = std::max(kMinSimulatedIterations,
                             FirstRepeatingIteration(setup) + kSteadySearchIterations);
  return std::min(setup.training.train_iters, bound);
}

}  // namespace memsim::config
