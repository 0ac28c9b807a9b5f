// When and in what dtypes the optimizer's state is created: the fp16 loss scaler's skipped
// steps (TrainingConfig::skipped_iterations) and Megatron's precision-aware optimizer (TE
// FusedAdam's state, workload/optimizer.h StateLayout).
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "test_setups.h"
#include "workload/build.h"

namespace memsim::workload {
namespace {

using testing::NetByCategory;

// Llama-2-7B with 4 layers, TP 2, SP, distributed optimizer over DP 4: small, sharded state.
config::Setup Sharded() {
  config::Setup s = testing::Llama2_7b();
  s.model.num_hidden_layers = 4;
  s.training.tensor_model_parallel_size = 2;
  s.training.sequence_parallel = true;
  s.training.use_distributed_optimizer = true;
  s.training.data_parallel_size = 4;
  return s;
}

// Bytes of category `c` allocated by ops of `iteration` whose name contains `part`.
Bytes Allocated(const Program& p, int iteration, Category c, const std::string& part = "") {
  Bytes n = 0;
  for (const Op& op : p.ops) {
    if (op.iteration != iteration || op.name.find(part) == std::string::npos) continue;
    for (const TensorAlloc& a : op.allocs) n += a.category == c ? a.size_bytes : 0;
  }
  return n;
}

bool HasOp(const Program& p, int iteration, const std::string& name) {
  for (const Op& op : p.ops) {
    if (op.iteration == iteration && op.name == name) return true;
  }
  return false;
}

TEST_CASE("fp16 steps the loss scaler skips create no optimizer state", "[workload]") {
  config::Setup s = Sharded();
  s.training.precision = config::Precision::kFp16;
  s.training.accumulate_allreduce_grads_in_fp32 = true;
  s.training.train_iters = 3;
  s.training.skipped_iterations = 2;
  const Program p = Build(s, 0);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  // MixedPrecisionOptimizer.step returns after prepare_grads (unscale and check) when found_inf:
  // iterations 1 and 2 have no grad norm and no Adam update; iteration 3 creates exp_avg and
  // exp_avg_sq, fp32: 8 bytes per main-param shard element.
  for (int k : {1, 2}) {
    INFO("iteration " << k);
    CHECK(HasOp(p, k, "optim.unscale_and_check"));
    CHECK_FALSE(HasOp(p, k, "optim.grad_norm"));
    CHECK(Allocated(p, k, Category::kOptimizerStates) == 0);
  }
  CHECK(HasOp(p, 3, "optim.grad_norm"));
  CHECK(Allocated(p, 3, Category::kOptimizerStates) == 8 * st.main_param_count);

  // Plain PyTorch: GradScaler.step does not call optimizer.step(); the state (AdamW in the
  // weights' dtype, fp32 here: 8 bytes per parameter) comes with the first step taken.
  config::Setup pt = testing::TinyLlama();
  pt.training.framework = "pytorch";
  pt.training.stack.emplace<config::PyTorchOptions>();
  pt.training.precision = config::Precision::kFp16;
  pt.training.pytorch()->torch_dtype = config::Precision::kFp32;
  pt.training.train_iters = 2;
  pt.training.skipped_iterations = 1;
  const Program q = Build(pt, 0);
  CHECK(Allocated(q, 1, Category::kOptimizerStates) == 0);
  CHECK(Allocated(q, 2, Category::kOptimizerStates) ==
        8 * ComputeStaticSizes(pt, 0).parameter_count);
}

TEST_CASE("precision-aware optimizer: FusedAdam's state in its dtypes, made by the first step",
          "[workload]") {
  config::Setup s = Sharded();
  s.training.use_precision_aware_optimizer = true;
  s.training.exp_avg_dtype = config::StateDtype::kBf16;
  s.training.exp_avg_sq_dtype = config::StateDtype::kBf16;
  const Program p = Build(s, 0);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  const std::int64_t n = st.main_param_count;
  // No fp32 main params at setup (distrib_optimizer.py makes none with the precision-aware
  // optimizer); FusedAdam.initialize_state in step 1: exp_avg and exp_avg_sq bf16 (2 + 2 B) and
  // the master weight as int16 remainders of the bf16 parameter (store_param_remainders, 2 B).
  CHECK(NetByCategory(p, 0).count(Category::kMainParameters) == 0);
  CHECK(Allocated(p, 1, Category::kOptimizerStates) == 4 * n);
  CHECK(Allocated(p, 1, Category::kMainParameters) == 2 * n);
  CHECK(st.optimizer_state_bytes == 4 * n);
  CHECK(st.main_param_bytes == 2 * n);
  // Both moments bf16: fuse_unscale, no fp32 copies in the step.
  CHECK(Allocated(p, 2, Category::kTemporaries, "unscaled_states") == 0);

  // exp_avg fp16, exp_avg_sq fp32, fp16 master: get_unscaled_state copies exp_avg and the master
  // to fp32 each step (4 + 4 B per element, held for the group's update); the fp16 master (2 B)
  // is filled from param.clone().float() (2 + 4 B, transient) at its creation.
  s.training.exp_avg_dtype = config::StateDtype::kFp16;
  s.training.exp_avg_sq_dtype = config::StateDtype::kFp32;
  s.training.main_params_dtype = config::Precision::kFp16;
  const Program q = Build(s, 0);
  CHECK(Allocated(q, 1, Category::kOptimizerStates) == (2 + 4) * n);
  CHECK(Allocated(q, 1, Category::kMainParameters) == 2 * n);
  CHECK(Allocated(q, 2, Category::kTemporaries, "unscaled_states") == 8 * n);
  CHECK(Allocated(q, 1, Category::kTemporaries, "optim.adam") >= (2 + 4 + 8) * n);
  CHECK(ComputeStaticSizes(s, 0).main_grad_copy_bytes == 0);
}

}  // namespace
}  // namespace memsim::workload
