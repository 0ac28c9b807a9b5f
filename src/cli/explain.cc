// memsim explain [CONFIG] ... : the run of one pipeline stage told in words (report/explain.h).
// Takes the options of `run` that choose what is simulated; the stage is the one `run` reports
// (the highest peak device memory) unless --pipeline-rank names one.
#include "report/explain.h"

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "config/load.h"
#include "engine/stages.h"
#include "report/run_report.h"

namespace memsim::cli {
namespace {

struct ExplainArgs {
  std::string config;
  ConfigArgs load;
  MegatronArgs megatron;
  std::vector<std::string> trailing;  // with --megatron-args: the arguments after `--`
  int pipeline_rank = kNotGiven;
  std::string capacity;
  bool capacity_given = false;
  bool verbose = false;
  int width = kNotGiven;
};

int Explain(const ExplainArgs& a) {
  config::LoadOptions load = ToLoadOptions(a.load);
  std::optional<Bytes> capacity;
  if (a.capacity_given) capacity = ParseSizeArg(a.capacity, "--capacity");
  load.capacity_bytes = capacity;
  const config::Setup setup = LoadConfigOrLaunch(a.config, a.trailing, a.megatron, load);
  PrintWarnings(setup);
  const int width = TerminalWidth(a.width);
  const std::optional<int> chosen = CheckPipelineRank(a.pipeline_rank, setup);
  // Every stage runs once without samples: the stage `run` reports, and whether (and where)
  // the job runs out of memory, which the narrative must not hide.
  engine::RunOptions run_options;
  run_options.usable_memory_bytes = capacity;
  run_options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(setup, run_options);
  const int rank = chosen.value_or(run.Reported().pipeline_rank);
  engine::SimulateOptions options;
  options.usable_memory_bytes = capacity;
  std::string out;
  if (a.verbose) out += FormatVerboseNotes(setup);
  out += report::FormatOom(run) + report::FormatNotModelledCaveat(run, setup);
  if (run.first_oom) {
    out +=
        "The explanation below follows the simulation past that point, as if the device were "
        "unbounded.\n\n";
  }
  // The iterations `run` simulated: in a long run the rest repeat its steady state, which
  // FormatLongRun says (engine::SimulatedSetup).
  report::ExplainFacts facts =
      report::CollectExplainFacts(engine::SimulatedSetup(setup, run), rank, options);
  facts.long_run = report::FormatLongRun(run);
  facts.stages = report::FormatStageComparison(setup, run);
  out += report::FormatExplanation(setup, facts, width);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

Action AddExplainCommand(CLI::App& sub) {
  auto a = std::make_shared<ExplainArgs>();
  sub.add_option("config", a->config, "training config (JSON) or fine-tuning recipe (LLaMA-Factory, axolotl, TRL YAML); the embedded default if omitted");
  AddConfigOptions(sub, a->load, /*with_iterations=*/true);
  sub.add_option("--pipeline-rank", a->pipeline_rank,
                 "explain this pipeline stage (default: the one `run` reports)")
      ->check(NotSentinel);
  sub.add_option("--capacity", a->capacity,
                 "usable device memory, e.g. 60GiB (replaces the preset's)");
  sub.add_flag("--verbose", a->verbose, "list ignored keys and defaults taken");
  sub.add_option("--width", a->width, "wrap lines at N columns (default $COLUMNS or 80)")
      ->check(NotSentinel);
  sub.add_option("args", a->trailing, "with --megatron-args: the training arguments after --");
  AddMegatronOptions(sub, a->megatron);
  CLI::Option* capacity = sub.get_option("--capacity");
  return [a, capacity] {
    a->capacity_given = capacity->count() > 0;
    return Explain(*a);
  };
}

}  // namespace memsim::cli
