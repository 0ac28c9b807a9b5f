#include "cli/commands.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace memsim::cli {
namespace {

constexpr Subcommand kSubcommands[] = {
    {"run", "simulate a training config and print per-iteration memory", &AddRunCommand},
    {"explain", "say in words what each span of the run creates, keeps and frees, and why",
     &AddExplainCommand},
    {"replay", "replay an allocator trace (CSV or PyTorch snapshot) through the model",
     &AddReplayCommand},
    {"compare", "compare a real memory profile with the simulation", &AddCompareCommand},
    {"plan", "which parallel layouts fit the devices, each simulated in full, ranked",
     &AddPlanCommand},
    {"check", "memory gates for CI: fail when a config would not fit or grew", &AddCheckCommand},
    {"validate", "parse, check and resolve configs without simulating", &AddValidateCommand},
    {"dump-program", "print the per-rank Program (one op a line)", &AddDumpProgramCommand},
};

// "unknown option '--iteration' (did you mean '--iterations'?)" for the first "--name" of the
// subcommand's words (before a bare "--") that it does not define; "" when there is none.
std::string UnknownOption(CLI::App& app, int argc, char** argv) {
  if (argc < 2) return "";
  CLI::App* sub = nullptr;
  for (const Subcommand& s : kSubcommands) {
    if (s.name == argv[1]) sub = app.get_subcommand(std::string(s.name));
  }
  if (sub == nullptr) return "";
  std::vector<std::string> names = {"--help"};
  for (const CLI::Option* o : sub->get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
  }
  for (int i = 2; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (!word.starts_with("--")) continue;
    const std::string name = word.substr(0, word.find('='));
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    std::string message = fmt::format("unknown option '{}'", name);
    const std::string guess = ClosestMatch(name, names);
    if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
    return message + fmt::format("; 'memsim {} --help' lists the options", sub->get_name());
  }
  return "";
}

// `--megatron-args -- ARGS`: CLI11 takes a "--" right after an option of optional value
// (--megatron-args FILE is optional) as the end of that option's values, not as the start of
// the positional arguments, so ARGS were read as memsim's options ("The following arguments
// were not expected"), while `--megatron-args --device X -- ARGS` worked. A second "--" there
// makes both spellings one.
std::vector<char*> WithPositionalSeparator(int argc, char** argv) {
  std::vector<char*> out(argv, argv + argc);
  static char separator[] = "--";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string_view(argv[i + 1]) != "--") continue;
    if (std::string_view(argv[i]) == "--megatron-args") out.insert(out.begin() + i + 1, separator);
    break;  // only the first "--" separates
  }
  return out;
}

}  // namespace

int Main(int argc_in, char** argv_in) {
  std::vector<char*> args = WithPositionalSeparator(argc_in, argv_in);
  const int argc = static_cast<int>(args.size());
  char** argv = args.data();
  CLI::App app{"memsim: device-memory simulator for deep-learning training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("memsim ") + MEMSIM_VERSION);
  std::vector<std::pair<CLI::App*, Action>> actions;
  for (const Subcommand& s : kSubcommands) {
    CLI::App* sub = app.add_subcommand(std::string(s.name), std::string(s.summary));
    actions.emplace_back(sub, s.add(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    if (const std::string option = UnknownOption(app, argc, argv); !option.empty()) {
      message = option;
    }
    // "did you mean" for a mistyped subcommand.
    if (argc > 1 && argv[1][0] != '-') {
      std::vector<std::string> names;
      for (const Subcommand& s : kSubcommands) names.emplace_back(s.name);
      bool known = false;
      for (const std::string& n : names) known = known || n == argv[1];
      if (!known) {
        message = fmt::format("unknown subcommand '{}'", argv[1]);
        std::string guess = ClosestMatch(argv[1], names);
        if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
      }
    }
    std::fprintf(stderr, "memsim: %s\nRun 'memsim --help' for usage.\n", message.c_str());
    return 2;
  }
  for (auto& [sub, action] : actions) {
    if (!sub->parsed()) continue;
    try {
      const int code = action();
      // What went to standard output must have been written: `memsim validate --print-config >
      // c.json` on a full disk (or > /dev/full) exited 0 with c.json cut short.
      const bool flushed = std::fflush(stdout) == 0;
      if (!flushed || std::ferror(stdout)) {
        // errno is the flush's own; an earlier failed write left only the stream's error flag.
        std::fprintf(stderr, "memsim %s: standard output: cannot write: %s\n",
                     sub->get_name().c_str(), flushed ? "a write failed" : std::strerror(errno));
        return 2;
      }
      return code;
    } catch (const InputError& e) {
      std::fprintf(stderr, "memsim %s: %s\n", sub->get_name().c_str(), e.what());
      return 2;
    } catch (const std::exception& e) {
      // A library error that escaped its boundary (file system, allocation): still one line and
      // exit 2, never a crash.
      std::fprintf(stderr, "memsim %s: error: %s\n", sub->get_name().c_str(), e.what());
      return 2;
    }
  }
  return 2;
}

}  // namespace memsim::cli
