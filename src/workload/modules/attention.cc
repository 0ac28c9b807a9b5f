#include "workload/modules/attention.h"

#include <fmt/format.h>

#include "workload/modules/residual.h"

namespace memsim::workload {
namespace {

constexpr ResidualNames kNames = {"attn",          "ln1",          "proj",
                                  "attn.residual", "residual_bwd", "d_input"};

// Saved tensors of core attention. Flash: output and softmax statistics (lse1; on Ascend
// npu_fusion_attention's softmax_max and softmax_sum, lse1 and lse2). Unfused: probabilities,
// dropout mask and output, GQA's repeated K and V, and the output; under PyTorch before 1.11
// also softmax's input (FrameworkFacts::softmax_saves_input).
struct CoreAttn {
  TensorId out = 0, lse1 = 0, lse2 = 0, probs = 0, dmask = 0, dout = 0, k_rep = 0, v_rep = 0;
  TensorId softmax_in = 0;
  // The attention kernel's own [b, s, a/t, d] output, saved besides the projection's [s, b]
  // copy: flash-attn 2 under TE (te_flash_attn2), cuDNN FusedAttention under Megatron-core
  // 0.5-0.13's bshd switch (te_fused_attn_bshd_out).
  TensorId fa_out = 0;
};

struct AttentionSaved final : ModuleSaved {
  NormSaved ln1;
  TensorId qkv = 0;
  TensorId q_norm_out = 0, k_norm_out = 0, q_norm_stats = 0, k_norm_stats = 0;  // qk_layernorm
  CoreAttn core;
  TensorId bda_mask = 0;
  TensorId qkv_weight_copy = 0, proj_weight_copy = 0;  // autocast copies (kernels.h CastWeight)
};

void FreeIds(Emitter& em, std::initializer_list<TensorId> ids) {
  for (TensorId id : ids) em.Free(id);
}

// Flash / fused attention forward (FlashAttention-2 flash_attn_func saves out and
// softmax_lse [b, a/t, s] fp32; torch_npu npu_fusion_attention saves softmax_max and
// softmax_sum [b, a/t, s, 8] fp32 each). keep: the statistics stay saved for backward.
CoreAttn FlashForward(ModuleContext& ctx, int l, bool keep) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t heads = d.a / d.t;
  CoreAttn c;
  em.Begin("attn.core", l);
  if (ctx.f.te_flash_attn2 || ctx.f.te_fused_attn_bshd_out) {
    // FrameworkFacts::te_flash_attn2 / te_fused_attn_bshd_out: the kernel's Function saves the output
    // it wrote; the output projection saves a [s, b, ...] copy of it (core_out below).
    c.fa_out = em.Alloc(d.act_bytes * d.T * d.q / d.t, Category::kActivations,
                        LayerLabel(l, ctx.f.te_flash_attn2 ? "attn.flash_out" : "attn.fused_out"));
  }
  c.out = em.Alloc(d.act_bytes * d.T * d.q / d.t, Category::kActivations,
                   LayerLabel(l, "attn.core_out"));
  if (ctx.f.npu) {
    c.lse1 = em.Alloc(32 * d.T * heads, Category::kActivations, LayerLabel(l, "attn.softmax_max"));
    c.lse2 = em.Alloc(32 * d.T * heads, Category::kActivations, LayerLabel(l, "attn.softmax_sum"));
  } else {
    c.lse1 = em.Alloc(4 * d.T * heads, Category::kActivations, LayerLabel(l, "attn.softmax_lse"));
  }
  if (!keep) {
    FreeIds(em, {c.lse1, c.lse2, c.fa_out});
    c.lse1 = c.lse2 = c.fa_out = 0;
  }
  em.Flops(2.0 * d.b * d.s * d.s * d.q / d.t);  // 4·b·s²·q/t, halved by the causal mask
  return c;
}

// Transformers eager attention (modeling_bert.py BertSelfAttention.forward; llama's
// eager_attention_forward): matmul(q, k^T), then the scale and the additive mask, each a new
// [b, a, s, s] tensor while the previous one is alive. The mask is always there: with no
// attention_mask in the batch, BertModel.forward makes one of ones and
// get_extended_attention_mask (modeling_utils.py) turns it into the additive [b, 1, 1, s] mask,
// in the model's dtype, so under autocast over fp32 weights the masked scores promote to fp32
// (wide_bytes, model.h; act_bytes otherwise). Before PyTorch 1.11 softmax saves the masked
// scores for its backward (FrameworkFacts::softmax_saves_input). Returns the masked scores;
// s2 = b·(a/t)·s² elements.
TensorId HfMaskedScores(ModuleContext& ctx, int l, Bytes s2) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const TensorId scores =
      em.Alloc(d.act_bytes * s2, Category::kTemporaries, LayerLabel(l, "attn.scores"));
  const TensorId scaled =
      em.Alloc(d.act_bytes * s2, Category::kTemporaries, LayerLabel(l, "attn.scores_scaled"));
  em.Free(scores);  // `attention_scores = attention_scores / ...` rebinds the name
  em.Begin("attn.scores_mask", l);
  const TensorId masked =
      em.Alloc(d.wide_bytes * s2,
               ctx.f.softmax_saves_input ? Category::kActivations : Category::kTemporaries,
               LayerLabel(l, "attn.scores_masked"));
  em.Free(scaled);  // and `attention_scores = attention_scores + attention_mask` again
  return masked;
}

