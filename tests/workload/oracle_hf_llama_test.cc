// memsim's Program for the oracle's tiny Llama (tests/data/oracle/llama*.log, recorded by
// tools/oracle/record.py from transformers 4.36.0.dev0 0864dd3b and peft 0.7.1 on CPU, PyTorch
// 1.13, fp32, eager attention), lined up with the recorded log at each module boundary of the
// forward (and the checkpointed forward's re-run in backward), the loss, the end of backward and
// the optimizer step. Every difference is a row of a gap table below (oracle_log.h).
//
// Shape (record.py llama_model; test_setups.h TinyHfLlama): h 64, 4 heads of dh 16, 2 KV heads,
// ffn 128 (SwiGLU), 2 layers, vocab 256, untied; batch 1, sequence 32: T = 32 tokens. fp32 (4 B):
// T·h = 8192 B, T·kv = 4096 B, T·ffn = 16384 B, scores [1, 4, 32, 32] = 16384 B,
// logits T·vocab = 32768 B.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>

#include "workload/build.h"
#include "workload/oracle_log.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

using testing::GapReason;
using testing::GapRow;

config::Setup OracleLlama(const std::string& variant) {
  config::Setup s = testing::TinyHfLlama(config::Precision::kFp32);
  s.training.precision = config::Precision::kFp32;
  s.training.use_flash_attn = false;  // attn_implementation "eager" (sdpa needs torch >= 2.1.1)
  // transformers_version "4.36": the loss's shifted logits copy (setup.h loss_shift_copy).
  std::get<config::HfTrainerOptions>(s.training.stack).loss_shift_copy = true;
  if (variant == "ckpt") {
    s.training.recompute_granularity = config::RecomputeGranularity::kFull;
    s.training.recompute_method = config::RecomputeMethod::kUniform;
    s.training.recompute_num_layers = 1;
  }
  if (variant == "lora") {
    auto& hf = std::get<config::HfTrainerOptions>(s.training.stack);
    hf.lora_r = 8;
    hf.lora_alpha = 16;
    hf.lora_dropout = 0.1;
    hf.lora_target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                              "gate_proj", "up_proj", "down_proj"};
  }
  return s;
}

// record.py llama_qlora: bf16 weights, the decoder's linears in 4 bits (NF4 without double
// quantisation), peft's prepare_model_for_kbit_training (fp32 embedding, norms and lm_head;
// reentrant gradient checkpointing), LoRA r 8, alpha 16, dropout 0.1 on q/k/v/o_proj; the step
// under bf16 autocast.
config::Setup OracleQlora() {
  config::Setup s = OracleLlama("ckpt");
  s.training.precision = config::Precision::kBf16;
  s.training.pytorch()->torch_dtype = config::Precision::kBf16;
  auto& hf = std::get<config::HfTrainerOptions>(s.training.stack);
  hf.lora_r = 8;
  hf.lora_alpha = 16;
  hf.lora_dropout = 0.1;
  hf.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  hf.load_in_4bit = true;
  hf.kbit_prepared = true;
  return s;
}

