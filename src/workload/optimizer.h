// The optimizer of one rank: torch.optim Adam/AdamW or SGD (or Transformer Engine's FusedAdam,
// the same state) over the tensors it updates, and Megatron-core's mixed-precision optimizer
// around it (megatron/core/optimizer/optimizer.py Float16OptimizerWithFloat16Params,
// distrib_optimizer.py DistributedOptimizer): fp32 main parameters cloned at setup, the step's
// grad copies, grad-norm scratch and the copy back into the model parameters.
// Lazy state: Adam's exp_avg / exp_avg_sq and SGD's momentum buffer are created inside the
// first step, per param group just before the group's update (torch/optim/adam.py
// Adam._init_group, sgd.py; TE FusedAdam.initialize_state). Sizes in bytes.
#pragma once

#include <string>
#include <vector>

#include "config/setup.h"
#include "workload/data_parallel.h"
#include "workload/emitter.h"
#include "workload/model.h"

namespace memsim::workload {

// A tensor the optimizer updates: a whole fp32 main param, a whole param, or a shard slice.
struct MainTensor {
  int param = 0;  // index into RankParams::params
  std::int64_t numel = 0;
  int group = 0;  // param group
};
// The slices in `slices`, tagged with their param group.
std::vector<MainTensor> MainTensors(const RankParams& params,
                                    const std::vector<ShardSlice>& slices);

// torch.optim's update over the main tensors, with state of `state_bytes` per element (fp32
// for Megatron's main params; the parameter dtype for plain PyTorch, zeros_like(param)).
class TorchOptimizer {
 public:
  TorchOptimizer(const config::TrainingConfig& tc, const RankParams& params,
                 std::vector<MainTensor> main, Bytes state_bytes);
  const std::vector<MainTensor>& main() const { return main_; }
  // One step; creates the state on the first call.
  void Step(Emitter& em);

 private:
  void AdamGroup(Emitter& em, int group, std::int64_t group_numel);
  void SgdGroup(Emitter& em, int group, std::int64_t group_numel);
  // Bytes of one state tensor of `mt`: state_bytes per element, or the parameter's own element
  // size where it has its own storage (PEFT's fp32 adapters on a 16-bit model; torch.optim
  // makes the state zeros_like(param)).
  Bytes StateBytes(const MainTensor& mt) const;

  const config::TrainingConfig& tc_;
  const RankParams& params_;
  const std::vector<MainTensor> main_;
  const Bytes state_bytes_;
  bool has_state_ = false;
};

// Megatron-core's optimizer around TorchOptimizer.
class MegatronOptimizer {
 public:
  MegatronOptimizer(const config::TrainingConfig& tc, const ModelDims& d, const RankParams& params,
                    DataParallel& dp);
  // At setup, after the wrapper's buffers: the scalars and (16-bit training, unless the wrapper
  // holds them) the fp32 main parameters.
  void Init(Emitter& em);
  // Inside train_step's zero_grad: drops the previous step's fp32 grad copies.
  void ZeroGrad(Emitter& em);
  // optimizer.step(); the phase and micro-batch of `em` are the caller's.
  void Step(Emitter& em);

 private:
  void GradNorm(Emitter& em);

  const config::TrainingConfig& tc_;
  const ModelDims& d_;
  const RankParams& params_;
  DataParallel& dp_;
  TorchOptimizer inner_;
  std::vector<TensorId> grad_copies_;
};

}  // namespace memsim::workload
