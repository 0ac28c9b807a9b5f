// torchtitan job configs (config/torchtitan_toml.h): torchtitan's own llama3_8b.toml
// (configs/torchtitan/, from torchtitan commit 31a17bfdb70bab6f62a13d21816a5339b911d6e3) read
// unedited into the "torchtitan" stack, the llama3 flavors' shapes, and every bad value named
// by file, line and key. Expected numbers are derived from torchtitan's model args and
// JobConfig defaults in the comments.
#include "config/torchtitan_toml.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "config/load.h"
#include "core/error.h"
#include "test_util.h"
#include "workload/data_parallel.h"

namespace memsim::config {
namespace {

using testing::ErrorOf;
using testing::WriteTemp;

std::string Llama3_8bToml() {
  return std::string(MEMSIM_SOURCE_DIR) + "/configs/torchtitan/llama3_8b.toml";
}

LoadOptions OnH100() {
  LoadOptions o;
  o.device = "h100-80g";
  return o;
}

TEST_CASE("torchtitan llama3 flavors: SwiGLU hidden sizes from FeedForward's rule",
          "[config][torchtitan]") {
  // int(2 · 4·dim / 3), × ffn_dim_multiplier (truncated), rounded up to multiple_of:
  // 8B: 10922 × 1.3 = 14198.6 -> 14198 -> 14336 (14 × 1024);
  // 70B: 21845 × 1.3 = 28398.5 -> 28398 -> 28672 (7 × 4096);
  // 405B: 43690 × 1.2 = 52428 -> 53248 (13 × 4096); debugmodel: 682 -> 768 (3 × 256).
  const std::map<std::string_view, std::int64_t> expected = {
      {"8B", 14336}, {"70B", 28672}, {"405B", 53248}, {"debugmodel", 768}};
  for (const internal::TorchtitanFlavor& f : internal::Llama3Flavors()) {
    INFO(f.name);
    CHECK(internal::TorchtitanFfnHidden(f) == expected.at(f.name));
  }
}

TEST_CASE("torchtitan's llama3_8b.toml runs unedited", "[config][torchtitan]") {
  const Setup s = LoadSetup(Llama3_8bToml(), OnH100());
  CHECK(s.training.framework == "torchtitan");
  // [model] llama3 8B: dim 4096, 32 layers, 32 heads, 8 kv heads, vocab 128256.
  CHECK(s.model.hidden_size == 4096);
  CHECK(s.model.num_hidden_layers == 32);
  CHECK(s.model.num_attention_heads == 32);
  CHECK(s.model.num_key_value_heads == 8);
  CHECK(s.model.intermediate_size == 14336);
  CHECK(s.model.vocab_size == 128256);
  CHECK_FALSE(s.model.tie_word_embeddings);
  // [parallelism] data_parallel_shard_degree -1: 8 ranks (run_train.sh's NGPU default).
  CHECK(s.training.data_parallel_size == 8);
  // [training] local_batch_size 1, seq_len 8192, steps 1000; global batch 1 · 8.
  CHECK(s.training.micro_batch_size == 1);
  CHECK(s.training.global_batch_size == 8);
  CHECK(s.training.seq_length == 8192);
  CHECK(s.training.train_iters == 1000);
  // JobConfig defaults: mixed_precision_param bfloat16, reduce float32, dtype float32, fused
  // AdamW.
  CHECK(s.training.precision == Precision::kBf16);
  CHECK(s.training.optimizer_impl == OptimizerImpl::kFused);
  const auto& titan = std::get<TorchtitanOptions>(s.training.stack);
  CHECK(titan.torch_dtype == Precision::kFp32);
  CHECK(titan.reduce_dtype == Precision::kFp32);
  CHECK(titan.reshard_after_forward);
  CHECK(std::holds_alternative<TorchFsdp2>(DataParallelOf(s.training)));
  // [activation_checkpoint] mode "selective": modelled as none, said in a warning.
  CHECK(s.training.recompute_granularity == RecomputeGranularity::kNone);
  bool warned = false;
  for (const std::string& w : s.warnings) {
    warned = warned || w.find("[activation_checkpoint] mode: 'selective'") != std::string::npos;
  }
  CHECK(warned);
}

TEST_CASE("torchtitan job config errors name the file, line and key", "[config][torchtitan]") {
  const std::string head = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n";
  SECTION("an unknown flavor") {
    const std::string p = WriteTemp("t1.toml", "[model]\nname = \"llama3\"\nflavor = \"9B\"\n");
    CHECK(ErrorOf(p, OnH100()) ==
          p + ":3: [model] flavor: expected one of 'debugmodel', '8B', '70B', '405B' "
              "(torchtitan's llama3 flavors memsim reads), got \"9B\"");
  }
  SECTION("a value of the wrong type") {
    const std::string p = WriteTemp("t2.toml", head + "[training]\nseq_len = \"long\"\n");
    CHECK(ErrorOf(p, OnH100()) == p + ":5: [training] seq_len: expected an integer, got \"long\"");
  }
  SECTION("a bad choice") {
    const std::string p = WriteTemp("t3.toml", head + "[activation_checkpoint]\nmode = \"some\"\n");
    CHECK(ErrorOf(p, OnH100()) ==
          p + ":5: [activation_checkpoint] mode: expected one of 'none', 'selective', 'full', "
              "'memory_budget', got \"some\"");
  }
  SECTION("malformed TOML") {
    const std::string p = WriteTemp("t4.toml", head + "[training\n");
    CHECK(ErrorOf(p, OnH100()).rfind(p + ":4:", 0) == 0);
  }
  SECTION("no device") {
    const std::string p = WriteTemp("t5.toml", head);
    CHECK(ErrorOf(p).rfind(p + ": a torchtitan job config does not name its device", 0) == 0);
  }
}

TEST_CASE("torchtitan features memsim does not model are refused with the reason",
          "[config][torchtitan]") {
  const std::string head = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n";
  const auto [text, where] = GENERATE(table<std::string, std::string>({
      {"converters = [\"float8\"]\n", ":4: [model] converters: converter 'float8' (Float8"},
      {"[parallelism]\ntensor_parallel_degree = 8\n", ":5: [parallelism] tensor_parallel_degree"},
      {"[parallelism]\npipeline_parallel_degree = 2\n",
       ":5: [parallelism] pipeline_parallel_degree"},
      {"[parallelism]\ncontext_parallel_degree = 2\n", ":5: [parallelism] context_parallel_degree"},
      {"[training]\nenable_cpu_offload = true\n", ":5: [training] enable_cpu_offload"},
  }));
  const std::string p = WriteTemp("u.toml", head + text);
  try {
    LoadSetup(p, OnH100());
    FAIL("no error");
  } catch (const UnsupportedError& e) {
    CHECK(std::string(e.what()).find(p + where) != std::string::npos);
  }
}

TEST_CASE("torchtitan: compile is a warning saying memsim errs high", "[config][torchtitan]") {
  const std::string p = WriteTemp(
      "c.toml", "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[compile]\nenable = true\n");
  const Setup s = LoadSetup(p, OnH100());
  // [activation_checkpoint] mode is absent: JobConfig's default "selective", also errs high.
  REQUIRE(s.not_modelled.size() == 2);
  CHECK(s.not_modelled[0].flag == "activation_checkpoint.mode");
  CHECK(s.not_modelled[1].what == p + ":5: [compile] enable");
  CHECK(s.not_modelled[1].direction == NotModelled::Direction::kHigh);
}

}  // namespace
}  // namespace memsim::config
