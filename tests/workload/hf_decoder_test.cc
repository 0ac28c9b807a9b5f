// One Llama decoder layer under the Hugging Face Trainer (framework "hf-trainer",
// modules/hf_decoder.h), counted by hand from Transformers' modeling_llama.py and PyTorch's
// autograd, for attn_implementation "sdpa" on a GPU (flash backend for 16-bit, PyTorch >= 2.5):
// bf16 autocast over fp32 weights, and bf16-loaded weights (torch_dtype bfloat16), each with
// and without gradient checkpointing (reentrant, one checkpoint per decoder layer).
//
// Shape: h 64, 4 heads of dh 16 (q = 64), 2 KV heads (kv = 32), intermediate 128 (SwiGLU), no
// biases; sequence 32, micro-batch 1: T = 32 tokens. Element counts: T·h = 2048,
// T·q = 2048, T·kv = 1024, T·ffn = 4096.
//
// What each op keeps (PyTorch tools/autograd/derivatives.yaml: mm saves its input and the
// weight; SiLU saves its input; mul saves the factors whose partner requires grad; to() saves
// nothing; sdpa's flash / efficient kernels save q, k, v, the output and the logsumexp):
//   LlamaRMSNorm.forward: x.to(fp32) (a new fp32 copy unless x is fp32: saved by pow), variance
//     and rsqrt (fp32 [T], saved), x·rsqrt (fp32, saved by the weight's mul when x is fp32),
//     .to(input dtype) (a new tensor unless fp32: saved by the weight's mul), weight · that.
//   LlamaAttention.forward: q_proj, k_proj, v_proj (separate nn.Linear), apply_rotary_pos_emb
//     (q·cos + rotate_half(q)·sin: cos and sin need no grad, so only they are saved; the
//     result is in promote(q, cos), and cos is in inputs_embeds' dtype),
//     sdpa_attention_forward (enable_gqa: k, v not repeated; the output is [b, s, a, dh] in
//     storage, so transpose(1, 2).contiguous() copies nothing), o_proj.
//   LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x)).
//   LlamaDecoderLayer.forward: the two residual sums (residual + branch).
// Autocast (aten/src/ATen/autocast_mode.cpp): linear and scaled_dot_product_attention run in
// bf16; cached_cast keeps the bf16 copy of each fp32 leaf weight until the forward's autocast
// region ends (also under no_grad), and casts any other fp32 input afresh for each op.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

#include "workload/build.h"
#include "workload/model.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

config::Setup TinyHfLlama(config::Precision torch_dtype, bool checkpointing) {
  config::Setup s = testing::TinyHfLlama(torch_dtype);
  s.training.optimizer_impl = config::OptimizerImpl::kForeach;
  if (checkpointing) {
    s.training.recompute_granularity = config::RecomputeGranularity::kFull;
    s.training.recompute_method = config::RecomputeMethod::kUniform;
    s.training.recompute_num_layers = 1;
  }
  return s;
}

bool IsRecompute(const Op& op) { return op.name.rfind("recompute.", 0) == 0; }

// Activations made by layer 0's ops of micro-batch 0 in `phase` (only the recompute ops in
// backward) and not freed by them: what that forward saved, by tensor id.
std::map<TensorId, Bytes> Saved(const Program& p, Phase phase) {
  std::map<TensorId, Bytes> alive;
  for (const Op& op : p.ops) {
    if (op.iteration != 1 || op.micro_batch != 0 || op.layer != 0 || op.phase != phase) continue;
    if (phase == Phase::kBackward && !IsRecompute(op)) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kActivations) alive[a.id] = a.size_bytes;
    }
    for (TensorId id : op.frees) alive.erase(id);
  }
  return alive;
}

Bytes Sum(const std::map<TensorId, Bytes>& m) {
  Bytes s = 0;
  for (const auto& [id, bytes] : m) s += bytes;
  return s;
}

