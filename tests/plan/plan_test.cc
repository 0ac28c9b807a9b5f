// `memsim plan` (plan/plan.h): the layouts enumerated, the rules that refuse some, the step-time
// estimate, a plan's verdict against a direct run of the config it writes, and the JSON.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "config/load.h"
#include "core/error.h"
#include "engine/stages.h"
#include "plan/plan.h"

namespace memsim {
namespace {

using plan::Layout;
using testing::ReadAll;
using testing::RunMemsim;
using testing::ScratchDir;

config::Setup Base(const std::string& model) {
  config::LoadOptions o;
  o.model_path = model;
  return config::LoadSetup("", o);  // the embedded default (Megatron, 910B) with `model`
}

plan::Request SmallRequest(const config::Setup& base) {
  plan::Request r;
  r.devices = 8;
  r.global_batch_size = 16;
  r.seq_length = 1024;
  r.space = plan::DefaultSpace(base);
  plan::ApplyFix("mbs=1", &r.space);
  plan::ApplyFix("recompute=none", &r.space);
  plan::ApplyFix("dist_opt=true", &r.space);
  return r;
}

TEST_CASE("plan: TP must divide heads and query groups, TP x PP the devices", "[plan]") {
  // Qwen2.5-0.5B: 14 heads, 2 query groups, 24 layers, FFN 4864. Over tp {1,2,4,8} x pp
  // {1,2,4,8} on 8 devices: tp 4 and 8 do not divide 14 heads; tp x pp must divide 8, which
  // leaves tp 1 with pp 1, 2, 4, 8 and tp 2 with pp 1, 2, 4: 7 of 16 (24 layers divide by every
  // pp; dp = 8 / (tp pp) divides the global batch 16 in each).
  const config::Setup base = Base("qwen2.5-0.5b");
  const plan::Request r = SmallRequest(base);
  const std::vector<plan::Candidate> all = plan::Enumerate(base, r);
  REQUIRE(all.size() == 16);
  int allowed = 0;
  for (const plan::Candidate& c : all) allowed += c.verdict != plan::Verdict::kNotAllowed;
  CHECK(allowed == 7);
  Layout l;
  l.tp = 4;
  CHECK(plan::RuleViolated(base, r, l).find("does not divide the 14 attention heads") !=
        std::string::npos);
  l.tp = 2;
  l.pp = 8;  // 16 ranks > 8 devices
  CHECK(plan::RuleViolated(base, r, l).find("= 16 does not divide the 8 devices") !=
        std::string::npos);
  l.pp = 4;  // dp = 1
  CHECK(plan::RuleViolated(base, r, l).empty());
}

TEST_CASE("plan: the global batch must divide by micro batch x DP, PP must divide the layers",
          "[plan]") {
  const config::Setup base = Base("qwen2.5-0.5b");
  plan::Request r = SmallRequest(base);
  Layout l;
  l.mbs = 4;  // dp 8 x mbs 4 = 32 does not divide 16
  CHECK(plan::RuleViolated(base, r, l).find("global batch 16 is not divisible by micro batch 4 "
                                            "× DP 8") != std::string::npos);
  r.devices = 16;
  l.mbs = 1;
  l.pp = 16;  // 24 layers
  CHECK(plan::RuleViolated(base, r, l).find("PP 16 does not divide the 24 layers") !=
        std::string::npos);
  r.devices = 8;
  l.pp = 1;
  l.cp = 2;
  r.seq_length = 1022;  // 2 x CP = 4 does not divide 1022
  CHECK(plan::RuleViolated(base, r, l).find("2 × CP 2 does not divide") != std::string::npos);
}

TEST_CASE("plan: EP must divide the experts and TP x DP x CP by EP x ETP", "[plan]") {
  const config::Setup dense = Base("qwen2.5-0.5b");
  plan::Request r = SmallRequest(dense);
  Layout l;
  l.ep = 2;
  CHECK(plan::RuleViolated(dense, r, l).find("needs a mixture-of-experts") != std::string::npos);
  // Qwen3-30B-A3B: 128 experts. TP 2 on 8 devices: dp 4, TP x DP = 8; EP 8 x ETP 2 (= TP) is 16.
  const config::Setup moe = Base("qwen3-30b-a3b");
  CHECK(plan::DefaultSpace(moe).ep == std::vector<int>{1, 2, 4, 8});
  l.tp = 2;
  l.ep = 8;
  CHECK(plan::RuleViolated(moe, r, l).find("EP 8 × ETP 2 does not divide TP × DP × CP = 8") !=
        std::string::npos);
  l.ep = 4;
  CHECK(plan::RuleViolated(moe, r, l).empty());
  l.ep = 3;  // 128 % 3
  CHECK(plan::RuleViolated(moe, r, l).find("EP 3 does not divide the 128 experts") !=
        std::string::npos);
}

TEST_CASE("plan: --fix and --vary replace a key's values, bad ones name the flag", "[plan]") {
  plan::Space s = plan::DefaultSpace(Base("qwen2.5-0.5b"));
  plan::ApplyVary("tp=1,2", &s);
  plan::ApplyFix("recompute=full", &s);
  plan::ApplyVary("dist_opt=false", &s);
  CHECK(s.tp == std::vector<int>{1, 2});
  CHECK(s.recompute == std::vector{config::RecomputeGranularity::kFull});
  CHECK(s.dist_opt == std::vector<bool>{false});
  CHECK_THROWS_WITH(plan::ApplyFix("tq=2", &s), Catch::Contains("--fix tq=2: unknown key 'tq'"));
  CHECK_THROWS_WITH(plan::ApplyFix("tp=2,4", &s), Catch::Contains("use --vary"));
  CHECK_THROWS_WITH(plan::ApplyVary("pp=1,x", &s), Catch::Contains("--vary pp=1,x: 'x'"));
  CHECK_THROWS_WITH(plan::ApplyVary("recompute=some", &s), Catch::Contains("recompute 'some'"));
  // A value listed twice would be simulated twice.
  CHECK_THROWS_WITH(plan::ApplyVary("pp=1,2,1", &s), Catch::Contains("--vary pp=1,2,1: '1' listed twice"));
  CHECK_THROWS_WITH(plan::ApplyVary("dist_opt=true,true", &s), Catch::Contains("'true' listed twice"));
}

TEST_CASE("plan: the step-time estimate is Megatron's FLOPs at the preset's peak, with the "
          "1F1B bubble", "[plan]") {
  const config::Setup base = config::LoadSetup("", {});
  // The default: Llama-2-7B (h 4096, 32 layers, 32 heads = query groups, FFN 11008, SwiGLU,
  // vocab 32000 padded to a multiple of 128 x TP 2 = 32000), seq 4096, gbs 64, 8 devices.
  // training.py num_floating_point_operations per layer in 12 h^2 units: attention
  // (1 + 32/32) x 1 + 4096/4096 = 3, MLP 11008/4096 x 3/2 = 4.03125; 32 layers: 225.
  const double tokens = 64.0 * 4096;
  const double flops = 12.0 * tokens * 4096.0 * 4096.0 * 225 + 6.0 * tokens * 4096 * 32000;
  const double expected = flops / 8 / (base.device.peak_flops_bf16 * plan::kAssumedEfficiency);
  REQUIRE(base.device.peak_flops_bf16 > 0);
  CHECK(plan::EstimateStepSeconds(base) == Approx(expected).epsilon(1e-12));
  // PP 2 over the same 8 devices (TP 2, DP 2): the same FLOPs a device, stretched by the bubble
  // 1 + (2 - 1) / m with m = 64 / (1 x 2) = 32 micro-batches.
  const config::Setup pp2 = config::LoadVariant(
      base, {"training.pipeline_model_parallel_size=2", "training.data_parallel_size=2"}, "pp2");
  CHECK(plan::EstimateStepSeconds(pp2) == Approx(expected * (1.0 + 1.0 / 32)).epsilon(1e-12));
  // Full recompute adds one forward of every layer: a third of the layer term.
  const config::Setup full = config::LoadVariant(
      base, {"training.recompute_granularity=\"full\"", "training.recompute_method=\"uniform\"",
             "training.recompute_num_layers=1"}, "full");
  const double extra = 12.0 * tokens * 4096.0 * 4096.0 * 225 / 3.0;
  CHECK(plan::EstimateStepSeconds(full) ==
        Approx((flops + extra) / 8 / (base.device.peak_flops_bf16 * plan::kAssumedEfficiency))
            .epsilon(1e-12));
}

TEST_CASE("plan: a plan's verdict and stage peaks are those of a direct run of its config",
          "[plan]") {
  const config::Setup base = Base("qwen2.5-0.5b");
  plan::Request r;
  r.devices = 4;
  r.global_batch_size = 8;
  r.seq_length = 1024;
  r.threads = 1;
  r.space = plan::DefaultSpace(base);
  plan::ApplyVary("tp=1,2", &r.space);
  plan::ApplyVary("pp=1,2", &r.space);
  plan::ApplyFix("mbs=1", &r.space);
  plan::ApplyFix("recompute=none", &r.space);
  const plan::PlanResult result = plan::Plan(base, r, nullptr);
  // 2 tp x 2 pp x 2 dist_opt, all allowed (tp x pp divides 4; dp 4, 2, 2, 1 divide 8).
  CHECK(result.enumerated == 8);
  CHECK(result.simulated == 8);
  REQUIRE(result.fitting > 0);
  const plan::Candidate& best = result.candidates.front();
  REQUIRE(best.verdict == plan::Verdict::kFits);
  ScratchDir dir("plan-direct");
  const auto path = dir.Write("plan.json", best.config_json);
  const config::Setup again = config::LoadSetup(path.string(), {});
  engine::RunOptions o;
  o.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(again, o);
  REQUIRE(run.stages.size() == best.stage_peak_bytes.size());
  for (size_t i = 0; i < run.stages.size(); ++i) {
    CHECK(run.stages[i].peak_device_bytes == best.stage_peak_bytes[i]);
  }
  CHECK(again.training.tensor_model_parallel_size == best.layout.tp);
  CHECK(again.training.data_parallel_size == best.layout.dp);
}

TEST_CASE("memsim plan: the written config runs to the same peak, byte for byte, JSON shape",
          "[plan][cli]") {
  ScratchDir dir("plan-cli");
  const auto p = RunMemsim(dir, "plan --model qwen2.5-0.5b --devices 4 --global-batch-size 8 "
                                "--seq-length 1024 --vary tp=1,2 --fix pp=1 --fix mbs=1 "
                                "--fix recompute=none --top 2 --json p.json --write-config plans");
  REQUIRE(p.exit_code == 0);
  CHECK(p.out.find("memsim plan: qwen2.5-0.5b on 4 × ascend-910b-64g") == 0);
  const nlohmann::json j = nlohmann::json::parse(ReadAll(dir.path() / "p.json"));
  CHECK(j["schema"] == 1);
  CHECK(j["enumerated"] == 4);  // tp {1, 2} x dist_opt {true, false}
  CHECK(j["simulated"] == 4);
  REQUIRE(j["plans"].size() == 2);
  for (const char* key : {"layout", "verdict", "reason", "check_verdict", "num_micro_batches",
                          "stage_peak_device_bytes", "peak_bytes", "usable_bytes",
                          "estimated_step_seconds"}) {
    CHECK(j["plans"][0].contains(key));
  }
  CHECK(j["plans"][0]["verdict"] == "fits");
  CHECK(j["rejected"].is_array());
  std::vector<std::filesystem::path> written;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() / "plans")) {
    written.push_back(e.path());
  }
  std::sort(written.begin(), written.end());
  REQUIRE(written.size() == 2);
  // Its comment names this plan, not the base config's (the embedded default's "Llama-2-7B on
  // Ascend 910B ..." would describe another model and layout).
  const nlohmann::json written0 = nlohmann::json::parse(ReadAll(written[0]));
  const std::string comment = written0["_comment"];
  CHECK(comment.find("memsim plan #1: ") == 0);
  CHECK(comment.find("for qwen2.5-0.5b on 4 x ascend-910b-64g") != std::string::npos);
  CHECK(comment.find("Llama-2") == std::string::npos);
  const auto r = RunMemsim(dir, "run '" + written[0].string() + "' --json r.json --no-chart");
  REQUIRE(r.exit_code == 0);
  const nlohmann::json run = nlohmann::json::parse(ReadAll(dir.path() / "r.json"));
  REQUIRE(run["stages"].size() == j["plans"][0]["stage_peak_device_bytes"].size());
  for (size_t i = 0; i < run["stages"].size(); ++i) {
    CHECK(run["stages"][i]["peak_device_bytes"] == j["plans"][0]["stage_peak_device_bytes"][i]);
  }
}

