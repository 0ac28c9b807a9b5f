#include "workload/modules/embedding.h"

#include <algorithm>
#include <vector>

#include "workload/modules/hf_encoder.h"

namespace memsim::workload {

bool LearnedPositions(const config::ModelConfig& model) {
  return model.position_embedding_type == config::PositionEmbedding::kLearnedAbsolute;
}

Batch GetBatch(ModuleContext& ctx, bool first_stage, bool last_stage) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  Batch b;
  em.Begin("data.get_batch");
  double bytes = 0;
  if (first_stage) {
    b.tokens = em.Alloc(8 * d.T, Category::kActivations, "data.tokens");
    b.position_ids = em.Alloc(8 * d.T, Category::kActivations, "data.position_ids");
    bytes += 16.0 * d.T;
  }
  if (last_stage) {
    b.labels = em.Alloc(8 * d.T, Category::kActivations, "data.labels");
    b.loss_mask = em.Alloc(4 * d.T, Category::kActivations, "data.loss_mask");
    bytes += 12.0 * d.T;
  }
  if (ctx.f.dataloader_attention_mask && (first_stage || last_stage)) {
    // gpt_dataset.py _get_ltor_masks_and_position_ids: torch.tril(ones(S, S)) < 0.5, one bool
    // [1, S, S] per sample over the full sequence S = s·cp; get_batch_on_this_tp_rank moves the
    // collated [b, 1, S, S] to the device (or broadcasts into an empty one on TP ranks > 0);
    // get_batch_on_this_cp_rank index_selects this rank's S/cp query rows into a new tensor.
    const std::int64_t full_s = d.s * d.cp;
    b.attention_mask = em.Alloc(d.b * full_s * full_s, Category::kActivations, "data.attention_mask");
    bytes += static_cast<double>(d.b * full_s * full_s);
    if (d.cp > 1) {
      const TensorId full = b.attention_mask;
      b.attention_mask = em.Alloc(d.b * d.s * full_s, Category::kActivations, "data.attention_mask");
      em.Free(full);
    }
  }
  em.Collective(CommGroup::kTp, d.t, bytes, Coll::kGather);
  return b;
}

void Embedding::AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                             std::vector<ParamTensor>* out) {
  out->push_back(
      MakeParam("embedding.word_embeddings.weight", d.V / d.t * d.h, d.h, chunk, -1, false, false));
  out->back().shared_embedding = d.tied && d.p > 1;
  if (LearnedPositions(model)) {
    out->push_back(MakeParam("embedding.position_embeddings.weight", d.max_positions * d.h, d.h,
                             chunk, -1, false, false));
  }
  if (model.type_vocab_size > 0) AppendEncoderEmbeddingParams(model, d, chunk, out);
}

TensorId Embedding::Forward(ModuleContext& ctx, const Batch& batch, EmbeddingSaved* saved) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  // wide_bytes: BERT under autocast looks up fp32 weights (embeddings are not autocast ops) and
  // its dropout output is fp32 (model.h); act_bytes everywhere else.
  const Bytes full = d.wide_bytes * d.T * d.h;
  em.Begin("embedding.lookup");
  if (d.t > 1) {
    const TensorId mask = em.Alloc(d.T, Category::kTemporaries, "embedding.input_mask");
    saved->indices = em.Alloc(8 * d.T, Category::kActivations, "embedding.masked_input");
    em.Free(mask);
  } else {
    saved->indices = batch.tokens;  // F.embedding saves the indices themselves
  }
  TensorId x = em.Alloc(full, Category::kTemporaries, "embedding.word_out");
  if (!d.sp) em.Collective(CommGroup::kTp, d.t, static_cast<double>(full), Coll::kAllReduce);
  if (ctx.model.type_vocab_size > 0) {
    x = EncoderEmbeddingForward(ctx, x, saved);
  } else if (LearnedPositions(ctx.model)) {
    em.Begin("embedding.position");
    const TensorId pos = em.Alloc(full, Category::kTemporaries, "embedding.position_out");
    const TensorId sum = em.Alloc(full, Category::kTemporaries, "embedding.sum");
    em.Free(x);
    em.Free(pos);
    x = sum;
  }
  const bool last_is_transpose = !d.sp && !d.hidden_dropout;
  TensorId y = 0;
  if (!ctx.f.hf) {  // Megatron's LanguageModelEmbedding; Transformers models stay [b, s, h]
    em.Begin("embedding.transpose");  // [b, s, h] -> [s, b, h] .contiguous()
    y = em.Alloc(full, last_is_transpose ? Category::kActivations : Category::kTemporaries,
                 last_is_transpose ? "embedding.out" : "embedding.transposed");
    em.Free(x);
    x = y;
  }
  if (d.sp) {
    em.Begin("embedding.scatter");
    y = em.Alloc(full / d.t, d.hidden_dropout ? Category::kTemporaries : Category::kActivations,
                 d.hidden_dropout ? "embedding.scattered" : "embedding.out");
    em.Collective(CommGroup::kTp, d.t, static_cast<double>(full), Coll::kGather);
    em.Free(x);
    x = y;
  }
  if (d.hidden_dropout) {
    em.Begin("embedding.dropout");
    saved->dropout_mask =
        em.Alloc(d.T * d.h / d.sigma, Category::kActivations, "embedding.dropout_mask");
    y = em.Alloc(full / d.sigma, Category::kActivations, "embedding.out");
    em.Free(x);
    x = y;
  }
  return x;
}

