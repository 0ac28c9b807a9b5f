#include "workload/modules/mlp.h"

#include "workload/modules/residual.h"

namespace memsim::workload {
namespace {

constexpr ResidualNames kNames = {
    "mlp", "ln2", "fc2", "mlp.residual", "attn.residual_bwd", "attn.d_residual"};

struct MlpSaved final : ModuleSaved {
  NormSaved ln2;
  TensorId fc1_out = 0, act_out = 0, bda_mask = 0;
  TensorId fc1_weight_copy = 0, fc2_weight_copy = 0;  // autocast copies (kernels.h CastWeight)
  bool act_recompute = false;  // MindSpeed --recompute-activation-function: act_out dropped
};

// The branch: norm + fc1, activation, fc2. nograd: each tensor freed when the framework drops
// it: fc1's output at the activation's rebinding of `intermediate_parallel`, the activation's
// output when MLP.forward returns (megatron/core/transformer/mlp.py at d98e8a64dd), the norm's
// statistics at once and its output too with TE's fused LayerNormLinear, unless hold_norm_out
// (the caller frees it). Returns fc2's output.
TensorId BranchForward(ModuleContext& ctx, int l, bool nograd, bool hold_norm_out, MlpSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("mlp.ln_fc1", l);
  a->ln2 = NormForward(ctx, l, "ln2");
  CastNormOutput(ctx, l, "ln2", 1, !nograd, &a->ln2);  // BertIntermediate.dense's autocast copy
  const TensorId g =
      ctx.k.SpGather(d.act_bytes * d.T * d.h, LayerLabel(l, "mlp.fc1_input_gather"), false);
  a->fc1_weight_copy =
      ctx.k.CastWeight(d.gamma * d.ffn / d.t, d.h, LayerLabel(l, "mlp.fc1.weight"), !nograd);
  a->fc1_out = em.Alloc(d.act_bytes * d.T * d.gamma * d.ffn / d.t, Category::kActivations,
                        LayerLabel(l, "mlp.fc1_out"));
  em.Free(g);
  em.Flops(2.0 * d.T * d.h * d.gamma * d.ffn / d.t);
  if (nograd && hold_norm_out) {
    em.Free(a->ln2.mean);
    em.Free(a->ln2.rstd);
  } else if (nograd) {
    FreeNorm(ctx, a->ln2);
  }
  // Activation (GeLU / SwiGLU): a new output, the input kept.
  em.Begin("mlp.act", l);
  a->act_out = em.Alloc(d.act_bytes * d.T * d.ffn / d.t, Category::kActivations,
                        LayerLabel(l, "mlp.act_out"));
  if (nograd) em.Free(a->fc1_out);
  em.Begin("mlp.fc2", l);
  a->fc2_weight_copy = ctx.k.CastWeight(d.h, d.ffn / d.t, LayerLabel(l, "mlp.fc2.weight"), !nograd);
  const TensorId fc2 =
      ctx.k.RowParallelOutput(d.act_bytes * d.T * d.h, LayerLabel(l, "mlp.fc2_out"));
  em.Flops(2.0 * d.T * d.ffn / d.t * d.h);
  // MindSpeed's CheckpointWithoutOutput.discard_output after linear_fc2 (resize_(0) of the
  // activation output's storage, which fc2 saved as its input).
  if (nograd || a->act_recompute) em.Free(a->act_out);
  return fc2;
}

}  // namespace

void MlpModule::AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                             int layer, std::vector<ParamTensor>* out) const {
  auto add = [&](const char* name, std::int64_t numel, bool one_dim, bool sp_replicated,
                 std::int64_t row_numel) {
    out->push_back(
        MakeParam(LayerLabel(layer, name), numel, row_numel, chunk, layer, one_dim, sp_replicated));
  };
  const bool bias = model.add_bias_linear;
  add("ln2.weight", d.h, true, true, 1);
  if (d.layernorm) add("ln2.bias", d.h, true, true, 1);
  add("mlp.fc1.weight", d.gamma * d.ffn / d.t * d.h, false, false, d.h);
  if (bias) add("mlp.fc1.bias", d.gamma * d.ffn / d.t, true, false, 1);
  add("mlp.fc2.weight", d.h * (d.ffn / d.t), false, false, d.ffn / d.t);
  if (bias) add("mlp.fc2.bias", d.h, true, true, 1);
}

TensorId MlpModule::Forward(ModuleContext& ctx, int l, TensorId x, const ForwardMode& mode,
                            std::unique_ptr<ModuleSaved>* saved) {
  MlpSaved a;
  // Selective recompute of "mlp": the branch runs under tensor_parallel.checkpoint (no_grad),
  // keeping only its input, which the residual keeps anyway.
  // Megatron's local spec (the norm its own module, not TE's fused LayerNormLinear): without
  // grad `pre_mlp_layernorm_output` stays referenced until TransformerLayer._forward_mlp
  // returns, after the bias-dropout-add (transformer_layer.py at d98e8a64dd).
  const bool hold_norm_out = mode.nograd && !ctx.f.te && !ctx.f.hf;
  a.act_recompute = !mode.nograd && !ctx.selective.mlp && ctx.selective.ActFnRecompute(ctx.d.IndexInChunk(l));
  const TensorId fc2 =
      BranchForward(ctx, l, mode.nograd || ctx.selective.mlp, hold_norm_out, &a);
  if (!mode.nograd && !ctx.selective.mlp && ctx.selective.layernorm) {
    DiscardNormOutput(ctx, &a.ln2);
  }
  const TensorId out = BiasDropoutAdd(ctx, l, kNames, x, fc2, mode, &a.bda_mask);
  if (hold_norm_out) ctx.em.Free(a.ln2.out);
  if (!mode.nograd && !ctx.selective.mlp) ReleaseCastNormOutput(ctx, &a.ln2);
  if (!mode.nograd) *saved = std::make_unique<MlpSaved>(a);
  return out;
}