TEST_CASE("plan: the estimate ranks to the digits the table shows, ties go to the lower peak",
          "[plan]") {
  // At least 3 significant digits, no exponent: 38.3812 -> 38.4; 1234.7 -> 1235; 0.012345 ->
  // 0.0123 (2 - floor(log10 s) decimals: 1, 0 and 4).
  CHECK(plan::StepSecondsText(38.3812) == "38.4");
  CHECK(plan::StepSecondsText(1234.7) == "1235");
  CHECK(plan::StepSecondsText(0.012345) == "0.0123");
  CHECK(plan::StepSecondsText(0) == "-");
  CHECK(plan::RankedStepSeconds(38.3812) == plan::RankedStepSeconds(38.4049));
  CHECK(plan::RankedStepSeconds(38.3812) < plan::RankedStepSeconds(38.4501));
  // Two layouts that differ only in the distributed optimizer have the same estimate (it counts
  // no optimizer step), so the one with the lower peak, the sharded optimizer, ranks first; a
  // second Plan of the same request gives the same order whatever the thread count.
  const config::Setup base = Base("qwen2.5-0.5b");
  plan::Request r = SmallRequest(base);
  plan::ApplyFix("tp=1", &r.space);
  plan::ApplyFix("pp=1", &r.space);
  plan::ApplyVary("dist_opt=false,true", &r.space);
  r.threads = 2;
  const plan::PlanResult two = plan::Plan(base, r, nullptr);
  REQUIRE(two.fitting == 2);
  CHECK(two.candidates[0].layout.distributed_optimizer);
  CHECK(two.candidates[0].peak_bytes < two.candidates[1].peak_bytes);
  r.threads = 1;
  const plan::PlanResult one = plan::Plan(base, r, nullptr);
  CHECK(one.candidates[0].layout == two.candidates[0].layout);
}

