// `memsim check` end to end (issue 6): exit codes, messages, baselines and report files.
#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iterator>
#include <string>
#include <tinyxml2.h>

#include "cli/cli_test_util.h"

namespace memsim {
namespace {

using testing::RunMemsim;
using testing::ScratchDir;

const std::string kDefault = std::string(MEMSIM_SOURCE_DIR) + "/configs/default.json";

TEST_CASE("memsim check: the default config fits its device", "[check][cli]") {
  ScratchDir dir("check");
  const auto r = RunMemsim(dir, "check " + kDefault);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("ok ", 0) == 0);
  CHECK(r.out.find("stage 0: peak ") != std::string::npos);
}

TEST_CASE("memsim check: over capacity exits 1 and names the stage and the shortfall",
          "[check][cli]") {
  ScratchDir dir("check");
  // The default needs tens of GiB (llama2-7b TP2 with Adam); 8 GiB cannot hold it.
  const auto r = RunMemsim(dir, "check " + kDefault + " --capacity 8GiB");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("FAIL oom") != std::string::npos);
  CHECK(r.out.find("default.json stage 0: out of memory") != std::string::npos);
  CHECK(r.out.find("short by") != std::string::npos);
}

TEST_CASE("memsim check: a peak inside the margin exits 1, a smaller margin passes",
          "[check][cli]") {
  ScratchDir dir("check");
  // Find the default's peak P from its JSON report, then set the capacity to P / 0.97: it fits
  // with 3% headroom, inside the default 5% margin but outside a 2% one.
  const auto json = RunMemsim(dir, "check " + kDefault + " --json r.json");
  REQUIRE(json.exit_code == 0);
  const std::string text = testing::ReadAll(dir.path() / "r.json");
  const auto at = text.find("\"peak_bytes\": ");
  REQUIRE(at != std::string::npos);
  const long long peak = std::stoll(text.substr(at + 14));
  const long long capacity = static_cast<long long>(static_cast<double>(peak) / 0.97);
  auto r = RunMemsim(dir, "check " + kDefault + " --capacity " + std::to_string(capacity));
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("FAIL margin") != std::string::npos);
  r = RunMemsim(dir, "check " + kDefault + " --capacity " + std::to_string(capacity) + " --margin 2%");
  CHECK(r.exit_code == 0);
}

TEST_CASE("memsim check: baseline regression above the tolerance fails, below passes",
          "[check][cli]") {
  ScratchDir dir("check");
  REQUIRE(RunMemsim(dir, "check " + kDefault + " --baseline base/ --update-baseline").exit_code == 0);
  // Same config: no growth at all.
  CHECK(RunMemsim(dir, "check " + kDefault + " --baseline base/ --tolerance 0").exit_code == 0);
  // Micro-batch 2 doubles the activations: far above a 1% tolerance ...
  ScratchDir cfg("check-config");
  std::string config = testing::ReadAll(kDefault);
  config.replace(config.find("\"micro_batch_size\": 1"), 21, "\"micro_batch_size\": 2");
  // The model file is named relative to the config: name the shipped model instead.
  config.replace(config.find("\"../models/llama2-7b.json\""), 26, "\"llama2-7b\"");
  const std::string bigger = cfg.Write("default.json", config).string();
  auto r = RunMemsim(dir, "check " + bigger + " --baseline base/");
  REQUIRE(r.exit_code != 2);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("FAIL regression") != std::string::npos);
  CHECK(r.out.find("activations +") != std::string::npos);
  // ... and within a 99% one.
  CHECK(RunMemsim(dir, "check " + bigger + " --baseline base/ --tolerance 99").exit_code == 0);
}

TEST_CASE("memsim check: a malformed baseline exits 2 naming the file", "[check][cli]") {
  ScratchDir dir("check");
  dir.Write("base.json", "{\"schema_version\": 1, \"stages\": [{\"pipeline\": 0}]}");
  const auto r = RunMemsim(dir, "check " + kDefault + " --baseline base.json --junit j.xml");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim check: base.json: /stages/0/peak_allocated_bytes: expected a byte count "
                 "(an integer from 0 to 2^62), missing\n");
  // The JUnit report is still written, with the config's error case (issue 18).
  tinyxml2::XMLDocument doc;
  REQUIRE(doc.LoadFile((dir.path() / "j.xml").c_str()) == tinyxml2::XML_SUCCESS);
  CHECK(doc.FirstChildElement("testsuites")->IntAttribute("errors") == 1);
}

// An endless baseline (it was read until the process was killed for memory) is refused at its
// first bytes: binary data.
TEST_CASE("memsim check: an endless baseline exits 2", "[check][cli]") {
  ScratchDir dir("check");
  const auto r = RunMemsim(dir, "check " + kDefault + " --baseline /dev/zero");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim check: /dev/zero: binary data (a NUL byte at byte 0), not a baseline "
                 "report\n");
}

// A baseline directory holding the config: the config's own name is where its report would go.
TEST_CASE("memsim check: --update-baseline never replaces a config", "[check][cli]") {
  ScratchDir dir("check");
  const std::string config = "{\"model\": \"llama3.2-1b\", \"device\": \"a100-80g\", "
                             "\"training\": {\"seq_length\": 128, \"train_iters\": 2}}";
  dir.Write("c.json", config);
  auto r = RunMemsim(dir, "check c.json --baseline . --update-baseline");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim check: --baseline .: ./c.json is the config c.json; --update-baseline "
                 "would replace it with a report (keep baselines in a directory of their own)\n");
  r = RunMemsim(dir, "check c.json --baseline c.json --update-baseline");
  CHECK(r.exit_code == 2);
  std::ifstream in(dir.path() / "c.json");
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == config);
}