TensorId MlpModule::Backward(ModuleContext& ctx, int l, ModuleSaved& saved, TensorId x, bool free_x,
                             TensorId dy, bool free_dy) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  MlpSaved a = static_cast<const MlpSaved&>(saved);
  const Bytes full = d.act_bytes * d.T * d.h;
  const bool bias = ctx.model.add_bias_linear;
  const TensorId dfc2 = BiasDropoutAddBackward(ctx, l, kNames, dy, a.bda_mask);
  // CheckpointFunction.backward (tensor_parallel/random.py): the branch re-run with grad; its
  // output stays referenced until the region's backward (the norm's included) returns.
  TensorId recomputed_out = 0;
  if (ctx.selective.mlp) {
    ctx.em.SetPrefix("recompute.");
    recomputed_out = BranchForward(ctx, l, false, false, &a);
    ctx.em.SetPrefix("");
  } else if (ctx.selective.layernorm) {
    RecomputeNormOutput(ctx, l, "ln2", &a.ln2);
  }
  // MindSpeed's recompute hook on fc2's output (CheckpointWithoutOutput.recompute): the
  // activation re-run with grad from the saved fc1 output (`outputs`, kept in ctx.outputs until
  // the checkpoint's backward), then copied into the restored storage of fc2's saved input.
  TensorId act_rerun = 0;
  if (a.act_recompute) {
    em.Begin("mlp.act_recompute", l);
    const Bytes act = d.act_bytes * d.T * d.ffn / d.t;
    act_rerun = em.Alloc(act, Category::kActivations, LayerLabel(l, "recompute.mlp.act_out"));
    a.act_out = em.Alloc(act, Category::kActivations, LayerLabel(l, "mlp.act_out"));
  }
  // fc2: gather dY (SP), dgrad, wgrad.
  em.Begin("mlp.fc2_bwd", l);
  ctx.k.GemmWorkspace(false);
  TensorId g = ctx.k.SpGather(full, LayerLabel(l, "mlp.d_fc2_gather"), false);
  const TensorId dact = em.Alloc(d.act_bytes * d.T * d.ffn / d.t, Category::kTemporaries,
                                 LayerLabel(l, "mlp.d_act_out"));
  if (bias) {
    ctx.k.SmallWeightGrad(d.h, LayerLabel(l, "mlp.fc2.bias_grad"), LayerLabel(l, "mlp.fc2.bias"));
  }
  ctx.k.WeightGradToAutograd(d.h, d.ffn / d.t, ctx.f.te, LayerLabel(l, "mlp.fc2.wgrad"),
                             LayerLabel(l, "mlp.fc2.weight"));
  em.Free(g);
  em.Free(a.act_out);
  if (dfc2 != dy) em.Free(dfc2);
  ctx.k.ReleaseWeightCopy(a.fc2_weight_copy);
  em.Flops(4.0 * d.T * d.ffn / d.t * d.h);
  em.Begin("mlp.act_bwd", l);
  const TensorId dfc1 = em.Alloc(d.act_bytes * d.T * d.gamma * d.ffn / d.t, Category::kTemporaries,
                                 LayerLabel(l, "mlp.d_fc1_out"));
  if (act_rerun != 0) em.Free(act_rerun);  // CheckpointFunctionWithoutOutput: ctx.outputs = None
  em.Free(a.fc1_out);
  em.Free(dact);
  // fc1 (re-gather the norm output with SP), then the norm and the residual sum.
  em.Begin("mlp.ln_fc1_bwd", l);
  g = ctx.k.SpGather(full, LayerLabel(l, "mlp.fc1_input_gather"), false);
  const TensorId dln2out = ctx.k.ColumnParallelInputGrad(LayerLabel(l, "mlp.d_ln2_out"));
  if (bias) {
    ctx.k.SmallWeightGrad(d.gamma * d.ffn / d.t, LayerLabel(l, "mlp.fc1.bias_grad"),
                          LayerLabel(l, "mlp.fc1.bias"));
  }
  ctx.k.WeightGradToAutograd(d.gamma * d.ffn / d.t, d.h, ctx.f.te, LayerLabel(l, "mlp.fc1.wgrad"),
                             LayerLabel(l, "mlp.fc1.weight"));
  em.Free(g);
  em.Free(dfc1);
  em.Free(a.ln2.out);
  ctx.k.ReleaseWeightCopy(a.fc1_weight_copy);
  em.Flops(4.0 * d.T * d.h * d.gamma * d.ffn / d.t);
  const TensorId dnorm = NormOutputGrad(ctx, l, "ln2", dln2out, &a.ln2);
  return NormAndResidualBackward(ctx, l, kNames, a.ln2, dnorm, x, free_x, dy, free_dy,
                                 recomputed_out);
}

}  // namespace memsim::workload
