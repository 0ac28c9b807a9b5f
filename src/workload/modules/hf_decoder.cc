// Transformers' decoder layer (hf_decoder.h). Each tensor cites the line of Transformers or the
// PyTorch autograd formula (tools/autograd/derivatives.yaml) that makes or keeps it.
#include "workload/modules/hf_decoder.h"

#include <fmt/format.h>

#include <array>
#include <string>

#include "config/stack.h"
#include "core/check.h"

namespace memsim::workload {
namespace {

using Name = std::string;

// The autocast dtype of linears and sdpa (C), the residual stream's (X, the weights' dtype), and
// the dtype of the rotary products q·cos (R): PyTorch's promotion of C and X, fp32 when two
// different 16-bit dtypes meet.
struct Dtypes {
  Bytes c, x, r;
  bool cast;  // X is not C: linears cast their inputs (ModelDims::cast_inputs)
};
Dtypes DtypesOf(const ModelDims& d) {
  const bool cast = d.cast_inputs;
  const Bytes r = !cast ? d.act_bytes : d.wide_bytes == d.act_bytes ? 4 : d.wide_bytes;
  return {d.act_bytes, d.wide_bytes, r, cast};
}

void FreeAll(Emitter& em, std::initializer_list<TensorId> ids) {
  for (TensorId id : ids) em.Free(id);
}

// ---------------------------------------------------------------------------------------------
// LlamaRMSNorm.forward over `rows` rows of `width` elements in `in_bytes`:
//   h32 = x.to(float32)        a new fp32 copy unless x is fp32; PowBackward0 saves it
//   variance = h32.pow(2).mean(-1)   the fp32 square is freed once mean has read it
//   r = rsqrt(variance + eps)  RsqrtBackward0 saves its result, fp32 [rows]
//   n = h32 * r                fp32; MulBackward0 saves h32 and r
//   c = n.to(input_dtype)      a new tensor unless fp32 (then c is n); n freed
//   y = weight * c             MulBackward0 saves c (the weight is a leaf); y in the promoted
//                              dtype of weight and c
struct RmsSaved {
  TensorId h32 = 0, rstd = 0, c = 0;
};

TensorId RmsNormForward(ModuleContext& ctx, int l, const Name& name, std::int64_t rows,
                        std::int64_t width, Bytes in_bytes, Bytes out_bytes, bool nograd,
                        RmsSaved* s) {
  Emitter& em = ctx.em;
  const std::int64_t n = rows * width;
  em.Begin(name + ".variance", l);
  s->h32 = in_bytes != 4 ? em.Alloc(4 * n, Category::kActivations, LayerLabel(l, name + ".input_fp32"))
                         : 0;
  const TensorId sq = em.Alloc(4 * n, Category::kTemporaries, LayerLabel(l, name + ".squared"));
  const TensorId var = em.Alloc(4 * rows, Category::kTemporaries, LayerLabel(l, name + ".variance"));
  em.Free(sq);
  em.Begin(name + ".rsqrt", l);
  const TensorId veps = em.Alloc(4 * rows, Category::kTemporaries, LayerLabel(l, name + ".var_eps"));
  s->rstd = em.Alloc(4 * rows, Category::kActivations, LayerLabel(l, name + ".rstd"));
  em.Free(veps);
  em.Begin(name + ".normalize", l);
  s->c = em.Alloc(4 * n, Category::kActivations, LayerLabel(l, name + ".normed_fp32"));
  if (nograd) em.Free(s->h32);
  if (in_bytes != 4) {
    em.Begin(name + ".to", l);
    const TensorId n32 = s->c;
    s->c = em.Alloc(in_bytes * n, Category::kActivations, LayerLabel(l, name + ".normed"));
    em.Free(n32);
  }
  em.Begin(name + ".weight", l);
  const TensorId y = em.Alloc(out_bytes * n, Category::kActivations, LayerLabel(l, name + ".out"));
  em.Free(var);
  if (nograd) {
    FreeAll(em, {s->rstd, s->c});
    *s = RmsSaved{};
  } else if (!ctx.k.Trainable(LayerLabel(l, name + ".weight"))) {
    // weight · c: MulBackward0 reads c only for the weight's grad (mul_tensor_backward(grad,
    // other, ...) under should_compute_output of the weight), so a frozen weight keeps no c.
    em.Free(s->c);
    s->c = 0;
  }
  return y;
}

// Its backward, given dy (the grad of y, out_bytes; freed); returns the grad of x (in_bytes).
// The autograd engine runs the norm's nodes latest first, each freeing what it no longer needs
// (tools/autograd/derivatives.yaml; FunctionsManual.cpp):
//   weight * c    MulBackward0: grad_c = dy·weight and the weight grad, the sum of dy·c (a
//                 temporary of y's size); grad_c cast to c's dtype when it differs (the
//                 engine's validate_outputs)
//   n.to()        ToCopyBackward: grad_n in fp32 (when c is not n)
//   h32 * r       MulBackward0: grad_n·r (fp32 [n], the first grad of h32) and r's grad, the
//                 row sums of grad_n·h32 (an fp32 [n] temporary)
//   rsqrt, mean   an fp32 [rows] grad; MeanBackward expands and divides it: fp32 [n]
//   pow(2)        pow_backward: grad · (2 · h32.pow(1)): two fp32 [n] temporaries and the
//                 product, added in place into h32's first grad (input_buffer.cpp)
//   x.to(fp32)    ToCopyBackward back to in_bytes (when x is not fp32)
TensorId RmsNormBackward(ModuleContext& ctx, int l, const Name& name, std::int64_t rows,
                         std::int64_t width, Bytes in_bytes, Bytes out_bytes, const RmsSaved& s,
                         TensorId dy, bool free_dy = true) {
  Emitter& em = ctx.em;
  const std::int64_t n = rows * width;
  auto tmp = [&](Bytes bytes, const char* label) {
    return em.Alloc(bytes, Category::kTemporaries, LayerLabel(l, name + label));
  };
  em.Begin(name + "_bwd.weight", l);
  const bool weight_grad = ctx.k.Trainable(LayerLabel(l, name + ".weight"));
  const TensorId prod = weight_grad ? tmp(out_bytes * n, ".d_weight_product") : 0;
  ctx.k.SmallWeightGrad(width, LayerLabel(l, name + ".weight_grad"), LayerLabel(l, name + ".weight"));
  TensorId g = tmp(out_bytes * n, ".d_normed");
  FreeAll(em, {prod, s.c, free_dy ? dy : 0});
  auto step = [&](const char* op, Bytes bytes, const char* label) {
    em.Begin(name + op, l);
    const TensorId next = tmp(bytes * n, label);
    em.Free(g);
    g = next;
  };
  if (out_bytes != in_bytes) step("_bwd.cast", in_bytes, ".d_normed_cast");
  if (in_bytes != 4) step("_bwd.to", 4, ".d_normed_fp32");
  em.Begin(name + "_bwd.normalize", l);
  const TensorId gin = tmp(4 * n, ".d_input_fp32");
  const TensorId rprod = tmp(4 * n, ".d_rstd_product");
  const TensorId dr = tmp(4 * rows, ".d_rstd");
  FreeAll(em, {rprod, g});
  em.Begin(name + "_bwd.rsqrt", l);
  const TensorId dvar = tmp(4 * rows, ".d_variance");
  FreeAll(em, {dr, s.rstd});
  em.Begin(name + "_bwd.mean", l);
  const TensorId dsq = tmp(4 * n, ".d_squared");
  em.Free(dvar);
  em.Begin(name + "_bwd.pow", l);
  FreeAll(em, {tmp(4 * n, ".pow_1"), tmp(4 * n, ".pow_times_2"), tmp(4 * n, ".d_pow"), dsq});
  g = gin;
  if (in_bytes != 4) {
    step("_bwd.from_fp32", in_bytes, ".d_input");
    em.Free(s.h32);
  }
  return g;
}

// ---------------------------------------------------------------------------------------------
// One nn.Linear of the layer (F.linear: mm over [T, in] saves its input and the weight). Under
// cast_inputs the wide input is cast afresh to C and the copy is saved (aten/src/ATen/
// autocast_mode.h cached_cast caches leaf weights only); the weight's autocast copy is
// Kernels::CastWeight's. Returns the output [T, out] in C.
struct LinearSaved {
  TensorId input = 0;   // the input copy it saved (0: the caller's tensor, or nothing)
  TensorId weight = 0;  // the weight copy it saved
  bool cast_input = false;  // it cast a wide input (its input grad is cast back)
  bool wide_out = false;    // a quantised linear fed a wide input: its output is wide too
};

// The element size of a linear's output: the wide dtype when it returns its input's
// (Kernels::ReturnsInputDtype), else C.
Bytes OutBytes(const ModelDims& d, const LinearSaved& s) { return s.wide_out ? d.wide_bytes : d.act_bytes; }

Name Param(int l, const Name& module, const char* what = "weight") {
  return LayerLabel(l, fmt::format("{}.{}", module, what));
}

TensorId LinearForward(ModuleContext& ctx, int l, const Name& module, std::int64_t in,
                       std::int64_t out, bool cast_input, bool nograd, LinearSaved* s) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin(module, l);
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  s->cast_input = cast_input;
  if (cast_input) {
    s->input = em.Alloc(d.act_bytes * d.T * in, Category::kActivations, LayerLabel(l, module + ".input_cast"));
  }
  s->weight = ctx.k.CastWeight(out, in, Param(l, module), !nograd);
  TensorId y = em.Alloc(d.act_bytes * d.T * out, Category::kActivations, LayerLabel(l, module + ".out"));
  em.Flops(2.0 * d.T * in * out);
  if (cast_input && ctx.k.ReturnsInputDtype(Param(l, module))) {
    // bitsandbytes Linear4bit.forward `out = out.to(inp_dtype)`: the C product is rebound to its
    // wide copy; the C input copy (the local x) goes when forward returns, just after.
    em.Begin(module + ".to_input_dtype", l);
    const TensorId wide = em.Alloc(d.wide_bytes * d.T * out, Category::kActivations, LayerLabel(l, module + ".out_wide"));
    em.Free(y);
    y = wide;
    s->wide_out = true;
  }
  if (nograd || !ctx.k.KeepsLinearInput(Param(l, module))) {
    em.Free(s->input);
    s->input = 0;
  }
  return y;
}

// Its backward (MmBackward0: the input grad dy·W, the weight grad handed to autograd, the bias
// grad); frees dy when free_dy and what forward saved; with cast_input the input grad goes back
// to the wide dtype (ToCopyBackward). Returns the input grad.
TensorId LinearBackward(ModuleContext& ctx, int l, const Name& module, std::int64_t in,
                        std::int64_t out, bool bias, const LinearSaved& s, TensorId dy,
                        bool free_dy) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  if (s.wide_out) {
    // ToCopyBackward of `out.to(inp_dtype)`: the wide grad cast back to C for MatMul4Bit.
    em.Begin(module + "_bwd.to_compute_dtype", l);
    const TensorId c = em.Alloc(d.act_bytes * d.T * out, Category::kTemporaries, LayerLabel(l, module + ".d_out"));
    if (free_dy) em.Free(dy);
    dy = c;
    free_dy = true;
  }
  em.Begin(module + "_bwd", l);
  ctx.k.GemmWorkspace(/*torch_gemm=*/true);
  TensorId g = em.Alloc(d.act_bytes * d.T * in, Category::kTemporaries, LayerLabel(l, module + ".d_input"));
  if (bias) ctx.k.SmallWeightGrad(out, LayerLabel(l, module + ".bias_grad"), Param(l, module, "bias"));
  ctx.k.WeightGradToAutograd(out, in, /*te_layer=*/false, LayerLabel(l, module + ".wgrad"), Param(l, module));
  if (free_dy) em.Free(dy);
  em.Free(s.input);
  ctx.k.ReleaseWeightCopy(s.weight);
  em.Flops(4.0 * d.T * in * out);
  if (s.cast_input) {
    em.Begin(module + "_bwd.cast", l);
    const TensorId wide = em.Alloc(d.wide_bytes * d.T * in, Category::kTemporaries, LayerLabel(l, module + ".d_input_wide"));
    em.Free(g);
    g = wide;
  }
  return g;
}

