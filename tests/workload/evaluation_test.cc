// The Trainer's evaluation pass inside training (workload/evaluation.h): when it runs, what it
// keeps (the gathered logits, labels and losses concatenated batch after batch by
// EvalLoopContainer), eval_accumulation_steps' moves to the CPU with empty_cache, and the
// gradients already freed by model.zero_grad() before it starts.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "workload/build.h"
#include "workload/evaluation.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

// testing::TinyLlama (h 64, 2 layers, vocab 256, seq 32) under the Trainer: one micro-batch per
// step, three steps, bf16 autocast over fp32 weights; an evaluation after step 2 of three
// batches of 2 samples, predictions kept.
config::Setup TinyEval() {
  config::Setup s = testing::TinyLlama();
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  s.training.global_batch_size = 1;
  s.training.train_iters = 3;
  s.training.precision = config::Precision::kBf16;
  s.training.pytorch()->torch_dtype = config::Precision::kFp32;
  s.training.pytorch()->zero_grad_set_to_none = true;
  s.training.gradient_accumulation_fusion = false;
  s.training.optimizer_impl = config::OptimizerImpl::kForeach;
  s.training.hf_trainer()->eval_steps = 2;
  s.training.hf_trainer()->eval_batches = 3;
  s.training.hf_trainer()->eval_batch_size = 2;
  s.training.hf_trainer()->eval_keep_predictions = true;
  return s;
}

// One batch's kept tensors. Logits [b, s, V] fp32 (convert_outputs_to_fp32 under autocast):
// 2 · 32 · 256 · 4 = 65536. Labels [b, s] int64: 2 · 32 · 8 = 512. Losses [b] fp32: 2 · 4 = 8.
constexpr Bytes kLogits = 2 * 32 * 256 * 4;
constexpr Bytes kLabels = 2 * 32 * 8;
constexpr Bytes kLosses = 2 * 4;

bool IsEval(const Op& op) { return op.name.rfind("eval.", 0) == 0; }

// Sizes of the tensors allocated with `label`, in order.
std::vector<Bytes> Allocs(const Program& p, const std::string& label) {
  std::vector<Bytes> out;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label == label) out.push_back(a.size_bytes);
    }
  }
  return out;
}

// The most bytes of tensors labelled `label` alive at once (after an op's allocations).
Bytes PeakAlive(const Program& p, const std::string& label) {
  std::map<TensorId, Bytes> alive;
  Bytes sum = 0, peak = 0;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label != label) continue;
      alive[a.id] = a.size_bytes;
      sum += a.size_bytes;
    }
    peak = std::max(peak, sum);
    for (TensorId id : op.frees) {
      auto it = alive.find(id);
      if (it == alive.end()) continue;
      sum -= it->second;
      alive.erase(it);
    }
  }
  return peak;
}

TEST_CASE("evaluation: after every eval_steps-th optimizer step", "[workload][hf][eval]") {
  config::TrainingConfig tc = TinyEval().training;
  // DefaultFlowCallback.on_step_end: global_step % eval_steps == 0 and >= eval_delay.
  CHECK_FALSE(EvaluatesAfterStep(tc, 1));
  CHECK(EvaluatesAfterStep(tc, 2));
  CHECK_FALSE(EvaluatesAfterStep(tc, 3));
  CHECK(EvaluatesAfterStep(tc, 4));
  tc.hf_trainer()->eval_delay = 3;
  CHECK_FALSE(EvaluatesAfterStep(tc, 2));
  CHECK(EvaluatesAfterStep(tc, 4));

  const Program p = Build(TinyEval(), 0);
  int first_eval = -1, last_step_op = -1;
  for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) {
    const Op& op = p.ops[i];
    if (IsEval(op)) {
      CHECK(op.iteration == 2);  // only after step 2 of 3
      if (first_eval < 0) first_eval = i;
    }
    if (op.iteration == 2 && op.phase == Phase::kOptimizerStep) last_step_op = i;
  }
  REQUIRE(first_eval > 0);
  CHECK(first_eval > last_step_op);
  // model.zero_grad() before _maybe_log_save_evaluate: no gradient alive during evaluation.
  std::map<TensorId, Bytes> grads;
  for (int i = 0; i < first_eval; ++i) {
    for (const TensorAlloc& a : p.ops[i].allocs) {
      if (a.category == Category::kGradients) grads[a.id] = a.size_bytes;
    }
    for (TensorId id : p.ops[i].frees) grads.erase(id);
  }
  CHECK(grads.empty());
}

