#include "cli/commands.h"
#include "core/error.h"

namespace memsim::cli {

// STUB: not implemented yet.
Action AddValidateCommand(CLI::App& sub) {
  (void)sub;
  return [] () -> int { throw UnsupportedError("this subcommand is not implemented yet"); };
}

}  // namespace memsim::cli
