// Multi-latent attention keys: the MLA and MoE fields of Hugging Face deepseek_v2 / deepseek_v3
// files, the Megatron MLA arguments that override them, and what memsim models of MLA
// (docs/config.md "Multi-latent attention").
#include "config/mla.h"

#include <fmt/core.h>

#include "config/stack.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// The class defaults of transformers' DeepseekV3Config (configuration_deepseek_v3.py at
// 001f85b3) and DeepseekV2Config (configuration_deepseek_v2.py at 008e5743).
struct DeepseekDefaults {
  int q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  int n_routed_experts, n_shared_experts, num_experts_per_tok, moe_intermediate_size;
  int first_k_dense_replace;
};
// V3: q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128, 256 routed experts, 1
// shared, top-8, moe_intermediate_size 2048, first_k_dense_replace 3.
constexpr DeepseekDefaults kV3 = {1536, 512, 128, 64, 128, 256, 1, 8, 2048, 3};
// V2: the same attention; 64 routed experts, 2 shared, num_experts_per_tok None (0 here: the
// file must say), moe_intermediate_size 1407, first_k_dense_replace 0.
constexpr DeepseekDefaults kV2 = {1536, 512, 128, 64, 128, 64, 2, 0, 1407, 0};

// A rank or width that a file may set to null (q_lora_rank: null in DeepSeek-V2-Lite, whose
// attention has one q_proj): 0 for null, the default when absent.
int NullableInt(ObjectReader& r, std::string_view key, int fallback) {
  if (r.IsNull(key)) {
    r.Skip(key);
    return 0;
  }
  return r.PositiveInt(key).value_or(fallback);
}

// DeepseekV3Attention / DeepseekV2Attention (modeling_deepseek_v3.py): q_a_proj, q_a_layernorm,
// q_b_proj (or q_proj without q_lora_rank), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
// o_proj; every head has its own key and value; no biases unless attention_bias.
void ReadMlaDims(ObjectReader& r, const DeepseekDefaults& def, LocatedModel& out) {
  ModelConfig& m = out.model;
  m.multi_latent_attention = true;
  m.q_lora_rank = NullableInt(r, "q_lora_rank", def.q_lora_rank);
  m.kv_lora_rank = r.PositiveInt("kv_lora_rank").value_or(def.kv_lora_rank);
  m.qk_head_dim = r.PositiveInt("qk_nope_head_dim").value_or(def.qk_nope_head_dim);
  m.qk_pos_emb_head_dim = r.PositiveInt("qk_rope_head_dim").value_or(def.qk_rope_head_dim);
  m.v_head_dim = r.PositiveInt("v_head_dim").value_or(def.v_head_dim);
  out.where["q_lora_rank"] = r.At("q_lora_rank");
  out.where["kv_lora_rank"] = r.At("kv_lora_rank");
  out.where["qk_head_dim"] = r.At("qk_nope_head_dim");
  out.where["qk_pos_emb_head_dim"] = r.At("qk_rope_head_dim");
  out.where["v_head_dim"] = r.At("v_head_dim");
  m.head_dim = m.v_head_dim;
  out.where["head_dim"] = r.At("v_head_dim");
  m.num_key_value_heads = m.num_attention_heads;
  // The q_a_layernorm / kv_a_layernorm: Megatron's qk_layernorm (gpt_layer_specs.py builds
  // linear_q_up_proj and linear_kv_up_proj as TELayerNormColumnParallelLinear with it).
  m.qk_layernorm = true;
  if (r.Bool("attention_bias").value_or(false)) {
    throw UnsupportedError(fmt::format("{}: true (Megatron-core's MLASelfAttention has no "
                                       "biases on its projections)",
                                       r.At("attention_bias")));
  }
}

