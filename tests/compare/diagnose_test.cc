// `memsim compare` diagnoses (issue 15): what a Megatron log says about its own run (skipped
// iterations, the per-rank parameter count, the printed theoretical memory) is read and set
// against the simulated config; the published case whose every step the fp16 loss scaler skipped
// (tests/validation/cases/zhnotes-gpt2small-fp16-1gpu-all-skipped) names the skipped steps.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "compare/diagnose.h"
#include "config/load.h"
#include "profile/profile.h"
#include "workload/build.h"

namespace memsim {
namespace {

const std::string kCase =
    std::string(MEMSIM_SOURCE_DIR) + "/tests/validation/cases/zhnotes-gpt2small-fp16-1gpu-all-skipped";

// The case's own report_memory line ("raw").
std::string RawLine() {
  std::ifstream in(kCase + "/expected.json");
  return nlohmann::json::parse(in).at("raw").get<std::string>();
}

// Megatron's training_log line for iteration 10 (training.py training_log; fields abridged).
const std::string kSkippedLine =
    " [2025-04-13 10:00:00] iteration       10/      10 | consumed samples:          160 | "
    "elapsed time per iteration (ms): 250.0 | learning rate: 0.000000E+00 | global batch size:    "
    "16 | loss scale: 4194304.0 | number of skipped iterations:  10 | number of nan iterations:   "
    "0 |";

std::int64_t CaseParameters() {
  const config::Setup setup = config::LoadSetup(kCase + "/config.json", {});
  return workload::ComputeStaticSizes(setup, 0).parameter_count;
}

testing::CommandResult Compare(const testing::ScratchDir& dir, const std::string& log) {
  dir.Write("train.log", log);
  return testing::RunMemsim(dir, fmt::format("compare {}/config.json --profile train.log --width 80", kCase));
}

// The output with the diagnosis's continuation lines joined back.
std::string Unwrapped(std::string out) {
  for (size_t p = out.find("\n   "); p != std::string::npos; p = out.find("\n   ", p)) {
    out.replace(p, 4, " ");
  }
  return out;
}

void CheckFits80(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    INFO(line);
    CHECK(line.size() <= 80);
  }
}

TEST_CASE("the Megatron log reader keeps what the log says about its run", "[compare][profile]") {
  testing::ScratchDir dir("statements");
  const auto path = dir.Write(
      "train.log",
      " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 124439808\n"
      " > number of parameters on (tensor, gtp_weight_remat, pipeline) model parallel rank (1, 0, 3): 77\n"
      "Theoretical memory footprints: weight and optimizer=2121.85 MB, activation=100.50 MB, "
      "total=2222.35 MB\n" +
          kSkippedLine + "\n" + kSkippedLine + "\n" + RawLine() + "\n");
  const timeline::Timeline t = profile::LoadProfile(path.string(), profile::Format::kMegatronLog);
  const timeline::LogStatements& s = t.statements;
  CHECK(s.skipped_iterations == 20);
  CHECK(s.last_logged_iteration == 10);
  REQUIRE(s.parameters.size() == 2);
  CHECK(s.parameters[0] == timeline::LogStatements::RankParameters{0, 0, 124439808});
  CHECK(s.parameters[1] == timeline::LogStatements::RankParameters{1, 3, 77});
  REQUIRE(s.theoretical_weight_and_optimizer_bytes);
  CHECK(std::llabs(*s.theoretical_weight_and_optimizer_bytes - static_cast<Bytes>(2121.85 * kMiB)) <= 1);
}

TEST_CASE("a malformed parameter line is one error naming the file and line", "[compare][profile]") {
  testing::ScratchDir dir("statements-bad");
  const auto path = dir.Write(
      "train.log", RawLine() + "\n > number of parameters on (tensor, pipeline) model parallel rank (0, x): 5\n");
  const testing::CommandResult r =
      testing::RunMemsim(dir, fmt::format("compare {}/config.json --profile train.log", kCase));
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "memsim compare: train.log:2: expected ' > number of parameters on (tensor, pipeline) "
        "model parallel rank (t, p): N'\n");
}

