#include "workload/stage_runner.h"

#include "core/check.h"
#include "workload/modules/hf_encoder.h"

namespace memsim::workload {

StageRunner::StageRunner(ModuleContext& ctx, const config::TrainingConfig& tc, int rank,
                         DecoderLayer& layer, DataParallel& dp, PipelineExchange& exchange)
    : ctx_(ctx),
      d_(ctx.d),
      rank_(rank),
      layer_(layer),
      dp_(dp),
      exchange_(exchange),
      runs_(RecomputeRuns(tc, ctx.d.StageLayers(rank))) {
  // The output layer reads the embedding's own Parameter when both are on this stage (tied, PP
  // 1: OutputAndLoss::OutputWeight); its grad then has two producers per backward.
  const std::string output_weight = OutputAndLoss::OutputWeight(d_, /*has_embedding=*/d_.p == 1);
  if (!ctx.model.sequence_classification && Pre(0) && Post(d_.v - 1) &&
      output_weight == "embedding.word_embeddings.weight") {
    ctx_.k.ShareGradAccumulator(output_weight);
  }
}

int StageRunner::GlobalLayer(int chunk, int i) const {
  return d_.FirstLayer(chunk, rank_) + i;
}
bool StageRunner::Pre(int chunk) const { return rank_ == 0 && chunk == 0; }
bool StageRunner::Post(int chunk) const { return rank_ == d_.p - 1 && chunk == d_.v - 1; }

std::vector<TensorId> StageRunner::TakeReportLosses() {
  std::vector<TensorId> out;
  out.swap(report_losses_);
  return out;
}

TensorId StageRunner::LayersForward(Unit& u, int chunk, TensorId x) {
  for (const LayerRun& run : runs_) {
    for (int i = run.first; i <= run.last; ++i) {
      u.layer_inputs[i] = x;
      const int l = GlobalLayer(chunk, i);
      dp_.BeforeForward(ctx_.em, GradSite::kLayer, l);
      if (run.checkpointed) {
        // CheckpointFunction.forward runs under no_grad: only the run's input stays.
        DecoderLayer::Saved discarded;
        x = layer_.Forward(ctx_, l, x, /*nograd=*/true, i > run.first, &discarded);
      } else {
        x = layer_.Forward(ctx_, l, x, false, false, &u.layers[i]);
      }
      dp_.AfterForward(ctx_.em, GradSite::kLayer, l);
    }
  }
  return x;
}

// forward_step returns: the batch tensors autograd did not save are dropped.
void StageRunner::DropBatch(Unit& u) {
  Emitter& em = ctx_.em;
  const bool positions_saved = LearnedPositions(ctx_.model);
  if (u.batch.tokens != u.embedding.indices) em.Free(u.batch.tokens);
  if (!positions_saved) em.Free(u.batch.position_ids);
  em.Free(u.batch.labels);
  if (!ctx_.f.attention_mask_to_backward) {
    em.Free(u.batch.attention_mask);
    u.batch.attention_mask = 0;
  }
  u.batch.tokens = u.batch.labels = 0;
  if (!positions_saved) u.batch.position_ids = 0;
}

void StageRunner::Forward(int mb, int chunk, const ScheduleStep* next) {
  Unit& u = units_[{mb, chunk}];
  u = Unit{};
  u.layer_inputs.assign(d_.StageLayers(rank_), 0);
  u.layers.resize(d_.StageLayers(rank_));
  const bool pre = Pre(chunk), post = Post(chunk);
  TensorId x;
  if (pre) {
    u.batch = GetBatch(ctx_, pre, post);
    dp_.BeforeForward(ctx_.em, GradSite::kEmbedding, -1);
    x = Embedding::Forward(ctx_, u.batch, &u.embedding);
    dp_.AfterForward(ctx_.em, GradSite::kEmbedding, -1);
  } else {
    // p2p_communication.py _communicate: torch.empty((s/σ, b, h), requires_grad=True), kept
    // in input_tensors until this unit's backward.
    x = exchange_.ReceiveForward(chunk);
    u.input_external = true;
    // forward_step: set_input_tensor, then the forward step function's get_batch.
    if (post) u.batch = GetBatch(ctx_, pre, post);
  }
  u.stage_input = x;
  x = LayersForward(u, chunk, x);
  if (post) {
    dp_.BeforeForward(ctx_.em, GradSite::kHead, -1);
    report_losses_.push_back(
        ctx_.model.sequence_classification
            ? ClassificationHead::Forward(ctx_, x, &u.head)
            : OutputAndLoss::Forward(
                  ctx_, x, OutputAndLoss::OutputWeight(d_, /*has_embedding=*/d_.p == 1), &u.head));
    // loss_func: the reporting loss (a scalar) all-reduced over Megatron's "dp" (ModelDims).
    if (ctx_.f.loss_dp_all_reduce) {
      ctx_.em.Begin("loss.reporting_all_reduce");
      ctx_.em.Collective(CommGroup::kDp, d_.d, 4, Coll::kAllReduce);
    }
    dp_.AfterForward(ctx_.em, GradSite::kHead, -1);
  }
  DropBatch(u);
  ctx_.k.EndAutocastRegion();  // the forward step's autocast region ends
  if (!post) exchange_.SendForward(x, next != nullptr && !next->forward && !Post(next->chunk));
}

TensorId StageRunner::LayersBackward(Unit& u, int chunk, TensorId dy, bool dy_external) {
  Emitter& em = ctx_.em;
  for (auto run = runs_.rbegin(); run != runs_.rend(); ++run) {
    TensorId recomputed_out = 0;
    if (run->checkpointed) {
      // CheckpointFunction.backward: re-run the run's forward with grad, then its backward.
      // The re-run calls each layer as a module, so its forward pre / post hooks fire again,
      // layer by layer, before the run's backward: Megatron's custom_forward calls layer(...)
      // (transformer_block.py _checkpointed_forward), re-run by ctx.run_function in
      // tensor_parallel/random.py CheckpointFunction.backward; Transformers checkpoints
      // decoder_layer.__call__ (torch/utils/checkpoint.py CheckpointFunction.backward). Hence
      // the wrapper's forward hooks around each re-run layer; what a sharding wrapper does there
      // is its own rule (FSDP's _pre_forward / _post_forward return at once in the recomputed
      // forward, torch/distributed/fsdp/_runtime_utils.py: its pre-backward hook unsharded).
      em.SetPrefix("recompute.");
      TensorId x = u.layer_inputs[run->first];
      for (int i = run->first; i <= run->last; ++i) {
        u.layer_inputs[i] = x;
        const int l = GlobalLayer(chunk, i);
        dp_.BeforeForward(em, GradSite::kLayer, l);
        x = layer_.Forward(ctx_, l, x, false, false, &u.layers[i]);
        dp_.AfterForward(em, GradSite::kLayer, l);
      }
      em.SetPrefix("");
      recomputed_out = x;  // held by the checkpoint until its backward ends
    }
    for (int i = run->last; i >= run->first; --i) {
      const bool free_x = !(i == 0 && u.input_external);
      const bool free_dy = !(i == d_.StageLayers(rank_) - 1 && dy_external);
      const int l = GlobalLayer(chunk, i);
      dp_.BeforeBackward(em, GradSite::kLayer, l);
      dy = layer_.Backward(ctx_, l, u.layers[i], u.layer_inputs[i], free_x, dy, free_dy);
      dp_.AfterBackward(em, GradSite::kLayer, l);
    }
    em.Free(recomputed_out);
  }
  return dy;
}

void StageRunner::Backward(int mb, int chunk, const ScheduleStep* next) {
  auto it = units_.find({mb, chunk});
  MEMSIM_CHECK(it != units_.end());
  Unit& u = it->second;
  Emitter& em = ctx_.em;
  const bool pre = Pre(chunk), post = Post(chunk);
  ctx_.k.SetAutogradThread(true);  // backward_step's autograd run, recompute included
  TensorId dy;
  if (post) {
    dp_.BeforeBackward(em, GradSite::kHead, -1);
    dy = ctx_.model.sequence_classification
             ? ClassificationHead::Backward(ctx_, u.batch, u.head)
             : OutputAndLoss::Backward(ctx_, u.batch, u.head,
                                       OutputAndLoss::OutputWeight(d_, /*has_embedding=*/d_.p == 1));
    dp_.AfterBackward(em, GradSite::kHead, -1);
  } else {
    dy = exchange_.ReceiveBackward();
  }
  const TensorId recv_grad = post ? 0 : dy;
  dy = LayersBackward(u, chunk, dy, !post);
  em.Free(u.batch.attention_mask);  // the checkpoints that saved it are backwarded (model.h)
  u.batch.attention_mask = 0;
  if (pre) {
    dp_.BeforeBackward(em, GradSite::kEmbedding, -1);
    Embedding::Backward(ctx_, u.batch, u.embedding, dy);
    dp_.AfterBackward(em, GradSite::kEmbedding, -1);
  }
  dp_.EndOfBackward(em);
  ctx_.k.SetAutogradThread(false);
  exchange_.AfterBackwardStep(recv_grad);  // backward_step returned
  if (!pre) {
    // The input grad goes to the previous stage; with a forward next, its input is received
    // in the same exchange, then the backwarded input is dropped.
    exchange_.SendBackward(chunk, u.stage_input, dy,
                           next != nullptr && next->forward && !Pre(next->chunk));
  }
  units_.erase(it);
}

}  // namespace memsim::workload
