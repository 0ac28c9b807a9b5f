// The plain-PyTorch stack on one device (framework "pytorch", single_device.cc,
// training_loop.cc PyTorchLoop): gradients are created by autograd in the first backward of an
// iteration (AccumulateGrad adopts the first gradient, later micro-batches add into it);
// optimizer.zero_grad(set_to_none=True) frees them at the start of the next iteration, while
// set_to_none=False keeps them; torch.optim creates Adam's state inside the first step, in the
// parameters' dtype.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "workload/build.h"
#include "workload/model.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

// testing::TinyLlama (h 64, ffn 128 gated, 4 heads, 4 KV heads, 2 layers, vocab 256, untied,
// no biases) in a plain PyTorch loop: two micro-batches per iteration, three iterations; fp32
// weights under bf16 autocast.
config::Setup TinyPyTorch(bool set_to_none) {
  config::Setup s = testing::TinyLlama();
  s.training.framework = "pytorch";
  s.training.stack.emplace<config::PyTorchOptions>();
  s.training.global_batch_size = 2;  // two micro-batches of 1 (gradient accumulation)
  s.training.train_iters = 3;
  s.training.precision = config::Precision::kBf16;
  s.training.pytorch()->torch_dtype = config::Precision::kFp32;
  s.training.pytorch()->zero_grad_set_to_none = set_to_none;
  s.training.gradient_accumulation_fusion = false;
  s.training.optimizer_impl = config::OptimizerImpl::kForeach;
  return s;
}

// Parameters P: embedding 256·64 = 16384; per layer ln1 64 + qkv (64 + 2·64)·64 = 12288 +
// proj 64·64 = 4096 + ln2 64 + fc1 2·128·64 = 16384 + fc2 64·128 = 8192 = 41088, two layers
// 82176; final norm 64; output layer 16384. P = 115008.
constexpr Bytes kParams = 16384 + 2 * 41088 + 64 + 16384;

// Bytes of `cat` alive after the last op of (iteration, phase, micro-batch) that matches, and
// how many bytes of `cat` were allocated by ops of that iteration and phase.
struct Gauge {
  Bytes alive_after = 0;
  Bytes allocated = 0;
};
Gauge Measure(const Program& p, Category cat, int iteration, Phase phase, int mb) {
  std::map<TensorId, Bytes> alive;
  Gauge g;
  for (const Op& op : p.ops) {
    const bool match = op.iteration == iteration && op.phase == phase && op.micro_batch == mb;
    for (const TensorAlloc& a : op.allocs) {
      if (a.category != cat) continue;
      alive[a.id] = a.size_bytes;
      if (match) g.allocated += a.size_bytes;
    }
    for (TensorId id : op.frees) alive.erase(id);
    if (match) {
      g.alive_after = 0;
      for (const auto& [id, bytes] : alive) g.alive_after += bytes;
    }
  }
  return g;
}

TEST_CASE("plain PyTorch, zero_grad(set_to_none=True): gradients made in each first backward",
          "[workload][pytorch]") {
  const Program p = Build(TinyPyTorch(true), 0);
  // After micro-batch 0's backward every parameter has its fp32 .grad: 4 bytes × P. The
  // bf16 GEMM gradients and their fp32 casts of micro-batch 1 are added in place and freed.
  for (int k = 1; k <= 3; ++k) {
    CHECK(Measure(p, Category::kGradients, k, Phase::kBackward, 0).alive_after == 4 * kParams);
    CHECK(Measure(p, Category::kGradients, k, Phase::kBackward, 1).alive_after == 4 * kParams);
  }
  // zero_grad at the start of iterations 2 and 3 frees them all: the forward of micro-batch 0
  // runs without gradients.
  CHECK(Measure(p, Category::kGradients, 2, Phase::kForward, 0).alive_after == 0);
  CHECK(Measure(p, Category::kGradients, 3, Phase::kForward, 0).alive_after == 0);
  // Adam (foreach) state: exp_avg and exp_avg_sq in fp32, 8 × P, made in iteration 1's step
  // only.
  CHECK(Measure(p, Category::kOptimizerStates, 1, Phase::kOptimizerStep, -1).allocated ==
        8 * kParams);
  CHECK(Measure(p, Category::kOptimizerStates, 2, Phase::kOptimizerStep, -1).allocated == 0);
  CHECK(Measure(p, Category::kOptimizerStates, 3, Phase::kOptimizerStep, -1).alive_after ==
        8 * kParams);
  // No main parameters and no wrapper buffers: parameters stay P fp32 tensors.
  CHECK(Measure(p, Category::kMainParameters, 3, Phase::kOptimizerStep, -1).alive_after == 0);
  CHECK(Measure(p, Category::kParameters, 3, Phase::kOptimizerStep, -1).alive_after == 4 * kParams);
}