TEST_CASE("memsim plan: --nodes x --per-node devices, TP is kept within a node, not-allowed "
          "rows are grouped by rule, --require gates on fitting plans", "[plan][cli]") {
  // Qwen2.5-0.5B (14 heads) on 2 nodes of 2: TP 4 spans nodes (the rule checked before the
  // heads), TP 8 does not divide the 4 devices; TP 1 and 2 are simulated.
  ScratchDir dir("plan-nodes");
  const auto p = RunMemsim(dir, "plan --model qwen2.5-0.5b --nodes 2 --per-node 2 "
                                "--global-batch-size 8 --seq-length 1024 --vary tp=1,2,4,8 "
                                "--fix pp=1 --fix mbs=1 --fix recompute=none --fix dist_opt=true");
  INFO(p.out << p.err);
  REQUIRE(p.exit_code == 0);
  CHECK(p.out.find("on 4 × ascend-910b-64g") != std::string::npos);
  CHECK(p.out.find("not allowed (2), by rule:") != std::string::npos);
  CHECK(p.out.find("1 × TP stays within a node (--per-node); e.g. tp4 pp1") != std::string::npos);
  CHECK(p.out.find("1 × TP × PP × CP divides the devices; e.g. tp8 pp1") != std::string::npos);
  // The gate: 2 layouts fit (TP 1 and 2), so --require 3 exits 1 and says so.
  const auto gate = RunMemsim(dir, "plan --model qwen2.5-0.5b --nodes 2 --per-node 2 "
                                   "--global-batch-size 8 --seq-length 1024 --vary tp=1,2,4,8 "
                                   "--fix pp=1 --fix mbs=1 --fix recompute=none "
                                   "--fix dist_opt=true --require 3");
  CHECK(gate.exit_code == 1);
  CHECK(gate.err.find("2 layouts fit, fewer than --require 3") != std::string::npos);
  const auto alone = RunMemsim(dir, "plan --nodes 2");
  CHECK(alone.exit_code == 2);
  CHECK(alone.err.find("--nodes 2: give --per-node too") != std::string::npos);
  const auto both = RunMemsim(dir, "plan --nodes 2 --per-node 4 --devices 16");
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("--devices 16 disagrees with --nodes 2 × --per-node 4 = 8") !=
        std::string::npos);
}

