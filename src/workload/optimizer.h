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

// Bytes per element of what the optimizer's first step creates for each tensor it updates, and
// of the step's temporaries.
// - Megatron: fp32 state (zeros_like of the fp32 main params), master weights outside the
//   optimizer (MegatronOptimizer::Init or the wrapper).
// - plain PyTorch: the parameter dtype (torch/optim/adam.py Adam._init_group, zeros_like(param)).
// - Megatron's precision-aware optimizer: TE FusedAdam holds the master weights too
//   (megatron/core/optimizer/__init__.py passes master_weights=True, master_weight_dtype,
//   exp_avg_dtype, exp_avg_sq_dtype, store_param_remainders); FusedAdam.initialize_state
//   (transformer_engine/pytorch/optimizers/fused_adam.py) creates exp_avg, exp_avg_sq and
//   master_param in those dtypes (fp8: a 1-byte Float8Tensor), the master as int16 remainders of
//   a bf16 parameter when store_param_remainders (Megatron's OptimizerConfig default, TE >= 2.1),
//   else filled from param.clone().float(). Each step, get_unscaled_state gives an fp32 copy of
//   every fp16 / fp8 state (and of bf16 moments unless both are bf16: fuse_unscale), all held
//   until the group's update has run (`del unscaled_lists`). Not modelled: the [1]-element scale
//   tensors and _apply_scale's per-tensor temporaries (one tensor at a time).
struct StateLayout {
  Bytes exp_avg = 4;       // Adam's exp_avg, or SGD's momentum buffer
  Bytes exp_avg_sq = 4;    // Adam only
  Bytes master_param = 0;  // FusedAdam's master weight; 0: held outside the optimizer
  // initialize_state's param.clone().detach().float(): the clone's bytes (the parameter dtype),
  // then 4 for the float copy, both transient; 0: no clone (remainders start at zero).
  Bytes master_clone = 0;
  Bytes unscaled_copies = 0;  // fp32 copies of the non-fp32 states in each step
  Bytes temporary = 4;        // torch.optim's foreach temporaries, in the state dtype
  bool operator==(const StateLayout&) const = default;
};
StateLayout OptimizerStateLayout(const config::Setup& setup, const ModelDims& d);

// transformers.optimization.Adafactor.step's state for one parameter, created in its first
// step, always fp32 (`.to(grad)` of the grad's fp32 upcast): for a parameter of two or more
// dimensions (_get_options: factored) exp_avg_sq_row [shape[:-1]] and exp_avg_sq_col
// [shape[-1]], else exp_avg_sq of the parameter's size; and the 0-dim `RMS` tensor
// (_rms(p_data_fp32)), 4 bytes, which each step replaces by another of the same size. No exp_avg: the Trainer leaves beta1 None. A parameter with
// row_numel 1 is taken as 1-D.
Bytes AdafactorStateBytes(const ParamTensor& pt);

// A bitsandbytes optimizer's state for one parameter of `numel` elements
// (config::BnbOptimizer; bitsandbytes/optim/optimizer.py, Optimizer2State / Optimizer1State
// .init_state, created in the first step that finds the parameter's .grad):
// - each state (state1, and state2 for AdamW) is uint8, 1 byte an element, with 8-bit state,
//   and fp32 otherwise; a parameter of fewer than min_8bit_size = 4096 elements keeps fp32 state
//   even with optim_bits 8;
// - 8-bit state is block-wise (block_wise=True by default): an fp32 absmax per 256 elements per
//   state (`blocks = n // 256 + bool(n % 256)`, bitsandbytes 0.44.0 on, PR #1365; 0.43 and
//   before used blocks of 2048, so memsim is high by 2 · 4 · (1/256 − 1/2048) bytes an element
//   for those releases);
// - paged (is_paged): get_state_buffer puts a state of at least 1e5 elements in CUDA unified
//   memory (functional.py get_paged: cudaMallocManaged through cget_managed_ptr) outside the
//   caching allocator; smaller states and every absmax stay torch.zeros on the device.
// The shared quantisation maps (functional.py create_dynamic_map: 256 fp32 values each; qmap1
// "dynamic" and, for two states, qmap2 "udynamic") are moved to the device once, by the first
// 8-bit init_state: kBnbQmapBytes each. Sizes in bytes.
struct BnbState {
  Bytes device_bytes = 0;   // through the caching allocator
  Bytes managed_bytes = 0;  // unified memory (paged)
};
BnbState BnbStateBytes(std::int64_t numel, const config::BnbOptimizer& bnb);
inline constexpr std::int64_t kBnbMin8BitSize = 4096;
inline constexpr std::int64_t kBnbBlockSize = 256;
inline constexpr std::int64_t kBnbMinPagedSize = 100000;
inline constexpr Bytes kBnbQmapBytes = 256 * 4;

