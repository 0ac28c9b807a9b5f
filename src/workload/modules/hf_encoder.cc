// BERT's embedding extras and sequence-classification head (hf_encoder.h). Every tensor below
// follows transformers/models/bert/modeling_bert.py: BertEmbeddings.forward, BertPooler.forward,
// BertForSequenceClassification.forward (dropout, classifier, CrossEntropyLoss).
#include "workload/modules/hf_encoder.h"

namespace memsim::workload {

void AppendEncoderEmbeddingParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                                  std::vector<ParamTensor>* out) {
  out->push_back(MakeParam("embedding.token_type_embeddings.weight",
                           std::int64_t{model.type_vocab_size} * d.h, d.h, chunk, -1, false, false));
  out->push_back(MakeParam("embedding.norm.weight", d.h, 1, chunk, -1, true, false));
  out->push_back(MakeParam("embedding.norm.bias", d.h, 1, chunk, -1, true, false));
}

TensorId EncoderEmbeddingForward(ModuleContext& ctx, TensorId x, EmbeddingSaved* saved) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  // nn.Embedding over the weights' dtype: autocast does not cast embeddings, and LayerNorm runs
  // in fp32 under autocast (aten/src/ATen/autocast_mode.cpp: layer_norm in the fp32 list), so the
  // embedding side is in the weights' dtype.
  const Bytes full = d.param_bytes * d.T * d.h;
  em.Begin("embedding.token_type");  // token_type_embeddings(token_type_ids), then the sum
  const TensorId types = em.Alloc(full, Category::kTemporaries, "embedding.token_type_out");
  const TensorId sum = em.Alloc(full, Category::kActivations, "embedding.sum");  // saved by the norm
  em.Free(x);
  em.Free(types);
  em.Begin("embedding.position");  // position_embeddings(position_ids); embeddings += ...
  const TensorId pos = em.Alloc(full, Category::kTemporaries, "embedding.position_out");
  em.Free(pos);
  em.Begin("embedding.norm");  // LayerNorm saves its input, mean and rstd (fp32 [b, s])
  saved->norm_in = sum;
  saved->norm_mean = em.Alloc(4 * d.T, Category::kActivations, "embedding.norm.mean");
  saved->norm_rstd = em.Alloc(4 * d.T, Category::kActivations, "embedding.norm.rstd");
  const Category out_kind = d.hidden_dropout ? Category::kTemporaries : Category::kActivations;
  return em.Alloc(full, out_kind, d.hidden_dropout ? "embedding.norm.out" : "embedding.out");
}

TensorId EncoderEmbeddingBackward(ModuleContext& ctx, const EmbeddingSaved& saved, TensorId dx) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("embedding.norm_bwd");
  const TensorId g =
      em.Alloc(d.param_bytes * d.T * d.h, Category::kTemporaries, "embedding.d_sum");
  ctx.k.SmallWeightGrad(d.h, "embedding.norm.weight_grad", "embedding.norm.weight");
  ctx.k.SmallWeightGrad(d.h, "embedding.norm.bias_grad", "embedding.norm.bias");
  for (TensorId id : {dx, saved.norm_in, saved.norm_mean, saved.norm_rstd}) em.Free(id);
  em.Begin("embedding.token_type_bwd");  // embedding_dense_backward: a dense weight-sized grad
  ctx.k.SmallWeightGrad(std::int64_t{ctx.model.type_vocab_size} * d.h,
                        "embedding.token_type_embeddings.grad",
                        "embedding.token_type_embeddings.weight");
  return g;
}

void ClassificationHead::AppendParams(const config::ModelConfig& model, const ModelDims& d,
                                      int chunk, std::vector<ParamTensor>* out) {
  const std::int64_t labels = model.num_labels;
  out->push_back(MakeParam("pooler.dense.weight", d.h * d.h, d.h, chunk, -1, false, false));
  out->push_back(MakeParam("pooler.dense.bias", d.h, 1, chunk, -1, true, false));
  out->push_back(MakeParam("classifier.weight", labels * d.h, d.h, chunk, -1, false, false));
  out->push_back(MakeParam("classifier.bias", labels, 1, chunk, -1, true, false));
}

