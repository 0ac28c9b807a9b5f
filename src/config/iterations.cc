#include "config/iterations.h"

#include <algorithm>

namespace memsim::config {

int FirstEvaluationStep(const TrainingConfig& training) {
  const HfTrainerOptions* h = training.hf_trainer();  // the only stack that evaluates
  if (h == nullptr) return 0;
  const int every = h->eval_steps;
  if (every <= 0 || h->eval_batches <= 0) return 0;
  const int from = std::max(1, h->eval_delay);
  const long long step = (static_cast<long long>(from) + every - 1) / every * every;
  return step <= training.train_iters ? static_cast<int>(step) : 0;
}

// Iteration skipped_iterations + 1 runs the first real optimizer.step() (the skipped ones return
// before the inner step: megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer.step;
// workload/training_loop.h), so the one after it is the first that repeats.
int FirstRepeatingIteration(const Setup& setup) {
  return std::max(setup.training.skipped_iterations + 2,
                  FirstEvaluationStep(setup.training) + 1);
}

int MaxSimulatedIterations(const Setup& setup) {
  if (setup.training.data.Varies()) return setup.training.train_iters;
  const int bound = std::max(kMinSimulatedIterations,
                             FirstRepeatingIteration(setup) + kSteadySearchIterations);
  return std::min(setup.training.train_iters, bound);
}

}  // namespace memsim::config
