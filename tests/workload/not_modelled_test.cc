// What flags memsim does not model would change, by about how much (workload/not_modelled.h),
// and the caveat that goes with an out-of-memory verdict (report/run_report.h; issue 32).
#include "workload/not_modelled.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "config/launch_script.h"
#include "config/megatron_args.h"
#include "config/test_util.h"
#include "engine/stages.h"
#include "report/run_report.h"

namespace memsim::workload {
namespace {

using config::NotModelled;

// tests/config/data/launch/mindspeed_reuse_swap.sh: Llama-2-13B-shaped (40 layers, h 5120,
// ffn 13824 SwiGLU, 40 heads of 128, vocab 32000 untied), TP 8 with sequence parallelism, PP 1,
// DP 1, the distributed optimizer, bf16, seq 4096, micro-batch 2, with --reuse-fp32-param and
// --recompute-activation-function (both modelled) and --swap-attention (not modelled).
config::Setup MindSpeedScript(const std::vector<std::string>& sets = {}) {
  config::LoadOptions options;
  options.device = "ascend-910b-64g";
  options.overrides = sets;
  return config::LoadSetupFromMegatron(
      config::ReadMegatronArgsFile(config::testing::Data("launch/mindspeed_reuse_swap.sh")),
      options, {});
}

TEST_CASE("a MindSpeed feature memsim does not model: its direction and amount, derived",
          "[workload][not_modelled]") {
  const config::Setup s = MindSpeedScript();
  REQUIRE(s.not_modelled.size() == 1);
  const std::vector<NotModelledEstimate> e = EstimateNotModelled(s, 0);
  REQUIRE(e.size() == 1);
  const std::string path = config::testing::Data("launch/mindspeed_reuse_swap.sh");
  CHECK(e[0].flag.what == path + ":20: --swap-attention");
  CHECK(e[0].flag.direction == NotModelled::Direction::kHigh);
  // What SwapPrefetch.pack_hook moves to the host inside `self_attention` (MindSpeed 028de58
  // swap_attention/prefetch.py), a layer: T = 4096·2 = 8192 tokens; the norm output [T, h/σ =
  // 640], q, k, v and the attention output [T, 5120/8 = 640] each, bf16: 5 × 10,485,760; the
  // two softmax statistics of npu_fusion_attention [b, a/t = 5, s, 8] fp32: 2 × 1,310,720; all
  // of 512 KiB or more: 55,050,240 bytes. 40 layers × 1 micro-batch in flight (PP 1), less the
  // one layer prefetched back at a time: 39 sets.
  CHECK(e[0].about_bytes == 39LL * 55'050'240);
}

TEST_CASE("a feature's estimate follows the run: full recompute, a layer count",
          "[workload][not_modelled]") {
  // Under full recompute a layer keeps only its input: little to swap.
  const config::Setup full = MindSpeedScript({"training.recompute_granularity=\"full\"",
                                              "training.recompute_method=\"uniform\"",
                                              "training.recompute_num_layers=1"});
  const std::vector<NotModelledEstimate> e = EstimateNotModelled(full, 0);
  CHECK(e[0].about_bytes == 0);
  CHECK(e[0].basis == "little: full recompute keeps only each layer's input");
  // --recompute-norm-num-layers 8: 8 layers' two norm outputs [T = 8192, h/t = 640] bf16.
  config::Setup some = MindSpeedScript();
  some.not_modelled = {{"x:1: --recompute-norm-num-layers",
                        "--recompute-norm-num-layers",
                        {"8"},
                        NotModelled::Direction::kHigh}};
  CHECK(EstimateNotModelled(some, 0)[0].about_bytes == 8LL * 2 * 8192 * 640 * 2);
}

TEST_CASE("MindSpeed swap-attention: the layers it swaps, --recompute-method block's count",
          "[workload][not_modelled]") {
  config::Setup s = MindSpeedScript();
  // solve_prefetch_policy: with --recompute-method block only the first --recompute-num-layers
  // layers of a stage are swapped: 4 layers, less the one prefetched, × 55,050,240 bytes.
  s.training.recompute_method = config::RecomputeMethod::kBlock;
  s.training.recompute_num_layers = 4;
  CHECK(EstimateNotModelled(s, 0)[0].about_bytes == 3LL * 55'050'240);
}

TEST_CASE("MindSpeed swap-attention in MindSpeed-LLM's Qwen2-57B-A14B script: the amount at hand",
          "[workload][not_modelled]") {
  config::LoadOptions options;
  options.device = "ascend-910b-64g";
  const config::Setup s = config::LoadSetupFromMegatron(
      config::ReadMegatronArgsFile(std::string(MEMSIM_SOURCE_DIR) +
                                   "/tests/data/launch_scripts/"
                                   "mindspeed_llm_pretrain_qwen2_57b_a14b_4k_ptd.sh"),
      options, {});
  const std::vector<NotModelledEstimate> all = EstimateNotModelled(s, 0);
  const auto e = std::find_if(all.begin(), all.end(), [](const NotModelledEstimate& x) {
    return x.flag.flag == "--swap-attention";
  });
  REQUIRE(e != all.end());
  // Seq 4096 over CP 4, micro-batch 1: T = 1024; TP 1; h 3584, 28 heads × 128, 4 groups. A
  // layer: norm output, q and attention output 1024 × 3584 × 2 = 7,340,032 each; k and v 1024
  // × 512 × 2 = 1,048,576 each; softmax max and sum 32 × 1024 × 28 = 917,504 each: 25,952,256
  // bytes. Stage 0 of PP 4 holds 7 layers of min(4, 64 / (1 · DP 4) = 16) = 4 micro-batches:
  // 28 sets, less the one prefetched.
  CHECK(e->about_bytes == 27LL * 25'952'256);
}

TEST_CASE("MindSpeed moe-zero-memory: its share of the MoE MLP's activations, by level",
          "[workload][not_modelled]") {
  config::LoadOptions options;
  options.device = "ascend-910b-64g";
  options.overrides = {"model.vocab_size=32000"};
  config::Setup s = config::LoadSetupFromMegatron(
      config::ReadMegatronArgsFile(std::string(MEMSIM_SOURCE_DIR) +
                                   "/tests/data/launch_scripts/"
                                   "mindspeed_llm_pretrain_mixtral_8x7b_ptd.sh"),
      options, {});
  // MindSpeed-LLM's Mixtral script: seq 32768 over CP 4, micro-batch 1: T = 8192; TP 8 with
  // sequence parallelism (σ 8), EP 1, expert TP 8; top-2 of 8 experts of width 14336 (SwiGLU);
  // 32 MoE layers, PP 1 (one micro-batch in flight). A rank's experts take R = 2 · 8192/8 · 8
  // = 16,384 token copies; recomputing the MoE MLP would save fc1's input and fc2's output
  // [R, 4096] and fc1's and the activation's outputs [R, 2·1792] and [R, 1792]: 16,384 ×
  // 13,568 × 2 bytes = 444,596,224 bytes a layer.
  s.not_modelled = {{"x:1: --moe-zero-memory", "--moe-zero-memory", {"level0"},
                     NotModelled::Direction::kHigh}};
  // level0: 70% of it on all 32 layers: 22.4 × 444,596,224 = 9,958,955,417 (rounded down).
  CHECK(EstimateNotModelled(s, 0)[0].about_bytes == 9'958'955'417LL);
  // level1 on 8 layers (--moe-zero-memory-num-layers 8), level0's share on the other 24:
  // (0.9 · 8 + 0.7 · 24) × 444,596,224 = 24 × 444,596,224.
  s.not_modelled = {{"x:1: --moe-zero-memory", "--moe-zero-memory", {"level1"},
                     NotModelled::Direction::kHigh},
                    {"x:2: --moe-zero-memory-num-layers", "--moe-zero-memory-num-layers", {"8"},
                     NotModelled::Direction::kHigh}};
  CHECK(EstimateNotModelled(s, 0)[0].about_bytes == 24LL * 444'596'224);
  s.not_modelled.resize(1);  // level1 alone: all 32 layers at 90%
  CHECK(EstimateNotModelled(s, 0)[0].about_bytes == 288LL * 444'596'224 / 10);
}

TEST_CASE("MindSpeed recompute-in-bubble and recompute-in-advance: a chunk's activations",
          "[workload][not_modelled]") {
  // 8 layers (h 1024, 8 heads, SwiGLU ffn 2816, no dropout, flash attention, bf16, seq 1024,
  // micro-batch 1) over PP 2 with 2 layers a virtual stage: v = 2 chunks of Lc = 2 layers a
  // rank; 16 micro-batches (DP 1).
  std::vector<std::string> words = {
      "--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "8",
      "--ffn-hidden-size", "2816", "--swiglu", "--seq-length", "1024",
      "--max-position-embeddings", "1024", "--micro-batch-size", "1", "--global-batch-size",
      "16", "--vocab-size", "32000", "--bf16", "--use-flash-attn", "--hidden-dropout", "0",
      "--attention-dropout", "0", "--pipeline-model-parallel-size", "2",
      "--num-layers-per-virtual-pipeline-stage", "2", "--recompute-in-bubble"};
  config::LoadOptions options;
  options.device = "ascend-910b-64g";
  options.overrides = {"training.data_parallel_size=1"};
  const config::Setup bubble =
      config::LoadSetupFromMegatron(config::ReadCommandLineArguments(words), options, {});
  REQUIRE(bubble.not_modelled.size() == 1);
  // Korthikanti's per-layer activations without SP, t = 1: s·b·h · (8 + 8 + 6·2816/1024 =
  // 16.5) = 1,048,576 × 32.5 = 34,078,720 bytes (closed_form.cc). Interleaved 1F1B holds
  // warmup + 1 = 2·(2 - r - 1) + (2 - 1)·2 + 1 chunks: 5 on rank 0, 3 on rank 1; in the bubble
  // MindSpeed keeps p·v = 4: rank 0 one chunk (2 layers) fewer, rank 1 none.
  CHECK(EstimateNotModelled(bubble, 0)[0].about_bytes == 2 * 34'078'720LL);
  CHECK(EstimateNotModelled(bubble, 1)[0].about_bytes == 0);
  // --recompute-in-advance (with full recompute, block, 1 layer): either way by about one
  // chunk's activations without recompute: 2 × 34,078,720.
  words.back() = "--recompute-in-advance";
  words.insert(words.end(), {"--recompute-granularity", "full", "--recompute-method", "block",
                             "--recompute-num-layers", "1"});
  const config::Setup advance =
      config::LoadSetupFromMegatron(config::ReadCommandLineArguments(words), options, {});
  REQUIRE(advance.not_modelled.size() == 1);
  CHECK(advance.not_modelled[0].direction == NotModelled::Direction::kEither);
  CHECK(EstimateNotModelled(advance, 0)[0].about_bytes == 2 * 34'078'720LL);
}

TEST_CASE("the warnings of not-modelled flags end in their amount", "[workload][not_modelled]") {
  const config::Setup s = MindSpeedScript();
  const std::vector<std::string> w = report::WarningsWithEstimates(s);
  REQUIRE(w.size() == s.warnings.size());
  const std::string path = config::testing::Data("launch/mindspeed_reuse_swap.sh");
  // 39 × 55,050,240 bytes = 2,146,959,360 bytes = 1.9995 GiB.
  CHECK(w[1] == s.warnings[1] +
                    "; by about 2.00 GiB: 40 layers x 1 micro-batches in flight, less the one "
                    "layer prefetched, x 55050240 bytes a layer (the norm output, q, k, v, the "
                    "attention output and its softmax statistics of 512 KiB or more) go to "
                    "pinned host memory");
  CHECK(w[1].starts_with(path + ":20: --swap-attention: not modelled (MindSpeed moves"));
}

TEST_CASE("an out-of-memory verdict says which way the flags not modelled make memsim err",
          "[workload][not_modelled]") {
  // One micro-batch per iteration keeps the run short; 20 GiB is less than the static
  // 1.63 G parameters × (2 + 4 + 2 + 8) bytes = 26 GB (bf16 parameters, fp32 grads, the
  // residual of --reuse-fp32-param, Adam), so the run runs out of memory.
  const config::Setup s = MindSpeedScript({"training.global_batch_size=2"});
  engine::RunOptions options;
  options.usable_memory_bytes = Bytes{20} << 30;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(s, options);
  REQUIRE(run.first_oom);
  const std::string path = config::testing::Data("launch/mindspeed_reuse_swap.sh");
  const std::string caveat = report::FormatNotModelledCaveat(run, s);
  CHECK(caveat.starts_with("*** Caveat: 1 flag warned not modelled; so this verdict may be off "
                           "(stage 0):\n"));
  CHECK(caveat.find("***   " + path + ":20: --swap-attention: memsim errs high by about "
                    "2.00 GiB (") != std::string::npos);
  CHECK(caveat.ends_with("***   In all: memsim predicts up to about 2.00 GiB more and 0 B less "
                         "than the run would use.\n"));
  const nlohmann::json j = nlohmann::json::parse(report::RunReportJson(run, s));
  REQUIRE(j["not_modelled"].size() == 1);
  CHECK(j["not_modelled"][0]["flag"] == "--swap-attention");
  CHECK(j["not_modelled"][0]["memsim_errs"] == "high");
  CHECK(j["not_modelled"][0]["about_bytes"] == 2'146'959'360LL);
  // Without an out-of-memory verdict there is no caveat to print.
  engine::RunOptions roomy = options;
  roomy.usable_memory_bytes = Bytes{60} << 30;
  CHECK(report::FormatNotModelledCaveat(engine::RunAllStages(s, roomy), s).empty());
}

TEST_CASE("MindSpeed flags: --variable-seq-lengths runs, warned that memsim errs high if at all",
          "[workload][not_modelled]") {
  // MindSpeed-LLM's Qwen scripts pass it; it sends p2p shapes per micro-batch, and no
  // micro-batch is longer than --seq-length, which memsim simulates (it was refused as "an
  // uneven or custom pipeline layout").
  const config::MegatronLaunch l = config::ReadCommandLineArguments(
      {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
       "128", "--vocab-size", "1000", "--bf16", "--variable-seq-lengths"});
  config::LoadOptions options;
  options.device = "h100-80g";
  const config::Setup s = config::LoadSetupFromMegatron(l, options, {});
  REQUIRE(s.not_modelled.size() == 1);
  CHECK(s.not_modelled[0].flag == "--variable-seq-lengths");
  CHECK(s.not_modelled[0].direction == NotModelled::Direction::kHigh);
  const std::vector<NotModelledEstimate> e = EstimateNotModelled(s, 0);
  CHECK(e[0].about_bytes == 0);  // no amount: every micro-batch is at most what memsim runs
}

TEST_CASE("host memory that MindSpeed's optimizer swap keeps is reported on its own line",
          "[workload][report][mindspeed]") {
  // The script with --swap-optimizer instead of --reuse-fp32-param (MindSpeed refuses both).
  const config::Setup s = MindSpeedScript({"training.global_batch_size=2",
                                           "training.reuse_fp32_param=false",
                                           "training.swap_optimizer=true"});
  engine::RunOptions options;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(s, options);
  // DP 1: the shard is all Ψ = 1,627,345,920 parameters of the rank; pinned host copies of the
  // fp32 main parameter, exp_avg and exp_avg_sq: 12 B each = 19,528,151,040 B = 18.19 GiB.
  const std::string header = report::FormatRunHeader(run, s);
  CHECK(header.find("\n  host memory (pinned, per rank): 18.19 GiB: the fp32 main parameters and "
                    "Adam moments of 1627345920 (1.63 B) elements, off the device between steps "
                    "(MindSpeed --swap-optimizer)\n") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(report::RunReportJson(run, s));
  CHECK(j["host"]["pinned_bytes"] == 19'528'151'040LL);
  // Between steps neither is on the device.
  CHECK(j["static"]["main_param_bytes"] == 0);
  CHECK(j["static"]["optimizer_state_bytes"] == 0);
  // Without the swap there is no host line and no "host" key.
  const config::Setup plain = MindSpeedScript({"training.global_batch_size=2"});
  const engine::RunResult r2 = engine::RunAllStages(plain, options);
  CHECK(report::FormatRunHeader(r2, plain).find("host memory") == std::string::npos);
  CHECK_FALSE(nlohmann::json::parse(report::RunReportJson(r2, plain)).contains("host"));
}

}  // namespace
}  // namespace memsim::workload

namespace memsim::workload {
namespace {

// The shipped LoRA config (Llama-3 8B, bf16 weights: 8.03 G parameters x 2 bytes = 16 GB) on
// 8 GiB runs out of memory while loading the weights, with two TrainingArguments fields memsim
// does not model (hf_trainer.cc kNotModelledFields): torch_empty_cache_steps (the Trainer
// empties the cache between forward and backward, so reserved is lower than memsim's: memsim
// high) and neftune_noise_alpha (one embedding-output-sized tensor more: memsim low).
TEST_CASE("an out-of-memory verdict lists the config keys warned not modelled, with their direction",
          "[workload][not_modelled]") {
  config::LoadOptions load;
  load.overrides = {"training.neftune_noise_alpha=5", "training.torch_empty_cache_steps=1",
                    "training.max_steps=1"};
  const config::Setup s =
      config::LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/llama3-8b-lora-rtx4090.json", load);
  REQUIRE(s.not_modelled.size() == 2);
  // In the table's order; the location is the --set text the value came from.
  CHECK(s.not_modelled[0] == NotModelled{"--set training.torch_empty_cache_steps=1",
                                         "/training/torch_empty_cache_steps", {"1"},
                                         NotModelled::Direction::kHigh, true});
  CHECK(s.not_modelled[1] == NotModelled{"--set training.neftune_noise_alpha=5",
                                         "/training/neftune_noise_alpha", {"5"},
                                         NotModelled::Direction::kLow, true});
  engine::RunOptions options;
  options.usable_memory_bytes = Bytes{8} << 30;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(s, options);
  REQUIRE(run.first_oom);
  CHECK(report::FormatNotModelledCaveat(run, s) ==
        "*** Caveat: 2 keys warned not modelled; so this verdict may be off (stage 0):\n"
        "***   --set training.torch_empty_cache_steps=1: memsim errs high, by an amount not "
        "estimated\n"
        "***   --set training.neftune_noise_alpha=5: memsim errs low, by an amount not "
        "estimated\n"
        "***   In all: no amount is estimated for any of them.\n");
  const nlohmann::json j = nlohmann::json::parse(report::RunReportJson(run, s));
  REQUIRE(j["not_modelled"].size() == 2);
  CHECK(j["not_modelled"][1]["flag"] == "/training/neftune_noise_alpha");
  CHECK(j["not_modelled"][1]["kind"] == "config key");
  CHECK(j["not_modelled"][1]["memsim_errs"] == "low");
  CHECK(j["not_modelled"][1]["about_bytes"].is_null());
}

// A Megatron launch's flags and a config key together: the header counts both, the flags first.
TEST_CASE("the caveat counts the launch's flags and the config's keys apart",
          "[workload][not_modelled]") {
  config::Setup s = MindSpeedScript({"training.global_batch_size=2"});
  REQUIRE(s.not_modelled.size() == 1);
  s.not_modelled.push_back({"c.json: /training/x", "/training/x", {"1"},
                            NotModelled::Direction::kEither, true});
  engine::RunOptions options;
  options.usable_memory_bytes = Bytes{20} << 30;  // as the OOM test above
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(s, options);
  REQUIRE(run.first_oom);
  const std::string caveat = report::FormatNotModelledCaveat(run, s);
  CHECK(caveat.starts_with("*** Caveat: 1 flag and 1 key warned not modelled; so this verdict "
                           "may be off (stage 0):\n"));
  CHECK(caveat.find("***   c.json: /training/x: memsim errs either way, by an amount not "
                    "estimated\n") != std::string::npos);
  // The swap-attention amount of the test above (39 x 55,050,240 bytes = 2.00 GiB); the key has none.
  CHECK(caveat.ends_with("***   In all: memsim predicts up to about 2.00 GiB more and 0 B less "
                         "than the run would use, 1 not estimated.\n"));
}

}  // namespace
}  // namespace memsim::workload