// Megatron-core DotProductAttention forward: baddbmm scores over the "mpu" buffer, fused
// scale-mask-softmax (saves its output), attention dropout, bmm with V, permute().contiguous().
CoreAttn UnfusedForward(ModuleContext& ctx, int l, bool keep) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes qbytes = d.act_bytes * d.T * d.q / d.t;
  const Bytes s2 = d.b * (d.a / d.t) * d.s * d.s;
  CoreAttn c;
  if (d.g < d.a) {
    // GQA: repeat_interleave materializes K and V to a heads (saved by the matmuls).
    em.Begin("attn.repeat_kv", l);
    c.k_rep = em.Alloc(qbytes, Category::kActivations, LayerLabel(l, "attn.key_repeated"));
    c.v_rep = em.Alloc(qbytes, Category::kActivations, LayerLabel(l, "attn.value_repeated"));
  }
  em.Begin("attn.scores", l);
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  TensorId scores;
  if (ctx.f.hf) {
    scores = HfMaskedScores(ctx, l, s2);
  } else {
    ctx.k.MpuBuffer(d.act_bytes * s2);
    scores = em.Alloc(d.act_bytes * s2, Category::kTemporaries, LayerLabel(l, "attn.scores"));
  }
  em.Flops(2.0 * d.b * d.s * d.s * d.q / d.t);
  em.Begin("attn.softmax", l);
  // softmax is an autocast fp32 op (aten/src/ATen/autocast_mode.cpp): wide_bytes; it saves its
  // output.
  c.probs = em.Alloc(d.wide_bytes * s2, Category::kActivations, LayerLabel(l, "attn.probs"));
  // The scores stay referenced until the forward returns (freed below, after the context):
  // Megatron-core DotProductAttention.forward keeps the baddbmm output in the locals
  // `matmul_result` and `attention_scores`, BertSelfAttention.forward the masked scores in
  // `attention_scores`, until `return` (Megatron-LM dot_product_attention.py at d98e8a64dd;
  // NVIDIA/Megatron-LM#965 measures allocated memory unchanged from the dropout to the end).
  if (ctx.f.hf && ctx.f.softmax_saves_input && keep) c.softmax_in = scores;
  if (d.attention_dropout) {
    em.Begin("attn.dropout", l);
    c.dmask = em.Alloc(s2, Category::kActivations, LayerLabel(l, "attn.dropout_mask"));
    c.dout = em.Alloc(d.wide_bytes * s2, Category::kActivations, LayerLabel(l, "attn.dropout_out"));
    if (!keep) {
      FreeIds(em, {c.probs, c.dmask});
      c.probs = c.dmask = 0;
    }
  }
  TensorId wide_probs = 0;  // the fp32 dropout output the cast below read
  TensorId wide_probs_cast = 0;
  if (d.cast_inputs) {
    // matmul(probs, v) under autocast casts the fp32 probabilities afresh and saves that copy
    // (for v's grad) in place of the dropout output, which native_dropout's backward does not
    // read (it reads the mask). The fp32 tensor itself stays referenced by the local
    // `attention_probs` until BertSelfAttention.forward returns (freed below).
    em.Begin("attn.probs_cast", l);
    const TensorId copy =
        em.Alloc(d.act_bytes * s2, Category::kActivations, LayerLabel(l, "attn.probs_cast"));
    wide_probs = c.dout;  // 0 without dropout: then they are c.probs, softmax's output
    c.dout = keep ? copy : 0;
    if (!keep) wide_probs_cast = copy;  // unnamed: freed when the matmul returns
  }
  em.Begin("attn.context", l);
  const TensorId context = em.Alloc(qbytes, Category::kTemporaries, LayerLabel(l, "attn.context"));
  c.out = em.Alloc(qbytes, Category::kActivations, LayerLabel(l, "attn.core_out"));
  FreeIds(em, {context, wide_probs_cast});
  // The function's locals go out of scope at its `return`.
  if (c.softmax_in == 0) em.Free(scores);
  em.Free(wide_probs);
  em.Flops(2.0 * d.b * d.s * d.s * d.q / d.t);
  if (!keep) {
    FreeIds(em, {c.probs, c.dout, c.k_rep, c.v_rep});
    c.probs = c.dout = c.k_rep = c.v_rep = 0;
  }
  return c;
}

