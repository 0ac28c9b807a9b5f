// The table of subcommands (ninja style): each entry names a subcommand, its one-line summary,
// and a function that declares its options on a CLI11 sub-app and returns the action to run
// after parsing. cli/ is the only module that includes CLI11.
#pragma once

#include <functional>
#include <string_view>

#include <CLI/CLI.hpp>

#include "cli/main_entry.h"

namespace memsim::cli {

// Runs the parsed subcommand; returns the process exit code (0 ok, 1 check failed, 2 bad input).
// May throw InputError (reported by Main as one line, exit 2).
using Action = std::function<int()>;

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  Action (*add)(CLI::App& sub);
};

Action AddRunCommand(CLI::App& sub);
Action AddReplayCommand(CLI::App& sub);
Action AddCompareCommand(CLI::App& sub);
Action AddCheckCommand(CLI::App& sub);
Action AddValidateCommand(CLI::App& sub);
Action AddDumpProgramCommand(CLI::App& sub);
Action AddExplainCommand(CLI::App& sub);
Action AddPlanCommand(CLI::App& sub);

}  // namespace memsim::cli
