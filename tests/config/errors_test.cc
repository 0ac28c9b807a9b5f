// Error messages of LoadSetup, asserted verbatim: "<file>: <JSON pointer>: <what was expected>".
#include <cerrno>
#include <cstring>

#include <catch2/catch.hpp>

#include "config/embedded.h"
#include "config/load.h"
#include "core/error.h"
#include "test_util.h"

namespace memsim::config {
namespace {

using testing::Data;
using testing::ErrorOf;

TEST_CASE("unknown training key names the closest known key", "[config]") {
  CHECK(ErrorOf(Data("unknown_key.json")) ==
        Data("unknown_key.json") + ": /training/seq_lenght: unknown key (did you mean 'seq_length'?)");
}

TEST_CASE("wrong JSON type", "[config]") {
  CHECK(ErrorOf(Data("wrong_type.json")) ==
        Data("wrong_type.json") + ": /training/micro_batch_size: expected a positive integer, got \"2\"");
}

TEST_CASE("every field error of one config is reported in one message", "[config]") {
  // Three independent field errors: an unknown key, a type error, an out-of-range value; each is
  // named by file and JSON pointer, in the order the reader meets them (unknown keys first).
  const std::string path = testing::WriteTemp(
      "field_errors.json",
      R"({"model": "llama2-7b", "device": "a100-80g", "training": {"seq_length": 4096,
          "micro_batch_size": "2", "tensor_model_parallel_size": 0, "hiden_size": 4096,
          "global_batch_size": 64}})");
  CHECK(ErrorOf(path) == "3 problems in " + path + ":\n  " + path +
                             ": /training/hiden_size: unknown key (did you mean 'hidden_size'?)\n  " +
                             path + ": /training/micro_batch_size: expected a positive integer, got \"2\"\n  " +
                             path + ": /training/tensor_model_parallel_size: expected a positive integer, got 0");
}

TEST_CASE("every field error of a model file is reported in one message", "[config]") {
  // Two bad sizes in the model file the config names: both, each with the model file and its
  // JSON pointer, in the order ReadSizes reads them (hidden_size, then num_hidden_layers).
  const std::string model = testing::WriteTemp(
      "field_errors_model.json",
      R"({"model_type": "llama", "hidden_size": "x", "num_hidden_layers": -1,
          "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 1000})");
  const std::string path = testing::WriteTemp(
      "field_errors_model_config.json",
      R"({"model": "field_errors_model.json", "device": "a100-80g", "training": {"seq_length": 128,
          "micro_batch_size": 1, "global_batch_size": 8}})");
  CHECK(ErrorOf(path) == "2 problems in " + model + ":\n  " + model +
                             ": /hidden_size: expected a positive integer, got \"x\"\n  " + model +
                             ": /num_hidden_layers: expected a positive integer, got -1");
}

TEST_CASE("field errors of a training_args file and an adapter_config file join the config's",
          "[config]") {
  // Two bad TrainingArguments fields in the training_args file, two bad LoraConfig fields in the
  // adapter_config file and one bad own key in the block: all five in one message, each named
  // by its own file and JSON pointer, in the order the reader meets them (the block's own keys,
  // then the TrainingArguments fields, then the adapter: hf_trainer.cc ReadFromArgs, ReadPeft).
  const std::string args = testing::WriteTemp(
      "field_errors_args.json",
      R"({"output_dir": "out", "per_device_train_batch_size": "4", "gradient_accumulation_steps": 0})");
  const std::string adapter = testing::WriteTemp(
      "field_errors_adapter.json",
      R"({"peft_type": "LORA", "r": 0, "lora_dropout": 2, "target_modules": ["q_proj"]})");
  const std::string path = testing::WriteTemp(
      "field_errors_hf.json",
      R"({"model": "llama3-8b", "device": "l40s-48g", "training": {"framework": "hf-trainer",
          "training_args": "field_errors_args.json", "adapter_config": "field_errors_adapter.json",
          "max_seq_length": 0}})");
  const std::string error = ErrorOf(path) + "\n";  // each line ends in a newline
  CHECK(error.starts_with("5 problems in " + path + ":\n  "));
  for (const std::string& line :
       {path + ": /training/max_seq_length: expected a positive integer, got 0",
        args + ": /per_device_train_batch_size: expected a positive integer, got \"4\"",
        args + ": /gradient_accumulation_steps: expected a positive integer, got 0",
        adapter + ": /r: expected an integer from 1 to 65536, got 0",
        adapter + ": /lora_dropout: expected a number in [0, 1), got 2"}) {
    CAPTURE(line);
    CHECK(error.find("\n  " + line + "\n") != std::string::npos);
  }
}

