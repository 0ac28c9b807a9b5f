// The output side of a causal LM (modules/output_loss.h) under the Hugging Face Trainer, run alone
// on the module harness: when each [T, V] tensor of Transformers' loss is made and when the
// Python code drops its last reference, counted by hand from the framework code.
//
// Shape: testing::TinyHfLlama in bf16 (bf16 weights, bf16 autocast through the Trainer's
// mixed precision): h 64, vocab V 256, s 32, b 1: T = 32 tokens, T·V = 8192 logits. The final
// norm (LlamaRMSNorm, its weight trained): rstd fp32 [T] (4·T = 128), its output [T, h] bf16
// (2·T·h = 4096), and what the Transformers norm keeps for backward: `hidden_states.to(float32)`
// of the bf16 input (4·T·h = 8192, saved by pow and the rsqrt product) and x·rsqrt cast back to
// bf16 (2·T·h = 4096, saved by `self.weight * ...`).
#include "workload/modules/output_loss.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::output_loss_module_test {

using testing::ModuleHarness;
using testing::SeenTensors;

constexpr Bytes kT = 32, kH = 64, kTV = 32 * 256;

TEST_CASE(
    "Transformers' causal-LM loss holds the bf16 logits, their fp32 copy and the fp32 "
    "log-probabilities together, and frees each where the Python code drops it",
    "[workload][modules][output_loss][lifetimes]") {
  ModuleHarness h(testing::TinyHfLlama(config::Precision::kBf16));
  const std::string weight = OutputAndLoss::OutputWeight(h.dims(), /*has_embedding=*/true);
  const TensorId x = h.MakeTensor(2 * kT * kH, "harness.last_output");
  HeadSaved head;
  TensorId report = 0;
  h.Run(Phase::kForward,
        [&](ModuleContext& ctx) { report = OutputAndLoss::Forward(ctx, x, weight, &head); });
  // transformers loss/loss_utils.py ForCausalLMLoss: `logits = logits.float()` (4·T·V) is a
  // local until the function returns; F.cross_entropy's log_softmax (4·T·V) is saved; the
  // shifted labels int64 [T] (8·T) are saved by nll_loss; the loss and the reported loss are
  // scalars (8 bytes each as memsim counts them). The lm_head's bf16 logits (2·T·V) are held by
  // the model's output.
  CHECK(h.AliveDuring("cross_entropy") == SeenTensors{
                                              {"final_norm.rstd", 4 * kT},
                                              {"final_norm.input_fp32", 4 * kT * kH},
                                              {"final_norm.normed", 2 * kT * kH},
                                              {"final_norm.out", 2 * kT * kH},
                                              {"output_layer.logits", 2 * kTV},
                                              {"loss.logits_fp32", 4 * kTV},
                                              {"loss.shift_labels", 8 * kT},
                                              {"loss.log_probs", 4 * kTV},
                                              {"loss.output", 8},
                                              {"loss.report", 8},
                                          });
  CHECK(h.FreedIn("loss.logits_fp32") == "cross_entropy");
  // accelerate's convert_outputs_to_fp32 rebuilds the output with fp32 logits (4·T·V): the
  // bf16 ones go with the old output object, the fp32 ones when Trainer.compute_loss returns.
  CHECK(h.FreedIn("output_layer.logits") == "loss.outputs_to_fp32");
  CHECK(h.FreedIn("loss.outputs_logits_fp32") == "loss.compute_loss_return");
  CHECK(h.Saved() == SeenTensors{{"final_norm.rstd", 4 * kT},
                                 {"final_norm.input_fp32", 4 * kT * kH},
                                 {"final_norm.normed", 2 * kT * kH},
                                 {"final_norm.out", 2 * kT * kH},
                                 {"loss.shift_labels", 8 * kT},
                                 {"loss.log_probs", 4 * kTV},
                                 {"loss.output", 8},
                                 {"loss.report", 8}});

  TensorId dx = 0;
  h.Run(Phase::kBackward, [&](ModuleContext& ctx) {
    dx = OutputAndLoss::Backward(ctx, Batch{}, head, weight);
  });
  // NllLossBackward's grad (4·T·V), then LogSoftmaxBackward's (4·T·V) while the first and the
  // saved log-probabilities (4·T·V) are alive: 12·T·V at once.
  CHECK(h.AliveDuring("log_softmax_bwd") == SeenTensors{
                                                {"final_norm.rstd", 4 * kT},
                                                {"final_norm.input_fp32", 4 * kT * kH},
                                                {"final_norm.normed", 2 * kT * kH},
                                                {"final_norm.out", 2 * kT * kH},
                                                {"loss.log_probs", 4 * kTV},
                                                {"loss.report", 8},
                                                {"loss.d_log_probs", 4 * kTV},
                                                {"loss.d_logits_fp32", 4 * kTV},
                                            });
  // ToCopyBackward of `.float()`: the bf16 grad of the logits (2·T·V), the fp32 one freed.
  CHECK(h.FreedIn("loss.d_logits_fp32") == "logits_float_bwd");
  CHECK(h.FreedIn("final_norm.input_fp32") == "final_norm_bwd");
  CHECK(h.FreedIn("final_norm.normed") == "final_norm_bwd");
  h.Release({dx, report});
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE("Transformers' causal-LM loss in fp32 makes no copies of the logits",
          "[workload][modules][output_loss][lifetimes]") {
  // fp32 weights, no autocast (precision fp32): `.float()` returns the logits themselves and
  // accelerate does not wrap the forward; the fp32 logits (4·T·V) go when compute_loss returns.
  config::Setup s = testing::TinyHfLlama(config::Precision::kFp32);
  s.training.precision = config::Precision::kFp32;
  ModuleHarness h(s);
  const std::string weight = OutputAndLoss::OutputWeight(h.dims(), true);
  const TensorId x = h.MakeTensor(4 * kT * kH, "harness.last_output");
  HeadSaved head;
  TensorId report = 0;
  h.Run(Phase::kForward,
        [&](ModuleContext& ctx) { report = OutputAndLoss::Forward(ctx, x, weight, &head); });
  CHECK(h.FreedIn("output_layer.logits") == "loss.compute_loss_return");
  const SeenTensors made = h.Allocated(Phase::kForward);
  CHECK(std::none_of(made.begin(), made.end(), [](const testing::SeenTensor& t) {
    return t.label == "loss.logits_fp32" || t.label == "loss.outputs_logits_fp32";
  }));
  h.Release({report, x});
  CHECK(h.problems().empty());
}

TEST_CASE("Transformers before 4.49 shift the fp32 logits into a copy that the loss holds until "
          "it returns, and its backward widens the shifted grad back to all positions",
          "[workload][modules][output_loss][lifetimes]") {
  // Micro-batch 2 (T = 64 tokens): with b = 1 `logits[..., :-1, :]` is contiguous already and
  // `.contiguous()` copies nothing (the next test).
  config::Setup s = testing::TinyHfLlama(config::Precision::kBf16);
  std::get<config::HfTrainerOptions>(s.training.stack).loss_shift_copy = true;
  s.training.micro_batch_size = 2;
  ModuleHarness h(s);
  constexpr Bytes kT2 = 64, kTV2 = 64 * 256;
  const std::string weight = OutputAndLoss::OutputWeight(h.dims(), true);
  const TensorId x = h.MakeTensor(2 * kT2 * kH, "harness.last_output");
  HeadSaved head;
  TensorId report = 0;
  h.Run(Phase::kForward,
        [&](ModuleContext& ctx) { report = OutputAndLoss::Forward(ctx, x, weight, &head); });
  // transformers v4.47.1 loss/loss_utils.py ForCausalLMLoss: `logits.float()` (4·T·V), then
  // `shift_logits = logits[..., :-1, :].contiguous()`: b (s - 1) = 62 rows, 4·62·V fp32;
  // `shift_labels = labels[..., 1:].contiguous()` int64, 8·62; cross_entropy's log_softmax on
  // the 62 rows (4·62·V), saved; the copy and the fp32 logits are locals until the return.
  constexpr Bytes kRowsV = 62 * 256;
  CHECK(h.AliveDuring("cross_entropy") == SeenTensors{
                                              {"final_norm.rstd", 4 * kT2},
                                              {"final_norm.input_fp32", 4 * kT2 * kH},
                                              {"final_norm.normed", 2 * kT2 * kH},
                                              {"final_norm.out", 2 * kT2 * kH},
                                              {"output_layer.logits", 2 * kTV2},
                                              {"loss.logits_fp32", 4 * kTV2},
                                              {"loss.shift_logits", 4 * kRowsV},
                                              {"loss.shift_labels", 8 * 62},
                                              {"loss.log_probs", 4 * kRowsV},
                                              {"loss.output", 8},
                                              {"loss.report", 8},
                                          });
  CHECK(h.FreedIn("loss.shift_logits") == "cross_entropy");
  TensorId dx = 0;
  h.Run(Phase::kBackward, [&](ModuleContext& ctx) {
    dx = OutputAndLoss::Backward(ctx, Batch{}, head, weight);
  });
  // LogSoftmaxBackward's grad of the 62 rows (4·62·V); CloneBackward of `.contiguous()` passes
  // it on; SliceBackward's slice_backward writes it into a zero fp32 [2, 32, V] (4·T·V).
  CHECK(h.AliveDuring("shift_logits_bwd") == SeenTensors{
                                                 {"final_norm.rstd", 4 * kT2},
                                                 {"final_norm.input_fp32", 4 * kT2 * kH},
                                                 {"final_norm.normed", 2 * kT2 * kH},
                                                 {"final_norm.out", 2 * kT2 * kH},
                                                 {"loss.report", 8},
                                                 {"loss.d_logits_fp32", 4 * kRowsV},
                                                 {"loss.d_logits_unshifted", 4 * kTV2},
                                             });
  CHECK(h.FreedIn("loss.d_logits_unshifted") == "logits_float_bwd");
  h.Release({dx, report});
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE("Transformers before 4.49 with micro-batch 1: the shifted slices are views, no copy",
          "[workload][modules][output_loss][lifetimes]") {
  // [1, s, V] sliced to [1, s - 1, V] keeps strides (s·V, V, 1): contiguous, since a size-1
  // dimension's stride is not checked, so `.contiguous()` returns the view; likewise the labels.
  // The loss still runs on s - 1 = 31 rows: log_softmax 4·31·V.
  config::Setup s = testing::TinyHfLlama(config::Precision::kBf16);
  std::get<config::HfTrainerOptions>(s.training.stack).loss_shift_copy = true;
  ModuleHarness h(s);
  const std::string weight = OutputAndLoss::OutputWeight(h.dims(), true);
  const TensorId x = h.MakeTensor(2 * kT * kH, "harness.last_output");
  HeadSaved head;
  TensorId report = 0;
  h.Run(Phase::kForward,
        [&](ModuleContext& ctx) { report = OutputAndLoss::Forward(ctx, x, weight, &head); });
  const SeenTensors made = h.Allocated(Phase::kForward);
  CHECK(std::none_of(made.begin(), made.end(), [](const testing::SeenTensor& t) {
    return t.label == "loss.shift_logits" || t.label == "loss.shift_labels";
  }));
  CHECK(std::count(made.begin(), made.end(), testing::SeenTensor{"loss.log_probs", 4 * 31 * 256}) == 1);
  h.Release({report, x});
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::output_loss_module_test
