// The file exports of `memsim run` (export/exports.h) on the default config: the Perfetto trace's
// required fields, the per-category CSV, the snapshot's round trip through `memsim replay`'s
// reader and replayer, and the HTML report's offline rule.
#include "export/exports.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "alloc/allocator.h"
#include "cli/cli_test_util.h"
#include "config/load.h"
#include "engine/stages.h"
#include "replay/trace.h"

namespace memsim::exports {
namespace {

using nlohmann::json;

// The default config (embedded configs/default.json) shortened to 4 micro-batches and 3
// iterations (enough for lazy optimizer state and a repeated iteration; the exports' size grows
// with the run, their structure does not, and the sanitized pass of .ci/run runs these tests),
// its worst stage, detail with allocator events; computed once.
struct Default {
  config::Setup setup;
  engine::RunResult run;
  RunDetail detail;
};
const Default& DefaultRun() {
  static const Default d = [] {
    Default x;
    config::LoadOptions load;
    load.overrides = {"training.global_batch_size=16"};  // DP 4 x micro-batch 1 x 4 micro-batches
    load.iterations = 3;
    x.setup = config::LoadSetup("", load);
    x.run = engine::RunAllStages(x.setup, engine::RunOptions{});
    DetailOptions options;
    options.allocator_events = true;
    x.detail = CollectRunDetail(x.setup, x.run.reported_stage, options);
    return x;
  }();
  return d;
}

TEST_CASE("exports: the detail run is the run (same samples as the Timeline)", "[export]") {
  const Default& d = DefaultRun();
  REQUIRE(d.detail.samples.size() == d.run.timeline.samples.size());
  for (size_t i = 0; i < d.detail.samples.size(); ++i) {
    const CategorySample& s = d.detail.samples[i];
    const timeline::Sample& t = d.run.timeline.samples[i];
    CHECK(s.allocated_bytes == t.allocated_bytes);
    CHECK(s.reserved_bytes == t.reserved_bytes);
    CHECK(s.device_bytes == t.device_bytes);
    std::int64_t sum = 0;
    for (std::int64_t b : s.by_category) sum += b;
    CHECK(sum == s.allocated_bytes);  // categories sum to allocated (docs/architecture.md)
    if (sum != s.allocated_bytes) break;
  }
}

TEST_CASE("exports: a long run's stages are replayed over the iterations run simulated",
          "[export]") {
  // The shortened default with train_iters 1000: RunAllStages simulates
  // max(kMinSimulatedIterations 4, FirstRepeatingIteration 2 + 1) = 4 iterations
  // (config/iterations.h; docs/config.md, 'Long runs'). The
  // HTML report's stages are those 4 iterations again, sample for sample (tryout8 #1: all 1000).
  config::LoadOptions load;
  load.overrides = {"training.global_batch_size=16"};
  load.iterations = 1000;
  const config::Setup setup = config::LoadSetup("", load);
  const engine::RunResult run = engine::RunAllStages(setup, engine::RunOptions{});
  REQUIRE(run.IsLongRun());
  REQUIRE(run.simulated_iterations == 4);
  CHECK(engine::SimulatedSetup(setup, run).training.train_iters == 4);
  const std::vector<RunDetail> stages = CollectStageDetails(setup, run);
  REQUIRE(stages.size() == 1);
  CHECK(stages[0].spans.back().iteration == 4);
  REQUIRE(stages[0].samples.size() == run.timeline.samples.size());
  CHECK(stages[0].samples.back().allocated_bytes == run.timeline.samples.back().allocated_bytes);
}

TEST_CASE("exports: every Perfetto event has its required fields", "[export]") {
  const json trace = json::parse(ChromeTraceJson(DefaultRun().detail));
  REQUIRE(trace["traceEvents"].is_array());
  std::set<std::string> counters;
  int slices = 0;
  for (const json& e : trace["traceEvents"]) {
    INFO(e.dump());
    REQUIRE(e.contains("ph"));
    REQUIRE(e["ts"].is_number());
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    REQUIRE(e["name"].is_string());
    const std::string ph = e["ph"];
    if (ph == "C") {
      REQUIRE(e["args"].is_object());
      REQUIRE(!e["args"].empty());
      for (const auto& [k, v] : e["args"].items()) REQUIRE(v.is_number());
      counters.insert(e["name"].get<std::string>());
    } else if (ph == "X") {
      REQUIRE(e["dur"].is_number());
      REQUIRE(e["dur"].get<double>() >= 0);
      ++slices;
    } else {
      REQUIRE(ph == "M");
    }
  }
  CHECK(counters.count("allocated") == 1);
  CHECK(counters.count("reserved") == 1);
  CHECK(counters.count("device") == 1);
  CHECK(counters.count("category parameters") == 1);
  CHECK(counters.count("category optimizer_states") == 1);
  // One slice per op, one per span (init + 4 iterations), one per phase marker.
  CHECK(slices == static_cast<int>(DefaultRun().detail.ops.size() + DefaultRun().detail.spans.size() +
                                   DefaultRun().detail.markers.size()));
}

TEST_CASE("exports: the CSV has one column per category beside the totals", "[export]") {
  const std::string csv = CategoryCsv(DefaultRun().detail);
  const std::string header = csv.substr(0, csv.find('\n'));
  CHECK(header ==
        "time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes,"
        "parameters_bytes,gradients_bytes,main_parameters_bytes,optimizer_states_bytes,"
        "activations_bytes,temporaries_bytes,communication_bytes,workspace_bytes,other_bytes");
  CHECK(std::count(csv.begin(), csv.end(), '\n') ==
        static_cast<long>(DefaultRun().detail.samples.size() + 1));
}

// The snapshot's device trace replayed by `memsim replay --backend npu` (ParseTrace + Replay on
// the config's allocator options) passes through every simulated (allocated, reserved) state in
// order: the simulated curves are a subsequence of the replayed ones, and the peaks and the
// final state are equal.
TEST_CASE("exports: the snapshot replays to the simulated curves exactly", "[export]") {
  const Default& d = DefaultRun();
  REQUIRE(d.setup.allocator.backend == alloc::Backend::kNpu);
  const std::string pickle = MemorySnapshotPickle(d.detail);
  const replay::Trace trace = replay::ParseTrace(pickle, "default.pickle", 0);
  alloc::AllocatorOptions options = d.setup.allocator;
  options.capacity_bytes.reset();  // replay's default: an unbounded device
  auto allocator = alloc::NewCachingAllocator(options);
  const replay::ReplayResult r = replay::Replay(trace, *allocator, /*keep_rows=*/true);
  size_t row = 0;
  size_t matched = 0;
  for (const CategorySample& s : d.detail.samples) {
    // Before the first allocation (the world's communicator is made at init) both curves are at
    // the empty state the replay starts from, before its first row.
    if (row == 0 && s.allocated_bytes == 0 && s.reserved_bytes == 0) {
      ++matched;
      continue;
    }
    while (row < r.rows.size() && (r.rows[row].allocated_bytes != s.allocated_bytes ||
                                   r.rows[row].reserved_bytes != s.reserved_bytes)) {
      ++row;
    }
    if (row == r.rows.size()) break;
    ++matched;
  }
  CHECK(matched == d.detail.samples.size());
  const engine::StageResult& stage = d.run.Reported();
  CHECK(r.stats.allocated_bytes.peak == stage.peak_allocated_bytes);
  CHECK(r.stats.reserved_bytes.peak == stage.peak_reserved_bytes);
  CHECK(r.stats.allocated_bytes.current == d.detail.samples.back().allocated_bytes);
  CHECK(r.stats.reserved_bytes.current == d.detail.samples.back().reserved_bytes);
  REQUIRE(trace.snapshot);
  CHECK(trace.snapshot->reserved_end_bytes == d.detail.samples.back().reserved_bytes);
  CHECK(trace.snapshot->skipped == 0);
}

TEST_CASE("exports: the HTML report holds no URL and inlines uPlot", "[export]") {
  const Default& d = DefaultRun();
  HtmlInput input;
  input.title = "default";
  input.stages = {d.detail};
  const std::string html = HtmlReport(input);
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=") == std::string::npos);
  CHECK(html.find("var uPlot=") != std::string::npos);
  CHECK(html.find("const DATA = ") != std::string::npos);
  CHECK(html.find("The MIT License") != std::string::npos);
}

// Both charts (the curves and the stacked categories) draw a mark at every iteration's start:
// the hook is on the options they share, and each span's start reaches the page.
TEST_CASE("exports: the HTML report marks where each iteration starts on every chart",
          "[export]") {
  const Default& d = DefaultRun();
  HtmlInput input;
  input.title = "default";
  input.stages = {d.detail};
  const std::string html = HtmlReport(input);
  CHECK(html.find("draw: [iterationMarks(stage)]") != std::string::npos);
  CHECK(html.find("const common = {") < html.find("draw: [iterationMarks(stage)]"));
  CHECK(html.find("...common, title: \"allocated, reserved") != std::string::npos);
  CHECK(html.find("...common, title: \"allocated by category") != std::string::npos);
  size_t starts = 0;
  for (size_t at = html.find("\"start_ms\":"); at != std::string::npos;
       at = html.find("\"start_ms\":", at + 1)) {
    ++starts;
  }
  CHECK(starts == d.detail.spans.size());  // init and 3 iterations
}

// The snapshot window: init and iterations 1..N. The kept entries are those before iteration
// N + 1's start; the segments are the state after them, so the pickle replays to the simulated
// state at that moment.
TEST_CASE("exports: a snapshot window keeps init and the first iterations", "[export]") {
  const Default& d = DefaultRun();  // 3 iterations
  REQUIRE(d.detail.spans.size() == 4);
  const size_t all = d.detail.allocator_events.size();
  CHECK(SnapshotEventsKept(d.detail, 0) == all);
  CHECK(SnapshotEventsKept(d.detail, 3) == all);
  CHECK(SnapshotEventsKept(d.detail, 5) == all);
  const size_t one = SnapshotEventsKept(d.detail, 1);
  const size_t two = SnapshotEventsKept(d.detail, 2);
  CHECK(one < two);
  CHECK(two < all);
  // Every kept event is before iteration 2's start, the next one at or after it.
  const timeline::SpanSummary& it2 = d.detail.spans[2];
  REQUIRE(it2.iteration == 2);
  CHECK(d.detail.allocator_events[one - 1].time_us < it2.start_time_us);
  CHECK(d.detail.allocator_events[one].time_us >= it2.start_time_us);
  // A short run fits the default budget whole.
  REQUIRE(all <= kSnapshotEntryBudget);
  CHECK(DefaultSnapshotIterations(d.detail) == 0);
  const replay::Trace trace =
      replay::ParseTrace(MemorySnapshotPickle(d.detail, 1), "window.pickle", 0);
  CHECK(trace.records.size() <= one);
  CHECK(trace.snapshot->entries == static_cast<std::int64_t>(one));
}

// The default snapshot window on a mixture-of-experts shipped config whose reported stage makes
// more allocator events than the budget (issue 32: Qwen3-30B-A3B's 1.3 million entries, 254 MB,
// did not open in pytorch.org/memory_viz). The whole run is over the budget; the window is then
// the most whole iterations from the first whose events fit (DefaultSnapshotIterations), and the
// pickle holds exactly those.
TEST_CASE("exports: an MoE shipped config's default snapshot window stays within the budget",
          "[export]") {
  config::LoadOptions load;
  const config::Setup setup =
      config::LoadSetup(std::string(MEMSIM_SOURCE_DIR) + "/configs/qwen3-30b-a3b-910b-pp4-ep4.json",
                        load);
  REQUIRE(setup.model.num_experts > 1);  // routed experts: the MoE path of the generator
  const engine::RunResult run = engine::RunAllStages(setup, engine::RunOptions{});
  DetailOptions options;
  options.allocator_events = true;
  const RunDetail detail =
      CollectRunDetail(engine::SimulatedSetup(setup, run), run.reported_stage, options);
  const size_t all = detail.allocator_events.size();
  REQUIRE(all > kSnapshotEntryBudget);
  const int window = DefaultSnapshotIterations(detail);
  REQUIRE(window >= 1);
  REQUIRE(window < run.simulated_iterations);
  const size_t kept = SnapshotEventsKept(detail, window);
  CHECK(kept <= kSnapshotEntryBudget);
  CHECK(SnapshotEventsKept(detail, window + 1) > kSnapshotEntryBudget);  // the widest that fits
  CHECK(kept < all);
  const std::string pickle = MemorySnapshotPickle(detail, window);
  const replay::Trace trace = replay::ParseTrace(pickle, "moe-window.pickle", 0);
  REQUIRE(trace.snapshot);
  CHECK(trace.snapshot->entries == static_cast<std::int64_t>(kept));
}

}  // namespace
}  // namespace memsim::exports

