// memsim run [CONFIG] ... (docs/interfaces.md, 'Command line').
#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "config/load.h"
#include "core/error.h"
#include "engine/stages.h"
#include "export/exports.h"
#include "report/chart.h"
#include "report/format.h"
#include "report/moe_routing.h"
#include "report/run_report.h"
#include "report/steps.h"

namespace memsim::cli {
namespace {

// Rows of the iteration table (init and the first steps) when the steps vary in length; the rest
// are summarised by report::FormatSteps.
constexpr size_t kVaryingTableRows = 11;

struct RunArgs {
  std::string config;
  ConfigArgs load;
  int pipeline_rank = kNotGiven;
  std::string capacity;
  bool capacity_given = false;
  std::string json_path;
  std::string csv_path;
  std::string steps_csv_path;
  std::string html_path;
  std::string trace_path;
  std::string snapshot_path;
  int snapshot_iterations = kNotGiven;  // --snapshot-iterations; kNotGiven: the default window
  bool no_chart = false;
  bool megatron_report = false;
  bool verbose = false;
  int width = kNotGiven;
  MegatronArgs megatron;
  std::vector<std::string> trailing;  // with --megatron-args: the arguments after `--`
};

// `--csv`: the rows written to a temporary file as the simulation produces them (never held;
// report::WriteFilesAtomically renames it into place with the other outputs).
class CategoryCsvFile final : public exports::CategorySampleSink {
 public:
  explicit CategoryCsvFile(const std::string& path) : file_(path) {
    file_.Append(exports::CategoryCsvHeader());
  }
  void OnSample(const exports::CategorySample& sample) override {
    row_.clear();
    exports::AppendCategoryCsvRow(row_, sample);
    file_.Append(row_);
  }
  report::StreamedFile& file() { return file_; }