TEST_CASE("plain PyTorch, fp32 weights under bf16 autocast: a bf16 copy of each GEMM weight",
          "[workload][pytorch]") {
  const Program p = Build(TinyPyTorch(true), 0);
  // The linears cast their weights (autocast cached_cast): per layer qkv 12288 + proj 4096 +
  // fc1 16384 + fc2 8192 = 40960 elements, two layers 81920, output layer 16384: 98304
  // elements, 2 bytes each, alive from each GEMM's forward to its backward. Norms and the
  // embedding lookup are not cast.
  constexpr Bytes kCopies = 2 * (2 * 40960 + 16384);
  Bytes copies_after_forward = 0, peak = 0, alive = 0;
  std::map<TensorId, Bytes> sizes;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.find(".autocast_copy") == std::string::npos) continue;
      CHECK(a.category == Category::kActivations);
      sizes[a.id] = a.size_bytes;
      alive += a.size_bytes;
    }
    peak = std::max(peak, alive);
    for (TensorId id : op.frees) {
      auto it = sizes.find(id);
      if (it != sizes.end()) alive -= it->second;
    }
    if (op.iteration == 1 && op.micro_batch == 0 && op.phase == Phase::kForward) {
      copies_after_forward = alive;
    }
  }
  CHECK(copies_after_forward == kCopies);
  CHECK(peak == kCopies);  // one micro-batch's copies at a time (forward, backward, forward...)
  CHECK(alive == 0);       // every copy released by its GEMM's backward
}

// Bytes of every tensor whose label contains `part`, allocated over the whole program.
Bytes AllocatedWith(const Program& p, const std::string& part) {
  Bytes sum = 0;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs)
      sum += a.label.find(part) != std::string::npos ? a.size_bytes : 0;
  }
  return sum;
}

TEST_CASE("plain PyTorch: weight copies only when autocast's dtype is not the weights'",
          "[workload][pytorch]") {
  config::Setup s = TinyPyTorch(true);
  s.training.train_iters = 1;
  s.training.global_batch_size = 1;
  // bf16 weights, no autocast (precision fp32): everything runs in bf16, nothing is cast.
  s.training.pytorch()->torch_dtype = config::Precision::kBf16;
  s.training.precision = config::Precision::kFp32;
  CHECK(ComputeDims(s).act_bytes == 2);
  CHECK(AllocatedWith(Build(s, 0), ".autocast_copy") == 0);
  // bf16 weights under bf16 autocast: the same dtype, no copies.
  s.training.precision = config::Precision::kBf16;
  CHECK(AllocatedWith(Build(s, 0), ".autocast_copy") == 0);
  // fp16 weights under bf16 autocast: two 2-byte dtypes, still a cast per GEMM weight: the
  // 98304 elements of the test above, 2 bytes each, once (one micro-batch).
  s.training.pytorch()->torch_dtype = config::Precision::kFp16;
  CHECK(AllocatedWith(Build(s, 0), ".autocast_copy") == 2 * (2 * 40960 + 16384));
}

TEST_CASE("plain PyTorch: torch.optim.Adam's L2 weight decay makes a gradient-sized list",
          "[workload][pytorch]") {
  config::Setup s = TinyPyTorch(true);
  s.training.train_iters = 1;
  s.training.weight_decay = 0.01;
  // AdamW (decoupled): no such list.
  CHECK(AllocatedWith(Build(s, 0), "optim.decayed_grad.") == 0);
  // Adam with weight decay (_multi_tensor_adam: _foreach_add(grads, params, alpha=wd)): one
  // tensor per parameter in the parameters' dtype, fp32 here: 4 × P bytes.
  s.training.pytorch()->adam_coupled_weight_decay = true;
  CHECK(AllocatedWith(Build(s, 0), "optim.decayed_grad.") == 4 * kParams);
  s.training.weight_decay = 0.0;
  CHECK(AllocatedWith(Build(s, 0), "optim.decayed_grad.") == 0);
}

