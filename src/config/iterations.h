// How many training iterations memsim simulates (docs/config.md, 'Long runs'). Iterations repeat
// once nothing scheduled changes any more: the engine (engine/stages.h) simulates from
// FirstRepeatingIteration on until two consecutive iterations are identical, allocator state
// included, and reports that steady state for the rest of train_iters.
#pragma once

#include "config/setup.h"

namespace memsim::config {

// The first iteration whose allocation stream repeats in every later one: after every scheduled
// change: skipped_iterations + 2. Iteration skipped_iterations + 1 runs the first real
// optimizer.step(), which creates the optimizer state lazily (torch/optim/adam.py `_init_group`;
// docs/training-memory.md); the fp16 steps the loss scaler skips before it create none. An
// empty_unused_memory_level schedule runs every iteration, so it changes nothing from one to the
// next. With an evaluation pass inside training (hf-trainer eval_steps, workload/evaluation.h)
// whose first run falls within train_iters: at least the step after that first evaluation, so
// that it is simulated (its reserved segments stay cached); later evaluations are not followed
// once the steps between them repeat (a warning says so, config/hf_trainer.cc).
int FirstRepeatingIteration(const Setup& setup);

// The first optimizer step followed by an evaluation (DefaultFlowCallback.on_step_end: a multiple
// of eval_steps, at least eval_delay), or 0 when there is none.
int FirstEvaluationStep(const TrainingConfig& training);

// At least this many iterations are simulated (or train_iters when fewer): the default
// train_iters, so that short runs report as they always have.
inline constexpr int kMinSimulatedIterations = 4;
// A long run whose iterations are not yet identical by this many iterations after
// FirstRepeatingIteration is reported as simulated so far, with a note.
inline constexpr int kSteadySearchIterations = 32;

// The most iterations memsim simulates for `setup`: train_iters, or fewer for a long run. Data of
// varying lengths (SampleData::Varies): train_iters, every one (no two steps need be alike).
int MaxSimulatedIterations(const Setup& setup);

}  // namespace memsim::config