CoreAttn CoreForward(ModuleContext& ctx, int l, bool keep) {
  const ModelDims& d = ctx.d;
  if (d.cp > 1) {
    // Context parallelism: the core attention exchanges K and V chunks with the other ranks of
    // the context-parallel process group (Transformer Engine attention.py
    // AttnFuncWithCPAndKVP2P, cp_group = parallel_state.get_context_parallel_group(), Megatron's
    // "cp"), which gives that group its communicator. Only the communicator is modelled here;
    // the ring's receive buffers and per-step saved tensors are not (docs/validation.md).
    ctx.em.Begin("attn.cp_exchange", l);
    ctx.em.Collective(CommGroup::kCp, d.cp, static_cast<double>(2 * d.T * (d.kv / d.t) * d.act_bytes),
                      Coll::kP2P);
  }
  return ctx.f.flash ? FlashForward(ctx, l, keep) : UnfusedForward(ctx, l, keep);
}

struct QkvGrads {
  TensorId dq = 0, dk = 0, dv = 0;
};

// FlashAttention-2 backward: fp32 dq accumulator and softmax_d [b, a/t, s] (CUDA only).
QkvGrads FlashBackward(ModuleContext& ctx, int l, const CoreAttn& c, TensorId d_core,
                       TensorId extra_free) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  QkvGrads g;
  em.Begin("attn.core_bwd", l);
  TensorId acc = 0, softmax_d = 0;
  if (!ctx.f.npu) {
    acc = em.Alloc(4 * d.T * d.q / d.t, Category::kTemporaries, LayerLabel(l, "attn.dq_accum"));
    softmax_d =
        em.Alloc(4 * d.T * (d.a / d.t), Category::kTemporaries, LayerLabel(l, "attn.softmax_d"));
  }
  g.dq = em.Alloc(d.act_bytes * d.T * d.q / d.t, Category::kTemporaries,
                  LayerLabel(l, "attn.d_query"));
  g.dk =
      em.Alloc(d.act_bytes * d.T * d.kv / d.t, Category::kTemporaries, LayerLabel(l, "attn.d_key"));
  g.dv = em.Alloc(d.act_bytes * d.T * d.kv / d.t, Category::kTemporaries,
                  LayerLabel(l, "attn.d_value"));
  TensorId dk_expanded = 0, dv_expanded = 0;
  if (ctx.f.te_flash_attn2 && d.g < d.a) {
    // flash-attn 2 with fewer KV heads (csrc/flash_attn/flash_api.cpp mha_bwd / mha_varlen_bwd):
    // dk_expanded and dv_expanded [b, s, a/t, d] in the input dtype, summed over each KV group
    // into dk and dv before the call returns.
    dk_expanded = em.Alloc(d.act_bytes * d.T * d.q / d.t, Category::kTemporaries,
                           LayerLabel(l, "attn.d_key_expanded"));
    dv_expanded = em.Alloc(d.act_bytes * d.T * d.q / d.t, Category::kTemporaries,
                           LayerLabel(l, "attn.d_value_expanded"));
  }
  FreeIds(em, {acc, softmax_d, dk_expanded, dv_expanded, d_core, c.out, c.fa_out, c.lse1, c.lse2,
               extra_free});
  em.Flops(5.0 * d.b * d.s * d.s * d.q / d.t);
  return g;
}