TEST_CASE("compare names the skipped steps of the published all-skipped case", "[compare]") {
  testing::ScratchDir dir("skipped");
  const testing::CommandResult r = Compare(dir, kSkippedLine + "\n" + RawLine() + "\n");
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  const std::string out = Unwrapped(r.out);
  CHECK_THAT(out, Catch::Contains("diagnosis:\n - likely cause: the log says 10 of 10 iterations were skipped"));
  CHECK_THAT(out, Catch::Contains("skipped every optimizer step, so Adam's state was never created"));
  CheckFits80(r.out);
}

TEST_CASE("compare flags a per-rank parameter count that disagrees with the config", "[compare]") {
  const std::int64_t psi = CaseParameters();
  testing::ScratchDir dir("params");
  const std::string line = fmt::format(
      " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): {}\n", psi * 2);
  const testing::CommandResult r = Compare(dir, line + RawLine() + "\n");
  INFO(r.out << r.err);
  CHECK_THAT(Unwrapped(r.out), Catch::Contains(fmt::format(
                        " - likely cause: the log's rank (tensor 0, pipeline 0) holds {} parameters,",
                        psi * 2)));
  CheckFits80(r.out);
  // The same line with the config's own count is not a cause.
  const testing::CommandResult ok = Compare(
      dir, fmt::format(" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): {}\n", psi) +
               RawLine() + "\n");
  CHECK_THAT(Unwrapped(ok.out), Catch::Contains("agrees with the config"));
  CHECK(ok.out.find("likely cause") == std::string::npos);
}

TEST_CASE("Diagnose: a parameter count off by one parameter is said, not called a cause",
          "[compare]") {
  // Megatron's get_model prints an exact count: 1,000,001 against the simulated 1,000,000 is a
  // different model (+1, +0.00%), too close to explain a memory gap.
  compare::Report report;
  timeline::LogStatements log;
  log.parameters.push_back({0, 0, 1000001});
  compare::SimulatedSide sim;
  sim.parameters_on_rank = 1000000;
  std::vector<compare::Finding> f = compare::Diagnose(report, log, sim);
  REQUIRE(f.size() == 1);
  CHECK_FALSE(f[0].likely_cause);
  CHECK_THAT(f[0].text, Catch::Contains("holds 1000001 parameters, the simulated config 1000000 (+1, +0.00%)"));
  log.parameters[0].count = 1000000;
  f = compare::Diagnose(report, log, sim);
  REQUIRE(f.size() == 1);
  CHECK_THAT(f[0].text, Catch::Contains("agrees with the config"));
}

TEST_CASE("Diagnose: the printed theoretical memory against the closed form", "[compare]") {
  compare::Report report;
  timeline::LogStatements log;
  compare::SimulatedSide sim;
  sim.closed_form_weight_and_optimizer_bytes = 1000 * kMiB;
  log.theoretical_weight_and_optimizer_bytes = 1010 * kMiB;  // +1%: agrees
  std::vector<compare::Finding> f = compare::Diagnose(report, log, sim);
  REQUIRE(f.size() == 1);
  CHECK_FALSE(f[0].likely_cause);
  log.theoretical_weight_and_optimizer_bytes = 1500 * kMiB;  // +50%: another config
  f = compare::Diagnose(report, log, sim);
  REQUIRE(f.size() == 1);
  CHECK(f[0].likely_cause);
  CHECK_THAT(f[0].text, Catch::Contains("1.46 GiB, against 1000.0 MiB"));
}