// DeepseekV3MoE / DeepseekV2MoE: n_routed_experts experts of moe_intermediate_size, and
// shared_experts, one MLP n_shared_experts × moe_intermediate_size wide. Layer i is an MoE layer
// when n_routed_experts is set, i >= first_k_dense_replace and i % moe_layer_freq == 0
// (DeepSeek's modeling_deepseek.py DeepseekV3DecoderLayer; transformers' port drops the
// frequency, which DeepSeek's own files give as 1). A layer that is not one runs the dense MLP
// of intermediate_size.
void ReadDeepseekMoe(ObjectReader& r, const DeepseekDefaults& def, LocatedModel& out) {
  ModelConfig& m = out.model;
  m.num_experts = NullableInt(r, "n_routed_experts", def.n_routed_experts);
  out.where["num_experts"] = r.At("n_routed_experts");
  if (const Json* alias = r.Get("num_local_experts"); alias != nullptr) {
    // DeepseekV3Config.attribute_map: num_local_experts names n_routed_experts.
    if (!alias->is_number_integer() || alias->get<std::int64_t>() != m.num_experts) {
      Fail(r.At("num_local_experts"),
           fmt::format("{} disagrees with n_routed_experts = {}", Describe(*alias), m.num_experts));
    }
  }
  if (m.num_experts <= 1) {
    m.num_experts = 0;
    for (const char* key : {"num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                            "first_k_dense_replace", "moe_layer_freq"}) {
      r.Skip(key);
    }
    return;
  }
  const std::optional<int> topk = r.PositiveInt("num_experts_per_tok");
  if (!topk && def.num_experts_per_tok == 0) {
    Fail(r.At("num_experts_per_tok"), "missing key (DeepseekV2Config has no default for it)");
  }
  m.moe_router_topk = topk.value_or(def.num_experts_per_tok);
  out.where["moe_router_topk"] = r.At("num_experts_per_tok");
  if (m.moe_router_topk > m.num_experts) {
    Fail(r.At("num_experts_per_tok"),
         fmt::format("{} exceeds the {} experts", m.moe_router_topk, m.num_experts));
  }
  m.moe_ffn_hidden_size = r.PositiveInt("moe_intermediate_size").value_or(def.moe_intermediate_size);
  out.where["moe_ffn_hidden_size"] = r.At("moe_intermediate_size");
  const int shared = NullableInt(r, "n_shared_experts", def.n_shared_experts);
  m.moe_shared_expert_intermediate_size = shared * m.moe_ffn_hidden_size;
  const int first_dense = r.NonNegativeInt("first_k_dense_replace").value_or(def.first_k_dense_replace);
  const int freq = r.PositiveInt("moe_layer_freq").value_or(1);
  m.moe_layer_pattern.assign(static_cast<std::size_t>(m.num_hidden_layers), false);
  for (int i = 0; i < m.num_hidden_layers; ++i) {
    m.moe_layer_pattern[static_cast<std::size_t>(i)] = i >= first_dense && i % freq == 0;
  }
}

// The router's scoring and the group-limited top-k (DeepseekV3TopkRouter: sigmoid scores,
// n_group groups of which topk_group are kept, an fp32 correction bias): memsim models
// Megatron's softmax top-k router, whose [tokens, experts] tensors these resemble; the group
// scores and masks ([tokens, n_group], [tokens, experts]) are not modelled.
void ReadDeepseekRouter(ObjectReader& r, LocatedModel& out, std::vector<std::string>* notes) {
  const std::optional<std::string> scoring = r.String("scoring_func");
  const int groups = r.PositiveInt("n_group").value_or(1);
  (void)r.PositiveInt("topk_group");
  (void)r.String("topk_method");
  if ((scoring && *scoring != "softmax") || groups > 1) {
    r.WarnNotModelled(scoring ? "scoring_func" : "n_group",
                      fmt::format("{}: the router's {} scores and group-limited top-k "
                                  "([tokens, n_group] and [tokens, experts] temporaries) are not "
                                  "modelled; memsim models a softmax top-k router",
                                  r.At(scoring ? "scoring_func" : "n_group"),
                                  scoring ? Printable(*scoring) : std::string("softmax")),
                      NotModelled::Direction::kLow, &out.warnings);
  }
  for (const char* key : {"routed_scaling_factor", "norm_topk_prob", "aux_loss_alpha", "seq_aux",
                          "ep_size", "rope_scaling", "rope_parameters", "rope_interleave"}) {
    if (r.Has(key)) {
      r.Skip(key);
      notes->push_back(fmt::format("{}: accepted, no effect on memory", r.At(key)));
    }
  }
  if (r.Has("num_nextn_predict_layers")) {
    r.Skip("num_nextn_predict_layers");
    notes->push_back(fmt::format("{}: ignored: Megatron-core builds multi-token prediction "
                                 "layers only with mtp_num_layers",
                                 r.At("num_nextn_predict_layers")));
  }
}

// Megatron-LM's MLA arguments (arguments.py _add_mla_args at core_v0.13.0).
const std::vector<std::string> kMlaKeys = {"multi_latent_attention", "q_lora_rank",
                                           "kv_lora_rank",           "qk_head_dim",
                                           "qk_pos_emb_head_dim",    "v_head_dim"};

}  // namespace