// A dtype cast of a [b, a, s, s] grad (ToCopyBackward, or the type-promoting add's backward):
// a new tensor of `bytes`; frees `grad`.
TensorId CastScoresGrad(ModuleContext& ctx, int l, TensorId grad, Bytes bytes, const char* label) {
  ctx.em.Begin(fmt::format("{}_cast", label), l);
  const TensorId g = ctx.em.Alloc(bytes, Category::kTemporaries, LayerLabel(l, label));
  ctx.em.Free(grad);
  return g;
}

QkvGrads UnfusedBackward(ModuleContext& ctx, int l, CoreAttn c, TensorId d_core,
                         TensorId extra_free) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes qbytes = d.act_bytes * d.T * d.q / d.t;
  const Bytes kvbytes = d.act_bytes * d.T * d.kv / d.t;
  const Bytes s2 = d.act_bytes * d.b * (d.a / d.t) * d.s * d.s;
  const Bytes wide_s2 = s2 / d.act_bytes * d.wide_bytes;  // the probabilities' grads (model.h)
  em.Begin("attn.context_bwd", l);
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  TensorId dp = em.Alloc(s2, Category::kTemporaries, LayerLabel(l, "attn.d_probs"));
  const TensorId dvr =
      em.Alloc(qbytes, Category::kTemporaries, LayerLabel(l, "attn.d_value_repeated"));
  FreeIds(em, {d_core, c.dout, c.v_rep});
  em.Flops(4.0 * d.b * d.s * d.s * d.q / d.t);
  if (d.cast_inputs) dp = CastScoresGrad(ctx, l, dp, wide_s2, "attn.d_probs_wide");
  if (d.attention_dropout) {
    em.Begin("attn.dropout_bwd", l);
    const TensorId g = em.Alloc(wide_s2, Category::kTemporaries, LayerLabel(l, "attn.d_softmax"));
    FreeIds(em, {dp, c.dmask});
    dp = g;
  }
  if (d.cast_inputs) {
    // Eager softmax backward (_softmax_backward_data) makes a new fp32 grad and frees the saved
    // probabilities; the masked add's backward casts it to the fp16 scaled scores' dtype.
    em.Begin("attn.softmax_bwd", l);
    const TensorId ds =
        em.Alloc(wide_s2, Category::kTemporaries, LayerLabel(l, "attn.d_scores_masked"));
    FreeIds(em, {dp, c.probs, c.softmax_in});
    c.probs = c.softmax_in = 0;
    dp = CastScoresGrad(ctx, l, ds, s2, "attn.d_scores_scaled");
  }
  em.Begin("attn.scores_bwd", l);  // softmax backward in place, then baddbmm backward
  QkvGrads g;
  g.dq = em.Alloc(qbytes, Category::kTemporaries, LayerLabel(l, "attn.d_query"));
  const TensorId dkr =
      em.Alloc(qbytes, Category::kTemporaries, LayerLabel(l, "attn.d_key_repeated"));
  FreeIds(em, {dp, c.probs, c.softmax_in, c.k_rep});
  em.Flops(4.0 * d.b * d.s * d.s * d.q / d.t);
  if (d.g < d.a) {
    em.Begin("attn.repeat_kv_bwd", l);
    g.dk = em.Alloc(kvbytes, Category::kTemporaries, LayerLabel(l, "attn.d_key"));
    g.dv = em.Alloc(kvbytes, Category::kTemporaries, LayerLabel(l, "attn.d_value"));
    FreeIds(em, {dkr, dvr});
  } else {
    g.dk = dkr;
    g.dv = dvr;
  }
  FreeIds(em, {c.out, extra_free});
  return g;
}