// Autograd's InputBuffer adds a second gradient of the same tensor into the first in place
// (torch/csrc/autograd/input_buffer.cpp accumulate) and drops it.
TensorId Accumulate(Emitter& em, TensorId into, TensorId g) {
  if (into == 0) return g;
  em.Free(g);
  return into;
}

// The residual sum `residual + hidden_states` (X + C promotes to X): a new tensor; frees the
// branch output, and the input with mode.free_input.
TensorId ResidualSum(ModuleContext& ctx, int l, const char* prefix, TensorId x, TensorId branch,
                     const ForwardMode& mode) {
  const ModelDims& d = ctx.d;
  ctx.em.Begin(fmt::format("{}.residual", prefix), l);
  const TensorId out = ctx.em.Alloc(d.wide_bytes * d.T * d.h, Category::kActivations,
                                    LayerLabel(l, fmt::format("{}.residual", prefix)));
  ctx.em.Free(branch);
  if (mode.free_input) ctx.em.Free(x);
  return out;
}

// AddBackward0 hands dy to the branch: cast to the branch output's dtype C when that differs
// (the engine's validate_outputs); else dy itself.
TensorId ResidualBranchGrad(ModuleContext& ctx, int l, const char* prefix, TensorId dy) {
  const ModelDims& d = ctx.d;
  ctx.em.Begin(fmt::format("{}.residual_bwd", prefix), l);
  if (!d.cast_inputs) return dy;
  return ctx.em.Alloc(d.act_bytes * d.T * d.h, Category::kTemporaries,
                      LayerLabel(l, fmt::format("{}.d_branch", prefix)));
}

