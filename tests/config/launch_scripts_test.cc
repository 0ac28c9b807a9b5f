// Published launch scripts, unedited (tests/data/launch_scripts/, SOURCES.md names each one's
// repository, path and commit): each runs without --allow-unsupported and memsim's parameters
// per rank equal what Megatron's get_model prints for it ("number of parameters on (tensor,
// pipeline) model parallel rank (0, p)"), derived below from Megatron-LM's modules at the pinned
// commit d98e8a64 (megatron/core/models/gpt/gpt_layer_specs.py, transformer/mlp.py,
// moe/experts.py, tensor_parallel/layers.py) where no published log exists. Conventions of every
// derivation: a TE linear with a fused norm holds the norm weight (RMSNorm: h; LayerNorm: 2h),
// replicated over tensor-parallel ranks like the router and the final norm; column-parallel
// weights hold out/t rows, row-parallel ones in/t columns; a gated (SwiGLU) fc1 is 2·ffn wide;
// the vocabulary is padded to a multiple of make_vocab_size_divisible_by × TP
// (megatron/training/vocab_utils.py:58) and split over TP; without
// --untie-embeddings-and-output-weights the last stage holds its own copy of the word
// embeddings when PP > 1, none when PP = 1.
#include <catch2/catch.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "config/launch_script.h"
#include "config/load.h"
#include "config/megatron_args.h"
#include "workload/build.h"