TEST_CASE("plain PyTorch, zero_grad(set_to_none=False): gradients kept across iterations",
          "[workload][pytorch]") {
  const Program p = Build(TinyPyTorch(false), 0);
  // Made once, in iteration 1's first backward; zeroed in place afterwards.
  CHECK(Measure(p, Category::kGradients, 1, Phase::kBackward, 0).alive_after == 4 * kParams);
  CHECK(Measure(p, Category::kGradients, 2, Phase::kForward, 0).alive_after == 4 * kParams);
  CHECK(Measure(p, Category::kGradients, 3, Phase::kBackward, 1).alive_after == 4 * kParams);
  CHECK(Measure(p, Category::kOptimizerStates, 2, Phase::kOptimizerStep, -1).allocated == 0);
}

TEST_CASE("plain PyTorch with bf16 weights: bf16 grads and bf16 Adam state",
          "[workload][pytorch]") {
  config::Setup s = TinyPyTorch(true);
  s.training.pytorch()->torch_dtype = config::Precision::kBf16;
  const Program p = Build(s, 0);
  // 2 bytes per element everywhere: .grad 2 × P, state 2 × 2 × P.
  CHECK(Measure(p, Category::kGradients, 1, Phase::kBackward, 0).alive_after == 2 * kParams);
  CHECK(Measure(p, Category::kOptimizerStates, 1, Phase::kOptimizerStep, -1).allocated ==
        4 * kParams);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  CHECK(st.parameter_bytes == 2 * kParams);
  CHECK(st.gradient_bytes == 2 * kParams);
  CHECK(st.main_param_bytes == 0);
  CHECK(st.optimizer_state_bytes == 4 * kParams);
}

// transformers' Trainer._inner_training_loop calls model.zero_grad() right after
// optimizer.step() (FrameworkFacts::zero_grad_after_step); a plain PyTorch loop zeroes at the
// next iteration's start. TinyPyTorch's model has P = kParams parameters under either stack
// (Transformers' separate q/k/v projections hold the fused qkv's 3·64·64 elements), fp32 .grad.
TEST_CASE("hf-trainer: model.zero_grad() after the step frees the gradients before the reading",
          "[workload][hf]") {
  config::Setup s = TinyPyTorch(true);
  const Program plain = Build(s, 0);
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  const Program trainer = Build(s, 0);
  for (int k = 1; k <= 3; ++k) {
    // Both hold every .grad after the last micro-batch's backward: 4 bytes × P.
    CHECK(Measure(trainer, Category::kGradients, k, Phase::kBackward, 1).alive_after ==
          4 * kParams);
    // After the step: the Trainer has freed them all, plain PyTorch keeps them until its
    // zero_grad at the next iteration's start.
    CHECK(Measure(trainer, Category::kGradients, k, Phase::kOptimizerStep, -1).alive_after == 0);
    CHECK(Measure(plain, Category::kGradients, k, Phase::kOptimizerStep, -1).alive_after ==
          4 * kParams);
  }
  SECTION("before PyTorch 2.0 Module.zero_grad zeroes in place: the gradients stay") {
    s.training.pytorch()->zero_grad_set_to_none = false;
    CHECK(Measure(Build(s, 0), Category::kGradients, 2, Phase::kOptimizerStep, -1).alive_after ==
          4 * kParams);
  }
}

// bitsandbytes optimizers (optimizer.h BnbStateBytes) under the Trainer, on TinyPyTorch's model:
// embed_tokens and lm_head [256, 64] 16384 elements each; per layer q/k/v/o_proj 4096 each,
// gate/up/down_proj 8192 each, two norms of 64; the final norm 64. Tensors of at least
// min_8bit_size 4096 elements get 8-bit state: 16384 · 2 + 2 · (4 · 4096 + 3 · 8192) = 114688
// elements; the five norms (320 elements) keep fp32 state.
config::Setup TinyTrainerBnb(int bits, bool paged, int states) {
  config::Setup s = TinyPyTorch(true);
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  s.training.optimizer_impl = config::OptimizerImpl::kFused;
  s.training.hf_trainer()->bnb_optimizer = {bits, paged, states};
  return s;
}

Bytes ProgramManagedBytes(const Program& p) {
  Bytes sum = 0;
  for (const Op& op : p.ops) sum += op.managed_bytes;
  return sum;
}

