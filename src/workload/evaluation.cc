// The evaluation pass inside training (evaluation.h). Ownership of what the loop keeps is
// modelled with the Emitter's shared references: the loop's locals (the last batch's losses,
// logits, labels) and each EvalLoopContainer hold one reference each, as the Python objects do.
#include "workload/evaluation.h"

#include <string>
#include <vector>

#include "core/check.h"
#include "workload/modules/embedding.h"
#include "workload/modules/hf_encoder.h"
#include "workload/modules/output_loss.h"

namespace memsim::workload {
namespace {

// EvalLoopContainer (transformers/trainer_pt_utils.py) with do_nested_concat: add() keeps the
// first batch's tensor itself, then torch.cat's (old + new) into a new tensor and drops the
// old; without it, a list of the batches' tensors. to_cpu_and_numpy() drops the device tensors.
class Container {
 public:
  Container(std::string name, bool concat) : name_(std::move(name)), concat_(concat) {}

  void Add(Emitter& em, TensorId batch) {
    em.Ref(batch);
    if (!concat_) {
      held_.push_back(batch);
      return;
    }
    if (held_.empty()) {
      held_.push_back(batch);
      return;
    }
    em.Begin("eval." + name_ + ".concat");
    const Bytes total = em.SizeOf(held_[0]) + em.SizeOf(batch);
    const TensorId cat = em.Alloc(total, Category::kOther, "eval." + name_);
    em.Ref(cat);
    em.Unref(held_[0]);
    em.Unref(batch);
    held_[0] = cat;
  }

  void ToCpu(Emitter& em) {
    for (TensorId id : held_) em.Unref(id);
    held_.clear();
  }

 private:
  std::string name_;
  bool concat_;
  std::vector<TensorId> held_;
};

// The tensors one evaluation batch leaves to the loop: the losses, and with predictions kept
// the logits and labels (all gathered across processes).
struct BatchResults {
  TensorId losses = 0, logits = 0, labels = 0;
};

// Frees what the head's forward made for backward; under no_grad nothing is saved, so each
// tensor goes when the head returns (the head's ops are grad-mode ops followed by these frees).
void DropHead(ModuleContext& ctx, const HeadSaved& u) {
  Emitter& em = ctx.em;
  em.Begin("head_done");
  for (TensorId id : {u.last_output, u.final_mean, u.final_rstd, u.final_out, u.logits_fp32,
                      u.target_mask, u.masked_target, u.loss, u.pooled, u.pooled_mask,
                      u.pooled_dropped, u.log_probs}) {
    em.Free(id);
  }
  for (TensorId id : {u.weight_copy, u.pooler_copy, u.classifier_copy}) {
    if (id != 0) ctx.k.ReleaseWeightCopy(id);
  }
}

// accelerate gather_for_metrics across processes: an all-gather into a new tensor; the
// process's own tensor is dropped when the loop's local is rebound. One process: as is.
TensorId Gather(ModuleContext& ctx, TensorId t, const char* label) {
  const int world = static_cast<int>(ctx.d.d);
  if (world <= 1 || t == 0) return t;
  Emitter& em = ctx.em;
  em.Begin(std::string("gather_") + label);
  const TensorId all = em.Alloc(em.SizeOf(t) * world, Category::kOther, std::string("eval.") + label);
  em.Collective(CommGroup::kDp, world, static_cast<double>(em.SizeOf(t)), Coll::kGather);
  em.Free(t);
  return all;
}

// One prediction_step and what evaluation_loop gathers from it.
BatchResults PredictionStep(ModuleContext& ctx, DecoderLayer& layer,
                            const config::TrainingConfig& tc) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const bool classify = ctx.model.sequence_classification;
  Batch batch = GetBatch(ctx, true, true);
  EmbeddingSaved emb;
  TensorId x = Embedding::Forward(ctx, batch, &emb);
  em.Begin("embedding_done");
  for (TensorId id : {emb.dropout_mask, emb.norm_in, emb.norm_mean, emb.norm_rstd}) em.Free(id);
  if (emb.indices != batch.tokens) em.Free(emb.indices);
  for (int l = 0; l < d.L; ++l) {
    DecoderLayer::Saved discarded;
    x = layer.Forward(ctx, l, x, /*nograd=*/true, /*free_input=*/true, &discarded);
  }
  HeadSaved head;
  const TensorId report =
      classify ? ClassificationHead::Forward(ctx, x, &head)
               : OutputAndLoss::Forward(ctx, x, OutputAndLoss::OutputWeight(d, true), &head);
  DropHead(ctx, head);
  em.Free(report);
  ctx.k.EndAutocastRegion();
  BatchResults r;
  // loss.detach().mean(), then losses.repeat(batch_size): [b] fp32.
  em.Begin("losses");
  r.losses = em.Alloc(4 * d.b, Category::kOther, "eval.losses");
  r.losses = Gather(ctx, r.losses, "losses");
  for (TensorId id : {batch.tokens, batch.position_ids, batch.loss_mask}) em.Free(id);
  if (!config::HfTrainerOf(tc).eval_keep_predictions) {
    em.Free(batch.labels);
    return r;
  }
  // outputs.logits, made fp32 by accelerate's convert_outputs_to_fp32 under autocast: [b, s, V]
  // for a causal LM, [b, num_labels] for sequence classification.
  const Bytes logit_bytes = tc.precision != config::Precision::kFp32 ? 4 : d.act_bytes;
  const Bytes logits_size =
      classify ? logit_bytes * d.b * ctx.model.num_labels : logit_bytes * d.T * d.V;
  em.Begin("logits");
  r.logits = Gather(ctx, em.Alloc(logits_size, Category::kOther, "eval.logits"), "logits");
  // The batch's labels ([b, s] int64; [b] for classification) are what prediction_step returns.
  if (classify) {
    em.Free(batch.labels);
    batch.labels = em.Alloc(8 * d.b, Category::kOther, "eval.labels");
  }
  r.labels = Gather(ctx, batch.labels, "labels");
  return r;
}

}  // namespace