TEST_CASE("memsim check: --junit writes XML with testsuites, testsuite, testcase and failure",
          "[check][cli]") {
  ScratchDir dir("check");
  const auto r = RunMemsim(dir, "check " + kDefault + " --capacity 8GiB --junit j.xml");
  CHECK(r.exit_code == 1);
  tinyxml2::XMLDocument doc;
  REQUIRE(doc.LoadFile((dir.path() / "j.xml").c_str()) == tinyxml2::XML_SUCCESS);
  const auto* suites = doc.FirstChildElement("testsuites");
  REQUIRE(suites != nullptr);
  const auto* suite = suites->FirstChildElement("testsuite");
  REQUIRE(suite != nullptr);
  const auto* testcase = suite->FirstChildElement("testcase");
  REQUIRE(testcase != nullptr);
  CHECK(testcase->FirstChildElement("failure") != nullptr);
}

TEST_CASE("memsim check: with several configs a bad one makes the exit code 2", "[check][cli]") {
  ScratchDir dir("check");
  dir.Write("bad.json", "{\"training\": 3}");
  const auto r = RunMemsim(dir, "check bad.json " + kDefault + " --capacity 8GiB");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("FAIL oom") != std::string::npos);
  CHECK(r.out.find("ERROR") != std::string::npos);
  // The row names the file once: the loader's message starts with it.
  CHECK(r.out.find("bad.json: bad.json") == std::string::npos);
  CHECK(r.out.find("ERROR      bad.json: /training: ") != std::string::npos);
}

// --require-plans N: `memsim plan` over the config's own job (its 4 devices, global batch 8,
// sequence 1024) with --margin as the headroom. The plan verdict's count is the one `memsim plan`
// reports for the same job, and the gate fails (exit 1) when fewer than N fit, whatever the
// config's own stages say.
TEST_CASE("memsim check: --require-plans gates on how many layouts of the job fit",
          "[check][cli][plan]") {
  ScratchDir dir("check-plans");
  dir.Write("c.json", "{\"model\": \"qwen2.5-0.5b\", \"device\": \"ascend-910b-64g\", "
                      "\"training\": {\"framework\": \"megatron\", \"seq_length\": 1024, "
                      "\"global_batch_size\": 8, \"data_parallel_size\": 4, \"train_iters\": 2}}");
  const auto p = RunMemsim(dir, "plan c.json --json p.json");
  REQUIRE(p.exit_code == 0);
  const nlohmann::json plan = nlohmann::json::parse(testing::ReadAll(dir.path() / "p.json"));
  const int fitting = plan["fitting"];
  const int simulated = plan["simulated"];
  REQUIRE(fitting >= 1);
  auto r = RunMemsim(dir, "check c.json --require-plans 1 --json r.json --junit j.xml");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("ok         c.json stage 0: ") != std::string::npos);
  CHECK(r.out.find(fmt::format("ok         c.json plans: {} of {} simulated layouts fit, 1 "
                               "required; best: tp",
                               fitting, simulated)) != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(testing::ReadAll(dir.path() / "r.json"));
  REQUIRE(j["results"].size() == 2);  // stage 0, then the plan gate
  CHECK(j["results"][0]["gate"] == "stage");
  CHECK(j["results"][1]["gate"] == "plans");
  CHECK(j["results"][1]["pipeline"].is_null());
  CHECK(j["results"][1]["peak_bytes"] == plan["plans"][0]["peak_bytes"]);
  tinyxml2::XMLDocument doc;
  REQUIRE(doc.LoadFile((dir.path() / "j.xml").c_str()) == tinyxml2::XML_SUCCESS);
  const auto* suite = doc.FirstChildElement("testsuites")->FirstChildElement("testsuite");
  CHECK(suite->IntAttribute("tests") == 2);
  // One more than fit: the config itself still fits, the gate fails.
  r = RunMemsim(dir, fmt::format("check c.json --require-plans {}", fitting + 1));
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("ok         c.json stage 0: ") != std::string::npos);
  CHECK(r.out.find(fmt::format("FAIL no-plan c.json plans: {} of {} simulated layouts fit, {} "
                               "required",
                               fitting, simulated, fitting + 1)) != std::string::npos);
  // 64 MiB of usable memory: no layout fits, and the message names the closest one's reason.
  r = RunMemsim(dir, "check c.json --require-plans 1 --capacity 64MiB");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("c.json plans: 0 of ") != std::string::npos);
  CHECK(r.out.find("; closest: tp") != std::string::npos);
  CHECK(RunMemsim(dir, "check c.json --require-plans 0").exit_code == 2);
  // The planner varies Megatron layouts only: another framework's config is an error row alone
  // (no stage verdict beside it), exit 2.
  r = RunMemsim(dir, "check " + std::string(MEMSIM_SOURCE_DIR) +
                         "/configs/llama3-8b-lora-rtx4090.json --require-plans 1");
  CHECK(r.exit_code == 2);
  CHECK(r.out.rfind("ERROR ", 0) == 0);
  CHECK(r.out.find("has no model-parallel layouts to vary") != std::string::npos);
}

}  // namespace
}  // namespace memsim