 private:
  report::StreamedFile file_;
  std::string row_;
};

// What --snapshot left out of FILE (said, never silently dropped), or "".
std::string SnapshotNote(const exports::RunDetail& detail, const std::string& path,
                         int iterations, int simulated) {
  const size_t kept = exports::SnapshotEventsKept(detail, iterations);
  const size_t all = detail.allocator_events.size();
  if (kept == all) return "";
  return fmt::format(
      "--snapshot {}: init and iterations 1..{} of the {} simulated: {} of {} allocator "
      "events (the default keeps at most {}, which pytorch.org/memory_viz holds in the "
      "browser); --snapshot-iterations N names the window (0: every iteration)\n",
      path, iterations, simulated, kept, all, exports::kSnapshotEntryBudget);
}

// --csv, --trace, --snapshot, --html: the reported stage simulated once more with the detail
// they need (export/detail.h); --html every stage again, for its stage selector. --csv is
// streamed into `*csv`; the other files are rendered into `files`.
void AddExports(const RunArgs& a, const config::Setup& setup, const engine::RunResult& run,
                std::vector<std::pair<std::string, std::string>>* files,
                std::unique_ptr<CategoryCsvFile>* csv, std::string* notes) {
  if (!a.csv_path.empty() || !a.trace_path.empty() || !a.snapshot_path.empty()) {
    exports::DetailOptions options;
    options.simulate.usable_memory_bytes = run.usable_memory_bytes;
    options.allocator_events = !a.snapshot_path.empty();
    // --csv alone needs neither the samples nor the ops held.
    const bool held = !a.trace_path.empty() || !a.snapshot_path.empty();
    options.keep_samples = held;
    options.keep_ops = held;
    if (!a.csv_path.empty()) {
      *csv = std::make_unique<CategoryCsvFile>(a.csv_path);
      options.sample_sink = csv->get();
    }
    // The iterations the table shows: a long run's steady state repeats (engine/stages.h).
    const exports::RunDetail detail =
        exports::CollectRunDetail(engine::SimulatedSetup(setup, run), run.reported_stage, options);
    if (!a.trace_path.empty()) {
      files->emplace_back(a.trace_path, exports::ChromeTraceJson(detail));
    }
    if (!a.snapshot_path.empty()) {
      const int window = a.snapshot_iterations == kNotGiven
                             ? exports::DefaultSnapshotIterations(detail)
                             : a.snapshot_iterations;
      files->emplace_back(a.snapshot_path, exports::MemorySnapshotPickle(detail, window));
      *notes += SnapshotNote(detail, a.snapshot_path, window, run.simulated_iterations);
    }
  }
  if (a.html_path.empty()) return;
  exports::HtmlInput html;
  html.header = report::FormatRunHeader(run, setup);
  html.title = exports::TitleOf(html.header);
  // The verdict and its caveat (flags not modelled) beside the header, as `run` prints them.
  const std::string oom = report::FormatOom(run) + report::FormatNotModelledCaveat(run, setup);
  if (!oom.empty()) html.header += "\n" + oom;
  html.table = report::FormatIterationTable(run, 100);
  html.stages = exports::CollectStageDetails(setup, run);
  html.reported_stage = run.reported_stage;
  files->emplace_back(a.html_path, exports::HtmlReport(html));
}

int Run(const RunArgs& a) {
  // Every option is checked before the simulation, so a typo costs no waiting.
  const int width = TerminalWidth(a.width);
  const std::vector<std::string> outputs = {a.json_path, a.csv_path, a.steps_csv_path, a.html_path, a.trace_path,
                                            a.snapshot_path};
  report::CheckOutputs(outputs, {a.config, a.load.model, a.load.device, a.megatron.file});
  config::LoadOptions load = ToLoadOptions(a.load);
  std::optional<Bytes> capacity;
  if (a.capacity_given) capacity = ParseSizeArg(a.capacity, "--capacity");
  load.capacity_bytes = capacity;
  const config::Setup setup = LoadConfigOrLaunch(a.config, a.trailing, a.megatron, load);
  PrintWarnings(setup);
  report::CheckOutputs(outputs, {setup.model_path, setup.device_path});

  engine::RunOptions options;
  options.usable_memory_bytes = capacity;
  options.pipeline_rank = CheckPipelineRank(a.pipeline_rank, setup);
  options.keep_timeline = !a.no_chart;
  // --csv is written by the exports (AddExports: the reported stage simulated once more, with a
  // column per category), streamed to its file as that simulation goes.
  ProgressLine progress;
  options.progress = [&progress](const engine::RunProgress& p) {
    progress.Update(p.stages == 1 ? fmt::format("simulating {} iterations", p.iterations)
                                  : fmt::format("simulating {} iterations of {} pipeline stages",
                                                p.iterations, p.stages),
                    p.stages_done / p.stages);
  };
  const engine::RunResult run = engine::RunAllStages(setup, options);
  progress.Done();

  std::string out = report::FormatRunHeader(run, setup);
  if (a.verbose) out += FormatVerboseNotes(setup);
  out += "\n";
  const std::string oom = report::FormatOom(run) + report::FormatNotModelledCaveat(run, setup);
  if (!oom.empty()) out += oom + "\n";
  // Steps of varying length: the first rows, then the distribution over all of them.
  const bool varies = setup.training.data.Varies();
  out += report::FormatIterationTable(run, width, varies ? kVaryingTableRows : 0);
  out += report::FormatSteps(run, setup);
  out += report::FormatMoeRouting(setup, run, capacity);
  if (!a.no_chart) {
    report::ChartOptions chart;
    chart.width = width;
    chart.height = width >= 120 ? 16 : 12;
    chart.title = fmt::format("\nmemory of pipeline stage {} over init and {} iterations (GiB)",
                              run.Reported().pipeline_rank, run.simulated_iterations);
    out += report::FormatChart(run.timeline, chart);
  }
  if (a.megatron_report) out += "\n" + report::FormatMegatronLines(run, setup);
  // Files first, so a failed write (exit 2) leaves no partial report on stdout either.
  std::vector<std::pair<std::string, std::string>> files;
  if (!a.json_path.empty()) files.emplace_back(a.json_path, report::RunReportJson(run, setup));
  if (!a.steps_csv_path.empty()) {
    files.emplace_back(a.steps_csv_path, report::FormatStepsCsv(run, setup));
  }
  std::unique_ptr<CategoryCsvFile> csv;
  std::string notes;
  AddExports(a, setup, run, &files, &csv, &notes);
  out += notes.empty() ? "" : "\n" + notes;
  std::vector<report::StreamedFile*> streamed;
  if (csv) streamed.push_back(&csv->file());
  report::WriteFilesAtomically(files, streamed);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

Action AddRunCommand(CLI::App& sub) {
  auto a = std::make_shared<RunArgs>();
  sub.add_option("config", a->config, "training config (JSON) or fine-tuning recipe (LLaMA-Factory, axolotl, TRL YAML); the embedded default if omitted");
  AddConfigOptions(sub, a->load, /*with_iterations=*/true);
  sub.add_option("--pipeline-rank", a->pipeline_rank,
                 "report this pipeline stage (default: the worst)")
      ->check(NotSentinel);
  sub.add_option("--capacity", a->capacity,
                 "usable device memory, e.g. 60GiB (replaces the preset's)");
  sub.add_option("--json", a->json_path, "write the JSON report (schema 1) to FILE")
      ->check(NonEmpty);
  sub.add_option("--csv", a->csv_path,
                 "write the timeline as CSV to FILE (totals and one column per category)")->check(NonEmpty);
  sub.add_option("--steps-csv", a->steps_csv_path,
                 "write one CSV row per step to FILE (its micro-batches' lengths, peaks, "
                 "reserved - allocated)")
      ->check(NonEmpty);
  sub.add_option("--html", a->html_path,
                 "write a self-contained HTML report (zoomable curves, categories) to FILE")
      ->check(NonEmpty);
  sub.add_option("--trace", a->trace_path,
                 "write a Chrome / Perfetto trace (JSON; ui.perfetto.dev) to FILE")
      ->check(NonEmpty);
  sub.add_option("--snapshot", a->snapshot_path,
                 "write a PyTorch memory snapshot (pickle; pytorch.org/memory_viz) to FILE")
      ->check(NonEmpty);
  sub.add_option("--snapshot-iterations", a->snapshot_iterations,
                 "the --snapshot window: init and the first N iterations (0: every simulated "
                 "iteration; default: all that fit in 300,000 trace entries)")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--no-chart", a->no_chart, "do not print the terminal chart");
  sub.add_flag("--megatron-report", a->megatron_report,
               "print Megatron's report_memory line after each iteration");
  sub.add_flag("--verbose", a->verbose, "list ignored keys and defaults taken");
  sub.add_option("--width", a->width,
                 "terminal width for the table and chart (default $COLUMNS or 80)")
      ->check(NotSentinel);
  sub.add_option("args", a->trailing, "with --megatron-args: the training arguments after --");
  AddMegatronOptions(sub, a->megatron);
  // Hidden (empty group): the equivalence test's switch to the whole-Program path.
  CLI::Option* capacity = sub.get_option("--capacity");
  return [a, capacity] {
    a->capacity_given = capacity->count() > 0;
    return Run(*a);
  };
}

}  // namespace memsim::cli
