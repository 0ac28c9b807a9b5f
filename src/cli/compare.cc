// memsim compare: a thin wrapper -- load the profile (profile/), simulate the config (engine/)
// or read a simulated memsim-csv, compare (compare/), print table + chart, write JSON.
#include "compare/compare.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "compare/diagnose.h"
#include "config/load.h"
#include "core/error.h"
#include "engine/stages.h"
#include "export/exports.h"
#include "profile/profile.h"
#include "report/format.h"
#include "report/run_report.h"
#include "workload/build.h"

namespace memsim::cli {
namespace {

struct CompareArgs {
  std::string config;
  std::string profile;
  std::string format = "auto";
  std::string simulated;
  int pipeline_rank = 0;
  CLI::Option* pipeline_rank_option = nullptr;  // count() > 0 when --pipeline-rank was given
  int skip = 0;
  int profile_iterations = 0;
  std::string tolerance;
  std::string json;
  std::string html;
  ConfigArgs load;
  int device_index = -1;
  int rank = -1;
  bool no_chart = false;
  int width = kNotGiven;
};

// What the diagnosis needs from the simulation of `setup`'s stage `rank`.
compare::SimulatedSide SimulatedSideOf(const config::Setup& setup, const engine::RunResult& run) {
  const engine::StageResult& stage = run.Reported();
  compare::SimulatedSide side;
  side.pipeline_rank = stage.pipeline_rank;
  side.fp16 = setup.training.precision == config::Precision::kFp16;
  for (const timeline::SpanSummary& s : stage.spans) {
    if (s.iteration > 0)
      side.iterations.push_back({s.iteration, s.by_category_at_peak, s.end_by_category});
  }
  const auto opt = static_cast<size_t>(Category::kOptimizerStates);
  if (const timeline::SpanSummary* first = stage.Span(1)) {
    side.optimizer_state_bytes = first->end_by_category[opt] - first->start_by_category[opt];
  }
  side.parameters_on_rank =
      workload::ComputeStaticSizes(setup, stage.pipeline_rank).parameter_count;
  side.closed_form_weight_and_optimizer_bytes =
      workload::ComputeClosedFormEstimate(setup, stage.pipeline_rank).weight_and_optimizer_bytes;
  return side;
}

// For the HTML overlay: the shift that puts the measured curve's first iteration on the simulated
// one's (each side's first sample of the lowest iteration >= 1 they both label), or the starts of
// both curves on each other when the profile labels none.
double MeasuredOffsetUs(const timeline::Timeline& measured, const timeline::Timeline& simulated) {
  auto first_of = [](const timeline::Timeline& t, int iteration) -> std::optional<double> {
    for (const timeline::Sample& s : t.samples) {
      if (s.iteration == iteration) return s.time_us;
    }
    return std::nullopt;
  };
  for (const timeline::Sample& s : measured.samples) {
    if (s.iteration < 1) continue;
    const std::optional<double> sim = first_of(simulated, s.iteration);
    if (sim) return *sim - s.time_us;
    break;
  }
  if (measured.samples.empty() || simulated.samples.empty()) return 0;
  return simulated.samples.front().time_us - measured.samples.front().time_us;
}

// The --format name, and the choice between CONFIG and --simulated with the options that only
// CONFIG's simulation takes. Throws InputError naming the option.
profile::Format CheckFormatAndSources(const CompareArgs& a) {
  auto format = profile::FormatFromName(a.format);
  if (!format) {
    std::vector<std::string> names;
    for (const profile::FormatInfo& row : profile::kFormatTable) names.emplace_back(row.name);
    const std::string guess = ClosestMatch(a.format, names);
    throw InputError(fmt::format(
        "--format: expected {}, got '{}'{}", profile::FormatNames(", ", " or "), a.format,
        guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess)));
  }
  if (a.config.empty() == a.simulated.empty()) {
    throw InputError("expected either CONFIG or --simulated FILE (exactly one)");
  }
  if (!a.simulated.empty()) {
    // These change (or pick a stage of) the simulation of CONFIG; a --simulated timeline has
    // none to change.
    const std::string given = !a.load.model.empty()    ? "--model"
                              : !a.load.device.empty() ? "--device"
                              : !a.load.sets.empty()   ? "--set"
                              : a.load.iterations != kNotGiven ? "--iterations"
                              : a.pipeline_rank_option != nullptr && a.pipeline_rank_option->count() > 0
                                  ? "--pipeline-rank"
                                  : "";
    if (!given.empty()) {
      throw InputError(fmt::format("{} applies to the CONFIG compare simulates; with --simulated "
                                   "{} there is no simulation to change",
                                   given, a.simulated));
    }
  }
  return *format;
}

// --rank picks a Megatron log's [Rank N] lines, --device-index the device of the other formats
// (a memsim-csv timeline holds one); given where they pick nothing in `measured` they would be
// ignored, so they are errors.
void CheckProfilePicks(const CompareArgs& a, const timeline::Timeline& measured) {
  const std::optional<profile::Format> read_as = profile::FormatFromName(measured.source);
  const bool per_rank = read_as == profile::Format::kMegatronLog;
  const bool one_device = read_as == profile::Format::kMemsimCsv;
  if (a.rank >= 0 && !per_rank) {
    throw InputError(fmt::format("--rank {}: applies to a Megatron log (its [Rank N] lines); {} "
                                 "is {}{}",
                                 a.rank, a.profile, measured.source,
                                 one_device ? "" : " (--device-index picks its device)"));
  }
  if (a.device_index >= 0 && (per_rank || one_device)) {
    throw InputError(fmt::format("--device-index {}: {} is {}, {}", a.device_index, a.profile,
                                 measured.source,
                                 per_rank ? "read per rank (--rank N picks one)"
                                          : "one device's timeline"));
  }
}

// The simulated side: CONFIG's stage simulated, or a --simulated memsim-csv read; what the
// diagnosis and (with --html) the HTML report take from it.
struct SimulatedInputs {
  timeline::Timeline timeline;
  compare::SimulatedSide side;
  exports::HtmlInput html;  // header and stages, with --html
};
SimulatedInputs SimulateOrRead(const CompareArgs& a) {
  SimulatedInputs in;
  if (!a.simulated.empty()) {
    in.timeline = profile::LoadProfile(a.simulated, profile::Format::kMemsimCsv);
    if (!a.html.empty()) {
      in.html.header = fmt::format("memsim compare: simulated {}\n", a.simulated);
      in.html.stages.push_back(exports::DetailFromTimeline(in.timeline));
    }
    return in;
  }
  const config::Setup setup = LoadSetupAndWarn(a.config, ToLoadOptions(a.load));
  report::CheckOutputs({a.json, a.html}, {setup.model_path, setup.device_path});
  engine::RunOptions run_options;
  run_options.pipeline_rank = CheckPipelineRank(a.pipeline_rank, setup);
  run_options.keep_timeline = true;
  engine::RunResult run = engine::RunAllStages(setup, run_options);
  if (a.pipeline_rank_option == nullptr || a.pipeline_rank_option->count() == 0) {
    run.reported_stage_chosen = false;  // stage 0 by default, not the user's choice
    run.reported_stage_default = true;
  }
  in.side = SimulatedSideOf(setup, run);
  if (!a.html.empty()) {
    in.html.header = report::FormatRunHeader(run, setup);
    in.html.stages = exports::CollectStageDetails(setup, run);
    in.html.reported_stage = run.reported_stage;
  }
  in.timeline = std::move(run.timeline);
  return in;
}

// What compare prints: the table, the diagnosis, the chart unless --no-chart.
std::string FormatCompareOutput(const CompareArgs& a, const compare::Report& report,
                                const timeline::Timeline& measured,
                                const compare::SimulatedSide& side, int width) {
  std::string out = compare::FormatTable(report, width);
  const std::string diagnosis =
      compare::FormatDiagnosis(compare::Diagnose(report, measured.statements, side), width);
  if (!diagnosis.empty()) out += diagnosis;
  if (!a.no_chart) {
    // The chart's axis labels take 12 columns.
    const std::string chart = compare::FormatChart(report, std::min(72, width - 12));
    if (!chart.empty()) out += "\n" + chart;
  }
  return out;
}

int RunCompare(const CompareArgs& a) {
  const profile::Format format = CheckFormatAndSources(a);
  report::CheckOutputs({a.json, a.html},
                       {a.config, a.profile, a.simulated, a.load.model, a.load.device});
  compare::CompareOptions options;
  options.skip = a.skip;
  options.profile_iterations = a.profile_iterations;
  options.pipeline_rank = a.pipeline_rank;
  if (!a.tolerance.empty()) options.tolerance_pct = ParsePercentArg(a.tolerance, "--tolerance");
  profile::LoadProfileOptions load;
  load.device_index = a.device_index;
  load.rank = a.rank;
  const timeline::Timeline measured = profile::LoadProfile(a.profile, format, load);
  CheckProfilePicks(a, measured);
  const int width = TerminalWidth(a.width);
  SimulatedInputs simulated = SimulateOrRead(a);
  options.format = measured.source;
  const compare::Report report = compare::Compare(measured, simulated.timeline, options);
  if (a.skip > 0 && report.measured_iterations > 0 && a.skip >= report.measured_iterations) {
    throw InputError(
        fmt::format("--skip {}: the profile {} has {} iteration(s); it would skip "
                    "all of them",
                    a.skip, a.profile, report.measured_iterations));
  }
  const std::string out = FormatCompareOutput(a, report, measured, simulated.side, width);
  // The files first, so a failed write (exit 2) leaves no report on stdout either.
  std::vector<std::pair<std::string, std::string>> files;
  if (!a.json.empty()) files.emplace_back(a.json, compare::FormatJson(report));
  if (!a.html.empty()) {
    exports::HtmlInput& html = simulated.html;
    html.title = fmt::format("{} against {}", exports::TitleOf(html.header), a.profile);
    html.table = compare::FormatTable(report, 100);
    html.measured = exports::MeasuredCurve{fmt::format("{} ({})", a.profile, measured.source),
                                           measured,
                                           MeasuredOffsetUs(measured, simulated.timeline)};
    files.emplace_back(a.html, exports::HtmlReport(html));
  }
  report::WriteFilesAtomically(files);
  std::fputs(out.c_str(), stdout);
  return report.failed ? 1 : 0;
}

}  // namespace