bool IsDeepseekModelType(std::string_view model_type) {
  return model_type == "deepseek_v2" || model_type == "deepseek_v3";
}

void ReadHfDeepseek(ObjectReader& r, LocatedModel& out, std::vector<std::string>* notes) {
  const DeepseekDefaults& def = out.model.model_type == "deepseek_v3" ? kV3 : kV2;
  ReadMlaDims(r, def, out);
  ReadDeepseekMoe(r, def, out);
  ReadDeepseekRouter(r, out, notes);
}

const std::vector<std::string>& MegatronMlaArchitectureKeys() { return kMlaKeys; }

void ApplyMegatronMla(ObjectReader& t, LocatedModel* located, std::vector<std::string>* notes) {
  ModelConfig& m = located->model;
  if (std::optional<bool> on = t.Bool("multi_latent_attention"); on && *on != m.multi_latent_attention) {
    m.multi_latent_attention = *on;
    located->where["multi_latent_attention"] = t.At("multi_latent_attention");
    if (*on) {
      // arguments.py: --q-lora-rank None, --kv-lora-rank 32, --qk-head-dim 128,
      // --qk-pos-emb-head-dim 64, --v-head-dim 128.
      m.q_lora_rank = 0;
      m.kv_lora_rank = 32;
      m.qk_head_dim = 128;
      m.qk_pos_emb_head_dim = 64;
      m.v_head_dim = 128;
    }
  }
  auto set = [&](const char* key, int* dst) {
    if (std::optional<int> v = t.PositiveInt(key)) {
      *dst = *v;
      located->where[key] = t.At(key);
    }
  };
  set("q_lora_rank", &m.q_lora_rank);
  set("kv_lora_rank", &m.kv_lora_rank);
  set("qk_head_dim", &m.qk_head_dim);
  set("qk_pos_emb_head_dim", &m.qk_pos_emb_head_dim);
  set("v_head_dim", &m.v_head_dim);
  if (!m.multi_latent_attention) {
    for (const std::string& key : kMlaKeys) {
      if (key != "multi_latent_attention" && t.Has(key)) {
        notes->push_back(fmt::format("{}: ignored (multi_latent_attention is off)", t.At(key)));
      }
    }
    return;
  }
  m.head_dim = m.v_head_dim;  // MultiLatentAttention: query_projection_size = v_head_dim × heads
  located->where["head_dim"] = located->where["v_head_dim"];
  m.num_key_value_heads = m.num_attention_heads;
}

void CheckMla(const Setup& s, const Origin& origin) {
  if (!s.model.multi_latent_attention) return;
  const TrainingConfig& c = s.training;
  const std::string at = origin.Model("kv_lora_rank");
  auto refuse = [&](const std::string& where, const std::string& what) {
    throw UnsupportedError(fmt::format("{}: {} with multi-latent attention ({})", where, what, at));
  };
  if (!StackOf(c).Traits().multi_latent_attention) {
    throw UnsupportedError(fmt::format("{}: multi-latent attention under framework \"{}\" "
                                       "(memsim models Megatron-core's MLASelfAttention)",
                                       at, c.framework));
  }
  // MLASelfAttention.get_query_key_value_tensors gathers and re-scatters the latents over the
  // tensor-parallel group; context parallelism splits the RoPE part: neither is modelled yet.
  if (c.tensor_model_parallel_size > 1) {
    refuse(origin.Training("tensor_model_parallel_size"), "tensor parallelism");
  }
  if (c.context_parallel_size > 1) {
    refuse(origin.Training("context_parallel_size"), "context parallelism");
  }
  if (!c.use_flash_attn) refuse(origin.Training("use_flash_attn"), "unfused attention");
  if (c.transformer_impl != "transformer_engine") {
    refuse(origin.Training("transformer_impl"), "Megatron's local spec");
  }
  if (s.device.allocator_backend == alloc::Backend::kNpu) {
    refuse(origin.Training("framework"), "an Ascend device (MindSpeed's MLA)");
  }
}

}  // namespace memsim::config::internal