namespace memsim::exports {
namespace {

using memsim::testing::RunMemsim;
using memsim::testing::ScratchDir;

TEST_CASE("exports: run writes every file, replay reads its snapshot, bad pickles exit 2",
          "[export][cli]") {
  ScratchDir dir("exports");
  // Shortened like DefaultRun above.
  const auto run = RunMemsim(dir, "run --set training.global_batch_size=16 --iterations 3 "
                                  "--no-chart --json r.json --csv c.csv --trace t.json "
                                  "--snapshot s.pickle --html r.html");
  REQUIRE(run.exit_code == 0);
  for (const char* f : {"r.json", "c.csv", "t.json", "s.pickle", "r.html"}) {
    CAPTURE(f);
    CHECK(std::filesystem::file_size(dir.path() / f) > 0);
  }
  const auto replay = RunMemsim(dir, "replay s.pickle --backend npu --json replay.json");
  REQUIRE(replay.exit_code == 0);
  const json report = json::parse(memsim::testing::ReadAll(dir.path() / "r.json"));
  const json replayed = json::parse(memsim::testing::ReadAll(dir.path() / "replay.json"));
  INFO(replayed.dump().substr(0, 400));
  // The run report's stage peaks against the replay's allocator peaks.
  REQUIRE(report["stages"].size() == 1);  // the default config: PP1
  CHECK(replayed["peak"]["allocated_bytes"] == report["stages"][0]["peak_allocated_bytes"]);
  CHECK(replayed["peak"]["reserved_bytes"] == report["stages"][0]["peak_reserved_bytes"]);
  // A pickle with a class reference (GLOBAL os.system): refused, nothing run.
  dir.Write("evil.pickle", std::string("\x80\x02" "cos\nsystem\n.", 13));
  const auto evil = RunMemsim(dir, "replay evil.pickle");
  CHECK(evil.exit_code == 2);
  CHECK(evil.err.find("evil.pickle: pickle byte 2: unsupported opcode 0x63") != std::string::npos);
  dir.Write("old.pickle", std::string("\x80\x01}.", 4));
  const auto old = RunMemsim(dir, "replay old.pickle");
  CHECK(old.exit_code == 2);
  CHECK(old.err.find("old.pickle: a pickle of protocol 1; memsim reads pickled snapshots of "
                     "protocols 2 to 5") != std::string::npos);
}

}  // namespace
}  // namespace memsim::exports
