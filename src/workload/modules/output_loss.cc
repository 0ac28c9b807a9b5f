#include "workload/modules/output_loss.h"

#include <optional>

namespace memsim::workload {

namespace {

// What the model's output object held besides the logits (ModuleContext::output_held: the
// DynamicCache's k and v), released when Trainer.compute_loss drops `outputs`.
void ReleaseOutputHeld(ModuleContext& ctx) {
  if (ctx.output_held == nullptr) return;
  for (TensorId id : *ctx.output_held) ctx.em.Unref(id);
  ctx.output_held->clear();
}

// Transformers' causal-LM loss after the lm_head (the logits [b, s, V] in the autocast dtype C):
// LlamaForCausalLM.forward calls self.loss_function, ForCausalLMLoss (transformers
// src/transformers/loss/loss_utils.py at 0114da07ec; the releases with the pad-based label shift):
//   logits = logits.float()            a new fp32 [T, V] unless C is fp32; the local lives until
//                                      ForCausalLMLoss returns (log_softmax saves its output,
//                                      not its input)
//   labels = pad(labels, (0, 1)); shift_labels = labels[..., 1:].contiguous()   int64 [T]
//   fixed_cross_entropy: F.cross_entropy = log_softmax (fp32 [T, V], saved by LogSoftmaxBackward
//                                      and NllLossBackward) + nll_loss (saves the labels)
// Before 4.49 (FrameworkFacts::hf_loss_shift_copy; ForCausalLMLoss at v4.47.1, and
// LlamaForCausalLM.forward itself before 4.46, e.g. 4.36 at 0864dd3b) the logits are shifted:
//   shift_logits = logits[..., :-1, :].contiguous()   a new fp32 [b (s - 1), V], a local until
//                                      the loss returns
//   shift_labels = labels[..., 1:].contiguous()       int64 [b (s - 1)]
// and log_softmax and nll_loss run on b (s - 1) rows. With b = 1 both slices are contiguous
// already (a size-1 dimension's stride does not count: c10 TensorImpl compute_contiguous), so
// `.contiguous()` returns the view and nothing is copied. (Before 4.46 the fp32 `logits` was the
// output object's and lived until the caller dropped it: not modelled, memsim frees it at the
// loss's return as from 4.46.)
// The 16-bit logits are held by the model's output object. Under the Trainer's mixed precision
// (FrameworkFacts::hf_native_amp) convert_outputs_to_fp32 (accelerate utils/operations.py
// convert_to_fp32, at 16cb6eb80d) rebuilds the output with `logits.float()`, a second fp32
// [T, V], and the 16-bit logits go with the old output object. The logits left go when
// Trainer.compute_loss returns (its local `outputs`), before backward.
TensorId HfCausalLmLossForward(ModuleContext& ctx, TensorId logits, HeadSaved* u) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes vocab = d.V / d.t;
  const Bytes tv = d.T * vocab;
  const std::int64_t rows = ctx.f.hf_loss_shift_copy ? d.T - d.b : d.T;
  const bool widen = d.act_bytes != 4;
  em.Begin("loss.logits_float");
  const TensorId logits32 =
      widen ? em.Alloc(4 * tv, Category::kTemporaries, "loss.logits_fp32") : logits;
  TensorId shifted = 0;
  const bool view = ctx.f.hf_loss_shift_copy && d.b == 1;  // the shifted slices are contiguous
  if (ctx.f.hf_loss_shift_copy && !view) {
    em.Begin("loss.shift_logits");
    shifted = em.Alloc(4 * rows * vocab, Category::kTemporaries, "loss.shift_logits");
  }
  u->masked_target =
      view ? 0 : em.Alloc(8 * rows, Category::kActivations, "loss.shift_labels");
  em.Begin("cross_entropy");
  u->log_probs = em.Alloc(4 * rows * vocab, Category::kActivations, "loss.log_probs");
  u->loss = em.Alloc(8, Category::kActivations, "loss.output");  // loss and total_weight
  const TensorId report = em.Alloc(8, Category::kOther, "loss.report");  // loss / num_items
  em.Free(shifted);               // `return loss`: the loss's locals go
  if (widen) em.Free(logits32);
  if (ctx.f.hf_native_amp && widen) {
    em.Begin("loss.outputs_to_fp32");
    const TensorId converted = em.Alloc(4 * tv, Category::kTemporaries, "loss.outputs_logits_fp32");
    em.Free(logits);
    em.Begin("loss.compute_loss_return");
    em.Free(converted);
    ReleaseOutputHeld(ctx);
  } else {
    em.Begin("loss.compute_loss_return");
    em.Free(logits);
    ReleaseOutputHeld(ctx);
  }
  return report;
}

// Its backward (loss.backward(), torch/csrc/autograd/engine.cpp releases a node's saved tensors
// after it runs): NllLossBackward makes the fp32 [rows, V] grad (zeros scattered), then releases
// the labels; LogSoftmaxBackward (_log_softmax_backward_data) a new fp32 [rows, V] grad while the
// first and the saved log-probabilities are alive, then both go; with the shift copy,
// CloneBackward of `.contiguous()` passes the grad on and SliceBackward (slice_backward) writes it
// into a new zero fp32 [T, V]; ToCopyBackward of `.float()` a C grad [T, V]. Returns the logits'
// grad.
TensorId HfCausalLmLossBackward(ModuleContext& ctx, const Batch& batch, const HeadSaved& u) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes tv = d.T * (d.V / d.t);
  const Bytes rows_v = (ctx.f.hf_loss_shift_copy ? d.T - d.b : d.T) * (d.V / d.t);
  em.Begin("loss_bwd");
  const TensorId g = em.Alloc(4 * rows_v, Category::kTemporaries, "loss.d_log_probs");
  for (TensorId id : {u.loss, batch.loss_mask, u.masked_target}) em.Free(id);
  em.Begin("log_softmax_bwd");
  TensorId dlogits = em.Alloc(4 * rows_v, Category::kTemporaries, "loss.d_logits_fp32");
  for (TensorId id : {g, u.log_probs}) em.Free(id);
  if (ctx.f.hf_loss_shift_copy) {
    em.Begin("shift_logits_bwd");
    const TensorId full = em.Alloc(4 * tv, Category::kTemporaries, "loss.d_logits_unshifted");
    em.Free(dlogits);
    dlogits = full;
  }
  if (d.act_bytes != 4) {
    em.Begin("logits_float_bwd");
    const TensorId narrow =
        em.Alloc(d.act_bytes * tv, Category::kTemporaries, "output_layer.d_logits");
    em.Free(dlogits);
    dlogits = narrow;
  }
  return dlogits;
}