// Layer 0's backward (its recompute excluded): the temporaries it makes, their peak (after an
// op's allocations, before its frees) and what is left at its end; and the bytes of `saved`
// it frees.
struct BackwardGauge {
  Bytes peak = 0, end = 0, freed_saved = 0;
};
BackwardGauge MeasureBackward(const Program& p, const std::map<TensorId, Bytes>& saved) {
  std::map<TensorId, Bytes> alive;
  std::set<TensorId> freed;
  BackwardGauge g;
  Bytes now = 0;
  for (const Op& op : p.ops) {
    if (op.iteration != 1 || op.micro_batch != 0 || op.layer != 0 ||
        op.phase != Phase::kBackward || IsRecompute(op)) {
      continue;
    }
    for (const TensorAlloc& a : op.allocs) {
      if (a.category != Category::kTemporaries) continue;
      alive[a.id] = a.size_bytes;
      now += a.size_bytes;
    }
    g.peak = std::max(g.peak, now);
    for (TensorId id : op.frees) {
      freed.insert(id);
      auto it = alive.find(id);
      if (it == alive.end()) continue;
      now -= it->second;
      alive.erase(it);
    }
  }
  g.end = now;
  for (const auto& [id, bytes] : saved) g.freed_saved += freed.count(id) != 0 ? bytes : 0;
  return g;
}

// ---------------------------------------------------------------------------------------------
// bf16 autocast over fp32 weights (torch_dtype float32, bf16 true). The embedding lookup is no
// autocast op: the layer input x is fp32, and so are both residual sums (fp32 + bf16 promotes).
//   input_layernorm: x.to(fp32) is x itself; rstd 4·T = 128; x·rstd fp32 4·T·h = 8192 (saved
//     by the weight's mul; the .to(fp32) is again a no-op); its output y = weight·n fp32 is
//     read by q/k/v, each of which saves its own bf16 cast: 3 × 2·T·h = 12288; y itself is
//     then unused and freed.
//   q_proj / k_proj outputs (bf16) are freed after RoPE; RoPE's results are fp32 (cos is fp32),
//     so sdpa casts them afresh: q 2·T·q = 4096, k 2·T·kv = 2048, saved; v_proj's output (bf16,
//     2·T·kv = 2048) is saved as sdpa's v; the output 2·T·q = 4096 (saved by sdpa and o_proj);
//     logsumexp fp32 [b, a, s] = 4·4·32 = 512.
//   attention residual sum fp32 4·T·h = 8192.
//   post_attention_layernorm: rstd 128, n 8192; gate_proj and up_proj each save a bf16 cast of
//     its fp32 output: 2 × 4096 = 8192.
//   MLP: gate's output (SiLU's input), SiLU's output and up's output (the mul's factors), their
//     product (down_proj's input): 4 × 2·T·ffn = 32768.
//   MLP residual sum (the layer output) fp32 8192.
//   bf16 weight copies, cached by autocast and saved by the GEMMs: 2 × (q 64·64 + k 32·64 +
//     v 32·64 + o 64·64 + gate, up, down 3 × 128·64) = 2 × 36864 = 73728.
constexpr Bytes kCopies = 73728;
constexpr Bytes kAutocastSaved =
    (128 + 8192 + 12288) + (4096 + 2048 + 2048 + 4096 + 512) + 8192 + (128 + 8192 + 8192) +
    32768 + 8192 + kCopies;  // = 172800

