// When and in what dtypes the optimizer's state is created: the fp16 loss scaler's skipped
// steps (TrainingConfig::skipped_iterations) and Megatron's precision-aware optimizer (TE
// FusedAdam's state, workload/optimizer.h StateLayout).
#include <catch2/catch.hpp>
#include <algorithm>
#include <map>
#include <set>
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

// testing::TinyLlama's parameters (TE spec, untied, no biases): embedding and output layer 256·64
// each, per layer the fused norm weights 2·64, QKV 3·64·64, proj 64·64, fc1 2·128·64, fc2
// 64·128 (41,088), 2 layers, final norm 64: Ψ = 2·16,384 + 2·41,088 + 64 = 115,008. The
// largest tensors (embedding, output layer, each fc1) have 16,384 elements.
constexpr std::int64_t kTinyParams = 115'008;
constexpr std::int64_t kTinyLargest = 16'384;

TEST_CASE("MindSpeed reuse-fp32-param keeps a 2-byte residual per main element, not an fp32 copy",
          "[workload][mindspeed]") {
  config::Setup s = testing::TinyLlama();
  s.training.reuse_fp32_param = true;
  const Program p = Build(s, 0);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  REQUIRE(st.main_param_count == kTinyParams);
  // reuse_fp32_param_init_wrapper (non-distributed optimizer): the bf16 parameter and the
  // residual share the fp32 copy's 4 bytes, so beyond the parameter 2 bytes per element remain.
  CHECK(st.main_param_bytes == 2 * kTinyParams);
  CHECK(NetByCategory(p, 0).at(Category::kMainParameters) == 2 * kTinyParams);
  // Setup still makes the fp32 copies first (clone().float(), 4 B each) and then drops them.
  CHECK(Allocated(p, 0, Category::kMainParameters, "init.optimizer.main_param") == 4 * kTinyParams);
  // Each conversion (prepare_grads: bf16 -> fp32; step_with_ready_grads: fp32 -> bf16) copies one
  // tensor's transposed 2·numel bf16 view at a time: 4 B x the largest tensor's elements.
  CHECK(Allocated(p, 1, Category::kTemporaries, "optim.reuse_fp32.to_fp32") == 4 * kTinyLargest);
  CHECK(Allocated(p, 1, Category::kTemporaries, "optim.reuse_fp32.to_bf16") == 4 * kTinyLargest);
  // Without the flag: fp32 copies, 4 B per element.
  s.training.reuse_fp32_param = false;
  CHECK(ComputeStaticSizes(s, 0).main_param_bytes == 4 * kTinyParams);
  CHECK(NetByCategory(Build(s, 0), 0).at(Category::kMainParameters) == 4 * kTinyParams);
}

TEST_CASE("MindSpeed reuse-fp32-param over DP 2: the residual of the shard and 64 MiB workspaces",
          "[workload][mindspeed]") {
  config::Setup s = testing::TinyLlama();
  s.training.reuse_fp32_param = true;
  s.training.use_distributed_optimizer = true;
  s.training.data_parallel_size = 2;
  s.training.global_batch_size = 2;
  s.training.overlap_grad_reduce = true;
  const Program p = Build(s, 0);
  const std::int64_t n = ComputeStaticSizes(s, 0).main_param_count;  // the rank's shard
  // reuse_buffer_dis: one bf16 residual of buffer.numel // dp per buffer, 2 B per shard element.
  CHECK(NetByCategory(p, 0).at(Category::kMainParameters) == 2 * n);
  // fp32_tensor_convert_to_fp16_tensor_dis: `workspace` (TRANSPOSE_BF16_BLOCK_SIZE x 2 bf16 =
  // 4096·4096·2·2 B = 67,108,864 B), `temp` (4 B x min(block, shard) = 4n, the shard being far
  // below 4096²) and, with several buckets, the next bucket's workspace before they are dropped.
  constexpr Bytes kWorkspace = 4096LL * 4096 * 2 * 2;
  CHECK(Allocated(p, 1, Category::kTemporaries, "optim.reuse_fp32.to_bf16") ==
        2 * kWorkspace + 4 * n);
  CHECK(Allocated(p, 1, Category::kTemporaries, "optim.reuse_fp32.to_fp32") ==
        2 * kWorkspace + 4 * n);
}

// The most bytes of categories `cats` alive at once during `iteration` (allocations of an op
// before its frees, as the engine samples them).
Bytes PeakLive(const Program& p, int iteration, std::set<Category> cats) {
  std::map<TensorId, const TensorAlloc*> all;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) all[a.id] = &a;
  }
  Bytes live = 0, peak = 0;
  for (const Op& op : p.ops) {
    if (op.iteration > iteration) break;
    for (const TensorAlloc& a : op.allocs) live += cats.count(a.category) ? a.size_bytes : 0;
    if (op.iteration == iteration) peak = std::max(peak, live);
    for (TensorId id : op.frees) {
      live -= cats.count(all.at(id)->category) ? all.at(id)->size_bytes : 0;
    }
  }
  return peak;
}

TEST_CASE("MindSpeed swap-optimizer keeps main parameters and Adam moments on the host between "
          "steps and brings one window at a time",
          "[workload][mindspeed]") {
  config::Setup s = testing::TinyLlama();
  s.training.use_distributed_optimizer = true;  // DP 1: the shard is every parameter
  s.training.swap_optimizer = true;
  const StaticSizes st = ComputeStaticSizes(s, 0);
  REQUIRE(st.main_param_count == kTinyParams);
  // swap_optimizer.py: pinned host copies of the fp32 main parameter, exp_avg and exp_avg_sq,
  // 12 B per shard element; none of them stays on the device.
  CHECK(st.host_pinned_bytes == 12 * kTinyParams);
  CHECK(st.main_param_bytes == 0);
  CHECK(st.optimizer_state_bytes == 0);
  const Program p = Build(s, 0);
  const std::set<Category> optim = {Category::kMainParameters, Category::kOptimizerStates};
  CHECK(NetByCategory(p, 0).count(Category::kMainParameters) == 0);
  CHECK(NetByCategory(p, 1).count(Category::kOptimizerStates) == 0);
  CHECK(NetByCategory(p, 1).count(Category::kMainParameters) == 0);
  // swap_adamw_step with swap_optimizer_times 16: swap_numel = 115,008 // 16 = 7,188 elements; a
  // window holds parameters while it stays within that, at least one, so the largest window is
  // a single 16,384-element tensor: 12 B x 16,384 = 196,608 B alive at once.
  CHECK(PeakLive(p, 1, optim) == 12 * kTinyLargest);
  // swap_optimizer_times 0: one window of the whole shard.
  s.training.swap_optimizer_times = 0;
  CHECK(PeakLive(Build(s, 0), 1, optim) == 12 * kTinyParams);
}

}  // namespace
}  // namespace memsim::workload