bool OracleStartsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The ops of each Transformers module of the log: LlamaForCausalLM ("model": all but the data
// loader's and the caller's dropping of the output object, memsim's loss.compute_loss_return,
// which comes after the model's forward hook), the embedding, a decoder layer (by layer index), its submodules (by op-name prefix;
// the residual adds are the decoder layer's own), the final norm and lm_head.
bool OracleLlamaModuleOps(const std::string& module, const Op& op) {
  if (module == "model") {
    return op.name != "data.get_batch" && op.name != "zero_grad" &&
           op.name != "loss.compute_loss_return";
  }
  if (module == "embed_tokens") return OracleStartsWith(op.name, "embedding.");
  if (module == "norm") return op.name == "final_norm";
  if (module == "lm_head") return op.name == "output_layer";
  if (!OracleStartsWith(module, "layers.")) return false;
  const size_t dot = module.find('.', 7);
  const int layer = std::stoi(module.substr(7, dot - 7));
  if (op.layer != layer) return false;
  if (dot == std::string::npos) return true;
  const std::string sub = module.substr(dot + 1);
  const bool residual = op.name.size() > 9 && op.name.substr(op.name.size() - 9) == ".residual";
  return OracleStartsWith(op.name, sub + ".") && !residual;
}

void OracleCompare(const std::string& log_name, const config::Setup& setup,
                   const std::vector<GapRow>& table) {
  const auto log = testing::ReadOracleLog(log_name);
  const Program p = Build(setup, 0);
  const auto checks = testing::CheckAgainstTable(
      log, testing::MemsimAtBoundaries(p, log, OracleLlamaModuleOps), table);
  CHECK(checks.size() > 10);
  // MEMSIM_ORACLE_DUMP=1: one line per boundary with what the gap table leaves unexplained (for
  // updating the table after a change of memsim's lifetimes).
  if (std::getenv("MEMSIM_ORACLE_DUMP") != nullptr) {
    for (const auto& c : checks) {
      std::fprintf(stderr, "%s|%s|%lld|%lld|%lld\n", log_name.c_str(), c.label.c_str(),
                   static_cast<long long>(c.real), static_cast<long long>(c.memsim),
                   static_cast<long long>(c.real - c.memsim - c.explained));
    }
  }
  for (const auto& c : checks) {
    INFO(log_name << " | " << c.label << " | real " << c.real << " memsim " << c.memsim
                  << " explained " << c.explained << " unexplained "
                  << c.real - c.memsim - c.explained);
    CHECK(c.real - c.memsim == c.explained);
  }
}

std::string OracleL(int layer, const std::string& rest, const std::string& phase = "fwd") {
  return phase + " layers." + std::to_string(layer) + "." + rest;
}

// Rows every Llama log shares: what the recorder feeds and transformers 4.36's LlamaModel.forward
// makes once per forward (modeling_llama.py, 0864dd3b).
void OracleModelRows(std::vector<GapRow>& t, const std::string& last_model_boundary,
                     const std::string& last_tokens_boundary,
                     const std::string& first_layer = "fwd layers.0 pre",
                     const std::string& model_pre = "fwd model pre") {
  // memsim's data loader (embedding.cc data.get_batch): tokens 256, position_ids 256, labels 256
  // (int64 [1, 32]), loss_mask 128 (fp32); the recorder makes input_ids before the step and
  // passes them as labels too, and 4.36 computes the loss without a mask.
  // memsim frees them in its loss.compute_loss_return op, after the model's forward hook.
  t.push_back({"setup: memsim's position_ids and labels, freed after the loss", GapReason::kSetup,
               -512, model_pre,
               model_pre == "fwd model pre" ? "fwd model post" : "fwd lm_head post"});
  t.push_back({"setup: memsim's loss_mask, freed by its loss_bwd", GapReason::kSetup, -128,
               model_pre, "step loss post"});
  t.push_back({"setup: memsim's tokens, freed by its embedding.wgrad", GapReason::kSetup, -256,
               model_pre, last_tokens_boundary});
  // LlamaModel.forward: position_ids = torch.arange(...) when none are passed (int64 [1, 32]).
  t.push_back({"LlamaModel.forward's own position_ids (none passed)", GapReason::kSetup, 256,
               "fwd embed_tokens pre", last_model_boundary});
  // _prepare_4d_causal_attention_mask (modeling_attn_mask_utils.py): fp32 [1, 1, 32, 32], the
  // local attention_mask of LlamaModel.forward until it returns. 4.48 makes the same 4-D mask in
  // the model dtype for eager attention (LlamaModel._update_causal_mask,
  // _prepare_4d_causal_attention_mask_with_cache_position: torch.full); hf_decoder.h leaves it
  // out.
  t.push_back({"eager 4-D causal mask, not modelled (hf_decoder.h 'Not modelled')",
               GapReason::kMemsimShorter, 4096, first_layer, last_model_boundary});
}

// Rows of one decoder layer's forward with grad (full fine-tune), fp32 eager; `phase` "fwd", or
// "recompute" for a checkpointed layer's re-run; `end` the last compared boundary before the
// layer's backward frees what it saved.
void OracleLayerRows(std::vector<GapRow>& t, int l, const std::string& phase = "fwd",
                     const std::string& end = "step loss post") {
  const std::string tag = phase + " layer " + std::to_string(l);
  // LlamaRMSNorm.forward: variance = hidden_states.pow(2).mean(-1, keepdim=True). PyTorch 1.13's
  // MeanBackward1 saves its input (grad_fn._saved_self; the formula reads self.numel()), so the
  // pow output T·h·4 = 8192 lives until backward; later releases' formula (derivatives.yaml
  // mean.dim: mean_backward(grad, self.sym_sizes(), dim, self.sym_numel(), keepdim)) saves only
  // sizes, which memsim follows by freeing it at the mean.
  t.push_back({tag + " input_layernorm: pow output saved by 1.13's mean", GapReason::kVersion, 8192,
               OracleL(l, "input_layernorm post", phase), end});
  t.push_back({tag + " post_attention_layernorm: pow output saved by 1.13's mean",
               GapReason::kVersion, 8192, OracleL(l, "post_attention_layernorm post", phase), end});
  // use_cache (the config default; gradient checkpointing turns it off): 4.36's
  // LlamaAttention.forward returns `past_key_value = (key_states, value_states)`, k after RoPE
  // and v before repeat_kv, 2 · T·kv·4 = 8192 a layer, which the output object keeps until the
  // caller drops it: memsim's DynamicCache (hf_decoder.cc CacheKv), no row.
  // 4.36 LlamaAttention.forward: self.rotary_emb per layer, then cos[position_ids] and
  // sin[position_ids] ([1, 1, 32, 16] fp32, 2048 each), saved by the rotary muls. Current
  // transformers computes cos / sin once per forward (LlamaRotaryEmbedding at model level),
  // which memsim does not model either.
  t.push_back({tag + " per-layer rotary cos/sin (4.36)", GapReason::kVersion, 4096,
               OracleL(l, "self_attn post", phase), end});
  // attn_weights = matmul(q, k^T) / math.sqrt(head_dim): DivBackward0 saves the wrapped
  // 0-dim double (8 B).
  t.push_back({tag + " 0-dim scale saved by DivBackward0 (4.36)", GapReason::kVersion, 8,
               OracleL(l, "self_attn post", phase), end});
  // softmax(..., dtype=torch.float32).to(query_states.dtype): a no-op for fp32 weights; memsim
  // keeps a probs_fp32 and a probs tensor (16384 each).
  t.push_back({tag + " memsim's second probs tensor (.to is a no-op in fp32)",
               GapReason::kMemsimLonger, -16384, OracleL(l, "self_attn post", phase), end});
}

// LlamaForCausalLM.forward's loss (4.36): logits.float() (a no-op in fp32), shift_logits =
// logits[..., :-1, :].contiguous() and the labels' shift (views: with b = 1 both slices are
// contiguous), CrossEntropyLoss: log_softmax fp32 [31, 256] = 31744 (saved by
// NllLossBackward0), the loss and total_weight (4 B each): memsim's loss with
// transformers_version 4.36 (output_loss.cc HfCausalLmLossForward), no row. The output object
// (logits, cache) lives until the caller takes .loss and drops it: memsim's
// loss.compute_loss_return, after the model's forward hook, no row.
void OracleLossRows(std::vector<GapRow>& t, const std::string& after_norm) {
  // The final LlamaRMSNorm as the layers' (pow saved by 1.13's mean); x·rsqrt, saved by the
  // trained weight's mul, is memsim's final_norm.normed_fp32 (output_loss.cc HfFinalNormSaves).
  t.push_back({"final norm: pow output saved by 1.13's mean", GapReason::kVersion, 8192, after_norm,
               "step loss post"});
  // torch.optim.AdamW (1.13, foreach off) state["step"]: a 0-dim fp32 tensor per parameter, 21
  // here; in a GPU run they stay on the CPU.
  t.push_back({"AdamW step counters (CPU tensors)", GapReason::kSetup, 21 * 4,
               "step optimizer post", "step optimizer post"});
  // The recorder steps without the Trainer's model.zero_grad() after optimizer.step()
  // (transformers Trainer._inner_training_loop); memsim's hf-trainer frees the gradients there
  // (FrameworkFacts::zero_grad_after_step): 106,816 fp32 parameters' gradients (embedding and
  // lm_head 256 x 64 each, two layers of 36,992, the final norm's 64).
  t.push_back({"setup: gradients the recorder keeps after the step; the Trainer zeroes them",
               GapReason::kSetup, 106816 * 4, "step optimizer post", "step optimizer post"});
}

// One LoRA linear's dropout (peft tuners/lora/layer.py Linear.forward: result =
// base_layer(x); result += lora_B(lora_A(dropout(x))) * scaling). PyTorch 1.13's CPU dropout
// (ATen Dropout.cpp _dropout_impl) multiplies by an fp32 noise tensor, saved by the mul only
// when x requires grad; CUDA's native_dropout makes a bool mask (1 B an element) whatever x
// needs, which memsim models. `elems`: the elements of x.
void OracleLoraDropoutRow(std::vector<GapRow>& t, const std::string& name, std::int64_t elems,
                          bool x_requires_grad, const std::string& first) {
  const Bytes real = x_requires_grad ? 4 * elems : 0;
  t.push_back({name + ": CPU dropout noise (fp32, saved only if x needs grad) vs CUDA's bool mask",
               GapReason::kVersion, real - elems, first, "step loss post"});
}

void OracleLoraLayerRows(std::vector<GapRow>& t, int l) {
  const std::string tag = "lora layer " + std::to_string(l);
  // Layer 0's input (the frozen embedding's output) needs no grad: its input_layernorm saves
  // nothing; memsim keeps rstd (4·T = 128). Layer 1's input needs grad (through layer 0's LoRA):
  // the 1.13 pow row as in a full fine-tune, and rstd in both.
  if (l == 0) {
    t.push_back({tag + " input_layernorm: memsim keeps rstd though nothing needs grad",
                 GapReason::kMemsimLonger, -128, OracleL(l, "input_layernorm post"),
                 "step loss post"});
  } else {
    t.push_back({tag + " input_layernorm: pow output saved by 1.13's mean", GapReason::kVersion,
                 8192, OracleL(l, "input_layernorm post"), "step loss post"});
  }
  t.push_back({tag + " post_attention_layernorm: pow output saved by 1.13's mean",
               GapReason::kVersion, 8192, OracleL(l, "post_attention_layernorm post"),
               "step loss post"});
  t.push_back({tag + " per-layer rotary cos/sin (4.36)", GapReason::kVersion, 4096,
               OracleL(l, "self_attn post"), "step loss post"});
  t.push_back({tag + " 0-dim scale saved by DivBackward0 (4.36)", GapReason::kVersion, 8,
               OracleL(l, "self_attn post"), "step loss post"});
  t.push_back({tag + " memsim's second probs tensor (.to is a no-op in fp32)",
               GapReason::kMemsimLonger, -16384, OracleL(l, "self_attn post"), "step loss post"});
  // lora_B(...) * scaling with a Python float: MulBackward0 saves the wrapped 0-dim double (8 B),
  // one per LoRA linear (q, k, v, o; gate, up, down).
  t.push_back({tag + " attention LoRA: 0-dim scaling saved by MulBackward0", GapReason::kVersion,
               4 * 8, OracleL(l, "self_attn post"), "step loss post"});
  t.push_back({tag + " MLP LoRA: 0-dim scaling saved by MulBackward0", GapReason::kVersion, 3 * 8,
               OracleL(l, "mlp post"), "step loss post"});
  // T·h = 2048 elements for q, k, v, o, gate, up; T·ffn = 4096 for down. q, k, v's x is
  // input_layernorm's output (needs grad in layer 1 only); o's is the attention output, gate's
  // and up's post_attention_layernorm's, down's act_fn(gate)·up: all need grad.
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    OracleLoraDropoutRow(t, tag + " " + p, 2048, l == 1, OracleL(l, "self_attn post"));
  }
  OracleLoraDropoutRow(t, tag + " o_proj", 2048, true, OracleL(l, "self_attn post"));
  OracleLoraDropoutRow(t, tag + " gate_proj", 2048, true, OracleL(l, "mlp post"));
  OracleLoraDropoutRow(t, tag + " up_proj", 2048, true, OracleL(l, "mlp post"));
  OracleLoraDropoutRow(t, tag + " down_proj", 4096, true, OracleL(l, "mlp post"));
  // The norm outputs, which the frozen q/k/v (gate/up) weights do not save, live until
  // self_attn / mlp return (LlamaDecoderLayer.forward rebinds `hidden_states` then): memsim's
  // "<norm>_out.rebind" ops (hf_decoder.cc DropNormOutput), no row.
}

