// Transformers' decoder modules (modules/hf_decoder.h, framework "hf-trainer") run alone on the
// module harness, counted by hand from modeling_llama.py and PyTorch's autograd formulas
// (tools/autograd/derivatives.yaml).
//
// Shape: testing::TinyLlama with 2 KV heads: h 64, a 4 heads of dh 16 (q = 64), g 2
// (kv = 32), intermediate 128 (SwiGLU), s 32, b 1: T = 32 tokens; no biases. Weights loaded in
// bf16 (torch_dtype bfloat16) under bf16 autocast: every tensor of the residual stream, the
// linears and sdpa is bf16 (2 bytes), no autocast copies. attn_implementation "sdpa" on a GPU
// (the flash backend for 16-bit). No wgrad fusion (plain PyTorch).
#include "workload/modules/hf_decoder.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "workload/hf_peft.h"
#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::hf_decoder_module_test {

using testing::ModuleHarness;
using testing::SeenTensors;

constexpr Bytes kT = 32, kH = 64, kQ = 64, kKv = 32, kFfn = 128, kHeads = 4;

config::Setup BfloatHfLlama() { return testing::TinyHfLlama(config::Precision::kBf16); }

TEST_CASE(
    "Llama MLP under the Trainer saves the fp32 norm input, the norm output and the four "
    "[T, ffn] tensors of the gated MLP",
    "[workload][modules][hf_decoder]") {
  ModuleHarness h(BfloatHfLlama());
  HfMlpModule mlp;
  h.Forward(mlp);
  CHECK(h.Saved() == SeenTensors{
                         // LlamaRMSNorm: hidden_states.to(float32), saved by pow (4·T·h); rsqrt's
                         // result, fp32 [T] (4·T); .to(bf16) of the normalized rows, saved by the
                         // weight's mul (2·T·h); weight · that, saved by gate_proj and up_proj.
                         {"layer0.post_attention_layernorm.input_fp32", 4 * kT * kH},
                         {"layer0.post_attention_layernorm.rstd", 4 * kT},
                         {"layer0.post_attention_layernorm.normed", 2 * kT * kH},
                         {"layer0.post_attention_layernorm.out", 2 * kT * kH},
                         // LlamaMLP: gate_proj's output (SiLU's input), act_fn's output and
                         // up_proj's output (the mul's factors), the product (down_proj's
                         // input): [T, ffn] each, 2·T·ffn.
                         {"layer0.mlp.gate_proj.out", 2 * kT * kFfn},
                         {"layer0.mlp.act_out", 2 * kT * kFfn},
                         {"layer0.mlp.up_proj.out", 2 * kT * kFfn},
                         {"layer0.mlp.act_mul_up", 2 * kT * kFfn},
                     });
  CHECK(h.problems().empty());
}

TEST_CASE(
    "Llama MLP backward frees all it saved and hands down, up and gate projections' grads "
    "then the norm's to the wrapper",
    "[workload][modules][hf_decoder]") {
  ModuleHarness h(BfloatHfLlama());
  HfMlpModule mlp;
  h.Forward(mlp);
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
  // The engine runs down_proj's MmBackward first, then the mul's (up_proj made after act_fn, so
  // first), then gate_proj, then the norm: [h, ffn] or [ffn, h] in bf16 (2·h·ffn), the norm
  // weight [h] (2·h).
  CHECK(h.wrapper().grads() == SeenTensors{{"layer0.mlp.down_proj.weight", 2 * kH * kFfn},
                                           {"layer0.mlp.up_proj.weight", 2 * kFfn * kH},
                                           {"layer0.mlp.gate_proj.weight", 2 * kFfn * kH},
                                           {"layer0.post_attention_layernorm.weight", 2 * kH}});
  // torch GEMMs: cuBLAS's workspace for the forward's thread and one for the autograd engine's
  // (8 × 4 MiB each on sm >= 90; aten/src/ATen/cuda/CublasHandlePool.cpp).
  CHECK(h.Alive(Category::kWorkspace) ==
        SeenTensors{{"workspace.cublas", 32 * kMiB}, {"workspace.cublas_autograd", 32 * kMiB}});
}

