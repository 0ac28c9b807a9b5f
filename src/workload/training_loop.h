// The training loops around the schedule; a stack picks its own (config/stack.h
// NewTrainingLoop), or brings one of its own as a subclass of TrainingLoop:
// - MegatronLoop: Megatron-LM's train_step (megatron/training/training.py): zero_grad_buffer
//   and optimizer.zero_grad, forward_backward_func over the micro-batches with
//   finalize_model_grads at its end (megatron/core/distributed/finalize_model_grads.py), the
//   empty_unused_memory_level cache releases, optimizer.step();
// - PyTorchLoop: a plain loop (one device, or under DistributedDataParallel, whose hooks the
//   data-parallel wrapper adds): optimizer.zero_grad() at the start of each
//   iteration, forward and backward of each micro-batch (gradient accumulation), a
//   torch.optim step.
// Both build the model the same way at init (one tensor per parameter, construction order,
// one op per module) and hand the parameters to the data-parallel wrapper.
// fp16 loss scaling: iterations 1..training.skipped_iterations skip the update (the loss scaler
// found inf/nan): no optimizer state is created before iteration skipped_iterations + 1, the
// first iteration from which the program can settle into repeating itself.
#pragma once

#include <memory>
#include <vector>

#include "workload/batch_lengths.h"
#include "workload/data_parallel.h"
#include "workload/optimizer.h"
#include "workload/stage_runner.h"

namespace memsim::workload {

// The parts of one rank a loop drives. All outlive the loop.
struct LoopParts {
  const config::Setup& setup;
  const ModelDims& d;
  const FrameworkFacts& f;
  const RankParams& params;
  Emitter& em;
  DataParallel& dp;
  StageRunner& runner;
  PipelineExchange& exchange;
  const std::vector<ScheduleStep>& steps;
  // The evaluation pass (evaluation.h; PyTorchLoop only): its context, carrying the evaluation
  // dims, and the model's layer. Null: no evaluation.
  ModuleContext* eval_ctx = nullptr;
  DecoderLayer* layer = nullptr;
  // Micro-batches of varying length (batch_lengths.h): RunSchedule sets `d`'s s and T to each
  // step's micro-batch. Null: every micro-batch seq_length long.
  BatchShapes* shapes = nullptr;
};

class TrainingLoop {
 public:
  explicit TrainingLoop(const LoopParts& parts) : p_(parts) {}
  virtual ~TrainingLoop() = default;
  virtual void Init() = 0;
  virtual void Iteration(int k) = 0;

 protected:
  // The model's parameters, one tensor each (ids by param index).
  std::vector<TensorId> BuildModel();
  // The schedule's forward and backward steps, with the wrapper's end-of-chunk hook; each step
  // shaped by its micro-batch's length when they vary (LoopParts::shapes).
  void RunSchedule();

  LoopParts p_;
};

std::unique_ptr<TrainingLoop> NewMegatronLoop(const LoopParts& parts);
std::unique_ptr<TrainingLoop> NewPyTorchLoop(const LoopParts& parts);

}  // namespace memsim::workload