TensorId ClassificationHead::Forward(ModuleContext& ctx, TensorId x, HeadSaved* u) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t labels = ctx.model.num_labels;
  const Bytes row = d.act_bytes * d.b * d.h;
  u->last_output = x;  // hidden_states[:, 0] is a view; the dense saves it, keeping x
  em.Begin("pooler.dense");
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  u->pooler_copy = ctx.k.CastWeight(d.h, d.h, "pooler.dense.weight", true);
  const TensorId dense = em.Alloc(row, Category::kTemporaries, "pooler.dense_out");
  em.Flops(2.0 * d.b * d.h * d.h);
  em.Begin("pooler.tanh");  // tanh saves its output
  u->pooled = em.Alloc(row, Category::kActivations, "pooler.out");
  em.Free(dense);
  if (d.hidden_dropout) {  // classifier_dropout None: hidden_dropout_prob
    em.Begin("classifier.dropout");
    u->pooled_mask = em.Alloc(d.b * d.h, Category::kActivations, "classifier.dropout_mask");
    u->pooled_dropped = em.Alloc(row, Category::kActivations, "classifier.dropout_out");
  }
  em.Begin("classifier");
  u->classifier_copy = ctx.k.CastWeight(labels, d.h, "classifier.weight", true);
  const TensorId logits =
      em.Alloc(d.act_bytes * d.b * labels, Category::kTemporaries, "classifier.logits");
  // CrossEntropyLoss: log_softmax (fp32 under autocast) saves its output; nll_loss a scalar.
  em.Begin("loss");
  u->log_probs = em.Alloc(4 * d.b * labels, Category::kActivations, "loss.log_probs");
  u->loss = em.Alloc(4, Category::kActivations, "loss.output");
  const TensorId report = em.Alloc(4, Category::kOther, "loss.report");
  em.Free(logits);  // SequenceClassifierOutput.logits: dropped when the step's outputs go
  return report;
}

TensorId ClassificationHead::Backward(ModuleContext& ctx, const Batch& batch, const HeadSaved& u) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t labels = ctx.model.num_labels;
  const Bytes row = d.act_bytes * d.b * d.h;
  em.Begin("loss_bwd");
  const TensorId dlogits =
      em.Alloc(d.act_bytes * d.b * labels, Category::kTemporaries, "classifier.d_logits");
  for (TensorId id : {u.log_probs, u.loss, batch.loss_mask}) em.Free(id);
  em.Begin("classifier_bwd");
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  TensorId g = em.Alloc(row, Category::kTemporaries, "classifier.d_input");
  ctx.k.WeightGradToAutograd(labels, d.h, false, "classifier.wgrad", "classifier.weight");
  ctx.k.SmallWeightGrad(labels, "classifier.bias_grad", "classifier.bias");
  em.Free(dlogits);
  ctx.k.ReleaseWeightCopy(u.classifier_copy);
  if (d.hidden_dropout) {
    em.Begin("classifier.dropout_bwd");
    const TensorId g2 = em.Alloc(row, Category::kTemporaries, "classifier.d_dropout");
    for (TensorId id : {g, u.pooled_mask, u.pooled_dropped}) em.Free(id);
    g = g2;
  }
  em.Begin("pooler.tanh_bwd");
  const TensorId dd = em.Alloc(row, Category::kTemporaries, "pooler.d_dense_out");
  em.Free(g);
  em.Free(u.pooled);
  em.Begin("pooler.dense_bwd");
  const TensorId dfirst = em.Alloc(row, Category::kTemporaries, "pooler.d_first_token");
  ctx.k.WeightGradToAutograd(d.h, d.h, false, "pooler.dense.wgrad", "pooler.dense.weight");
  ctx.k.SmallWeightGrad(d.h, "pooler.dense.bias_grad", "pooler.dense.bias");
  em.Free(dd);
  ctx.k.ReleaseWeightCopy(u.pooler_copy);
  em.Flops(4.0 * d.b * d.h * d.h);
  em.Begin("pooler.select_bwd");  // SelectBackward: a zero [b, s, h] grad with row 0 filled
  const TensorId dx = em.Alloc(d.act_bytes * d.T * d.h, Category::kTemporaries, "head.d_input");
  em.Free(dfirst);
  em.Free(u.last_output);
  return dx;
}

}  // namespace memsim::workload
