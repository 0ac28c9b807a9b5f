// memsim run [CONFIG] ... (docs/interfaces.md, 'Command line').
#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "config/load.h"
#include "config/megatron_args.h"
#include "core/error.h"
#include "engine/stages.h"
#include "report/chart.h"
#include "report/format.h"
#include "report/run_report.h"

namespace memsim::cli {
namespace {

struct RunArgs {
  std::string config;
  ConfigArgs load;
  int pipeline_rank = kNotGiven;
  std::string capacity;
  bool capacity_given = false;
  std::string json_path;
  std::string csv_path;
  bool no_chart = false;
  bool megatron_report = false;
  bool verbose = false;
  int width = kNotGiven;
  // --megatron-args [FILE] (a launch script or a training log), or `-- ARGS...` (trailing).
  bool megatron = false;
  std::string megatron_file;
  std::vector<std::string> trailing;
  bool allow_unsupported = false;
};

// The Setup of a Megatron launch: FILE, or the words after `--` (CLI11 puts the first in
// `config`).
config::Setup LoadMegatron(const RunArgs& a, const config::LoadOptions& load) {
  config::MegatronLaunch launch;
  if (!a.megatron_file.empty()) {
    if (!a.config.empty()) throw InputError("--megatron-args FILE: give no training config too");
    launch = config::ReadMegatronArgsFile(a.megatron_file);
  } else {
    std::vector<std::string> words = a.trailing;
    if (!a.config.empty()) words.insert(words.begin(), a.config);
    if (words.empty()) throw InputError("--megatron-args: expected FILE, or -- ARGS...");
    launch = config::ReadCommandLineArguments(words);
  }
  return config::LoadSetupFromMegatron(launch, load, {a.allow_unsupported});
}

int Run(const RunArgs& a) {
  // Every option is checked before the simulation, so a typo costs no waiting.
  const int width = TerminalWidth(a.width);
  const std::vector<std::string> outputs = {a.json_path, a.csv_path};
  report::CheckOutputs(outputs, {a.config, a.load.model, a.load.device, a.megatron_file});
  config::LoadOptions load = ToLoadOptions(a.load);
  std::optional<Bytes> capacity;
  if (a.capacity_given) capacity = ParseSizeArg(a.capacity, "--capacity");
  load.capacity_bytes = capacity;
  if (!a.megatron && !a.trailing.empty()) {
    throw InputError(
        fmt::format("unexpected argument '{}' (one config per run; --set takes one "
                    "KEY=VALUE and is repeated for more)",
                    a.trailing[0]));
  }
  const config::Setup setup =
      a.megatron ? LoadMegatron(a, load) : config::LoadSetup(a.config, load);
  PrintWarnings(setup);
  report::CheckOutputs(outputs, {setup.model_path, setup.device_path});

  engine::RunOptions options;
  options.usable_memory_bytes = capacity;
  options.pipeline_rank = CheckPipelineRank(a.pipeline_rank, setup);
  options.keep_timeline = !a.no_chart;
  if (!a.csv_path.empty()) {  // full resolution, streamed to the file as the engine runs
    options.sample_sink = [&a](int) { return std::make_shared<report::CsvTimelineFile>(a.csv_path); };
  }
  ProgressLine progress;
  options.progress = [&progress](const engine::RunProgress& p) {
    const double fraction = (p.stage + p.stage_fraction) / p.stages;
    progress.Update(fmt::format("simulating {} iterations, stage {} of {}", p.iterations,
                                p.stage + 1, p.stages),
                    fraction);
  };
  const engine::RunResult run = engine::RunAllStages(setup, options);
  progress.Done();

  std::string out = report::FormatRunHeader(run, setup);
  if (a.verbose) out += FormatVerboseNotes(setup);
  out += "\n";
  const std::string oom = report::FormatOom(run);
  if (!oom.empty()) out += oom + "\n";
  out += report::FormatIterationTable(run, width);
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
  std::vector<report::StreamedFile*> streamed;
  const auto csv = std::static_pointer_cast<report::CsvTimelineFile>(run.sample_sink);
  if (csv) streamed.push_back(&csv->file());
  report::WriteFilesAtomically(files, streamed);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

Action AddRunCommand(CLI::App& sub) {
  auto a = std::make_shared<RunArgs>();
  sub.add_option("config", a->config, "training config (JSON); the embedded default if omitted");
  AddConfigOptions(sub, a->load, /*with_iterations=*/true);
  sub.add_option("--pipeline-rank", a->pipeline_rank,
                 "report this pipeline stage (default: the worst)");
  sub.add_option("--capacity", a->capacity,
                 "usable device memory, e.g. 60GiB (replaces the preset's)");
  sub.add_option("--json", a->json_path, "write the JSON report (schema 1) to FILE")
      ->check(NonEmpty);
  sub.add_option("--csv", a->csv_path, "write the timeline as CSV to FILE")->check(NonEmpty);
  sub.add_flag("--no-chart", a->no_chart, "do not print the terminal chart");
  sub.add_flag("--megatron-report", a->megatron_report,
               "print Megatron's report_memory line after each iteration");
  sub.add_flag("--verbose", a->verbose, "list ignored keys and defaults taken");
  sub.add_option("--width", a->width,
                 "terminal width for the table and chart (default $COLUMNS or 80)");
  sub.add_option("args", a->trailing, "with --megatron-args: the training arguments after --");
  CLI::Option* megatron =
      sub.add_option("--megatron-args", a->megatron_file,
                     "read a Megatron-LM / MindSpeed-LLM launch script or training log (or the "
                     "arguments after --) instead of a config")
          ->expected(0, 1);
  sub.add_flag("--allow-unsupported", a->allow_unsupported,
               "with --megatron-args: run even with unsupported flags (ignored, with a warning)");
  CLI::Option* capacity = sub.get_option("--capacity");
  return [a, capacity, megatron] {
    a->capacity_given = capacity->count() > 0;
    a->megatron = megatron->count() > 0;
    return Run(*a);
  };
}

}  // namespace memsim::cli