TEST_CASE("hf-trainer Llama layer, sdpa, bf16 autocast over fp32 weights: saved and freed",
          "[workload][hf][hf_decoder]") {
  const Program p = Build(TinyHfLlama(config::Precision::kFp32, false), 0);
  const std::map<TensorId, Bytes> saved = Saved(p, Phase::kForward);
  // Without gradient checkpointing use_cache stays on (LlamaModel.forward): the DynamicCache
  // holds RoPE's fp32 k (4·T·kv = 4096), which sdpa's bf16 cast would otherwise free, until
  // Trainer.compute_loss drops the output: alive when the layer's forward ends, freed before
  // its backward. v is sdpa's own saved tensor anyway.
  CHECK(Sum(saved) == kAutocastSaved + 4096);
  CHECK(kAutocastSaved == 172800);
  // Backward, in the autograd engine's order (latest node first). The highest point is flash's
  // backward (flash_api.cpp mha_bwd). Alive when it starts: the MLP's input grad (fp32 T·h,
  // 8192) and o_proj's input grad (bf16 T·q, 4096; the bf16 cast of dy it read is freed). It
  // adds dq 4096, dk 2048, dv 2048, softmax_d fp32 [b, a, s rounded up to 128] 2048, the fp32
  // dq accumulator [b, 128, a, dh rounded up to 32] 65536, and with GQA dk and dv for every
  // query head, 2 × 4096: 12288 + 83968 = 96256. (Next highest: input_layernorm's pow backward,
  // 49152: the MLP's grad 8192, the fp32 input grad 8192, the expanded mean grad 8192 and pow's
  // two temporaries and product 3 × 8192.)
  const BackwardGauge b = MeasureBackward(p, saved);
  CHECK(b.peak == 96256);
  CHECK(b.end == 8192);  // the layer input's fp32 grad
  // Every saved tensor is freed by the layer's backward but the layer output, which is layer
  // 1's input and freed by layer 1's backward (and the cached k, freed before).
  CHECK(b.freed_saved == kAutocastSaved - 8192);
}

TEST_CASE("hf-trainer Llama layer, sdpa, bf16 autocast over fp32 weights, gradient checkpointing",
          "[workload][hf][hf_decoder]") {
  const Program p = Build(TinyHfLlama(config::Precision::kFp32, true), 0);
  // Forward under no_grad (torch/utils/checkpoint.py CheckpointFunction.forward): only the
  // layer output stays (fp32 8192), and the weights' bf16 copies, which autocast caches whether
  // or not grad is enabled, until the forward's autocast region ends: 73728.
  CHECK(Sum(Saved(p, Phase::kForward)) == 8192 + kCopies);
  // CheckpointFunction.backward re-runs the layer with grad: it saves what the layer without
  // checkpointing saves (the weight copies made again, saved by the GEMMs; autocast's cache of
  // the recompute ends with its own region), then the same backward.
  const std::map<TensorId, Bytes> saved = Saved(p, Phase::kBackward);
  CHECK(Sum(saved) == kAutocastSaved);
  const BackwardGauge b = MeasureBackward(p, saved);
  CHECK(b.peak == 96256);
  CHECK(b.end == 8192);
  // All freed, the recomputed output too: CheckpointFunction.backward drops it when it returns.
  CHECK(b.freed_saved == kAutocastSaved);
}

// ---------------------------------------------------------------------------------------------
// bf16-loaded weights (torch_dtype bfloat16, bf16 autocast: no casts). Everything is bf16 but
// the norms' fp32 internals.
//   each norm: x.to(fp32) 4·T·h = 8192 (saved by pow), rstd 128, n.to(bf16) 4096 (saved by the
//     weight's mul), the output 4096 (saved by q/k/v, or by gate/up): 16512, twice.
//   attention: RoPE's outputs bf16 q 4096 and k 2048, v 2048, the output 4096, logsumexp 512.
//   the residual sums 4096 each; the MLP's four bf16 T·ffn tensors 32768.
constexpr Bytes kBf16Saved = 2 * 16512 + (4096 + 2048 + 2048 + 4096 + 512) + 2 * 4096 + 32768;