TEST_CASE(
    "Llama attention under the Trainer saves the norm, v, the rotated q and k, and sdpa's "
    "output and logsumexp",
    "[workload][modules][hf_decoder]") {
  ModuleHarness h(BfloatHfLlama());
  HfAttentionModule attention;
  h.Forward(attention);
  CHECK(h.Saved() == SeenTensors{
                         // input_layernorm, as the MLP's norm above.
                         {"layer0.input_layernorm.input_fp32", 4 * kT * kH},
                         {"layer0.input_layernorm.rstd", 4 * kT},
                         {"layer0.input_layernorm.normed", 2 * kT * kH},
                         {"layer0.input_layernorm.out", 2 * kT * kH},
                         // v_proj's output [T, kv] goes to sdpa unchanged (2·T·kv); q_proj's
                         // and k_proj's are dropped once apply_rotary_pos_emb made q_embed
                         // [T, q] and k_embed [T, kv] (cos and sin need no grad).
                         {"layer0.self_attn.v_proj.out", 2 * kT * kKv},
                         {"layer0.self_attn.q_embed", 2 * kT * kQ},
                         {"layer0.self_attn.k_embed", 2 * kT * kKv},
                         // _scaled_dot_product_flash_attention: its output [b, s, a, dh] (also
                         // o_proj's input, 2·T·q) and logsumexp fp32 [b, a, s] (4·b·a·s).
                         {"layer0.self_attn.attn_output", 2 * kT * kQ},
                         {"layer0.self_attn.logsumexp", 4 * kHeads * kT},
                     });
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
  // o_proj first (the last op of forward), then v, k, q in the engine's order, then the norm.
  CHECK(h.wrapper().grads().size() == 5);
  CHECK(h.wrapper().grads().front() ==
        testing::SeenTensor{"layer0.self_attn.o_proj.weight", 2 * kH * kQ});
  CHECK(h.wrapper().grads().back() == testing::SeenTensor{"layer0.input_layernorm.weight", 2 * kH});
}

TEST_CASE(
    "LoRA on a bf16 q_proj under autocast: the fp32 cast of x lives until the layer's forward "
    "returns and lora_A saves autocast's bf16 copy of it",
    "[workload][modules][hf_decoder][peft][lifetimes]") {
  ModuleHarness h(BfloatHfLlama());
  // PEFT as get_peft_model leaves it (hf_peft.h): q_proj's weight frozen, one adapter r = 4 on
  // it, fp32 (autocast_adapter_dtype), no dropout.
  PeftKernels peft;
  peft.r = 4;
  peft.adapter_bytes = 4;
  peft.frozen = {"layer0.self_attn.q_proj.weight"};
  const std::string a = "layer0.self_attn.q_proj.lora_A.weight";
  const std::string b = "layer0.self_attn.q_proj.lora_B.weight";
  peft.adapters["layer0.self_attn.q_proj.weight"] = {LoraAdapter{a, b, kH, kQ}};
  h.kernels().SetPeft(&peft);
  HfAttentionModule attention;
  h.Forward(attention);
  // peft tuners/lora/layer.py Linear.forward: `x = self._cast_input_dtype(x, torch.float32)`
  // (4·T·h), the local held until forward returns; lora_A under bf16 autocast casts it back and
  // saves that copy (2·T·h); lora_A's output [T, r] (2·T·r), saved by lora_B; lora_B's output
  // and its scaled copy [T, q] (2·T·q each) are transients.
  const SeenTensors during = h.AliveDuring("self_attn.q_proj");
  for (const testing::SeenTensor& t :
       {testing::SeenTensor{a + ".input_cast", 4 * kT * kH},
        testing::SeenTensor{a + ".input_autocast_copy", 2 * kT * kH},
        testing::SeenTensor{a + ".out", 2 * kT * 4}, testing::SeenTensor{b + ".out", 2 * kT * kQ},
        testing::SeenTensor{b + ".scaled", 2 * kT * kQ}}) {
    CHECK(std::find(during.begin(), during.end(), t) != during.end());
  }
  CHECK(h.FreedIn(a + ".input_cast") == "self_attn.q_proj");
  const SeenTensors saved = h.Saved();
  CHECK(std::find(saved.begin(), saved.end(),
                  testing::SeenTensor{a + ".input_autocast_copy", 2 * kT * kH}) != saved.end());
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

// QLoRA after peft's prepare_model_for_kbit_training: bf16 weights loaded in 4 bits for the
// decoder's linears, the norms cast to fp32, bf16 autocast: the residual stream is fp32
// (hf_peft.h KbitWideResidual: ModelDims::wide_bytes 4).
config::Setup KbitHfLlama() {
  config::Setup s = BfloatHfLlama();
  auto& hf = std::get<config::HfTrainerOptions>(s.training.stack);
  hf.load_in_4bit = true;
  hf.kbit_prepared = true;
  return s;
}

PeftKernels FourBitMlp() {
  PeftKernels peft;
  for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
    const std::string name = std::string("layer0.mlp.") + w + ".weight";
    peft.frozen.insert(name);
    peft.four_bit.insert(name);
  }
  peft.frozen.insert("layer0.post_attention_layernorm.weight");
  return peft;
}

