#include "workload/modules/mla.h"

#include <fmt/format.h>

#include "workload/modules/residual.h"

namespace memsim::workload {
namespace {

constexpr ResidualNames kNames = {"attn",          "ln1",          "proj",
                                  "attn.residual", "residual_bwd", "d_input"};

// The widths of one rank's MLA tensors, in elements per token (mla.h: t = 1, so per-rank
// heads are all heads).
struct MlaWidths {
  std::int64_t ql = 0;        // q_lora_rank (0: linear_q_proj)
  std::int64_t kl = 0;        // kv_lora_rank
  std::int64_t kv_down = 0;   // kl + dr: linear_kv_down_proj's output
  std::int64_t qk = 0;        // n·(dn + dr): query and key
  std::int64_t kv_up = 0;     // n·(dn + dv): linear_kv_up_proj's output
  std::int64_t v = 0;         // n·dv: value and the core attention output
  std::int64_t dr = 0;        // qk_pos_emb_head_dim
};

MlaWidths Widths(const config::ModelConfig& m, const ModelDims& d) {
  MlaWidths w;
  w.ql = m.q_lora_rank;
  w.kl = m.kv_lora_rank;
  w.dr = m.qk_pos_emb_head_dim;
  w.kv_down = w.kl + w.dr;
  w.qk = d.a * (m.qk_head_dim + m.qk_pos_emb_head_dim);
  w.kv_up = d.a * (m.qk_head_dim + m.v_head_dim);
  w.v = d.a * m.v_head_dim;
  return w;
}

// A latent's fused norm in front of its up projection (TELayerNormColumnParallelLinear with
// qk_layernorm): the statistics (LayerNorm's mean too) and the normalized output.
struct LatentNorm {
  TensorId stats = 0, out = 0;
};

struct MlaSaved final : ModuleSaved {
  NormSaved ln1;
  TensorId q_compressed = 0, kv_combined = 0;
  LatentNorm q_norm, kv_norm;
  TensorId query = 0, key = 0, value = 0;
  TensorId q_copy = 0, k_copy = 0, v_copy = 0;  // the bshd switch's copies (b > 1)
  TensorId core_out = 0, fa_out = 0, lse = 0;
  TensorId bda_mask = 0;
};

void FreeIds(Emitter& em, std::initializer_list<TensorId> ids) {
  for (TensorId id : ids) em.Free(id);
}

Bytes Act(const ModelDims& d, std::int64_t width) { return d.act_bytes * d.T * width; }

LatentNorm LatentNormForward(ModuleContext& ctx, int l, const char* name, std::int64_t width) {
  LatentNorm n;
  if (!ctx.model.qk_layernorm) return n;
  const Bytes stat = ctx.d.layernorm ? 8 : 4;
  n.stats = ctx.em.Alloc(stat * ctx.d.T, Category::kActivations,
                         LayerLabel(l, fmt::format("attn.{}.norm_stats", name)));
  n.out = ctx.em.Alloc(Act(ctx.d, width), Category::kActivations,
                       LayerLabel(l, fmt::format("attn.{}.norm_out", name)));
  return n;
}

// The down projections and the query's up projection (or linear_q_proj).
void ProjectQuery(ModuleContext& ctx, int l, const MlaWidths& w, bool nograd, MlaSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  if (w.ql > 0) {
    em.Begin("attn.q_down", l);
    ctx.k.GemmWorkspace(false);
    a->q_compressed = em.Alloc(Act(d, w.ql), Category::kActivations, LayerLabel(l, "attn.q_compressed"));
    em.Flops(2.0 * d.T * d.h * w.ql);
  }
  em.Begin("attn.kv_down", l);
  ctx.k.GemmWorkspace(false);
  a->kv_combined =
      em.Alloc(Act(d, w.kv_down), Category::kActivations, LayerLabel(l, "attn.kv_combined"));
  em.Flops(2.0 * d.T * d.h * w.kv_down);
  if (w.ql > 0) {
    em.Begin("attn.q_up", l);
    a->q_norm = LatentNormForward(ctx, l, "q_up", w.ql);
    a->query = em.Alloc(Act(d, w.qk), Category::kActivations, LayerLabel(l, "attn.query"));
    em.Flops(2.0 * d.T * w.ql * w.qk);
    if (nograd) FreeIds(em, {a->q_compressed, a->q_norm.stats, a->q_norm.out});
  } else {
    em.Begin("attn.q_proj", l);
    a->query = em.Alloc(Act(d, w.qk), Category::kActivations, LayerLabel(l, "attn.query"));
    em.Flops(2.0 * d.T * d.h * w.qk);
  }
}

// linear_kv_up_proj and the fused RoPE (ApplyMLARotaryEmbKV: key and value from kv; the query
// rotated in place).
void ProjectKeyValue(ModuleContext& ctx, int l, const MlaWidths& w, bool nograd, MlaSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("attn.kv_up", l);
  a->kv_norm = LatentNormForward(ctx, l, "kv_up", w.kl);
  const TensorId kv = em.Alloc(Act(d, w.kv_up), Category::kTemporaries, LayerLabel(l, "attn.kv"));
  em.Flops(2.0 * d.T * w.kl * w.kv_up);
  if (nograd) FreeIds(em, {a->kv_norm.stats, a->kv_norm.out});
  em.Begin("attn.rope", l);
  a->key = em.Alloc(Act(d, w.qk), Category::kActivations, LayerLabel(l, "attn.key"));
  a->value = em.Alloc(Act(d, w.v), Category::kActivations, LayerLabel(l, "attn.value"));
  em.Free(kv);  // a local of qkv_up_proj_and_rope_apply; nothing saved it
  if (nograd) {
    em.Free(a->kv_combined);
    a->kv_combined = 0;
  }
}

// TEDotProductAttention (cuDNN FusedAttention). keep: the statistics stay saved for backward.
void CoreForward(ModuleContext& ctx, int l, const MlaWidths& w, bool keep, MlaSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("attn.core", l);
  if (ctx.f.te_fused_attn_bshd_out && d.b > 1) {
    // transformer_engine.py TEDotProductAttention.forward (core 0.5-0.13): `x.transpose(0, 1)
    // .contiguous()` of query, key and value; TE saves these copies.
    a->q_copy = em.Alloc(Act(d, w.qk), Category::kActivations, LayerLabel(l, "attn.query_bshd"));
    a->k_copy = em.Alloc(Act(d, w.qk), Category::kActivations, LayerLabel(l, "attn.key_bshd"));
    a->v_copy = em.Alloc(Act(d, w.v), Category::kActivations, LayerLabel(l, "attn.value_bshd"));
  }
  if (ctx.f.te_flash_attn2 || ctx.f.te_fused_attn_bshd_out) {
    // As AttentionModule: the kernel's Function saves the output it wrote besides the
    // projection's [s, b, ...] copy.
    a->fa_out = em.Alloc(Act(d, w.v), Category::kActivations, LayerLabel(l, "attn.fused_out"));
  }
  a->core_out = em.Alloc(Act(d, w.v), Category::kActivations, LayerLabel(l, "attn.core_out"));
  a->lse = em.Alloc(4 * d.T * d.a, Category::kActivations, LayerLabel(l, "attn.softmax_lse"));
  if (!keep) {
    FreeIds(em, {a->lse, a->fa_out, a->q_copy, a->k_copy, a->v_copy});
    a->lse = a->fa_out = a->q_copy = a->k_copy = a->v_copy = 0;
  }
  // QK^T over n·(dn + dr) and PV over n·dv, halved by the causal mask.
  em.Flops(1.0 * d.b * d.s * d.s * (w.qk + w.v));
}

}  // namespace

void MlaAttentionModule::AppendParams(const config::ModelConfig& model, const ModelDims& d,
                                      int chunk, int layer, std::vector<ParamTensor>* out) const {
  const MlaWidths w = Widths(model, d);
  auto add = [&](const char* name, std::int64_t numel, bool one_dim, std::int64_t row_numel) {
    out->push_back(MakeParam(LayerLabel(layer, name), numel, row_numel, chunk, layer, one_dim,
                             one_dim));
  };
  auto norm = [&](const char* name, std::int64_t width) {
    if (!model.qk_layernorm) return;
    add(fmt::format("{}_norm.weight", name).c_str(), width, true, 1);
    if (d.layernorm) add(fmt::format("{}_norm.bias", name).c_str(), width, true, 1);
  };
  // TransformerLayer: input_layernorm; MultiLatentAttention.__init__: linear_proj;
  // MLASelfAttention.__init__: the q projections, linear_kv_down_proj, linear_kv_up_proj (TE
  // registers a fused norm's weights before the GEMM weight).
  add("ln1.weight", d.h, true, 1);
  if (d.layernorm) add("ln1.bias", d.h, true, 1);
  add("attn.proj.weight", d.h * w.v, false, w.v);
  if (w.ql > 0) {
    add("attn.q_down.weight", w.ql * d.h, false, d.h);
    norm("attn.q_up", w.ql);
    add("attn.q_up.weight", w.qk * w.ql, false, w.ql);
  } else {
    add("attn.q_proj.weight", w.qk * d.h, false, d.h);
  }
  add("attn.kv_down.weight", w.kv_down * d.h, false, d.h);
  norm("attn.kv_up", w.kl);
  add("attn.kv_up.weight", w.kv_up * w.kl, false, w.kl);
}

TensorId MlaAttentionModule::Forward(ModuleContext& ctx, int l, TensorId x, const ForwardMode& mode,
                                     std::unique_ptr<ModuleSaved>* saved) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MlaWidths w = Widths(ctx.model, d);
  MlaSaved a;
  em.Begin("attn.ln1", l);
  a.ln1 = NormForward(ctx, l, "ln1");
  ProjectQuery(ctx, l, w, mode.nograd, &a);
  if (mode.nograd) FreeNorm(ctx, a.ln1);  // both down projections have run
  ProjectKeyValue(ctx, l, w, mode.nograd, &a);
  CoreForward(ctx, l, w, !(mode.nograd || ctx.selective.core_attn), &a);
  const bool copies = a.q_copy != 0;
  if (mode.nograd) FreeIds(em, {a.query, a.key, a.value});
  em.Begin("attn.proj", l);
  const TensorId proj = ctx.k.RowParallelOutput(d.act_bytes * d.T * d.h, LayerLabel(l, "attn.proj_out"));
  em.Flops(2.0 * d.T * w.v * d.h);
  if (mode.nograd) em.Free(a.core_out);
  if (copies && !mode.nograd) {
    // MultiLatentAttention.forward returns: its query, key, value locals go.
    FreeIds(em, {a.query, a.key, a.value});
    a.query = a.key = a.value = 0;
  }
  if (!mode.nograd && ctx.selective.layernorm) DiscardNormOutput(ctx, &a.ln1);
  const TensorId out = BiasDropoutAdd(ctx, l, kNames, x, proj, mode, &a.bda_mask);
  if (!mode.nograd) *saved = std::make_unique<MlaSaved>(a);
  return out;
}

