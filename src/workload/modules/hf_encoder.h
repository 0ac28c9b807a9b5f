// The encoder pieces of a Hugging Face BERT / RoBERTa model that a decoder has not
// (transformers/models/bert/modeling_bert.py): BertEmbeddings' token-type embedding and the
// LayerNorm after the embedding sum, and BertForSequenceClassification's head (BertPooler: dense
// [h, h] + tanh on the first token; dropout; classifier [num_labels, h]; CrossEntropyLoss). The
// transformer layers themselves are the residual modules of decoder_layer.h with LayerNorm,
// biases and GeLU: BERT's post-norm layer saves the same tensors in another order (per branch
// the norm's input, its statistics and its output, the dropout mask; see docs/config.md).
// Shapes: activations [b, s, h] in the autocast dtype, except what autocast keeps in the
// weights' dtype (ModelDims::wide_bytes, model.h: LayerNorm outputs, residual sums, masked scores,
// softmax); the head's tensors are [b, h] and [b, num_labels].
#pragma once

#include "workload/modules/embedding.h"
#include "workload/modules/module.h"
#include "workload/modules/output_loss.h"

namespace memsim::workload {

// token_type_embeddings [type_vocab_size, h], LayerNorm weight and bias [h]
// (BertEmbeddings.__init__ order: word, position, token type, LayerNorm).
void AppendEncoderEmbeddingParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                                  std::vector<ParamTensor>* out);
// BertEmbeddings.forward after the word lookup `x` ([b, s, h], owned): the token-type lookup and
// sum, the position lookup added in place, then LayerNorm (saves its input and fp32 mean / rstd
// [b, s]). Returns the norm's output; the position ids buffer is the model's own (not per batch).
TensorId EncoderEmbeddingForward(ModuleContext& ctx, TensorId x, EmbeddingSaved* saved);
// Backward of the LayerNorm and the token-type grad; frees dx and the saved norm tensors and
// returns the grad of the embedding sum. The position and word grads are Embedding::Backward's.
TensorId EncoderEmbeddingBackward(ModuleContext& ctx, const EmbeddingSaved& saved, TensorId dx);

class ClassificationHead {
 public:
  // pooler.dense weight [h, h] and bias, classifier weight [num_labels, h] and bias.
  static void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                           std::vector<ParamTensor>* out);
  // From the last layer's output x (kept: the pooler's dense saves a view of its first token).
  // Returns the loss tensor the loop keeps until the step ends.
  static TensorId Forward(ModuleContext& ctx, TensorId x, HeadSaved* saved);
  // Frees the saved tensors, the loss mask and x; returns the [b, s, h] grad of x
  // (SelectBackward: zeros with the first token's rows filled).
  static TensorId Backward(ModuleContext& ctx, const Batch& batch, const HeadSaved& saved);
};

}  // namespace memsim::workload