TEST_CASE(
    "QLoRA MLP after prepare_model_for_kbit_training: the 4-bit linears return fp32, so the "
    "gate, up and activation it saves are fp32",
    "[workload][modules][hf_decoder][peft]") {
  ModuleHarness h(KbitHfLlama());
  REQUIRE(h.dims().wide_bytes == 4);
  const PeftKernels peft = FourBitMlp();
  h.kernels().SetPeft(&peft);
  HfMlpModule mlp;
  h.Forward(mlp);
  CHECK(h.Saved() == SeenTensors{
                         // LlamaRMSNorm over the fp32 stream: no fp32 copy of x (pow saves x
                         // itself, the caller's); rsqrt's result fp32 [T] (4·T); the frozen fp32
                         // weight's mul saves nothing, and `weight * hidden.to(fp32)` is fp32.
                         {"layer0.post_attention_layernorm.rstd", 4 * kT},
                         // Linear4bit.forward: x.to(bf16) (a transient), the bf16 product, then
                         // `out.to(inp_dtype)`: gate_proj's output fp32 [T, ffn] (4·T·ffn), saved
                         // by SiLU; act_fn's fp32 output and up_proj's fp32 output, saved by the
                         // mul. MatMul4Bit saves no input (ctx.tensors = (None, B)), so the
                         // product goes when down_proj returns.
                         {"layer0.mlp.gate_proj.out_wide", 4 * kT * kFfn},
                         {"layer0.mlp.act_out", 4 * kT * kFfn},
                         {"layer0.mlp.up_proj.out_wide", 4 * kT * kFfn},
                     });
  // down_proj casts the fp32 product to bf16 (2·T·ffn), returns its [T, h] output as fp32.
  const SeenTensors during = h.AliveDuring("mlp.down_proj");
  CHECK(std::find(during.begin(), during.end(),
                  testing::SeenTensor{"layer0.mlp.down_proj.input_cast", 2 * kT * kFfn}) != during.end());
  CHECK(h.FreedIn("layer0.mlp.down_proj.input_cast") == "mlp.down_proj.to_input_dtype");
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE(
    "QLoRA attention after prepare_model_for_kbit_training: fp32 q, k, v from the 4-bit "
    "projections are cast back to bf16 for sdpa",
    "[workload][modules][hf_decoder][peft]") {
  ModuleHarness h(KbitHfLlama());
  PeftKernels peft;
  for (const char* w : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    const std::string name = std::string("layer0.self_attn.") + w + ".weight";
    peft.frozen.insert(name);
    peft.four_bit.insert(name);
  }
  peft.frozen.insert("layer0.input_layernorm.weight");
  h.kernels().SetPeft(&peft);
  HfAttentionModule attention;
  h.Forward(attention);
  CHECK(h.Saved() == SeenTensors{
                         {"layer0.input_layernorm.rstd", 4 * kT},
                         // apply_rotary_pos_emb on the fp32 q and k: fp32 q_embed, k_embed; sdpa
                         // under autocast saves its bf16 copies of them and of the fp32 v (the
                         // fp32 ones go: nothing else keeps them).
                         {"layer0.self_attn.query_cast", 2 * kT * kQ},
                         {"layer0.self_attn.key_cast", 2 * kT * kKv},
                         {"layer0.self_attn.value_cast", 2 * kT * kKv},
                         // sdpa's bf16 output (o_proj's input: bf16, so o_proj returns bf16) and
                         // logsumexp fp32 [b, a, s].
                         {"layer0.self_attn.attn_output", 2 * kT * kQ},
                         {"layer0.self_attn.logsumexp", 4 * kHeads * kT},
                     });
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::hf_decoder_module_test
