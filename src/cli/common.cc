#include "cli/common.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "config/megatron_args.h"
#include "core/error.h"
#include "core/size.h"
#include "report/run_report.h"

namespace memsim::cli {

std::string NonEmpty(const std::string& value) {
  if (value.empty()) return "expected a path or a name, got an empty string";
  // CLI11 gives an option its one value whatever it looks like, so `--json --no-chart` would
  // write a file named "--no-chart": a value starting with '-' is the file name forgotten.
  if (value.starts_with('-') && value != "-") {
    return fmt::format("expected a file name, got the option '{}' (the file name is missing; "
                       "write ./{} for a file of that name)",
                       value, value);
  }
  return "";
}

std::string KeyValue(const std::string& value) {
  if (value.starts_with('-')) {
    return fmt::format("expected KEY=VALUE, got the option '{}' (the KEY=VALUE is missing)", value);
  }
  // `--set training.micro_batch_size 2` would otherwise take "2" as the config file.
  if (value.find('=') == std::string::npos) {
    return fmt::format("expected KEY=VALUE, got '{}' without '=' (write {}=VALUE as one word)",
                       value, value);
  }
  return "";
}

namespace {

// "" when `value` (blanks around it allowed) is a decimal integer from `lo` to `hi`, else the
// message: CLI11's own would say "Could not convert" for an integer beyond int, and print the
// range of CLI::NonNegativeNumber with 300 digits.
std::string IntegerIn(const std::string& value, std::int64_t lo, std::int64_t hi,
                      std::string_view expected) {
  std::string_view v = value;
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  std::int64_t n = 0;
  const char* begin = v.data() + (v.starts_with('+') ? 1 : 0);
  const auto [end, ec] = std::from_chars(begin, v.data() + v.size(), n);
  if (v.empty() || end != v.data() + v.size() || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return fmt::format("expected {}, got '{}'", expected, value);
  }
  if (ec == std::errc::result_out_of_range || n < lo || n > hi) {
    return fmt::format("{} is out of range: expected {} ({} to {})", v, expected, lo, hi);
  }
  return "";
}

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

}  // namespace

std::string NotSentinel(const std::string& value) {
  return IntegerIn(value, -kIntMax, kIntMax, "an integer");
}

std::string NonNegativeInt(const std::string& value) {
  return IntegerIn(value, 0, kIntMax, "a non-negative integer");
}

std::string PositiveInt(const std::string& value) {
  return IntegerIn(value, 1, kIntMax, "a positive integer");
}

void AddConfigOptions(CLI::App& sub, ConfigArgs& args, bool with_iterations) {
  sub.add_option("--model", args.model,
                 "shipped model name (llama3-8b, ...) or model file (Hugging Face config.json "
                 "form), replaces the config's")
      ->check(NonEmpty);
  sub.add_option("--device", args.device,
                 "device preset name or preset file, replaces the config's")
      ->check(NonEmpty);
  sub.add_option("--set", args.sets,
                 "override KEY=VALUE (training.<key> or allocator.<key>); one per --set, "
                 "repeat --set for more")
      ->allow_extra_args(false)
      ->option_text("KEY=VALUE")
      ->check(KeyValue);
  if (with_iterations) {
    sub.add_option("--iterations", args.iterations, "training iterations to simulate (train_iters)")
        ->check(PositiveInt);
  }
}

void AddMegatronOptions(CLI::App& sub, MegatronArgs& args) {
  args.option = sub.add_option("--megatron-args", args.file,
                               "read a Megatron-LM / MindSpeed-LLM launch script or training log "
                               "(or the arguments after --) instead of a config; words after FILE are the script's own arguments")
                    ->expected(0, 1);
  // Only a launch's flags are allowed through; a JSON config's unsupported keys stay errors, so
  // without --megatron-args the flag would be ignored without a word.
  sub.add_flag("--allow-unsupported", args.allow_unsupported,
               "with --megatron-args: run even with unsupported flags (ignored, with a warning)")
      ->needs(args.option);
  sub.add_option("--script-var", args.script_vars,
                 "with --megatron-args FILE: set the script's variable NAME to VALUE before its "
                 "first line and skip the script's own assignments to it; repeat for more")
      ->option_text("NAME=VALUE")
      ->allow_extra_args(false)
      ->needs(args.option);
}

namespace {

// A word ending as memsim's config files do (JSON, YAML, TOML).
bool LooksLikeConfigFile(const std::string& word) {
  for (const std::string_view ext : {".json", ".yaml", ".yml", ".toml"}) {
    if (word.size() > ext.size() && word.compare(word.size() - ext.size(), ext.size(), ext) == 0) {
      return true;
    }
  }
  return false;
}

// The reader's warnings about --script-var (where a pinned variable's own assignments were
// skipped, or that the script never uses it), one line each, for a refusal of the launch: a
// misspelt NAME, which changes nothing, is often why the script was refused.
std::string ScriptVarNotes(const config::MegatronLaunch& launch) {
  std::string notes;
  for (const std::string& w : launch.warnings) {
    if (w.find(": --script-var ") != std::string::npos) notes += "\n  note: " + w;
  }
  return notes;
}

// config::LoadSetupFromMegatron, its refusals carrying ScriptVarNotes.
config::Setup LoadLaunchTellingScriptVars(const config::MegatronLaunch& launch,
                                          const config::LoadOptions& load,
                                          bool allow_unsupported) {
  try {
    return config::LoadSetupFromMegatron(launch, load, {allow_unsupported});
  } catch (const UnsupportedError& e) {
    const std::string notes = ScriptVarNotes(launch);
    if (notes.empty()) throw;
    constexpr std::string_view kPrefix = "unsupported: ";  // UnsupportedError adds it again
    std::string what = e.what();
    if (what.starts_with(kPrefix)) what.erase(0, kPrefix.size());
    throw UnsupportedError(what + notes);
  } catch (const InputError& e) {
    const std::string notes = ScriptVarNotes(launch);
    if (notes.empty()) throw;
    throw InputError(e.what() + notes);
  }
}

}  // namespace

config::Setup LoadMegatronLaunch(const MegatronArgs& args, const std::vector<std::string>& words,
                                 const config::LoadOptions& load) {
  config::MegatronLaunch launch;
  if (!args.file.empty()) {
    // Words after the file are the launch script's own arguments ($1, $2, ...; "$@"), as
    // `bash FILE ARGS...` would give them (Pai-Megatron-Patch's run scripts take 27); a first
    // word that names a config file is a config given beside the launch, which is refused.
    if (!words.empty() && LooksLikeConfigFile(words[0])) {
      throw InputError(fmt::format("--megatron-args {}: give no training config too (got '{}')",
                                   args.file, words[0]));
    }
    std::vector<config::ScriptVariable> vars;
    for (const std::string& v : args.script_vars) {
      vars.push_back(config::ParseScriptVariable(v, "--script-var"));
    }
    launch = config::ReadMegatronArgsFile(args.file, words, vars);
  } else {
    if (words.empty()) throw InputError("--megatron-args: expected FILE, or -- ARGS...");
    if (!args.script_vars.empty()) {
      throw InputError(fmt::format("--script-var {}: only with --megatron-args FILE (a launch "
                                   "script); the arguments after -- have no variables",
                                   args.script_vars[0]));
    }
    launch = config::ReadCommandLineArguments(words);
  }
  config::Setup setup = LoadLaunchTellingScriptVars(launch, load, args.allow_unsupported);
  if (!args.file.empty() && !words.empty()) {
    setup.warnings.push_back(fmt::format("{}: read with the script arguments '{}' ($1 to ${})",
                                         args.file, fmt::join(words, " "), words.size()));
  }
  return setup;
}

config::Setup LoadConfigOrLaunch(const std::string& config, const std::vector<std::string>& words,
                                 const MegatronArgs& megatron, const config::LoadOptions& load) {
  if (!megatron.given()) {
    if (!words.empty()) {
      throw InputError(fmt::format("unexpected argument '{}' (one config per run; --set takes "
                                   "one KEY=VALUE and is repeated for more)",
                                   words[0]));
    }
    return config::LoadSetup(config, load);
  }
  std::vector<std::string> all = words;
  if (!config.empty()) all.insert(all.begin(), config);
  return LoadMegatronLaunch(megatron, all, load);
}

config::LoadOptions ToLoadOptions(const ConfigArgs& args) {
  config::LoadOptions load;
  load.model_path = args.model;
  load.device = args.device;
  load.overrides = args.sets;
  load.iterations = CheckIterations(args.iterations);
  return load;
}

Bytes ParseSizeArg(std::string_view text, std::string_view option) {
  const Bytes bytes = ParseSize(text, option);
  // A device smaller than 1 MiB or larger than 1 PiB is a typo, and larger values would
  // overflow the byte arithmetic downstream.
  if (bytes < kMiB || bytes > (Bytes{1} << 50)) {
    throw InputError(
        fmt::format("{} {}: expected a size from 1MiB to 1024TiB (2^50 bytes), e.g. 80GiB",
                    option, text));
  }
  return bytes;
}

double ParsePercentArg(std::string_view text, std::string_view option) {
  std::string_view s = text;
  if (!s.empty() && s.back() == '%') s.remove_suffix(1);
  double v = -1;
  // Plain decimal only: no exponent, hex, inf or nan.
  const auto [end, ec] =
      std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::fixed);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !(v >= 0.0) || v >= 100.0) {
    throw InputError(
        fmt::format("{} {}: expected a percentage in [0, 100), e.g. 5 or 5%", option, text));
  }
  return v;
}