TEST_CASE("hf-trainer adamw_bnb_8bit: uint8 state, fp32 absmax per 256, fp32 below 4096",
          "[workload][hf][optim]") {
  const config::Setup s = TinyTrainerBnb(8, false, 2);
  // Two uint8 states of the 114688 8-bit elements, two fp32 states of the 320 others:
  // 2 · 114688 + 2 · 4 · 320 = 231936. Absmax blocks of 256: 16384 → 64, 4096 → 16, 8192 → 32;
  // 64 + 2 · (4 · 16 + 3 · 32) + 64 = 448 blocks, two fp32 each: 3584. The two 256-value fp32
  // quantisation maps: 2048. 237568 in all.
  constexpr Bytes kState = 231936 + 3584 + 2048;
  const Program p = Build(s, 0);
  CHECK(Measure(p, Category::kOptimizerStates, 1, Phase::kOptimizerStep, -1).allocated == kState);
  CHECK(Measure(p, Category::kOptimizerStates, 2, Phase::kOptimizerStep, -1).allocated == 0);
  CHECK(Measure(p, Category::kTemporaries, 1, Phase::kOptimizerStep, -1).allocated == 0);
  CHECK(ProgramManagedBytes(p) == 0);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  CHECK(st.optimizer_state_bytes == kState);
  CHECK(st.managed_optimizer_state_bytes == 0);
  // 32-bit bitsandbytes state is fp32 whatever the parameter's dtype: 2 · 4 · P, no absmax.
  const config::Setup s32 = TinyTrainerBnb(32, false, 2);
  CHECK(ComputeStaticSizes(s32, 0).optimizer_state_bytes == 8 * kParams);
  // Lion keeps one state and moves only the signed map: 114688 + 4 · 320 + 448 · 4 + 1024.
  const config::Setup lion = TinyTrainerBnb(8, false, 1);
  CHECK(ComputeStaticSizes(lion, 0).optimizer_state_bytes == 114688 + 1280 + 1792 + 1024);
}

TEST_CASE("hf-trainer paged_adamw: states of 1e5 elements or more in unified memory",
          "[workload][hf][optim]") {
  config::Setup s = TinyTrainerBnb(8, true, 2);
  s.model.vocab_size = 2048;  // embed_tokens and lm_head [2048, 64]: 131072 elements each
  // Paged (get_paged, >= 1e5 elements): both states of embed_tokens and lm_head, uint8:
  // 2 · 2 · 131072 = 524288 bytes of unified memory. On the device: the layers' 8-bit states
  // 2 · 81920, the norms' fp32 states 2 · 4 · 320 = 2560, every absmax (paged tensors' too:
  // torch.zeros) 2 · 4 · (512 + 512 + 2 · 160) = 10752, the maps 2048: 179200.
  const Program p = Build(s, 0);
  CHECK(ProgramManagedBytes(p) == 524288);
  CHECK(Measure(p, Category::kOptimizerStates, 1, Phase::kOptimizerStep, -1).allocated == 179200);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  CHECK(st.optimizer_state_bytes == 179200);
  CHECK(st.managed_optimizer_state_bytes == 524288);
  for (const Op& op : p.ops) {
    if (op.managed_bytes != 0) CHECK((op.iteration == 1 && op.phase == Phase::kOptimizerStep));
  }
  // paged_adamw_32bit: fp32 states, the same two tensors paged: 2 · 2 · 4 · 131072.
  s.training.hf_trainer()->bnb_optimizer.optim_bits = 32;
  CHECK(ProgramManagedBytes(Build(s, 0)) == 2097152);
}

