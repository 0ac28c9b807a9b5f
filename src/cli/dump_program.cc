// memsim dump-program CONFIG: the per-rank Program, one op a line (docs/interfaces.md, 'Command
// line').
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "config/load.h"
#include "workload/build.h"
#include "workload/format.h"

namespace memsim::cli {
namespace {

struct DumpArgs {
  std::string config;
  ConfigArgs load;
  MegatronArgs megatron;
  std::vector<std::string> trailing;  // with --megatron-args: the arguments after `--`
  int pipeline_rank = kNotGiven;
};

int Dump(const DumpArgs& a) {
  const config::Setup setup =
      LoadConfigOrLaunch(a.config, a.trailing, a.megatron, ToLoadOptions(a.load));
  PrintWarnings(setup);
  const int rank = CheckPipelineRank(a.pipeline_rank, setup).value_or(0);
  const std::string text = workload::FormatProgram(workload::Build(setup, rank));
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

Action AddDumpProgramCommand(CLI::App& sub) {
  auto a = std::make_shared<DumpArgs>();
  sub.add_option("config", a->config, "training config (JSON) or fine-tuning recipe (LLaMA-Factory, axolotl, TRL YAML); the embedded default if omitted");
  AddConfigOptions(sub, a->load, /*with_iterations=*/true);
  sub.add_option("--pipeline-rank", a->pipeline_rank, "the pipeline stage to print (default 0)")
      ->check(NotSentinel);
  sub.add_option("args", a->trailing, "with --megatron-args: the training arguments after --");
  AddMegatronOptions(sub, a->megatron);
  return [a] { return Dump(*a); };
}

}  // namespace memsim::cli