// torch.optim's update over the main tensors, with state as `layout` says.
class TorchOptimizer {
 public:
  TorchOptimizer(const config::TrainingConfig& tc, const RankParams& params,
                 std::vector<MainTensor> main, const StateLayout& layout);
  const std::vector<MainTensor>& main() const { return main_; }
  // One step; creates the state on the first call.
  void Step(Emitter& em);

 private:
  void AdamGroup(Emitter& em, int group, std::int64_t group_numel);
  void AdamState(Emitter& em, int group);
  void SgdGroup(Emitter& em, int group, std::int64_t group_numel);
  void AdafactorGroup(Emitter& em, int group);
  // A bitsandbytes optimizer (config::BnbOptimizer): per parameter, the state at its first step
  // (BnbStateBytes), then the in-place update kernel.
  void BnbGroup(Emitter& em, int group, const config::BnbOptimizer& bnb);
  // Bytes of one state-sized tensor of `mt`: `per_element` bytes per element (the layout's
  // dtype), or the parameter's own storage where it has one (PEFT's fp32 adapters on a 16-bit
  // model; torch.optim makes the state zeros_like(param)).
  Bytes StateBytes(const MainTensor& mt, Bytes per_element) const;

  const config::TrainingConfig& tc_;
  const RankParams& params_;
  const std::vector<MainTensor> main_;
  const StateLayout layout_;
  bool has_state_ = false;
  bool has_qmaps_ = false;  // a bitsandbytes 8-bit state moved its quantisation maps over
};

// Megatron-core's optimizer around TorchOptimizer.
class MegatronOptimizer {
 public:
  MegatronOptimizer(const config::Setup& setup, const ModelDims& d, const RankParams& params,
                    DataParallel& dp);
  // At setup, after the wrapper's buffers: the scalars and (16-bit training, unless the wrapper
  // holds them) the fp32 main parameters.
  void Init(Emitter& em);
  // Inside train_step's zero_grad: drops the previous step's fp32 grad copies.
  void ZeroGrad(Emitter& em);
  // optimizer.step(); the phase and micro-batch of `em` are the caller's. `skipped`: the fp16
  // loss scaler found an inf/nan, and MixedPrecisionOptimizer.step returns after prepare_grads
  // (the grad copies and the unscale-and-check; megatron/core/optimizer/optimizer.py): no grad
  // norm, no update (so no optimizer state yet), no copy back, no parameter all-gather.
  void Step(Emitter& em, bool skipped);

 private:
  void UnscaleAndCheck(Emitter& em);
  void GradNorm(Emitter& em);
  // MindSpeed --reuse-fp32-param (TrainingConfig::reuse_fp32_param): at Init, the fp32 copies
  // `mains` replaced by 16-bit residuals; in the step, the conversions' temporaries.
  void ReuseFp32Storage(Emitter& em, const std::vector<TensorId>& mains);
  void ReuseFp32Convert(Emitter& em, bool to_fp32);
  // MindSpeed --swap-optimizer (TrainingConfig::swap_optimizer): the states made and sent to
  // host at Init, and the step's windows brought to the device and back.
  void SwapInitStates(Emitter& em);
  void SwapStep(Emitter& em);
  // The grad-stats all-reduce (found_inf, the norm): "mp" (tp·pp ranks), or "world" with a
  // sharded optimizer.
  void GradStatsAllReduce(Emitter& em) const;

  const config::TrainingConfig& tc_;
  const ModelDims& d_;
  const RankParams& params_;
  DataParallel& dp_;
  TorchOptimizer inner_;
  std::vector<TensorId> grad_copies_;
};

}  // namespace memsim::workload
