// Transformers' decoder layer under framework "hf-trainer": modeling_llama.py LlamaDecoderLayer
// (mistral, qwen2 and qwen3 reuse it through their modular files), as the modules of
// module.h. Unlike the Megatron modules it follows the Transformers code tensor by tensor:
// LlamaRMSNorm computes in fp32 (`hidden_states.to(torch.float32)`, pow, mean, rsqrt, back to
// the input dtype, times the weight); LlamaAttention has separate q_proj / k_proj / v_proj /
// o_proj nn.Linear layers, apply_rotary_pos_emb, and sdpa_attention_forward /
// flash_attention_2 / eager_attention_forward; LlamaMLP is down_proj(act_fn(gate_proj(x)) *
// up_proj(x)). Parameters carry Transformers' names ("layer3.self_attn.q_proj.weight").
//
// dtypes (model.h): the residual stream is in the weights' dtype (wide_bytes: the embedding
// lookup is not an autocast op), linears and sdpa in the autocast dtype (act_bytes). Under
// autocast over wider weights (cast_inputs) every nn.Linear fed a wide tensor saves its own
// autocast copy of it (autocast caches casts of leaf weights only), and the rotary products
// promote to the wide dtype (cos and sin are in inputs_embeds' dtype). The same holds for a
// 16-bit model after peft's prepare_model_for_kbit_training (fp32 norms / embedding:
// hf_peft.h KbitWideResidual), where each quantised linear fed the wide stream also returns it
// wide (Kernels::ReturnsInputDtype: q, k, v, the MLP's intermediates) and the attention casts
// a wide v as it casts q and k. Not modelled: tensor
// parallelism (the whole model on each device); the model-level cos / sin and the eager causal
// mask (made once per forward, shared by the layers); fp16 autocast over bf16 weights, where
// PyTorch promotes bf16 + fp16 sums to fp32 (modelled in the weights' dtype).
#pragma once

#include "workload/modules/module.h"

namespace memsim::workload {

// input_layernorm, self_attn (q/k/v/o projections, [q_norm, k_norm], RoPE, core attention) and
// the residual sum.
class HfAttentionModule final : public LayerModule {
 public:
  void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk, int layer,
                    std::vector<ParamTensor>* out) const override;
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                   std::unique_ptr<ModuleSaved>* saved) override;
  TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy) override;
};

// post_attention_layernorm, the gated MLP and the residual sum.
class HfMlpModule final : public LayerModule {
 public:
  void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk, int layer,
                    std::vector<ParamTensor>* out) const override;
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                   std::unique_ptr<ModuleSaved>* saved) override;
  TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy) override;
};

// Whether `setup` runs these modules: framework "hf-trainer" with a Llama-style decoder (no
// token types, no experts, RMSNorm, gated MLP).
bool UsesHfDecoder(const config::Setup& setup);

}  // namespace memsim::workload
