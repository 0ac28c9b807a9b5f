// docs/walkthrough.md explains the default run with figures; this test recomputes each figure
// from the simulation of the embedded default and checks that the document quotes it, so the
// walkthrough cannot drift from memsim's output. On failure it lists the expected phrases.
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>
#include <fmt/core.h>

#include "config/load.h"
#include "engine/stages.h"
#include "report/format.h"
#include "report/run_report.h"
#include "cli/cli_test_util.h"

namespace memsim {
namespace {

std::string ReadDoc(const std::string& relative = "docs/walkthrough.md") {
  std::ifstream in(std::string(MEMSIM_SOURCE_DIR) + "/" + relative);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Bytes Cat(const CategoryBytes& c, Category k) { return c[static_cast<size_t>(k)]; }

TEST_CASE("docs/walkthrough.md quotes the default run's own figures", "[docs]") {
  const config::Setup setup = config::LoadSetup("", {});
  engine::RunOptions options;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(setup, options);
  const engine::StageResult& stage = run.Reported();
  const timeline::SpanSummary& init = *stage.Span(0);
  const timeline::SpanSummary& it1 = *stage.Span(1);
  const timeline::SpanSummary& it2 = *stage.Span(2);
  const timeline::SpanSummary& it3 = *stage.Span(3);
  const timeline::SpanSummary& it4 = *stage.Span(4);
  using report::GiB;
  const CategoryBytes& kept = it1.end_by_category;
  const Bytes outside = it4.end_device_bytes - it4.end_reserved_bytes;
  std::vector<std::string> phrases = {
      // Static memory after the first step, by category.
      fmt::format("parameters: {} GiB", GiB(Cat(kept, Category::kParameters))),
      fmt::format("gradients: {} GiB", GiB(Cat(kept, Category::kGradients))),
      fmt::format("main parameters: {} GiB", GiB(Cat(kept, Category::kMainParameters))),
      fmt::format("optimizer states: {} GiB", GiB(Cat(kept, Category::kOptimizerStates))),
      fmt::format("{} GiB of static memory", GiB(it1.end_allocated_bytes)),
      // Init and iteration 1.
      fmt::format("allocated is {} GiB after init", GiB(init.end_allocated_bytes)),
      fmt::format("reserved is {} GiB", GiB(init.end_reserved_bytes)),
      fmt::format("{} GiB of activations at the iteration-1 peak",
                  GiB(Cat(it1.by_category_at_peak, Category::kActivations))),
      fmt::format("iteration 1 peaks at {} GiB allocated", GiB(it1.peak_allocated_bytes)),
      fmt::format("reserved stands at {} GiB after iteration 1", GiB(it1.end_reserved_bytes)),
      // Iteration 2: the optimizer states raise the floor.
      fmt::format("iteration 2 starts at {} GiB", GiB(it2.start_allocated_bytes)),
      fmt::format("iteration 2 peaks at {} GiB allocated", GiB(it2.peak_allocated_bytes)),
      fmt::format("reserved grows by {} GiB during iteration 2",
                  GiB(it2.end_reserved_bytes - it1.end_reserved_bytes)),
      fmt::format("by {} GiB in iteration 3 and by {} GiB in iteration 4",
                  GiB(it3.end_reserved_bytes - it2.end_reserved_bytes),
                  GiB(it4.end_reserved_bytes - it3.end_reserved_bytes)),
      fmt::format("reserved stays at {} GiB", GiB(it4.end_reserved_bytes)),
      // npu-smi.
      fmt::format("npu-smi shows {} GiB", GiB(it4.end_device_bytes)),
      fmt::format("{} GiB more than reserved", GiB(outside)),
      fmt::format("{} communicators", stage.simulation.num_communicators),
      fmt::format("idle baseline: {} GiB", GiB(setup.device.idle_baseline_bytes)),
      fmt::format("runtime context: {} GiB", GiB(setup.device.context_bytes)),
  };
  const std::string doc = ReadDoc();
  REQUIRE_FALSE(doc.empty());
  std::string missing;
  for (const std::string& p : phrases) {
    if (doc.find(p) == std::string::npos) missing += "  " + p + "\n";
  }
  INFO("phrases the walkthrough must quote (from the current simulation):\n" << missing);
  CHECK(missing.empty());
}

TEST_CASE("the walkthrough and the README quote the whole current output of `memsim run`",
          "[docs]") {
  testing::ScratchDir dir("docs");
  const testing::CommandResult r = testing::RunMemsim(dir, "run --width 80");
  REQUIRE(r.exit_code == 0);
  INFO("current output:\n" << r.out);
  CHECK(ReadDoc().find("$ memsim run\n" + r.out + "```") != std::string::npos);
  CHECK(ReadDoc("README.md").find("$ build/memsim run\n" + r.out + "```") != std::string::npos);
}

// The number after `prefix` in `out` ("peak device (nvidia-smi) " -> 75.27).
double NumberAfter(const std::string& out, const std::string& prefix) {
  const size_t at = out.find(prefix);
  REQUIRE(at != std::string::npos);
  return std::stod(out.substr(at + prefix.size()));
}

TEST_CASE("docs/walkthrough.md quotes the Qwen DDP job's H100 variants", "[docs]") {
  testing::ScratchDir dir("docs");
  const std::string config =
      std::string(MEMSIM_SOURCE_DIR) + "/configs/qwen2.5-7b-ddp8-h200.json --device h100-80g "
      "--set training.optim=adamw_torch_fused --no-chart";
  const testing::CommandResult fused = testing::RunMemsim(dir, "run " + config);
  REQUIRE(fused.exit_code == 0);
  const double peak = NumberAfter(fused.out, "peak device (nvidia-smi) ");
  const testing::CommandResult fp32 =
      testing::RunMemsim(dir, "run " + config + " --set training.torch_dtype=float32");
  REQUIRE(fp32.exit_code == 0);
  const std::string doc = ReadDoc();
  // Headroom: "peak reserved + runtime R GiB of U GiB usable by the framework" -> U - R.
  const double needed = NumberAfter(fused.out, "peak reserved + runtime ");
  const std::string usable_line = fused.out.substr(fused.out.find("peak reserved + runtime "));
  const double usable = NumberAfter(usable_line, " GiB of ");
  const std::vector<std::string> phrases = {
      fmt::format("the job needs {:.1f} GiB on nvidia-smi", peak),
      fmt::format("with {:.1f} GiB to spare", usable - needed),
      fmt::format("the job would need\n{:.1f} GiB", NumberAfter(fp32.out, "peak device (nvidia-smi) ")),
  };
  std::string missing;
  for (const std::string& p : phrases) {
    if (doc.find(p) == std::string::npos) missing += "  " + p + "\n";
  }
  INFO("phrases the walkthrough must quote:\n" << missing);
  CHECK(missing.empty());
}

}  // namespace
}  // namespace memsim
