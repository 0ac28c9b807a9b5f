// Pipeline stages simulated at once (RunOptions::threads, core/parallel.h): every stage is an
// independent simulation and the results are merged in rank order, so a run on several threads
// must give exactly what one thread gives -- every stage's report, the kept curve, the first
// OOM, a long run's steady state.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "config/load.h"
#include "engine/stages.h"
#include "report/run_report.h"

namespace memsim::engine {
namespace {

// llama2-13b PP2 at 8 micro-batches and 2 iterations: both stages with a steady 1F1B phase, a
// quarter of the shipped config's work.
const std::vector<std::string> kSmall13b = {"training.global_batch_size=8",
                                            "training.train_iters=2"};

config::Setup Load(const std::string& name, std::vector<std::string> overrides = {}) {
  config::LoadOptions o;
  o.overrides = std::move(overrides);
  return config::LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/" + name, o);
}

RunResult RunOn(const config::Setup& setup, int threads, RunOptions options = {}) {
  options.threads = threads;
  return RunAllStages(setup, options);
}

// Everything a report can show of `a` and `b`, stage by stage.
void CheckSameRun(const RunResult& a, const RunResult& b, const config::Setup& setup) {
  REQUIRE(a.stages.size() == b.stages.size());
  CHECK(a.reported_stage == b.reported_stage);
  CHECK(a.timeline.samples == b.timeline.samples);
  CHECK(a.timeline.markers == b.timeline.markers);
  CHECK(a.simulated_iterations == b.simulated_iterations);
  CHECK(a.steady_state_from == b.steady_state_from);
  CHECK(a.steady_state_period == b.steady_state_period);
  CHECK(a.first_oom.has_value() == b.first_oom.has_value());
  if (a.first_oom && b.first_oom) {
    CHECK(a.first_oom->pipeline_rank == b.first_oom->pipeline_rank);
    CHECK(a.first_oom->oom.time_us == b.first_oom->oom.time_us);
  }
  CHECK(report::RunReportJson(a, setup) == report::RunReportJson(b, setup));
  for (int r = 0; r < static_cast<int>(a.stages.size()); ++r) {
    INFO("stage " << r);
    RunResult x = a, y = b;
    x.reported_stage = y.reported_stage = r;
    x.reported_stage_chosen = y.reported_stage_chosen = true;
    CHECK(report::RunReportJson(x, setup) == report::RunReportJson(y, setup));
    CHECK(a.stages[r].steady_state_from == b.stages[r].steady_state_from);
  }
}

TEST_CASE("llama2-70b PP8: stages on 1, 3 and 8 threads give the same run", "[engine][threads]") {
  // 16 micro-batches (DP 2) and 2 iterations: every stage still runs warm-up, steady 1F1B and
  // cool-down, at an eighth of the shipped config's work (the sanitized CI pass runs this).
  const config::Setup setup = Load("llama2-70b-h100-tp8-pp8.json",
                                   {"training.global_batch_size=32", "training.train_iters=2"});
  const RunResult one = RunOn(setup, 1);
  REQUIRE(one.stages.size() == 8);
  // 3 does not divide 8: stages finish out of order and wait for the earlier ones.
  CheckSameRun(one, RunOn(setup, 3), setup);
  CheckSameRun(one, RunOn(setup, 8), setup);
}

TEST_CASE("llama2-13b PP2 on 4 threads: more threads than stages", "[engine][threads]") {
  const config::Setup setup = Load("llama2-13b-910b-tp4-pp2.json", kSmall13b);
  CheckSameRun(RunOn(setup, 1), RunOn(setup, 4), setup);
}

TEST_CASE("threads: --pipeline-rank, --no-chart and an OOM on every stage", "[engine][threads]") {
  const config::Setup setup = Load("llama2-13b-910b-tp4-pp2.json", kSmall13b);
  RunOptions rank;
  rank.pipeline_rank = 1;
  CheckSameRun(RunOn(setup, 1, rank), RunOn(setup, 2, rank), setup);
  RunOptions no_chart;
  no_chart.keep_timeline = false;
  const RunResult bare = RunOn(setup, 2, no_chart);
  CHECK(bare.timeline.samples.empty());
  CheckSameRun(RunOn(setup, 1, no_chart), bare, setup);
  // 1 GiB is far below either stage's weights: both run out of memory, the earliest OOM wins.
  RunOptions small;
  small.usable_memory_bytes = Bytes{1} << 30;
  const RunResult oom = RunOn(setup, 2, small);
  REQUIRE(oom.first_oom.has_value());
  CheckSameRun(RunOn(setup, 1, small), oom, setup);
}

TEST_CASE("threads: a long run's passes and steady state are the same", "[engine][threads]") {
  const config::Setup setup = Load("llama2-13b-910b-tp4-pp2.json",
                                   {"training.global_batch_size=8", "training.train_iters=100000"});
  const RunResult one = RunOn(setup, 1);
  REQUIRE(one.IsLongRun());
  CheckSameRun(one, RunOn(setup, 2), setup);
}

TEST_CASE("threads: progress ends at 1 on one thread and on two", "[engine][threads]") {
  const config::Setup setup = Load("llama2-13b-910b-tp4-pp2.json", kSmall13b);
  auto run = [&](int threads, std::vector<double>* done) {
    RunOptions o;
    // Called on the stages' threads (one call at a time): recorded here, checked below.
    o.progress = [done](const RunProgress& p) { done->push_back(p.stages_done / p.stages); };
    return RunOn(setup, threads, o);
  };
  std::vector<double> done1, done2;
  const RunResult one = run(1, &done1);
  const RunResult two = run(2, &done2);
  CHECK(one.reported_stage == two.reported_stage);
  // Both stages report their end: all done, never more.
  REQUIRE(!done2.empty());
  CHECK(done1.back() == 1.0);
  CHECK(done2.back() == 1.0);
  CHECK(*std::max_element(done2.begin(), done2.end()) == 1.0);
}

}  // namespace
}  // namespace memsim::engine
