// Bad input found by trying to break `memsim`: every case is one InputError message, asserted
// verbatim, never a crash, an abort in a later module or a silently absurd simulation.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "cli/cli_test_util.h"

#include "test_util.h"

namespace memsim::config {
namespace {

using testing::Data;
using testing::ErrorOf;

// Writes `text` to a file of its own in the temporary directory and returns its path.
std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("memsim_hardening_" + std::to_string(getpid()) + "_" + name))
                               .string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// A config with an inline model (as tests/config/data/good.json: 32 heads, 8 key/value heads,
// 32 layers, hidden 256, intermediate 688, vocab 32000) and TP 2, DP 2, 4 micro-batches;
// `model_extra` is appended to the model object's members, `device` is the device value.
std::string Config(const std::string& model_extra, const std::string& device = "\"a100-80g\"") {
  return "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, \"intermediate_size\": "
         "688, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"num_hidden_layers\": "
         "32, \"vocab_size\": 32000" +
         model_extra + "}, \"device\": " + device +
         ", \"training\": {\"seq_length\": 1024, \"global_batch_size\": 8, "
         "\"data_parallel_size\": 2, \"tensor_model_parallel_size\": 2}}";
}

// Config("") with the model's "key": value replaced by `value`.
std::string ConfigWith(const std::string& key, const std::string& value) {
  std::string text = Config("");
  const size_t at = text.find("\"" + key + "\": ");
  const size_t start = at + key.size() + 4;
  const size_t end = text.find_first_of(",}", start);
  return text.substr(0, start) + value + text.substr(end);
}

using Result = ::memsim::testing::CombinedResult;

Result Run(const std::string& args) { return ::memsim::testing::RunMemsimCombined(args); }

LoadOptions Set(std::vector<std::string> overrides) {
  LoadOptions o;
  o.overrides = std::move(overrides);
  return o;
}

TEST_CASE("a short unknown key gets no far-fetched suggestion", "[config]") {
  // "foo" vs "fp8": 2 edits; a 3-letter word allows max(1, 3/3) = 1 edit.
  CHECK(ErrorOf(Data("good.json"), Set({"training.foo=1"})) == "--set training.foo=1: unknown key");
  // One edit still suggests: "fp9" -> "fp8".
  CHECK(ErrorOf(Data("good.json"), Set({"training.fp9=1"})) ==
        "--set training.fp9=1: unknown key (did you mean 'fp8'?)");
  // A swap of adjacent letters is one edit: "rnu" -> "run"; "fp8" is 2 edits from "foo".
  CHECK(ClosestMatch("rnu", {"run", "check"}) == "run");
  CHECK(ClosestMatch("foo", {"fp8"}) == "");
}


TEST_CASE("the hardening tests' base config loads", "[config]") {
  CHECK(ErrorOf(WriteTemp("base.json", Config(""))) == "(no error)");
}

// Every Setup the workload would stop on (a MEMSIM_CHECK in workload/model.cc) is rejected here.
TEST_CASE("FFN hidden size not divisible by TP", "[config]") {
  // Megatron splits ffn_hidden_size over TP ranks: 11007 is odd, TP is 2.
  CHECK(ErrorOf(Data("good.json"), Set({"training.ffn_hidden_size=11007"})) ==
        "--set training.ffn_hidden_size=11007: FFN hidden size 11007 is not divisible by "
        "tensor_model_parallel_size 2");
  const std::string path = WriteTemp("ffn.json", ConfigWith("intermediate_size", "687"));
  CHECK(ErrorOf(path) == path + ": /model/intermediate_size: FFN hidden size 687 is not divisible "
                                "by tensor_model_parallel_size 2");
}

TEST_CASE("other shapes the workload cannot take are rejected", "[config]") {
  // More key/value heads (64) than attention heads (32).
  const std::string kv = WriteTemp("kv.json", ConfigWith("num_key_value_heads", "64"));
  CHECK(ErrorOf(kv) == kv + ": /model/num_key_value_heads: 64 key/value heads do not divide the "
                            "32 attention heads");
  // hidden_size 250 over 32 heads without head_dim: 250 / 32 is not whole.
  const std::string hd = WriteTemp("hd.json", ConfigWith("hidden_size", "250"));
  CHECK(ErrorOf(hd) == hd + ": /model/hidden_size: hidden_size 250 is not divisible by "
                            "num_attention_heads 32 (set head_dim)");
  const std::string vocab = WriteTemp("vocab.json", ConfigWith("vocab_size", "0"));
  CHECK(ErrorOf(vocab) == vocab + ": /model/vocab_size: expected a positive integer, got 0");
  // Learned positions: seq_length 1024 over max_position_embeddings 512.
  const std::string pos = WriteTemp(
      "pos.json", "{\"model\": {\"model_type\": \"gpt2\", \"n_positions\": 512}, \"device\": "
                  "\"a100-80g\", \"training\": {\"seq_length\": 1024}}");
  CHECK(ErrorOf(pos) == pos + ": /training/seq_length: 1024 exceeds max_position_embeddings 512 "
                              "(learned absolute position embeddings: max_position_embeddings at " +
                              pos + ": /model/n_positions)");
}

TEST_CASE("JSON nested deeper than 64 levels is rejected while parsing", "[config]") {
  // 100000 '[': the 65th, at byte offset 64 of line 1, opens level 65 (column 65).
  const std::string deep = WriteTemp("deep.json", std::string(100000, '[') + std::string(100000, ']'));
  CHECK(ErrorOf(deep) == deep + ":1:65: JSON nested deeper than memsim's limit of 64 levels");
  // Brackets inside strings do not count; the 65th object opens on line 2, column 1 + 64 = 65
  // after a first line of one '{' and the key.
  std::string text = "{\"a[[[[\":\n";
  for (int i = 0; i < 100; ++i) text += "{\"k\":";
  const std::string objects = WriteTemp("deep_objects.json", text);
  CHECK(ErrorOf(objects) ==
        objects + ":2:" + std::to_string(1 + 63 * 5) + ": JSON nested deeper than memsim's limit of 64 levels");
  // 64 levels are fine (then the config is not an object).
  const std::string ok = WriteTemp("deep_ok.json", std::string(64, '[') + std::string(64, ']'));
  CHECK(ErrorOf(ok).find("expected an object") != std::string::npos);
  // A --set value is held to the same limit.
  CHECK(ErrorOf(Data("good.json"), Set({"training.seed=" + std::string(65, '[')})) ==
        "--set training.seed=" + std::string(65, '[') +
            ": value nested deeper than memsim's limit of 64 levels");
  // Through the binary: one line, exit 2.
  const Result r = Run("validate " + deep);
  CHECK(r.exit_code == 2);
  CHECK(r.output == "memsim validate: " + deep + ":1:65: JSON nested deeper than memsim's limit of 64 levels\n");
}

TEST_CASE("duplicate keys are still found at depth, with their full pointer", "[config]") {
  const std::string path = WriteTemp("dup.json", "{\"a\": [0, {\"b~/\": {\"c\": 1, \"c\": 2}}]}");
  CHECK(ErrorOf(path) == path + ": /a/1/b~0~1/c: duplicate key");
}

TEST_CASE("simulation size limits", "[config]") {
  // train_iters has no limit of its own (a long run is simulated until its steady state).
  CHECK(ErrorOf(Data("good.json"), Set({"training.train_iters=2147483647"})) == "(no error)");
  // global 131074 / (micro-batch 1 × DP 2) = 65537 micro-batches.
  CHECK(ErrorOf(Data("good.json"), Set({"training.global_batch_size=131074"})) ==
        "--set training.global_batch_size=131074: 65537 micro-batches per iteration exceed "
        "memsim's limit of 65536");
  // 10 iterations × (32768 / 2 = 16384 micro-batches) × 32 layers = 5242880 > 2^21 = 2097152.
  CHECK(ErrorOf(Data("good.json"),
                Set({"training.train_iters=10", "training.global_batch_size=32768"})) ==
        "--set training.train_iters=10: train_iters × micro-batches per iteration × "
        "num_hidden_layers = 10 × 16384 × 32 = 5242880 layer passes exceed memsim's limit of "
        "2097152; reduce train_iters, global_batch_size (micro-batches) or num_hidden_layers");
  // A long run counts the iterations it may simulate (config/iterations.h): 2 + 32 = 34;
  // 34 × 4096 × 32 = 4456448 > 2^21.
  CHECK(ErrorOf(Data("good.json"),
                Set({"training.train_iters=1000", "training.global_batch_size=8192"})) ==
        "--set training.train_iters=1000: simulated iterations × micro-batches per iteration × "
        "num_hidden_layers = 34 × 4096 × 32 = 4456448 layer passes exceed memsim's limit of "
        "2097152; reduce train_iters, global_batch_size (micro-batches) or num_hidden_layers");
  // One stage holds no more memory than another (its ops are streamed): PP 1 with
  // 34 × 128 × 32 = 139264 passes, once refused for the memory of one stage, is accepted.
  CHECK(ErrorOf(Data("good.json"),
                Set({"training.train_iters=1000", "training.global_batch_size=256"})) ==
        "(no error)");
  // PP 2 halves a stage: 34 × 128 × 16 = 69632 passes, accepted.
  CHECK(ErrorOf(Data("good.json"),
                Set({"training.train_iters=1000", "training.global_batch_size=256",
                     "training.pipeline_model_parallel_size=2"})) == "(no error)");
}

TEST_CASE("models too large for memsim's byte range", "[config]") {
  // hidden 2^20 = 1048576 over 32 heads: head_dim 32768, q = 32 × 32768 = 2^20,
  // kv = 8 × 32768 = 2^18; ffn 688, gated (γ = 2); 64 layers, PP 1, TP 2; vocab 32000 (a multiple
  // of 128 × 2). Per layer: (h(q + 2kv) + qh + 3 h ffn + 4h) / 2
  //   = (1649267441664 + 1099511627776 + 2164260864 + 4194304) / 2 = 1375473762304 ≈ 1.38e+12;
  // embedding 2 × 32000 × 2^20 / 2 = 33554432000 ≈ 3.36e+10;
  // parameters 64 × 1375473762304 + 33554432000 = 88063875219456 ≈ 8.81e+13;
  // × 20 bytes = 1761277504389120 ≈ 1.76e+15 > 2^50 ≈ 1.13e+15.
  CHECK(ErrorOf(Data("good.json"), Set({"training.hidden_size=1048576", "training.num_layers=64"})) ==
        "--set training.hidden_size=1048576: model too large for memsim: about 8.81e+13 "
        "parameters per rank (64 layers per stage × 1.38e+12 + 3.36e+10 embedding), 1.76e+15 "
        "bytes of weights, gradients and optimizer state at 20 bytes each, over memsim's limit of "
        "2^50 bytes (1 PiB); reduce hidden_size, intermediate_size, num_hidden_layers or "
        "vocab_size, or raise tensor_model_parallel_size or pipeline_model_parallel_size");
  // seq 2^26 without flash attention: scores 1 × (32 / 2) × 2^26 × 2^26 × 4 bytes = 2^58
  // = 288230376151711744 ≈ 2.88e+17 bytes.
  CHECK(ErrorOf(Data("good.json"), Set({"training.seq_length=67108864"})) ==
        "--set training.seq_length=67108864: model too large for memsim: one activation of a "
        "micro-batch would take about 2.88e+17 bytes, over memsim's limit of 2^50 bytes (1 PiB); "
        "reduce seq_length, micro_batch_size or the model's width, or set use_flash_attn");
  // With flash attention the largest is the logits, 2^26 × 32000 / 2 × 4 ≈ 4.3e12 bytes: accepted.
  CHECK(ErrorOf(Data("good.json"),
                Set({"training.seq_length=67108864", "training.use_flash_attn=true"})) ==
        "(no error)");
}

TEST_CASE("device preset figures are bounded", "[config]") {
  auto preset = [](const std::string& fields) {
    return "{\"name\": \"x\", \"allocator_backend\": \"cuda\", \"total_memory_bytes\": 1024, "
           "\"usable_memory_bytes\": 1024" +
           fields + "}";
  };
  auto error = [](const std::string& path) {
    try {
      LoadDevicePreset(path);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string ok = WriteTemp("dev_ok.json", preset(", \"peak_flops\": {\"bf16\": 0}"));
  CHECK(error(ok) == "(no error)");
  // 2^63 - 1 bytes: far over 2^50.
  const std::string huge = WriteTemp("dev_huge.json", preset(", \"context_bytes\": 9223372036854775807"));
  CHECK(error(huge) == huge + ": /context_bytes: expected an integer number of bytes from 0 to "
                              "2^50 (1 PiB), got 9223372036854775807");
  const std::string pib = WriteTemp(
      "dev_pib.json", "{\"name\": \"x\", \"allocator_backend\": \"cuda\", \"total_memory_bytes\": "
                      "1125899906842625, \"usable_memory_bytes\": 1}");
  CHECK(error(pib) == pib + ": /total_memory_bytes: expected an integer number of bytes from 1 to "
                            "2^50 (1 PiB), got 1125899906842625");
  const std::string tiny = WriteTemp("dev_flops.json", preset(", \"peak_flops\": {\"bf16\": 1e-300}"));
  CHECK(error(tiny) == tiny + ": /peak_flops/bf16: expected 0 (unknown) or a number from 1e9 to "
                              "1e18 FLOP/s, got 1e-300");
  const std::string bw = WriteTemp("dev_bw.json", preset(", \"memory_bandwidth_bytes_per_s\": 1e17"));
  CHECK(error(bw) == bw + ": /memory_bandwidth_bytes_per_s: expected 0 (unknown) or a number from "
                          "1e6 to 1e16 bytes/s, got 1e+17");
}

TEST_CASE("an inline device object reports pointers under /device", "[config]") {
  const std::string path = WriteTemp(
      "inline_dev.json",
      Config("", "{\"name\": \"x\", \"allocator_backend\": \"cuda\", \"total_memory_bytes\": -1}"));
  CHECK(ErrorOf(path) == path + ": /device/total_memory_bytes: expected an integer number of "
                                "bytes from 1 to 2^50 (1 PiB), got -1");
  const Result r = Run("validate " + path);
  CHECK(r.exit_code == 2);
}

TEST_CASE("invalid UTF-8 and long values are echoed safely", "[config]") {
  // Each invalid byte shows as U+FFFD (UTF-8 EF BF BD); no nlohmann type_error escapes.
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(ErrorOf(Data("good.json"), Set({"training.precision=\xff\xfe"})) ==
        "--set training.precision=" + fffd + fffd + ": expected one of 'fp32', 'fp16', 'bf16', got \"" +
            fffd + fffd + "\"");
  // A 100-character value is echoed as its first 77 characters and "...".
  const std::string x(100, 'x');
  CHECK(ErrorOf(Data("good.json"), Set({"training.framework=" + x})) ==
        "unsupported: --set training.framework=" + x.substr(0, 77) + "...: framework '" +
            x.substr(0, 77) + "...' (memsim models \"megatron\", \"pytorch\", \"hf-trainer\" and \"torchtitan\")");
  // Through the binary (printf writes the two bytes; /bin/sh has no $'...').
  const Result r = Run("validate " + Data("good.json") +
                       " --set \"$(printf 'training.precision=\\377\\376')\"");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "memsim validate: --set training.precision=" + fffd + fffd +
                        ": expected one of 'fp32', 'fp16', 'bf16', got \"" + fffd + fffd + "\"\n");
}

TEST_CASE("a model-file value in conflict with the training config names both", "[config]") {
  CHECK(ErrorOf(Data("file_model_heads_tp.json")) ==
        Data("tiny-llama.json") + ": /num_attention_heads: 8 heads are not divisible by "
                                  "tensor_model_parallel_size 3 (training config " +
            Data("file_model_heads_tp.json") + ": /training/tensor_model_parallel_size)");
  // tiny-llama has 4 layers; PP 3 from the command line.
  CHECK(ErrorOf(Data("file_model.json"), Set({"training.pipeline_model_parallel_size=3"})) ==
        Data("tiny-llama.json") + ": /num_hidden_layers: 4 layers are not divisible by "
                                  "pipeline_model_parallel_size 3 (training config --set "
                                  "training.pipeline_model_parallel_size=3)");
}

TEST_CASE("hidden_act must be an activation Hugging Face knows", "[config]") {
  const std::string path = WriteTemp("act.json", Config(", \"hidden_act\": \"foo\""));
  CHECK(ErrorOf(path) ==
        path + ": /model/hidden_act: expected one of 'gelu', 'gelu_10', 'gelu_fast', 'gelu_new', "
               "'gelu_python', 'gelu_pytorch_tanh', 'gelu_accurate', 'laplace', 'leaky_relu', "
               "'linear', 'mish', 'quick_gelu', 'relu', 'relu2', 'relu6', 'sigmoid', 'silu', "
               "'swish', 'tanh', 'prelu', got \"foo\"");
  CHECK(ErrorOf(WriteTemp("act_ok.json", Config(", \"hidden_act\": \"gelu_pytorch_tanh\""))) ==
        "(no error)");
}

TEST_CASE("a --set repeated with another value, or --iterations over a --set, is a warning",
          "[config]") {
  // Applied in order, the last one wins (as before); it was not said.
  LoadOptions o = Set({"training.seq_length=512", "training.micro_batch_size=1",
                       "training.seq_length=2048", "training.micro_batch_size=1",
                       "training.train_iters=9"});
  o.iterations = 2;
  const Setup s = LoadSetup(Data("good.json"), o);
  CHECK(s.training.seq_length == 2048);
  CHECK(s.training.train_iters == 2);
  CHECK(std::count(s.warnings.begin(), s.warnings.end(),
                   "--set training.seq_length=2048: overrides --set training.seq_length=512 given "
                   "before it; the last is taken") == 1);
  CHECK(std::count(s.warnings.begin(), s.warnings.end(),
                   "--iterations 2: overrides --set training.train_iters=9") == 1);
  // The same value twice says nothing.
  for (const std::string& w : s.warnings) CHECK(w.find("micro_batch_size") == std::string::npos);
}

TEST_CASE("an integer beyond int is named as over the limit, not as not positive", "[config]") {
  // It read "expected a positive integer, got 1099511627776".
  CHECK(ErrorOf(Data("good.json"), Set({"training.micro_batch_size=1099511627776"})) ==
        "--set training.micro_batch_size=1099511627776: 1099511627776 exceeds memsim's limit of "
        "65536");
  // 2^63 (stored unsigned by the JSON parser).
  CHECK(ErrorOf(Data("good.json"), Set({"training.train_iters=9223372036854775808"})) ==
        "--set training.train_iters=9223372036854775808: 9223372036854775808 exceeds memsim's "
        "limit of 2147483647");
  CHECK(ErrorOf(Data("good.json"), Set({"training.seq_length=-1099511627776"})) ==
        "--set training.seq_length=-1099511627776: expected a positive integer, got "
        "-1099511627776");
}

TEST_CASE("a device preset path that cannot be read says why", "[config]") {
  // It said only "cannot read device preset file 'DIR'".
  const std::string dir = std::filesystem::temp_directory_path().string();
  LoadOptions o;
  o.device = dir;
  CHECK(ErrorOf(Data("good.json"), o) ==
        "--device " + dir + ": cannot read device preset file '" + dir + "': a directory, not a file");
}

}  // namespace
}  // namespace memsim::config