// The loss rows of a full fine-tune (OracleLossRows) less the final norm's, and AdamW's step
// counters for the 28 LoRA matrices.
void OracleLoraLossRows(std::vector<GapRow>& t) {
  // lm_head is frozen, so its matmul saves no input: the final norm's output goes with the
  // output object; memsim keeps it to output_layer_bwd.
  t.push_back({"final norm output: frozen lm_head saves nothing; memsim keeps it",
               GapReason::kMemsimLonger, -8192, "step loss post", "step loss post"});
  t.push_back({"AdamW step counters (CPU tensors)", GapReason::kSetup, 28 * 4,
               "step optimizer post", "step optimizer post"});
  // As in OracleLossRows: the recorder keeps the adapters' gradients after the step; the Trainer's
  // model.zero_grad() frees them: r 8 over q, o (64 + 64), k, v (64 + 32), gate, up, down
  // (64 + 128): 8 x 1024 = 8192 a layer, two layers, fp32.
  t.push_back({"setup: adapter gradients the recorder keeps after the step; the Trainer zeroes them",
               GapReason::kSetup, 16384 * 4, "step optimizer post", "step optimizer post"});
}

TEST_CASE("oracle: Llama full fine-tune, eager fp32, module boundaries match the real code's",
          "[workload][oracle]") {
  std::vector<GapRow> t;
  OracleModelRows(t, "fwd norm post", "step loss post");
  for (int l = 0; l < 2; ++l) OracleLayerRows(t, l);
  OracleLossRows(t, "fwd norm post");
  OracleCompare("llama", OracleLlama(""), t);
}