// The norm's input grad and dy (the residual path) summed into the layer input's grad: a new
// tensor, as memsim's other modules (residual.h NormAndResidualBackward).
TensorId ResidualInputGrad(ModuleContext& ctx, int l, const char* op, TensorId d_norm_in,
                           TensorId x, bool free_x, TensorId dy, bool free_dy) {
  const ModelDims& d = ctx.d;
  ctx.em.Begin(op, l);
  const TensorId dx = ctx.em.Alloc(d.wide_bytes * d.T * d.h, Category::kTemporaries, LayerLabel(l, Name(op) + ".d_input"));
  ctx.em.Free(d_norm_in);
  if (free_dy) ctx.em.Free(dy);
  if (free_x) ctx.em.Free(x);
  return dx;
}

// LlamaDecoderLayer.forward: `hidden_states = self.input_layernorm(hidden_states)` keeps the norm
// output in the local until `hidden_states, _ = self.self_attn(...)` rebinds it (likewise
// post_attention_layernorm's until `hidden_states = self.mlp(hidden_states)`), in transformers
// 4.36 (0864dd3b) and 4.48 alike. When no linear saved it (frozen PEFT weights, each linear
// casting it, a no-grad forward), that rebinding is its last reference: an op of its own right
// after the module returns, before the residual sum. Returns 0 (released) or *y (saved).
TensorId DropNormOutput(ModuleContext& ctx, int l, const char* norm, TensorId y, bool saved) {
  if (saved) return y;
  ctx.em.Begin(fmt::format("{}_out.rebind", norm), l);
  ctx.em.Free(y);
  return 0;
}

}  // namespace

bool UsesHfDecoder(const config::Setup& setup) {
  const config::ModelConfig& m = setup.model;
  return config::StackOf(setup.training).Traits().transformers_modelling &&
         m.type_vocab_size == 0 &&
         m.num_experts <= 1 && m.gated_mlp && m.normalization == config::Normalization::kRMSNorm;
}

// ---------------------------------------------------------------------------------------------
// Attention.
namespace {

constexpr std::array<const char*, 4> kProj = {"self_attn.q_proj", "self_attn.k_proj",
                                              "self_attn.v_proj", "self_attn.o_proj"};

struct HfAttnSaved final : ModuleSaved {
  RmsSaved ln;
  TensorId ln_out = 0;  // the norm output, saved by q/k/v when they do not cast it
  bool ln_out_saved = false;  // else the layer's local drops it when self_attn returns
  std::array<LinearSaved, 4> proj{};
  RmsSaved q_norm, k_norm;
  RmsSaved post;  // Gemma2's post_attention_layernorm
  // Core attention: sdpa / flash save q, k, v, the output and the logsumexp; eager saves q and
  // k (repeated with GQA), v, fp32 probabilities, their copy (or dropout mask and output) and
  // the transposed output.
  TensorId q = 0, k = 0, v = 0, out = 0, lse = 0;
  TensorId probs32 = 0, probs = 0, dmask = 0, ctx_out = 0;
  bool v_wide = false;  // v_proj returned the wide dtype (LinearSaved::wide_out): cast for attention
};

// The DynamicCache's hold on key_states after RoPE and value_states (FrameworkFacts::hf_kv_cache):
// a second reference each, kept in ModuleContext::output_held until the loss releases the output
// object; the attention's own goes through DropKv.
void CacheKv(ModuleContext& ctx, const HfAttnSaved& a) {
  if (!ctx.f.hf_kv_cache || ctx.output_held == nullptr) return;
  for (TensorId id : {a.k, a.v}) {
    ctx.em.Ref(id);  // the attention's (its saved tensor or local)
    ctx.em.Ref(id);  // the cache's
    ctx.output_held->push_back(id);
  }
}

// Drops the attention's reference to k or v: freed now unless the cache still holds it.
void DropKv(Emitter& em, TensorId id) {
  if (em.Refs(id) > 0) {
    em.Unref(id);
  } else {
    em.Free(id);
  }
}

std::int64_t Widths(const ModelDims& d, int i, bool in) {
  const std::array<std::int64_t, 4> outs = {d.q, d.kv, d.kv, d.h};
  const std::array<std::int64_t, 4> ins = {d.h, d.h, d.h, d.q};
  return in ? ins[i] : outs[i];
}

// Qwen3Attention q_norm / k_norm: LlamaRMSNorm over head_dim of the projection's output (C),
// weight dtype W: y in promote(C, W).
TensorId QkNorm(ModuleContext& ctx, int l, const char* which, TensorId in, Bytes in_bytes,
                std::int64_t heads, bool nograd, RmsSaved* s) {
  const ModelDims& d = ctx.d;
  const Bytes out = std::max(in_bytes, d.param_bytes);
  const TensorId y = RmsNormForward(ctx, l, fmt::format("self_attn.{}_norm", which), d.T * heads, d.dh,
                                    in_bytes, out, nograd, s);
  ctx.em.Free(in);  // the projection's output has no other user
  return y;
}

// apply_rotary_pos_emb: q·cos + rotate_half(q)·sin. cos / sin do not require grad, so the muls
// save only them; rotate_half (a negated half and a cat) is freed after its mul. The result is
// in R; the input (C, or promote(C, W) after a q/k norm) is not saved: LlamaAttention.forward
// drops it when `query_states, key_states` are rebound to the results (the caller frees it).
TensorId RopeForward(ModuleContext& ctx, int l, const char* which, Bytes in_bytes,
                     std::int64_t width) {
  const ModelDims& d = ctx.d;
  const Dtypes t = DtypesOf(d);
  const Bytes r = std::max(t.r, in_bytes);
  Emitter& em = ctx.em;
  em.Begin(fmt::format("self_attn.rope_{}", which), l);
  const TensorId a = em.Alloc(r * d.T * width, Category::kTemporaries, LayerLabel(l, fmt::format("self_attn.{}_cos", which)));
  const TensorId neg = em.Alloc(in_bytes * d.T * width / 2, Category::kTemporaries, LayerLabel(l, fmt::format("self_attn.{}_neg_half", which)));
  const TensorId rot = em.Alloc(in_bytes * d.T * width, Category::kTemporaries, LayerLabel(l, fmt::format("self_attn.{}_rotated", which)));
  const TensorId b = em.Alloc(r * d.T * width, Category::kTemporaries, LayerLabel(l, fmt::format("self_attn.{}_sin", which)));
  const TensorId e = em.Alloc(r * d.T * width, Category::kActivations, LayerLabel(l, fmt::format("self_attn.{}_embed", which)));
  FreeAll(em, {a, neg, rot, b});
  return e;
}

// Its backward, node by node in the engine's order (latest made first): rot·sin's
// MulBackward0 (grad·sin in R, cast to the input dtype when it differs), rotate_half's cat
// (views of that grad), NegBackward (a half-width grad), the two SliceBackward nodes (each a
// zero-filled full-width grad: slice_backward), then q·cos's MulBackward0 (grad·cos, cast);
// the grads of the input are added in place into the first (input_buffer.cpp). Frees dy;
// returns the input grad.
TensorId RopeBackward(ModuleContext& ctx, int l, const char* which, TensorId dy, Bytes in_bytes,
                      std::int64_t width) {
  const ModelDims& d = ctx.d;
  const Bytes r = std::max(DtypesOf(d).r, in_bytes);
  Emitter& em = ctx.em;
  const std::int64_t n = d.T * width;
  const Name op = fmt::format("self_attn.rope_{}_bwd", which);
  auto tmp = [&](Bytes bytes, const char* label) {
    return em.Alloc(bytes, Category::kTemporaries, LayerLabel(l, fmt::format("self_attn.d_{}_{}", which, label)));
  };
  // grad·factor in R, then (when R is wider) its cast; returns the input-dtype grad.
  auto product = [&](const char* label, const char* cast_label) {
    const TensorId p = tmp(r * n, label);
    if (r == in_bytes) return p;
    const TensorId c = tmp(in_bytes * n, cast_label);
    em.Free(p);
    return c;
  };
  em.Begin(op + ".sin", l);
  const TensorId gsin = product("sin", "sin_cast");
  em.Begin(op + ".neg", l);
  const TensorId neg = tmp(in_bytes * n / 2, "neg_half");
  em.Begin(op + ".slice2", l);
  const TensorId first = tmp(in_bytes * n, "slice2");
  em.Free(neg);
  em.Begin(op + ".slice1", l);
  FreeAll(em, {tmp(in_bytes * n, "slice1"), gsin});
  em.Begin(op + ".cos", l);
  FreeAll(em, {product("cos", "cos_cast"), dy});
  return first;
}

}  // namespace