// Megatron's loss_func and _VocabParallelCrossEntropy.backward: the gradient in place in the
// saved softmax, then ToCopyBackward of `.float()` (16-bit grad, fp32 buffer released). Returns
// the logits' grad.
TensorId VocabParallelLossBackward(ModuleContext& ctx, const Batch& batch, const HeadSaved& u) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("loss_bwd");
  const TensorId g = em.Alloc(4 * d.T, Category::kTemporaries, "loss.d_per_token");
  em.Free(u.loss);
  em.Free(batch.loss_mask);
  em.Begin("cross_entropy_bwd");
  const TensorId arange = em.Alloc(8 * d.T, Category::kTemporaries, "loss.arange");
  const TensorId upd = em.Alloc(4 * d.T, Category::kTemporaries, "loss.softmax_update");
  for (TensorId id : {arange, upd, g, u.target_mask, u.masked_target}) em.Free(id);
  TensorId dlogits = u.logits_fp32;
  if (d.act_bytes != 4) {
    em.Begin("logits_float_bwd");
    dlogits = em.Alloc(d.act_bytes * d.T * (d.V / d.t), Category::kTemporaries,
                       "output_layer.d_logits");
    em.Free(u.logits_fp32);
  }
  return dlogits;
}

// LlamaModel.norm, LlamaRMSNorm.forward (transformers modeling_llama.py, 4.36 0864dd3b and 4.48
// alike; the decoder's norms are hf_decoder.cc RmsNormForward): `hidden_states.to(torch.float32)`
// is a new fp32 copy unless x is fp32, which PowBackward0 and the rsqrt product's MulBackward0
// keep (x needs grad); n = h32 · rsqrt is fp32, cast back to x's dtype, and `self.weight * c`
// keeps c only for the weight's grad (mul_tensor_backward), so a frozen weight (PEFT) keeps
// none. The fp32 square and, for a 16-bit x, the fp32 n are transients. rstd and the output are
// Forward's own.
void HfFinalNormSaves(ModuleContext& ctx, TensorId x, HeadSaved* u) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t n = d.T * d.h / d.sigma;
  const Bytes in = em.SizeOf(x) / n;
  if (in != 4) u->final_h32 = em.Alloc(4 * n, Category::kActivations, "final_norm.input_fp32");
  const TensorId sq = em.Alloc(4 * n, Category::kTemporaries, "final_norm.squared");
  const TensorId n32 = em.Alloc(4 * n, Category::kActivations, "final_norm.normed_fp32");
  TensorId c = n32;
  if (in != 4) {
    c = em.Alloc(in * n, Category::kActivations, "final_norm.normed");
    em.Free(n32);
  }
  em.Free(sq);
  if (ctx.k.Trainable("final_norm.weight")) {
    u->final_normed = c;
  } else {
    em.Free(c);
  }
}

}  // namespace

