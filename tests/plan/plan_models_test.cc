// `memsim plan` end to end on the three cases of its acceptance (docs/plan.md, 'Examples'):
// Llama-3-8B on 8 H100 (global batch 256, sequence 8192), Qwen3-30B-A3B on 16 Ascend 910B (512,
// 4096) and Llama-2-70B on 64 H100 (1024, 4096), shipped model names and device presets. Each
// must print at least 5 fitting plans, and `memsim run` of every config `--write-config` wrote
// must report the peaks the plan reported, byte for byte, stage by stage.
//
// The spaces are narrowed with --fix / --vary to the layouts a user of these sizes would try
// first (what the full default space takes is in docs/performance.md); --iterations 2 keeps the
// runs short: iteration 2 is where the optimizer states exist for the first time and the peak is
// reached (docs/walkthrough.md, 'Why iteration 2 differs from iteration 1'), and the written
// config carries train_iters 2, so the direct run simulates the same two iterations.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"

namespace memsim {
namespace {

using testing::ReadAll;
using testing::RunMemsim;
using testing::ScratchDir;

// Runs `memsim plan ARGS --top 5 --json p.json --write-config plans` in `dir`; requires 5
// fitting plans and that `memsim run` of each written config reports the plan's stage peaks.
void PlanFiveAndRunEach(const ScratchDir& dir, const std::string& args) {
  const auto p = RunMemsim(dir, "plan " + args + " --iterations 2 --top 5 --json p.json "
                                "--write-config plans");
  INFO(p.out << p.err);
  REQUIRE(p.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(ReadAll(dir.path() / "p.json"));
  CHECK(j["fitting"].get<int>() >= 5);
  REQUIRE(j["plans"].size() == 5);
  std::vector<std::filesystem::path> written;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() / "plans")) {
    written.push_back(e.path());
  }
  std::sort(written.begin(), written.end());  // plan-01-..., plan-02-..., in rank order
  REQUIRE(written.size() == 5);
  for (size_t k = 0; k < written.size(); ++k) {
    INFO(written[k].string());
    CHECK(j["plans"][k]["verdict"] == "fits");
    const auto r = RunMemsim(dir, "run '" + written[k].string() + "' --json r.json --no-chart");
    REQUIRE(r.exit_code == 0);
    const nlohmann::json run = nlohmann::json::parse(ReadAll(dir.path() / "r.json"));
    const nlohmann::json& peaks = j["plans"][k]["stage_peak_device_bytes"];
    REQUIRE(run["stages"].size() == peaks.size());
    for (size_t i = 0; i < peaks.size(); ++i) {
      CHECK(run["stages"][i]["peak_device_bytes"] == peaks[i]);
    }
  }
}

TEST_CASE("memsim plan: Llama-3-8B on 8 H100 has 5 fitting plans that run to the same peaks",
          "[plan][cli][.plan_models]") {
  // TP 2, 4, 8 with micro batch 1 or 2, no pipeline, no recompute, distributed optimizer on or
  // off: 12 layouts; TP x PP divides 8 and DP x mbs divides 256 in each, so all are simulated.
  ScratchDir dir("plan-llama3-8b");
  PlanFiveAndRunEach(dir, "--model llama3-8b --device h100-80g --devices 8 "
                          "--global-batch-size 256 --seq-length 8192 --vary tp=2,4,8 --fix pp=1 "
                          "--vary mbs=1,2 --fix recompute=none");
}

TEST_CASE("memsim plan: Qwen3-30B-A3B on 16 Ascend 910B has 5 fitting plans that run to the "
          "same peaks", "[plan][cli][.plan_models]") {
  // TP 1, full recompute, PP 1, 2, 4, EP 4, 8, 16 (128 experts), distributed optimizer on or
  // off: 18 layouts; EP x ETP (ETP = TP = 1) must divide DP = 16 / PP, which EP 16 with PP 2
  // or 4 (DP 8, 4) and EP 8 with PP 4 do not: 12 are simulated.
  ScratchDir dir("plan-qwen3-30b-a3b");
  PlanFiveAndRunEach(dir, "--model qwen3-30b-a3b --device ascend-910b-64g --devices 16 "
                          "--global-batch-size 512 --seq-length 4096 --fix tp=1 "
                          "--vary pp=1,2,4 --vary ep=4,8,16 --fix mbs=1 --fix recompute=full");
}

TEST_CASE("memsim plan: Llama-2-70B on 64 H100 has 5 fitting plans that run to the same peaks",
          "[plan][cli][.plan_models]") {
  // TP 4 or 8, PP 4 or 8 (80 layers), micro batch 1, selective or full recompute, distributed
  // optimizer: 8 layouts, each with DP = 64 / (TP x PP) dividing the global batch 1024.
  ScratchDir dir("plan-llama2-70b");
  PlanFiveAndRunEach(dir, "--model llama2-70b --device h100-80g --devices 64 "
                          "--global-batch-size 1024 --seq-length 4096 --vary tp=4,8 "
                          "--vary pp=4,8 --fix mbs=1 --vary recompute=selective,full "
                          "--fix dist_opt=true");
}

}  // namespace
}  // namespace memsim