TEST_CASE("Diagnose: a gap the size of one simulated category names it", "[compare]") {
  compare::Report report;
  compare::IterationResult it;
  it.iteration = 3;
  it.simulated_iteration = 3;
  it.simulated.peak_allocated_bytes = 10 * kGiB;
  it.measured.peak_allocated_bytes = 8 * kGiB;
  report.iterations.push_back(it);
  compare::SimulatedSide sim;
  CategoryBytes held{};
  held[static_cast<size_t>(Category::kParameters)] = 6 * kGiB;
  held[static_cast<size_t>(Category::kOptimizerStates)] = 2 * kGiB;
  held[static_cast<size_t>(Category::kActivations)] = 2 * kGiB + 512 * kMiB;
  sim.iterations.push_back({3, held, held});
  const std::vector<compare::Finding> f = compare::Diagnose(report, {}, sim);
  REQUIRE(f.size() == 1);
  CHECK_THAT(f[0].text, Catch::Contains("the gap (-2.00 GiB) is the size of optimizer_states alone"));
  CHECK_THAT(f[0].text, Catch::Contains("holds then 6.00 GiB parameters, 2.50 GiB activations, 2.00 GiB optimizer_states"));
}


// Tryout 7: iteration 1 ends 2 GiB low, the size of the simulated optimizer_states, but
// iteration 2's end agrees (within 2%) while the simulation holds those 2 GiB there: the run
// does hold them, so the finding must not say it may not.
TEST_CASE("Diagnose: a gap a later iteration contradicts is not called an absence", "[compare]") {
  compare::Report report;
  compare::SimulatedSide sim;
  CategoryBytes held{};
  held[static_cast<size_t>(Category::kParameters)] = 6 * kGiB;
  held[static_cast<size_t>(Category::kOptimizerStates)] = 2 * kGiB;
  for (int k = 1; k <= 2; ++k) {
    compare::IterationResult it;
    it.iteration = it.simulated_iteration = k;
    it.simulated.end_allocated_bytes = 8 * kGiB;
    it.measured.end_allocated_bytes = k == 1 ? 6 * kGiB : 8 * kGiB;
    report.iterations.push_back(it);
    sim.iterations.push_back({k, held, held});
  }
  const std::vector<compare::Finding> f = compare::Diagnose(report, {}, sim);
  REQUIRE(f.size() == 1);
  CHECK_THAT(f[0].text, !Catch::Contains("the run may not hold them"));
  CHECK_THAT(f[0].text, Catch::Contains("the gap (-2.00 GiB) is the size of optimizer_states "
                                        "(2.00 GiB), but at iteration 2's end the run agrees"));
}


// tryout8 #5: a profile's steady iterations repeat one gap; iterations 2..6 (the last three
// compared with simulated iteration 4, the steady state) give one finding per moment over the
// range, and iteration 1, whose gap differs, stays its own.
TEST_CASE("Diagnose: the same gap in consecutive iterations is one finding", "[compare]") {
  compare::Report report;
  compare::SimulatedSide sim;
  CategoryBytes held{};
  held[static_cast<size_t>(Category::kParameters)] = 6 * kGiB;
  held[static_cast<size_t>(Category::kActivations)] = 4 * kGiB;
  for (int k = 1; k <= 6; ++k) {
    compare::IterationResult it;
    it.iteration = k;
    it.simulated_iteration = std::min(k, 4);
    it.simulated.peak_allocated_bytes = 10 * kGiB;
    it.measured.peak_allocated_bytes = k == 1 ? 9 * kGiB : 9 * kGiB + 512 * kMiB;  // -10%, -5%
    report.iterations.push_back(it);
    if (k <= 4) sim.iterations.push_back({k, held, held});
  }
  const std::vector<compare::Finding> f = compare::Diagnose(report, {}, sim);
  REQUIRE(f.size() == 2);
  CHECK_THAT(f[0].text, Catch::StartsWith("iteration 1 (simulated 1), peak allocated: measured "
                                          "9.00 GiB"));
  CHECK_THAT(f[1].text, Catch::StartsWith("iterations 2..6 (simulated 2..4), peak allocated: "
                                          "measured 9.50 GiB"));
}

}  // namespace
}  // namespace memsim