namespace {

// Core attention's backward: dq, dk, dv; frees what the kernel and linear_proj saved.
struct QkvGrads {
  TensorId dq = 0, dk = 0, dv = 0;
};
QkvGrads CoreBackward(ModuleContext& ctx, int l, const MlaWidths& w, const MlaSaved& c,
                      TensorId d_core, TensorId extra_free) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("attn.core_bwd", l);
  QkvGrads g;
  g.dq = em.Alloc(Act(d, w.qk), Category::kTemporaries, LayerLabel(l, "attn.d_query"));
  g.dk = em.Alloc(Act(d, w.qk), Category::kTemporaries, LayerLabel(l, "attn.d_key"));
  g.dv = em.Alloc(Act(d, w.v), Category::kTemporaries, LayerLabel(l, "attn.d_value"));
  FreeIds(em, {d_core, c.core_out, c.fa_out, c.lse, c.query, c.key, c.value, c.q_copy, c.k_copy,
               c.v_copy, extra_free});
  em.Flops(2.5 * d.b * d.s * d.s * (w.qk + w.v));
  return g;
}

// A latent's up projection backward (TELayerNormColumnParallelLinear, or TEColumnParallelLinear
// without qk_layernorm): the GEMM's dgrad, the weight grad, the norm's input grad and weight
// grad. Frees the output grad and what the forward saved; returns the latent's grad.
TensorId UpProjBackward(ModuleContext& ctx, int l, const char* name, std::int64_t in,
                        std::int64_t out, TensorId d_out, const LatentNorm& norm,
                        TensorId saved_input) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin(fmt::format("attn.{}_bwd", name), l);
  TensorId g = em.Alloc(Act(d, in), Category::kTemporaries,
                        LayerLabel(l, fmt::format("attn.d_{}_in", name)));
  ctx.k.WeightGradToAutograd(out, in, ctx.f.te, LayerLabel(l, fmt::format("attn.{}.wgrad", name)),
                             LayerLabel(l, fmt::format("attn.{}.weight", name)));
  em.Flops(4.0 * d.T * in * out);
  if (norm.out != 0) {
    const TensorId dn = em.Alloc(Act(d, in), Category::kTemporaries,
                                 LayerLabel(l, fmt::format("attn.d_{}_norm_in", name)));
    ctx.k.SmallWeightGrad(in, LayerLabel(l, fmt::format("attn.{}_norm.weight_grad", name)),
                          LayerLabel(l, fmt::format("attn.{}_norm.weight", name)));
    if (d.layernorm) {
      ctx.k.SmallWeightGrad(in, LayerLabel(l, fmt::format("attn.{}_norm.bias_grad", name)),
                            LayerLabel(l, fmt::format("attn.{}_norm.bias", name)));
    }
    em.Free(g);
    g = dn;
  }
  FreeIds(em, {d_out, norm.out, norm.stats, saved_input});
  return g;
}