TEST_CASE("hf-trainer Llama layer, sdpa, bf16 weights: saved and freed",
          "[workload][hf][hf_decoder]") {
  const Program p = Build(TinyHfLlama(config::Precision::kBf16, false), 0);
  const std::map<TensorId, Bytes> saved = Saved(p, Phase::kForward);
  CHECK(Sum(saved) == kBf16Saved);
  CHECK(kBf16Saved == 86784);
  // Flash's backward again: alive before it the MLP's input grad 4096 and o_proj's input grad
  // 4096 (dy passes to o_proj uncast); it adds 83968 as above: 92160.
  const BackwardGauge b = MeasureBackward(p, saved);
  CHECK(b.peak == 92160);
  CHECK(b.end == 4096);
  CHECK(b.freed_saved == kBf16Saved - 4096);  // all but the layer output
}

TEST_CASE("hf-trainer Llama layer, sdpa, bf16 weights, gradient checkpointing",
          "[workload][hf][hf_decoder]") {
  const Program p = Build(TinyHfLlama(config::Precision::kBf16, true), 0);
  CHECK(Sum(Saved(p, Phase::kForward)) == 4096);  // the layer output only; nothing is cast
  const std::map<TensorId, Bytes> saved = Saved(p, Phase::kBackward);
  CHECK(Sum(saved) == kBf16Saved);
  const BackwardGauge b = MeasureBackward(p, saved);
  CHECK(b.peak == 92160);
  CHECK(b.end == 4096);
  CHECK(b.freed_saved == kBf16Saved);  // the recomputed output too
}

// The op that frees layer 0's tensor `label` (LayerLabel) of iteration 1, micro-batch 0.
std::string FreedIn(const Program& p, const std::string& label) {
  TensorId id = 0;
  for (const Op& op : p.ops) {
    if (op.iteration != 1 || op.micro_batch != 0) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (id == 0 && a.label == label) id = a.id;
    }
    if (id != 0 && std::find(op.frees.begin(), op.frees.end(), id) != op.frees.end()) {
      return op.name;
    }
  }
  return "";
}

// Eager attention with GQA (bf16 weights): repeat_kv copies k and v for the matmuls, which save
// the copies; key_states after RoPE and value_states (v_proj's output), 2·T·kv = 2048 each,
// have no other reader. Transformers v4.47.1 LlamaModel.forward: use_cache (config default
// true) makes a DynamicCache unless `self.gradient_checkpointing and self.training`;
// LlamaAttention.forward's past_key_value.update appends both before repeat_kv, and the output
// returns the cache: they live until Trainer.compute_loss drops `outputs`. Under gradient
// checkpointing no cache: repeat_kv's rebinding drops them (eager_attention_forward's locals
// `key_states`, `value_states` are the repeated ones).
TEST_CASE("hf-trainer Llama eager attention: the DynamicCache keeps k after RoPE and v until the "
          "Trainer drops the output, unless gradient checkpointing turns use_cache off",
          "[workload][hf][hf_decoder]") {
  for (bool ckpt : {false, true}) {
    config::Setup s = TinyHfLlama(config::Precision::kBf16, ckpt);
    s.training.use_flash_attn = false;  // attn_implementation "eager"
    const Program p = Build(s, 0);
    INFO("gradient checkpointing " << ckpt);
    const std::string end = ckpt ? "self_attn.repeat_kv" : "loss.compute_loss_return";
    CHECK(FreedIn(p, "layer0.self_attn.k_embed") == end);
    CHECK(FreedIn(p, "layer0.self_attn.v_proj.out") == end);
    CHECK(FreedIn(p, "layer1.self_attn.k_embed") == end);
  }
}