namespace memsim::config {
namespace {

std::string LaunchScriptPath(const std::string& name) {
  return std::string(MEMSIM_SOURCE_DIR) + "/tests/data/launch_scripts/" + name;
}

Setup LoadPublishedScript(const std::string& name, const std::string& device,
                          std::vector<std::string> overrides = {}) {
  LoadOptions o;
  o.device = device;
  o.overrides = std::move(overrides);
  return LoadSetupFromMegatron(ReadMegatronArgsFile(LaunchScriptPath(name)), o, MegatronOptions{});
}

std::int64_t ParametersOnStage(const Setup& s, int pipeline_rank) {
  return workload::ComputeStaticSizes(s, pipeline_rank).parameter_count;
}

TEST_CASE("Megatron-LM's Mixtral 8x7B example: parameters per rank as Megatron builds them") {
  // The script leaves the vocabulary to its Llama2Tokenizer (32000 tokens) and the node count
  // to SLURM_NNODES (1 when unset, which gives DP 2, too few ranks for EP 8); the run it
  // describes has 4 nodes: 32 GPUs / (TP 1 × PP 4) = DP 8. Both given with --set.
  const Setup s = LoadPublishedScript("megatron_train_mixtral_8x7b_distributed.sh", "h100-80g",
                                      {"model.vocab_size=32000", "training.data_parallel_size=8"});
  CHECK(s.training.data_parallel_size == 8);
  // No --attention-backend: Megatron's default auto (flash or fused attention).
  CHECK(s.training.use_flash_attn);
  // h 4096, 8/32 layers per stage (PP 4), GQA 8 groups × 128 channels, ffn 14336, 8 experts
  // over EP 8 = 1 local expert, no biases, RMSNorm, vocabulary 32000 (a multiple of 128).
  // A layer: linear_qkv 4096 × (4096 + 2·8·128) = 25,165,824 + its norm 4,096; linear_proj
  // 4096 × 4096 = 16,777,216; pre-MLP norm 4,096; router 8 × 4096 = 32,768; one expert
  // fc1 2·14336 × 4096 = 117,440,512 + fc2 14336 × 4096 = 58,720,256: 218,144,768.
  // Eight layers 1,745,158,144; stage 0 adds the embedding 32000 × 4096 = 131,072,000:
  // 1,876,230,144; stage 3 the final norm 4,096 and the untied output layer 131,072,000:
  // 1,876,234,240.
  CHECK(ParametersOnStage(s, 0) == 1876230144);
  CHECK(ParametersOnStage(s, 3) == 1876234240);
}

TEST_CASE("Megatron-LM's GPT-3 175B example: parameters per rank as Megatron builds them") {
  // TP 8 × PP 16 = 128 GPUs while the script names 8: the data-parallel size (1) is given with
  // --set, which overrides the world size the script implies. The GPT-2 BPE vocabulary has
  // 50257 tokens, padded to a multiple of 128 × 8 = 1024: 51200. The global batch is the first
  // step of the script's --step-batch-size-schedule (16; 1536 micro-batches of 96 layers exceed
  // memsim's simulation limit), which changes no parameter.
  const Setup s = LoadPublishedScript("megatron_train_gpt3_175b_distributed.sh", "h100-80g",
                                      {"model.vocab_size=50257", "training.data_parallel_size=1",
                                       "training.global_batch_size=16"});
  // h 12288, 96 heads, 6/96 layers per stage, LayerNorm (weight and bias: 2h), biases, GELU
  // MLP 4h (no --ffn-hidden-size and no --swiglu: 4·h, arguments.py:1329), learned positions.
  // A layer on a TP rank: qkv 3h·h/8 + bias 3h/8, its norm 2h; proj h·h/8 + bias h; the MLP's
  // norm 2h; fc1 4h·h/8 + bias 4h/8; fc2 h·4h/8 + bias h: 1.5·h² + 7h/8 + 6h
  // = 226,492,416 + 10,752 + 73,728 = 226,576,896; six layers 1,359,461,376.
  // Stage 0 adds word embeddings 51200/8 × 12288 = 78,643,200 and positions 2048 × 12288 =
  // 25,165,824: 1,463,270,400. Stage 15 adds the final LayerNorm 24,576 and its copy of the
  // tied word embeddings 78,643,200: 1,438,129,152.
  CHECK(ParametersOnStage(s, 0) == 1463270400);
  CHECK(ParametersOnStage(s, 15) == 1438129152);
}

TEST_CASE("Megatron-Bridge's Llama-3.2-1B Megatron-LM launch: parameters as Megatron builds them") {
  const Setup s = LoadPublishedScript("megatron_bridge_test_llama32_1b_mcore.sh", "h100-80g");
  CHECK(s.training.data_parallel_size == 2);  // torchrun --nproc_per_node=2, TP 1, PP 1
  // h 2048, 16 layers, 32 heads × kv_channels 64, 8 groups, ffn 8192 (SwiGLU), RMSNorm, no
  // biases; NullTokenizer with --vocab-size 131072 (at d98e8a64 its vocabulary is exactly that,
  // megatron/core/tokenizers/text/libraries/null_tokenizer.py), a multiple of 128; tied.
  // A layer: qkv (32 + 16)·64 × 2048 = 6,291,456; proj 2048 × 2048 = 4,194,304; fc1 2·8192 ×
  // 2048 = 33,554,432; fc2 16,777,216; two norms 4,096: 60,821,504; 16 layers 973,144,064.
  // Embedding 131072 × 2048 = 268,435,456, final norm 2,048: 1,241,581,568.
  CHECK(ParametersOnStage(s, 0) == 1241581568);
}

TEST_CASE("Megatron-Bridge's Qwen3-4B Megatron-LM launch: parameters as Megatron builds them") {
  const Setup s = LoadPublishedScript("megatron_bridge_test_qwen3_4b_mcore.sh", "h100-80g");
  CHECK(s.training.data_parallel_size == 2);  // 4 GPUs / TP 2
  // h 2560, 36 layers, 32 heads × 128, 8 groups, ffn 9728, --qk-layernorm (q and k RMSNorm
  // over the 128 channels, replicated), tied; vocabulary 151936 padded to a multiple of
  // 128 × 2: 152064. A layer on a TP rank: qkv (32 + 16)·128/2 × 2560 = 7,864,320; q/k norms
  // 256; proj 4096/2 × 2560 = 5,242,880; fc1 2·9728/2 × 2560 = 24,903,680; fc2 9728/2 × 2560 =
  // 12,451,840; two norms 5,120: 50,468,096; 36 layers 1,816,851,456. Embedding 152064/2 ×
  // 2560 = 194,641,920, final norm 2,560: 2,011,495,936.
  CHECK(ParametersOnStage(s, 0) == 2011495936);
}

TEST_CASE("MindSpeed-LLM's Llama-2-7B pretraining script: parameters as Megatron builds them") {
  // Llama2Tokenizer: 32000 tokens, --make-vocab-size-divisible-by 1.
  const Setup s = LoadPublishedScript("mindspeed_llm_pretrain_llama2_7b_ptd.sh", "ascend-910b-64g",
                                      {"model.vocab_size=32000"});
  // h 4096, 16/32 layers per stage (PP 2), MHA 32 heads, ffn 11008 (SwiGLU), RMSNorm, no
  // biases, untied. A layer: qkv 3·4096² = 50,331,648; proj 16,777,216; fc1 2·11008 × 4096 =
  // 90,177,536; fc2 45,088,768; two norms 8,192: 202,383,360; 16 layers 3,238,133,760.
  // Stage 0 + embedding 32000 × 4096 = 131,072,000: 3,369,205,760; stage 1 + output layer
  // 131,072,000 + final norm 4,096: 3,369,209,856.
  CHECK(ParametersOnStage(s, 0) == 3369205760);
  CHECK(ParametersOnStage(s, 1) == 3369209856);
}

TEST_CASE("MindSpeed-LLM's Qwen2.5-7B 32k script: parameters as Megatron builds them") {
  const Setup s =
      LoadPublishedScript("mindspeed_llm_pretrain_qwen25_7b_32k_ptd.sh", "ascend-910b-64g");
  // h 3584, 14/28 layers per stage (PP 2), TP 4, 28 heads × 128, 4 groups, QKV bias, ffn 18944,
  // --padded-vocab-size 152064, untied. A layer on a TP rank: qkv (28 + 8)·128/4 = 1152 rows ×
  // 3584 = 4,128,768 + bias 1,152; proj 3584/4 × 3584 = 3,211,264; fc1 2·18944/4 × 3584 =
  // 33,947,648; fc2 18944/4 × 3584 = 16,973,824; two norms 7,168: 58,269,824; 14 layers
  // 815,777,536. Stage 0 + embedding 152064/4 × 3584 = 136,249,344: 952,026,880; stage 1 +
  // output layer 136,249,344 + final norm 3,584: 952,030,464.
  CHECK(ParametersOnStage(s, 0) == 952026880);
  CHECK(ParametersOnStage(s, 1) == 952030464);
}

TEST_CASE("MindSpeed-LLM's Mixtral 8x7B script: parameters as Megatron builds them",
          "[launch_scripts]") {
  // Llama2Tokenizer (32000); --moe-layer-freq -1 with --first-k-dense-replace -1: every layer
  // MoE (Python's i % -1 == 0, i >= -1).
  const Setup s = LoadPublishedScript("mindspeed_llm_pretrain_mixtral_8x7b_ptd.sh",
                                      "ascend-910b-64g", {"model.vocab_size=32000"});
  CHECK(s.training.data_parallel_size == 2);  // 64 NPUs / (TP 8 × CP 4)
  // TP 8, PP 1, EP 1 (expert TP = TP 8): a layer on a TP rank: qkv 6144/8 × 4096 = 3,145,728;
  // proj 512 × 4096 = 2,097,152; two norms 8,192; router 8 × 4096 = 32,768; 8 experts of
  // (2·14336/8 + 14336/8) × 4096 = 22,020,096: 176,160,768; 181,444,608 a layer, 32 layers
  // 5,806,227,456. Embedding and output 32000/8 × 4096 = 16,384,000 each, final norm 4,096:
  // 5,838,999,552.
  CHECK(ParametersOnStage(s, 0) == 5838999552);
}

TEST_CASE("MindSpeed-LLM's Qwen2-57B-A14B script: parameters as Megatron builds them",
          "[launch_scripts]") {
  const Setup s = LoadPublishedScript("mindspeed_llm_pretrain_qwen2_57b_a14b_4k_ptd.sh",
                                      "ascend-910b-64g");
  CHECK(s.training.data_parallel_size == 4);  // 64 NPUs / (PP 4 × CP 4)
  // h 3584, 7/28 layers per stage (PP 4), TP 1, 28 heads × 128, 4 groups, QKV bias, 64 experts
  // over EP 4 = 16 local of width 2560, --n-shared-experts 8: one shared expert 8 × 2560 =
  // 20480 wide (mindspeed_llm/features_manager/moe/shared_expert.py) with --shared-expert-gate
  // Linear(h, 1); --padded-vocab-size 151936, untied. A layer: qkv 4608 × 3584 = 16,515,072 +
  // bias 4,608; proj 3584² = 12,845,056; two norms 7,168; router 64 × 3584 = 229,376; 16
  // experts × 3·2560 × 3584 = 440,401,920; shared expert 3·20480 × 3584 = 220,200,960; its
  // gate 3,584: 690,207,744; 7 layers 4,831,454,208. Stage 0 + embedding 151936 × 3584 =
  // 544,538,624: 5,375,992,832; stage 3 + output layer 544,538,624 + final norm 3,584:
  // 5,375,996,416.
  CHECK(ParametersOnStage(s, 0) == 5375992832);
  CHECK(ParametersOnStage(s, 3) == 5375996416);
}

// The script assigns DTYPE="fp8" itself (line 39) and takes its FP8 flags in
// `if [[ "$DTYPE" == "fp8" ]]`; --script-var DTYPE=bf16 pins the variable, so the script's own
// assignment is skipped and the else-less branch adds nothing: no edit of the script.
TEST_CASE("Megatron-LM's Llama-3 8B H100 example in bf16: parameters as Megatron builds them",
          "[launch_scripts]") {
  LoadOptions o;
  o.device = "h100-80g";
  const MegatronLaunch launch = ReadMegatronArgsFile(
      LaunchScriptPath("megatron_train_llama3_8b_h100_fp8.sh"), {}, {{"DTYPE", "bf16"}});
  for (const LaunchArgument& a : launch.arguments) CHECK_FALSE(a.name.starts_with("--fp8"));
  CHECK(std::any_of(launch.warnings.begin(), launch.warnings.end(), [](const std::string& w) {
    return w.find("--script-var DTYPE=bf16: the script's own assignment at line 39 skipped") !=
           std::string::npos;
  }));
  const Setup s = LoadSetupFromMegatron(launch, o, MegatronOptions{});
  // h 4096, 32 layers, TP 1, PP 1, GQA 8 × 128, ffn 14336, vocabulary 128256 (a multiple of
  // 128), untied. A layer: qkv 25,165,824; proj 16,777,216; fc1 117,440,512; fc2 58,720,256;
  // two norms 8,192: 218,112,000; 32 layers 6,979,584,000; embedding and output 128256 × 4096
  // = 525,336,576 each, final norm 4,096: 8,030,261,248.
  CHECK(ParametersOnStage(s, 0) == 8030261248);
}

// Unedited, the script runs its FP8 branch (DTYPE="fp8", line 39): the first refusal names
// --fp8-format with the other FP8 flags, all of them unsupported, so --allow-unsupported runs
// the bf16 rest of the script (memsim models no FP8: src/config/training.cc refuses fp8_format).
TEST_CASE("Megatron-LM's Llama-3 8B FP8 example: every FP8 flag is refused at once, then dropped",
          "[launch_scripts]") {
  LoadOptions o;
  o.device = "h100-80g";
  const MegatronLaunch launch =
      ReadMegatronArgsFile(LaunchScriptPath("megatron_train_llama3_8b_h100_fp8.sh"), {});
  std::string message;
  try {
    LoadSetupFromMegatron(launch, o, MegatronOptions{});
  } catch (const UnsupportedError& e) {
    message = e.what();
  }
  CHECK(message.find("--fp8-format") != std::string::npos);
  CHECK(message.find("--fp8-param-gather") != std::string::npos);
  MegatronOptions allow;
  allow.allow_unsupported = true;
  const Setup s = LoadSetupFromMegatron(launch, o, allow);
  CHECK(ParametersOnStage(s, 0) == 8030261248);  // as the bf16 test above derives it
}

// Pai-Megatron-Patch's run_mcore_qwen3.sh takes its settings as 27 positional arguments and runs
// `eval ${run_cmd}`; the same arguments as launch_script_test.cc's reading of it (Qwen3-30B-A3B,
// bf16, TP 1, PP 1, CP 1, EP 4, distributed optimizer, flash attention, selective recompute).
TEST_CASE("Pai-Megatron-Patch's Qwen3-30B-A3B launch: parameters per rank as Megatron builds them",
          "[launch_scripts]") {
  const std::vector<std::string> args = {
      "dsw", "A3B",   "1",      "8",  "1e-5", "1e-6", "1024",        "1024",  "bf16",
      "1",   "1",     "1",      "1",  "4",    "true", "true",        "true",  "false",
      "sel", "false", "100000", "/d", "/v",   "none", "10000000000", "10000", "/o"};
  LoadOptions o;
  o.device = "h100-80g";
  // GPUS_PER_NODE comes from `python -c "...device_count()"`, which the reader does not run:
  // the world size of one 8-GPU node is given as DP 8 (8 / (TP 1 × PP 1 × CP 1)).
  o.overrides = {"training.data_parallel_size=8"};
  const Setup s = LoadSetupFromMegatron(
      ReadMegatronArgsFile(LaunchScriptPath("eval_pai_run_mcore_qwen3.sh"), args), o,
      MegatronOptions{});
  // The A3B branch: h 2048, 48 layers, 32 heads × --kv-channels 128 (q 4096), 4 query groups
  // (k and v 512 each), --qk-layernorm (RMSNorm over the 128 channels of q and of k), no
  // biases, 128 experts of width 768 over EP 4 = 32 local, every layer MoE ('([1]*48)'),
  // --padded-vocab-size 151936, untied. A layer: linear_qkv (4096 + 2·512) × 2048 =
  // 10,485,760 and its fused norm 2,048; q/k norms 256; proj 2048 × 4096 = 8,388,608;
  // pre-MLP norm 2,048; router 128 × 2048 = 262,144; 32 experts × (2·768 + 768) × 2048 =
  // 150,994,944: 170,135,808; 48 layers 8,166,518,784. Embedding and output layer 151936 ×
  // 2048 = 311,164,928 each, final norm 2,048: 8,788,850,688.
  CHECK(s.training.data_parallel_size == 8);
  CHECK(ParametersOnStage(s, 0) == 8788850688);
}

}  // namespace
}  // namespace memsim::config