TEST_CASE("evaluation: logits, labels and losses concatenated on the device",
          "[workload][hf][eval]") {
  const Program p = Build(TinyEval(), 0);
  // Each batch's fp32 logits, then EvalLoopContainer.add's torch.cat of 1 + 1 and 2 + 1
  // batches (the first batch's tensor is kept as is).
  CHECK(Allocs(p, "eval.logits") ==
        std::vector<Bytes>{kLogits, kLogits, 2 * kLogits, kLogits, 3 * kLogits});
  CHECK(Allocs(p, "eval.labels") == std::vector<Bytes>{2 * kLabels, 3 * kLabels});
  CHECK(Allocs(p, "eval.losses") ==
        std::vector<Bytes>{kLosses, kLosses, 2 * kLosses, kLosses, 3 * kLosses});
  // The third add: the container's 2 batches, the batch's own (held by the loop's `logits`)
  // and the new 3-batch tensor: 2 + 1 + 3 = 6 batches before the old container is freed.
  CHECK(PeakAlive(p, "eval.logits") == 6 * kLogits);
  // Everything goes to the CPU at the end: nothing labelled eval.* survives the pass.
  std::map<TensorId, bool> alive;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.rfind("eval.", 0) == 0) alive[a.id] = true;
    }
    for (TensorId id : op.frees) alive.erase(id);
  }
  CHECK(alive.empty());
}

TEST_CASE("evaluation: eval_accumulation_steps 1 moves each batch to the CPU",
          "[workload][hf][eval]") {
  config::Setup s = TinyEval();
  s.training.hf_trainer()->eval_accumulation_steps = 1;
  const Program p = Build(s, 0);
  // to_cpu_and_numpy after every batch: no concatenation, one batch at a time.
  CHECK(Allocs(p, "eval.logits") == std::vector<Bytes>{kLogits, kLogits, kLogits});
  CHECK(PeakAlive(p, "eval.logits") == kLogits);
  int empty_caches = 0;
  for (const Op& op : p.ops) empty_caches += IsEval(op) && op.empty_cache ? 1 : 0;
  CHECK(empty_caches == 3);  // torch.cuda.empty_cache() after each move
}

TEST_CASE("evaluation: without compute_metrics only the losses are kept", "[workload][hf][eval]") {
  config::Setup s = TinyEval();
  s.training.hf_trainer()->eval_keep_predictions = false;
  const Program p = Build(s, 0);
  CHECK(Allocs(p, "eval.logits").empty());
  CHECK(Allocs(p, "eval.labels").empty());
  CHECK(Allocs(p, "eval.losses") ==
        std::vector<Bytes>{kLosses, kLosses, 2 * kLosses, kLosses, 3 * kLosses});
}

TEST_CASE("evaluation: gathered across processes", "[workload][hf][eval]") {
  config::Setup s = TinyEval();
  s.training.data_parallel_size = 2;
  s.training.global_batch_size = 2;
  const Program p = Build(s, 0);
  // gather_for_metrics on 2 processes: each batch's logits all-gathered into 2 · kLogits; the
  // containers then hold 2, 4, 6 batches' worth.
  const std::vector<Bytes> logits = Allocs(p, "eval.logits");
  CHECK(std::count(logits.begin(), logits.end(), 2 * kLogits) == 3);
  CHECK(std::count(logits.begin(), logits.end(), 6 * kLogits) == 1);
}

}  // namespace
}  // namespace memsim::workload