// A down projection's backward (TEColumnParallelLinear h -> out): the dgrad [T, h] and the
// weight grad; frees the output grad.
TensorId DownProjBackward(ModuleContext& ctx, int l, const char* name, std::int64_t out,
                          TensorId d_out) {
  const ModelDims& d = ctx.d;
  ctx.em.Begin(fmt::format("attn.{}_bwd", name), l);
  const TensorId g = ctx.em.Alloc(Act(d, d.h), Category::kTemporaries,
                                  LayerLabel(l, fmt::format("attn.d_ln1_out_{}", name)));
  ctx.k.WeightGradToAutograd(out, d.h, ctx.f.te, LayerLabel(l, fmt::format("attn.{}.wgrad", name)),
                             LayerLabel(l, fmt::format("attn.{}.weight", name)));
  ctx.em.Flops(4.0 * d.T * d.h * out);
  ctx.em.Free(d_out);
  return g;
}

// From the grads of query, key and value to the grad of the input norm's output.
TensorId ProjectionsBackward(ModuleContext& ctx, int l, const MlaWidths& w, MlaSaved& a,
                             const QkvGrads& g) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  // ApplyMLARotaryEmbKV.backward: d_kv [T, n, dn+dv] and d_emb [T, 1, dr]; the query's rotary
  // backward works in place on dq.
  em.Begin("attn.rope_bwd", l);
  const TensorId d_kv = em.Alloc(Act(d, w.kv_up), Category::kTemporaries, LayerLabel(l, "attn.d_kv"));
  const TensorId d_emb = em.Alloc(Act(d, w.dr), Category::kTemporaries, LayerLabel(l, "attn.d_k_pos_emb"));
  FreeIds(em, {g.dk, g.dv});
  const TensorId d_kv_c = UpProjBackward(ctx, l, "kv_up", w.kl, w.kv_up, d_kv, a.kv_norm, a.kv_combined);
  TensorId d_q_c = 0, d_ln_q = 0;
  if (w.ql > 0) {
    d_q_c = UpProjBackward(ctx, l, "q_up", w.ql, w.qk, g.dq, a.q_norm, a.q_compressed);
  } else {
    d_ln_q = DownProjBackward(ctx, l, "q_proj", w.qk, g.dq);
  }
  // torch.split's backward: the two grads into one [T, kl + dr].
  em.Begin("attn.kv_split_bwd", l);
  const TensorId d_kv_comb =
      em.Alloc(Act(d, w.kv_down), Category::kTemporaries, LayerLabel(l, "attn.d_kv_combined"));
  FreeIds(em, {d_kv_c, d_emb});
  const TensorId d_ln = DownProjBackward(ctx, l, "kv_down", w.kv_down, d_kv_comb);
  if (w.ql > 0) d_ln_q = DownProjBackward(ctx, l, "q_down", w.ql, d_q_c);
  // Autograd's InputBuffer adds the second grad of the norm output into the first in place.
  em.Free(d_ln_q);
  em.Free(a.ln1.out);  // its savers' backward has run
  a.ln1.out = 0;
  return d_ln;
}

}  // namespace