void HfAttentionModule::AppendParams(const config::ModelConfig& model, const ModelDims& d,
                                     int chunk, int layer, std::vector<ParamTensor>* out) const {
  MEMSIM_CHECK(d.t == 1);
  const bool qkv_bias = model.add_bias_linear || model.add_qkv_bias;
  auto add = [&](const Name& name, std::int64_t numel, std::int64_t row, bool one_dim) {
    out->push_back(MakeParam(LayerLabel(layer, name), numel, row, chunk, layer, one_dim, false));
  };
  // Registration order of LlamaDecoderLayer.__init__: self_attn (q, k, v, o; Qwen3's q_norm and
  // k_norm after o_proj), then mlp, then the norms. memsim lists input_layernorm (and Gemma2's
  // post_attention_layernorm) with the attention, the MLP's norms with the MLP.
  add("input_layernorm.weight", d.h, 1, true);
  if (model.fused_projections) {  // Phi3Attention.qkv_proj
    add("self_attn.qkv_proj.weight", d.h * (d.q + 2 * d.kv), d.h, false);
    if (qkv_bias) add("self_attn.qkv_proj.bias", d.q + 2 * d.kv, 1, true);
  }
  for (int i = model.fused_projections ? 3 : 0; i < 4; ++i) {
    add(Name(kProj[i]) + ".weight", Widths(d, i, true) * Widths(d, i, false), Widths(d, i, true), false);
    if (i < 3 ? qkv_bias : model.add_bias_linear) add(Name(kProj[i]) + ".bias", Widths(d, i, false), 1, true);
  }
  if (model.qk_layernorm) {
    add("self_attn.q_norm.weight", d.dh, 1, true);
    add("self_attn.k_norm.weight", d.dh, 1, true);
  }
  if (model.sandwich_norms) add("post_attention_layernorm.weight", d.h, 1, true);
}

namespace {

// sdpa (its flash or memory-efficient backend) and flash_attention_2 save q, k, v, the output
// and the logsumexp (aten/src/ATen/native/transformers/attention.cpp
// _scaled_dot_product_flash_attention / _efficient_attention: logsumexp [b, a, s] fp32, the
// efficient kernel's padded to a multiple of 32 rows). GQA without a padding mask runs with
// enable_gqa (integrations/sdpa_attention.py use_gqa_in_sdpa): k and v are not repeated.
// The output's storage is [b, s, a, dh], so `transpose(1, 2).contiguous()` copies nothing.
void SdpaForward(ModuleContext& ctx, int l, bool nograd, HfAttnSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("self_attn.sdpa", l);
  const std::int64_t rows = d.act_bytes == 4 ? (d.s + 31) / 32 * 32 : d.s;  // fp32: efficient
  a->out = em.Alloc(d.act_bytes * d.T * d.q, Category::kActivations, LayerLabel(l, "self_attn.attn_output"));
  a->lse = em.Alloc(4 * d.b * d.a * rows, Category::kActivations, LayerLabel(l, "self_attn.logsumexp"));
  em.Flops(2.0 * d.b * d.s * d.s * d.q);
  if (nograd) {
    FreeAll(em, {a->q, a->k, a->v, a->lse});
    a->q = a->k = a->v = a->lse = 0;
  }
}

// Backward. Flash (16-bit; aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp
// mha_bwd): dq, dk, dv (empty_like q, k, v), softmax_d fp32 [b, a, s rounded up to 128] and the
// fp32 dq accumulator [b, s rounded up to 128, a, dh rounded up to 32]; with GQA dk and dv are
// first computed for every query head (dk_expanded, dv_expanded) and summed. The fp32
// memory-efficient kernel accumulates in its outputs and keeps only its delta [b, a, s] (an
// estimate: its workspace, which PyTorch sizes for 16-bit outputs only, is not modelled).
// Frees dout and the saved tensors; returns dq, dk, dv in C.
std::array<TensorId, 3> SdpaBackward(ModuleContext& ctx, int l, HfAttnSaved& a, TensorId dout) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const bool flash = d.act_bytes != 4;
  const std::int64_t rows = flash ? RoundUp(d.s, 128) : d.s;
  auto tmp = [&](Bytes bytes, const char* label) {
    return em.Alloc(bytes, Category::kTemporaries, LayerLabel(l, label));
  };
  em.Begin("self_attn.sdpa_bwd", l);
  std::array<TensorId, 3> g{};
  g[0] = tmp(d.act_bytes * d.T * d.q, "self_attn.d_query");
  g[1] = tmp(d.act_bytes * d.T * d.kv, "self_attn.d_key");
  g[2] = tmp(d.act_bytes * d.T * d.kv, "self_attn.d_value");
  const TensorId delta = tmp(4 * d.b * d.a * rows, "self_attn.softmax_d");
  const TensorId acc = flash ? tmp(4 * d.b * rows * d.a * RoundUp(d.dh, 32), "self_attn.dq_accum") : 0;
  TensorId dk_exp = 0, dv_exp = 0;
  if (flash && d.g < d.a) {
    dk_exp = tmp(d.act_bytes * d.T * d.q, "self_attn.dk_expanded");
    dv_exp = tmp(d.act_bytes * d.T * d.q, "self_attn.dv_expanded");
  }
  FreeAll(em, {acc, delta, dk_exp, dv_exp, dout, a.q, a.out, a.lse});
  DropKv(em, a.k);
  DropKv(em, a.v);
  em.Flops(5.0 * d.b * d.s * d.s * d.q);
  return g;
}