TEST_CASE("a bad required value is one error, not also a missing key", "[config]") {
  // seq_length is required: a bad one is reported as such, not again as "missing key".
  const std::string path = testing::WriteTemp(
      "bad_required.json",
      R"({"model": "llama2-7b", "device": "a100-80g", "training": {"seq_length": "long",
          "bf16": 3}})");
  CHECK(ErrorOf(path) == "2 problems in " + path + ":\n  " + path +
                             ": /training/seq_length: expected a positive integer, got \"long\"\n  " +
                             path + ": /training/bf16: expected true or false, got 3");
}

TEST_CASE("an error that stops the reading is listed after the field errors before it", "[config]") {
  // No model: reading stops there; the unknown key found before it is listed too.
  const std::string path = testing::WriteTemp(
      "stopped.json", R"({"device": "a100-80g", "training": {"seq_length": 4096, "seq_lenght": 1}})");
  const std::string error = ErrorOf(path);
  CHECK(error.starts_with("2 problems in " + path + ":\n  " + path +
                          ": /training/seq_lenght: unknown key (did you mean 'seq_length'?)\n  " +
                          path + ": /model: missing key"));
  CHECK(error.ends_with("\n  (reading stopped at the last; the rest is checked once it is fixed)"));
}

TEST_CASE("negative size", "[config]") {
  CHECK(ErrorOf(Data("negative_size.json")) ==
        Data("negative_size.json") + ": /training/micro_batch_size: expected a positive integer, got -1");
}

TEST_CASE("attention heads not divisible by TP", "[config]") {
  // Inline model: the pointer is inside the config.
  CHECK(ErrorOf(Data("heads_tp.json")) ==
        Data("heads_tp.json") +
            ": /model/num_attention_heads: 32 heads are not divisible by tensor_model_parallel_size 3");
  // Model file: the message names the model file and its key, then the training config's.
  CHECK(ErrorOf(Data("file_model_heads_tp.json")) ==
        Data("tiny-llama.json") +
            ": /num_attention_heads: 8 heads are not divisible by tensor_model_parallel_size 3 "
            "(training config " + Data("file_model_heads_tp.json") +
            ": /training/tensor_model_parallel_size)");
}

TEST_CASE("key/value heads not divisible by TP", "[config]") {
  // 32 heads divide by TP 16, the 8 query groups do not (Megatron divides both by TP).
  CHECK(ErrorOf(Data("kv_heads_tp.json")) ==
        Data("kv_heads_tp.json") +
            ": /model/num_key_value_heads: 8 key/value heads are not divisible by "
            "tensor_model_parallel_size 16");
}

TEST_CASE("layers not divisible by PP or by virtual stages", "[config]") {
  CHECK(ErrorOf(Data("layers_pp.json")) ==
        Data("layers_pp.json") +
            ": /model/num_hidden_layers: 32 layers are not divisible by pipeline_model_parallel_size 3");
  // 32 layers / PP 4 = 8 layers per stage; 8 % 3 != 0.
  CHECK(ErrorOf(Data("layers_vpp.json")) ==
        Data("layers_vpp.json") +
            ": /training/num_layers_per_virtual_pipeline_stage: 8 layers per pipeline stage (32 "
            "layers / pipeline_model_parallel_size 4) are not divisible by 3");
}

