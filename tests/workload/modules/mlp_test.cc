// Megatron-core's dense MLP module (modules/mlp.h) run alone on the module harness, counted by
// hand from megatron/core/transformer/mlp.py with the Transformer Engine spec.
//
// Shape (testing::TinyLlama): h 64, ffn 128, gated (SwiGLU: fc1 is [2·ffn/t, h], γ = 2), s 32,
// b 1: T = 32 tokens; TP 1; bf16 (2 bytes an element); RMSNorm, no biases, no dropout.
#include "workload/modules/mlp.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/modules/decoder_layer.h"
#include "workload/test_setups.h"

namespace memsim::workload::mlp_module_test {

using testing::ModuleHarness;
using testing::SeenTensors;

constexpr Bytes kT = 32, kH = 64, kFfn = 128, kGamma = 2;

TEST_CASE(
    "MLP forward saves the norm statistics and output, fc1's output and the activation's "
    "output",
    "[workload][modules][mlp]") {
  ModuleHarness h(testing::TinyLlama());
  MlpModule mlp;
  h.Forward(mlp);
  CHECK(h.Saved() == SeenTensors{
                         // TELayerNormColumnParallelLinear: rsigma fp32 [T], ln_out [s, b, h].
                         {"layer0.ln2.rstd", 4 * kT},
                         {"layer0.ln2.out", 2 * kT * kH},
                         // fc1's output [s, b, γ·ffn/t], the SwiGLU's input: 2·T·γ·ffn.
                         {"layer0.mlp.fc1_out", 2 * kT * kGamma * kFfn},
                         // The activation's output [s, b, ffn/t], fc2's input: 2·T·ffn.
                         {"layer0.mlp.act_out", 2 * kT * kFfn},
                     });
  CHECK(h.problems().empty());
}

TEST_CASE(
    "MLP backward frees all it saved and, without wgrad fusion, hands fc2's, fc1's and the "
    "norm's grads to the wrapper",
    "[workload][modules][mlp]") {
  config::Setup s = testing::TinyLlama();
  s.training.gradient_accumulation_fusion = false;
  ModuleHarness h(s);
  MlpModule mlp;
  h.Forward(mlp);
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
  // fc2 [h, ffn] (2·h·ffn), fc1 [γ·ffn, h] (2·γ·ffn·h), the norm weight [h] (2·h).
  CHECK(h.wrapper().grads() == SeenTensors{{"layer0.mlp.fc2.weight", 2 * kH * kFfn},
                                           {"layer0.mlp.fc1.weight", 2 * kGamma * kFfn * kH},
                                           {"layer0.ln2.weight", 2 * kH}});
}

TEST_CASE("selective mlp recompute saves nothing in forward and re-runs the branch in backward",
          "[workload][modules][mlp]") {
  config::Setup s = testing::TinyLlama();
  s.training.recompute_granularity = config::RecomputeGranularity::kSelective;
  s.training.recompute_modules = {"mlp"};
  ModuleHarness h(s);
  MlpModule mlp;
  h.Forward(mlp);
  // tensor_parallel.checkpoint runs norm, fc1, activation and fc2 under no_grad and keeps only
  // the branch input, the layer input the residual keeps anyway.
  CHECK(h.Saved().empty());
  h.Backward();
  // The re-run makes fc1's and the activation's outputs again (sizes as above).
  const SeenTensors backward = h.Allocated(Phase::kBackward);
  for (const testing::SeenTensor& t :
       {testing::SeenTensor{"layer0.mlp.fc1_out", 2 * kT * kGamma * kFfn},
        testing::SeenTensor{"layer0.mlp.act_out", 2 * kT * kFfn}}) {
    CHECK(std::count(backward.begin(), backward.end(), t) == 1);
  }
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE(
    "MLP under sequence parallelism saves the norm on the 1/t shard and fc1's output on the "
    "gathered sequence",
    "[workload][modules][mlp]") {
  config::Setup s = testing::TinyLlama();
  s.training.tensor_model_parallel_size = 2;
  s.training.sequence_parallel = true;
  ModuleHarness h(s);
  MlpModule mlp;
  h.Forward(mlp);
  // t = σ = 2: the norm runs on [s/σ, b, h] (T/σ = 16 tokens); fc1 runs on the all-gathered
  // sequence, with its output split over TP: [s, b, γ·ffn/t]; the activation [s, b, ffn/t].
  CHECK(h.Saved() == SeenTensors{{"layer0.ln2.rstd", 4 * kT / 2},
                                 {"layer0.ln2.out", 2 * kT * kH / 2},
                                 {"layer0.mlp.fc1_out", 2 * kT * kGamma * kFfn / 2},
                                 {"layer0.mlp.act_out", 2 * kT * kFfn / 2}});
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE(
    "without grad a layer's input and its attention output stay alive until the layer returns",
    "[workload][modules][mlp][decoder_layer][lifetimes]") {
  // Two layers inside one full-recompute checkpoint (no grad). Megatron-core TransformerBlock's
  // checkpointed loop rebinds `hidden_states` to a layer's output only when the layer returns,
  // and TransformerLayer.forward holds the attention output in `hidden_states` while
  // _forward_mlp runs (transformer_layer.py): layer 1's input (layer 0's output) and its
  // attention output, [s, b, h] bf16 (2·T·h) each, are alive during layer 1's fc2.
  ModuleHarness h(testing::TinyLlama());
  DecoderLayer layer = DecoderLayer::Dense();
  const TensorId x = h.MakeTensor(2 * kT * kH, "harness.input");
  TensorId y = 0;
  h.Run(Phase::kForward, [&](ModuleContext& ctx) {
    DecoderLayer::Saved s0, s1;
    const TensorId x1 = layer.Forward(ctx, 0, x, /*nograd=*/true, /*free_input=*/false, &s0);
    y = layer.Forward(ctx, 1, x1, /*nograd=*/true, /*free_input=*/true, &s1);
  });
  const SeenTensors during = h.AliveDuring("mlp.fc2", 1);
  for (const char* label : {"layer0.mlp.residual", "layer1.attn.residual"}) {
    CHECK(std::find(during.begin(), during.end(), testing::SeenTensor{label, 2 * kT * kH}) !=
          during.end());
  }
  // Both go when layer 1 returns: after its last op, nothing of the two layers but y is alive.
  CHECK(h.Alive(Category::kActivations) == SeenTensors{{"layer1.mlp.residual", 2 * kT * kH}});
  h.Release({x, y});
  CHECK(h.problems().empty());
}

TEST_CASE(
    "MindSpeed activation recompute drops the activation's output after fc2 and re-runs it "
    "before fc2's backward",
    "[workload][modules][mlp][mindspeed]") {
  config::Setup s = testing::TinyLlama();
  s.training.recompute_activation_function = true;
  ModuleHarness h(s);
  MlpModule mlp;
  h.Forward(mlp);
  // core_activation_recompute_forward_impl: the activation runs in CheckpointFunctionWithoutOutput
  // (its input, fc1's output, saved), and discard_output() resizes its output's storage to 0
  // after linear_fc2: everything of the plain MLP is kept but the [s, b, ffn/t] output.
  CHECK(h.Saved() == SeenTensors{{"layer0.ln2.rstd", 4 * kT},
                                 {"layer0.ln2.out", 2 * kT * kH},
                                 {"layer0.mlp.fc1_out", 2 * kT * kGamma * kFfn}});
  h.Backward();
  // CheckpointWithoutOutput.recompute (the hook on fc2's output): the activation re-run with
  // grad (2·T·ffn), then the discarded storage restored to the same size and copied into.
  const SeenTensors backward = h.Allocated(Phase::kBackward);
  for (const testing::SeenTensor& t :
       {testing::SeenTensor{"layer0.recompute.mlp.act_out", 2 * kT * kFfn},
        testing::SeenTensor{"layer0.mlp.act_out", 2 * kT * kFfn}}) {
    CHECK(std::count(backward.begin(), backward.end(), t) == 1);
  }
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::mlp_module_test