// ---------------------------------------------------------------------------------------------
// LoRA (peft tuners/lora/layer.py Linear.forward: result = base_layer(x) + lora_B(lora_A(
// dropout(x))) · scaling) r = 4 on q_proj and v_proj over the bf16 weights above; every base
// weight, the norms' included, is frozen. Autograd keeps a tensor only for a gradient that is
// needed (tools/autograd/gen_variable_type.py guard_for: a saved tensor read by one input's
// formula is saved under should_compute_output of that input):
//   mm (nn.Linear): the input is read only by the weight's formula (derivatives.yaml mm,
//     `mat2: mm_mat2_backward(grad, self, ...)`), so a frozen linear keeps no input;
//   weight · c (LlamaRMSNorm): c is read only by the weight's formula, so a frozen norm keeps
//     no c, 4096 a norm.
// Against kBf16Saved: both norms' c, −2 × 4096; input_layernorm's output (read by q/k/v, all
// frozen; the adapters read their dropout's output instead), −4096; post_attention_layernorm's
// output (gate and up frozen), −4096; the product (down_proj frozen), −2·T·ffn = −8192. Kept as
// before: rstd and the fp32 copies (pow, x·rstd), RoPE's outputs, v and the output (sdpa), the
// gate output (SiLU), SiLU's output and up's output (the mul: each factor for the other's
// grad), the residual sums.
// The adapters are fp32 (get_peft_model's autocast_adapter_dtype), so Linear.forward first
// casts x to fp32 (`x = self._cast_input_dtype(x, lora_A.weight.dtype)`, a transient) and
// lora_A, under bf16 autocast, saves its own bf16 copy of what it reads. Each adapter keeps:
// with lora_dropout 0.1 the bool mask T·in = 32·64 = 2048 and the bf16 copy of the dropped
// input 2·T·in = 4096, and lora_A's output 2·T·r = 256 (lora_B's input): 6400, two adapters
// 12800. Without dropout the bf16 copy of the cast x (4096) and the 256; the norm output is
// not kept (lora_A reads the cast, not x): 2 × 4352.
TEST_CASE("hf-trainer Llama layer, sdpa, bf16 weights, LoRA: frozen linears keep no input",
          "[workload][hf][hf_decoder][peft]") {
  auto lora = [](double dropout) {
    config::Setup s = TinyHfLlama(config::Precision::kBf16, false);
    s.training.hf_trainer()->lora_r = 4;
    s.training.hf_trainer()->lora_alpha = 8;
    s.training.hf_trainer()->lora_dropout = dropout;
    s.training.hf_trainer()->lora_target_modules = {"q_proj", "v_proj"};
    return s;
  };
  constexpr Bytes kFrozen = kBf16Saved - 2 * 4096 - 4096 - 4096 - 8192;
  const Program p = Build(lora(0.1), 0);
  const std::map<TensorId, Bytes> saved = Saved(p, Phase::kForward);
  CHECK(Sum(saved) == kFrozen + 2 * (2048 + 4096 + 256));
  CHECK(Sum(saved) == 75008);
  CHECK(MeasureBackward(p, saved).freed_saved == Sum(saved) - 4096);  // all but the output
  CHECK(Sum(Saved(Build(lora(0.0), 0), Phase::kForward)) == kFrozen + 2 * (4096 + 256));
}

TEST_CASE("hf-trainer Llama layer: parameters under Transformers' names",
          "[workload][hf][hf_decoder]") {
  // LlamaDecoderLayer: q_proj 64·64, k_proj and v_proj 32·64, o_proj 64·64, gate/up/down
  // 128·64 each, two norm weights of 64: 4096 + 2·2048 + 4096 + 3·8192 + 128 = 36992.
  const std::vector<ParamTensor> params = StageParams(TinyHfLlama(config::Precision::kFp32, false), 0);
  std::int64_t layer0 = 0;
  std::set<std::string> names;
  for (const ParamTensor& pt : params) {
    if (pt.layer != 0) continue;
    layer0 += pt.numel;
    names.insert(pt.name);
  }
  CHECK(layer0 == 36992);
  for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                        "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                        "input_layernorm", "post_attention_layernorm"}) {
    CHECK(names.count(std::string("layer0.") + n + ".weight") == 1);
  }
}

}  // namespace
}  // namespace memsim::workload