TensorId MlaAttentionModule::Backward(ModuleContext& ctx, int l, ModuleSaved& saved, TensorId x,
                                      bool free_x, TensorId dy, bool free_dy) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MlaWidths w = Widths(ctx.model, d);
  MlaSaved a = static_cast<const MlaSaved&>(saved);
  const TensorId dproj = BiasDropoutAddBackward(ctx, l, kNames, dy, a.bda_mask);
  if (ctx.selective.layernorm) RecomputeNormOutput(ctx, l, "ln1", &a.ln1);
  em.Begin("attn.proj_bwd", l);
  const TensorId dcore = em.Alloc(Act(d, w.v), Category::kTemporaries, LayerLabel(l, "attn.d_core_out"));
  ctx.k.WeightGradToAutograd(d.h, w.v, ctx.f.te, LayerLabel(l, "attn.proj.wgrad"),
                             LayerLabel(l, "attn.proj.weight"));
  if (dproj != dy) em.Free(dproj);
  em.Flops(4.0 * d.T * w.v * d.h);
  QkvGrads g;
  if (ctx.selective.core_attn) {
    // The checkpoint re-runs core attention (its inputs, query, key and value, were saved).
    MlaSaved rec = a;
    em.SetPrefix("recompute.");
    CoreForward(ctx, l, w, true, &rec);
    em.SetPrefix("");
    g = CoreBackward(ctx, l, w, rec, dcore, a.core_out);
  } else {
    g = CoreBackward(ctx, l, w, a, dcore, 0);
  }
  const TensorId dln = ProjectionsBackward(ctx, l, w, a, g);
  const TensorId dnorm = NormOutputGrad(ctx, l, "ln1", dln, &a.ln1);
  return NormAndResidualBackward(ctx, l, kNames, a.ln1, dnorm, x, free_x, dy, free_dy);
}

}  // namespace memsim::workload
