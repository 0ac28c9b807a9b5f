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
// DP 1, the distributed optimizer, bf16, seq 4096, micro-batch 2, with --reuse-fp32-param,
// --swap-attention and --recompute-activation-function.
config::Setup MindSpeedScript(const std::vector<std::string>& sets = {}) {
  config::LoadOptions options;
  options.device = "ascend-910b-64g";
  options.overrides = sets;
  return config::LoadSetupFromMegatron(
      config::ReadMegatronArgsFile(config::testing::Data("launch/mindspeed_reuse_swap.sh")),
      options, {});
}

TEST_CASE("each MindSpeed memory feature of a script: its direction and amount, derived",
          "[workload][not_modelled]") {
  const config::Setup s = MindSpeedScript();
  REQUIRE(s.not_modelled.size() == 3);
  const std::vector<NotModelledEstimate> e = EstimateNotModelled(s, 0);
  REQUIRE(e.size() == 3);
  const std::string path = config::testing::Data("launch/mindspeed_reuse_swap.sh");
  CHECK(e[0].flag.what == path + ":19: --reuse-fp32-param");
  CHECK(e[0].flag.direction == NotModelled::Direction::kHigh);
  // Parameters of the rank (TP 8): per layer (h·(q + 2kv) + h·h + h·2ffn + ffn·h) / 8 + 2h =
  // (78,643,200 + 26,214,400 + 141,557,760 + 70,778,880) / 8 + 10,240 = 39,659,520; 40 layers
  // 1,586,380,800; embedding and untied output layer 2 × 32000·5120 / 8 = 40,960,000; final
  // norm 5120: Ψ = 1,627,345,920. MindSpeed's saving (reuse-fp32-param.md): 2 bytes × Ψ / DP 1.
  CHECK(e[0].about_bytes == 2 * 1'627'345'920LL);
  CHECK(e[1].flag.flag == "--swap-attention");
  CHECK(e[1].flag.direction == NotModelled::Direction::kHigh);
  // Up to the attention block's saved activations: 40 layers × 1 micro-batch in flight (PP 1)
  // × T = 4096·2 tokens × (2h/t + (2q + 2kv)/t = 1280 + 2560 = 3840) × 2 bytes.
  CHECK(e[1].about_bytes == 40LL * 8192 * 3840 * 2);
  CHECK(e[2].flag.flag == "--recompute-activation-function");
  // The activation's output [T, ffn/t = 1728] bf16 in each of 40 layers, one micro-batch.
  CHECK(e[2].about_bytes == 40LL * 8192 * 1728 * 2);
}

TEST_CASE("a feature's estimate follows the run: full recompute, a layer count, fp32",
          "[workload][not_modelled]") {
  // Under full recompute a layer keeps only its input: neither saving applies.
  const config::Setup full = MindSpeedScript({"training.recompute_granularity=\"full\"",
                                              "training.recompute_method=\"uniform\"",
                                              "training.recompute_num_layers=1"});
  const std::vector<NotModelledEstimate> e = EstimateNotModelled(full, 0);
  CHECK(e[1].about_bytes == 0);
  CHECK(e[2].about_bytes == 0);
  CHECK(e[2].basis == "no saving: full recompute keeps only each layer's input");
  CHECK(e[0].about_bytes == 2 * 1'627'345'920LL);  // the parameters do not depend on it
  // --recompute-activation-function-num-layers 8: 8 layers' outputs.
  config::Setup some = MindSpeedScript();
  some.not_modelled = {{"x:1: --recompute-activation-function-num-layers",
                        "--recompute-activation-function-num-layers",
                        {"8"},
                        NotModelled::Direction::kHigh}};
  CHECK(EstimateNotModelled(some, 0)[0].about_bytes == 8LL * 8192 * 1728 * 2);
}

TEST_CASE("the warnings of not-modelled flags end in their amount", "[workload][not_modelled]") {
  const config::Setup s = MindSpeedScript();
  const std::vector<std::string> w = report::WarningsWithEstimates(s);
  REQUIRE(w.size() == s.warnings.size());
  const std::string path = config::testing::Data("launch/mindspeed_reuse_swap.sh");
  // 2 × 1,627,345,920 bytes = 3.03 GiB.
  CHECK(w[1] == s.warnings[1] +
                    "; by about 3.03 GiB: 2 bytes x 1.63 G parameters of the rank / DP 1 "
                    "(MindSpeed reuse-fp32-param.md)");
  CHECK(w[1].starts_with(path + ":19: --reuse-fp32-param: not modelled (MindSpeed keeps"));
}

TEST_CASE("an out-of-memory verdict says which way the flags not modelled make memsim err",
          "[workload][not_modelled]") {
  // One micro-batch per iteration keeps the run short; 20 GiB is less than the static
  // 1.63 G parameters × (2 + 4 + 4 + 8) bytes = 29 GB, so the run runs out of memory.
  const config::Setup s = MindSpeedScript({"training.global_batch_size=2"});
  engine::RunOptions options;
  options.usable_memory_bytes = Bytes{20} << 30;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(s, options);
  REQUIRE(run.first_oom);
  const std::string path = config::testing::Data("launch/mindspeed_reuse_swap.sh");
  const std::string caveat = report::FormatNotModelledCaveat(run, s);
  CHECK(caveat.starts_with("*** Caveat: 3 flags warned not modelled; so this verdict may be off "
                           "(stage 0):\n"));
  CHECK(caveat.find("***   " + path + ":19: --reuse-fp32-param: memsim errs high by about "
                    "3.03 GiB (") != std::string::npos);
  // In all: 3,254,691,840 + 2,516,582,400 + 1,132,462,080 = 6,903,736,320 bytes = 6.43 GiB.
  CHECK(caveat.ends_with("***   In all: memsim predicts up to about 6.43 GiB more and 0 B less "
                         "than the run would use.\n"));
  const nlohmann::json j = nlohmann::json::parse(report::RunReportJson(run, s));
  REQUIRE(j["not_modelled"].size() == 3);
  CHECK(j["not_modelled"][0]["flag"] == "--reuse-fp32-param");
  CHECK(j["not_modelled"][0]["memsim_errs"] == "high");
  CHECK(j["not_modelled"][0]["about_bytes"] == 3'254'691'840LL);
  CHECK(j["not_modelled"][2]["about_bytes"] == 1'132'462'080LL);
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

}  // namespace
}  // namespace memsim::workload