// eager_attention_forward: repeat_kv (a copy with GQA), matmul(q, k^T) and its scaling, the
// causal mask added (its dtype is inputs_embeds': the sum promotes to X), softmax in fp32
// (SoftmaxBackward0 saves it) and `.to(query.dtype)`, dropout, matmul with v (saves the
// probabilities and v), `transpose(1, 2).contiguous()` (a copy, saved by o_proj).
void EagerForward(ModuleContext& ctx, int l, bool nograd, HfAttnSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes c = d.act_bytes;
  const std::int64_t s2 = d.b * d.a * d.s * d.s;
  if (d.g < d.a) {
    em.Begin("self_attn.repeat_kv", l);
    const TensorId k = em.Alloc(em.SizeOf(a->k) * (d.a / d.g), Category::kActivations, LayerLabel(l, "self_attn.key_repeated"));
    const TensorId v = em.Alloc(em.SizeOf(a->v) * (d.a / d.g), Category::kActivations, LayerLabel(l, "self_attn.value_repeated"));
    DropKv(em, a->k);
    DropKv(em, a->v);
    a->k = k;
    a->v = v;
  }
  em.Begin("self_attn.scores", l);
  ctx.k.GemmWorkspace(true);
  if (d.cast_inputs) {  // matmul under autocast: fresh C copies of the wide rotary outputs
    const TensorId q = em.Alloc(c * d.T * d.q, Category::kActivations, LayerLabel(l, "self_attn.query_cast"));
    const TensorId k = em.Alloc(c * d.T * d.q, Category::kActivations, LayerLabel(l, "self_attn.key_cast"));
    em.Free(a->q);
    DropKv(em, a->k);
    a->q = q;
    a->k = k;
  }
  // `attn_weights = torch.matmul(...) * scaling`: the matmul's output is unnamed and goes when
  // the product exists; `attn_weights = attn_weights + causal_mask` drops the scaled scores, and
  // the softmax line's rebinding the masked ones (transformers modeling_llama.py
  // eager_attention_forward; LlamaAttention.forward rebinds the same way in the releases before
  // it, with `/ math.sqrt(self.head_dim)`).
  const TensorId sc = em.Alloc(c * s2, Category::kTemporaries, LayerLabel(l, "self_attn.scores"));
  const TensorId scaled = em.Alloc(c * s2, Category::kTemporaries, LayerLabel(l, "self_attn.scores_scaled"));
  em.Free(sc);
  em.Begin("self_attn.mask_add", l);
  const TensorId masked = em.Alloc(d.wide_bytes * s2, Category::kTemporaries, LayerLabel(l, "self_attn.scores_masked"));
  em.Free(scaled);
  em.Flops(2.0 * d.b * d.s * d.s * d.q);
  em.Begin("self_attn.softmax", l);
  a->probs32 = em.Alloc(4 * s2, Category::kActivations, LayerLabel(l, "self_attn.probs_fp32"));
  a->probs = em.Alloc(c * s2, Category::kActivations, LayerLabel(l, "self_attn.probs"));
  em.Free(masked);
  if (d.attention_dropout) {
    em.Begin("self_attn.dropout", l);
    a->dmask = em.Alloc(s2, Category::kActivations, LayerLabel(l, "self_attn.dropout_mask"));
    const TensorId out = em.Alloc(c * s2, Category::kActivations, LayerLabel(l, "self_attn.dropout_out"));
    em.Free(a->probs);
    a->probs = out;
  }
  em.Begin("self_attn.context", l);
  if (a->v_wide) {
    // matmul(probs, v) under autocast: a fresh C copy of the wide v, saved in its place (the
    // wide one is the caller's local until the attention returns: modelled freed here).
    const TensorId v = em.Alloc(c * d.T * d.q, Category::kActivations, LayerLabel(l, "self_attn.value_cast"));
    DropKv(em, a->v);
    a->v = v;
  }
  const TensorId ctx_out = em.Alloc(c * d.T * d.q, Category::kTemporaries, LayerLabel(l, "self_attn.context"));
  a->out = em.Alloc(c * d.T * d.q, Category::kActivations, LayerLabel(l, "self_attn.attn_output"));
  em.Free(ctx_out);
  em.Flops(2.0 * d.b * d.s * d.s * d.q);
  if (nograd) {
    FreeAll(em, {a->q, a->k, a->v, a->probs32, a->probs, a->dmask});
    a->q = a->k = a->v = a->probs32 = a->probs = a->dmask = 0;
  }
}

// Its backward: matmul(probs, v) (d_probs, d_v), dropout, the fp32 copy's and softmax's
// backward (fp32, then the masked sum's dtype), the cast to the scaled scores' C, the scaling,
// matmul(q, k^T) (dq, dk); the repeat_kv sums; the casts back to R under cast_inputs.
std::array<TensorId, 3> EagerBackward(ModuleContext& ctx, int l, HfAttnSaved& a, TensorId dout) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const Bytes c = d.act_bytes;
  const std::int64_t s2 = d.b * d.a * d.s * d.s;
  auto chain = [&](TensorId g, const char* op, Bytes bytes, std::initializer_list<TensorId> also) {
    em.Begin(fmt::format("self_attn.{}", op), l);
    const TensorId next = em.Alloc(bytes * s2, Category::kTemporaries, LayerLabel(l, fmt::format("self_attn.d_{}", op)));
    em.Free(g);
    FreeAll(em, also);
    return next;
  };
  em.Begin("self_attn.context_bwd", l);
  ctx.k.GemmWorkspace(true);
  TensorId dp = em.Alloc(c * s2, Category::kTemporaries, LayerLabel(l, "self_attn.d_probs"));
  TensorId dv = em.Alloc(c * d.T * d.q, Category::kTemporaries, LayerLabel(l, "self_attn.d_value_repeated"));
  FreeAll(em, {dout, a.out, a.probs});
  DropKv(em, a.v);
  if (a.v_wide) {  // ToCopyBackward of the matmul's autocast copy of v
    em.Begin("self_attn.value_cast_bwd", l);
    const TensorId wide = em.Alloc(d.wide_bytes * d.T * d.q, Category::kTemporaries, LayerLabel(l, "self_attn.d_value_repeated_wide"));
    em.Free(dv);
    dv = wide;
  }
  if (d.attention_dropout) dp = chain(dp, "dropout_bwd", c, {a.dmask});
  dp = chain(dp, "probs_to_bwd", 4, {});
  dp = chain(dp, "softmax_bwd", d.wide_bytes, {a.probs32});
  if (d.wide_bytes != c) dp = chain(dp, "mask_bwd", c, {});
  dp = chain(dp, "scale_bwd", c, {});
  em.Begin("self_attn.scores_bwd", l);
  std::array<TensorId, 3> g{};
  g[0] = em.Alloc(c * d.T * d.q, Category::kTemporaries, LayerLabel(l, "self_attn.d_query"));
  g[1] = em.Alloc(c * d.T * d.q, Category::kTemporaries, LayerLabel(l, "self_attn.d_key_repeated"));
  FreeAll(em, {dp, a.q});
  DropKv(em, a.k);
  if (d.cast_inputs) {  // ToCopyBackward of the matmul's autocast copies, to the rotary dtype
    const Bytes r = DtypesOf(d).r;
    em.Begin("self_attn.scores_bwd.cast", l);
    const TensorId q = em.Alloc(r * d.T * d.q, Category::kTemporaries, LayerLabel(l, "self_attn.d_query_embed"));
    const TensorId k = em.Alloc(r * d.T * d.q, Category::kTemporaries, LayerLabel(l, "self_attn.d_key_embed"));
    FreeAll(em, {g[0], g[1]});
    g[0] = q;
    g[1] = k;
  }
  if (d.g < d.a) {
    em.Begin("self_attn.repeat_kv_bwd", l);
    const TensorId k = em.Alloc(em.SizeOf(g[1]) / (d.a / d.g), Category::kTemporaries, LayerLabel(l, "self_attn.d_key"));
    const TensorId v = em.Alloc(em.SizeOf(dv) / (d.a / d.g), Category::kTemporaries, LayerLabel(l, "self_attn.d_value"));
    FreeAll(em, {g[1], dv});
    g[1] = k;
    dv = v;
  }
  g[2] = dv;
  return g;
}

