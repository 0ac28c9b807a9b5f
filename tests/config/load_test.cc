// LoadSetup: the embedded default, Hugging Face defaults per model_type, Megatron overrides,
// --set / --model / --device, the allocator block, and what is unsupported.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "config/embedded.h"
#include "config/load.h"
#include "core/units.h"
#include "test_util.h"

namespace memsim::config {
namespace {

using namespace memsim::literals;
using testing::Data;
using testing::ErrorOf;
using testing::IsUnsupported;

// Writes `text` to a fresh file under the system temp dir and returns its path.
std::string TempFile(const std::string& name, const std::string& text) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("memsim_config_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

// A config with an inline model and the given training block (JSON members, no braces).
std::string InlineConfig(const std::string& name, const std::string& model,
                         const std::string& training, const std::string& extra = "") {
  return TempFile(name, "{\"model\": " + model + ", \"device\": \"a100-80g\", \"training\": {" +
                            training + "}" + extra + "}");
}

TEST_CASE("embedded default: llama2-7b on 910B, TP2 DP4", "[config]") {
  const Setup s = LoadSetup("", {});
  CHECK(s.config_path == "<embedded>/configs/default.json");
  CHECK(s.model_path == "<embedded>/models/llama2-7b.json");
  CHECK(ModelName(s) == "llama2-7b");
  // Llama-2-7b-hf config.json.
  CHECK(s.model.model_type == "llama");
  CHECK(s.model.hidden_size == 4096);
  CHECK(s.model.intermediate_size == 11008);
  CHECK(s.model.num_attention_heads == 32);
  CHECK(s.model.num_key_value_heads == 32);
  CHECK(s.model.head_dim == 128);  // 4096 / 32
  CHECK(s.model.num_hidden_layers == 32);
  CHECK(s.model.vocab_size == 32000);
  // 32000 is a multiple of 128 × TP 2 = 256 (125 × 256), so no padding.
  CHECK(s.model.padded_vocab_size == 32000);
  CHECK_FALSE(s.model.tie_word_embeddings);
  CHECK(s.model.gated_mlp);
  CHECK(s.model.normalization == Normalization::kRMSNorm);
  CHECK(s.model.position_embedding_type == PositionEmbedding::kRope);
  // configs/default.json.
  CHECK(s.training.tensor_model_parallel_size == 2);
  CHECK(s.training.pipeline_model_parallel_size == 1);
  CHECK(s.training.data_parallel_size == 4);
  CHECK(s.training.seq_length == 4096);
  CHECK(s.training.micro_batch_size == 1);
  CHECK(s.training.global_batch_size == 64);
  CHECK(s.training.num_micro_batches == 16);  // 64 / (1 × 4)
  CHECK(s.training.sequence_parallel);
  CHECK(s.training.precision == Precision::kBf16);
  CHECK(s.training.accumulate_allreduce_grads_in_fp32);  // forced by bf16 (Megatron)
  CHECK(s.training.use_distributed_optimizer);
  CHECK(s.training.use_flash_attn);
  CHECK(s.training.train_iters == 4);
  // configs/devices/ascend-910b-64g.json: torch_npu's 60.96 GiB total capacity ≈ 62423 MiB.
  CHECK(s.device.name == "ascend-910b-64g");
  CHECK(s.device.allocator_backend == alloc::Backend::kNpu);
  CHECK(s.device.total_memory_bytes == 65536_MiB);
  CHECK(s.device.communicator_buffer_bytes == 400_MiB);  // 2 × HCCL_BUFFSIZE 200 MiB
  CHECK(s.allocator.backend == alloc::Backend::kNpu);
  CHECK(s.allocator.capacity_bytes == std::optional<Bytes>(62423_MiB));
  CHECK_FALSE(s.allocator.expandable_segments);
}

TEST_CASE("the embedded default loads from any working directory", "[config]") {
  const auto old = std::filesystem::current_path();
  std::filesystem::current_path(std::filesystem::temp_directory_path());
  const Setup s = LoadSetup("", {});
  std::filesystem::current_path(old);
  CHECK(s.model.hidden_size == 4096);
  // Without the flag, no config is an error.
  LoadOptions o;
  o.use_embedded_default = false;
  CHECK(ErrorOf("", o) == "no config file given");
}

TEST_CASE("configs/default.json from disk equals the embedded one", "[config]") {
  Setup disk = LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/default.json", {});
  Setup embedded = LoadSetup("", {});
  CHECK(disk.model == embedded.model);
  CHECK(disk.training == embedded.training);
  CHECK(disk.device == embedded.device);
  CHECK(disk.allocator == embedded.allocator);
}

TEST_CASE("Hugging Face defaults per model_type", "[config]") {
  const std::string training = "\"seq_length\": 512";
  SECTION("llama (LlamaConfig)") {
    const Setup s = LoadSetup(InlineConfig("llama.json", "{\"model_type\": \"llama\"}", training), {});
    CHECK(s.model.vocab_size == 32000);
    CHECK(s.model.hidden_size == 4096);
    CHECK(s.model.intermediate_size == 11008);
    CHECK(s.model.num_hidden_layers == 32);
    CHECK(s.model.num_attention_heads == 32);
    CHECK(s.model.num_key_value_heads == 32);  // None -> num_attention_heads
    CHECK(s.model.head_dim == 128);
    CHECK(s.model.max_position_embeddings == 2048);
    CHECK_FALSE(s.model.tie_word_embeddings);
    CHECK(s.model.hidden_act == "silu");
    CHECK(s.model.gated_mlp);
    CHECK_FALSE(s.model.add_bias_linear);
    CHECK_FALSE(s.model.add_qkv_bias);
  }
  SECTION("mistral (MistralConfig)") {
    const Setup s = LoadSetup(InlineConfig("mistral.json", "{\"model_type\": \"mistral\"}", training), {});
    CHECK(s.model.intermediate_size == 14336);
    CHECK(s.model.num_key_value_heads == 8);
    CHECK(s.model.max_position_embeddings == 131072);  // 4096 × 32
  }
  SECTION("qwen2 (Qwen2Config; q/k/v biases hard-coded in Qwen2Attention)") {
    const Setup s = LoadSetup(InlineConfig("qwen2.json", "{\"model_type\": \"qwen2\"}", training), {});
    CHECK(s.model.vocab_size == 151936);
    CHECK(s.model.intermediate_size == 22016);
    CHECK(s.model.max_position_embeddings == 32768);
    CHECK(s.model.add_qkv_bias);
    CHECK_FALSE(s.model.add_bias_linear);
    CHECK_FALSE(s.model.qk_layernorm);
  }
  SECTION("qwen3 (Qwen3Config: head_dim 128, q/k RMSNorm)") {
    const Setup s = LoadSetup(
        InlineConfig("qwen3.json", "{\"model_type\": \"qwen3\", \"hidden_size\": 2560}", training), {});
    CHECK(s.model.head_dim == 128);  // not 2560 / 32 = 80
    CHECK(s.model.qk_layernorm);
    CHECK_FALSE(s.model.add_qkv_bias);
  }
  SECTION("gpt2 (GPT2Config)") {
    const Setup s = LoadSetup(InlineConfig("gpt2.json", "{\"model_type\": \"gpt2\"}", training), {});
    CHECK(s.model.vocab_size == 50257);
    CHECK(s.model.hidden_size == 768);
    CHECK(s.model.intermediate_size == 3072);  // n_inner None -> 4 × 768
    CHECK(s.model.num_hidden_layers == 12);
    CHECK(s.model.num_attention_heads == 12);
    CHECK(s.model.max_position_embeddings == 1024);
    CHECK(s.model.tie_word_embeddings);
    CHECK(s.model.hidden_act == "gelu_new");
    CHECK_FALSE(s.model.gated_mlp);
    CHECK(s.model.normalization == Normalization::kLayerNorm);
    CHECK(s.model.add_bias_linear);
    CHECK(s.model.position_embedding_type == PositionEmbedding::kLearnedAbsolute);
    CHECK(s.model.hidden_dropout == 0.1);
    CHECK(s.model.attention_dropout == 0.1);
  }
  SECTION("gpt2 key aliases must agree") {
    const std::string path = InlineConfig(
        "gpt2_alias.json", "{\"model_type\": \"gpt2\", \"n_embd\": 1024, \"hidden_size\": 768}", training);
    CHECK(ErrorOf(path) == path + ": /model/hidden_size: 768 disagrees with n_embd = 1024");
  }
  SECTION("unused model keys are listed in the notes") {
    const Setup s = LoadSetup(Data("file_model.json"), {});
    CHECK(std::find(s.notes.begin(), s.notes.end(),
                    Data("tiny-llama.json") + ": /torch_dtype: ignored (not used by memsim)") !=
          s.notes.end());
  }
  SECTION("unknown model_type") {
    const std::string path = InlineConfig("lama.json", "{\"model_type\": \"lama\"}", training);
    CHECK(ErrorOf(path) == path + ": /model/model_type: unknown model_type \"lama\", expected one of "
                                  "'llama', 'mistral', 'qwen2', 'qwen3', 'mixtral', 'qwen2_moe', "
                                  "'qwen3_moe', 'gpt2', 'gemma', 'gemma2', 'phi3', 'gpt_neox', "
                                  "'bert', 'roberta', 'deepseek_v3', 'deepseek_v2' (did you mean 'llama'?)");
  }
}

TEST_CASE("Megatron architecture arguments override the model file", "[config]") {
  SECTION("GPT-3 style dims in the training config") {
    const Setup s = LoadSetup(
        InlineConfig("gpt3.json", "{\"model_type\": \"gpt2\"}",
                     "\"seq_length\": 2048, \"num_layers\": 96, \"hidden_size\": 12288, "
                     "\"ffn_hidden_size\": 49152, \"num_attention_heads\": 96, "
                     "\"max_position_embeddings\": 2048, \"tensor_model_parallel_size\": 8, "
                     "\"pipeline_model_parallel_size\": 8, \"global_batch_size\": 64"),
        {});
    CHECK(s.model.num_hidden_layers == 96);
    CHECK(s.model.hidden_size == 12288);
    CHECK(s.model.intermediate_size == 49152);
    CHECK(s.model.num_attention_heads == 96);
    CHECK(s.model.num_key_value_heads == 96);  // MHA stays MHA
    CHECK(s.model.head_dim == 128);            // 12288 / 96
    // GPT-2 BPE 50257 padded to a multiple of 128 × 8 = 1024: ceil(50257 / 1024) = 50 -> 51200.
    CHECK(s.model.padded_vocab_size == 51200);
    CHECK(s.training.num_micro_batches == 64);
  }
  SECTION("the training config wins") {
    const Setup s = LoadSetup(
        InlineConfig("override.json", "{\"model_type\": \"llama\", \"num_key_value_heads\": 8}",
                     "\"seq_length\": 512, \"swiglu\": false, \"normalization\": \"LayerNorm\", "
                     "\"add_bias_linear\": true, \"qk_layernorm\": true, \"kv_channels\": 64, "
                     "\"num_query_groups\": 4, \"untie_embeddings_and_output_weights\": false, "
                     "\"position_embedding_type\": \"learned_absolute\", \"max_position_embeddings\": 4096, "
                     "\"hidden_dropout\": 0.1, \"attention_dropout\": 0.05, "
                     "\"make_vocab_size_divisible_by\": 64"),
        {});
    CHECK_FALSE(s.model.gated_mlp);
    CHECK(s.model.hidden_act == "gelu");
    CHECK(s.model.normalization == Normalization::kLayerNorm);
    CHECK(s.model.add_bias_linear);
    CHECK(s.model.qk_layernorm);
    CHECK(s.model.head_dim == 64);
    CHECK(s.model.num_key_value_heads == 4);
    CHECK(s.model.tie_word_embeddings);
    CHECK(s.model.position_embedding_type == PositionEmbedding::kLearnedAbsolute);
    CHECK(s.model.hidden_dropout == 0.1);
    CHECK(s.model.attention_dropout == 0.05);
    CHECK(s.model.make_vocab_size_divisible_by == 64);
  }
}

TEST_CASE("training defaults and null and Megatron's adjustments", "[config]") {
  const Setup s = LoadSetup(
      InlineConfig("defaults.json", "{\"model_type\": \"llama\"}",
                   "\"seq_length\": 512, \"micro_batch_size\": null, \"recompute_method\": null, "
                   "\"sequence_parallel\": true, \"precision\": \"fp16\""),
      {});
  CHECK(s.training.micro_batch_size == 1);
  CHECK(s.training.global_batch_size == 1);  // micro_batch_size × DP (Megatron default)
  CHECK(s.training.num_micro_batches == 1);
  CHECK_FALSE(s.training.sequence_parallel);  // TP 1: Megatron switches it off
  CHECK_FALSE(s.training.accumulate_allreduce_grads_in_fp32);  // only bf16 forces it
  CHECK(s.training.precision == Precision::kFp16);
  CHECK(s.training.recompute_granularity == RecomputeGranularity::kNone);
  CHECK(s.training.optimizer_impl == OptimizerImpl::kFused);
  CHECK(s.training.transformer_impl == "transformer_engine");
  CHECK(s.training.gradient_accumulation_fusion);  // Megatron's default
  CHECK(s.training.transformer_engine_version.empty());  // not stated: current releases
  CHECK(s.training.megatron_core_version.empty());
}

TEST_CASE("software versions: the forms release tags use, and malformed ones", "[config]") {
  auto load = [](const std::string& te, const std::string& mcore) {
    return LoadSetup(InlineConfig("versions.json", "{\"model_type\": \"llama\"}",
                                  "\"seq_length\": 512, \"transformer_engine_version\": \"" + te +
                                      "\", \"megatron_core_version\": \"" + mcore +
                                      "\", \"gradient_accumulation_fusion\": false"),
                     {})
        .training;
  };
  const TrainingConfig a = load("2.9", "0.15");
  CHECK(a.transformer_engine_version == std::vector<int>{2, 9});
  CHECK(a.megatron_core_version == std::vector<int>{0, 15});
  CHECK_FALSE(a.gradient_accumulation_fusion);
  const TrainingConfig b = load("v1", "core_r0.8.0");  // a missing minor is 0; patch dropped
  CHECK(b.transformer_engine_version == std::vector<int>{1, 0});
  CHECK(b.megatron_core_version == std::vector<int>{0, 8});
  for (const char* bad : {"", "2.", ".9", "2..9", "2.9.1.4", "two", "2.9rc1", "1234567"}) {
    INFO(bad);
    CHECK_THROWS_WITH(load(bad, "0.15"),
                      Catch::Matchers::EndsWith(
                          "/versions.json: /training/transformer_engine_version: expected a "
                          "version string such as \"2.9\", got \"" +
                          std::string(bad) + "\""));
  }
  // Control characters are shown escaped, and the example fits the key.
  CHECK_THROWS_WITH(load("2.9", std::string("0.15\\u0000x")),
                    Catch::Matchers::EndsWith("/training/megatron_core_version: expected a version "
                                              "string such as \"0.15\", got \"0.15\\u0000x\""));
  // A JSON number loses trailing zeros (2.10 would read as 2.1), so it is refused with a hint.
  CHECK_THROWS_WITH(
      LoadSetup(InlineConfig("versions.json", "{\"model_type\": \"llama\"}",
                             "\"seq_length\": 512, \"transformer_engine_version\": 2.10"),
                {}),
      Catch::Matchers::EndsWith("/training/transformer_engine_version: expected a version string "
                                "such as \"2.9\", got the number 2.1 (quote it; with --set: "
                                "'training.transformer_engine_version=\"2.9\"')"));
}

TEST_CASE("a model file next to the config with pipeline and full recompute", "[config]") {
  const Setup s = LoadSetup(Data("file_model.json"), {});
  CHECK(s.model_path == Data("tiny-llama.json"));
  CHECK(ModelName(s) == "tiny-llama");
  CHECK(s.model.num_hidden_layers == 4);
  CHECK(s.training.pipeline_model_parallel_size == 2);
  CHECK(s.training.num_micro_batches == 8);  // 16 / (1 × 2)
  CHECK(s.training.sequence_parallel);
  CHECK(s.training.recompute_granularity == RecomputeGranularity::kFull);
  CHECK(s.training.recompute_method == RecomputeMethod::kUniform);  // null -> uniform
  CHECK(s.training.recompute_num_layers == 1);
  // 1000 rounded up to a multiple of 128 × 2 = 256: 4 × 256 = 1024.
  CHECK(s.model.padded_vocab_size == 1024);
}

TEST_CASE("overrides with --set and --model and --device", "[config]") {
  LoadOptions o;
  o.overrides = {"training.micro_batch_size=2", "allocator.expandable_segments=True",
                 "training.recompute_granularity=selective"};
  Setup s = LoadSetup("", o);
  CHECK(s.training.micro_batch_size == 2);
  CHECK(s.training.num_micro_batches == 8);  // 64 / (2 × 4)
  CHECK(s.allocator.expandable_segments);
  CHECK(s.training.recompute_granularity == RecomputeGranularity::kSelective);

  // A nested key is not edited one member at a time (it used to become an unknown key
  // "adapter_config.r" of the block, reported with a "did you mean" of its parent).
  o = {};
  o.overrides = {"training.adapter_config.r=4"};
  CHECK(ErrorOf("", o) == "--set training.adapter_config.r=4: r is a key inside "
                          "training.adapter_config; --set replaces a key of the training block as "
                          "a whole: give its whole value, e.g. --set "
                          "'training.adapter_config={...}'");

  o = {};
  o.model_path = Data("tiny-llama.json");
  o.device = "h100-80g";
  s = LoadSetup("", o);
  CHECK(s.model.hidden_size == 256);
  CHECK(s.device.name == "h100-80g");
  CHECK(s.allocator.backend == alloc::Backend::kCuda);
  CHECK(s.allocator.capacity_bytes == std::optional<Bytes>(81089_MiB));

  o = {};
  o.model_path = "qwen2.5-7b";  // a shipped model by name
  s = LoadSetup("", o);
  CHECK(s.model_path == "<embedded>/models/qwen2.5-7b.json");
  CHECK(s.model.hidden_size == 3584);
  o.model_path = "qwen2.5-7";
  CHECK(ErrorOf("", o).rfind("--model qwen2.5-7: unknown model 'qwen2.5-7' (did you mean 'qwen2.5-7b'?); "
                             "shipped models: ",
                             0) == 0);

  o = {};
  o.device = std::string(MEMSIM_SOURCE_DIR) + "/configs/devices/a100-40g.json";
  o.capacity_bytes = 10_GiB;
  s = LoadSetup("", o);
  CHECK(s.device.name == "a100-40g");
  CHECK(s.device.usable_memory_bytes == 10_GiB);
  CHECK(s.allocator.capacity_bytes == std::optional<Bytes>(10_GiB));

  // A device path in the config is relative to the config file.
  const std::string path = TempFile(
      "device_path.json", "{\"model\": {\"model_type\": \"llama\"}, \"device\": \"" +
                              std::string(MEMSIM_SOURCE_DIR) +
                              "/configs/devices/v100-16g.json\", \"training\": {\"seq_length\": 512}}");
  CHECK(LoadSetup(path, {}).device.name == "v100-16g");
  const std::string missing = TempFile(
      "device_missing.json",
      "{\"model\": {\"model_type\": \"llama\"}, \"device\": \"devices/x.json\", \"training\": {\"seq_length\": 512}}");
  CHECK(ErrorOf(missing) == missing + ": /device: cannot read device preset file '" +
                                (std::filesystem::path(missing).parent_path() / "devices/x.json").string() +
                                "': No such file or directory");
}

TEST_CASE("allocator block", "[config]") {
  const std::string model = "{\"model_type\": \"llama\"}";
  SECTION("JSON keys") {
    const Setup s = LoadSetup(
        InlineConfig("alloc1.json", model, "\"seq_length\": 512",
                     ", \"allocator\": {\"max_split_size_mb\": 128, \"max_non_split_rounding_mb\": 64, "
                     "\"garbage_collection_threshold\": 0.6, \"memory_fraction\": 0.5, "
                     "\"roundup_power2_divisions\": {\"64\": 8, \"128\": 2, \">\": 1}}"),
        {});
    CHECK(s.allocator.max_split_size_bytes == std::optional<Bytes>(128_MiB));
    CHECK(s.allocator.max_non_split_rounding_bytes == 64_MiB);
    CHECK(s.allocator.garbage_collection_threshold == 0.6);
    CHECK(s.allocator.memory_fraction == std::optional<double>(0.5));
    // Interval i covers [2^i MiB, 2^(i+1) MiB): 64 MiB is i = 6, 128 MiB i = 7. The first entry
    // also fills i < 6; ">" fills i > 7, after the last numbered key, as PyTorch's
    // AcceleratorAllocatorConfig::parseRoundUpPower2Divisions (c10/core/AllocatorConfig.cpp) does
    // (src/config/allocator_block.cc ReadRoundup).
    const std::array<int, 16> expected = {8, 8, 8, 8, 8, 8, 8, 2, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(s.allocator.roundup_power2_divisions == expected);
  }
  SECTION("alloc_conf string reads like the JSON keys") {
    const Setup a = LoadSetup(
        InlineConfig("alloc2.json", model, "\"seq_length\": 512",
                     ", \"allocator\": {\"alloc_conf\": \"expandable_segments:True, "
                     "roundup_power2_divisions:[64:8,128:2,>:1]\"}"),
        {});
    const Setup b = LoadSetup(
        InlineConfig("alloc3.json", model, "\"seq_length\": 512",
                     ", \"allocator\": {\"expandable_segments\": true, "
                     "\"roundup_power2_divisions\": {\"64\": 8, \"128\": 2, \">\": 1}}"),
        {});
    CHECK(a.allocator == b.allocator);
    CHECK(a.allocator.expandable_segments);
  }
  SECTION("a single roundup value fills every interval") {
    const Setup s = LoadSetup(InlineConfig("alloc4.json", model, "\"seq_length\": 512",
                                           ", \"allocator\": {\"roundup_power2_divisions\": 4}"),
                              {});
    std::array<int, 16> four;
    four.fill(4);
    CHECK(s.allocator.roundup_power2_divisions == four);
  }
  SECTION("backend-specific keys") {
    std::string path = InlineConfig("alloc5.json", model, "\"seq_length\": 512",
                                    ", \"allocator\": {\"base_addr_aligned_kb\": 8}");
    CHECK(ErrorOf(path) == path + ": /allocator/base_addr_aligned_kb: not an option of "
                                  "PYTORCH_CUDA_ALLOC_CONF (the device's allocator is cuda)");
    LoadOptions npu;
    npu.device = "ascend-910b-64g";
    CHECK(LoadSetup(path, npu).allocator.base_addr_aligned_bytes == 8_KiB);
    path = InlineConfig("alloc6.json", model, "\"seq_length\": 512",
                        ", \"allocator\": {\"max_non_split_rounding_mb\": 40}");
    CHECK(ErrorOf(path, npu) == path + ": /allocator/max_non_split_rounding_mb: not an option of "
                                       "PYTORCH_NPU_ALLOC_CONF (the device's allocator is npu)");
    path = InlineConfig("alloc7.json", model, "\"seq_length\": 512",
                        ", \"allocator\": {\"expandable_segments\": true, \"max_split_size_mb\": 64}");
    CHECK(ErrorOf(path, npu) == path + ": /allocator/expandable_segments: torch_npu rejects "
                                       "expandable_segments true together with max_split_size_mb");
  }
  SECTION("ranges") {
    std::string path = InlineConfig("alloc8.json", model, "\"seq_length\": 512",
                                    ", \"allocator\": {\"garbage_collection_threshold\": 1}");
    CHECK(ErrorOf(path) == path + ": /allocator/garbage_collection_threshold: expected a number "
                                  "in (0, 1), got 1");
    path = InlineConfig("alloc9.json", model, "\"seq_length\": 512",
                        ", \"allocator\": {\"roundup_power2_divisions\": 3}");
    CHECK(ErrorOf(path) == path + ": /allocator/roundup_power2_divisions: expected a power of two "
                                  "(divisions per power-of-two interval), got 3");
    path = InlineConfig("alloc10.json", model, "\"seq_length\": 512",
                        ", \"allocator\": {\"alloc_conf\": \"max_split_size_mb:10\"}");
    CHECK(ErrorOf(path) == path + ": /allocator/alloc_conf: max_split_size_mb must be > 20, got 10");
  }
}

TEST_CASE("unsupported: recognised but not modelled", "[config]") {
  const std::string llama = "{\"model_type\": \"llama\"}";
  const std::string base = "\"seq_length\": 512, \"data_parallel_size\": 4";
  auto unsupported = [&](const std::string& name, const std::string& model, const std::string& extra) {
    return IsUnsupported(InlineConfig(name, model, base + extra));
  };
  CHECK(unsupported("u1.json", llama, ", \"framework\": \"deepspeed\", \"zero_stage\": 2, \"optim\": \"x\""));
  CHECK(unsupported("u2.json", llama, ", \"zero_stage\": 3"));
  CHECK(unsupported("u3.json", llama,
                    ", \"use_megatron_fsdp\": true, "
                    "\"data_parallel_sharding_strategy\": \"optim_grads_params\""));
  CHECK(unsupported("u3b.json", llama, ", \"use_megatron_fsdp\": true, \"zero_stage\": 3"));
  CHECK(unsupported("u3c.json", llama,
                    ", \"use_megatron_fsdp\": true, "
                    "\"pipeline_model_parallel_size\": 2"));
  CHECK(unsupported("u3d.json", llama, ", \"use_megatron_fsdp\": true, \"precision\": \"fp32\""));
  // MoE (docs/config.md, "Mixture of experts"): unsupported under Megatron-FSDP, with the flex
  // dispatcher, and as expert counts in a dense model_type's file.
  CHECK(unsupported("u4.json", "{\"model_type\": \"mixtral\"}", ", \"use_megatron_fsdp\": true"));
  CHECK(unsupported("u5.json", llama, ", \"num_experts\": 8, \"moe_token_dispatcher_type\": \"flex\""));
  CHECK_FALSE(unsupported("u6.json", "{\"model_type\": \"mixtral\"}", ""));
  CHECK(unsupported("u7.json", "{\"model_type\": \"llama\", \"num_local_experts\": 8}", ""));
  CHECK(unsupported("u8.json", llama, ", \"load\": \"ckpt/\""));
  CHECK(unsupported("u9.json", llama, ", \"enable_cuda_graph\": true"));
  CHECK(unsupported("u10.json", llama, ", \"fp8\": \"hybrid\""));
  CHECK(unsupported("u11.json", "{\"model_type\": \"bert\"}", ""));
  // Loading weights only is fine; so are the MoE tuning keys of a dense model.
  CHECK_FALSE(unsupported("s1.json", llama, ", \"load\": \"ckpt/\", \"no_load_optim\": true, "
                                            "\"moe_grouped_gemm\": true, \"zero_stage\": 1"));
  const std::string path = InlineConfig("u12.json", llama, base + ", \"framework\": \"deepspeed\"");
  CHECK(ErrorOf(path) == "unsupported: " + path +
                             ": /training/framework: framework 'deepspeed' (memsim models "
                             "\"megatron\", \"pytorch\", \"hf-trainer\" and \"torchtitan\")");
}

TEST_CASE("keys without effect on this setup are noted, not dropped", "[config]") {
  const std::string llama = "{\"model_type\": \"llama\"}";
  const auto noted = [](const Setup& s, const std::string& part) {
    return std::any_of(s.notes.begin(), s.notes.end(),
                       [&](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  // MoE training keys of a dense model (no experts: the router is never built).
  const std::string dense = InlineConfig("n1.json", llama, "\"seq_length\": 512, "
                                                           "\"moe_router_pre_softmax\": true");
  CHECK(noted(LoadSetup(dense, {}), dense + ": /training/moe_router_pre_softmax: ignored (dense "
                                            "model)"));
  // The data loader's mask is Megatron's get_batch (workload/model.cc): not under "pytorch".
  const std::string mask = InlineConfig("n2.json", llama,
                                        "\"seq_length\": 512, \"framework\": \"pytorch\", "
                                        "\"create_attention_mask_in_dataloader\": false");
  CHECK(noted(LoadSetup(mask, {}), mask + ": /training/create_attention_mask_in_dataloader: no "
                                          "effect here (modelled for framework \"megatron\" on "
                                          "CUDA devices: Megatron's get_batch)"));
}

TEST_CASE("precision: explicit false flags", "[config]") {
  const std::string llama = "{\"model_type\": \"llama\"}";
  // Megatron trains in fp32 without --bf16 / --fp16: "bf16": false alone means fp32.
  Setup s = LoadSetup(InlineConfig("p1.json", llama, "\"seq_length\": 512, \"bf16\": false"), {});
  CHECK(s.training.precision == Precision::kFp32);
  // Nothing said: memsim's default, bf16.
  s = LoadSetup(InlineConfig("p2.json", llama, "\"seq_length\": 512, \"fp16\": false"), {});
  CHECK(s.training.precision == Precision::kBf16);
  const std::string path = InlineConfig(
      "p3.json", llama, "\"seq_length\": 512, \"precision\": \"bf16\", \"bf16\": false");
  CHECK(ErrorOf(path) == path + ": /training/bf16: false disagrees with precision \"bf16\"");
}

TEST_CASE("Megatron-FSDP: strategy, ZeRO label and the optimizer flag", "[config]") {
  const std::string llama = "{\"model_type\": \"llama\"}";
  const std::string base =
      "\"seq_length\": 512, \"data_parallel_size\": 4, \"use_megatron_fsdp\": true";
  auto load = [&](const std::string& name, const std::string& extra) {
    return LoadSetup(InlineConfig(name, llama, base + extra), {});
  };
  auto has_note = [](const Setup& s, const std::string& text) {
    return std::any_of(s.notes.begin(), s.notes.end(),
                       [&](const std::string& n) { return n.find(text) != std::string::npos; });
  };
  SECTION("the strategy decides the sharding; use_distributed_optimizer follows it") {
    Setup s = load("f1.json", ", \"data_parallel_sharding_strategy\": \"optim_grads\"");
    CHECK(s.training.use_megatron_fsdp);
    CHECK(s.training.fsdp_sharding == FsdpSharding::kOptimGrads);
    CHECK(s.training.use_distributed_optimizer);
    CHECK(has_note(s,
                   "/training/use_distributed_optimizer: taken as true: Megatron-FSDP "
                   "\"optim_grads\" shards the optimizer state"));
    // Fusion on is noted: Megatron-Bridge launches switch it off with Megatron-FSDP.
    CHECK(has_note(s, "/training/gradient_accumulation_fusion: true with Megatron-FSDP"));
    // optim_grads without overlap_grad_reduce: one bucket, said in a note.
    CHECK(has_note(s, "/training/overlap_grad_reduce: false with Megatron-FSDP \"optim_grads\""));
    s = load("f2.json",
             ", \"data_parallel_sharding_strategy\": \"optim\", "
             "\"use_distributed_optimizer\": true, \"zero_stage\": 1, "
             "\"gradient_accumulation_fusion\": false");
    CHECK(s.training.fsdp_sharding == FsdpSharding::kOptim);
    CHECK_FALSE(has_note(s, "use_distributed_optimizer"));
    CHECK_FALSE(has_note(s, "gradient_accumulation_fusion"));
  }
  SECTION("no strategy: Megatron-LM's default no_shard, or the ZeRO label's") {
    Setup s = load("f3.json", ", \"use_distributed_optimizer\": true");
    CHECK(s.training.fsdp_sharding == FsdpSharding::kNoShard);
    CHECK_FALSE(s.training.use_distributed_optimizer);
    CHECK(has_note(s,
                   "/training/data_parallel_sharding_strategy: absent, Megatron-LM's default "
                   "\"no_shard\" taken"));
    s = load("f4.json", ", \"zero_stage\": 2");
    CHECK(s.training.fsdp_sharding == FsdpSharding::kOptimGrads);
    CHECK(has_note(s, "/training/zero_stage: Megatron-FSDP sharding taken as \"optim_grads\""));
  }
  SECTION("errors") {
    std::string path = InlineConfig("f5.json", llama,
                                    base +
                                        ", \"data_parallel_sharding_strategy\": \"optim\", "
                                        "\"zero_stage\": 2");
    CHECK(ErrorOf(path) == path +
                               ": /training/zero_stage: 2 disagrees with "
                               "data_parallel_sharding_strategy \"optim\" (ZeRO stage 1 under "
                               "Megatron-FSDP)");
    path =
        InlineConfig("f6.json", llama,
                     "\"seq_length\": 512, \"data_parallel_sharding_strategy\": \"optim_grads\"");
    CHECK(ErrorOf(path) == path +
                               ": /training/data_parallel_sharding_strategy: \"optim_grads\" "
                               "applies to Megatron-FSDP only; set use_megatron_fsdp true, or "
                               "use_distributed_optimizer for Megatron's ZeRO-1");
    path = InlineConfig("f7.json", llama, base + ", \"pipeline_model_parallel_size\": 2");
    CHECK(ErrorOf(path) == "unsupported: " + path +
                               ": /training/pipeline_model_parallel_size: Megatron-FSDP with "
                               "pipeline parallelism (memsim models Megatron-FSDP with "
                               "pipeline_model_parallel_size 1)");
    // Megatron allows overlap_param_gather with Megatron-FSDP whatever the strategy.
    CHECK_NOTHROW(
        LoadSetup(InlineConfig("f8.json", llama, base + ", \"overlap_param_gather\": true"), {}));
    path = InlineConfig("f8b.json", llama, "\"seq_length\": 512, \"overlap_param_gather\": true");
    CHECK(ErrorOf(path) == path +
                               ": /training/overlap_param_gather: true needs "
                               "use_distributed_optimizer or use_megatron_fsdp true (as in "
                               "Megatron)");
    path =
        InlineConfig("f9.json", llama,
                     "\"seq_length\": 512, \"zero_stage\": 0, \"use_distributed_optimizer\": true");
    CHECK(ErrorOf(path) == path +
                               ": /training/zero_stage: 0 disagrees with "
                               "use_distributed_optimizer true (ZeRO-1)");
  }
  SECTION("padding with coprime widths stays within memsim's size limit") {
    // h 4099 and ffn 4093 are primes, head_dim 128: lcm(4099, 32·128, 4093) = 4099·4096·4093
    // ≈ 6.87e10 elements; × d = 4096 is 2.8e14 elements of padding per bucket, × 18 B > 2^50.
    const std::string odd =
        "{\"model_type\": \"llama\", \"hidden_size\": 4099, \"intermediate_size\": 4093, "
        "\"num_attention_heads\": 32, \"num_key_value_heads\": 32, \"head_dim\": 128}";
    const std::string path = InlineConfig(
        "f10.json", odd,
        "\"seq_length\": 512, \"data_parallel_size\": 4096, \"global_batch_size\": 4096, "
        "\"use_megatron_fsdp\": true, \"data_parallel_sharding_strategy\": \"optim\"");
    CHECK(ErrorOf(path).find(path + ": /training/data_parallel_size: model too large for memsim: "
                                    "Megatron-FSDP pads each of 1 bucket(s)") == 0);
    // No padding without a sharding strategy.
    CHECK_NOTHROW(
        LoadSetup(InlineConfig("f11.json", odd,
                               "\"seq_length\": 512, \"data_parallel_size\": 4096, "
                               "\"global_batch_size\": 4096, \"use_megatron_fsdp\": true"),
                  {}));
  }
}

TEST_CASE("a model directory given with --model: its config.json, before a shipped name",
          "[config]") {
  // A directory spelt like a shipped model ("llama2-7b") wins: what is on disk is meant.
  const auto root = std::filesystem::temp_directory_path() /
                    ("memsim_model_dir_test-" + std::to_string(::getpid()));
  const auto dir = root / "llama2-7b";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
             "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000})";
  const std::string training =
      TempFile("model_dir.json", R"({"device": "a100-80g", "training": {"seq_length": 128}})");
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(root);
  LoadOptions o;
  o.model_path = "llama2-7b";
  Setup s;
  const std::string error = ErrorOf(training, o);
  if (error == "(no error)") s = LoadSetup(training, o);
  std::filesystem::current_path(cwd);
  CHECK(error == "(no error)");
  CHECK(s.model.hidden_size == 256);
  CHECK(s.model_path == "llama2-7b/config.json");
  o.model_path = (root / "empty").string();
  std::filesystem::create_directories(root / "empty");
  CHECK(ErrorOf(training, o).find("directory '" + o.model_path + "' has no readable config.json") !=
        std::string::npos);
}

TEST_CASE("a config.json given as the training config gets a hint to use --model", "[config]") {
  const std::string path =
      TempFile("hf_config.json", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                     "hidden_size": 256})");
  CHECK(ErrorOf(path) == path +
                             ": a model file (Hugging Face config.json: it has \"model_type\"), "
                             "not a training config; give it with --model " +
                             path +
                             " and a training config (or --megatron-args for a launch script)");
}


// A device preset (configs/devices/*.json) where the training config is expected says so,
// rather than "/allocator_backend: unknown key".
TEST_CASE("a device preset given as the training config gets a hint to use --device",
          "[config]") {
  const std::string path = TempFile("preset.json", R"({"name": "x", "allocator_backend": "cuda",
      "total_memory_bytes": 85899345920})");
  CHECK(ErrorOf(path) == path + ": a device preset (it has \"allocator_backend\"), not a training "
                                "config; give it with --device " + path +
                                " and a training config");
}

// A literal beyond a double's range (JSON allows any exponent; nlohmann refuses to round it to
// infinity) is out of range for a number, whatever the key.
TEST_CASE("a JSON number beyond a double's range is named as such", "[config]") {
  const std::string path = InlineConfig("wd.json", "\"llama2-7b\"", R"("weight_decay": 1e400)");
  CHECK(ErrorOf(path) == path + ": /training/weight_decay: out of range for a number: beyond the "
                                "largest 64-bit float, about 1.8e308 (IEEE 754 binary64)");
}

// tryout8 #3: `memsim check memsim/*.json` (docs/ci.md) also globs the adapter_config.json and
// the TrainingArguments JSON that the training configs name beside them; each says what it is
// and where it belongs rather than "unknown key".
TEST_CASE("an adapter_config or a TrainingArguments JSON as the training config say so",
          "[config]") {
  // PEFT's saved adapter_config.json (peft/config.py: every config has peft_type).
  const std::string adapter = TempFile("adapter_config.json", R"({"alpha_pattern": {},
      "peft_type": "LORA", "r": 16, "target_modules": ["q_proj"]})");
  CHECK(ErrorOf(adapter) == adapter +
                                ": a PEFT adapter config (adapter_config.json: it has "
                                "\"peft_type\"), not a training config; name it in a training "
                                "config's training.adapter_config (framework \"hf-trainer\")");
  // trainer.args.to_json_string() (transformers/training_args.py: output_dir first).
  const std::string args = TempFile("training_args.json", R"({"output_dir": "out",
      "accelerator_config": {"split_batches": false}, "per_device_train_batch_size": 4})");
  CHECK(ErrorOf(args) == args +
                             ": a TrainingArguments JSON (trainer.args.to_json_string(): it has "
                             "\"output_dir\"), not a training config; name it in a training "
                             "config's training.training_args (framework \"hf-trainer\")");
}

// Tryout 7 finding 4: other tools' files where memsim's config is expected say what they are.
TEST_CASE("a DeepSpeed config, a TOML file or a training config as --model say what they are",
          "[config]") {
  // DeepSpeed's ds_config.json top-level keys (deepspeed/runtime/config.py).
  const std::string ds = TempFile("ds_config.json", R"({"train_micro_batch_size_per_gpu": 1,
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}})");
  CHECK(ErrorOf(ds) == ds +
                           ": a DeepSpeed config (ds_config.json: it has \"zero_optimization\"), "
                           "not a memsim training config; memsim does not model DeepSpeed's "
                           "engine (it models frameworks \"megatron\", \"pytorch\" and "
                           "\"hf-trainer\"; ZeRO-1 as Megatron's distributed optimizer): write a "
                           "training config (docs/config.md)");
  // torchtitan's job config: TOML tables, found by the header even without the .toml name,
  // and read as one (config/torchtitan_toml.h), which needs a device.
  const std::string toml =
      TempFile("titan.txt", "# torchtitan\n\n[job]\ndump_folder = \"./outputs\"\n");
  CHECK(ErrorOf(toml).rfind(toml + ": a torchtitan job config does not name its device; give "
                                   "--device NAME (",
                            0) == 0);
  // A training config given with --model.
  const std::string training =
      TempFile("as_model.json", R"({"model": "llama2-7b", "training": {"seq_length": 128}})");
  LoadOptions o;
  o.model_path = training;
  CHECK(ErrorOf(training, o) ==
        training + ": a memsim training config (it has \"training\"), not a model file (Hugging "
                   "Face config.json with \"model_type\"); give it as the CONFIG argument, not "
                   "with --model");
}

}  // namespace
}  // namespace memsim::config