Action AddCompareCommand(CLI::App& sub) {
  auto a = std::make_shared<CompareArgs>();
  sub.add_option("CONFIG", a->config,
                 "training config to simulate (this or --simulated FILE is required)")
      ->check(NonEmpty);
  sub.add_option("--profile", a->profile, "the real profile: file, .gz file or *_ascend_pt folder")
      ->required()
      ->check(NonEmpty);
  sub.add_option("--format", a->format,
                 profile::FormatNames("|") + " (default auto: detected and reported)");
  sub.add_option("--simulated", a->simulated,
                 "a simulated timeline (memsim-csv from `memsim run --csv`) instead of CONFIG")
      ->check(NonEmpty);
  a->pipeline_rank_option =
      sub.add_option("--pipeline-rank", a->pipeline_rank, "simulated stage to compare with (default 0)")
          ->check(NonNegativeInt);
  sub.add_option("--skip", a->skip, "drop the profile's first N iterations")
      ->check(NonNegativeInt);
  sub.add_option("--profile-iterations", a->profile_iterations,
                 "how many iterations the profile covers when it has no markers")
      ->check(PositiveInt);
  sub.add_option("--tolerance", a->tolerance, "exit 1 when an overall peak error exceeds PCT");
  sub.add_option("--json", a->json, "write the comparison as JSON (schema_version 1)")
      ->check(NonEmpty);
  sub.add_option("--html", a->html,
                 "write a self-contained HTML report with the measured curves overlaid to FILE")
      ->check(NonEmpty);
  sub.add_option("--device-index", a->device_index,
                 "device in the profile (default: the lowest with data)")
      ->check(NonNegativeInt);
  sub.add_option("--rank", a->rank, "Megatron logs: global rank (default: the lowest)")
      ->check(NonNegativeInt);
  AddConfigOptions(sub, a->load, /*with_iterations=*/true);
  sub.add_flag("--no-chart", a->no_chart, "omit the overlay chart");
  sub.add_option("--width", a->width,
                 "fit the output to N columns (default: the terminal's, 80 when not a terminal)")
      ->check(NotSentinel);
  return [a]() -> int { return RunCompare(*a); };
}

}  // namespace memsim::cli