bool EvaluatesAfterStep(const config::TrainingConfig& tc, int step) {
  const config::HfTrainerOptions* h = tc.hf_trainer();
  return h != nullptr && h->eval_steps > 0 && h->eval_batches > 0 && step % h->eval_steps == 0 &&
         step >= h->eval_delay;
}

ModelDims EvalDims(const ModelDims& train, const config::TrainingConfig& tc) {
  ModelDims d = train;
  // Without the Trainer's block there is no evaluation pass: the training batch stays.
  if (const config::HfTrainerOptions* h = tc.hf_trainer()) d.b = h->eval_batch_size;
  d.T = d.s * d.b;
  d.hidden_dropout = false;  // model.eval(): nn.Dropout is the identity
  d.attention_dropout = false;
  return d;
}

void RunEvaluation(ModuleContext& ctx, DecoderLayer& layer, const config::TrainingConfig& tc,
                   const ModelDims& train_dims) {
  MEMSIM_CHECK(ctx.d.p == 1 && ctx.d.v == 1);
  Emitter& em = ctx.em;
  ctx.k.SetDims(ctx.d);
  const config::HfTrainerOptions& h = config::HfTrainerOf(tc);
  const bool concat = h.eval_do_concat_batches;
  Container losses("losses", concat), logits("logits", concat), labels("labels", concat);
  BatchResults locals;  // the loop's variables: the last batch's tensors
  const auto drop_locals = [&] {
    for (TensorId id : {locals.losses, locals.logits, locals.labels}) em.Unref(id);
    locals = BatchResults{};
  };
  for (int i = 0; i < h.eval_batches; ++i) {
    em.SetPrefix("eval.");
    BatchResults r = PredictionStep(ctx, layer, tc);
    em.SetPrefix("");
    em.Begin("eval.step_done");
    for (TensorId id : {r.losses, r.logits, r.labels}) em.Ref(id);
    drop_locals();  // `losses, logits, labels = self.prediction_step(...)` rebinds them
    locals = r;
    losses.Add(em, r.losses);
    if (r.logits != 0) logits.Add(em, r.logits);
    if (r.labels != 0) labels.Add(em, r.labels);
    if (h.eval_accumulation_steps > 0 && (i + 1) % h.eval_accumulation_steps == 0) {
      // evaluation_loop: to_cpu_and_numpy on each container, del the locals, empty_cache().
      em.Begin("eval.to_cpu");
      for (Container* c : {&losses, &logits, &labels}) c->ToCpu(em);
      drop_locals();
      em.EmptyCache();
    }
  }
  // get_arrays() moves what is left to the CPU; the locals go when evaluation_loop returns.
  em.Begin("eval.done");
  for (Container* c : {&losses, &logits, &labels}) c->ToCpu(em);
  drop_locals();
  ctx.k.SetDims(train_dims);
}

}  // namespace memsim::workload
