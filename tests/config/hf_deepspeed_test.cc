// TrainingArguments `deepspeed` (config/hf_deepspeed.cc): the ds_config read from a path
// relative to the config or inline, DeepSpeed's defaults (zero/config.py v0.16.9), the Trainer's
// "auto" values (transformers integrations/deepspeed.py), and each refusal naming its key.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/load.h"
#include "test_util.h"

namespace memsim::config {
namespace {

using testing::ErrorOf;
using testing::IsUnsupported;

std::filesystem::path DsDir() {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("memsim_hf_deepspeed_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

// A config `name`.json naming `deepspeed` (a JSON value: a path string or an object) with a
// small llama (hidden_size 256), 2 processes, micro-batch 2, bf16.
std::string DsConfig(const std::string& name, const std::string& deepspeed) {
  const std::string path = (DsDir() / (name + ".json")).string();
  std::ofstream(path) << "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, "
                         "\"intermediate_size\": 688, \"num_attention_heads\": 32, "
                         "\"num_key_value_heads\": 8, \"num_hidden_layers\": 2, \"vocab_size\": "
                         "32001}, \"device\": \"a100-80g\", \"training\": {\"framework\": "
                         "\"hf-trainer\", \"max_seq_length\": 128, \"world_size\": 2, "
                         "\"per_device_train_batch_size\": 2, \"bf16\": true, \"torch_dtype\": "
                         "\"bfloat16\", \"deepspeed\": " +
                             deepspeed + "}}";
  return path;
}
std::string DsFile(const std::string& name, const std::string& text) {
  std::ofstream(DsDir() / name) << text;
  return name;
}
bool DsMentions(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

TEST_CASE("hf-trainer deepspeed: a ds_config beside the config, auto values and defaults",
          "[config][hf][zero]") {
  DsFile("z2.json",
         "{\"bf16\": {\"enabled\": \"auto\"}, \"train_micro_batch_size_per_gpu\": \"auto\", "
         "\"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\", "
         "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": \"auto\", "
         "\"allgather_bucket_size\": 2e8, \"overlap_comm\": true, \"reduce_scatter\": true, "
         "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}}");
  const Setup s = LoadSetup(DsConfig("rel", "\"z2.json\""), {});
  const DeepSpeedZero& z = *HfTrainerOf(s.training).deepspeed;
  CHECK(z.stage == 2);
  CHECK(z.reduce_bucket_size == 256 * 256);  // "auto": hidden_size²
  CHECK(z.allgather_bucket_size == 200'000'000);
  CHECK(z.overlap_comm);
  CHECK(z.contiguous_gradients);  // DeepSpeedZeroConfig default
  CHECK(z.offload_optimizer_cpu);
  CHECK(z.offload_pin_memory);
  CHECK(s.training.precision == Precision::kBf16);  // bf16.enabled "auto" = the Trainer's bf16
  CHECK(std::holds_alternative<DeepSpeedZero>(DataParallelOf(s.training)));
  // Inline, with DeepSpeed's defaults: reduce_bucket_size 5e8, overlap_comm false at stage 1.
  const Setup inl =
      LoadSetup(DsConfig("inline", "{\"bf16\": {\"enabled\": true}, \"zero_optimization\": "
                                 "{\"stage\": 1}}"),
                {});
  const DeepSpeedZero& d = *HfTrainerOf(inl.training).deepspeed;
  CHECK(d.stage == 1);
  CHECK(d.reduce_bucket_size == 500'000'000);
  CHECK_FALSE(d.overlap_comm);
  CHECK_FALSE(d.offload_optimizer_cpu);
  CHECK_FALSE(d.offload_pin_memory);
  // Offload forces contiguous gradients (stage_1_and_2.py: contiguous_gradients or
  // cpu_offload); pin_memory defaults to false (offload_config.py).
  const Setup off = LoadSetup(
      DsConfig("offload", "{\"zero_optimization\": {\"stage\": 2, \"contiguous_gradients\": "
                          "false, \"offload_optimizer\": {\"device\": \"cpu\"}}}"),
      {});
  const DeepSpeedZero& o = *HfTrainerOf(off.training).deepspeed;
  CHECK(o.contiguous_gradients);
  CHECK_FALSE(o.offload_pin_memory);
}

TEST_CASE("hf-trainer deepspeed stage 3: the Trainer's auto sizes, the stage-3 keys, ZeRO++ "
          "warned with its direction",
          "[config][hf][zero]") {
  // LLaMA-Factory's ds_z3_config.json form: "auto" sizes resolved from hidden_size 256
  // (HfTrainerDeepSpeedConfig.trainer_config_finalize): reduce 256² = 65536, prefetch
  // int(0.9·65536) = 58982, persistence 10·256 = 2560.
  const Setup s = LoadSetup(
      DsConfig("z3auto", "{\"bf16\": {\"enabled\": \"auto\"}, \"zero_optimization\": "
                         "{\"stage\": 3, \"sub_group_size\": 1e9, \"reduce_bucket_size\": "
                         "\"auto\", \"stage3_prefetch_bucket_size\": \"auto\", "
                         "\"stage3_param_persistence_threshold\": \"auto\", "
                         "\"stage3_max_live_parameters\": 1e9, \"stage3_max_reuse_distance\": 2e8, "
                         "\"stage3_gather_16bit_weights_on_model_save\": true, \"offload_param\": "
                         "{\"device\": \"none\", \"pin_memory\": true}}}"),
      {});
  const DeepSpeedZero& z = *HfTrainerOf(s.training).deepspeed;
  CHECK(z.stage == 3);
  CHECK(z.reduce_bucket_size == 65536);
  CHECK(z.prefetch_bucket_size == 58982);
  CHECK(z.param_persistence_threshold == 2560);
  CHECK(z.max_live_parameters == 1'000'000'000);
  CHECK(z.max_reuse_distance == 200'000'000);
  CHECK(z.sub_group_size == 1'000'000'000);
  CHECK(z.overlap_comm);  // config.py overlap_comm_valid: absent, on at stage 3
  CHECK(z.reduce_scatter);
  CHECK_FALSE(z.offload_param_cpu);
  CHECK_FALSE(z.offload_param_pin_memory);  // pin_memory means nothing without a device
  CHECK(s.warnings.empty());
  CHECK(DsMentions(s.notes, "stage3_gather_16bit_weights_on_model_save: only at checkpoint"));
  // Defaults (zero/config.py) and offload_param cpu.
  const Setup d = LoadSetup(
      DsConfig("z3def", "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": "
                        "{\"device\": \"cpu\", \"pin_memory\": true}}}"),
      {});
  const DeepSpeedZero& dz = *HfTrainerOf(d.training).deepspeed;
  CHECK(dz.prefetch_bucket_size == 50'000'000);
  CHECK(dz.param_persistence_threshold == 100'000);
  CHECK(dz.offload_param_cpu);
  CHECK(dz.offload_param_pin_memory);
  // ZeRO++: warned, with the direction memsim errs (hpZ's secondary partition: low).
  const Setup pp = LoadSetup(
      DsConfig("z3pp", "{\"zero_optimization\": {\"stage\": 3, \"zero_hpz_partition_size\": "
                       "8, \"zero_quantized_weights\": false}}"),
      {});
  CHECK(DsMentions(pp.warnings, "zero_hpz_partition_size: 8: ZeRO++ / MiCS not modelled "
                                "(memsim errs low)"));
  CHECK(DsMentions(pp.notes, "zero_quantized_weights: off, no effect"));
}

TEST_CASE("hf-trainer deepspeed: LLaMA-Factory's ds_z3_config.json, unedited, in a shipped config",
          "[config][hf][zero]") {
  // configs/deepspeed/llamafactory/ds_z3_config.json (a verbatim copy, its README says from
  // where) under configs/llama2-7b-a100-zero3-dp4.json: Llama-2-7B, hidden_size 4096, so the
  // "auto" sizes are 4096² = 16777216, int(0.9·4096²) = 15099494 and 10·4096 = 40960.
  const Setup s =
      LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/llama2-7b-a100-zero3-dp4.json", {});
  const DeepSpeedZero& z = *HfTrainerOf(s.training).deepspeed;
  CHECK(z.stage == 3);
  CHECK(z.reduce_bucket_size == 16'777'216);
  CHECK(z.prefetch_bucket_size == 15'099'494);
  CHECK(z.param_persistence_threshold == 40'960);
  CHECK_FALSE(z.overlap_comm);  // the file sets it false
  CHECK(s.training.precision == Precision::kBf16);  // bf16 "auto": the Trainer's
  CHECK(s.warnings.empty());
}

TEST_CASE("hf-trainer deepspeed: the ds_config's own Adam replaces the Trainer's optim",
          "[config][hf][zero]") {
  // Without an optimizer section the Trainer's optim (adamw_torch: torch.optim's foreach) is used.
  const Setup plain = LoadSetup(DsConfig("opt0", "{\"zero_optimization\": {\"stage\": 2}}"), {});
  CHECK(plain.training.optimizer_impl == OptimizerImpl::kForeach);
  // engine.py _configure_basic_optimizer: AdamW becomes DeepSpeed's FusedAdam (in place) ...
  const Setup fused = LoadSetup(
      DsConfig("opt1", "{\"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"type\": "
                       "\"AdamW\", \"params\": {\"lr\": \"auto\"}}}"),
      {});
  CHECK(fused.training.optimizer == OptimizerKind::kAdam);
  CHECK(fused.training.optimizer_impl == OptimizerImpl::kFused);
  // ... and torch.optim.AdamW with params.torch_adam.
  const Setup torch_adam = LoadSetup(
      DsConfig("opt2", "{\"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"type\": "
                       "\"AdamW\", \"params\": {\"torch_adam\": true}}}"),
      {});
  CHECK(torch_adam.training.optimizer_impl == OptimizerImpl::kForeach);
}

TEST_CASE("hf-trainer deepspeed: every wrong field of a ds_config is reported in one run",
          "[config][hf][zero]") {
  // Four wrong values in the file (stage a string, a bucket size a word, overlap_comm a number,
  // a batch size a word): each named by the ds_config's file and pointer, in one error.
  DsFile("many.ds.json",
         "{\"train_micro_batch_size_per_gpu\": \"four\", \"zero_optimization\": {\"stage\": "
         "\"2\", \"reduce_bucket_size\": \"x\", \"overlap_comm\": 3}}");
  const std::string e = ErrorOf(DsConfig("many", "\"many.ds.json\""));
  CHECK_THAT(e, Catch::Contains("4 problems in"));
  CHECK_THAT(e, Catch::Contains("many.ds.json: /zero_optimization/stage: expected an integer"));
  CHECK_THAT(e, Catch::Contains("many.ds.json: /zero_optimization/reduce_bucket_size: expected a "
                                "whole number of elements"));
  CHECK_THAT(e, Catch::Contains("many.ds.json: /zero_optimization/overlap_comm: expected true or "
                                "false"));
  CHECK_THAT(e, Catch::Contains("many.ds.json: /train_micro_batch_size_per_gpu: expected \"auto\" "
                                "or an integer"));
  // A bad stage is not also reported as the unsupported stage 0 or 3.
  CHECK_THAT(e, !Catch::Contains("unsupported"));
  // Inline, the pointers run from the training config's /training/deepspeed.
  const std::string inl = ErrorOf(DsConfig(
      "many-inline", "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": -1, "
                     "\"contiguous_gradients\": \"no\"}}"));
  CHECK_THAT(inl, Catch::Contains("2 problems in"));
  CHECK_THAT(inl, Catch::Contains("/training/deepspeed/zero_optimization/reduce_bucket_size"));
  CHECK_THAT(inl, Catch::Contains("/training/deepspeed/zero_optimization/contiguous_gradients"));
}

TEST_CASE("hf-trainer deepspeed: the reproducing config holds the ds_config inline",
          "[config][hf][zero]") {
  // run --json's input_config must load from any directory: the ds_config file beside the
  // config is written into it as the object, which reads as the file did.
  DsFile("repro.ds.json", "{\"bf16\": {\"enabled\": \"auto\"}, \"zero_optimization\": "
                          "{\"stage\": 1, \"reduce_bucket_size\": 1234, \"overlap_comm\": true}}");
  const Setup s = LoadSetup(DsConfig("repro", "\"repro.ds.json\""), {});
  CHECK(s.reproducing_config.find("repro.ds.json") == std::string::npos);
  const auto elsewhere = DsDir() / "elsewhere";
  std::filesystem::create_directories(elsewhere);
  const std::string again = (elsewhere / "again.json").string();
  std::ofstream(again) << s.reproducing_config;
  const Setup r = LoadSetup(again, {});
  const DeepSpeedZero& z = *HfTrainerOf(r.training).deepspeed;
  CHECK(z.stage == 1);
  CHECK(z.reduce_bucket_size == 1234);
  CHECK(z.overlap_comm);
}

TEST_CASE("hf-trainer deepspeed: unknown keys are warnings naming each", "[config][hf][zero]") {
  const Setup s = LoadSetup(
      DsConfig("unknown", "{\"bf16\": {\"enabled\": \"auto\"}, \"zero_optimzation\": {}, "
                        "\"zero_optimization\": {\"stage\": 2, \"bucket\": 1, "
                        "\"stage3_prefetch_bucket_size\": 5}}"),
      {});
  CHECK(DsMentions(s.warnings, "/training/deepspeed/zero_optimzation: not a DeepSpeed key"));
  CHECK(DsMentions(s.warnings, "/training/deepspeed/zero_optimization/bucket: not a DeepSpeed ZeRO"));
  // A ZeRO-3 key at stage 2 is DeepSpeed's own to ignore: a note.
  CHECK(DsMentions(s.notes, "stage3_prefetch_bucket_size: a ZeRO-3 setting, not read at stage 2"));
}

TEST_CASE("hf-trainer deepspeed: refusals and errors name the key", "[config][hf][zero]") {
  const std::string z3 = DsConfig(
      "z3", "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
            "\"nvme\"}}}");
  CHECK(IsUnsupported(z3));
  CHECK_THAT(ErrorOf(z3), Catch::Contains("/training/deepspeed/zero_optimization/offload_param/device"));
  const std::string z0 = DsConfig("z0", "{\"bf16\": {\"enabled\": \"auto\"}}");
  CHECK(IsUnsupported(z0));
  CHECK_THAT(ErrorOf(z0), Catch::Contains("zero_optimization/stage: 0"));
  const std::string nvme = DsConfig(
      "nvme", "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
              "\"nvme\"}}}");
  CHECK(IsUnsupported(nvme));
  CHECK_THAT(ErrorOf(nvme), Catch::Contains("offload_optimizer/device"));
  // bf16.enabled false while the Trainer's bf16 is true: HfTrainerDeepSpeedConfig refuses.
  CHECK_THAT(ErrorOf(DsConfig("mismatch", "{\"bf16\": {\"enabled\": false}, "
                                        "\"zero_optimization\": {\"stage\": 2}}")),
             Catch::Contains("/training/deepspeed/bf16/enabled: false while TrainingArguments "
                             "bf16 is true"));
  CHECK_THAT(ErrorOf(DsConfig("batch", "{\"train_micro_batch_size_per_gpu\": 4, "
                                     "\"zero_optimization\": {\"stage\": 2}}")),
             Catch::Contains("train_micro_batch_size_per_gpu: 4 differs from the Trainer's 2"));
  CHECK_THAT(ErrorOf(DsConfig("bucket", "{\"zero_optimization\": {\"stage\": 2, "
                                      "\"reduce_bucket_size\": \"big\"}}")),
             Catch::Contains("reduce_bucket_size: expected a whole number of elements"));
  CHECK_THAT(ErrorOf(DsConfig("missing", "\"no-such-ds.json\"")),
             Catch::Contains("/training/deepspeed: cannot read the DeepSpeed config"));
  CHECK_THAT(ErrorOf(DsConfig("number", "5")),
             Catch::Contains("/training/deepspeed: expected a path to a ds_config JSON"));
  // A ds_config file with a bad value: named by its own file and pointer.
  DsFile("badstage.json", "{\"zero_optimization\": {\"stage\": 7}}");
  CHECK_THAT(ErrorOf(DsConfig("badstage", "\"badstage.json\"")),
             Catch::Contains("badstage.json: /zero_optimization/stage"));
}

}  // namespace
}  // namespace memsim::config
