// Long runs (config/iterations.h, engine/stages.h): a run longer than the iterations memsim
// simulates stops once two consecutive iterations are identical, allocator state included, and
// the iterations it did simulate are exactly those of a run of that length.
#include <catch2/catch.hpp>
#include <string>

#include <fmt/core.h>

#include "config/iterations.h"
#include "config/load.h"
#include "engine/stages.h"
#include "report/run_report.h"
#include "shipped_configs.h"

namespace memsim::engine {
namespace {

config::Setup Load(const std::string& path, std::vector<std::string> overrides) {
  config::LoadOptions o;
  o.overrides = std::move(overrides);
  return config::LoadSetup(path, o);
}

const std::string kDefault = std::string(MEMSIM_SOURCE_DIR) + "/configs/default.json";

// The run report's JSON without the keys only a long run has.
std::string JsonWithoutLongRunKeys(const RunResult& run, const config::Setup& setup) {
  std::string j = report::RunReportJson(run, setup);
  for (const char* key :
       {"  \"steady_state_from\"", "  \"steady_state_period\"", "  \"train_iters\""}) {
    const size_t at = j.find(std::string("\n") + key);
    if (at != std::string::npos) j.erase(at, j.find('\n', at + 1) - at);
  }
  return j;
}

TEST_CASE("train_iters 500000 reports the steady state after a handful of iterations",
          "[engine][steady]") {
  const config::Setup setup = Load(kDefault, {"training.train_iters=500000"});
  const RunResult run = RunAllStages(setup, {});
  REQUIRE(run.IsLongRun());
  CHECK(run.train_iters == 500000);
  // Iteration 1 creates Adam's state (config::FirstRepeatingIteration = 2), so the first
  // candidate is iteration 2; the default config (no empty_cache schedule) settles by then or
  // soon after: at most max(4, 2 + 1) = 4 iterations, or one doubling (8).
  REQUIRE(run.steady_state_from.has_value());
  CHECK(*run.steady_state_from >= config::FirstRepeatingIteration(setup));
  CHECK(run.simulated_iterations <= 8);
  CHECK(*run.steady_state_from + 1 <= run.simulated_iterations);
  // The two identical iterations are in the report with the same numbers.
  const StageResult& s = run.Reported();
  const timeline::SpanSummary* a = s.Span(*run.steady_state_from);
  const timeline::SpanSummary* b = s.Span(*run.steady_state_from + 1);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a->peak_allocated_bytes == b->peak_allocated_bytes);
  CHECK(a->end_reserved_bytes == b->end_reserved_bytes);
  const std::string json = report::RunReportJson(run, setup);
  CHECK(json.find("\"train_iters\": 500000,\n  \"") != std::string::npos);
  CHECK(json.find(fmt::format("\"steady_state_from\": {}", *run.steady_state_from)) !=
        std::string::npos);
  CHECK(report::FormatLongRun(run).find(fmt::format("simulated {} of 500000 iterations",
                                                    run.simulated_iterations)) != std::string::npos);
}

TEST_CASE("a long run's simulated iterations are those of a run of that length",
          "[engine][steady]") {
  // train_iters 6: 4 iterations first (max(4, 2 + 1)); a stage not steady by then doubles the
  // count to min(8, 6) = 6 = train_iters, an ordinary run. Either way the simulated iterations
  // must be exactly those of a run of that length.
  for (const std::string& path : testing::ShippedConfigs()) {
    CAPTURE(path);
    // The Trainer's configs write TrainingArguments' max_steps for train_iters.
    const std::string key = config::LoadSetup(path, {}).training.framework == "hf-trainer"
                                ? "training.max_steps"
                                : "training.train_iters";
    const config::Setup long_setup = Load(path, {key + "=6"});
    const RunResult long_run = RunAllStages(long_setup, {});
    CHECK(long_run.IsLongRun() == long_run.steady_state_from.has_value());
    const config::Setup short_setup =
        Load(path, {fmt::format("{}={}", key, long_run.simulated_iterations)});
    const RunResult short_run = RunAllStages(short_setup, {});
    CHECK_FALSE(short_run.IsLongRun());
    // Equal reports but for the training block's train_iters (in "config" and in
    // "input_config", as max_steps for the Trainer's) and the long run's own keys.
    std::string want = report::RunReportJson(short_run, short_setup);
    std::string got = JsonWithoutLongRunKeys(long_run, long_setup);
    for (const char* name : {"train_iters", "max_steps"}) {
      const std::string short_iters =
          fmt::format("\"{}\": {}", name, long_run.simulated_iterations);
      for (size_t at = want.find(short_iters); at != std::string::npos;
           at = want.find(short_iters, at + 1)) {
        want.replace(at, short_iters.size(), fmt::format("\"{}\": 6", name));
      }
    }
    CHECK(got == want);
  }
}

TEST_CASE("a run no longer than the minimum simulates every iteration", "[engine][steady]") {
  const config::Setup setup = Load(kDefault, {"training.train_iters=4"});
  const RunResult run = RunAllStages(setup, {});
  CHECK_FALSE(run.IsLongRun());
  CHECK(run.simulated_iterations == 4);
  CHECK(report::FormatLongRun(run).empty());
  CHECK(report::RunReportJson(run, setup).find("steady_state_from") == std::string::npos);
}

TEST_CASE("skipped fp16 steps move the steady state past them", "[engine][steady]") {
  // skipped_iterations 3: iterations 1-3 create no optimizer state, iteration 4 runs the first
  // real step (workload/training_loop.h), so config::FirstRepeatingIteration = 3 + 2 = 5 and the
  // run simulates past the skipped steps before it may call anything steady.
  const config::Setup setup = Load(kDefault, {"training.precision=fp16",
                                              "training.train_iters=500000",
                                              "training.skipped_iterations=3"});
  CHECK(config::FirstRepeatingIteration(setup) == 5);
  const RunResult run = RunAllStages(setup, {});
  REQUIRE(run.IsLongRun());
  REQUIRE(run.steady_state_from.has_value());
  CHECK(*run.steady_state_from >= 5);
  CHECK(run.simulated_iterations >= 6);
  // The first real step (iteration 4) creates Adam's state: iteration 4 ends higher than 3.
  const StageResult& s = run.Reported();
  REQUIRE(s.Span(3) != nullptr);
  REQUIRE(s.Span(4) != nullptr);
  CHECK(s.Span(4)->end_allocated_bytes > s.Span(3)->end_allocated_bytes);
}

TEST_CASE("a pipeline stage whose blocks alternate between two layouts is steady with period 2",
          "[engine][steady]") {
  // Under 1F1B some stages of the Llama-2-70B PP8 config end every other iteration with the
  // same blocks in swapped places (EngineState of iteration k equals that of k + 2, not k + 1),
  // with identical numbers. Such a stage repeats from k on with period 2; the run must say so
  // after a handful of iterations instead of searching to config::MaxSimulatedIterations.
  const config::Setup setup = Load(std::string(MEMSIM_SOURCE_DIR) +
                                       "/configs/llama2-70b-h100-tp8-pp8.json",
                                   {"training.train_iters=500000"});
  const RunResult run = RunAllStages(setup, {});
  REQUIRE(run.steady_state_from.has_value());
  CHECK(run.simulated_iterations <= 8);
  CHECK(run.steady_state_period >= 1);
  CHECK(run.steady_state_period <= kMaxSteadyPeriod);
  for (const StageResult& s : run.stages) {
    CAPTURE(s.pipeline_rank);
    REQUIRE(s.steady_state_from.has_value());
    // The repeating iterations carry the same numbers one period apart.
    const timeline::SpanSummary* a = s.Span(*s.steady_state_from);
    const timeline::SpanSummary* b = s.Span(*s.steady_state_from + s.steady_state_period);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(a->peak_allocated_bytes == b->peak_allocated_bytes);
    CHECK(a->peak_reserved_bytes == b->peak_reserved_bytes);
  }
  if (run.steady_state_period > 1) {
    CHECK(report::FormatLongRun(run).find(
              fmt::format("repeat every {} iterations", run.steady_state_period)) !=
          std::string::npos);
  }
}

}  // namespace
}  // namespace memsim::engine