// sdpa under autocast (scaled_dot_product_attention is in autocast's lower-precision list):
// fresh C copies of the wide rotary outputs, saved in their place; v is already C.
void SdpaCasts(ModuleContext& ctx, int l, HfAttnSaved* a) {
  const ModelDims& d = ctx.d;
  if (!d.cast_inputs || !ctx.f.flash) return;
  Emitter& em = ctx.em;
  em.Begin("self_attn.sdpa_cast", l);
  const TensorId q = em.Alloc(d.act_bytes * d.T * d.q, Category::kActivations, LayerLabel(l, "self_attn.query_cast"));
  const TensorId k = em.Alloc(d.act_bytes * d.T * d.kv, Category::kActivations, LayerLabel(l, "self_attn.key_cast"));
  em.Free(a->q);
  DropKv(em, a->k);
  a->q = q;
  a->k = k;
  if (a->v_wide) {
    // A wide v (a quantised v_proj, LinearSaved::wide_out) is cast too: sdpa by autocast,
    // flash_attention_2 by `.to(target_dtype)` of query, key and value when the query is fp32
    // (transformers modeling_flash_attention_utils.py _flash_attention_forward, 4.48).
    const TensorId v = em.Alloc(d.act_bytes * d.T * d.kv, Category::kActivations, LayerLabel(l, "self_attn.value_cast"));
    DropKv(em, a->v);
    a->v = v;
  }
}

// The grads of the sdpa casts back to the rotary dtype (ToCopyBackward; k's cast was made
// last, so it runs first).
void SdpaCastsBackward(ModuleContext& ctx, int l, bool v_wide, std::array<TensorId, 3>* g) {
  const ModelDims& d = ctx.d;
  if (!d.cast_inputs || !ctx.f.flash) return;
  Emitter& em = ctx.em;
  const Bytes r = DtypesOf(d).r;
  if (v_wide) {  // v's cast was made last: its ToCopyBackward runs first
    em.Begin("self_attn.value_cast_bwd", l);
    const TensorId wide = em.Alloc(d.wide_bytes * d.T * d.kv, Category::kTemporaries, LayerLabel(l, "self_attn.d_value_wide"));
    em.Free((*g)[2]);
    (*g)[2] = wide;
  }
  for (int i : {1, 0}) {
    em.Begin(i == 1 ? "self_attn.key_cast_bwd" : "self_attn.query_cast_bwd", l);
    const TensorId wide = em.Alloc(r * d.T * (i == 1 ? d.kv : d.q), Category::kTemporaries,
                                   LayerLabel(l, i == 1 ? "self_attn.d_key_embed" : "self_attn.d_query_embed"));
    em.Free((*g)[i]);
    (*g)[i] = wide;
  }
}

// q / k / v projections (each casting the wide norm output under cast_inputs), Qwen3's q/k
// norms, RoPE. Leaves q, k (R or C) and v (C) in *a.
void ProjectQkv(ModuleContext& ctx, int l, TensorId y, bool nograd, HfAttnSaved* a) {
  const ModelDims& d = ctx.d;
  const bool cast = d.cast_inputs;
  std::array<TensorId, 3> out{};
  if (ctx.model.fused_projections) {
    // Phi3Attention: one qkv_proj; q, k and v are slices of its output. sdpa saves the v slice,
    // which keeps the whole output alive.
    out[2] = LinearForward(ctx, l, "self_attn.qkv_proj", d.h, d.q + 2 * d.kv, cast, nograd, &a->proj[0]);
  } else {
    for (int i = 0; i < 3; ++i) {
      out[i] = LinearForward(ctx, l, kProj[i], d.h, Widths(d, i, false), cast, nograd, &a->proj[i]);
    }
  }
  // The norm output: saved by the linears unless each cast it or none keeps its input (frozen
  // PEFT weights: Kernels::KeepsLinearInput); then the decoder layer's local still holds it until
  // self_attn returns (HfAttentionModule::Forward, DropNormOutput).
  bool kept = false;
  for (int i = 0; i < 3; ++i) {
    const Name module = ctx.model.fused_projections ? "self_attn.qkv_proj" : kProj[i];
    kept = kept || ctx.k.KeepsLinearInput(Param(l, module));
  }
  a->ln_out = y;
  a->ln_out_saved = !(cast || nograd || !kept);
  // q and k in C, or wide from a quantised projection fed the wide norm output (Phi3's fused
  // projection is never quantised by name: hf_peft.cc LayerLinearWeight lists qkv_proj, so its
  // slices follow proj[0]).
  const Bytes proj_bytes = OutBytes(d, a->proj[0]);
  a->v_wide = OutBytes(d, a->proj[ctx.model.fused_projections ? 0 : 2]) != d.act_bytes;
  Bytes in_bytes = proj_bytes;
  if (ctx.model.qk_layernorm) {
    out[0] = QkNorm(ctx, l, "q", out[0], proj_bytes, d.a, nograd, &a->q_norm);
    out[1] = QkNorm(ctx, l, "k", out[1], proj_bytes, d.g, nograd, &a->k_norm);
    in_bytes = std::max(proj_bytes, d.param_bytes);
  }
  a->q = RopeForward(ctx, l, "q", in_bytes, d.q);
  a->k = RopeForward(ctx, l, "k", in_bytes, d.kv);
  FreeAll(ctx.em, {out[0], out[1]});
  a->v = out[2];
}

// Phi3's qkv slices in backward: each SliceBackward makes a zero-filled grad of the whole
// output (slice_backward), v's first (made last); the others are added into it in place.
TensorId FusedQkvGrad(ModuleContext& ctx, int l, const std::array<TensorId, 3>& g) {
  const ModelDims& d = ctx.d;
  TensorId first = 0;
  for (int i = 2; i >= 0; --i) {
    ctx.em.Begin(fmt::format("self_attn.qkv_slice{}_bwd", i), l);
    const TensorId full = ctx.em.Alloc(d.act_bytes * d.T * (d.q + 2 * d.kv), Category::kTemporaries,
                                       LayerLabel(l, "self_attn.d_qkv"));
    ctx.em.Free(g[i]);
    first = Accumulate(ctx.em, first, full);
  }
  return first;
}

