// What flags memsim does not model would change, by about how much (workload/not_modelled.h),
// and the caveat that goes with an out-of-memory verdict (report/run_report.h; issue 32).
#include "workload/not_modelled.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

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
  // Up to the attention block's saved activations: 40 layers × 1 micro-batch in flight (PP 1)
  // × T = 4096·2 tokens × (2h/t + (2q + 2kv)/t = 1280 + 2560 = 3840) × 2 bytes.
  CHECK(e[0].about_bytes == 40LL * 8192 * 3840 * 2);
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

TEST_CASE("the warnings of not-modelled flags end in their amount", "[workload][not_modelled]") {
  const config::Setup s = MindSpeedScript();
  const std::vector<std::string> w = report::WarningsWithEstimates(s);
  REQUIRE(w.size() == s.warnings.size());
  const std::string path = config::testing::Data("launch/mindspeed_reuse_swap.sh");
  // 40 × 8192 × 3840 × 2 bytes = 2,516,582,400 bytes = 2.34 GiB.
  CHECK(w[1] == s.warnings[1] +
                    "; by about 2.34 GiB: up to 40 layers x 1 micro-batches in flight x [8192 "
                    "tokens, 3840] x 2 bytes (the attention block's saved activations, less the "
                    "layers MindSpeed keeps prefetched)");
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
                    "2.34 GiB (") != std::string::npos);
  CHECK(caveat.ends_with("***   In all: memsim predicts up to about 2.34 GiB more and 0 B less "
                         "than the run would use.\n"));
  const nlohmann::json j = nlohmann::json::parse(report::RunReportJson(run, s));
  REQUIRE(j["not_modelled"].size() == 1);
  CHECK(j["not_modelled"][0]["flag"] == "--swap-attention");
  CHECK(j["not_modelled"][0]["memsim_errs"] == "high");
  CHECK(j["not_modelled"][0]["about_bytes"] == 2'516'582'400LL);
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
  CHECK(caveat.ends_with("***   In all: memsim predicts up to about 2.34 GiB more and 0 B less "
                         "than the run would use, 1 not estimated.\n"));
}

}  // namespace
}  // namespace memsim::workload