// Core attention backward; returns the concatenated QKV grad (SplitBackward of mixed_qkv).
// extra_free: the saved output a selective recompute replaced.
TensorId CoreBackward(ModuleContext& ctx, int l, const CoreAttn& c, TensorId d_core,
                      TensorId extra_free) {
  const ModelDims& d = ctx.d;
  const QkvGrads g = ctx.f.flash ? FlashBackward(ctx, l, c, d_core, extra_free)
                             : UnfusedBackward(ctx, l, c, d_core, extra_free);
  ctx.em.Begin("attn.qkv_grad", l);
  const TensorId dqkv = ctx.em.Alloc(d.act_bytes * d.T * (d.q + 2 * d.kv) / d.t,
                                     Category::kTemporaries, LayerLabel(l, "attn.d_qkv"));
  FreeIds(ctx.em, {g.dq, g.dk, g.dv});
  return dqkv;
}

// q_layernorm / k_layernorm (attention.py get_query_key_value_tensors): new normalized q and
// k, saved by attention, with their per-head statistics; v stays a view of qkv.
void QkNormForward(ModuleContext& ctx, int l, bool nograd, AttentionSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("attn.qk_norm", l);
  const Bytes stat = d.layernorm ? 8 : 4;
  a->q_norm_out = em.Alloc(d.act_bytes * d.T * d.q / d.t, Category::kActivations,
                           LayerLabel(l, "attn.q_norm_out"));
  a->q_norm_stats =
      em.Alloc(stat * d.T * d.a / d.t, Category::kActivations, LayerLabel(l, "attn.q_norm_stats"));
  a->k_norm_out = em.Alloc(d.act_bytes * d.T * d.kv / d.t, Category::kActivations,
                           LayerLabel(l, "attn.k_norm_out"));
  a->k_norm_stats =
      em.Alloc(stat * d.T * d.g / d.t, Category::kActivations, LayerLabel(l, "attn.k_norm_stats"));
  if (nograd) {
    FreeIds(em, {a->q_norm_stats, a->k_norm_stats});
    a->q_norm_stats = a->k_norm_stats = 0;
  }
}

}  // namespace