namespace {

// Temporaries of PyTorch's embedding_dense_backward_cuda (aten/src/ATen/native/cuda/Embedding.cu)
// and embedding_backward_cuda_kernel (EmbeddingBackwardKernel.cu), alive together with the
// dense [V/t, h] grad it returns. Up to 3072 indices it runs one atomic kernel straight into the
// grad: nothing else. Above that, int64 indices (Megatron's tokens are int64) are radix-sorted:
// sorted_indices, orig_indices and their arange, [T] each; then segment_offsets [T],
// partials_per_segment and partials_per_segment_offset [min(T, V/t)] each,
// partial_segment_offset [T/10 + min(T, V/t)] (NROWS_PER_THREAD = 10), and
// grad_weight_per_segment [T/10 + min(T, V/t), h] in acc_type, fp32 for 16-bit and fp32 grads
// ("for numerical stability"). Sizes from pytorch/pytorch#78588 (2022-06, the upper bounds in
// every release since); before pytorch/pytorch#70943 the partial count was read back from the
// device (at most this bound), between the two PRs it was T. CUB's own scratch is not modelled.
// torch_npu's kernel is not audited: the sort buffers only, as before.
bool SortedEmbeddingBackward(const ModelDims& d, const FrameworkFacts& f) {
  constexpr std::int64_t kAtomicPathMaxIndices = 3072;
  return f.npu || d.T > kAtomicPathMaxIndices;
}

// The radix sort's buffers, made before the grad.
std::vector<TensorId> EmbeddingSortBuffers(const ModuleContext& ctx, Emitter& em) {
  const ModelDims& d = ctx.d;
  if (!SortedEmbeddingBackward(d, ctx.f)) return {};
  return {em.Alloc(24 * d.T, Category::kTemporaries, "embedding.sort_buffers")};
}

// The segment buffers and fp32 partial sums, made after the grad.
void AppendSegmentBuffers(const ModuleContext& ctx, Emitter& em, std::vector<TensorId>* out) {
  const ModelDims& d = ctx.d;
  if (ctx.f.npu || !SortedEmbeddingBackward(d, ctx.f)) return;
  const std::int64_t segments = std::min(d.T, d.V / d.t);
  const std::int64_t partials = d.T / 10 + segments;
  out->push_back(em.Alloc(8 * (d.T + 2 * segments + partials), Category::kTemporaries,
                          "embedding.segment_offsets"));
  out->push_back(
      em.Alloc(4 * partials * d.h, Category::kTemporaries, "embedding.grad_weight_per_segment"));
}

}  // namespace

void Embedding::Backward(ModuleContext& ctx, const Batch& batch, const EmbeddingSaved& saved,
                         TensorId dx) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes full = d.wide_bytes * d.T * d.h;  // the grads of Forward's tensors
  if (d.hidden_dropout) {
    em.Begin("embedding.dropout_bwd");
    const TensorId g = em.Alloc(full / d.sigma, Category::kTemporaries, "embedding.d_dropout");
    em.Free(saved.dropout_mask);
    em.Free(dx);
    dx = g;
  }
  if (d.sp) {
    em.Begin("embedding.scatter_bwd");
    const TensorId g = em.Alloc(full, Category::kTemporaries, "embedding.d_gathered");
    em.Collective(CommGroup::kTp, d.t, static_cast<double>(full), Coll::kGather);
    em.Free(dx);
    dx = g;
  }
  if (ctx.model.type_vocab_size > 0) dx = EncoderEmbeddingBackward(ctx, saved, dx);
  if (LearnedPositions(ctx.model)) {
    em.Begin("embedding.position_bwd");
    ctx.k.SmallWeightGrad(d.max_positions * d.h, "embedding.position_embeddings.grad",
                          "embedding.position_embeddings.weight");
    em.Free(batch.position_ids);
  }
  // embedding_dense_backward: a dense [V/t, h] grad in the weight dtype, handed to autograd,
  // and the sorted path's temporaries (SortedEmbeddingBackward), in the kernel's order.
  em.Begin("embedding.wgrad");
  // A frozen embedding (PEFT) gets no weight grad: autograd skips the kernel.
  const bool trainable = ctx.k.Trainable("embedding.word_embeddings.weight");
  std::vector<TensorId> temps;
  if (trainable) temps = EmbeddingSortBuffers(ctx, em);
  ctx.k.SmallWeightGrad(d.V / d.t * d.h, "embedding.word_embeddings.grad",
                        "embedding.word_embeddings.weight");
  if (trainable) AppendSegmentBuffers(ctx, em, &temps);
  for (TensorId id : temps) em.Free(id);
  em.Free(dx);
  em.Free(saved.indices);
  // A weight tied to the output layer on this stage: the output layer's grad waited in
  // AccumulateGrad's InputBuffer, the embedding's grad is summed into it now (Kernels::
  // ShareGradAccumulator).
  ctx.k.AccumulateSharedGrads("embedding.grad_accumulate");
}

}  // namespace memsim::workload