void OutputAndLoss::AppendParams(const ModelDims& d, int chunk, bool has_embedding,
                                 std::vector<ParamTensor>* out) {
  out->push_back(MakeParam("final_norm.weight", d.h, 1, chunk, -1, true, true));
  if (d.layernorm) out->push_back(MakeParam("final_norm.bias", d.h, 1, chunk, -1, true, true));
  // Tied on one stage: the output layer reuses the embedding (no tensor). Tied with p > 1: the
  // last stage owns its own copy (gpt_model.py, skip_weight_param_allocation).
  if (!d.tied || !has_embedding) {
    out->push_back(MakeParam("output_layer.weight", d.V / d.t * d.h, d.h, chunk, -1, false, false));
    out->back().shared_embedding = d.tied && d.p > 1;
  }
}

std::string OutputAndLoss::OutputWeight(const ModelDims& d, bool has_embedding) {
  return d.tied && has_embedding ? "embedding.word_embeddings.weight" : "output_layer.weight";
}

TensorId OutputAndLoss::Forward(ModuleContext& ctx, TensorId x, const std::string& output_weight,
                                HeadSaved* u) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t vocab = d.V / d.t;
  u->last_output = x;
  em.Begin("final_norm");
  if (d.layernorm) {
    u->final_mean = em.Alloc(4 * d.T / d.sigma, Category::kActivations, "final_norm.mean");
  }
  u->final_rstd = em.Alloc(4 * d.T / d.sigma, Category::kActivations, "final_norm.rstd");
  if (ctx.f.hf && !d.layernorm) HfFinalNormSaves(ctx, x, u);
  u->final_out =
      em.Alloc(d.act_bytes * d.T * d.h / d.sigma, Category::kActivations, "final_norm.out");
  em.Begin("output_layer");  // Megatron ColumnParallelLinear: torch GEMM, "mpu" buffer with SP
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  ctx.k.SpGather(d.act_bytes * d.T * d.h, "output_layer.input_gather", /*torch_linear=*/true);
  u->weight_copy = ctx.k.CastWeight(vocab, d.h, output_weight, true);
  const TensorId logits =
      em.Alloc(d.act_bytes * d.T * vocab, Category::kTemporaries, "output_layer.logits");
  em.Flops(2.0 * d.T * d.h * vocab);
  if (ctx.f.hf) return HfCausalLmLossForward(ctx, logits, u);
  em.Begin("cross_entropy");
  // `.float()` makes the fp32 copy that becomes the saved softmax (a no-op in fp32).
  u->logits_fp32 = d.act_bytes != 4
                       ? em.Alloc(4 * d.T * vocab, Category::kActivations, "loss.logits_fp32")
                       : logits;
  const TensorId mx = em.Alloc(4 * d.T, Category::kTemporaries, "loss.logits_max");
  // Megatron-core < 0.8 (FrameworkFacts::ce_max_out_of_place): `logits - logits_max` is a new fp32
  // tensor, which becomes the saved softmax; the input copy lives until the Function returns.
  std::optional<TensorId> ce_input;
  if (ctx.f.ce_max_out_of_place) {
    ce_input = u->logits_fp32;
    u->logits_fp32 = em.Alloc(4 * d.T * vocab, Category::kActivations, "loss.logits_minus_max");
  }
  u->target_mask = em.Alloc(d.T, Category::kActivations, "loss.target_mask");
  u->masked_target = em.Alloc(8 * d.T, Category::kActivations, "loss.masked_target");
  const TensorId arange = em.Alloc(8 * d.T, Category::kTemporaries, "loss.arange");
  const TensorId pred = em.Alloc(4 * d.T, Category::kTemporaries, "loss.predicted_logits");
  const TensorId sum = em.Alloc(4 * d.T, Category::kTemporaries, "loss.sum_exp_logits");
  const TensorId per_token = em.Alloc(4 * d.T, Category::kTemporaries, "loss.per_token");
  em.Collective(CommGroup::kTp, d.t, 12.0 * d.T, Coll::kAllReduce);
  for (TensorId id : {mx, arange, pred, sum}) em.Free(id);
  if (ce_input) em.Free(*ce_input);  // the fp32 input (bf16: the .float() copy; fp32: the logits)
  if (d.act_bytes != 4) em.Free(logits);  // 16-bit logits dropped when GPTModel.forward returns
  // loss_func: sum(losses * loss_mask) (MulBackward keeps loss_mask), [2] reporting copy.
  em.Begin("loss_func");
  const TensorId prod = em.Alloc(4 * d.T, Category::kTemporaries, "loss.masked");
  u->loss = em.Alloc(8, Category::kActivations, "loss.output");
  const TensorId report = em.Alloc(8, Category::kOther, "loss.report");
  em.Free(prod);
  em.Free(per_token);
  return report;
}