TEST_CASE("oracle: Llama with gradient checkpointing, module boundaries match the real code's",
          "[workload][oracle]") {
  // model.gradient_checkpointing_enable(): torch.utils.checkpoint.checkpoint, reentrant
  // (CheckpointFunction), one per decoder layer; use_cache is turned off (no DynamicCache).
  std::vector<GapRow> t;
  // CheckpointFunction.forward saves its tensor arguments (hidden_states, attention_mask,
  // position_ids) with ctx.save_for_backward: the mask and position_ids live until layer 0's
  // backward, not until LlamaModel.forward returns.
  OracleModelRows(t, "recompute layers.0 post", "recompute layers.0 post", "nograd layers.0 pre");
  for (int l = 0; l < 2; ++l) {
    const std::string n = std::to_string(l);
    // preserve_rng_state: ctx.fwd_cpu_state = torch.get_rng_state() (a 5056-byte CPU tensor, the
    // Mersenne Twister state), kept by the node until the graph goes; CheckpointFunction.backward
    // saves the current state again (bwd_cpu_rng_state) around the re-run. Host memory in a GPU
    // run (the CUDA states are CPU tensors too).
    t.push_back({"checkpoint layer " + n + ": saved CPU RNG state (host memory on GPU)",
                 GapReason::kSetup, 5056, "nograd layers." + n + " pre",
                 "recompute layers.0 post"});
    t.push_back({"checkpoint layer " + n + ": RNG state around the re-run (host memory on GPU)",
                 GapReason::kSetup, 5056, "recompute layers." + n + " pre",
                 "recompute layers." + n + " post"});
    // Under no_grad the norm outputs live until self_attn / mlp return (the decoder layer's local
    // `hidden_states` is rebound then): memsim's "<norm>_out.rebind" ops, no row.
    OracleLayerRows(t, l, "recompute", "recompute layers." + n + " post");
  }
  OracleLossRows(t, "fwd norm post");
  // record.py's step keeps `loss` (4 B) until backward returns, and the engine the root
  // gradient torch.ones_like(loss) (4 B) while it runs; memsim frees its loss (8 B, in the
  // loss-row above) at loss_bwd.
  t.push_back({"the caller's loss and the root gradient during backward", GapReason::kSetup, 8,
               "recompute layers.1 pre", "recompute layers.0 post"});
  OracleCompare("llama_ckpt", OracleLlama("ckpt"), t);
}

