#include "workload/modules/residual.h"

#include <fmt/format.h>

#include "core/check.h"

namespace memsim::workload {

NormSaved NormForward(ModuleContext& ctx, int layer, const char* norm) {
  const ModelDims& d = ctx.d;
  const std::int64_t tokens = d.T / d.sigma;
  NormSaved n;
  if (d.layernorm) {
    n.mean = ctx.em.Alloc(4 * tokens, Category::kActivations,
                          LayerLabel(layer, fmt::format("{}.mean", norm)));
  }
  n.rstd = ctx.em.Alloc(4 * tokens, Category::kActivations,
                        LayerLabel(layer, fmt::format("{}.rstd", norm)));
  n.out = ctx.em.Alloc(d.wide_bytes * d.T * d.h / d.sigma, Category::kActivations,
                       LayerLabel(layer, fmt::format("{}.out", norm)));
  return n;
}

void FreeNorm(ModuleContext& ctx, const NormSaved& n) {
  for (TensorId id : {n.mean, n.rstd, n.out}) ctx.em.Free(id);
  for (TensorId id : n.casts) ctx.em.Free(id);
}

void CastNormOutput(ModuleContext& ctx, int layer, const char* norm, int consumers, bool saved,
                    NormSaved* n) {
  const ModelDims& d = ctx.d;
  if (!d.cast_inputs) return;
  MEMSIM_CHECK(consumers >= 1 && consumers <= static_cast<int>(n->casts.size()));
  for (int i = 0; i < consumers; ++i) {
    const TensorId copy = ctx.em.Alloc(d.act_bytes * d.T * d.h / d.sigma, Category::kActivations,
                                       LayerLabel(layer, fmt::format("{}.out_cast{}", norm, i)));
    if (saved) {
      n->casts[static_cast<std::size_t>(i)] = copy;
    } else {
      ctx.em.Free(copy);
    }
  }
}

void ReleaseCastNormOutput(ModuleContext& ctx, NormSaved* n) {
  if (!ctx.d.cast_inputs) return;
  ctx.em.Free(n->out);
  n->out = 0;
}

TensorId NormOutputGrad(ModuleContext& ctx, int layer, const char* norm, TensorId dcopy,
                        NormSaved* n) {
  const ModelDims& d = ctx.d;
  if (!d.cast_inputs) return dcopy;
  const TensorId g = ctx.em.Alloc(d.wide_bytes * d.T * d.h / d.sigma, Category::kTemporaries,
                                  LayerLabel(layer, fmt::format("d_{}_out_wide", norm)));
  ctx.em.Free(dcopy);
  for (TensorId& id : n->casts) {
    ctx.em.Free(id);
    id = 0;
  }
  return g;
}

void DiscardNormOutput(ModuleContext& ctx, NormSaved* norm) {
  ctx.em.Free(norm->out);
  norm->out = 0;
}

void RecomputeNormOutput(ModuleContext& ctx, int layer, const char* norm, NormSaved* saved) {
  const ModelDims& d = ctx.d;
  ctx.em.SetPrefix("recompute.");
  ctx.em.Begin(norm, layer);
  saved->out = ctx.em.Alloc(d.wide_bytes * d.T * d.h / d.sigma, Category::kActivations,
                            LayerLabel(layer, fmt::format("{}.out", norm)));
  ctx.em.SetPrefix("");
}

TensorId BiasDropoutAdd(ModuleContext& ctx, int layer, const ResidualNames& names, TensorId x,
                        TensorId branch_out, const ForwardMode& mode, TensorId* mask) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin(fmt::format("{}.bda", names.prefix), layer);
  *mask = 0;
  if (d.hidden_dropout) {
    *mask = em.Alloc(d.T * d.h / d.sigma, Category::kActivations,
                     LayerLabel(layer, fmt::format("{}.bda_mask", names.prefix)));
  }
  // The residual sum: wide_bytes when an act_bytes branch meets a wide residual (model.h).
  const TensorId out = em.Alloc(d.wide_bytes * d.T * d.h / d.sigma, Category::kActivations,
                                LayerLabel(layer, names.output));
  em.Free(branch_out);
  if (mode.nograd) {
    em.Free(*mask);
    *mask = 0;
  }
  if (mode.free_input) em.Free(x);
  return out;
}

TensorId BiasDropoutAddBackward(ModuleContext& ctx, int layer, const ResidualNames& names,
                                TensorId dy, TensorId mask) {
  const ModelDims& d = ctx.d;
  ctx.em.Begin(fmt::format("{}.bda_bwd", names.prefix), layer);
  if (mask == 0) return dy;
  const TensorId g =
      ctx.em.Alloc(d.act_bytes * d.T * d.h / d.sigma, Category::kTemporaries,
                   LayerLabel(layer, fmt::format("{}.d_{}_out", names.prefix, names.branch_out)));
  ctx.em.Free(mask);
  return g;
}

TensorId NormAndResidualBackward(ModuleContext& ctx, int layer, const ResidualNames& names,
                                 const NormSaved& norm, TensorId d_norm_out, TensorId x,
                                 bool free_x, TensorId dy, bool free_dy, TensorId region_out) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes shard = d.wide_bytes * d.T * d.h / d.sigma;  // grads of the wide norm input
  em.Begin(fmt::format("{}.{}_bwd", names.prefix, names.norm), layer);
  const TensorId d_norm_in =
      em.Alloc(shard, Category::kTemporaries,
               LayerLabel(layer, fmt::format("{}.d_{}_in", names.prefix, names.norm)));
  ctx.k.NormWeightGrads(layer, names.norm);
  for (TensorId id : {d_norm_out, norm.mean, norm.rstd}) em.Free(id);
  if (free_x) em.Free(x);
  em.Free(region_out);
  // Autograd sums the branch's and the residual path's grads into a new tensor.
  em.Begin(names.residual_op, layer);
  const TensorId dx =
      em.Alloc(shard, Category::kTemporaries, LayerLabel(layer, names.residual_label));
  em.Free(d_norm_in);
  if (free_dy) em.Free(dy);
  return dx;
}

}  // namespace memsim::workload
