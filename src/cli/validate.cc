// memsim validate CONFIG...: parse, check and resolve each config without simulating
// (docs/interfaces.md, 'Command line'). One line per config on stdout; errors on stderr; exit 0 iff
// all loaded, else 2.
#include <fmt/core.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "config/load.h"
#include "core/error.h"

namespace memsim::cli {
namespace {

struct ValidateArgs {
  std::vector<std::string> configs;
  ConfigArgs load;
  MegatronArgs megatron;
  bool verbose = false;
  bool print_config = false;
};

// The Setup of one config, or of the launch (--megatron-args: `configs` are then the arguments
// after --), with its warnings printed.
config::Setup LoadOne(const ValidateArgs& a, const std::string& path,
                      const config::LoadOptions& options) {
  const config::Setup s = a.megatron.given() ? LoadMegatronLaunch(a.megatron, a.configs, options)
                                             : config::LoadSetup(path, options);
  PrintWarnings(s);
  return s;
}

std::string Summary(const config::Setup& s) {
  const config::TrainingConfig& t = s.training;
  std::string line = fmt::format("{} on {}, TP{} PP{} DP{}", config::ModelName(s), s.device.name,
                                 t.tensor_model_parallel_size, t.pipeline_model_parallel_size,
                                 t.data_parallel_size);
  if (t.context_parallel_size > 1) line += fmt::format(" CP{}", t.context_parallel_size);
  line += fmt::format(", seq {}, micro-batch {}, {} micro-batches per iteration", t.seq_length,
                      t.micro_batch_size, t.num_micro_batches);
  return line;
}

}  // namespace

Action AddValidateCommand(CLI::App& sub) {
  auto args = std::make_shared<ValidateArgs>();
  sub.add_option("configs", args->configs,
                 "training config files (none: the embedded default; with --megatron-args: the "
                 "arguments after --)");
  AddConfigOptions(sub, args->load, /*with_iterations=*/false);
  sub.add_flag("--verbose", args->verbose, "list what was ignored or defaulted");
  sub.add_flag("--print-config", args->print_config,
               "print, instead of the summary, the JSON training config that reproduces the "
               "setup (a launch's translation with --megatron-args)");
  AddMegatronOptions(sub, args->megatron);
  return [args]() -> int {
    std::vector<std::string> configs = args->configs;
    if (configs.empty() || args->megatron.given()) configs = {""};
    if (args->print_config && configs.size() > 1) {
      std::fprintf(stderr, "memsim validate: --print-config: give one config\n");
      return 2;
    }
    const config::LoadOptions options = ToLoadOptions(args->load);
    int exit_code = 0;
    for (const std::string& path : configs) {
      try {
        const config::Setup s = LoadOne(*args, path, options);
        if (args->print_config) {
          std::printf("%s\n", s.reproducing_config.c_str());
          continue;
        }
        std::printf("ok: %s: %s\n", s.config_path.c_str(), Summary(s).c_str());
        if (args->verbose) {
          for (const std::string& n : s.notes) std::printf("  note: %s\n", n.c_str());
        }
      } catch (const InputError& e) {
        std::fprintf(stderr, "memsim validate: %s\n", e.what());
        exit_code = 2;
      }
    }
    std::fflush(stdout);
    return exit_code;
  };
}

}  // namespace memsim::cli