TEST_CASE("oracle: Llama with LoRA and LoRA dropout, module boundaries match the real code's",
          "[workload][oracle]") {
  // peft 0.7.1 LoraConfig(r 8, alpha 16, lora_dropout 0.1, the seven linears); get_peft_model
  // freezes the base model. PeftModelForCausalLM calls the base model's forward directly, so the
  // log has no "model" boundary.
  std::vector<GapRow> t;
  OracleModelRows(t, "fwd norm post", "step loss post", "fwd layers.0 pre", "fwd embed_tokens pre");
  for (int l = 0; l < 2; ++l) OracleLoraLayerRows(t, l);
  // LlamaModel.forward's local inputs_embeds: with a frozen embedding and layer 0's input not
  // requiring grad nothing saves it, so it goes when LlamaModel.forward returns; memsim keeps it
  // to layer 0's residual backward, as in a full fine-tune.
  t.push_back({"inputs_embeds freed at LlamaModel.forward's return (nothing saves it)",
               GapReason::kMemsimLonger, -8192, "fwd lm_head pre", "step loss post"});
  // The final norm: only the 1.13 pow row (the frozen weight's mul saves no x·rsqrt).
  t.push_back({"final norm: pow output saved by 1.13's mean", GapReason::kVersion, 8192,
               "fwd norm post", "step loss post"});
  OracleLoraLossRows(t);
  OracleCompare("llama_lora", OracleLlama("lora"), t);
}

