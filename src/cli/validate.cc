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
  bool verbose = false;
};

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
  sub.add_option("configs", args->configs, "training config files (none: the embedded default)");
  AddConfigOptions(sub, args->load, /*with_iterations=*/false);
  sub.add_flag("--verbose", args->verbose, "list what was ignored or defaulted");
  return [args]() -> int {
    std::vector<std::string> configs = args->configs;
    if (configs.empty()) configs.push_back("");
    const config::LoadOptions options = ToLoadOptions(args->load);
    int exit_code = 0;
    for (const std::string& path : configs) {
      try {
        const config::Setup s = LoadSetupAndWarn(path, options);
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