TEST_CASE("global batch not divisible by micro-batch x DP", "[config]") {
  CHECK(ErrorOf(Data("global_batch.json")) ==
        Data("global_batch.json") +
            ": /training/global_batch_size: 10 is not divisible by micro_batch_size × "
            "data_parallel_size = 2 × 3");
}

TEST_CASE("missing model file names /model and the resolved path", "[config]") {
  CHECK(ErrorOf(Data("missing_model.json")) ==
        Data("missing_model.json") + ": /model: cannot read model file '" + Data("no-such-model.json") +
            "' (a relative path is read from the config's folder)");
}

TEST_CASE("unknown device preset lists the known ones", "[config]") {
  std::string known;
  for (const std::string& n : EmbeddedDeviceNames()) known += (known.empty() ? "" : ", ") + n;
  CHECK(ErrorOf(Data("bad_device.json")) ==
        Data("bad_device.json") + ": /device: unknown device preset 'a100-80' (did you mean "
                                  "'a100-80g'?); known presets: " +
            known + "; or give a path to a preset file");
  LoadOptions o;
  o.device = "h100-80";
  CHECK(ErrorOf(Data("good.json"), o) ==
        "--device h100-80: unknown device preset 'h100-80' (did you mean 'h100-80g'?); known "
        "presets: " +
            known + "; or give a path to a preset file");
}

TEST_CASE("malformed JSON gives line and column", "[config]") {
  // Line 4 is `  "training": {"seq_length": 1024,}`; the '}' after the comma is column 35.
  CHECK(ErrorOf(Data("malformed.json")) ==
        Data("malformed.json") +
            ":4:35: malformed JSON: while parsing object key - unexpected '}'; expected string literal");
}

TEST_CASE("a value outside a list of choices suggests the closest", "[config]") {
  CHECK(ErrorOf(Data("bad_choice.json")) ==
        Data("bad_choice.json") +
            ": /training/recompute_granularity: expected one of 'none', 'selective', 'full', got "
            "\"ful\" (did you mean 'full'?)");
}

TEST_CASE("allocator ranges", "[config]") {
  CHECK(ErrorOf(Data("bad_allocator.json")) ==
        Data("bad_allocator.json") +
            ": /allocator/max_split_size_mb: expected an integer > 20 (MiB) or null, got 20");
}

TEST_CASE("values given with --set are named by their command-line text", "[config]") {
  LoadOptions o;
  o.overrides = {"training.micro_batch_size=0"};
  CHECK(ErrorOf(Data("good.json"), o) ==
        "--set training.micro_batch_size=0: expected a positive integer, got 0");
  o.overrides = {"training.micro_batch_sise=2"};
  CHECK(ErrorOf(Data("good.json"), o) ==
        "--set training.micro_batch_sise=2: unknown key (did you mean 'micro_batch_size'?)");
  o.overrides = {"micro_batch_size=2"};
  CHECK(ErrorOf(Data("good.json"), o) ==
        "--set micro_batch_size=2: expected a key training.<name> or allocator.<name>");
  o.overrides = {"training.micro_batch_size"};
  CHECK(ErrorOf(Data("good.json"), o) ==
        "--set training.micro_batch_size: expected KEY=VALUE, e.g. training.micro_batch_size=2");
}

TEST_CASE("a missing config file", "[config]") {
  CHECK(ErrorOf(Data("no-such-config.json")) ==
        Data("no-such-config.json") + ": cannot read the config file: " + std::strerror(ENOENT));
}

}  // namespace
}  // namespace memsim::config