// A QLoRA layer's re-run in backward (phase "recompute"), against memsim's: the rows of 4.36 and
// PyTorch 1.13 the fp32 tests name (OracleLayerRows, OracleLoraLayerRows), at the fp32 sizes the
// prepared model has there (its residual stream, q, k, v and the MLP's tensors are fp32).
void OracleQloraRecomputeRows(std::vector<GapRow>& t, int l) {
  const std::string tag = "qlora recompute layer " + std::to_string(l);
  const std::string end = "recompute layers." + std::to_string(l) + " post";
  auto at = [&](const std::string& rest) { return OracleL(l, rest, "recompute"); };
  t.push_back({tag + " input_layernorm: pow output saved by 1.13's mean", GapReason::kVersion, 8192,
               at("input_layernorm post"), end});
  t.push_back({tag + " post_attention_layernorm: pow output saved by 1.13's mean",
               GapReason::kVersion, 8192, at("post_attention_layernorm post"), end});
  // 4.36's per-layer rotary_emb(value_states): cos / sin in v's dtype, fp32 here.
  t.push_back({tag + " per-layer rotary cos/sin (4.36)", GapReason::kVersion, 4096,
               at("self_attn post"), end});
  t.push_back({tag + " 0-dim scale saved by DivBackward0 (4.36)", GapReason::kVersion, 8,
               at("self_attn post"), end});
  t.push_back({tag + " LoRA: 0-dim scaling saved by MulBackward0 (q, k, v, o)", GapReason::kVersion,
               4 * 8, at("self_attn post"), end});
  // The adapters' dropout on [T, 64] inputs that need grad: q, k, v's is the fp32 norm output
  // (CPU noise fp32, 4 B an element); o's the bf16 attention output, whose CPU noise is bf16
  // (2 B), against CUDA's bool mask (1 B) in memsim.
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    OracleLoraDropoutRow(t, tag + " " + p, 2048, true, at("self_attn post"));
    t.back().last = end;
  }
  t.push_back({tag + " o_proj: CPU dropout noise (bf16 input) vs CUDA's bool mask",
               GapReason::kVersion, 2 * 2048 - 2048, at("self_attn post"), end});
  // The re-run enters autocast again (torch.utils.checkpoint CheckpointFunction.backward), which
  // caches the LoRA weights' bf16 copies (7,168 B, as in the forward) until it exits after the
  // layer.
  t.push_back({tag + " autocast cache: the LoRA weights in bf16, not modelled",
               GapReason::kMemsimShorter, 7168, at("self_attn post"), end});
}

