// The streamed path (what `run` does: each stage's ops fed to the engine as workload::BuildInto
// generates them, the Program never held whole) against the whole-Program path (workload::Build,
// then engine::Simulate, as `explain` and the exports replay a stage), on every shipped config:
// every pipeline stage's span summaries (what `run --pipeline-rank R --json` reports of it) and
// simulation result must be the same, and so must the reported stage's kept curve.
#include <catch2/catch.hpp>
#include <filesystem>

#include "config/load.h"
#include "engine/recorder.h"
#include "engine/stages.h"
#include "shipped_configs.h"
#include "workload/build.h"

namespace memsim::engine {
namespace {

namespace fs = std::filesystem;

TEST_CASE("every shipped config and stage: the streamed run records what the whole Program does",
          "[engine][configs][fast_path]") {
  const std::vector<std::string> configs = testing::ShippedConfigs();
  REQUIRE(configs.size() >= 7);
  for (const std::string& path : configs) {
    DYNAMIC_SECTION(fs::path(path).filename().string()) {
      const config::Setup setup = config::LoadSetup(path, {});
      const RunResult streamed = RunAllStages(setup, RunOptions{});
      // A long run simulates fewer iterations than it trains: the whole Program of those.
      const config::Setup simulated = SimulatedSetup(setup, streamed);
      for (int r = 0; r < static_cast<int>(streamed.stages.size()); ++r) {
        INFO("stage " << r);
        const bool reported = r == streamed.reported_stage;
        Recorder recorder(reported);
        const SimulateResult whole =
            Simulate(workload::Build(simulated, r), simulated, SimulateOptions{}, recorder);
        recorder.Finish();
        const StageResult& stage = streamed.stages[static_cast<size_t>(r)];
        CHECK(recorder.spans() == stage.spans);
        CHECK(whole.allocator_stats == stage.simulation.allocator_stats);
        CHECK(whole.first_oom == stage.simulation.first_oom);
        CHECK(whole.end_time_us == stage.simulation.end_time_us);
        CHECK(whole.num_communicators == stage.simulation.num_communicators);
        CHECK(whole.outside_allocator_bytes == stage.simulation.outside_allocator_bytes);
        if (reported) CHECK(recorder.timeline() == streamed.timeline);
      }
    }
  }
}

}  // namespace
}  // namespace memsim::engine
