// Helpers shared by the subcommands: argument parsing that reports InputError with the option's
// name, and terminal width.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/load.h"
#include "config/setup.h"
#include "core/units.h"

namespace memsim::cli {

// The options every simulating subcommand takes to load a config: --model, --device, --set
// (repeatable, one KEY=VALUE each) and, where `with_iterations`, --iterations.
struct ConfigArgs {
  std::string model;
  std::string device;
  std::vector<std::string> sets;
  int iterations = -2147483647 - 1;  // kNotGiven
};
void AddConfigOptions(CLI::App& sub, ConfigArgs& args, bool with_iterations);
// The loader options they stand for. Throws InputError for a bad --iterations.
config::LoadOptions ToLoadOptions(const ConfigArgs& args);

// --megatron-args [FILE] (a Megatron-LM / MindSpeed-LLM launch script or training log, or the
// training arguments after `--`) and --allow-unsupported: a launch read instead of a training
// config (config/megatron_args.h), by run, explain, check and dump-program.
struct MegatronArgs {
  std::string file;
  bool allow_unsupported = false;
  std::vector<std::string> script_vars;  // --script-var NAME=VALUE, in order
  CLI::Option* option = nullptr;  // set by AddMegatronOptions
  bool given() const { return option != nullptr && option->count() > 0; }
};
void AddMegatronOptions(CLI::App& sub, MegatronArgs& args);
// The Setup of the launch: FILE, or `words` (the subcommand's positional words: with FILE they
// must be none; else the training arguments after `--`). Throws InputError.
config::Setup LoadMegatronLaunch(const MegatronArgs& args, const std::vector<std::string>& words,
                                 const config::LoadOptions& load);
// The Setup of `config` (LoadSetup), or of the launch when --megatron-args was given (`words`:
// the positional words after `config`, which without --megatron-args must be none); no warning
// printed.
config::Setup LoadConfigOrLaunch(const std::string& config, const std::vector<std::string>& words,
                                 const MegatronArgs& megatron, const config::LoadOptions& load);

// config::LoadSetup, then each of the Setup's warnings (keys given that do not act) on standard
// error as "warning: ...".
config::Setup LoadSetupAndWarn(const std::string& config_path, const config::LoadOptions& load);
void PrintWarnings(const config::Setup& setup);

// A CLI11 validator for options that name a file or a preset: an empty value is an error, not
// "not given" (`--json ""` would otherwise write nothing and exit 0), and so is a value starting
// with '-' other than "-" (standard input or output): CLI11 gives the option the next word
// whatever it is, so `--json --no-chart` means the file name was left out.
std::string NonEmpty(const std::string& value);
// A CLI11 validator for --set: a value starting with '-' is the next option, and one without
// '=' a KEY whose VALUE was written as the next word; both are refused.
std::string KeyValue(const std::string& value);

// The value of an int option the user did not give.
inline constexpr int kNotGiven = -2147483647 - 1;
// CLI11 validators for int options, run on the text before CLI11 converts it, so that text
// that is not an integer, or one beyond the range, is named in memsim's words ("--skip: -1 is
// out of range: expected a non-negative integer (0 to 2147483647)"). NotSentinel: any int but
// kNotGiven (-2147483648), for the options that default to it, so that giving it is never
// taken as "not given". NonNegativeInt: 0 and up. PositiveInt: 1 and up (for options whose 0
// means "not given").
std::string NotSentinel(const std::string& value);
std::string NonNegativeInt(const std::string& value);
std::string PositiveInt(const std::string& value);

// "80GiB", "512MiB", "1000000" (bytes), "80GB" (10^9), from 1 MiB to 1 PiB (2^50). Throws
// InputError naming `option`.
Bytes ParseSizeArg(std::string_view text, std::string_view option);
// "5" or "5%" -> 5.0; must be in [0, 100). Throws InputError naming `option`.
double ParsePercentArg(std::string_view text, std::string_view option);
// kNotGiven -> nullopt; else checks 0 <= r < pipeline_model_parallel_size.
std::optional<int> CheckPipelineRank(int rank, const config::Setup& setup);
// kNotGiven -> 0 (the config's train_iters); else checks iterations >= 1.
int CheckIterations(int iterations);
// `requested` (40..1000) if given, else $COLUMNS if it is a number in 40..1000, else the
// terminal's width when standard output is a terminal, else 80.
int TerminalWidth(int requested);
// The loader's notes (ignored model keys, defaults taken), one per line, for --verbose.
std::string FormatVerboseNotes(const config::Setup& setup);

// A progress line on standard error for work longer than about a second, shown only when
// standard error is a terminal (never in CI logs or redirected output), redrawn at most ten
// times a second and erased when the work is done (or the object destroyed).
class ProgressLine {
 public:
  ProgressLine();
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // `what` ("stage 2 of 8") and the fraction done in [0, 1].
  void Update(std::string_view what, double fraction);
  void Done();

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace memsim::cli
