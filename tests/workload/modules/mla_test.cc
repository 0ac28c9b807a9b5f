// Megatron-core's multi-latent attention (modules/mla.h) run alone on the module harness: what
// MLASelfAttention's forward saves for backward and what its backward frees and hands to
// autograd, counted by hand from megatron/core/transformer/multi_latent_attention.py and
// gpt_layer_specs.py at core_v0.13.0.
//
// Shape (TinyMla: testing::TinyLlama, an H100, Megatron-core with the Transformer Engine spec):
// h 64, n 4 heads, s 32, b 1: T = 32 tokens; q_lora_rank ql 24, kv_lora_rank kl 16,
// qk_head_dim dn 8, qk_pos_emb_head_dim dr 4, v_head_dim dv 8; qk_layernorm (the latents'
// norms); TP 1; bf16 (2 bytes an element); RMSNorm (rstd fp32), no biases, no dropout.
#include "workload/modules/mla.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::mla_module_test {

using testing::ModuleHarness;
using testing::SeenTensors;

constexpr Bytes kT = 32, kH = 64, kN = 4, kQl = 24, kKl = 16, kDn = 8, kDr = 4, kDv = 8;

config::Setup TinyMla() {
  config::Setup s = testing::TinyLlama();
  s.model.multi_latent_attention = true;
  s.model.q_lora_rank = 24;
  s.model.kv_lora_rank = 16;
  s.model.qk_head_dim = 8;
  s.model.qk_pos_emb_head_dim = 4;
  s.model.v_head_dim = 8;
  s.model.head_dim = 8;  // v_head_dim, as config/ sets it
  s.model.qk_layernorm = true;
  return s;
}

// The bytes MLASelfAttention saves per token, with B = 2 and fp32 norm statistics:
//   input_layernorm rstd 4 and output 2h (saved by both down projections);
//   q_compressed 2·ql (linear_q_up_proj's input), its norm's rstd 4 and output 2·ql;
//   kv_combined 2·(kl + dr) (linear_kv_up_proj's input is a split view of it), its norm's
//   rstd 4 and output 2·kl;
//   query and key 2·n·(dn + dr) each, value 2·n·dv (the fused attention's inputs);
//   the attention output 2·n·dv (the kernel's and linear_proj's) and softmax_lse 4·n.
constexpr Bytes SavedPerToken(Bytes h, Bytes n, Bytes ql, Bytes kl, Bytes dn, Bytes dr, Bytes dv) {
  return 4 + 2 * h + 2 * ql + 4 + 2 * ql + 2 * (kl + dr) + 4 + 2 * kl + 2 * 2 * n * (dn + dr) +
         2 * n * dv + 2 * n * dv + 4 * n;
}

TEST_CASE(
    "MLA forward saves the input norm output, both latents with their norms, query, key, "
    "value and the attention output with its softmax statistics",
    "[workload][modules][mla]") {
  ModuleHarness h(TinyMla());
  MlaAttentionModule mla;
  h.Forward(mla);
  const SeenTensors expected = {
      {"layer0.ln1.rstd", 4 * kT},
      {"layer0.ln1.out", 2 * kT * kH},
      {"layer0.attn.q_compressed", 2 * kT * kQl},
      {"layer0.attn.kv_combined", 2 * kT * (kKl + kDr)},
      {"layer0.attn.q_up.norm_stats", 4 * kT},
      {"layer0.attn.q_up.norm_out", 2 * kT * kQl},
      {"layer0.attn.query", 2 * kT * kN * (kDn + kDr)},
      {"layer0.attn.kv_up.norm_stats", 4 * kT},
      {"layer0.attn.kv_up.norm_out", 2 * kT * kKl},
      {"layer0.attn.key", 2 * kT * kN * (kDn + kDr)},
      {"layer0.attn.value", 2 * kT * kN * kDv},
      {"layer0.attn.core_out", 2 * kT * kN * kDv},
      {"layer0.attn.softmax_lse", 4 * kT * kN},
  };
  CHECK(h.Saved() == expected);
  // 644 bytes a token: 12 + 4n + 2h + 4ql + 4kl + 2dr + 4n(dn + dr) + 4n·dv
  // = 12 + 16 + 128 + 96 + 64 + 8 + 192 + 128.
  CHECK(SavedPerToken(kH, kN, kQl, kKl, kDn, kDr, kDv) == 644);
  CHECK(testing::TotalBytes(h.Saved()) == 644 * kT);
  // linear_kv_up_proj's output [T, n·(dn + dv)] is a transient of qkv_up_proj_and_rope_apply.
  CHECK(h.FreedIn("layer0.attn.kv") == "attn.rope");
  CHECK(h.problems().empty());
}

