// Megatron-core's MoE layer (modules/moe.h) run alone on the module harness, counted by hand
// from megatron/core/transformer/moe/ (router.py, token_dispatcher.py, experts.py, moe_utils.py).
//
// Shape: testing::TinyLlama with E = 4 routed experts of width Fe = 32, top-k = 2, the alltoall
// dispatcher and grouped GEMM (TEGroupedMLP), EP 1, TP 1, dropless, balanced: n = T = 32 local
// tokens, S = n·k = 64 permuted tokens, N = 64 tokens through the 4 local experts (moe.h
// MoeTokens); h 64, gated experts (γ = 2); bf16; no aux loss, no shared experts.
#include "workload/modules/moe.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::moe_module_test {

using testing::ModuleHarness;
using testing::SeenTensors;

constexpr Bytes kN = 32, kE = 4, kK = 2, kFe = 32, kH = 64, kGamma = 2;
constexpr Bytes kSent = kN * kK, kExpertTokens = kSent;

config::Setup TinyMoe() {
  config::Setup s = testing::TinyLlama();
  s.model.num_experts = 4;
  s.model.moe_router_topk = 2;
  s.model.moe_ffn_hidden_size = 32;
  s.training.moe_token_dispatcher_type = "alltoall";
  s.training.moe_grouped_gemm = true;
  return s;
}

TEST_CASE(
    "MoE forward saves the router's top-k, the routing and permutation maps and the "
    "experts' inputs and activations",
    "[workload][modules][moe]") {
  ModuleHarness h(TinyMoe());
  const MoeTokens tokens = ComputeMoeTokens(h.dims());
  CHECK(tokens.n == kN);
  CHECK(tokens.send == kSent);
  CHECK(tokens.expert == kExpertTokens);
  MoeModule moe;
  h.Forward(moe);
  CHECK(h.Saved() == SeenTensors{
                         // pre_mlp_layernorm (its own TENorm in the MoE spec): rsigma fp32 [n],
                         // output [n, h].
                         {"layer0.ln2.rstd", 4 * kN},
                         {"layer0.ln2.out", 2 * kN * kH},
                         // topk_routing_with_score_function: the top-k indices int64 [n, k]
                         // (scatter's backward), the fp32 softmax of the top-k scores [n, k]
                         // (SoftmaxBackward), the bool routing map [n, E] the dispatcher keeps.
                         {"layer0.moe.router.topk_indices", 8 * kN * kK},
                         {"layer0.moe.router.topk_probs_fp32", 4 * kN * kK},
                         {"layer0.moe.router.routing_map", kN * kE},
                         // permute()'s sorted indices, int64 [S], the unpermute's map.
                         {"layer0.moe.permutation_map", 8 * kSent},
                         // sort_chunks_by_idxs (4 local experts): the tokens [N, h] and probs [N]
                         // the experts take, saved by fc1 and the weighted activation.
                         {"layer0.moe.dispatched_tokens", 2 * kExpertTokens * kH},
                         {"layer0.moe.dispatched_probs", 2 * kExpertTokens},
                         // TEGroupedMLP: fc1's output [N, γ·Fe] and the activation's [N, Fe].
                         {"layer0.moe.experts.fc1_out", 2 * kExpertTokens * kGamma * kFe},
                         {"layer0.moe.experts.act_out", 2 * kExpertTokens * kFe},
                     });
  CHECK(h.problems().empty());
}

TEST_CASE("MoE backward frees all it saved and hands each expert's weight grads to the wrapper",
          "[workload][modules][moe]") {
  config::Setup s = TinyMoe();
  s.training.gradient_accumulation_fusion = false;
  ModuleHarness h(s);
  MoeModule moe;
  h.Forward(moe);
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
  // Grouped GEMM: fc2's grads of the 4 experts ([h, Fe], 2·h·Fe each), then fc1's ([γ·Fe, h]),
  // then the router's [E, h] and the norm's [h].
  SeenTensors expected;
  for (int e = 0; e < 4; ++e) {
    expected.push_back({fmt::format("layer0.mlp.experts.{}.fc2.weight", e), 2 * kH * kFe});
  }
  for (int e = 0; e < 4; ++e) {
    expected.push_back({fmt::format("layer0.mlp.experts.{}.fc1.weight", e), 2 * kGamma * kFe * kH});
  }
  expected.push_back({"layer0.mlp.router.weight", 2 * kE * kH});
  expected.push_back({"layer0.ln2.weight", 2 * kH});
  CHECK(h.wrapper().grads() == expected);
}

TEST_CASE(
    "selective moe_act recompute drops the experts' activation after fc2 and makes it "
    "again in backward",
    "[workload][modules][moe]") {
  config::Setup s = TinyMoe();
  s.training.recompute_granularity = config::RecomputeGranularity::kSelective;
  s.training.recompute_modules = {"moe_act"};
  ModuleHarness h(s);
  MoeModule moe;
  h.Forward(moe);
  const testing::SeenTensor act{"layer0.moe.experts.act_out", 2 * kExpertTokens * kFe};
  const SeenTensors saved = h.Saved();
  CHECK(std::count(saved.begin(), saved.end(), act) == 0);
  h.Backward();
  const SeenTensors backward = h.Allocated(Phase::kBackward);
  CHECK(std::count(backward.begin(), backward.end(), act) == 1);
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::moe_module_test