// Gemma2's norm of a branch output (C) before the residual sum, modelled as LlamaRMSNorm.
TensorId BranchNorm(ModuleContext& ctx, int l, const char* name, TensorId branch, bool nograd,
                    RmsSaved* s) {
  const ModelDims& d = ctx.d;
  const TensorId y = RmsNormForward(ctx, l, name, d.T, d.h, d.act_bytes,
                                    std::max(d.act_bytes, d.param_bytes), nograd, s);
  ctx.em.Free(branch);  // its norm saved its own fp32 copy
  return y;
}

}  // namespace

TensorId HfAttentionModule::Forward(ModuleContext& ctx, int l, TensorId x, const ForwardMode& mode,
                                    std::unique_ptr<ModuleSaved>* saved) {
  const ModelDims& d = ctx.d;
  HfAttnSaved a;
  const TensorId y = RmsNormForward(ctx, l, "input_layernorm", d.T, d.h, d.wide_bytes, d.wide_bytes,
                                    mode.nograd, &a.ln);
  ProjectQkv(ctx, l, y, mode.nograd, &a);
  if (!mode.nograd) CacheKv(ctx, a);
  if (ctx.f.flash) {
    SdpaCasts(ctx, l, &a);
    SdpaForward(ctx, l, mode.nograd, &a);
  } else {
    EagerForward(ctx, l, mode.nograd, &a);
  }
  TensorId o = LinearForward(ctx, l, kProj[3], d.q, d.h, false, mode.nograd, &a.proj[3]);
  // sdpa saved its output too; eager's transposed copy is o_proj's alone.
  if (mode.nograd || (!ctx.f.flash && !ctx.k.KeepsLinearInput(Param(l, kProj[3])))) {
    ctx.em.Free(a.out);
    a.out = 0;
  }
  a.ln_out = DropNormOutput(ctx, l, "input_layernorm", a.ln_out, a.ln_out_saved);
  if (ctx.model.sandwich_norms) o = BranchNorm(ctx, l, "post_attention_layernorm", o, mode.nograd, &a.post);
  const TensorId out = ResidualSum(ctx, l, "self_attn", x, o, mode);
  if (!mode.nograd) *saved = std::make_unique<HfAttnSaved>(a);
  return out;
}

TensorId HfAttentionModule::Backward(ModuleContext& ctx, int l, ModuleSaved& saved, TensorId x,
                                     bool free_x, TensorId dy, bool free_dy) {
  const ModelDims& d = ctx.d;
  HfAttnSaved& a = static_cast<HfAttnSaved&>(saved);
  const bool qkv_bias = ctx.model.add_bias_linear || ctx.model.add_qkv_bias;
  const Bytes wide = std::max(d.act_bytes, d.param_bytes);
  TensorId db = dy;
  if (ctx.model.sandwich_norms) {
    db = RmsNormBackward(ctx, l, "post_attention_layernorm", d.T, d.h, d.act_bytes, wide, a.post, dy, false);
  } else {
    db = ResidualBranchGrad(ctx, l, "self_attn", dy);
  }
  const TensorId dout =
      LinearBackward(ctx, l, kProj[3], d.q, d.h, ctx.model.add_bias_linear, a.proj[3], db, db != dy);
  std::array<TensorId, 3> g = ctx.f.flash ? SdpaBackward(ctx, l, a, dout) : EagerBackward(ctx, l, a, dout);
  SdpaCastsBackward(ctx, l, a.v_wide, &g);
  const Bytes proj_bytes = OutBytes(d, a.proj[0]);
  Bytes in_bytes = proj_bytes;
  if (ctx.model.qk_layernorm) in_bytes = std::max(proj_bytes, d.param_bytes);
  g[1] = RopeBackward(ctx, l, "k", g[1], in_bytes, d.kv);
  g[0] = RopeBackward(ctx, l, "q", g[0], in_bytes, d.q);
  if (ctx.model.qk_layernorm) {
    g[1] = RmsNormBackward(ctx, l, "self_attn.k_norm", d.T * d.g, d.dh, proj_bytes, in_bytes, a.k_norm, g[1]);
    g[0] = RmsNormBackward(ctx, l, "self_attn.q_norm", d.T * d.a, d.dh, proj_bytes, in_bytes, a.q_norm, g[0]);
  }
  TensorId dnorm = 0;
  if (ctx.model.fused_projections) {
    dnorm = LinearBackward(ctx, l, "self_attn.qkv_proj", d.h, d.q + 2 * d.kv, qkv_bias, a.proj[0],
                           FusedQkvGrad(ctx, l, g), true);
  } else {
    // The autograd engine runs the latest-made node first: v_proj, k_proj, q_proj.
    for (int i = 2; i >= 0; --i) {
      dnorm = Accumulate(ctx.em, dnorm,
                         LinearBackward(ctx, l, kProj[i], d.h, Widths(d, i, false), qkv_bias, a.proj[i], g[i], true));
    }
  }
  ctx.em.Free(a.ln_out);
  const TensorId din = RmsNormBackward(ctx, l, "input_layernorm", d.T, d.h, d.wide_bytes, d.wide_bytes, a.ln, dnorm);
  return ResidualInputGrad(ctx, l, "input_layernorm_residual_bwd", din, x, free_x, dy, free_dy);
}

