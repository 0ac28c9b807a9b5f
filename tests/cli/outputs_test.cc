// The output files of every command that writes some (check, compare, replay, plan; run's own
// cases are in run_command_test.cc): a named pipe with no reader is refused at once instead of
// blocking open(2) (fifo(7)), and an output that cannot be written (/dev/full: open(2) succeeds,
// every write fails with ENOSPC, null(4)) leaves none of the command's other outputs behind and
// says which were not written (report/format.h WriteFilesAtomically).
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>

#include "cli/cli_test_util.h"

namespace memsim::outputs_test {
namespace {

using testing::ReadAll;
using testing::RunMemsim;
using testing::ScratchDir;

const std::string kSource = MEMSIM_SOURCE_DIR;
const std::string kConfig = kSource + "/configs/default.json";
const std::string kSimulated = kSource + "/tests/profile/data/memsim.csv";
const std::string kProfile = kSource + "/tests/profile/data/nvidia_smi.csv";
const std::string kTrace = kSource + "/tests/cli/data/replay_small.csv";
// One layout (every plan key fixed) of a small model: the plan command's cheapest real run.
const std::string kPlan =
    "plan --model qwen2.5-0.5b --devices 4 --global-batch-size 8 --seq-length 1024 --fix tp=1 "
    "--fix pp=1 --fix mbs=1 --fix recompute=none --fix dist_opt=true --top 1";

// `memsim ARGS` run in `dir` under timeout(1), which turns a hang (open(2) of a FIFO blocking
// until a reader comes) into exit 124 rather than a stuck test; returns the exit code and stderr.
testing::CommandResult RunWithTimeout(const ScratchDir& dir, const std::string& args) {
  const std::string err = dir.path().string() + ".timeout-err";
  const std::string cmd = "cd '" + dir.path().string() + "' && timeout 120 '" MEMSIM_BINARY "' " +
                          args + " > /dev/null 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  testing::CommandResult r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, "", ReadAll(err)};
  std::filesystem::remove(err);
  return r;
}

std::string FifoMessage(const std::string& command) {
  return "memsim " + command + ": out.fifo: cannot write: a named pipe (FIFO) with no reader; "
         "start its reader first or choose a regular file\n";
}

TEST_CASE("outputs: a named pipe with no reader is refused at once by every writing command",
          "[cli]") {
  ScratchDir dir("outputs");
  REQUIRE(::mkfifo((dir.path() / "out.fifo").c_str(), 0600) == 0);
  struct Case {
    std::string command;  // as the message names it
    std::string args;     // with out.fifo for one output
  };
  const Case cases[] = {
      {"check", "check " + kConfig + " --json out.fifo"},
      {"check", "check " + kConfig + " --junit out.fifo"},
      {"compare", "compare --simulated " + kSimulated + " --profile " + kProfile +
                      " --no-chart --json out.fifo"},
      {"compare", "compare --simulated " + kSimulated + " --profile " + kProfile +
                      " --no-chart --html out.fifo"},
      {"replay", "replay " + kTrace + " --json out.fifo"},
      {"replay", "replay " + kTrace + " --csv out.fifo"},
      {"plan", kPlan + " --json out.fifo"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const testing::CommandResult r = RunWithTimeout(dir, c.args);
    CHECK(r.exit_code == 2);
    CHECK(r.err == FifoMessage(c.command));
  }
}

// `args` writes /dev/full and `regular` (a file in the scratch directory): exit 2, the message
// names /dev/full and says `regular` (its name or the start of it) was not written, and no `regular` (nor its temporary) is left.
void CheckNothingWritten(const std::string& command, const std::string& args,
                         const std::string& regular) {
  ScratchDir dir("outputs");
  INFO(args);
  const auto r = RunMemsim(dir, args);
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim " + command + ": /dev/full: cannot write: ", 0) == 0);
  CHECK(r.err.find("; not written either: " + regular) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.out.empty());
  // Nothing at all in the directory: neither the output nor a temporary of it.
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("outputs: a failed write leaves none of the other outputs of any command", "[cli]") {
  CheckNothingWritten("check", "check " + kConfig + " --junit /dev/full --json ok.json",
                      "ok.json");
  CheckNothingWritten("check", "check " + kConfig + " --json /dev/full --junit ok.xml", "ok.xml");
  // A baseline directory is made only when the baselines are written.
  CheckNothingWritten("check",
                      "check " + kConfig + " --baseline base/ --update-baseline --json /dev/full",
                      "base/default.json");
  CheckNothingWritten("compare",
                      "compare --simulated " + kSimulated + " --profile " + kProfile +
                          " --no-chart --html /dev/full --json ok.json",
                      "ok.json");
  CheckNothingWritten("replay", "replay " + kTrace + " --json /dev/full --csv ok.csv", "ok.csv");
  // The CSV is streamed as the replay goes (replay::CsvReplay): its failure is found at the end,
  // and the JSON, a regular file, is not written either.
  CheckNothingWritten("replay", "replay " + kTrace + " --csv /dev/full --json ok.json", "ok.json");
  // --write-config's directory is made only when the configs are written.
  CheckNothingWritten("plan", kPlan + " --json /dev/full --write-config plans",
                      "plans/plan-01-");
}

}  // namespace
}  // namespace memsim::outputs_test