TEST_CASE("plan: a layout the closed-form estimate calls fitting runs out of memory in "
          "iteration 2, and the reason says so", "[plan]") {
  // Llama-3-8B on 8 H100, global batch 256, sequence 8192: TP 2, DP 4, micro batch 2, no
  // recompute, distributed optimizer.
  config::LoadOptions o;
  o.model_path = "llama3-8b";
  o.device = "h100-80g";
  o.iterations = 2;
  const config::Setup base = config::LoadSetup("", o);
  const config::ModelConfig& m = base.model;
  // The closed form (the usual back-of-envelope):
  // - parameters a TP rank: the embedding and the untied output layer (vocab × h each) and
  //   every layer's projections (q and o: h × heads × head dim; k and v: h × groups × head
  //   dim) and gated MLP (3 × h × FFN) split over TP 2, the layer norms (2h a layer, h at the
  //   end) whole. Llama-3-8B: 2 × 128256 × 4096 + 32 × (2 × 4096² + 2 × 4096 × 1024 + 3 × 4096 ×
  //   14336) = 8,029,995,008 split, 266,240 whole: 4,015,263,744 a rank.
  // - bytes a parameter under Megatron's distributed optimizer with bf16 parameters and fp32
  //   gradients: 6 + 12 / DP (Megatron-LM docs/source/api-guide/dist_optimizer.md, its table of
  //   bytes a parameter) = 9 at DP 4.
  // - activations with sequence parallelism and flash attention (Korthikanti et al. 2022,
  //   arXiv:2205.05198, table 2, the 5as/h score term dropped): 34 s b h / t bytes a layer:
  //   34 × 8192 × 2 × 4096 / 2 × 32 layers; plus the fp32 logits, 4 s b v / t.
  const double head_dim = static_cast<double>(m.hidden_size) / m.num_attention_heads;
  const double split = 2.0 * m.vocab_size * m.hidden_size +
                       m.num_hidden_layers * (2.0 * m.hidden_size * m.num_attention_heads * head_dim +
                                              2.0 * m.hidden_size * m.num_key_value_heads * head_dim +
                                              3.0 * m.hidden_size * m.intermediate_size);
  const double whole = (2.0 * m.num_hidden_layers + 1) * m.hidden_size;
  REQUIRE(split == 8029995008.0);
  const double params = split / 2 + whole;
  const double s = 8192, b = 2, h = m.hidden_size, t = 2;
  const double closed_form = params * (6 + 12.0 / 4) + 34 * s * b * h / t * m.num_hidden_layers +
                             4 * s * b * m.vocab_size / t;
  const double line = static_cast<double>(base.device.usable_memory_bytes) * 0.95;
  CHECK(closed_form < line);  // about 71.6 GiB against 75.2 GiB: "fits"
  plan::Request r;
  r.devices = 8;
  r.global_batch_size = 256;
  r.seq_length = 8192;
  r.space = plan::DefaultSpace(base);
  plan::ApplyFix("tp=2", &r.space);
  plan::ApplyFix("pp=1", &r.space);
  plan::ApplyFix("mbs=2", &r.space);
  plan::ApplyFix("recompute=none", &r.space);
  plan::ApplyFix("dist_opt=true", &r.space);
  const plan::PlanResult result = plan::Plan(base, r, nullptr);
  REQUIRE(result.candidates.size() == 1);
  const plan::Candidate& c = result.candidates.front();
  // The simulation: the first iteration fits; in the second the optimizer states (created by
  // the first optimizer step) sit under the activations, and the forward runs out of memory.
  CHECK(c.verdict == plan::Verdict::kDoesNotFit);
  CHECK(c.check_verdict == "oom");
  CHECK(c.reason.find("stage 0: out of memory in iteration 2 forward") == 0);
}

