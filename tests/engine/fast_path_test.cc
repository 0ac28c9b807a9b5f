// Issue 17: the streamed path (each stage's ops fed to the engine as they are generated, the
// Program never held whole) against the whole-Program path, on every shipped config: the JSON
// report of every pipeline stage (what `run --pipeline-rank R --json` writes) must be byte for
// byte the same, and so must the reported stage's kept curve.
#include <catch2/catch.hpp>
#include <filesystem>

#include "config/load.h"
#include "engine/stages.h"
#include "report/run_report.h"
#include "shipped_configs.h"

namespace memsim::engine {
namespace {

namespace fs = std::filesystem;

TEST_CASE("every shipped config and stage: the streamed run reports what the whole Program does",
          "[engine][configs][fast_path]") {
  const std::vector<std::string> configs = testing::ShippedConfigs();
  REQUIRE(configs.size() >= 7);
  for (const std::string& path : configs) {
    DYNAMIC_SECTION(fs::path(path).filename().string()) {
      const config::Setup setup = config::LoadSetup(path, {});
      RunOptions whole_options;
      whole_options.whole_program = true;
      const RunResult whole = RunAllStages(setup, whole_options);
      const RunResult streamed = RunAllStages(setup, RunOptions{});
      REQUIRE(whole.stages.size() == streamed.stages.size());
      CHECK(whole.reported_stage == streamed.reported_stage);
      CHECK(whole.timeline.samples == streamed.timeline.samples);
      CHECK(whole.timeline.markers == streamed.timeline.markers);
      CHECK(report::RunReportJson(whole, setup) == report::RunReportJson(streamed, setup));
      for (int r = 0; r < static_cast<int>(whole.stages.size()); ++r) {
        // `run --pipeline-rank r` reports stage r from the same simulation of every stage.
        RunResult a = whole, b = streamed;
        a.reported_stage = b.reported_stage = r;
        a.reported_stage_chosen = b.reported_stage_chosen = true;
        INFO("stage " << r);
        CHECK(report::RunReportJson(a, setup) == report::RunReportJson(b, setup));
        CHECK(a.Reported().simulation.end_time_us == b.Reported().simulation.end_time_us);
      }
    }
  }
}

}  // namespace
}  // namespace memsim::engine
