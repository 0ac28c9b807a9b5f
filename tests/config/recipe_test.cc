// Fine-tuning recipes (config/recipe.h): real LLaMA-Factory, axolotl and TRL / alignment-handbook
// YAML files (tests/data/recipes, SOURCES.md) read unedited into the Hugging Face Trainer + PEFT
// stack. Each expected number is derived below from the model's published config.json shape and
// the tool's defaults; none is taken from memsim's output.
#include <stdlib.h>
#include <unistd.h>

#include <fstream>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <string>

#include "config/load.h"
#include "config/recipe.h"
#include "config/yaml_document.h"
#include "core/error.h"
#include "test_util.h"
#include "workload/build.h"

namespace memsim::config {
namespace {

using testing::ErrorOf;
using testing::WriteTemp;

std::string RecipePath(const std::string& name) {
  return std::string(MEMSIM_SOURCE_DIR) + "/tests/data/recipes/" + name;
}

// Recipes name hub ids; an empty HF cache makes them resolve from memsim's catalogue whatever
// the machine's ~/.cache holds.
LoadOptions RecipeOptions(const std::string& device = "h100-80g") {
  static const std::string empty_cache = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("memsim-recipe-hub-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
  }();
  ::setenv("HF_HUB_CACHE", empty_cache.c_str(), 1);
  LoadOptions o;
  o.device = device;
  return o;
}

// bitsandbytes 4-bit storage of a weight of n elements (bitsandbytes functional.py
// quantize_4bit, blocksize 64): n/2 packed bytes and one absmax per 64 values, fp32, or with
// nested quantisation a uint8 absmax per block plus an fp32 absmax per 256 blocks.
std::int64_t RecipeFourBit(std::int64_t n, bool nested) {
  const std::int64_t blocks = (n + 63) / 64;
  return (n + 1) / 2 + (nested ? blocks + 4 * ((blocks + 255) / 256) : 4 * blocks);
}

// LoRA on every linear of a llama-family layer adds r x (in + out) per linear (lora_A [r, in],
// lora_B [out, r]); with h, q_out = heads x head_dim, kv_out = kv_heads x head_dim, ffn:
// q (h + q_out), k and v (h + kv_out), o (q_out + h), gate and up (h + ffn), down (ffn + h).
std::int64_t RecipeAdapterParams(std::int64_t h, std::int64_t q_out, std::int64_t kv_out,
                              std::int64_t ffn, std::int64_t layers, std::int64_t r) {
  const std::int64_t per_layer = (h + q_out) + 2 * (h + kv_out) + (q_out + h) + 3 * (h + ffn);
  return r * per_layer * layers;
}

TEST_CASE("recipe: LLaMA-Factory qwen3_lora_sft.yaml is LoRA r 8 on every linear of Qwen3-4B",
          "[config][recipe]") {
  const Setup s = LoadSetup(RecipePath("llamafactory-qwen3_lora_sft.yaml"), RecipeOptions("rtx-4090-24g"));
  REQUIRE(!s.recipe.empty());
  CHECK(s.recipe[0] == "LLaMA-Factory v0.9.5 recipe");
  // Qwen3-4B (models/qwen3-4b.json): h 2560, 32 heads x 128 = 4096, 8 kv heads x 128 = 1024,
  // ffn 9728, 36 layers. lora_target all = the 7 linears, lora_rank 8:
  // per layer 8 x (6656 + 2 x 3584 + 6656 + 3 x 12288) = 8 x 57344 = 458752; x 36 = 16,515,072,
  // what print_trainable_parameters prints.
  const std::int64_t adapter = RecipeAdapterParams(2560, 4096, 1024, 9728, 36, 8);
  CHECK(adapter == 16515072);
  // Base: embedding 151936 x 2560 (tied) = 388,956,160; per layer q 10,485,760 + k, v 2,621,440
  // each + o 10,485,760 + MLP 3 x 24,903,680 + norms 2 x 2560 + q_norm, k_norm 2 x 128 =
  // 100,930,816, x 36 = 3,633,509,376; final norm 2560: 4,022,468,096.
  const std::int64_t base = 4022468096;
  const workload::ParameterCounts counts = workload::TotalParameterCounts(s);
  CHECK(counts.trainable == adapter);
  CHECK(counts.total == base + adapter);
  const workload::StaticSizes sizes = workload::ComputeStaticSizes(s, 0);
  // Frozen weights in the checkpoint's bf16 (torch_dtype "auto"), adapters fp32, no
  // quantisation; AdamW (adamw_torch) exp_avg + exp_avg_sq fp32 for the adapters only.
  CHECK(sizes.parameter_bytes == 2 * base + 4 * adapter);
  CHECK(sizes.optimizer_state_bytes == 8 * adapter);
  CHECK(s.training.seq_length == 2048);  // cutoff_len
  CHECK(s.training.micro_batch_size == 1);
}

TEST_CASE("recipe: alignment-handbook zephyr QLoRA is NF4 Mistral-7B with r 16 adapters",
          "[config][recipe]") {
  const Setup s = LoadSetup(RecipePath("handbook-zephyr-7b-beta-sft-config_qlora.yaml"), RecipeOptions());
  REQUIRE(!s.recipe.empty());
  CHECK(s.recipe[0] == "TRL v1.9.0 recipe");
  // Mistral-7B-v0.1: h 4096, q 4096, kv 8 x 128 = 1024, ffn 14336, 32 layers; r 16 on the 7
  // listed modules: 16 x (8192 + 2 x 5120 + 8192 + 3 x 18432) = 16 x 81920 per layer, x 32 =
  // 41,943,040.
  const std::int64_t adapter = RecipeAdapterParams(4096, 4096, 1024, 14336, 32, 16);
  CHECK(adapter == 41943040);
  CHECK(workload::TotalParameterCounts(s).trainable == adapter);
  // Quantised: each layer's linears, 4096x4096 (q, o), 4096x1024 (k, v), 4096x14336 (x3); TRL's
  // use_bnb_nested_quant defaults to false. Not quantised: SFTTrainer runs peft's
  // prepare_model_for_kbit_training (every bf16 parameter to fp32), then, with bf16 (TRL's
  // default) and 4-bit weights, peft_module_casting_to_bf16 casts embedding and lm_head
  // (32000 x 4096 each) back to bf16 and keeps the norms (2 of 4096 per layer, the final one)
  // fp32.
  std::int64_t four_bit = 0;
  for (std::int64_t n : {4096LL * 4096, 4096LL * 1024, 4096LL * 1024, 4096LL * 4096,
                         4096LL * 14336, 4096LL * 14336, 4096LL * 14336}) {
    four_bit += RecipeFourBit(n, false);
  }
  four_bit *= 32;
  const std::int64_t bf16 = 2 * (2 * 32000LL * 4096);
  const std::int64_t fp32_norms = 4 * (32 * 2 * 4096 + 4096);
  CHECK(s.training.hf_trainer()->kbit_prepared);
  const workload::StaticSizes sizes = workload::ComputeStaticSizes(s, 0);
  CHECK(sizes.parameter_bytes == four_bit + bf16 + fp32_norms + 4 * adapter);
  CHECK(sizes.optimizer_state_bytes == 8 * adapter);
  CHECK(s.training.seq_length == 2048);  // max_seq_length
  CHECK(s.training.micro_batch_size == 4);
}

TEST_CASE("recipe: full fine-tunes keep every parameter trainable", "[config][recipe]") {
  SECTION("alignment-handbook zephyr full: Mistral-7B in bf16") {
    const Setup s = LoadSetup(RecipePath("handbook-zephyr-7b-beta-sft-config_full.yaml"), RecipeOptions());
    // per layer 218,103,808 linear + 8192 norm = 218,112,000, x 32 = 6,979,584,000; embedding
    // and lm_head 131,072,000 each; final norm 4096: 7,241,732,096.
    const std::int64_t n = 7241732096;
    const workload::ParameterCounts counts = workload::TotalParameterCounts(s);
    CHECK(counts.total == n);
    CHECK(counts.trainable == n);
    const workload::StaticSizes sizes = workload::ComputeStaticSizes(s, 0);
    CHECK(sizes.parameter_bytes == 2 * n);  // torch_dtype bfloat16
    // adamw_torch: exp_avg and exp_avg_sq are zeros_like(p), bf16 like the weights (torch
    // optim/adamw.py _init_group): 2 x 2 bytes a parameter.
    CHECK(sizes.optimizer_state_bytes == 4 * n);
    CHECK(s.training.micro_batch_size == 16);
  }
  SECTION("alignment-handbook SmolLM2 full: SmolLM2-1.7B in bf16") {
    const Setup s = LoadSetup(RecipePath("handbook-smollm2-sft-config.yaml"), RecipeOptions());
    // h 2048, 32 heads and 32 kv heads of 64: q, k, v, o 2048 x 2048; MLP 3 x 2048 x 8192;
    // 2 norms: 67,112,960 per layer, x 24 = 1,610,711,040; tied embedding 49152 x 2048 =
    // 100,663,296; final norm 2048: 1,711,376,384.
    const std::int64_t n = 1711376384;
    CHECK(workload::TotalParameterCounts(s).trainable == n);
    CHECK(workload::ComputeStaticSizes(s, 0).parameter_bytes == 2 * n);
    CHECK(workload::ComputeStaticSizes(s, 0).optimizer_state_bytes == 4 * n);  // bf16 AdamW state
    CHECK(s.training.seq_length == 8192);
  }
  SECTION("TRL's CLI example: Qwen2.5-0.5B at TRL's defaults (fp32, max_length 1024)") {
    const Setup s = LoadSetup(RecipePath("trl-cli-example_config.yaml"), RecipeOptions());
    // h 896, 14 heads of 64, 2 kv heads (128), ffn 4864, 24 layers, q/k/v biases: attention
    // 802,816 + 896 + 2 x (114,688 + 128) + 802,816 = 1,836,160, MLP 13,074,432, norms 1792:
    // 14,912,384 per layer, x 24 = 357,897,216; tied embedding 151936 x 896 = 136,134,656;
    // final norm 896: 494,032,768.
    const std::int64_t n = 494032768;
    CHECK(workload::TotalParameterCounts(s).trainable == n);
    const workload::StaticSizes sizes = workload::ComputeStaticSizes(s, 0);
    CHECK(sizes.parameter_bytes == 4 * n);        // ModelConfig.dtype default float32
    CHECK(sizes.optimizer_state_bytes == 8 * n);  // AdamW, fp32 states
    CHECK(s.training.seq_length == 1024);         // SFTConfig.max_length default
    CHECK(s.training.micro_batch_size == 8);      // TrainingArguments default
  }
}

TEST_CASE("recipe: a DeepSpeed or FSDP recipe says the stack is not modelled", "[config][recipe]") {
  for (const char* name : {"llamafactory-qwen3_lora_sft_ds3.yaml", "llamafactory-qwen3_full_sft.yaml"}) {
    const std::string e = ErrorOf(RecipePath(name), RecipeOptions());
    // LLaMA-Factory v0.9.5's examples: `deepspeed: examples/deepspeed/ds_z3_config.json`.
    CHECK(e.rfind("unsupported: " + RecipePath(name) + ":", 0) == 0);
    CHECK(e.find(": deepspeed: DeepSpeed (ZeRO sharding and its own optimizer and buffers) is not "
                 "modelled yet") != std::string::npos);
  }
  const std::string e = ErrorOf(RecipePath("axolotl-llama-3-fft-8b-liger-fsdp.yaml"), RecipeOptions());
  CHECK(e.find("unsupported: ") == 0);
  CHECK(e.find(": fsdp: FSDP is not modelled yet") != std::string::npos);
}

// Recipes that need bitsandbytes 8-bit weights, a quant-storage dtype other than uint8 or the
// 8-bit optimizers.
TEST_CASE("recipe: 8-bit and bf16-storage recipes", "[config][recipe]") {
  SECTION("LLaMA-Factory qwen3_lora_sft_otfq: 4-bit, nested, bf16 storage") {
    const Setup s = LoadSetup(RecipePath("llamafactory-qwen3_lora_sft_otfq.yaml"), RecipeOptions());
    const std::int64_t adapter = RecipeAdapterParams(2560, 4096, 1024, 9728, 36, 8);
    CHECK(workload::TotalParameterCounts(s).trainable == adapter);  // 16,515,072
    // bnb_4bit_quant_storage bf16 holds the same packed bytes (two values a byte).
    std::int64_t four_bit = 0;
    for (std::int64_t n : {2560LL * 4096, 2560LL * 1024, 2560LL * 1024, 4096LL * 2560,
                           2560LL * 9728, 2560LL * 9728, 9728LL * 2560}) {
      four_bit += RecipeFourBit(n, true);
    }
    four_bit *= 36;
    const std::int64_t bf16 = 2 * (151936LL * 2560 + 36 * (2 * 2560 + 2 * 128) + 2560);
    const workload::StaticSizes sizes = workload::ComputeStaticSizes(s, 0);
    CHECK(sizes.parameter_bytes == four_bit + bf16 + 4 * adapter);
    CHECK(sizes.optimizer_state_bytes == 8 * adapter);
  }
  SECTION("axolotl llama-3 lora-8b: LLM.int8 weights, r 32, embed_tokens and lm_head saved") {
    const Setup s = LoadSetup(RecipePath("axolotl-llama-3-lora-8b.yml"), RecipeOptions());
    // Llama-3-8B has Mistral-7B's layer shapes: r 32 -> 32 x 81920 x 32 = 83,886,080; the
    // trainable copies of embed_tokens and lm_head, 128256 x 4096 each = 525,336,576.
    const std::int64_t adapter = RecipeAdapterParams(4096, 4096, 1024, 14336, 32, 32);
    CHECK(adapter == 83886080);
    CHECK(workload::TotalParameterCounts(s).trainable == adapter + 2 * 525336576LL);
    // optimizer: adamw_bnb_8bit (bitsandbytes AdamW8bit, not paged): two states of 1 byte an
    // element plus an fp32 absmax per block of 256 (bitsandbytes optim/optimizer.py
    // Optimizer2State.init_state; every trainable tensor here has >= 4096 elements, so none
    // keeps 32-bit state). Every tensor's size is a multiple of 256, so the state is
    // 2 x n x (1 + 4/256) over n = 83,886,080 + 1,050,673,152 = 1,134,559,232 elements:
    // 2 x (1,134,559,232 + 17,727,488) = 2,304,573,440 bytes; plus the two 256-entry fp32
    // quantization maps the optimizer moves to the device once ("dynamic" and "udynamic",
    // Optimizer2State.init_state's name2qmap): 2 x 1024 bytes. 2,304,575,488 in all.
    const workload::StaticSizes sizes = workload::ComputeStaticSizes(s, 0);
    CHECK(sizes.optimizer_state_bytes == 2304573440LL + 2 * 1024);
    // The weights: LLM.int8 (bitsandbytes Int8Params) on the 7 linears of the 32 layers, an int8
    // byte an element plus an fp32 scale per output row (SCB): 218,103,808 + 4 x 43,008 rows a
    // layer; lm_head stays bf16 (transformers' get_keys_to_not_convert keeps the output
    // embedding), as do the embedding and the norms (2 x 4096 a layer, the final 4096);
    // modules_to_save adds a trainable copy of embed_tokens and lm_head (peft
    // ModulesToSaveWrapper, the module's dtype, bf16); the LoRA matrices fp32.
    const std::int64_t int8 = 32 * (218103808LL + 4 * 43008);
    const std::int64_t bf16 = 2 * (4 * 525336576LL + 32 * 2 * 4096 + 4096);
    CHECK(sizes.parameter_bytes == int8 + bf16 + 4 * adapter);
    CHECK(sizes.managed_optimizer_state_bytes == 0);
  }
  SECTION("axolotl llama-3 lora-1b and qlora-1b: r 16 and r 32 on Llama-3.2-1B") {
    // h 2048, 32 heads of 64, kv 8 x 64 = 512, ffn 8192, 16 layers: per layer 44032 x r.
    const Setup lora = LoadSetup(RecipePath("axolotl-llama-3-lora-1b.yml"), RecipeOptions());
    const std::int64_t n16 = RecipeAdapterParams(2048, 2048, 512, 8192, 16, 16);
    CHECK(workload::TotalParameterCounts(lora).trainable == n16);
    const Setup qlora = LoadSetup(RecipePath("axolotl-llama-3-qlora-1b.yml"), RecipeOptions());
    const std::int64_t n32 = RecipeAdapterParams(2048, 2048, 512, 8192, 16, 32);
    CHECK(workload::TotalParameterCounts(qlora).trainable == n32);
    // adamw_8bit / adamw_bnb_8bit (bitsandbytes AdamW8bit): every adapter matrix has at least
    // 4096 elements (the smallest, 16 x 512, has 8192) and a multiple of 256, so two 1-byte states
    // plus an fp32 absmax per 256 elements, and the two 256-entry fp32 quantization maps once
    // (bitsandbytes optim/optimizer.py Optimizer2State.init_state): 2 x n x 260 / 256 + 2048.
    CHECK(workload::ComputeStaticSizes(lora, 0).optimizer_state_bytes == 2 * n16 * 260 / 256 + 2048);
    // lora-1b quantises nothing: Llama-3.2-1B's 1,235,814,400 weights (per layer 60,817,408 in
    // the linears + 4096 in the norms, x 16; the tied embedding 262,668,288; the final norm
    // 2048) in bf16, the adapters fp32.
    CHECK(workload::ComputeStaticSizes(lora, 0).parameter_bytes == 2 * 1235814400LL + 4 * n16);
    CHECK(workload::ComputeStaticSizes(qlora, 0).optimizer_state_bytes == 2 * n32 * 260 / 256 + 2048);
    // qlora-1b's weights: axolotl's qlora is NF4 with nested quantization (bf16 storage, the
    // same packed bytes) on every linear of the 16 layers (q, o 2048 x 2048; k, v 512 x 2048;
    // gate, up, down 8192 x 2048); the tied embedding 128256 x 2048 and the norms (2 x 2048 a
    // layer and the final 2048) stay bf16; the adapters fp32.
    std::int64_t four_bit = 0;
    for (std::int64_t w : {2048LL * 2048, 512LL * 2048, 512LL * 2048, 2048LL * 2048,
                           8192LL * 2048, 8192LL * 2048, 8192LL * 2048}) {
      four_bit += RecipeFourBit(w, true);
    }
    const std::int64_t bf16 = 2 * (128256LL * 2048 + 16 * 2 * 2048 + 2048);
    CHECK(workload::ComputeStaticSizes(qlora, 0).parameter_bytes == 16 * four_bit + bf16 + 4 * n32);
  }
  SECTION("axolotl mistral config: full fine-tune in bf16 with 8-bit Adam") {
    const Setup s = LoadSetup(RecipePath("axolotl-mistral-config.yml"), RecipeOptions());
    CHECK(workload::TotalParameterCounts(s).trainable == 7241732096);
    CHECK(workload::ComputeStaticSizes(s, 0).parameter_bytes == 2 * 7241732096);
    // adamw_bnb_8bit over every parameter: each tensor has at least 4096 elements (the norms'
    // 4096 is not below bitsandbytes' min_8bit_size) and a multiple of 256, so as above:
    // 2 x 7,241,732,096 x 260 / 256 + 2048 = 14,709,770,368.
    CHECK(workload::ComputeStaticSizes(s, 0).optimizer_state_bytes == 14709770368LL);
  }
}

TEST_CASE("recipe: what is read and what is warned", "[config][recipe]") {
  SECTION("a key of the tool memsim does not read is a warning naming the tool") {
    const std::string path = WriteTemp("lf-typo.yaml",
                                       "model_name_or_path: Qwen/Qwen3-4B-Instruct-2507\n"
                                       "stage: sft\nfinetuning_type: lora\nlora_rnak: 8\n"
                                       "enable_liger_kernel: true\n");
    const Setup s = LoadSetup(path, RecipeOptions());
    bool typo = false, liger = false;
    for (const std::string& w : s.warnings) {
      typo |= w == path + ":4: lora_rnak: not a LLaMA-Factory v0.9.5 key; ignored (did you mean 'lora_rank'?)";
      liger |= w.rfind(path + ":5: enable_liger_kernel: LLaMA-Factory v0.9.5 enable_liger_kernel true:", 0) == 0 &&
               w.find("(memsim high)") != std::string::npos;
    }
    CHECK(typo);
    CHECK(liger);
    // The Liger key is also kept for an out-of-memory verdict's caveat: Liger's fused
    // cross-entropy never holds the whole logits, which memsim does, so memsim errs high.
    REQUIRE(s.not_modelled.size() == 1);
    CHECK(s.not_modelled[0] == NotModelled{path + ":5: enable_liger_kernel", "enable_liger_kernel",
                                           {"true"}, NotModelled::Direction::kHigh, true});
  }
  SECTION("a hub id neither cached nor shipped asks for --model DIR") {
    const std::string path = WriteTemp("trl-unknown.yaml", "model_name_or_path: acme/unknown-7b\n");
    const std::string e = ErrorOf(path, RecipeOptions());
    CHECK(e.rfind(path + ":1: model_name_or_path: model 'acme/unknown-7b' is not in the Hugging "
                         "Face cache", 0) == 0);
    CHECK(e.find("pass --model DIR") != std::string::npos);
  }
  SECTION("the Hugging Face cache is looked in first") {
    const auto hub = std::filesystem::temp_directory_path() / ("memsim-recipe-cache-" + std::to_string(::getpid()));
    const auto snap = hub / "models--acme--tiny" / "snapshots" / "abc123";
    std::filesystem::create_directories(snap);
    WriteTemp("unused", "");
    {
      std::ofstream(snap / "config.json")
          << "{\"model_type\": \"llama\", \"hidden_size\": 256, \"intermediate_size\": 688, "
             "\"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"num_hidden_layers\": 2, "
             "\"vocab_size\": 1000}";
    }
    const std::string path = WriteTemp("trl-cached.yaml", "model_name_or_path: acme/tiny\nmax_length: 64\n");
    LoadOptions o = RecipeOptions();
    ::setenv("HF_HUB_CACHE", hub.string().c_str(), 1);
    const Setup s = LoadSetup(path, o);
    CHECK(s.model.hidden_size == 256);
    CHECK(s.model_path == (snap / "config.json").lexically_normal().generic_string());
  }
  SECTION("malformed YAML names the file and line") {
    const std::string path = WriteTemp("bad.yaml", "model_name_or_path: x\nlora_r: [1, 2\n");
    CHECK(ErrorOf(path, RecipeOptions()).rfind(path + ":", 0) == 0);
    CHECK(ErrorOf(path, RecipeOptions()).find("malformed YAML") != std::string::npos);
  }
  SECTION("a recipe names no device") {
    CHECK(ErrorOf(RecipePath("llamafactory-qwen3_lora_sft.yaml"), {}).rfind(
              RecipePath("llamafactory-qwen3_lora_sft.yaml") + ": a recipe does not name its device", 0) == 0);
  }
}

TEST_CASE("recipe: YAML scalars resolve as PyYAML's safe_load", "[config][recipe]") {
  const internal::YamlDocument d = internal::ParseYaml(
      "a: 1.0e-4\nb: 2e-5\nc: yes\nd: ~\ne: '8'\nf: 1_000\ng: -3\nh: [x, 2]\n", "t.yaml");
  CHECK(d.root["a"].is_number_float());
  CHECK(d.root["b"] == "2e-5");  // no dot: a string in YAML 1.1
  CHECK(d.root["c"] == true);
  CHECK(d.root["d"].is_null());
  CHECK(d.root["e"] == "8");
  CHECK(d.root["f"] == 1000);
  CHECK(d.root["g"] == -3);
  CHECK(d.lines.at("/h") == 8);
  CHECK_THROWS_WITH(internal::ParseYaml("a: 1\na: 2\n", "t.yaml"), "t.yaml:2: a: duplicate key");
}

}  // namespace
}  // namespace memsim::config
