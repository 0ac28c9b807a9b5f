// Issue 19, "alive at the peak" (docs/validation.md, 'Alive at the peak'): for a small dense
// Megatron-core config under the distributed optimizer, the Program holds each tensor the
// inventory lists at the moment it names. Labels are the Program's own (`memsim dump-program`).
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include "workload/build.h"
#include "workload/model.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

// Labels of every tensor alive during the first op of iteration 1 named `op_name`: its
// allocations made, its frees (at the op's end) not yet applied -- the op's own high point.
std::multiset<std::string> AliveAfter(const Program& p, const std::string& op_name) {
  std::map<TensorId, std::string> live;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) live[a.id] = a.label;
    const bool hit = op.iteration == 1 && op.name.find(op_name) != std::string::npos;
    if (hit) {
      std::multiset<std::string> out;
      for (const auto& [id, label] : live) out.insert(label);
      return out;
    }
    for (TensorId f : op.frees) live.erase(f);
  }
  return {};
}

// Bytes of the first iteration-1 allocation labelled `label`; 0 if none.
Bytes AllocBytes(const Program& p, const std::string& label) {
  for (const Op& op : p.ops) {
    if (op.iteration != 1) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label == label) return a.size_bytes;
    }
  }
  return 0;
}

// TinyLlama with 2 KV groups on an A100 (sm 80: Transformer Engine picks flash-attn 2).
config::Setup TinyGqaA100() {
  config::Setup s = testing::TinyLlama();
  s.model.num_key_value_heads = 2;
  s.device.name = "nvidia-a100-80g";
  s.device.peak_flops_bf16 = 312e12;
  s.device.memory_bandwidth_bytes_per_s = 2.0e12;
  return s;
}

config::Setup DenseDistOpt() {
  config::Setup s = testing::Llama2_7b();
  s.training.use_distributed_optimizer = true;
  return s;
}

}  // namespace

TEST_CASE("peak inventory: the loss holds the bf16 logits, the fp32 copy and the loss mask",
          "[workload][peak]") {
  // megatron/core/models/gpt/gpt_model.py compute_language_model_loss ->
  // tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels): during the cross-entropy
  // the 16-bit logits [s·b, V/t] and their fp32 copy are both alive; in core >= 0.8 the max is
  // subtracted in place (cross_entropy.py), so the copy becomes the saved softmax.
  const Program p = Build(DenseDistOpt(), 0);
  const std::multiset<std::string> alive = AliveAfter(p, "cross_entropy");
  REQUIRE_FALSE(alive.empty());
  CHECK(alive.count("output_layer.logits") == 1);
  CHECK(alive.count("loss.logits_fp32") == 1);
  CHECK(alive.count("loss.logits_minus_max") == 0);
  CHECK(alive.count("final_norm.out") == 1);  // saved by the output layer for its wgrad
}

TEST_CASE("peak inventory: Megatron-core < 0.8 keeps a second fp32 logits tensor (Megatron-LM#525)",
          "[workload][peak]") {
  // Before commit 9634c0e4a3 (first in core_v0.8.0) `logits - logits_max` is out of place: the
  // .float() copy stays alive until the autograd Function returns, next to the new fp32 tensor,
  // which becomes the saved softmax. 2 × 4 B × s·b·V/t on top of the 16-bit logits.
  config::Setup s = DenseDistOpt();
  s.training.megatron_core_version = {0, 7};
  const ModelDims d = ComputeDims(s);
  CHECK(testing::FactsOf(s).ce_max_out_of_place);
  const Program p = Build(s, 0);
  const std::multiset<std::string> alive = AliveAfter(p, "cross_entropy");
  CHECK(alive.count("output_layer.logits") == 1);
  CHECK(alive.count("loss.logits_minus_max") == 1);
  // Both fp32 tensors at once; the copy is freed at the end of the op (the Function returned).
  CHECK(alive.count("loss.logits_fp32") == 1);
  std::int64_t copy_bytes = 0, sub_bytes = 0;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (op.iteration != 1) continue;
      if (a.label == "loss.logits_fp32") copy_bytes = a.size_bytes;
      if (a.label == "loss.logits_minus_max") sub_bytes = a.size_bytes;
    }
  }
  CHECK(copy_bytes == 4 * d.T * (d.V / d.t));
  CHECK(sub_bytes == copy_bytes);
  s.training.megatron_core_version = {0, 8};
  CHECK_FALSE(testing::FactsOf(s).ce_max_out_of_place);
}