void AttentionModule::AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                                   int layer, std::vector<ParamTensor>* out) const {
  const bool qkv_bias = model.add_bias_linear || model.add_qkv_bias;
  auto add = [&](const char* name, std::int64_t numel, bool one_dim, bool sp_replicated,
                 std::int64_t row_numel) {
    out->push_back(
        MakeParam(LayerLabel(layer, name), numel, row_numel, chunk, layer, one_dim, sp_replicated));
  };
  // TE LayerNormColumnParallelLinear registers the norm weights before the GEMM weight.
  add("ln1.weight", d.h, true, true, 1);
  if (d.layernorm) add("ln1.bias", d.h, true, true, 1);
  add("attn.qkv.weight", (d.q + 2 * d.kv) / d.t * d.h, false, false, d.h);
  if (qkv_bias) add("attn.qkv.bias", (d.q + 2 * d.kv) / d.t, true, false, 1);
  if (model.qk_layernorm) {
    add("attn.q_norm.weight", d.dh, true, true, 1);
    if (d.layernorm) add("attn.q_norm.bias", d.dh, true, true, 1);
    add("attn.k_norm.weight", d.dh, true, true, 1);
    if (d.layernorm) add("attn.k_norm.bias", d.dh, true, true, 1);
  }
  add("attn.proj.weight", d.h * (d.q / d.t), false, false, d.q / d.t);
  if (model.add_bias_linear) add("attn.proj.bias", d.h, true, true, 1);
}

TensorId AttentionModule::Forward(ModuleContext& ctx, int l, TensorId x, const ForwardMode& mode,
                                  std::unique_ptr<ModuleSaved>* saved) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  AttentionSaved a;
  // Input norm + QKV (TELayerNormColumnParallelLinear).
  em.Begin("attn.ln_qkv", l);
  ctx.k.GemmWorkspace(false);
  a.ln1 = NormForward(ctx, l, "ln1");
  // BertSelfAttention: query, key and value are three nn.Linear reading the same input.
  CastNormOutput(ctx, l, "ln1", 3, !mode.nograd, &a.ln1);
  const TensorId g =
      ctx.k.SpGather(d.act_bytes * d.T * d.h, LayerLabel(l, "attn.qkv_input_gather"), false);
  a.qkv_weight_copy =
      ctx.k.CastWeight((d.q + 2 * d.kv) / d.t, d.h, LayerLabel(l, "attn.qkv.weight"), !mode.nograd);
  a.qkv = em.Alloc(d.act_bytes * d.T * (d.q + 2 * d.kv) / d.t, Category::kActivations,
                   LayerLabel(l, "attn.qkv"));
  em.Free(g);
  em.Flops(2.0 * d.T * d.h * (d.q + 2 * d.kv) / d.t);
  // Without grad TE's fused LayerNormLinear drops its norm output inside the call; Megatron's
  // local spec keeps `input_layernorm_output` until TransformerLayer._forward_attention returns,
  // after the bias-dropout-add (transformer_layer.py at d98e8a64dd). The statistics go at once.
  const bool hold_norm_out = mode.nograd && !ctx.f.te && !ctx.f.hf;
  if (hold_norm_out) {
    FreeIds(em, {a.ln1.mean, a.ln1.rstd});
  } else if (mode.nograd) {
    FreeNorm(ctx, a.ln1);
  }
  if (ctx.model.qk_layernorm) QkNormForward(ctx, l, mode.nograd, &a);
  a.core = CoreForward(ctx, l, !(mode.nograd || ctx.selective.core_attn));
  if (mode.nograd) FreeIds(em, {a.qkv, a.q_norm_out, a.k_norm_out});
  // Output projection (TERowParallelLinear).
  em.Begin("attn.proj", l);
  a.proj_weight_copy =
      ctx.k.CastWeight(d.h, d.q / d.t, LayerLabel(l, "attn.proj.weight"), !mode.nograd);
  const TensorId proj =
      ctx.k.RowParallelOutput(d.act_bytes * d.T * d.h, LayerLabel(l, "attn.proj_out"));
  em.Flops(2.0 * d.T * d.q / d.t * d.h);
  if (mode.nograd) em.Free(a.core.out);
  if (!mode.nograd && ctx.selective.layernorm) DiscardNormOutput(ctx, &a.ln1);
  const TensorId out = BiasDropoutAdd(ctx, l, kNames, x, proj, mode, &a.bda_mask);
  if (hold_norm_out) em.Free(a.ln1.out);
  if (!mode.nograd) ReleaseCastNormOutput(ctx, &a.ln1);
  if (!mode.nograd) *saved = std::make_unique<AttentionSaved>(a);
  return out;
}

