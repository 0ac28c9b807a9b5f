// Multi-latent attention as a residual module of a transformer layer: Megatron-core's
// MLASelfAttention with the Transformer Engine spec (megatron/core/transformer/
// multi_latent_attention.py and megatron/core/models/gpt/gpt_layer_specs.py
// get_gpt_layer_with_transformer_engine_spec, multi_latent_attention=True, at core_v0.13.0),
// on one tensor-parallel rank (config/ refuses TP, CP, unfused attention and the local spec).
//
// Shapes, with T = s·b tokens, n heads, h hidden, q_lora_rank ql, kv_lora_rank kl, per-head
// widths dn = qk_head_dim, dr = qk_pos_emb_head_dim, dv = v_head_dim (ModelConfig), B the
// activation element size:
//   input_layernorm (TENorm, its own module): rstd fp32 [T]; output [T, h], saved by
//     linear_q_down_proj and linear_kv_down_proj (one tensor, two savers);
//   linear_q_down_proj (TEColumnParallelLinear, h -> ql): q_compressed [T, ql], saved by
//     linear_q_up_proj (TELayerNormColumnParallelLinear with qk_layernorm: its norm's rstd [T]
//     and output [T, ql] saved too); without q_lora_rank one linear_q_proj (h -> n·(dn+dr));
//   linear_kv_down_proj (h -> kl + dr): kv_combined [T, kl + dr]; kv_compressed and k_pos_emb
//     are split views of it, and linear_kv_up_proj's saved input (a view) keeps it alive;
//     its norm's rstd [T] and output [T, kl] saved with qk_layernorm;
//   linear_kv_up_proj (kl -> n·(dn+dv)): kv [T, n, dn+dv], a transient;
//   the decoupled RoPE, fused (apply_rope_fusion, Megatron-LM's default, with MLA's "yarn"
//     rope_type at core 0.13: fused_mla_yarn_rope_apply.py): ApplyMLARotaryEmbQ rotates q in
//     place (query is linear_q_up_proj's output), ApplyMLARotaryEmbKV writes key
//     [T, n, dn+dr] and value [T, n, dv]; both save only the cos / sin cache;
//   core attention (TEDotProductAttention, cuDNN FusedAttention: flash-attn 2 cannot take a
//     value head narrower than the key's) saves query, key, value, its output [T, n·dv] (saved
//     again by linear_proj: one tensor) and the softmax statistics fp32 [b, n, s]; under
//     Megatron-core 0.5-0.13's bshd switch with b > 1 it saves contiguous copies of query, key
//     and value, and the originals live until MultiLatentAttention.forward returns;
//   linear_proj (TERowParallelLinear, n·dv -> h), bias-dropout-add.
// Backward frees each saved tensor where its Function's backward runs (autograd order:
// the rope, linear_kv_up_proj, linear_q_up_proj, the split's cat, linear_kv_down_proj,
// linear_q_down_proj, whose two input grads autograd sums in place), then the input norm and
// the residual sum. Selective recompute: "core_attn" (MultiLatentAttention.forward
// _checkpointed_attention_forward) and "layernorm" (the input norm's output) as for
// AttentionModule. Not modelled: cuDNN's backward workspace, the unfused RoPE's transients
// (--no-rope-fusion), the absorbed form (inference only), "mla_up_proj" recompute (refused).
#pragma once

#include "workload/modules/module.h"

namespace memsim::workload {

class MlaAttentionModule final : public LayerModule {
 public:
  void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk, int layer,
                    std::vector<ParamTensor>* out) const override;
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                   std::unique_ptr<ModuleSaved>* saved) override;
  TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy) override;
};

}  // namespace memsim::workload