TEST_CASE("MLA saves 187,020 bytes a token per layer at DeepSeek-V3's dimensions",
          "[workload][modules][mla]") {
  // DeepSeek-V3 (HF config.json): h 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512,
  // qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; s 4096, b 1.
  config::Setup s = TinyMla();
  s.model.hidden_size = 7168;
  s.model.num_attention_heads = 128;
  s.model.num_key_value_heads = 128;
  s.model.q_lora_rank = 1536;
  s.model.kv_lora_rank = 512;
  s.model.qk_head_dim = 128;
  s.model.qk_pos_emb_head_dim = 64;
  s.model.v_head_dim = 128;
  s.model.head_dim = 128;
  s.training.seq_length = 4096;
  ModuleHarness h(s);
  MlaAttentionModule mla;
  h.Forward(mla);
  // 12 + 4·128 + 2·7168 + 4·1536 + 4·512 + 2·64 + 4·128·192 + 4·128·128
  // = 12 + 512 + 14336 + 6144 + 2048 + 128 + 98304 + 65536 = 187,020.
  CHECK(SavedPerToken(7168, 128, 1536, 512, 128, 64, 128) == 187020);
  CHECK(testing::TotalBytes(h.Saved()) == Bytes{187020} * 4096);
}

TEST_CASE("MLA backward frees all it saved, without wgrad fusion each weight's grad reaches "
          "the wrapper in autograd's order",
          "[workload][modules][mla]") {
  config::Setup s = TinyMla();
  s.training.gradient_accumulation_fusion = false;
  ModuleHarness h(s);
  MlaAttentionModule mla;
  h.Forward(mla);
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
  // linear_proj [h, n·dv]; linear_kv_up_proj [n·(dn + dv), kl] then its norm [kl];
  // linear_q_up_proj [n·(dn + dr), ql] then its norm [ql]; linear_kv_down_proj [kl + dr, h];
  // linear_q_down_proj [ql, h]; the input norm [h]. 2 bytes an element.
  CHECK(h.wrapper().grads() == SeenTensors{
                                   {"layer0.attn.proj.weight", 2 * kH * kN * kDv},
                                   {"layer0.attn.kv_up.weight", 2 * kN * (kDn + kDv) * kKl},
                                   {"layer0.attn.kv_up_norm.weight", 2 * kKl},
                                   {"layer0.attn.q_up.weight", 2 * kN * (kDn + kDr) * kQl},
                                   {"layer0.attn.q_up_norm.weight", 2 * kQl},
                                   {"layer0.attn.kv_down.weight", 2 * (kKl + kDr) * kH},
                                   {"layer0.attn.q_down.weight", 2 * kQl * kH},
                                   {"layer0.ln1.weight", 2 * kH},
                               });
  // The latent kv_combined is released by linear_kv_up_proj's backward, the input norm's
  // output once both down projections' backward ran.
  CHECK(h.FreedIn("layer0.attn.kv_combined") == "attn.kv_up_bwd");
  CHECK(h.FreedIn("layer0.ln1.out") == "attn.q_down_bwd");
}

TEST_CASE("MLA without q_lora_rank projects the query from the norm output in one linear",
          "[workload][modules][mla]") {
  config::Setup s = TinyMla();
  s.model.q_lora_rank = 0;  // DeepSeek-V2-Lite: linear_q_proj h -> n·(dn + dr)
  ModuleHarness h(s);
  MlaAttentionModule mla;
  h.Forward(mla);
  const SeenTensors saved = h.Saved();
  CHECK(std::none_of(saved.begin(), saved.end(), [](const testing::SeenTensor& t) {
    return t.label == "layer0.attn.q_compressed" || t.label == "layer0.attn.q_up.norm_out";
  }));
  CHECK(std::count(saved.begin(), saved.end(),
                   testing::SeenTensor{"layer0.attn.query", 2 * kT * kN * (kDn + kDr)}) == 1);
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE("MLA with selective core_attn recompute keeps query, key and value, not the statistics",
          "[workload][modules][mla]") {
  config::Setup s = TinyMla();
  s.training.recompute_granularity = config::RecomputeGranularity::kSelective;  // {"core_attn"}
  ModuleHarness h(s);
  MlaAttentionModule mla;
  h.Forward(mla);
  const SeenTensors saved = h.Saved();
  CHECK(std::none_of(saved.begin(), saved.end(), [](const testing::SeenTensor& t) {
    return t.label == "layer0.attn.softmax_lse";
  }));
  CHECK(testing::TotalBytes(saved) == (644 - 4 * kN) * kT);
  h.Backward();
  CHECK(std::any_of(h.ops().begin(), h.ops().end(),
                    [](const Op& op) { return op.name == "recompute.attn.core"; }));
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::mla_module_test