TEST_CASE("oracle: QLoRA after prepare_model_for_kbit_training, parameter bytes match the real "
          "model's", "[workload][oracle]") {
  // llama_qlora.log's header: parameter bytes 197,888 and the 4-bit linears' absmax (not
  // parameters in bitsandbytes either) 4,608. Derived: embed_tokens and lm_head 256·64 each and
  // five norms of 64, all fp32 after the cast: 2 · 65,536 + 1,280; per layer the 4-bit linears
  // hold 64·64 (q) + 64·32 (k, v) + 64·64 (o) + 3 · 64·128 = 36,864 values: 18,432 packed bytes
  // and 576 fp32 absmax (one per 64 values, 2,304 B); LoRA r 8: q, o 8·(64 + 64), k, v
  // 8·(64 + 32), fp32: 14,336 B a layer.
  const Bytes expected = 2 * 65536 + 1280 + 2 * (18432 + 2304) + 2 * 14336;
  CHECK(expected == 197888 + 4608);
  const Program p = Build(OracleQlora(), 0);
  Bytes params = 0;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kParameters) params += a.size_bytes;
    }
  }
  CHECK(params == expected);
}

TEST_CASE("oracle: QLoRA after prepare_model_for_kbit_training, module boundaries match the real "
          "code's", "[workload][oracle]") {
  std::vector<GapRow> t;
  OracleModelRows(t, "recompute layers.0 post", "recompute layers.0 post", "nograd layers.0 pre",
                  "fwd embed_tokens pre");
  for (int l = 0; l < 2; ++l) {
    const std::string n = std::to_string(l);
    t.push_back({"checkpoint layer " + n + ": saved CPU RNG state (host memory on GPU)",
                 GapReason::kSetup, 5056, "nograd layers." + n + " pre", "recompute layers.0 post"});
    t.push_back({"checkpoint layer " + n + ": RNG state around the re-run (host memory on GPU)",
                 GapReason::kSetup, 5056, "recompute layers." + n + " pre",
                 "recompute layers." + n + " post"});
    // Autocast's cache (aten/src/ATen/autocast_mode.h cached_cast: fp32 leaves that require
    // grad): the bf16 copies of the layer's fp32 LoRA weights, q and o 8·64 + 64·8, k and v
    // 8·64 + 32·8 values: 3,584 · 2 = 7,168 B, held until the outermost autocast exits.
    t.push_back({"autocast cache: layer " + n + "'s LoRA weights in bf16, not modelled",
                 GapReason::kMemsimShorter, 7168, "nograd layers." + n + ".self_attn post",
                 "fwd lm_head post"});
  }
  // The final LlamaRMSNorm: fp32 output (fp32 weight · fp32 x; memsim keeps the compute dtype,
  // T·h·2 less), and 1.13's mean saving the pow output (T·h·4).
  t.push_back({"final norm output fp32 (memsim: bf16)", GapReason::kMemsimShorter, 4096,
               "fwd norm post", "fwd lm_head post"});
  t.push_back({"final norm: pow output saved by 1.13's mean", GapReason::kVersion, 8192,
               "fwd norm post", "step loss post"});
  // lm_head is frozen: its mm saves the weight's bf16 copy, not the norm output, which goes when
  // the forward returns; memsim keeps its bf16 final_out to output_layer_bwd.
  t.push_back({"final norm output: frozen lm_head saves nothing; memsim keeps it",
               GapReason::kMemsimLonger, -4096, "step loss post", "step loss post"});
  t.push_back({"the caller's loss and the root gradient during backward", GapReason::kSetup, 8,
               "recompute layers.1 pre", "recompute layers.0 post"});
  for (int l = 1; l >= 0; --l) OracleQloraRecomputeRows(t, l);
  // torch.optim.AdamW state["step"] of the 16 LoRA matrices (CPU tensors), and the adapters'
  // gradients, which the recorder keeps after the step and the Trainer's model.zero_grad()
  // frees: 28,672 B (the trainable bytes of the parameter test above).
  t.push_back({"AdamW step counters (CPU tensors)", GapReason::kSetup, 16 * 4,
               "step optimizer post", "step optimizer post"});
  t.push_back({"setup: adapter gradients the recorder keeps after the step; the Trainer zeroes them",
               GapReason::kSetup, 28672, "step optimizer post", "step optimizer post"});
  OracleCompare("llama_qlora", OracleQlora(), t);
}

}  // namespace
}  // namespace memsim::workload