TensorId OutputAndLoss::Backward(ModuleContext& ctx, const Batch& batch, const HeadSaved& u,
                                 const std::string& output_weight) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t vocab = d.V / d.t;
  const TensorId dlogits =
      ctx.f.hf ? HfCausalLmLossBackward(ctx, batch, u) : VocabParallelLossBackward(ctx, batch, u);
  em.Begin("output_layer_bwd");
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  ctx.k.SpGather(d.act_bytes * d.T * d.h, "output_layer.input_gather", true);
  // LinearWithGradAccumulationAndAsyncCommunication.backward (tensor_parallel/layers.py) hands
  // autograd a [V/t, h] weight grad.
  ctx.k.WeightGradToAutograd(vocab, d.h, /*te_layer=*/false, "output_layer.wgrad", output_weight);
  const TensorId din = ctx.k.ColumnParallelInputGrad("output_layer.d_input");
  em.Free(dlogits);
  em.Free(u.final_out);
  ctx.k.ReleaseWeightCopy(u.weight_copy);
  em.Flops(4.0 * d.T * d.h * vocab);
  em.Begin("final_norm_bwd");
  // The input's grad in the input's dtype (the engine's validate_outputs casts to it): the wide
  // residual stream's under autocast over wider weights or after prepare_model_for_kbit_training.
  const Bytes x_bytes = ctx.f.hf ? em.SizeOf(u.last_output) : d.act_bytes * d.T * d.h / d.sigma;
  const TensorId dx = em.Alloc(x_bytes, Category::kTemporaries, "final_norm.d_input");
  ctx.k.SmallWeightGrad(d.h, "final_norm.weight_grad", "final_norm.weight");
  if (d.layernorm) ctx.k.SmallWeightGrad(d.h, "final_norm.bias_grad", "final_norm.bias");
  for (TensorId id : {din, u.final_mean, u.final_rstd, u.final_h32, u.final_normed, u.last_output}) {
    em.Free(id);
  }
  return dx;
}

}  // namespace memsim::workload
