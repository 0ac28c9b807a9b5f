// Self-attention as a residual module of a transformer layer, Megatron-core's SelfAttention
// with the Transformer Engine or local spec (megatron/core/transformer/attention.py,
// megatron/core/models/gpt/gpt_layer_specs.py): input norm fused with the QKV projection
// (TELayerNormColumnParallelLinear), optional q/k norms, core attention, output projection
// (row-parallel), bias-dropout-add. Core attention comes in two kernels: flash / fused
// attention (saves its output and the softmax statistics; FlashAttention-2 on CUDA,
// torch_npu npu_fusion_attention on Ascend), and Megatron-core's unfused DotProductAttention
// (saves the [b, a/t, s, s] probabilities; megatron/core/transformer/dot_product_attention.py).
// Selective recompute of "core_attn" re-runs core attention in backward instead of saving it.
// Context parallelism (cp > 1): core attention exchanges K and V with the other ranks of
// Megatron's "cp" group (Transformer Engine AttnFuncWithCPAndKVP2P), which gives that group its
// communicator. The dataloader's causal mask, where there is one, is a batch tensor
// (embedding.h GetBatch, FrameworkFacts::dataloader_attention_mask). Not modelled: RoPE output
// copies (docs/training-memory.md, 'Saved tensors of a layer', A4'), the context-parallel
// ring's receive buffers and per-step saved tensors (only its communicator is).
#pragma once

#include "workload/modules/module.h"

namespace memsim::workload {

class AttentionModule final : public LayerModule {
 public:
  void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk, int layer,
                    std::vector<ParamTensor>* out) const override;
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                   std::unique_ptr<ModuleSaved>* saved) override;
  TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy) override;
};

}  // namespace memsim::workload
