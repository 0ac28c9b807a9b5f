// Internal to config/: multi-latent attention (docs/config.md "Multi-latent attention") and the
// model files that use it. Hugging Face files of model_type deepseek_v2 / deepseek_v3
// (transformers configuration_deepseek_v2.py / configuration_deepseek_v3.py): q_lora_rank,
// kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, and the MoE layout
// (n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
// first_k_dense_replace, moe_layer_freq). Training block: Megatron-LM's MLA argument names
// (megatron/training/arguments.py at core_v0.13.0: multi_latent_attention, q_lora_rank,
// kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim). Errors: InputError naming the key;
// UnsupportedError for what memsim does not model of MLA (tensor or context parallelism,
// unfused attention, Megatron's local spec, Ascend devices, attention biases).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/origin.h"
#include "config/parts.h"

namespace memsim::config::internal {

// model_type values with multi-latent attention (and DeepSeek's MoE keys).
bool IsDeepseekModelType(std::string_view model_type);
// Reads the MLA dimensions and the MoE layout of a deepseek_v2 / deepseek_v3 file (after
// ReadSizes): sets head_dim to v_head_dim and the KV heads to the heads (MLA keeps one key and
// value per head).
void ReadHfDeepseek(ObjectReader& r, LocatedModel& out, std::vector<std::string>* notes);

// The training block's MLA keys override the model's; multi_latent_attention true over a model
// without MLA starts from Megatron's defaults (arguments.py: q_lora_rank None, kv_lora_rank 32,
// qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim 128).
void ApplyMegatronMla(ObjectReader& t, LocatedModel* located, std::vector<std::string>* notes);
const std::vector<std::string>& MegatronMlaArchitectureKeys();

// The MLA rules (a CheckWritten rule, rules.h): what memsim models of Megatron-core's
// MLASelfAttention (UnsupportedError otherwise).
void CheckMla(const Setup& s, const Origin& origin);

}  // namespace memsim::config::internal