TEST_CASE("memsim plan: bad flags exit 2 naming the flag", "[plan][cli]") {
  ScratchDir dir("plan-bad");
  const auto fix = RunMemsim(dir, "plan --fix tq=2");
  CHECK(fix.exit_code == 2);
  CHECK(fix.err.find("--fix tq=2") != std::string::npos);
  const auto headroom = RunMemsim(dir, "plan --headroom 120");
  CHECK(headroom.exit_code == 2);
  CHECK(headroom.err.find("--headroom 120") != std::string::npos);
  const auto devices = RunMemsim(dir, "plan --devices 0");
  CHECK(devices.exit_code == 2);
  CHECK(devices.err.find("--devices") != std::string::npos);
  // The default space of the default config: 4 tp x 4 pp x 3 mbs x 3 recompute x 2 = 288
  // layouts, more than 10 of which pass the rules.
  const auto many = RunMemsim(dir, "plan --max-candidates 10");
  CHECK(many.exit_code == 2);
  CHECK(many.err.find("more than --max-candidates 10") != std::string::npos);
  // A framework without model parallelism: refused once, by the command's own prefix.
  const auto hf = RunMemsim(
      dir, std::string("plan '") + MEMSIM_SOURCE_DIR + "/configs/qwen2.5-7b-ddp8-h200.json'");
  CHECK(hf.exit_code == 2);
  CHECK(hf.err.find("memsim plan: framework \"hf-trainer\" has no model-parallel layouts") !=
        std::string::npos);
  // A key given twice, by --fix and --vary or twice by one of them: the second would replace
  // the first's values without a word, so it is refused, naming both.
  const auto both = RunMemsim(dir, "plan --vary tp=1,2 --fix tp=4 --json p.json");
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("--vary tp=1,2: tp is already given by --fix tp=4") != std::string::npos);
  const auto twice = RunMemsim(dir, "plan --fix pp=2 --fix pp=4");
  CHECK(twice.exit_code == 2);
  CHECK(twice.err.find("--fix pp=4: pp is already given by --fix pp=2") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir.path()));
}

