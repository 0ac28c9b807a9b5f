// What Megatron derives from a launch's arguments when a flag is absent, one rule per test, each
// citing the line of megatron/training/arguments.py (or the module named) at Megatron-LM
// d98e8a64ddf34856e74b24714e3bedb2f5a39553 it follows; and the MoE layer flags of Megatron-LM
// and MindSpeed-LLM (927a8d93effc2c59effda8dc3c473eb7712fba65).
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/launch_script.h"
#include "config/megatron_args.h"
#include "core/error.h"
#include "workload/build.h"

namespace memsim::config {
namespace {

// A small GPT (2 layers, h 256, 4 heads, vocabulary 1000) and `more` (1 process unless
// `more` names --nproc_per_node).
Setup DeriveFrom(std::vector<std::string> more, const std::string& device = "h100-80g",
                 std::vector<std::string> overrides = {}) {
  std::vector<std::string> words = {"--num-layers", "2", "--hidden-size", "256",
                                    "--num-attention-heads", "4", "--seq-length", "128",
                                    "--vocab-size", "1000"};
  if (std::find(more.begin(), more.end(), "--nproc_per_node") == more.end()) {
    words.insert(words.end(), {"--nproc_per_node", "1"});
  }
  words.insert(words.end(), more.begin(), more.end());
  LoadOptions o;
  o.device = device;
  o.overrides = std::move(overrides);
  return LoadSetupFromMegatron(ReadCommandLineArguments(words), o, MegatronOptions{});
}

std::string DeriveError(std::vector<std::string> more) {
  try {
    DeriveFrom(std::move(more));
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("ffn_hidden_size absent: 4·h, or int(4·h·2/3 / 64)·64 with --swiglu") {
  // arguments.py:1320-1329. h 256: 4·256 = 1024; with SwiGLU int(682.67 / 64)·64 = 10·64 = 640.
  CHECK(DeriveFrom({}).model.intermediate_size == 1024);
  CHECK(DeriveFrom({"--swiglu"}).model.intermediate_size == 640);
  // Llama-2-7B's width h 4096: int(10922.67 / 64)·64 = 170·64 = 10880, not the HF file's 11008.
  const Setup llama = DeriveFrom({"--hidden-size", "4096", "--num-attention-heads", "32",
                                  "--swiglu"});
  CHECK(llama.model.intermediate_size == 10880);
  CHECK(DeriveFrom({"--swiglu", "--ffn-hidden-size", "700"}).model.intermediate_size == 700);
}

TEST_CASE("a GPT-2-large shape with --swiglu and no --ffn-hidden-size: Megatron-LM #525's count") {
  // Megatron-LM issue #525: a GPT-2-large run (36 layers, h 1280, 20 heads, 1024 positions,
  // GPT-2's 50257 tokens) logs 771,201,024 parameters, which is this shape with --swiglu and no
  // --ffn-hidden-size (with biases, LayerNorm, tied embeddings; no other combination of those
  // gives it). ffn = int(4·1280·2/3 / 64)·64 = 53·64 = 3392. A layer: qkv 3·1280² + 3·1280 = 4,919,040;
  // proj 1280² + 1280 = 1,639,680; fc1 2·3392 × 1280 + 6784 = 8,690,304; fc2 3392 × 1280 + 1280
  // = 4,343,040; two LayerNorms 4·1280 = 5,120: 19,597,184; 36 layers 705,498,624. Word
  // embeddings 50304 × 1280 = 64,389,120 (tied), positions 1024 × 1280 = 1,310,720, final
  // LayerNorm 2,560: 771,201,024.
  const Setup s = DeriveFrom({"--num-layers", "36", "--hidden-size", "1280",
                              "--num-attention-heads", "20", "--seq-length", "1024",
                              "--max-position-embeddings", "1024", "--vocab-size", "50257",
                              "--swiglu"});
  CHECK(workload::ComputeStaticSizes(s, 0).parameter_count == 771201024);
}

TEST_CASE("kv_channels absent: hidden_size / num_attention_heads") {
  // arguments.py:1331-1333.
  CHECK(DeriveFrom({}).model.head_dim == 64);
  CHECK(DeriveFrom({"--kv-channels", "32"}).model.head_dim == 32);
}

TEST_CASE("num_query_groups counts only with --group-query-attention") {
  // argument_utils.py:330-333: num_query_groups None (multi-head) without the flag.
  const Setup mha = DeriveFrom({"--num-query-groups", "2"});
  CHECK(mha.model.num_key_value_heads == 4);
  CHECK(mha.warnings.front().find("--num-query-groups: ignored without --group-query-attention") !=
        std::string::npos);
  CHECK(DeriveFrom({"--group-query-attention", "--num-query-groups", "2"})
            .model.num_key_value_heads == 2);
}

TEST_CASE("the vocabulary is padded to make_vocab_size_divisible_by × TP") {
  // vocab_utils.py:58: multiple = divisible_by × TP. 1000 at TP 1: next multiple of 128 is
  // 1024; at TP 2 (4 processes) of 256: 1024; --make-vocab-size-divisible-by 100 at TP 2:
  // of 200: 1000.
  CHECK(DeriveFrom({}).model.padded_vocab_size == 1024);
  CHECK(DeriveFrom({"--tensor-model-parallel-size", "2"}, "h100-80g",
                   {"training.data_parallel_size=1"})
            .model.padded_vocab_size == 1024);
  CHECK(DeriveFrom({"--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "100"},
                   "h100-80g", {"training.data_parallel_size=1"})
            .model.padded_vocab_size == 1000);
}

TEST_CASE("embeddings are tied unless --untie-embeddings-and-output-weights") {
  // arguments.py:2460 (store_true, default tied). Untied adds an output layer of 1024 × 256.
  const Setup tied = DeriveFrom({});
  const Setup untied = DeriveFrom({"--untie-embeddings-and-output-weights"});
  CHECK(tied.model.tie_word_embeddings);
  CHECK_FALSE(untied.model.tie_word_embeddings);
  CHECK(workload::ComputeStaticSizes(untied, 0).parameter_count -
            workload::ComputeStaticSizes(tied, 0).parameter_count ==
        1024 * 256);
}

TEST_CASE("position embeddings: learned by default, none with RoPE, RoPE kept by --no-position-embedding") {
  // arguments.py:2397 (default learned_absolute), 1631-1634 (--no-position-embedding with rope
  // keeps rope). --rotary-percent (arguments.py:2420) changes no parameter: accepted.
  CHECK(DeriveFrom({}).model.position_embedding_type == PositionEmbedding::kLearnedAbsolute);
  const Setup rope = DeriveFrom({"--position-embedding-type", "rope", "--no-position-embedding",
                                 "--rotary-percent", "0.5"});
  CHECK(rope.model.position_embedding_type == PositionEmbedding::kRope);
  CHECK(DeriveFrom({"--no-position-embedding"}).model.position_embedding_type ==
        PositionEmbedding::kNone);
  // Learned positions: max_position_embeddings (here seq_length 128) × h = 32768 more.
  CHECK(workload::ComputeStaticSizes(DeriveFrom({}), 0).parameter_count -
            workload::ComputeStaticSizes(rope, 0).parameter_count ==
        128 * 256);
}

TEST_CASE("data-parallel size: world size / (TP × PP × CP), --set overrides the world size") {
  // arguments.py:442-448.
  const Setup s = DeriveFrom({"--nproc_per_node", "8", "--nnodes", "2",
                              "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                              "2", "--context-parallel-size", "2"});
  CHECK(s.training.data_parallel_size == 2);
  // 16 processes do not divide by TP 3; --set gives the data-parallel size instead.
  const Setup set = DeriveFrom({"--nproc_per_node", "8", "--nnodes", "2",
                                "--tensor-model-parallel-size", "4"},
                               "h100-80g", {"training.data_parallel_size=3"});
  CHECK(set.training.data_parallel_size == 3);
}

TEST_CASE("virtual stages from --num-layers-per-virtual-pipeline-stage") {
  // arguments.py:970-975: virtual stages = layers per stage / layers per virtual stage.
  const Setup s = DeriveFrom({"--num-layers", "8", "--nproc_per_node", "2",
                              "--pipeline-model-parallel-size", "2",
                              "--num-layers-per-virtual-pipeline-stage", "2"});
  CHECK(s.training.num_layers_per_virtual_pipeline_stage == 2);
}

TEST_CASE("global batch absent: micro batch × data-parallel size") {
  // arguments.py:702-703.
  CHECK(DeriveFrom({"--nproc_per_node", "4", "--micro-batch-size", "3"})
            .training.global_batch_size == 12);
}

TEST_CASE("attention backend absent: auto (no s×s scores) on GPUs, scores on Ascend and legacy") {
  // transformer_config.py:151 attention_backend = AttnBackend.auto.
  CHECK(DeriveFrom({}).training.use_flash_attn);
  CHECK_FALSE(DeriveFrom({"--attention-backend", "unfused"}).training.use_flash_attn);
  // MindSpeed's dot_product_attention_forward_wrapper: the fused NPU kernel only with
  // --use-flash-attn.
  CHECK_FALSE(DeriveFrom({}, "ascend-910b-64g").training.use_flash_attn);
  CHECK(DeriveFrom({"--use-flash-attn"}, "ascend-910b-64g").training.use_flash_attn);
  CHECK_FALSE(DeriveFrom({"--use-legacy-models"}).training.use_flash_attn);
}

TEST_CASE("all the wrong values of one launch are reported together") {
  const std::string e = DeriveError({"--micro-batch-size", "x", "--seq-length", "y"});
  CHECK(e == "2 problems in --megatron-args:\n"
             "  --megatron-args --micro-batch-size: expected an integer, got 'x'\n"
             "  --megatron-args --seq-length: expected an integer, got 'y'");
}

// ---- MoE layer flags ----

std::vector<bool> Pattern(std::vector<std::string> more) {
  std::vector<std::string> moe = {"--num-layers", "4", "--num-experts", "4", "--moe-router-topk",
                                  "2"};
  moe.insert(moe.end(), more.begin(), more.end());
  return DeriveFrom(moe).model.moe_layer_pattern;
}

TEST_CASE("Megatron args: --moe-layer-freq: an integer, MindSpeed-LLM's -1, and Megatron's list expressions") {
  // gpt_layer_specs.py:647-652: layer i is MoE when i % N == 0 (Python's %, 0 for every i
  // when N = -1), or the list's entry.
  CHECK(Pattern({"--moe-layer-freq", "2"}) == std::vector<bool>{true, false, true, false});
  CHECK(Pattern({"--moe-layer-freq", "-1"}) == std::vector<bool>{true, true, true, true});
  // arguments.py:327 moe_freq_type evaluates the Python expression.
  CHECK(Pattern({"--moe-layer-freq", "([1]*4)"}) == std::vector<bool>{true, true, true, true});
  CHECK(Pattern({"--moe-layer-freq", "([0]+[1]*3)"}) == std::vector<bool>{false, true, true, true});
  CHECK(Pattern({"--moe-layer-freq", "([1]*1+[0]*1)*2"}) ==
        std::vector<bool>{true, false, true, false});
  CHECK(DeriveError({"--num-experts", "4", "--moe-layer-freq", "([1]*3)"})
            .find("a list of 2 entries (one per layer) expected, got 3") != std::string::npos);
}

TEST_CASE("Megatron args: --first-k-dense-replace: the first K layers dense when a frequency is given") {
  // mindspeed_llm/core/transformer/transformer_block.py:112-120.
  CHECK(Pattern({"--moe-layer-freq", "1", "--first-k-dense-replace", "1"}) ==
        std::vector<bool>{false, true, true, true});
  CHECK(Pattern({"--moe-layer-freq", "-1", "--first-k-dense-replace", "-1"}) ==
        std::vector<bool>{true, true, true, true});
}

TEST_CASE("Megatron args: --n-shared-experts: one shared expert N × the expert width, --shared-expert-gate") {
  // mindspeed_llm/features_manager/moe/shared_expert.py:16-18: N × moe_ffn_hidden_size.
  const Setup s = DeriveFrom({"--num-experts", "4", "--moe-ffn-hidden-size", "128",
                              "--n-shared-experts", "2", "--shared-expert-gate"});
  CHECK(s.model.moe_shared_expert_intermediate_size == 256);
  CHECK(s.model.moe_shared_expert_gate);
  // Megatron-LM's own --moe-shared-expert-gate: shared_experts.py:139, a [1, h] weight.
  CHECK(DeriveFrom({"--num-experts", "4", "--moe-shared-expert-intermediate-size", "256",
                    "--moe-shared-expert-gate"})
            .model.moe_shared_expert_gate);
}

}  // namespace
}  // namespace memsim::config
