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
                         // The dense probs [n, E] bf16, bound to the dispatcher's self.probs
                         // (dispatch_preprocess) until the layer's next forward.
                         {"layer0.moe.router.probs", 2 * kN * kE},
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
  // Only what the dispatcher's attributes hold stays (next test).
  CHECK(h.Leaked().size() == 3);
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
  CHECK(h.Leaked().size() == 3);  // the dispatcher's attributes (below)
  CHECK(h.problems().empty());
}

TEST_CASE(
    "the token dispatcher's attributes outlive the layer's backward until its next forward "
    "rebinds them",
    "[workload][modules][moe]") {
  ModuleHarness h(TinyMoe());
  MoeModule moe;
  h.Forward(moe);
  h.Backward();
  // MoEAlltoAllTokenDispatcher.dispatch_preprocess (token_dispatcher.py) binds self.probs, the
  // router's dense probs [n, E] bf16 = 2·32·4 = 256 B, and self.routing_map [n, E] bool =
  // 32·4 = 128 B; permute's sorted indices int64 [S] = 8·64 = 512 B go to
  // self.reversed_local_input_permutation_mapping. Nothing clears them: after the backward
  // released autograd's references (IndexSelectBackward's index), 896 B stay.
  CHECK(h.Leaked() == SeenTensors{{"layer0.moe.router.probs", 2 * kN * kE},
                                  {"layer0.moe.router.routing_map", kN * kE},
                                  {"layer0.moe.permutation_map", 8 * kSent}});
  CHECK(TotalBytes(h.Leaked()) == 896);
  CHECK(h.FreedIn("layer0.moe.router.probs").empty());
  // The layer's next forward rebinds the three in its dispatch_preprocess (memsim's permute op).
  h.Forward(moe);
  CHECK(h.FreedIn("layer0.moe.router.probs") == "moe.permute");
  CHECK(h.FreedIn("layer0.moe.router.routing_map") == "moe.permute");
  CHECK(h.FreedIn("layer0.moe.permutation_map") == "moe.permute");
  CHECK(h.problems().empty());
}

TEST_CASE("MoE at EP 1: the all-to-alls return their input and allocate nothing",
          "[workload][modules][moe]") {
  // tensor_parallel/mappings.py _AllToAll.forward: `if world_size == 1: return input`, and its
  // backward applies _AllToAll again. TinyMoe runs EP 1: no received tokens [R, h] or probs [R]
  // in the dispatch, no combined tokens [S, h] in the combine, and no all-to-all gradients.
  ModuleHarness h(TinyMoe());
  REQUIRE(h.dims().ep == 1);
  MoeModule moe;
  h.Forward(moe);
  h.Backward();
  auto has = [](const SeenTensors& seen, const std::string& label) {
    return std::any_of(seen.begin(), seen.end(),
                       [&](const testing::SeenTensor& t) { return t.label == label; });
  };
  const SeenTensors fwd = h.Allocated(Phase::kForward);
  const SeenTensors bwd = h.Allocated(Phase::kBackward);
  for (const char* label : {"layer0.moe.received_tokens", "layer0.moe.received_probs",
                            "layer0.moe.combined_tokens"}) {
    CHECK_FALSE(has(fwd, label));
  }
  for (const char* label : {"layer0.moe.d_expert_output_ep", "layer0.moe.d_permuted_tokens",
                            "layer0.moe.d_permuted_probs"}) {
    CHECK_FALSE(has(bwd, label));
  }
  // The permuted copies [S, h] are the dispatch's output: the sort by local expert (4 local
  // experts) reads them, and custom_forward's hidden_states and dispatched_input (both the
  // same tensor) hold them until it returns: 2·64·64 = 8192 B alive during the sort, freed once.
  const SeenTensors during_sort = h.AliveDuring("moe.sort_chunks");
  CHECK(std::count(during_sort.begin(), during_sort.end(),
                   testing::SeenTensor{"layer0.moe.permuted_tokens", 2 * kSent * kH}) == 1);
  CHECK(h.FreedIn("layer0.moe.permuted_tokens") == "moe.unpermute");
  CHECK(h.problems().empty());
}

TEST_CASE("MoE allgather dispatcher with TP×EP 1: no gathers, no reduce-scatter",
          "[workload][modules][moe]") {
  // token_dispatcher.py MoEAllGatherTokenDispatcher (core 0.10-0.16): token_dispatch /
  // token_permutation gather the map, probs and tokens and token_combine reduce-scatters only
  // `if self.tp_size > 1 or self.ep_size > 1`. At EP 1, TP 1 none of the gathered copies, the
  // reduce-scatter's output or their gradients exist, and the "mpu" buffer is not touched.
  config::Setup s = TinyMoe();
  s.training.moe_token_dispatcher_type = "allgather";
  ModuleHarness h(s);
  MoeModule moe;
  h.Forward(moe);
  h.Backward();
  auto has = [](const SeenTensors& seen, const std::string& label) {
    return std::any_of(seen.begin(), seen.end(),
                       [&](const testing::SeenTensor& t) { return t.label == label; });
  };
  const SeenTensors fwd = h.Allocated(Phase::kForward);
  const SeenTensors bwd = h.Allocated(Phase::kBackward);
  for (const char* label :
       {"layer0.moe.routing_map_gathered", "layer0.moe.probs_gathered", "layer0.moe.output"}) {
    CHECK_FALSE(has(fwd, label));
  }
  for (const char* label : {"layer0.moe.d_unpermuted_tokens", "layer0.moe.d_routed_input",
                            "layer0.moe.d_probs"}) {
    CHECK_FALSE(has(bwd, label));
  }
  // What stays: dispatch_postprocess's self.local_map [n, El] bool = 32·4 = 128 B,
  // self.local_probs [N] bf16 = 2·64 = 128 B and the mapping int64 [N] = 8·64 = 512 B.
  CHECK(h.Leaked() == SeenTensors{{"layer0.moe.local_map", kN * kE},
                                  {"layer0.moe.local_probs", 2 * kExpertTokens},
                                  {"layer0.moe.permutation_map", 8 * kExpertTokens}});
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::moe_module_test
