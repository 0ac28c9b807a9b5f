// memsim dump-program CONFIG: the per-rank Program, one op a line (design.md "Command line").
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
  std::string model;
  std::string device;
  std::vector<std::string> sets;
  int pipeline_rank = 0;
  int iterations = 0;
};

int Dump(const DumpArgs& a) {
  config::LoadOptions load;
  load.model_path = a.model;
  load.device = a.device;
  load.overrides = a.sets;
  if (a.iterations > 0) load.overrides.push_back("training.train_iters=" + std::to_string(a.iterations));
  const config::Setup setup = config::LoadSetup(a.config, load);
  const int rank = CheckPipelineRank(a.pipeline_rank, setup).value_or(0);
  const std::string text = workload::FormatProgram(workload::Build(setup, rank));
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

Action AddDumpProgramCommand(CLI::App& sub) {
  auto a = std::make_shared<DumpArgs>();
  sub.add_option("config", a->config, "training config (JSON); the embedded default if omitted");
  sub.add_option("--model", a->model, "model file, replaces the config's");
  sub.add_option("--device", a->device, "device preset name or preset file");
  sub.add_option("--set", a->sets, "override KEY=VALUE (training.<key> or allocator.<key>)")
      ->allow_extra_args(false);
  sub.add_option("--pipeline-rank", a->pipeline_rank, "the pipeline stage to print (default 0)");
  sub.add_option("--iterations", a->iterations, "training iterations (train_iters)")
      ->check(CLI::PositiveNumber);
  return [a] { return Dump(*a); };
}

}  // namespace memsim::cli