TEST_CASE("peak inventory: TE's flash-attn 2 path saves flash-attn's own output besides TE's copy",
          "[workload][peak]") {
  // TE FlashAttention.forward (attention.py, v1.7 .. v2.9): with qkv_format "sbhd" q, k, v go to
  // flash-attn as [b, s, ...] copies and the [b, s, a/t·d] output comes back as a [s, b, ...]
  // .contiguous() copy; flash-attn's FlashAttnVarlenFunc / FlashAttnFunc (flash_attn_interface.py,
  // v2.5.8) save_for_backward(q, k, v, out_padded, softmax_lse, ...), so its output stays saved
  // too. TinyLlama: T = s·b = 32, a/t·d = 4 · 16 = 64, bf16: 2 B × 32 × 64 = 4096 B per layer.
  const config::Setup s = TinyGqaA100();
  const ModelDims d = ComputeDims(s);
  REQUIRE(testing::FactsOf(s).te_flash_attn2);
  const Program p = Build(s, 0);
  CHECK(AllocBytes(p, "layer0.attn.flash_out") == 4096);
  CHECK(AllocBytes(p, "layer0.attn.core_out") == 4096);
  // Both are alive at the loss (saved until the layer's backward).
  const std::multiset<std::string> alive = AliveAfter(p, "cross_entropy");
  CHECK(alive.count("layer0.attn.flash_out") == 1);
  CHECK(alive.count("layer1.attn.flash_out") == 1);
  // Backward with 2 KV groups for 4 heads: flash_api.cpp mha_varlen_bwd allocates dk_expanded and
  // dv_expanded [total_k, num_heads, head_size] = 32 × 4 × 16 × 2 B = 4096 B each.
  CHECK(AllocBytes(p, "layer0.attn.d_key_expanded") == 4096);
  CHECK(AllocBytes(p, "layer0.attn.d_value_expanded") == 4096);
  // From sm 90 on TE prefers cuDNN FusedAttention (TE 2.9 utils.py get_attention_backend): no
  // flash-attn output. With as many KV heads as heads, no expanded grads.
  CHECK_FALSE(testing::FactsOf(testing::TinyLlama()).te_flash_attn2);
  CHECK(AllocBytes(Build(testing::TinyLlama(), 0), "layer0.attn.flash_out") == 0);
  config::Setup mha = TinyGqaA100();
  mha.model.num_key_value_heads = 4;
  CHECK(AllocBytes(Build(mha, 0), "layer0.attn.d_key_expanded") == 0);
}

TEST_CASE("peak inventory: Megatron-core 0.5-0.13's bshd switch keeps cuDNN FusedAttention's output "
          "besides the projection's copy",
          "[workload][peak]") {
  // Megatron-core 0.5-0.13 transformer_engine.py TEDotProductAttention.forward: with RoPE fusion
  // (the default) qkv_format becomes 'bshd', q, k, v go to TE as transpose(0, 1).contiguous()
  // and the output comes back as core_attn_out.transpose(0, 1). TE FusedAttnFunc.forward
  // save_for_backward(q, k, v, out, ...) keeps the [b, s, a/t·d] output; TE Linear's
  // prepare_forward (module/base.py) makes the transposed view contiguous for the output
  // projection, which saves that copy. TinyLlama (an sm 90 device, cuDNN FusedAttention): T = 32,
  // a/t·d = 4 · 16 = 64, bf16: 2 B × 32 × 64 = 4096 B per layer, alive at the loss.
  config::Setup s = testing::TinyLlama();
  s.training.megatron_core_version = {0, 12};
  REQUIRE(testing::FactsOf(s).te_fused_attn_bshd_out);
  const Program p = Build(s, 0);
  CHECK(AllocBytes(p, "layer0.attn.fused_out") == 4096);
  CHECK(AllocBytes(p, "layer0.attn.core_out") == 4096);
  const std::multiset<std::string> alive = AliveAfter(p, "cross_entropy");
  CHECK(alive.count("layer0.attn.fused_out") == 1);
  CHECK(alive.count("layer1.attn.fused_out") == 1);
  // Commit 733b682b6b (first in core_v0.14.0) keeps 'sbhd': one output, the one both save. A
  // version not stated is taken as current.
  s.training.megatron_core_version = {0, 14};
  CHECK_FALSE(testing::FactsOf(s).te_fused_attn_bshd_out);
  CHECK(AllocBytes(Build(s, 0), "layer0.attn.fused_out") == 0);
  CHECK_FALSE(testing::FactsOf(testing::TinyLlama()).te_fused_attn_bshd_out);
  // core_v0.4.0 has no switch; without RoPE arguments.py turns the fusion off.
  s.training.megatron_core_version = {0, 4};
  CHECK_FALSE(testing::FactsOf(s).te_fused_attn_bshd_out);
  s.training.megatron_core_version = {0, 12};
  s.model.position_embedding_type = config::PositionEmbedding::kLearnedAbsolute;
  CHECK_FALSE(testing::FactsOf(s).te_fused_attn_bshd_out);
  // Below sm 90 flash-attn 2 runs instead; fix 12's two outputs, whatever the format.
  config::Setup a100 = TinyGqaA100();
  a100.training.megatron_core_version = {0, 12};
  CHECK_FALSE(testing::FactsOf(a100).te_fused_attn_bshd_out);
  CHECK(AllocBytes(Build(a100, 0), "layer0.attn.flash_out") == 4096);
}