// ---------------------------------------------------------------------------------------------
// MLP.
namespace {

struct HfMlpSaved final : ModuleSaved {
  RmsSaved ln, post;  // post: Gemma2's post_feedforward_layernorm
  TensorId ln_out = 0;
  std::array<LinearSaved, 3> proj{};  // gate (or Phi3's gate_up), up, down
  TensorId gate = 0, act = 0, up = 0, prod = 0;  // Phi3: gate is the gate_up output, up 0
};

// The MLP's input norm: post_attention_layernorm (Llama), pre_feedforward_layernorm (Gemma2).
const char* InputNorm(const config::ModelConfig& model) {
  return model.sandwich_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm";
}

// act_fn(gate_proj(x)) * up_proj(x): SiLU (or GeLU) saves its input, the product saves both
// factors. Phi3MLP: one gate_up_proj whose output is chunked: the activation's input and the
// up factor are views of it, which stays whole.
TensorId GatedForward(ModuleContext& ctx, int l, bool nograd, HfMlpSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const bool cast = d.cast_inputs;
  const bool fused = ctx.model.fused_projections;
  a->gate = fused ? LinearForward(ctx, l, "mlp.gate_up_proj", d.h, 2 * d.ffn, cast, nograd, &a->proj[0])
                  : LinearForward(ctx, l, "mlp.gate_proj", d.h, d.ffn, cast, nograd, &a->proj[0]);
  // C, or wide from quantised projections fed the wide norm output (LinearSaved::wide_out):
  // then act_fn, the product and down_proj's input are wide as well.
  const Bytes f = OutBytes(d, a->proj[0]) * d.T * d.ffn;
  em.Begin("mlp.act_fn", l);
  a->act = em.Alloc(f, Category::kActivations, LayerLabel(l, "mlp.act_out"));
  if (nograd && !fused) em.Free(a->gate);
  if (!fused) a->up = LinearForward(ctx, l, "mlp.up_proj", d.h, d.ffn, cast, nograd, &a->proj[1]);
  em.Begin("mlp.mul", l);
  a->prod = em.Alloc(f, Category::kActivations, LayerLabel(l, "mlp.act_mul_up"));
  if (nograd) FreeAll(em, {a->act, a->up, fused ? a->gate : 0});
  return a->prod;
}

// Its backward; returns the grad of the norm output (the wide dtype under cast_inputs).
TensorId GatedBackward(ModuleContext& ctx, int l, HfMlpSaved& a, TensorId dprod) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const bool bias = ctx.model.add_bias_linear;
  const Bytes f = OutBytes(d, a.proj[0]) * d.T * d.ffn;
  // MulBackward0: both factors' grads in one node; then up_proj (made after act_fn) first.
  em.Begin("mlp.mul_bwd", l);
  const TensorId dact = em.Alloc(f, Category::kTemporaries, LayerLabel(l, "mlp.d_act_out"));
  const TensorId dup = em.Alloc(f, Category::kTemporaries, LayerLabel(l, "mlp.d_up_out"));
  FreeAll(em, {dprod, a.prod, a.act, a.up});
  TensorId dnorm = 0;
  if (!ctx.model.fused_projections) {
    dnorm = LinearBackward(ctx, l, "mlp.up_proj", d.h, d.ffn, bias, a.proj[1], dup, true);
  }
  em.Begin("mlp.act_fn_bwd", l);  // a new grad of the activation's input
  const TensorId dgate = em.Alloc(f, Category::kTemporaries, LayerLabel(l, "mlp.d_gate_out"));
  FreeAll(em, {dact, a.gate});
  if (ctx.model.fused_projections) {
    em.Begin("mlp.chunk_bwd", l);  // SplitBackward: the two halves' grads concatenated
    const TensorId dgu = em.Alloc(2 * f, Category::kTemporaries, LayerLabel(l, "mlp.d_gate_up_out"));
    FreeAll(em, {dgate, dup});
    return LinearBackward(ctx, l, "mlp.gate_up_proj", d.h, 2 * d.ffn, bias, a.proj[0], dgu, true);
  }
  return Accumulate(em, dnorm, LinearBackward(ctx, l, "mlp.gate_proj", d.h, d.ffn, bias, a.proj[0], dgate, true));
}

}  // namespace

void HfMlpModule::AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                               int layer, std::vector<ParamTensor>* out) const {
  auto add = [&](const Name& name, std::int64_t numel, std::int64_t row, bool one_dim) {
    out->push_back(MakeParam(LayerLabel(layer, name), numel, row, chunk, layer, one_dim, false));
  };
  const bool bias = model.add_bias_linear;  // LlamaConfig mlp_bias
  MEMSIM_CHECK(d.gamma == 2 && d.t == 1);
  for (const char* w : model.fused_projections ? std::vector<const char*>{"mlp.gate_up_proj"}
                                               : std::vector<const char*>{"mlp.gate_proj", "mlp.up_proj"}) {
    const std::int64_t rows = model.fused_projections ? 2 * d.ffn : d.ffn;
    add(Name(w) + ".weight", rows * d.h, d.h, false);
    if (bias) add(Name(w) + ".bias", rows, 1, true);
  }
  add("mlp.down_proj.weight", d.h * d.ffn, d.ffn, false);
  if (bias) add("mlp.down_proj.bias", d.h, 1, true);
  add(Name(InputNorm(model)) + ".weight", d.h, 1, true);
  if (model.sandwich_norms) add("post_feedforward_layernorm.weight", d.h, 1, true);
}

TensorId HfMlpModule::Forward(ModuleContext& ctx, int l, TensorId x, const ForwardMode& mode,
                              std::unique_ptr<ModuleSaved>* saved) {
  const ModelDims& d = ctx.d;
  const bool nograd = mode.nograd;
  HfMlpSaved a;
  const TensorId y = RmsNormForward(ctx, l, InputNorm(ctx.model), d.T, d.h, d.wide_bytes,
                                    d.wide_bytes, nograd, &a.ln);
  const TensorId h = GatedForward(ctx, l, nograd, &a);
  const bool kept = ctx.model.fused_projections
                        ? ctx.k.KeepsLinearInput(Param(l, "mlp.gate_up_proj"))
                        : ctx.k.KeepsLinearInput(Param(l, "mlp.gate_proj")) ||
                              ctx.k.KeepsLinearInput(Param(l, "mlp.up_proj"));
  a.ln_out = y;  // saved by gate and up (or gate_up), else dropped when the MLP returns
  const bool ln_out_saved = !(d.cast_inputs || nograd || !kept);
  const bool wide_prod = a.proj[0].wide_out;  // down_proj casts a wide product (LinearForward)
  TensorId down = LinearForward(ctx, l, "mlp.down_proj", d.ffn, d.h, wide_prod, nograd, &a.proj[2]);
  if (nograd || !ctx.k.KeepsLinearInput(Param(l, "mlp.down_proj"))) {
    ctx.em.Free(h);  // the product's only reader is down_proj
    a.prod = 0;
  }
  a.ln_out = DropNormOutput(ctx, l, InputNorm(ctx.model), a.ln_out, ln_out_saved);
  if (ctx.model.sandwich_norms) down = BranchNorm(ctx, l, "post_feedforward_layernorm", down, nograd, &a.post);
  const TensorId out = ResidualSum(ctx, l, "mlp", x, down, mode);
  if (!nograd) *saved = std::make_unique<HfMlpSaved>(a);
  return out;
}

TensorId HfMlpModule::Backward(ModuleContext& ctx, int l, ModuleSaved& saved, TensorId x,
                               bool free_x, TensorId dy, bool free_dy) {
  const ModelDims& d = ctx.d;
  HfMlpSaved& a = static_cast<HfMlpSaved&>(saved);
  TensorId db = dy;
  if (ctx.model.sandwich_norms) {
    db = RmsNormBackward(ctx, l, "post_feedforward_layernorm", d.T, d.h, d.act_bytes,
                         std::max(d.act_bytes, d.param_bytes), a.post, dy, false);
  } else if (!a.proj[2].wide_out) {  // a wide down_proj output takes dy as it is
    db = ResidualBranchGrad(ctx, l, "mlp", dy);
  }
  const TensorId dh = LinearBackward(ctx, l, "mlp.down_proj", d.ffn, d.h, ctx.model.add_bias_linear,
                                     a.proj[2], db, db != dy);
  const TensorId dnorm = GatedBackward(ctx, l, a, dh);
  ctx.em.Free(a.ln_out);
  const TensorId din = RmsNormBackward(ctx, l, InputNorm(ctx.model), d.T, d.h, d.wide_bytes,
                                       d.wide_bytes, a.ln, dnorm);
  return ResidualInputGrad(ctx, l, "post_attention_layernorm_residual_bwd", din, x, free_x, dy, free_dy);
}

}  // namespace memsim::workload
