// Setups built in code for the workload tests, and small walkers over a Program.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/setup.h"
#include "workload/facts.h"
#include "workload/model.h"
#include "workload/program.h"

namespace memsim::workload::testing {

// The framework facts a Build of `s` runs with (facts.h).
inline FrameworkFacts FactsOf(const config::Setup& s) { return ComputeFacts(s, ComputeDims(s)); }

// LLaMA-2-7B (HF config.json): h 4096, ffn 11008, 32 layers, 32 heads, vocab 32000, RMSNorm,
// SwiGLU, RoPE, untied, no biases, no dropout. bf16, flash attention, TE, one rank.
inline config::Setup Llama2_7b() {
  config::Setup s;
  s.model.model_type = "llama";
  s.model.hidden_size = 4096;
  s.model.intermediate_size = 11008;
  s.model.num_attention_heads = 32;
  s.model.num_key_value_heads = 32;
  s.model.num_hidden_layers = 32;
  s.model.vocab_size = 32000;
  s.model.max_position_embeddings = 4096;
  s.model.gated_mlp = true;
  s.model.normalization = config::Normalization::kRMSNorm;
  s.training.seq_length = 4096;
  s.training.micro_batch_size = 1;
  s.training.global_batch_size = 1;
  s.training.use_flash_attn = true;
  s.training.train_iters = 3;
  s.device.name = "nvidia-h100-80g";
  s.device.peak_flops_bf16 = 989e12;
  s.device.memory_bandwidth_bytes_per_s = 3.35e12;
  return s;
}

// A tiny Llama-style model for tests that need every op but few bytes: h 64, ffn 128 (gated),
// 4 heads, 4 KV heads, 2 layers, vocab 256, untied, no biases, no dropout; seq 32, one
// micro-batch of 1, one iteration; bf16, flash attention, TE, one rank.
inline config::Setup TinyLlama() {
  config::Setup s = Llama2_7b();
  s.model.hidden_size = 64;
  s.model.intermediate_size = 128;
  s.model.num_attention_heads = 4;
  s.model.num_key_value_heads = 4;
  s.model.num_hidden_layers = 2;
  s.model.vocab_size = 256;
  s.training.seq_length = 32;
  s.training.train_iters = 1;
  return s;
}

// LLaMA-2-70B: h 8192, ffn 28672, 80 layers, 64 heads, 8 KV heads, vocab 32000.
// TinyLlama under the Hugging Face Trainer: Transformers' own decoder layer (2 key/value heads),
// sdpa attention, bf16 autocast over weights loaded in `torch_dtype`.
inline config::Setup TinyHfLlama(config::Precision torch_dtype) {
  config::Setup s = TinyLlama();
  s.model.num_key_value_heads = 2;
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  s.training.transformer_impl = "local";
  s.training.gradient_accumulation_fusion = false;
  s.training.use_flash_attn = true;  // attn_implementation "sdpa"
  s.training.precision = config::Precision::kBf16;
  s.training.pytorch()->torch_dtype = torch_dtype;
  return s;
}

inline config::Setup Llama2_70b() {
  config::Setup s = Llama2_7b();
  s.model.hidden_size = 8192;
  s.model.intermediate_size = 28672;
  s.model.num_attention_heads = 64;
  s.model.num_key_value_heads = 8;
  s.model.num_hidden_layers = 80;
  return s;
}

// The setting of Korthikanti et al. 2022 §4: GPT, GeLU MLP with ffn = 4h, MHA, LayerNorm,
// learned positions, dropout 0.1 (hidden and attention), 16-bit activations. Small enough to
// build fast: h 1024, a 16, s 1024, 4 layers.
inline config::Setup PaperGpt() {
  config::Setup s;
  s.model.model_type = "gpt2";
  s.model.hidden_size = 1024;
  s.model.intermediate_size = 4096;
  s.model.num_attention_heads = 16;
  s.model.num_key_value_heads = 16;
  s.model.num_hidden_layers = 4;
  s.model.vocab_size = 50257;
  s.model.max_position_embeddings = 1024;
  s.model.gated_mlp = false;
  s.model.hidden_act = "gelu";
  s.model.normalization = config::Normalization::kLayerNorm;
  s.model.add_bias_linear = true;
  s.model.position_embedding_type = config::PositionEmbedding::kLearnedAbsolute;
  s.model.hidden_dropout = 0.1;
  s.model.attention_dropout = 0.1;
  s.model.tie_word_embeddings = true;
  s.training.seq_length = 1024;
  s.training.micro_batch_size = 2;
  s.training.global_batch_size = 2;
  s.training.use_flash_attn = false;
  s.training.train_iters = 3;
  s.device.name = "nvidia-a100-80g";
  s.device.peak_flops_bf16 = 312e12;
  s.device.memory_bandwidth_bytes_per_s = 2.0e12;
  return s;
}

// Bytes allocated in category `cat` by the forward ops of (iteration, micro-batch, layer) that
// those same ops do not free: what the layer saves for backward.
inline Bytes LayerSavedBytes(const Program& p, int iteration, int mb, int layer,
                             Category cat = Category::kActivations) {
  std::map<TensorId, Bytes> alive;
  for (const Op& op : p.ops) {
    if (op.iteration != iteration || op.phase != Phase::kForward || op.micro_batch != mb ||
        op.layer != layer) {
      continue;
    }
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == cat) alive[a.id] = a.size_bytes;
    }
    for (TensorId id : op.frees) alive.erase(id);
  }
  Bytes sum = 0;
  for (const auto& [id, bytes] : alive) sum += bytes;
  return sum;
}

// Net bytes (allocated minus freed) per category over the ops of one iteration.
inline std::map<Category, Bytes> NetByCategory(const Program& p, int iteration) {
  std::map<TensorId, const TensorAlloc*> all;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) all[a.id] = &a;
  }
  std::map<Category, Bytes> net;
  for (const Op& op : p.ops) {
    if (op.iteration != iteration) continue;
    for (const TensorAlloc& a : op.allocs) net[a.category] += a.size_bytes;
    for (TensorId id : op.frees) net[all.at(id)->category] -= all.at(id)->size_bytes;
  }
  for (auto it = net.begin(); it != net.end();) {
    it = it->second == 0 ? net.erase(it) : std::next(it);
  }
  return net;
}

}  // namespace memsim::workload::testing
