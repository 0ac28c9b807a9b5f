// Mixture of experts: parameter counts of the shipped MoE models, and one MoE layer's tensors
// derived by hand from Megatron-core's code (megatron/core/transformer/moe/).
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "config/load.h"
#include "workload/module_harness.h"
#include "test_setups.h"
#include "workload/build.h"
#include "workload/model.h"
#include "workload/modules/moe.h"

namespace memsim::workload {
namespace {

struct Counts {
  std::int64_t total = 0, expert = 0;
};
Counts CountParams(const std::vector<ParamTensor>& params) {
  Counts c;
  for (const ParamTensor& p : params) {
    c.total += p.numel;
    if (p.expert) c.expert += p.numel;
  }
  return c;
}

// The shipped config with every parallel size 1, so one rank holds the whole model.
config::Setup WholeModel(const std::string& config) {
  config::LoadOptions o;
  for (const char* key : {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "data_parallel_size", "expert_model_parallel_size"}) {
    o.overrides.push_back(std::string("training.") + key + "=1");
  }
  o.overrides.emplace_back("training.global_batch_size=1");
  return config::LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/" + config, o);
}

TEST_CASE("qwen3-30b-a3b: 30.53 B parameters, 3.35 B active", "[workload][moe]") {
  const config::Setup s = WholeModel("qwen3-30b-a3b-910b-pp4-ep4.json");
  // models/qwen3-30b-a3b.json: h 2048, 48 layers, 32 heads of 128, 4 KV heads, 128 experts of
  // width 768, top-8, vocab 151936 (= 1187·128, no padding), untied, every layer MoE.
  // Per layer: q 2048·4096 = 8,388,608; k, v 2048·512 each = 2,097,152; o 4096·2048 =
  //   8,388,608; q/k norms 2·128; ln1, ln2 2·2048: attention and norms 18,878,720.
  //   Router 128·2048 = 262,144. Experts 128 · 3·2048·768 = 128 · 4,718,592 = 603,979,776.
  //   Layer 623,120,640; ×48 = 29,909,790,720.
  // Embedding and output layer 2·151936·2048 = 622,329,856; final norm 2048.
  // Total 30,532,122,624 (30.53 B). Active: 8 of 128 experts, 8·4,718,592 = 37,748,736 a
  // layer: 48·(18,878,720 + 262,144 + 37,748,736) + 622,331,904 = 3,353,032,704 (3.35 B).
  const Counts c = CountParams(StageParams(s, 0));
  CHECK(c.total == 30'532'122'624);
  CHECK(c.expert == 48 * std::int64_t{603'979'776});
  CHECK(c.total - c.expert + c.expert / 128 * 8 == 3'353'032'704);
}

TEST_CASE("mixtral-8x7b: 46.70 B parameters, 12.88 B active", "[workload][moe]") {
  const config::Setup s = WholeModel("mixtral-8x7b-h100-pp4-ep8.json");
  // models/mixtral-8x7b.json: h 4096, 32 layers, 32 heads, 8 KV heads (head 128), 8 experts of
  // width 14336, top-2, vocab 32000 (= 250·128), untied.
  // Per layer: q, o 4096² each = 33,554,432; k, v 4096·1024 each = 8,388,608; ln1, ln2 8192:
  //   41,951,232. Router 8·4096 = 32,768. Experts 8 · 3·4096·14336 = 8 · 176,160,768 =
  //   1,409,286,144. Layer 1,451,270,144; ×32 = 46,440,644,608.
  // Embedding and output 2·32000·4096 = 262,144,000; final norm 4096.
  // Total 46,702,792,704 (46.70 B). Active: 2 of 8 experts a layer:
  // 32·(41,951,232 + 32,768 + 352,321,536) + 262,148,096 = 12,879,925,248 (12.88 B).
  const Counts c = CountParams(StageParams(s, 0));
  CHECK(c.total == 46'702'792'704);
  CHECK(c.total - c.expert + c.expert / 8 * 2 == 12'879'925'248);
}

// The run header's "total" (TotalParameterCounts) is the shipped config as given, EP and PP
// included: every expert counts, so it equals the whole-model counts derived in the two tests
// above (46,702,792,704 and 30,532,122,624), whatever the config's parallel sizes.
TEST_CASE("run header total counts every expert of the shipped MoE configs", "[workload][moe]") {
  const auto [config, total] = GENERATE(table<std::string, std::int64_t>(
      {{"mixtral-8x7b-h100-pp4-ep8.json", 46'702'792'704},
       {"qwen3-30b-a3b-910b-pp4-ep4.json", 30'532'122'624}}));
  config::LoadOptions o;
  const config::Setup s =
      config::LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/" + config, o);
  CHECK(TotalParameterCounts(s).total == total);
  CHECK(TotalParameterCounts(s).trainable == total);
}

// "on this rank" never exceeds "total": a rank holds a part of the layers (PP), of the experts
// (EP) and of each matrix (TP), each at most the whole. Checked at every EP the config's data
// parallel size allows (config/moe.cc CheckMoe: EP·ETP divides TP·DP·CP, here 8 and 4) and every
// stage.
TEST_CASE("parameters on a rank never exceed the total, shipped MoE configs at each EP",
          "[workload][moe]") {
  const auto [config, ep] = GENERATE(table<std::string, int>(
      {{"mixtral-8x7b-h100-pp4-ep8.json", 1}, {"mixtral-8x7b-h100-pp4-ep8.json", 2},
       {"mixtral-8x7b-h100-pp4-ep8.json", 4}, {"mixtral-8x7b-h100-pp4-ep8.json", 8},
       {"qwen3-30b-a3b-910b-pp4-ep4.json", 1}, {"qwen3-30b-a3b-910b-pp4-ep4.json", 2},
       {"qwen3-30b-a3b-910b-pp4-ep4.json", 4}}));
  config::LoadOptions o;
  o.overrides.push_back("training.expert_model_parallel_size=" + std::to_string(ep));
  const config::Setup s =
      config::LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/" + config, o);
  const std::int64_t total = TotalParameterCounts(s).total;
  for (int rank = 0; rank < s.training.pipeline_model_parallel_size; ++rank) {
    INFO(config << " EP " << ep << " stage " << rank);
    const std::int64_t on_rank = ComputeStaticSizes(s, rank).parameter_count;
    CHECK(on_rank > 0);
    CHECK(on_rank <= total);
  }
}

TEST_CASE("qwen2_moe: shared expert and gate, decoder_sparse_step, mlp_only_layers",
          "[workload][moe]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("memsim_moe_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "m.json")
      << R"({"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
             "vocab_size": 256, "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
             "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": false})";
  std::ofstream(dir / "c.json")
      << R"({"model": "m.json", "device": "h100-80g", "training": {"seq_length": 32}})";
  const config::Setup s = config::LoadSetup((dir / "c.json").string(), {});
  // Qwen2MoeDecoderLayer: sparse when (i + 1) % 2 == 0 and i not in mlp_only_layers: layer 1
  // only (layer 3 is listed).
  const ModelDims d = ComputeDims(s);
  CHECK(!d.IsMoeLayer(0));
  CHECK(d.IsMoeLayer(1));
  CHECK(!d.IsMoeLayer(2));
  CHECK(!d.IsMoeLayer(3));
  std::map<std::string, std::int64_t> layer1;
  for (const ParamTensor& p : StageParams(s, 0)) {
    if (p.layer == 1) layer1[p.name] = p.numel;
  }
  // Router 4·64; 4 experts of fc1 2·32·64 and fc2 64·32; shared expert fc1 2·64·64, fc2 64·64
  // and its gate [1, 64].
  CHECK(layer1.at("layer1.mlp.router.weight") == 256);
  CHECK(layer1.at("layer1.mlp.experts.3.fc1.weight") == 4096);
  CHECK(layer1.at("layer1.mlp.experts.3.fc2.weight") == 2048);
  CHECK(layer1.at("layer1.mlp.shared_experts.fc1.weight") == 8192);
  CHECK(layer1.at("layer1.mlp.shared_experts.fc2.weight") == 4096);
  CHECK(layer1.at("layer1.mlp.shared_experts.gate_weight") == 64);
  // Builds and balances its books (every tensor of the shared experts freed in backward).
  CHECK_NOTHROW(Build(s, 0));
}

// A small MoE model: TinyLlama's attention (h 64, 4 heads, 2 layers, seq 32, one micro-batch of
// 1: T = n = 32 tokens) with 4 experts of width 32 (SwiGLU), top-2, EP 2 over DP 2, the
// alltoall dispatcher and grouped GEMM; no aux loss, no dropout.
config::Setup SmallMoe(double imbalance) {
  config::Setup s = testing::TinyLlama();
  s.model.num_experts = 4;
  s.model.moe_router_topk = 2;
  s.model.moe_ffn_hidden_size = 32;
  s.training.data_parallel_size = 2;
  s.training.global_batch_size = 2;
  s.training.expert_model_parallel_size = 2;
  s.training.moe_token_dispatcher_type = "alltoall";
  s.training.moe_grouped_gemm = true;
  s.training.moe_imbalance_factor = imbalance;
  return s;
}

// Sizes of the tensors labelled layer0.moe.* / layer0.ln2.* allocated by iteration 1's ops of
// `phase` (label -> bytes, summed over tensors sharing a label), and those of them still alive
// at the end of the phase's ops (saved for backward).
struct PhaseBytes {
  std::map<std::string, Bytes> allocated, alive;
};
PhaseBytes MoeLayerBytes(const Program& p, Phase phase) {
  std::map<TensorId, const TensorAlloc*> live;
  PhaseBytes out;
  for (const Op& op : p.ops) {
    if (op.iteration != 1 || op.phase != phase || op.layer != 0) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.rfind("layer0.moe.", 0) != 0 && a.label.rfind("layer0.ln2.", 0) != 0) continue;
      out.allocated[a.label] += a.size_bytes;
      live[a.id] = &a;
    }
    for (TensorId id : op.frees) live.erase(id);
  }
  for (const auto& [id, a] : live) out.alive[a->label] += a->size_bytes;
  return out;
}

// The op that frees each layer-0 tensor of iteration 1 first (label -> op name).
std::map<std::string, std::string> FreedBy(const Program& p) {
  std::map<TensorId, std::string> labels;
  std::map<std::string, std::string> out;
  for (const Op& op : p.ops) {
    if (op.iteration != 1 || op.layer != 0) continue;
    for (const TensorAlloc& a : op.allocs) labels[a.id] = a.label;
    for (TensorId id : op.frees) {
      if (labels.count(id) != 0) out.emplace(labels[id], op.name);
    }
  }
  return out;
}

Bytes Sum(const std::map<std::string, Bytes>& m) {
  Bytes s = 0;
  for (const auto& [label, bytes] : m) s += bytes;
  return s;
}

TEST_CASE("one MoE layer, alltoall, EP 2: forward and backward bytes by hand", "[workload][moe]") {
  // n = 32 local tokens, h = 64, E = 4, k = 2, El = E/ep = 2, Fe = 32, bf16 (2 B).
  // Sent S = n·k = 64 (token_dispatcher.py preprocess, num_out_tokens dropless).
  // Received R = S under balanced routing, 2·S = 128 at imbalance 2 (at most n·ep·min(k, El)
  // = 128); the experts see N = R (etp 1).
  const ModelDims d1 = ComputeDims(SmallMoe(1.0));
  const MoeTokens t1 = ComputeMoeTokens(d1);
  CHECK(t1.send == 64);
  CHECK(t1.receive == 64);
  CHECK(ComputeMoeTokens(ComputeDims(SmallMoe(2.0))).receive == 128);

  const Program p1 = Build(SmallMoe(1.0), 0);
  const Program p2 = Build(SmallMoe(2.0), 0);
  const PhaseBytes f1 = MoeLayerBytes(p1, Phase::kForward);
  const PhaseBytes f2 = MoeLayerBytes(p2, Phase::kForward);
  // The receive buffer (_AllToAll output, token_dispatch): R·h·2 = 64·64·2 = 8192 B; 16384 B at
  // imbalance 2.
  CHECK(f1.allocated.at("layer0.moe.received_tokens") == 8192);
  CHECK(f2.allocated.at("layer0.moe.received_tokens") == 16384);
  // The permuted copies sent (permute): S·h·2 = 8192 B, whatever the imbalance.
  CHECK(f2.allocated.at("layer0.moe.permuted_tokens") == 8192);

  // Saved for backward, balanced:
  //   ln2 rstd fp32 [n] 128 + output [n, h] 4096 (the router's and permute's input)
  //   router: top-k indices int64 [n, k] 512, fp32 softmax of the top-k [n, k] 256,
  //           routing map bool [n, E] 128
  //   permute's sorted indices int64 [S] 512
  //   experts: fc1 input [N, h] 8192, fc1 output [N, 2·Fe] 8192, activation output [N, Fe]
  //            4096, permuted probs [N] 128
  //   the dispatcher's self.probs: the dense probs [n, E] bf16 256 (not saved, but bound until
  //            the layer's next forward)
  //   = 4224 + 896 + 512 + 20608 + 256 = 26,496 B.
  CHECK(f1.alive.at("layer0.moe.experts.fc1_out") == 8192);
  CHECK(Sum(f1.alive) == 26'496);
  // Imbalance 2: N = 128 doubles the expert tensors (20608 -> 41216): 47,104 B.
  CHECK(Sum(f2.alive) == 47'104);

  // Backward allocations of the branch, balanced (each freed within the backward):
  //   [.., h] and [N, 2·Fe] tensors of 8192 B: unpermute's backward [S, h], the alltoall back
  //     [R, h], the unsort's backward [N, h], the activation's backward [N, 2·Fe], fc1's dgrad
  //     [N, h], the sort's backward [N, h], the dispatch alltoall back [S, h]: 7·8192 = 57,344
  //   4096 B: fc2's dgrad [N, Fe], permute's backward [n, h], the router's input grad [n, h],
  //     the sum of the two input grads [n, h], the norm's input grad [n, h]: 5·4096 = 20,480
  //   128 B: the probs' grad [N], its sort back [N], its alltoall back [S], the top-k grad
  //     [n, k] bf16, the norm's weight grad [h]: 5·128 = 640
  //   256 B: the dense probs' grad [n, E], the fp32 softmax grad [n, k], the logits' grad
  //     [n, E]: 768
  //   512 B: the router's weight grad [E, h]
  //   total 57,344 + 20,480 + 640 + 768 + 512 = 79,744 B.
  const PhaseBytes b1 = MoeLayerBytes(p1, Phase::kBackward);
  CHECK(Sum(b1.allocated) == 79'744);
  CHECK(b1.alive.empty());
}

TEST_CASE("Megatron-core < 0.13: unpermute weights the tokens by the probs and saves them",
          "[workload][moe][peak]") {
  // core_v0.10.0 .. core_v0.12.x, alltoall dispatcher: token_unpermutation calls moe_utils.py
  // unpermute(..., probs=self.probs), whose `permuted_tokens * permuted_probs.unsqueeze(-1)`
  // saves the combined tokens [S, h] for MulBackward: S·h·2 = 64·64·2 = 8192 B; the product
  // (8192 B) dies after scatter_add_. From core_v0.13.0 the experts apply the probs instead.
  config::Setup s = SmallMoe(1.0);
  s.training.megatron_core_version = {0, 12};
  REQUIRE(testing::FactsOf(s).moe_probs_at_unpermute);
  const PhaseBytes f = MoeLayerBytes(Build(s, 0), Phase::kForward);
  CHECK(f.alive.at("layer0.moe.combined_tokens") == 8192);
  CHECK(f.allocated.at("layer0.moe.weighted_tokens") == 8192);
  CHECK(f.alive.count("layer0.moe.weighted_tokens") == 0);
  // Freed by the unpermute's backward.
  CHECK(FreedBy(Build(s, 0)).at("layer0.moe.combined_tokens") == "moe.unpermute_bwd");
  s.training.megatron_core_version = {0, 13};
  CHECK_FALSE(testing::FactsOf(s).moe_probs_at_unpermute);
  CHECK(MoeLayerBytes(Build(s, 0), Phase::kForward).alive.count("layer0.moe.combined_tokens") == 0);
  // TE's fused unpermute (moe_permute_fusion) takes another path; unstated versions are current.
  s.training.megatron_core_version = {0, 12};
  s.training.moe_permute_fusion = true;
  CHECK_FALSE(testing::FactsOf(s).moe_probs_at_unpermute);
  CHECK_FALSE(testing::FactsOf(SmallMoe(1.0)).moe_probs_at_unpermute);
}

TEST_CASE("MoE router pre-softmax (--moe-router-pre-softmax) saves the fp32 softmax over every expert",
          "[workload][moe][peak]") {
  // moe_utils.py topk_softmax_with_capacity (core 0.10) / topk_routing_with_score_function:
  // with use_pre_softmax, `torch.softmax(logits, dim=-1, dtype=torch.float32)` runs on all
  // [n, E] logits before the top-k, and SoftmaxBackward saves its fp32 result: n·E·4 =
  // 32·4·4 = 512 B, where the post-softmax path saves the softmax of the top-k scores, n·k·4 =
  // 32·2·4 = 256 B (SmallMoe: n 32 tokens, E 4, k 2).
  config::Setup s = SmallMoe(1.0);
  const PhaseBytes post = MoeLayerBytes(Build(s, 0), Phase::kForward);
  CHECK(post.alive.at("layer0.moe.router.topk_probs_fp32") == 256);
  CHECK(post.alive.count("layer0.moe.router.softmax_fp32") == 0);
  s.training.moe_router_pre_softmax = true;
  const Program p = Build(s, 0);
  const PhaseBytes pre = MoeLayerBytes(p, Phase::kForward);
  CHECK(pre.alive.at("layer0.moe.router.softmax_fp32") == 512);
  CHECK(pre.alive.count("layer0.moe.router.topk_probs_fp32") == 0);
  CHECK(Sum(pre.alive) - Sum(post.alive) == 512 - 256);
  // Current releases (core 0.18 on, and an unstated version): the top-k on the fp32 scores
  // gives fp32 probs [n, k] (256 B), cast to bf16 (128 B), both freed in the router.
  CHECK(pre.allocated.at("layer0.moe.router.topk_probs_fp32") == 256);
  CHECK(pre.allocated.count("layer0.moe.router.softmax") == 0);
  // Up to core 0.17 the scores are cast back to bf16 before the top-k: a [n, E] copy of
  // 32·4·2 = 256 B, freed in the router.
  s.training.megatron_core_version = {0, 10};
  const PhaseBytes old = MoeLayerBytes(Build(s, 0), Phase::kForward);
  CHECK(old.allocated.at("layer0.moe.router.softmax") == 256);
  CHECK(old.alive.count("layer0.moe.router.softmax") == 0);
  // The softmax's backward makes its input grad over all E logits: 512 B (256 B post-softmax).
  CHECK(MoeLayerBytes(p, Phase::kBackward).allocated.at("layer0.moe.router.d_softmax_fp32") ==
        512);
}

TEST_CASE("core 0.10-0.12: unpermute's masked_select saves the transposed probs and map",
          "[workload][moe][peak]") {
  // moe_utils.py unpermute (core_v0.10.0; core_v0.11.0 and 0.12 unless drop_and_pad):
  // `probs.T.contiguous().masked_select(routing_map.T.contiguous())`; MaskedSelectBackward
  // saves self and mask (derivatives.yaml: masked_select_backward(grad, self, mask)): [E, n]
  // bf16 = 4·32·2 = 256 B and [E, n] bool = 128 B, until the unpermute's backward.
  config::Setup s = SmallMoe(1.0);
  s.training.megatron_core_version = {0, 10};
  REQUIRE(testing::FactsOf(s).unpermute_masked_select);
  const PhaseBytes f = MoeLayerBytes(Build(s, 0), Phase::kForward);
  CHECK(f.alive.at("layer0.moe.unpermute_probs_t") == 256);
  CHECK(f.alive.at("layer0.moe.unpermute_map_t") == 128);
  // Both freed by masked_select's backward, right after the prob weighting's.
  const std::map<std::string, std::string> freed_by = FreedBy(Build(s, 0));
  CHECK(freed_by.at("layer0.moe.unpermute_probs_t") == "moe.unpermute_probs_bwd");
  CHECK(freed_by.at("layer0.moe.unpermute_map_t") == "moe.unpermute_probs_bwd");
  // Padding to capacity: 0.10 still takes masked_select, 0.11 and 0.12 index_select (whose
  // backward keeps only the index).
  s.training.moe_expert_capacity_factor = 1.0;
  s.training.moe_pad_expert_input_to_capacity = true;
  CHECK(testing::FactsOf(s).unpermute_masked_select);
  s.training.megatron_core_version = {0, 11};
  CHECK_FALSE(testing::FactsOf(s).unpermute_masked_select);
  s.training.moe_pad_expert_input_to_capacity = false;
  CHECK(testing::FactsOf(s).unpermute_masked_select);
  // From 0.13 the experts apply the probs: no unpermute of them at all.
  s.training.megatron_core_version = {0, 13};
  CHECK_FALSE(testing::FactsOf(s).unpermute_masked_select);
}

// The op of layer 0's forward that frees each tensor first (label -> op name), iteration 1.
std::map<std::string, std::string> ForwardFreedBy(const Program& p) {
  std::map<TensorId, std::string> labels;
  std::map<std::string, std::string> out;
  for (const Op& op : p.ops) {
    if (op.iteration != 1 || op.layer != 0 || op.phase != Phase::kForward) continue;
    for (const TensorAlloc& a : op.allocs) labels[a.id] = a.label;
    for (TensorId id : op.frees) {
      if (labels.count(id) != 0) out.emplace(labels[id], op.name);
    }
  }
  return out;
}

TEST_CASE("MoE forward: custom_forward's locals keep the dispatch's tokens until it returns",
          "[workload][moe][peak]") {
  // SmallMoe with a shared expert (width 32): El = 2 local experts, so the all-to-all output is
  // sorted into a new tensor, and the combine's last op is the shared add.
  config::Setup s = SmallMoe(1.0);
  s.model.moe_shared_expert_intermediate_size = 32;
  // Current releases (core_v0.16.0 .. core_v0.19.0 moe_layer.py custom_forward, and a version
  // not stated): `hidden_states, probs = self.preprocess(...)` keeps the permuted copies [S, h],
  // `dispatched_input, probs = self.dispatch(...)` the all-to-all's outputs [R, h] and [R],
  // until custom_forward returns, after postprocess's shared add; dispatch_postprocess's sort
  // only rebinds its own local. `output = self.combine(output)` drops combine_preprocess's
  // result (the unsorted tokens) when the all-to-all back returns; `output =
  // self.postprocess(output, ...)` holds that all-to-all's output [S, h] through the shared add.
  // routed_experts_compute's expert_output (fc2's output) dies when it returns, after
  // combine_preprocess's sort back.
  std::map<std::string, std::string> f = ForwardFreedBy(Build(s, 0));
  CHECK(f.at("layer0.moe.permuted_tokens") == "moe.add_shared");
  CHECK(f.at("layer0.moe.received_tokens") == "moe.add_shared");
  CHECK(f.at("layer0.moe.received_probs") == "moe.add_shared");
  CHECK(f.at("layer0.moe.experts.fc2_out") == "moe.unsort_chunks");
  CHECK(f.at("layer0.moe.unsorted_tokens") == "moe.combine_alltoall");
  CHECK(f.at("layer0.moe.combined_tokens") == "moe.add_shared");
  // The permuted probs [S] die when token_dispatch returns (custom_forward rebinds `probs`).
  CHECK(f.at("layer0.moe.permuted_probs") == "moe.dispatch_alltoall");

  // core_v0.13.0 .. core_v0.15.0: combine(output, shared_expert_output) runs the all-to-all,
  // the unpermute and the shared add, while custom_forward's `output` still holds
  // combine_preprocess's result; combine's own local drops the all-to-all's output when
  // combine_postprocess returns.
  s.training.megatron_core_version = {0, 13};
  f = ForwardFreedBy(Build(s, 0));
  CHECK(f.at("layer0.moe.permuted_tokens") == "moe.add_shared");
  CHECK(f.at("layer0.moe.received_tokens") == "moe.add_shared");
  CHECK(f.at("layer0.moe.unsorted_tokens") == "moe.add_shared");
  CHECK(f.at("layer0.moe.combined_tokens") == "moe.unpermute");

  // core_v0.10.0 .. core_v0.12.0: token_permutation's locals (the permuted copies, the
  // all-to-all output) die when it returns, after the sort; custom_forward's expert_output
  // when custom_forward returns; token_unpermutation's sorted-back tokens when it returns,
  // after the unpermute. (The combined tokens are saved by the prob weighting in these releases.)
  s.training.megatron_core_version = {0, 12};
  f = ForwardFreedBy(Build(s, 0));
  CHECK(f.at("layer0.moe.permuted_tokens") == "moe.sort_chunks");
  CHECK(f.at("layer0.moe.received_tokens") == "moe.sort_chunks");
  CHECK(f.at("layer0.moe.experts.fc2_out") == "moe.add_shared");
  CHECK(f.at("layer0.moe.unsorted_tokens") == "moe.unpermute");
}

TEST_CASE("core 0.10-0.11 add the shared experts' output in place, 0.12 on into a new tensor",
          "[workload][moe]") {
  // SmallMoe with a shared expert of width 32. core_v0.10.0 / core_v0.11.0 moe_layer.py
  // custom_forward: `output += self.shared_experts(hidden_states)`: no new tensor, the shared
  // output [n, h] is dropped by the add. core_v0.12.0: `output = output + ...`, a new [n, h]
  // bf16 = 2·32·64 = 4096 B.
  config::Setup s = SmallMoe(1.0);
  s.model.moe_shared_expert_intermediate_size = 32;
  for (const std::vector<int>& v : std::vector<std::vector<int>>{{0, 10}, {0, 11}}) {
    s.training.megatron_core_version = v;
    const PhaseBytes f = MoeLayerBytes(Build(s, 0), Phase::kForward);
    CHECK(f.allocated.count("layer0.moe.output_with_shared") == 0);
    CHECK(ForwardFreedBy(Build(s, 0)).at("layer0.moe.shared_fc2_out") == "moe.add_shared");
  }
  s.training.megatron_core_version = {0, 12};
  CHECK(MoeLayerBytes(Build(s, 0), Phase::kForward).allocated.at("layer0.moe.output_with_shared") ==
        4096);
}

TEST_CASE("MoE forward: the tokens held by custom_forward raise the bytes alive at the unpermute",
          "[workload][moe][peak]") {
  // SmallMoe, current release: the module's tensors alive while the unpermute runs (layer 0's
  // forward), in bytes (n 32, h 64, E 4, k 2, S = R = N = 64, Fe 32, bf16):
  //   saved: ln2 rstd fp32 [n] 128 + output [n, h] 4096; router top-k indices int64 [n, k] 512,
  //     fp32 top-k softmax [n, k] 256, routing map bool [n, E] 128; permute's sorted indices
  //     int64 [S] 512; experts' input [N, h] 8192, probs [N] 128, fc1 output [N, 2·Fe] 8192,
  //     activation output [N, Fe] 4096                                        = 26,240
  //   the dispatcher's self.probs, the dense probs [n, E] bf16                = 256
  //   custom_forward's locals: permuted copies [S, h] 8192, all-to-all outputs [R, h] 8192 and
  //     [R] 128                                                               = 16,512
  //   the all-to-all back [S, h] 8192 and the unpermute's output [n, h] 4096 = 12,288
  //   total 55,296 B.
  testing::ModuleHarness h(SmallMoe(1.0));
  MoeModule m;
  h.Forward(m);
  CHECK(testing::TotalBytes(h.AliveDuring("moe.unpermute", 0)) == 55'296);
  h.Backward();
  // The dispatcher's attributes stay (self.probs, self.routing_map, the permutation map).
  CHECK(testing::TotalBytes(h.Leaked()) == 256 + 128 + 512);
  CHECK(h.problems().empty());
}

TEST_CASE("MoE allgather layer frees everything but the dispatcher's attributes exactly once",
          "[workload][moe]") {
  // The allgather dispatcher at EP 1 (no gathers: one map and one probs tensor under two names)
  // and EP 2, with grad and under selective moe recompute, in each release's forward. What
  // stays is what dispatch_postprocess (token_permutation before 0.13) binds: self.local_map
  // [n·ep, El] bool, self.local_probs and the mapping int64 [N], with N = n·ep·k·El/E = 64 at
  // both EP sizes (El = E/ep): local map 32·ep·(4/ep) = 128 B, mapping 8·64 = 512 B; the local
  // probs are the masked [N] bf16 from core 0.13 (2·64 = 128 B), the unmasked [n·ep, El] slice
  // before (2·32·ep·(4/ep) = 256 B).
  for (const std::vector<int>& v : std::vector<std::vector<int>>{{0, 12}, {0, 13}, {}}) {
    for (int ep : {1, 2}) {
      for (bool recompute : {false, true}) {
        config::Setup s = SmallMoe(1.0);
        s.training.moe_token_dispatcher_type = "allgather";
        s.training.data_parallel_size = ep;
        s.training.global_batch_size = ep;
        s.training.expert_model_parallel_size = ep;
        s.training.megatron_core_version = v;
        if (recompute) {
          s.training.recompute_granularity = config::RecomputeGranularity::kSelective;
          s.training.recompute_modules = {"moe"};
        }
        testing::ModuleHarness h(s);
        MoeModule m;
        h.Forward(m);
        h.Backward();
        const Bytes local_probs = v == std::vector<int>{0, 12} ? 256 : 128;
        CHECK(h.Leaked() == testing::SeenTensors{{"layer0.moe.local_map", 128},
                                                 {"layer0.moe.local_probs", local_probs},
                                                 {"layer0.moe.permutation_map", 512}});
        CHECK(h.problems().empty());
      }
    }
  }
}

TEST_CASE("MoE layer frees every token tensor its forward's locals held exactly once",
          "[workload][moe]") {
  // With grad, and under selective moe recompute (the forward under no_grad inside
  // tensor_parallel.checkpoint and its re-run in backward), custom_forward's locals hold the
  // dispatch's tokens; each release's rules, with one and with two local experts (EP 4 and 2 of
  // E 4: the all-to-all output is then, or is not, the experts' input) and with EP 1 (the
  // all-to-alls return their input, a second reference to one tensor), leave nothing behind
  // but the dispatcher's attributes and free nothing twice. The attributes (token_dispatcher.py
  // MoEAlltoAllTokenDispatcher.dispatch_preprocess / token_permutation): self.probs [n, E] bf16
  // 2·32·4 = 256 B, self.routing_map [n, E] bool 128 B, the permutation map int64 [S = n·k = 64]
  // 512 B.
  const testing::SeenTensors attrs = {{"layer0.moe.router.probs", 256},
                                      {"layer0.moe.router.routing_map", 128},
                                      {"layer0.moe.permutation_map", 512}};
  for (const std::vector<int>& v : std::vector<std::vector<int>>{{0, 12}, {0, 13}, {}}) {
    for (int ep : {1, 2, 4}) {
      for (bool recompute : {false, true}) {
      config::Setup s = SmallMoe(1.0);
      s.training.data_parallel_size = ep;
      s.training.global_batch_size = ep;
      s.training.expert_model_parallel_size = ep;
      s.training.megatron_core_version = v;
      if (recompute) {
        s.training.recompute_granularity = config::RecomputeGranularity::kSelective;
        s.training.recompute_modules = {"moe"};
      }
      testing::ModuleHarness h(s);
      MoeModule m;
      h.Forward(m);
      h.Backward();
      CHECK(h.Leaked() == attrs);
      CHECK(h.problems().empty());
      }
    }
  }
}

TEST_CASE("core 0.13-0.16: permute's masked_select saves the transposed probs and map",
          "[workload][moe][peak]") {
  // moe_utils.py permute with probs (core_v0.13.0 .. core_v0.16.0), no fusion, no padding:
  // `probs.T.contiguous().masked_select(routing_map)` with routing_map =
  // `routing_map.bool().T.contiguous()`; MaskedSelectBackward saves both: [E, n] bf16 =
  // 4·32·2 = 256 B and [E, n] bool = 128 B, until the permute's backward.
  config::Setup s = SmallMoe(1.0);
  s.training.megatron_core_version = {0, 13};
  REQUIRE(testing::FactsOf(s).permute_masked_select);
  const Program p = Build(s, 0);
  const PhaseBytes f = MoeLayerBytes(p, Phase::kForward);
  CHECK(f.alive.at("layer0.moe.permute_probs_t") == 256);
  CHECK(f.alive.at("layer0.moe.permute_map_t") == 128);
  const std::map<std::string, std::string> freed_by = FreedBy(p);
  CHECK(freed_by.at("layer0.moe.permute_probs_t") == "moe.permute_bwd");
  CHECK(freed_by.at("layer0.moe.permute_map_t") == "moe.permute_bwd");
  // core_v0.17.0 indexes the flattened probs (the backward keeps the index only); 0.12 and
  // before permute no probs; TE's fused permute and padding to capacity (index_select) neither.
  for (const std::vector<int>& v : std::vector<std::vector<int>>{{0, 17}, {0, 12}, {}}) {
    s.training.megatron_core_version = v;
    CHECK_FALSE(testing::FactsOf(s).permute_masked_select);
  }
  s.training.megatron_core_version = {0, 16};
  CHECK(testing::FactsOf(s).permute_masked_select);
  s.training.moe_permute_fusion = true;
  CHECK_FALSE(testing::FactsOf(s).permute_masked_select);
}

// The position of the first op of layer 0, iteration 1, `phase`, named `name` (-1: none).
int OpIndex(const Program& p, Phase phase, const std::string& name) {
  int i = 0;
  for (const Op& op : p.ops) {
    if (op.iteration == 1 && op.layer == 0 && op.phase == phase) {
      if (op.name == name) return i;
      ++i;
    }
  }
  return -1;
}

TEST_CASE(
    "core 0.10-0.12 alltoall: no probs travel with the tokens, unpermute saves the permuted probs",
    "[workload][moe][peak]") {
  // core_v0.10.0-v0.12.0 token_dispatcher.py MoEAlltoAllTokenDispatcher.token_permutation calls
  // moe_utils.py permute(hidden_states, routing_map, num_out_tokens=...) without probs, and the
  // experts take none (experts.py forward(permuted_local_hidden_states, tokens_per_expert)); the
  // probs stay in self.probs until token_unpermutation's unpermute: masked_select gives the
  // permuted probs [S] bf16 = 2·64 = 128 B, which MulBackward saves with the combined tokens.
  config::Setup s = SmallMoe(1.0);
  s.training.megatron_core_version = {0, 12};
  const Program p = Build(s, 0);
  const PhaseBytes f = MoeLayerBytes(p, Phase::kForward);
  for (const char* label : {"layer0.moe.permuted_probs", "layer0.moe.received_probs",
                            "layer0.moe.dispatched_probs"}) {
    CHECK(f.allocated.count(label) == 0);
  }
  CHECK(f.alive.at("layer0.moe.unpermute_probs") == 128);
  // Saved after the forward (n 32, h 64, E 4, k 2, S = N = 64, Fe 32, bf16):
  //   ln2 rstd fp32 [n] 128 + output [n, h] 4096                                  = 4224
  //   router: top-k indices int64 [n, k] 512, fp32 top-k softmax [n, k] 256, routing map
  //     bool [n, E] 128; self.probs [n, E] 256                                      = 1152
  //   permute's sorted indices int64 [S]                                           = 512
  //   experts: input [N, h] 8192, fc1 output [N, 2·Fe] 8192, activation [N, Fe] 4096 = 20480
  //   unpermute: combined tokens [S, h] 8192, probs.T [E, n] 256, map.T bool 128, permuted
  //     probs [S] 128                                                               = 8704
  //   total 35,072 B (the current release: 26,496, test above).
  CHECK(Sum(f.alive) == 35'072);
  // Backward: ScatterAddBackward's gather [S, h] and MulBackward0's two [S, h] grads (the probs'
  // one summed to [S] 128 B while the node's input is alive): 3·8192 + 128.
  const PhaseBytes b = MoeLayerBytes(p, Phase::kBackward);
  CHECK(b.allocated.count("layer0.moe.experts.d_probs") == 0);
  CHECK(b.allocated.count("layer0.moe.d_permuted_probs") == 0);
  testing::ModuleHarness h(s);
  MoeModule m;
  h.Forward(m);
  h.Backward();
  Bytes in_op = 0;
  for (const Op& op : h.ops()) {
    if (op.name != "moe.unpermute_bwd") continue;
    for (const TensorAlloc& a : op.allocs) in_op += a.size_bytes;
  }
  CHECK(in_op == 3 * 8192 + 128);
  // masked_select's backward gives the dense probs' grad [E, n] bf16 (256 B, a transposed view
  // for the router), which waits through the experts' and the dispatch's backward.
  CHECK(b.allocated.at("layer0.moe.d_probs") == 256);
  CHECK(FreedBy(p).at("layer0.moe.d_probs") == "moe.router_bwd");
  CHECK(h.problems().empty());
}

TEST_CASE("core 0.10-0.12 allgather: unpermute weights the experts' output by the local probs",
          "[workload][moe][peak]") {
  // core_v0.10.0-v0.12.0 MoEAllGatherTokenDispatcher, EP 2 (g = TP×EP = 2, El = 2, n·g = 64,
  // N = 64): token_permutation binds self.local_probs, `probs[:, local].contiguous()` [n·g, El]
  // bf16 = 2·64·2 = 256 B (not saved); token_unpermutation masks it,
  // `self.local_probs.T.contiguous().masked_select(self.local_map.T.contiguous())` (both copies
  // saved: 256 B and 128 B bool) into the permuted probs [N] 128 B, and `hidden_states *
  // permuted_probs.unsqueeze(-1)` saves the experts' output [N, h] 8192 B and those probs.
  config::Setup s = SmallMoe(1.0);
  s.training.moe_token_dispatcher_type = "allgather";
  s.training.megatron_core_version = {0, 12};
  const Program p = Build(s, 0);
  const PhaseBytes f = MoeLayerBytes(p, Phase::kForward);
  CHECK(f.alive.at("layer0.moe.local_probs") == 256);
  CHECK(f.alive.at("layer0.moe.unpermute_probs_t") == 256);
  CHECK(f.alive.at("layer0.moe.unpermute_map_t") == 128);
  CHECK(f.alive.at("layer0.moe.unpermute_probs") == 128);
  CHECK(f.alive.at("layer0.moe.experts.fc2_out") == 8192);
  // The weighted tokens [N, h] live until token_unpermutation returns, after the reduce-scatter.
  CHECK(ForwardFreedBy(p).at("layer0.moe.weighted_tokens") == "moe.combine_reduce_scatter");
  const std::map<std::string, std::string> freed_by = FreedBy(p);
  CHECK(freed_by.at("layer0.moe.experts.fc2_out") == "moe.unpermute_bwd");
  // The local probs' grad [El, n·g] 256 B waits for the slice's backward in the dispatch's.
  CHECK(MoeLayerBytes(p, Phase::kBackward).allocated.at("layer0.moe.d_local_probs") == 256);
  CHECK(freed_by.at("layer0.moe.d_local_probs") == "moe.permute_bwd");
  // From core 0.13 the experts take the masked probs and nothing weights their output.
  s.training.megatron_core_version = {0, 13};
  CHECK(MoeLayerBytes(Build(s, 0), Phase::kForward).alive.count("layer0.moe.experts.fc2_out") == 0);
}

TEST_CASE("core 0.10-0.12 run the shared experts after the unpermute, and backward them first",
          "[workload][moe]") {
  // core_v0.10.0-v0.12.0 moe_layer.py custom_forward (no --moe-shared-expert-overlap):
  // router, token_permutation, experts, token_unpermutation, then self.shared_experts(
  // hidden_states); autograd's engine runs the ready node of the highest sequence number first,
  // so the shared experts' backward runs before the routed path's. From core 0.13 memsim runs
  // them before the router (experts_compute calls them after the dispatch) and last in backward.
  config::Setup s = SmallMoe(1.0);
  s.model.moe_shared_expert_intermediate_size = 32;
  s.training.megatron_core_version = {0, 12};
  Program p = Build(s, 0);
  CHECK(OpIndex(p, Phase::kForward, "moe.shared_experts.fc1") >
        OpIndex(p, Phase::kForward, "moe.unpermute"));
  CHECK(OpIndex(p, Phase::kBackward, "moe.shared_experts.fc1_bwd") <
        OpIndex(p, Phase::kBackward, "moe.unpermute_bwd"));
  // So the shared experts' activations are not alive during the unpermute: fc1 output
  // [n, 2·32] bf16 4096 B and the activation [n, 32] 2048 B.
  testing::ModuleHarness h(s);
  MoeModule m;
  h.Forward(m);
  const auto during = [](const testing::SeenTensors& seen, const std::string& label) {
    return std::count_if(seen.begin(), seen.end(),
                         [&](const testing::SeenTensor& t) { return t.label == label; });
  };
  CHECK(during(h.AliveDuring("moe.unpermute", 0), "layer0.moe.shared_fc1_out") == 0);
  h.Backward();
  CHECK(h.problems().empty());
  s.training.megatron_core_version = {0, 13};
  p = Build(s, 0);
  CHECK(OpIndex(p, Phase::kForward, "moe.shared_experts.fc1") <
        OpIndex(p, Phase::kForward, "moe.router"));
  CHECK(OpIndex(p, Phase::kBackward, "moe.shared_experts.fc1_bwd") >
        OpIndex(p, Phase::kBackward, "moe.unpermute_bwd"));
}

TEST_CASE("expert parameters: own DDP buffers, optimizer shards over the expert-DP group",
          "[workload][moe]") {
  config::Setup s = SmallMoe(1.0);
  s.training.use_distributed_optimizer = true;
  const ModelDims d = ComputeDims(s);
  // Expert-DP = t·d·cp / (ep·etp) = 2/2 = 1.
  CHECK(d.edp == 1);
  const std::vector<ParamTensor> params = StageParams(s, 0);
  const std::vector<GradBuffer> bufs = LayoutGradBuffers(s, 0, params);
  REQUIRE(bufs.size() == 2);
  CHECK(!bufs[0].expert);
  CHECK(bufs[1].expert);
  // Expert buffer: 2 layers × 2 local experts × (fc1 64·64 + fc2 64·32) = 4·6144 = 24,576
  // elements, each param start aligned to 64, the bucket end to lcm(1, 128) = 128: 24,576.
  CHECK(bufs[1].numel_padded == 24'576);
  // The optimizer's slices: every expert element (edp 1), half of the dense buffer (d·cp 2).
  std::int64_t expert_owned = 0;
  for (const ShardSlice& sl : ShardSlices(d, params, bufs)) {
    if (params[sl.param].expert) expert_owned += sl.numel;
  }
  CHECK(expert_owned == 24'576);
}

}  // namespace
}  // namespace memsim::workload