// LLM.int8 base weights (quantization_config load_in_8bit; hf_peft.h Int8WeightBytes,
// kernels.cc Int8MatmulForward) under a LoRA adapter on q_proj, bf16 weights and autocast, one
// micro-batch of T = 32 tokens, one iteration, no checkpointing: each linear runs forward and
// backward once.
TEST_CASE("hf-trainer load_in_8bit: int8 weights with row scales, each GEMM quantises its input",
          "[workload][hf][peft]") {
  config::Setup s = TinyPyTorch(true);
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  s.training.global_batch_size = 1;
  s.training.train_iters = 1;
  config::HfTrainerOptions& hf = *s.training.hf_trainer();
  hf.torch_dtype = config::Precision::kBf16;
  hf.lora_r = 2;
  hf.lora_target_modules = {"q_proj"};
  hf.load_in_8bit = true;
  // Int8Params: int8 [out, in] plus fp32 SCB [out]. q/k/v/o_proj [64, 64]: 4096 + 256; gate and
  // up_proj [128, 64]: 8192 + 512; down_proj [64, 128]: 8192 + 256; 43264 a layer, 86528 for
  // two. bf16: embed_tokens, lm_head 2 · 16384 and five norms 320: 66176. fp32 adapters
  // (autocast_adapter_dtype) lora_A [2, 64] and lora_B [64, 2] per layer: 2 · 256 · 4 = 2048.
  CHECK(ComputeStaticSizes(s, 0).parameter_bytes == 86528 + 66176 + 2048);
  const Program p = Build(s, 0);
  const std::string q = "layer0.self_attn.q_proj.weight";
  // MatMul8bitLt.forward over the bf16 input [32, 64]: its fp16 cast 2 · 32 · 64, CA int8
  // 32 · 64, SCA fp32 4 · 32; the int32 product [32, 64] 4 · 2048 and its fp16 dequant 2 · 2048.
  CHECK(AllocatedWith(p, q + ".input_fp16") == 4096);
  CHECK(AllocatedWith(p, q + ".input_int8") == 2048);
  CHECK(AllocatedWith(p, q + ".input_scale") == 128);
  CHECK(AllocatedWith(p, q + ".out_int32") == 8192);
  CHECK(AllocatedWith(p, q + ".out_fp16") == 4096);
  // Backward (input grad only): CB.to(bf16) [64, 64] 8192 and the fp32 scale [64] 256.
  CHECK(AllocatedWith(p, q + ".dequantized") == 8192);
  CHECK(AllocatedWith(p, q + ".row_scale") == 256);
  // gate_proj [128, 64]: the product [32, 128] in int32.
  CHECK(AllocatedWith(p, "layer1.mlp.gate_proj.weight.out_int32") == 4 * 32 * 128);
}

// optim "adafactor": transformers.optimization.Adafactor as the Trainer builds it (beta1 None,
// so no exp_avg). Its state, fp32, is made in the first step, per parameter: a parameter of two
// or more dimensions keeps exp_avg_sq_row [shape[:-1]] and exp_avg_sq_col [shape[-1]], a 1-D
// one exp_avg_sq of its size, and each a 0-dim RMS tensor (4 bytes; later steps store a new one
// of the same size in its place, which memsim keeps as the same tensor).
// TinyPyTorch's model under hf-trainer, in Transformers' layout (rows + columns, or the
// length): embed_tokens [256, 64]: 256 + 64 = 320; per layer input_layernorm [64]: 64, q_proj,
// k_proj, v_proj, o_proj [64, 64]: 4 × 128, post_attention_layernorm [64]: 64, gate_proj and
// up_proj [128, 64]: 2 × 192, down_proj [64, 128]: 192 → 1216 a layer; norm [64]: 64; lm_head
// [256, 64]: 320. 320 + 2·1216 + 64 + 320 = 3136 elements, 12,544 bytes; 21 parameters, 21 RMS
// scalars: 84 bytes.
// The step's temporaries for the fp32 [256, 64] weights (the largest): grad**2 and the update (+ eps) are
// both alive, then _approx_sq_grad's r_factor [256] and c_factor [64] with the new update
// while the old one is, then `-update` next to it: at most 4 · (2 · 16384 + 256 + 64) bytes.
TEST_CASE("hf-trainer adafactor: factored fp32 state made in the first step",
          "[workload][hf][optim]") {
  config::Setup s = TinyPyTorch(true);
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  s.training.optimizer = config::OptimizerKind::kAdafactor;
  s.training.optimizer_impl = config::OptimizerImpl::kFused;
  constexpr Bytes kState = 4 * 3136 + 4 * 21;
  CHECK(ComputeStaticSizes(s, 0).optimizer_state_bytes == kState);
  const Program p = Build(s, 0);
  CHECK(Measure(p, Category::kOptimizerStates, 1, Phase::kBackward, 1).alive_after == 0);
  CHECK(Measure(p, Category::kOptimizerStates, 1, Phase::kOptimizerStep, -1).alive_after == kState);
  const Gauge second = Measure(p, Category::kOptimizerStates, 2, Phase::kOptimizerStep, -1);
  CHECK(second.allocated == 0);
  CHECK(second.alive_after == kState);
  Bytes now = 0, peak = 0;
  std::map<TensorId, Bytes> alive;
  for (const Op& op : p.ops) {
    if (op.iteration != 2 || op.phase != Phase::kOptimizerStep) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.category != Category::kTemporaries) continue;
      alive[a.id] = a.size_bytes;
      now += a.size_bytes;
    }
    peak = std::max(peak, now);
    for (TensorId id : op.frees) {
      auto it = alive.find(id);
      if (it == alive.end()) continue;
      now -= it->second;
      alive.erase(it);
    }
  }
  CHECK(peak == 4 * (2 * 16384 + 256 + 64));
  CHECK(now == 0);
}