TEST_CASE("peak inventory: the embedding's dense backward keeps fp32 partial sums beside its grad",
          "[workload][peak]") {
  // PyTorch aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda: above 3072
  // indices the int64 indices are radix-sorted (sorted_indices, orig_indices, arange: 3 × 8 B
  // × T), and EmbeddingBackwardKernel.cu embedding_backward_cuda_kernel makes, after the zeroed
  // [V/t, h] grad, segment_offsets [T], partials_per_segment and partials_per_segment_offset
  // [min(T, V/t)], partial_segment_offset [T/10 + min(T, V/t)] (int64), and
  // grad_weight_per_segment [T/10 + min(T, V/t), h] in acc_type (fp32 for bf16 grads).
  // TinyLlama at seq 4096: T = 4096, V = 256 (already a multiple of 128), h = 64:
  //   sort buffers 24 × 4096 = 98,304 B;
  //   segments min(4096, 256) = 256, partials 4096/10 + 256 = 665;
  //   index buffers 8 × (4096 + 2 × 256 + 665) = 42,184 B;
  //   fp32 partial sums 4 × 665 × 64 = 170,240 B.
  config::Setup s = testing::TinyLlama();
  s.training.seq_length = 4096;
  const ModelDims d = ComputeDims(s);
  REQUIRE(d.T == 4096);
  REQUIRE(d.V == 256);
  const Program p = Build(s, 0);
  CHECK(AllocBytes(p, "embedding.sort_buffers") == 98304);
  CHECK(AllocBytes(p, "embedding.segment_offsets") == 42184);
  CHECK(AllocBytes(p, "embedding.grad_weight_per_segment") == 170240);
  const std::multiset<std::string> alive = AliveAfter(p, "embedding.wgrad");
  CHECK(alive.count("embedding.word_embeddings.grad") == 1);
  CHECK(alive.count("embedding.grad_weight_per_segment") == 1);
  CHECK(alive.count("embedding.sort_buffers") == 1);
  // Up to 3072 indices one atomic kernel writes the grad: no temporaries (TinyLlama, T = 32).
  const Program small = Build(testing::TinyLlama(), 0);
  CHECK(AllocBytes(small, "embedding.sort_buffers") == 0);
  CHECK(AllocBytes(small, "embedding.grad_weight_per_segment") == 0);
  CHECK(AllocBytes(small, "embedding.word_embeddings.grad") == 2 * 256 * 64);
}

TEST_CASE("peak inventory: the attention and MLP backward hold the grads the sources make",
          "[workload][peak]") {
  // docs/validation.md 'Fifth pass'. TinyLlama on an sm 90 device (cuDNN FusedAttention) with
  // 2 KV groups for 4 heads: T = 32, q = 4 · 16 = 64, kv = 2 · 16 = 32, ffn 128, bf16.
  config::Setup s = testing::TinyLlama();
  s.model.num_key_value_heads = 2;
  const Program p = Build(s, 0);
  // TE attention.cpp fused_attn_bwd (separate layout): dQ, dK, dV torch::empty each,
  // 2 B × 32 × 64 = 4096 B and 2 B × 32 × 32 = 2048 B; TE SplitAlongDim.backward cats them
  // (separate storages) into the [T, q + 2·kv] grad, 2 B × 32 × 128 = 8192 B, while they are
  // alive (the RoPE'd grads in the source, of the same sizes).
  CHECK(AllocBytes(p, "layer1.attn.d_query") == 4096);
  CHECK(AllocBytes(p, "layer1.attn.d_key") == 2048);
  CHECK(AllocBytes(p, "layer1.attn.d_value") == 2048);
  CHECK(AllocBytes(p, "layer1.attn.d_qkv") == 8192);
  std::multiset<std::string> alive = AliveAfter(p, "attn.qkv_grad");
  for (const char* label : {"layer1.attn.d_qkv", "layer1.attn.d_query", "layer1.attn.d_key",
                            "layer1.attn.d_value"}) {
    CHECK(alive.count(label) == 1);
  }
  // fused_bias_swiglu.py swiglu_back under torch.compile: one [T, 2·ffn] grad,
  // 2 B × 32 × 256 = 16,384 B, beside fc2's dgrad [T, ffn] (TE _Linear.backward, 8192 B) and
  // the saved fc1 output it reads.
  CHECK(AllocBytes(p, "layer1.mlp.d_fc1_out") == 16384);
  CHECK(AllocBytes(p, "layer1.mlp.d_act_out") == 8192);
  alive = AliveAfter(p, "mlp.act_bwd");
  CHECK(alive.count("layer1.mlp.d_fc1_out") == 1);
  CHECK(alive.count("layer1.mlp.d_act_out") == 1);
  CHECK(alive.count("layer1.mlp.fc1_out") == 1);
}