// The loader names the plan's own overrides by their --set text; the planner says them in its
// keys (plan::Overrides sets "training.micro_batch_size=1", which the user knows as mbs).
TEST_CASE("plan: a loader message names the plan's keys, not its --set lines", "[plan]") {
  CHECK(plan::InUserKeys("plan tp1 pp2 cp1 ep1 dp4 mbs1 none dist_opt: --set "
                         "training.pipeline_model_parallel_size=2: 3 layers") ==
        "plan tp1 pp2 cp1 ep1 dp4 mbs1 none dist_opt: pp=2: 3 layers");
  CHECK(plan::InUserKeys("--set training.global_batch_size=4000000: 1000000 micro-batches; "
                         "--set training.micro_batch_size=1") ==
        "--global-batch-size 4000000: 1000000 micro-batches; mbs=1");
  CHECK(plan::InUserKeys("--set training.sequence_parallel=true: x") ==
        "--set training.sequence_parallel=true: x");  // not a key of the plan's space
}

// The layout column is as wide as the longest label shown, so that at a very large DP (131072:
// "tp1 pp1 cp1 ep1 dp131072 mbs1 selective dist_opt", 48 characters) the micro-batch, peak,
// headroom and estimate columns still end where the header's do.
TEST_CASE("plan: the table's columns stay aligned with a long layout label", "[plan]") {
  plan::PlanResult r;
  r.enumerated = r.simulated = r.fitting = 2;
  for (const int dp : {131072, 2}) {
    plan::Candidate c;
    c.layout = Layout{1, 1, 1, 1, dp, 1, config::RecomputeGranularity::kSelective, true};
    c.verdict = plan::Verdict::kFits;
    c.num_micro_batches = 1;
    c.peak_bytes = 1 << 30;
    c.usable_bytes = 2 << 30;
    c.step_seconds = 1.5;
    r.candidates.push_back(c);
  }
  const std::string table = plan::FormatPlanTable(r, 10);
  std::vector<std::string> lines;
  for (size_t at = 0, next; at < table.size(); at = next + 1) {
    next = table.find('\n', at);
    lines.push_back(table.substr(at, next - at));
  }
  size_t header = 0;
  while (header < lines.size() && lines[header].find("microbatches") == std::string::npos) ++header;
  REQUIRE(header + 2 < lines.size());
  const size_t end = lines[header].find("microbatches") + std::string("microbatches").size();
  for (const size_t row : {header + 1, header + 2}) {
    INFO(lines[row]);
    CHECK(lines[row].size() == lines[header].size());
    CHECK(lines[row].substr(end - 1, 1) == "1");  // micro-batches, right-aligned to the header
  }
}

}  // namespace
}  // namespace memsim
