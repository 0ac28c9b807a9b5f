// The output side of a GPT model on the last pipeline stage: final norm, the output layer
// (Megatron's own ColumnParallelLinear, also under the Transformer Engine spec;
// megatron/core/models/gpt/gpt_model.py), vocab-parallel cross-entropy
// (megatron/core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy) and the loss
// function of pretrain_gpt.py (loss_func: masked sum, a [2] reporting tensor). Shapes per
// rank: logits [s, b, V/t]; the fp32 softmax saved for backward.
#pragma once

#include "workload/modules/embedding.h"
#include "workload/modules/module.h"

namespace memsim::workload {

struct HeadSaved {
  TensorId last_output = 0;  // the last layer's output, saved by the final norm
  TensorId final_mean = 0, final_rstd = 0, final_out = 0;
  // Transformers' final LlamaRMSNorm (OutputAndLoss::Forward under FrameworkFacts::hf): the fp32
  // copy of a 16-bit input and x·rsqrt in the input's dtype (kept when the weight is trained).
  TensorId final_h32 = 0, final_normed = 0;
  TensorId logits_fp32 = 0, target_mask = 0, masked_target = 0, loss = 0;
  TensorId weight_copy = 0;  // the output weight's autocast copy (kernels.h CastWeight)
  // Sequence classification (hf_encoder.h): tanh output, dropout mask and output, log-softmax.
  TensorId pooled = 0, pooled_mask = 0, pooled_dropped = 0, log_probs = 0;
  TensorId pooler_copy = 0, classifier_copy = 0;
};

class OutputAndLoss {
 public:
  // final_norm (weight, LayerNorm bias) and output_layer [V/t, h], which a tied model on one
  // stage does not have (it reuses the word embedding).
  static void AppendParams(const ModelDims& d, int chunk, bool has_embedding,
                           std::vector<ParamTensor>* out);
  // The parameter the output layer's weight grad belongs to.
  static std::string OutputWeight(const ModelDims& d, bool has_embedding);
  // Forward from the last layer's output x. Returns the loss-reporting tensor (kept by the
  // training loop until the step ends).
  static TensorId Forward(ModuleContext& ctx, TensorId x, const std::string& output_weight,
                          HeadSaved* saved);
  // Backward; frees the saved tensors, the loss mask and x. Returns the grad of x.
  static TensorId Backward(ModuleContext& ctx, const Batch& batch, const HeadSaved& saved,
                           const std::string& output_weight);
};

}  // namespace memsim::workload
