// Helpers shared by the subcommands: argument parsing that reports InputError with the option's
// name, and terminal width.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::cli {

// "80GiB", "512MiB", "1000000" (bytes), "80GB" (10^9). Throws InputError naming `option`.
Bytes ParseSizeArg(std::string_view text, std::string_view option);
// "5" or "5%" -> 5.0; must be in [0, 100). Throws InputError naming `option`.
double ParsePercentArg(std::string_view text, std::string_view option);
// -1 = not given -> nullopt; else checks 0 <= r < pipeline_model_parallel_size.
std::optional<int> CheckPipelineRank(int rank, const config::Setup& setup);
// `requested` if > 0, else $COLUMNS if it is a number >= 40, else 80.
int TerminalWidth(int requested);
// The loader's notes (ignored model keys, defaults taken), one per line, for --verbose.
std::string FormatVerboseNotes(const config::Setup& setup);

}  // namespace memsim::cli