std::optional<int> CheckPipelineRank(int rank, const config::Setup& setup) {
  if (rank == kNotGiven) return std::nullopt;
  const int p = setup.training.pipeline_model_parallel_size;
  if (rank < 0 || rank >= p) {
    throw InputError(fmt::format(
        "--pipeline-rank {}: expected 0..{} (pipeline_model_parallel_size {})", rank, p - 1, p));
  }
  return rank;
}

int CheckIterations(int iterations) {
  if (iterations == kNotGiven) return 0;
  if (iterations < 1) {
    throw InputError(
        fmt::format("--iterations {}: expected a positive number of iterations", iterations));
  }
  return iterations;
}

int TerminalWidth(int requested) {
  if (requested != kNotGiven) {
    if (requested < 40 || requested > 1000) {
      throw InputError(fmt::format("--width {}: expected 40 to 1000 columns", requested));
    }
    return requested;
  }
  if (const char* c = std::getenv("COLUMNS")) {
    int v = 0;
    const std::string_view s(c);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size() && v >= 40 && v <= 1000) return v;
  }
  // The terminal's own width when standard output is one (not in tests, pipes or files).
  winsize size{};
  if (::isatty(STDOUT_FILENO) == 1 && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 &&
      size.ws_col >= 40 && size.ws_col <= 1000) {
    return size.ws_col;
  }
  return 80;
}

std::string FormatVerboseNotes(const config::Setup& setup) {
  std::string out;
  for (const std::string& note : setup.notes) out += "  note: " + note + "\n";
  return out;
}

void PrintWarnings(const config::Setup& setup) {
  for (const std::string& w : report::WarningsWithEstimates(setup)) {
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
}

config::Setup LoadSetupAndWarn(const std::string& config_path, const config::LoadOptions& load) {
  config::Setup setup = config::LoadSetup(config_path, load);
  PrintWarnings(setup);
  return setup;
}

ProgressLine::ProgressLine()
    : enabled_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()), last_(start_) {}

ProgressLine::~ProgressLine() { Done(); }

void ProgressLine::Update(std::string_view what, double fraction) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < std::chrono::seconds(1) || now - last_ < std::chrono::milliseconds(100)) {
    return;
  }
  last_ = now;
  shown_ = true;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r\033[Kmemsim: %.*s, %3.0f%% (%.0f s)", static_cast<int>(what.size()),
               what.data(), 100.0 * std::clamp(fraction, 0.0, 1.0), seconds);
  std::fflush(stderr);
}

void ProgressLine::Done() {
  if (!shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace memsim::cli