// BERT under the Hugging Face Trainer (modeling_bert.py; PaperGpt's sizes: h 1024, a 16,
// ffn 4096, dropout 0.1, LayerNorm, biases; seq 512, micro-batch 2, so T = 1024 tokens and
// b·a·s² = 8,388,608 score elements), eager attention, fp32 weights; autocast: fp16 autocast.
config::Setup TinyBert(bool autocast) {
  config::Setup s = testing::PaperGpt();
  s.model.model_type = "bert";
  s.model.type_vocab_size = 2;
  s.model.sequence_classification = true;
  s.model.tie_word_embeddings = false;
  s.model.vocab_size = 1024;
  s.model.max_position_embeddings = 512;
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  s.training.seq_length = 512;
  s.training.precision = autocast ? config::Precision::kFp16 : config::Precision::kFp32;
  s.training.pytorch()->torch_dtype = config::Precision::kFp32;
  s.training.gradient_accumulation_fusion = false;
  s.training.train_iters = 2;
  return s;
}

TEST_CASE("hf-trainer BERT: saved tensors of one layer in fp32 and under fp16 autocast",
          "[workload][hf]") {
  constexpr Bytes kT = 1024, kH = 1024, kScores = 8388608;
  // fp32, per layer (modeling_bert.py): the layer input read by query / key / value, q, k, v,
  // the context read by BertSelfOutput.dense, the residual sum LayerNorm saves, the attention
  // output read by BertIntermediate.dense, the dense output GeLU saves, GeLU's output read by
  // BertOutput.dense, the second residual sum: 16 [T, h] fp32 tensors; two bool dropout masks
  // [T, h]; softmax's output, the bool dropout mask and the dropped probabilities read by the
  // matmul with V: 9 bytes a score; two LayerNorms' mean and rstd, fp32 [T] each.
  const Bytes fp32 = 16 * 4 * kT * kH + 2 * kT * kH + 9 * kScores + 4 * 4 * kT;
  CHECK(testing::LayerSavedBytes(Build(TinyBert(false), 0), 2, 0, 1) == fp32);
  // fp16 autocast over fp32 weights (aten/src/ATen/autocast_mode.cpp: linear and matmul in the
  // lower-precision list, layer_norm and softmax in the fp32 list; an fp16 + fp32 add promotes
  // to fp32; the additive mask is fp32, modeling_utils.py get_extended_attention_mask):
  //   fp16 [T, h]: three casts of the fp32 layer input (query, key, value each cast it; autocast
  //   caches weight casts only), q, k, v, the context, the cast of the attention output read by
  //   BertIntermediate.dense: 8 × 2 bytes; the dense output and GeLU's output [T, 4h] fp16:
  //   2 × 4 × 2 bytes; the two residual sums fp32: 2 × 4 bytes; two bool masks: 2 × 1 byte.
  //   So 16 + 16 + 8 + 2 = 42 bytes per T·h element. The fp32 LayerNorm outputs are no longer
  //   saved: only their fp16 casts are.
  //   Scores: softmax's fp32 output, the bool mask, and the fp16 cast of the fp32 dropped
  //   probabilities that matmul(probs, V) saves: 4 + 1 + 2 = 7 bytes.
  //   The cached fp16 weight copies of the layer (query, key, value, dense: 4h²; intermediate
  //   and output dense: 8h²): 12 h² × 2 bytes. Norm statistics as in fp32.
  const Bytes amp = 42 * kT * kH + 7 * kScores + 24 * kH * kH + 4 * 4 * kT;
  CHECK(testing::LayerSavedBytes(Build(TinyBert(true), 0), 2, 0, 1) == amp);

  SECTION("PyTorch before 1.11: softmax also saves its input") {
    // tools/autograd/derivatives.yaml before pytorch/pytorch#66018 (first in 1.11): _softmax's
    // formula is _softmax_backward_data(grad, result, dim, self), so SoftmaxBackward keeps self,
    // the masked scores, as well as the output. They are fp32 in both runs (fp32 weights; under
    // autocast the fp32 additive mask promotes the fp16 scaled scores): 4 bytes a score more.
    for (bool autocast : {false, true}) {
      config::Setup s = TinyBert(autocast);
      s.training.hf_trainer()->softmax_saves_input = true;
      CHECK(testing::LayerSavedBytes(Build(s, 0), 2, 0, 1) ==
            (autocast ? amp : fp32) + 4 * kScores);
    }
  }
}

}  // namespace
}  // namespace memsim::workload
