// The input side of a GPT model on the first pipeline stage: the batch Megatron's get_batch
// puts on the device, and LanguageModelEmbedding (megatron/core/models/common/embeddings/
// language_model_embedding.py): vocab-parallel word embedding (VocabParallelEmbedding in
// megatron/core/tensor_parallel/layers.py), learned positions for GPT-2-style models, the
// [b, s, h] -> [s, b, h] transpose, the sequence-parallel scatter and embedding dropout.
// Shapes per rank: tokens [b, s] int64, activations [s/σ, b, h].
#pragma once

#include "workload/modules/module.h"

namespace memsim::workload {

// The batch tensors of one micro-batch (Megatron get_batch, megatron/training/utils.py
// get_batch_on_this_tp_rank): tokens and position ids on the first stage, labels and the loss
// mask on the last, and on both Megatron's causal mask where the dataloader makes one
// (FrameworkFacts::dataloader_attention_mask: off Ascend, without
// --no-create-attention-mask-in-dataloader).
struct Batch {
  TensorId tokens = 0, position_ids = 0, labels = 0, loss_mask = 0;
  TensorId attention_mask = 0;  // FrameworkFacts::dataloader_attention_mask
};
// Emits get_batch ("data.get_batch", a broadcast over TP).
Batch GetBatch(ModuleContext& ctx, bool first_stage, bool last_stage);

struct EmbeddingSaved {
  TensorId indices = 0;       // the masked input (TP > 1) or the tokens themselves
  TensorId dropout_mask = 0;  // embedding dropout
  // Encoders (hf_encoder.h): the embedding LayerNorm's saved input and statistics.
  TensorId norm_in = 0, norm_mean = 0, norm_rstd = 0;
};

class Embedding {
 public:
  // word_embeddings [V/t, h] (the shared copy with tied embeddings and PP > 1), position
  // embeddings [max_positions, h] for learned absolute positions.
  static void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                           std::vector<ParamTensor>* out);
  // Returns layer 0's input.
  static TensorId Forward(ModuleContext& ctx, const Batch& batch, EmbeddingSaved* saved);
  // Frees the saved tensors, dx and the position ids (learned positions).
  static void Backward(ModuleContext& ctx, const Batch& batch, const EmbeddingSaved& saved,
                       TensorId dx);
};

bool LearnedPositions(const config::ModelConfig& model);

}  // namespace memsim::workload