TensorId AttentionModule::Backward(ModuleContext& ctx, int l, ModuleSaved& saved, TensorId x,
                                   bool free_x, TensorId dy, bool free_dy) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  AttentionSaved a = static_cast<const AttentionSaved&>(saved);
  const Bytes full = d.act_bytes * d.T * d.h;
  const TensorId dproj = BiasDropoutAddBackward(ctx, l, kNames, dy, a.bda_mask);
  if (ctx.selective.layernorm) RecomputeNormOutput(ctx, l, "ln1", &a.ln1);
  em.Begin("attn.proj_bwd", l);
  TensorId g = ctx.k.SpGather(full, LayerLabel(l, "attn.d_proj_gather"), false);
  const TensorId dcore = em.Alloc(d.act_bytes * d.T * d.q / d.t, Category::kTemporaries,
                                  LayerLabel(l, "attn.d_core_out"));
  if (ctx.model.add_bias_linear) {
    ctx.k.SmallWeightGrad(d.h, LayerLabel(l, "attn.proj.bias_grad"),
                          LayerLabel(l, "attn.proj.bias"));
  }
  ctx.k.WeightGradToAutograd(d.h, d.q / d.t, ctx.f.te, LayerLabel(l, "attn.proj.wgrad"),
                             LayerLabel(l, "attn.proj.weight"));
  em.Free(g);
  if (dproj != dy) em.Free(dproj);
  ctx.k.ReleaseWeightCopy(a.proj_weight_copy);
  em.Flops(4.0 * d.T * d.q / d.t * d.h);
  // Core attention; with selective recompute its forward is re-run first
  // (transformer_layer.py / attention.py _checkpointed_attention_forward).
  TensorId dqkv;
  if (ctx.selective.core_attn) {
    em.SetPrefix("recompute.");
    const CoreAttn rec = CoreForward(ctx, l, true);
    em.SetPrefix("");
    dqkv = CoreBackward(ctx, l, rec, dcore, a.core.out);
  } else {
    dqkv = CoreBackward(ctx, l, a.core, dcore, 0);
  }
  FreeIds(em, {a.qkv, a.q_norm_out, a.k_norm_out, a.q_norm_stats, a.k_norm_stats});
  // QKV (re-gather the norm output with SP), then the input norm and the residual sum.
  em.Begin("attn.ln_qkv_bwd", l);
  g = ctx.k.SpGather(full, LayerLabel(l, "attn.qkv_input_gather"), false);
  const TensorId dln1out = ctx.k.ColumnParallelInputGrad(LayerLabel(l, "attn.d_ln1_out"));
  if (ctx.model.add_bias_linear || ctx.model.add_qkv_bias) {
    ctx.k.SmallWeightGrad((d.q + 2 * d.kv) / d.t, LayerLabel(l, "attn.qkv.bias_grad"),
                          LayerLabel(l, "attn.qkv.bias"));
  }
  ctx.k.WeightGradToAutograd((d.q + 2 * d.kv) / d.t, d.h, ctx.f.te, LayerLabel(l, "attn.qkv.wgrad"),
                             LayerLabel(l, "attn.qkv.weight"));
  FreeIds(em, {g, dqkv, a.ln1.out});
  ctx.k.ReleaseWeightCopy(a.qkv_weight_copy);
  em.Flops(4.0 * d.T * d.h * (d.q + 2 * d.kv) / d.t);
  const TensorId dnorm = NormOutputGrad(ctx, l, "ln1", dln1out, &a.ln1);
  return NormAndResidualBackward(ctx, l, kNames, a.ln1, dnorm, x, free_x, dy, free_dy);
}

}  // namespace memsim::workload
