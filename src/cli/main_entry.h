// The command line's entry point, apart from the subcommand table (commands.h) so that main.cc
// does not include CLI11 (docs/ci.md, "Build time").
#pragma once

namespace memsim::cli {

// The whole command line: parses argv, runs the subcommand, maps errors to exit codes
// (0 ok, 1 a check failed, 2 bad input).
int Main(int argc, char** argv);

}  // namespace memsim::cli
