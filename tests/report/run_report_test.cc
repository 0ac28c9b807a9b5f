// The run report's per-iteration lines compare like with like (issue 15): a peak is set against
// the previous iteration's peak of the same phase, or against the iteration's own start, never
// against a peak of another phase. The shipped configs are walked on every stage.
#include "report/run_report.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <regex>
#include <sstream>

#include "config/load.h"
#include "engine/stages.h"
#include "report/format.h"
#include "shipped_configs.h"

namespace memsim {
namespace {

namespace fs = std::filesystem;

using testing::ShippedConfigs;

// Checks every comparison line of `table` against the phase of the row above it. Returns the
// offending lines ("" when all compare like with like) and counts the lines checked.
std::string UnlikeComparisons(const std::string& table, int* checked) {
  static const std::regex row(
      R"(^(init| +\d+) .*  (init|forward|backward|optimizer_step)( mb\d+)?$)");
  static const std::regex vs_prev(R"(^ +at (\w+) peak vs iter \d+'s (\w+) peak: )");
  static const std::regex vs_start(R"(^ +at (\w+) peak vs the start of the iteration: )");
  static const std::regex any_peak(R"(peak vs)");
  std::istringstream in(table);
  std::string line, row_phase, bad;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, row)) {
      row_phase = m[2];
    } else if (std::regex_search(line, m, vs_prev)) {
      ++*checked;
      if (m[1] != row_phase || m[2] != row_phase) bad += line + "\n";
    } else if (std::regex_search(line, m, vs_start)) {
      ++*checked;
      if (m[1] != row_phase) bad += line + "\n";
    } else if (std::regex_search(line, any_peak)) {
      bad += "unrecognised: " + line + "\n";
    }
  }
  return bad;
}

TEST_CASE("no shipped config, on any stage, compares peaks of different phases",
          "[report][configs]") {
  const std::vector<std::string> configs = ShippedConfigs();
  REQUIRE(configs.size() >= 7);
  for (const std::string& path : configs) {
    const config::Setup setup = config::LoadSetup(path, {});
    engine::RunOptions options;
    options.keep_timeline = false;
    engine::RunResult run = engine::RunAllStages(setup, options);
    for (size_t r = 0; r < run.stages.size(); ++r) {
      run.reported_stage = static_cast<int>(r);
      const std::string table = report::FormatIterationTable(run, 80);
      int checked = 0;
      INFO(fs::path(path).filename().string() << " stage " << r << "\n" << table);
      CHECK(UnlikeComparisons(table, &checked).empty());
      // One comparison per iteration (init has none).
      CHECK(checked == setup.training.train_iters);
    }
  }
}

TEST_CASE("TP4 DP2: iteration 2's forward peak is set against iteration 1's forward peak",
          "[report]") {
  // Iteration 1 peaks in the optimizer step (no activations), iteration 2 in the forward pass:
  // comparing those two moments printed "+4.31 GiB activations" (issue 15).
  config::LoadOptions load;
  load.overrides = {"training.tensor_model_parallel_size=4", "training.data_parallel_size=2",
                    "training.global_batch_size=32"};
  const config::Setup setup = config::LoadSetup("", load);
  engine::RunOptions options;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(setup, options);
  const engine::StageResult& stage = run.Reported();
  const timeline::SpanSummary& it1 = *stage.Span(1);
  const timeline::SpanSummary& it2 = *stage.Span(2);
  REQUIRE(it1.peak_phase == Phase::kOptimizerStep);
  REQUIRE(it2.peak_phase == Phase::kForward);
  const std::string table = report::FormatIterationTable(run, 80);
  INFO(table);
  CHECK(table.find("+4.31 GiB activations") == std::string::npos);
  CHECK(table.find("at forward peak vs iter 1's forward peak: ") != std::string::npos);
  // The numbers of that line, from the phase peaks themselves.
  const report::PeakComparison c = report::CompareAtSameMoment(it1, it2);
  CHECK(c.against_previous);
  CHECK(c.phase == Phase::kForward);
  CHECK(c.before == it1.PeakOf(Phase::kForward).by_category);
  CHECK(c.after == it2.PeakOf(Phase::kForward).by_category);
  const auto opt = static_cast<size_t>(Category::kOptimizerStates);
  CHECK(table.find(report::SignedHuman(c.after[opt] - c.before[opt]) + " optimizer_states") !=
        std::string::npos);
}

TEST_CASE("a phase peak is the maximum of allocated over that phase's samples", "[report]") {
  const config::Setup setup = config::LoadSetup("", {});
  engine::RunOptions options;
  const engine::RunResult run = engine::RunAllStages(setup, options);
  const engine::StageResult& stage = run.Reported();
  for (const timeline::SpanSummary& s : stage.spans) {
    for (int p = 0; p < timeline::kNumSimulatedPhases; ++p) {
      Bytes max = -1;
      for (const timeline::Sample& x : run.timeline.samples) {
        if (x.iteration == s.iteration && static_cast<int>(x.phase) == p) {
          max = std::max(max, x.allocated_bytes);
        }
      }
      const timeline::PhasePeak& pp = s.phase_peaks[static_cast<size_t>(p)];
      INFO("iteration " << s.iteration << " phase " << p);
      CHECK(pp.seen == (max >= 0));
      if (pp.seen) CHECK(pp.allocated_bytes == max);
    }
    // The span's peak is the peak of its phase.
    CHECK(s.PeakOf(s.peak_phase).allocated_bytes == s.peak_allocated_bytes);
  }
}

// A run whose iterations repeat without a steady state being declared (issue 32: 34 rows seen)
// prints kMinRepeatedRows or more repeated rows as one line. The spans are the default run's
// init, 1 and 2, then copies of iteration 2 renumbered: each copy prints as iteration 2 did, with
// no change at the like-for-like peak and nothing kept.
TEST_CASE("repeated iteration rows of the table are summarised in one line", "[report]") {
  config::LoadOptions load;
  load.iterations = 2;
  const config::Setup setup = config::LoadSetup("", load);
  engine::RunOptions options;
  options.keep_timeline = false;
  engine::RunResult run = engine::RunAllStages(setup, options);
  std::vector<timeline::SpanSummary>& spans = run.stages[run.reported_stage].spans;
  REQUIRE(spans.size() == 3);
  REQUIRE(spans[2].start_allocated_bytes == spans[2].end_allocated_bytes);
  const timeline::SpanSummary two = spans[2];
  const auto repeat_to = [&](int last) {
    spans.resize(3);
    for (int k = 3; k <= last; ++k) {
      spans.push_back(two);
      spans.back().iteration = k;
    }
    return report::FormatIterationTable(run, 80);
  };
  // Iterations 3..34: 32 rows as iteration 2.
  const std::string many = repeat_to(34);
  INFO(many);
  CHECK(many.find("   3..34: 32 iterations, each as iteration 2 (no change)\n") !=
        std::string::npos);
  CHECK(many.find("\n   3 ") == std::string::npos);
  CHECK(many.find("\n   2 ") != std::string::npos);
  // Two repeated rows (fewer than kMinRepeatedRows) are printed as they are.
  static_assert(report::kMinRepeatedRows == 3);
  const std::string few = repeat_to(4);
  INFO(few);
  CHECK(few.find("iterations, each as") == std::string::npos);
  CHECK(few.find("\n   3 ") != std::string::npos);
  CHECK(few.find("\n   4 ") != std::string::npos);
}

}  // namespace
}  // namespace memsim