TEST_CASE("peak inventory: a tied output weight's grad waits in autograd for the embedding's",
          "[workload][peak]") {
  // GPTModel with share_embeddings_and_output_weights at PP 1: the output layer reads the
  // embedding's own Parameter (language_module.py setup_embeddings_and_output_layer sets
  // zero_out_wgrad on it), so its AccumulateGrad node has two producers and runs once both have
  // handed in their grads (torch/csrc/autograd/engine.cpp); the second is summed into the
  // first in the node's InputBuffer (input_buffer.cpp accumulate).
  // TinyLlama: V = 256, h = 64, bf16: every [V, h] grad is 2 B × 256 × 64 = 32,768 B.
  config::Setup s = testing::TinyLlama();
  s.model.tie_word_embeddings = true;
  REQUIRE(ComputeDims(s).tied);
  const std::int64_t grad_bytes = 2 * 256 * 64;
  // Current releases (no version stated): the output layer hands autograd TE's cached dummy
  // (tensor_parallel/layers.py get_dummy_wgrad(..., zero=True)), which the cache also holds, so
  // the InputBuffer sums out of place: `old_var + var`, a new [V, h] tensor next to the
  // embedding's dense grad, freed by the DDP hook once added into main_grad.
  const Program p = Build(s, 0);
  CHECK(AllocBytes(p, "embedding.word_embeddings.grad.accumulated") == grad_bytes);
  std::multiset<std::string> alive = AliveAfter(p, "embedding.grad_accumulate");
  CHECK(alive.count("embedding.word_embeddings.grad") == 1);
  CHECK(alive.count("embedding.word_embeddings.grad.accumulated") == 1);
  // Megatron-core 0.13 (before its linears took TE's cache): a fresh torch.zeros [V, h] grad,
  // the InputBuffer's only reference, so the embedding's grad is added into it in place -- but it
  // is alive from the output layer's backward through every layer's backward.
  s.training.megatron_core_version = {0, 13};
  const Program fresh = Build(s, 0);
  CHECK(AllocBytes(fresh, "output_layer.wgrad") == grad_bytes);
  CHECK(AllocBytes(fresh, "embedding.word_embeddings.grad.accumulated") == 0);
  alive = AliveAfter(fresh, "attn.core_bwd");
  CHECK(alive.count("output_layer.wgrad") == 1);
  alive = AliveAfter(fresh, "embedding.grad_accumulate");
  CHECK(alive.count("output_layer.wgrad") == 1);
  CHECK(alive.count("embedding.word_embeddings.grad") == 1);
  // Untied, the output layer's weight is its own Parameter: its grad goes to the DDP hook at
  // once (freed in its op), and nothing waits.
  s.model.tie_word_embeddings = false;
  const Program untied = Build(s, 0);
  CHECK(AliveAfter(untied, "attn.core_bwd").count("output_layer.wgrad") == 0);
  CHECK(AliveAfter(untied, "embedding.grad_accumulate").empty());
}

TEST_CASE("peak inventory: at the optimizer step the distributed optimizer's state is alive",
          "[workload][peak]") {
  // megatron/core/optimizer/distrib_optimizer.py: fp32 main-weight shards and (from step 1) Adam's
  // exp_avg / exp_avg_sq shards; megatron/core/distributed/param_and_grad_buffer.py: the param and
  // grad buffers. All alive when the step runs.
  const Program p = Build(DenseDistOpt(), 0);
  std::map<TensorId, Category> live;
  std::set<Category> at_step;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) live[a.id] = a.category;
    if (op.iteration == 1 && op.phase == Phase::kOptimizerStep) {
      for (const auto& [id, c] : live) at_step.insert(c);
    }
    for (TensorId f : op.frees) live.erase(f);
  }
  CHECK(at_step.count(Category::kParameters) == 1);
  CHECK(at_step.count(Category::kGradients) == 1);
  CHECK(at_step.count(Category::kMainParameters) == 1);
  CHECK(at_step.count(Category::kOptimizerStates) == 1);
}

}  // namespace memsim::workload