namespace memsim::config {
namespace {

TEST_CASE("micro_batch_size boundaries", "[config]") {
  // good.json: seq_length 1024, DP 2. global_batch_size null -> micro_batch_size × DP, so only
  // the micro-batch size limits apply: positive, at most 2^16, and seq × mbs at most 2^26 tokens
  // (1024 × 65536 = 2^26 exactly).
  const auto [value, message] = GENERATE(table<std::string, std::string>({
      {"0", "--set training.micro_batch_size=0: expected a positive integer, got 0"},
      {"1", "(no error)"},
      {"65536", "(no error)"},
      {"65537", "--set training.micro_batch_size=65537: 65537 exceeds memsim's limit of 65536"},
      {"1.5", "--set training.micro_batch_size=1.5: expected a positive integer, got 1.5"},
  }));
  LoadOptions o;
  o.overrides = {"training.micro_batch_size=" + value, "training.global_batch_size=null"};
  CHECK(testing::ErrorOf(testing::Data("good.json"), o) == message);
}

TEST_CASE("the token limit per micro-batch", "[config]") {
  // seq_length 2048 × micro_batch_size 32769 = 67110912 > 2^26 = 67108864.
  LoadOptions o;
  o.overrides = {"training.seq_length=2048", "training.micro_batch_size=32769",
                 "training.global_batch_size=null"};
  CHECK(testing::ErrorOf(testing::Data("good.json"), o) ==
        "--set training.micro_batch_size=32769: seq_length × micro_batch_size = 67110912 tokens "
        "exceeds memsim's limit of 67108864");
}

}  // namespace
}  // namespace memsim::config

namespace memsim::config {
namespace {

TEST_CASE("duplicate keys are errors, not last-one-wins", "[config]") {
  CHECK(testing::ErrorOf(testing::Data("duplicate_key2.json")) ==
        testing::Data("duplicate_key2.json") + ": /training/micro_batch_size: duplicate key");
  // Inside an array: element 1 of recompute_modules.
  CHECK(testing::ErrorOf(testing::Data("duplicate_key.json")) ==
        testing::Data("duplicate_key.json") + ": /training/recompute_modules/1/a: duplicate key");
}


// Tryout 7 finding 9: the messages say why and what was meant.
TEST_CASE("did you mean for dtype spellings and sections, Megatron argument names in JSON",
          "[config]") {
  auto error_of = [](std::vector<std::string> sets) {
    LoadOptions o;
    o.overrides = std::move(sets);
    return ErrorOf(Data("good.json"), o);
  };
  // PyTorch's dtype names (torch.bfloat16, torch.float16 = torch.half) for the choices.
  CHECK(error_of({"training.precision=bfloat16"}) ==
        "--set training.precision=bfloat16: expected one of 'fp32', 'fp16', 'bf16', got "
        "\"bfloat16\" (did you mean 'bf16'?)");
  CHECK(error_of({"training.precision=torch.half"}).ends_with("(did you mean 'fp16'?)"));
  CHECK(error_of({"trainig.seq_length=8"}) ==
        "--set trainig.seq_length=8: expected a key training.<name> or allocator.<name> (did "
        "you mean 'training.seq_length'?)");
  // Megatron's arguments, as --megatron-args classes them (megatron_flag_table.inc):
  // --optimizer-cpu-offload and --account-for-loss-in-pipeline-split unsupported,
  // --calculate-per-token-loss memory-neutral.
  CHECK(error_of({"training.optimizer_cpu_offload=true"}) ==
        "unsupported: --set training.optimizer_cpu_offload=true: offloading tensors to host memory (the "
        "launch-script argument --optimizer-cpu-offload)");
  CHECK_THROWS_AS(
      LoadSetup(Data("good.json"), [] {
        LoadOptions o;
        o.overrides = {"training.account_for_loss_in_pipeline_split=true"};
        return o;
      }()),
      UnsupportedError);
  CHECK(error_of({"training.calculate_per_token_loss=true"}) ==
        "--set training.calculate_per_token_loss=true: the launch-script argument "
        "--calculate-per-token-loss is memory-neutral and not a key memsim reads: remove it");
}

}  // namespace
}  // namespace memsim::config
