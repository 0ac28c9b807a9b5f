// A new user's tryout (2026-12-02): options that swallowed the next option as their file name,
// launch-script exports, near-miss keys and --capacity beyond the device. Each row runs the built
// binary: bad input exits 2 with a message naming the flag, a doubtful one warns.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli/cli_test_util.h"

namespace memsim {
namespace {

using testing::RunMemsim;
using testing::ScratchDir;

const std::string kSource = std::string(MEMSIM_SOURCE_DIR) + "/";

TEST_CASE("tryout: a file option followed by another option is a missing file name",
          "[cli][tryout]") {
  ScratchDir dir("tryout-dash");
  struct Row {
    std::string args;
    std::string message;  // after "memsim: "
  };
  const std::string profile = kSource + "tests/profile/data/memsim.csv";
  const Row rows[] = {
      {"run --json --no-chart", "--json: expected a file name, got the option '--no-chart'"},
      {"run --csv --html r.html", "--csv: expected a file name, got the option '--html'"},
      {"run --model --no-chart", "--model: expected a file name, got the option '--no-chart'"},
      {"run --set --no-chart", "--set: expected KEY=VALUE, got the option '--no-chart'"},
      {"explain --device --verbose", "--device: expected a file name, got the option '--verbose'"},
      {"compare --profile --no-chart", "--profile: expected a file name, got the option"},
      {"compare --profile " + profile + " --json --no-chart",
       "--json: expected a file name, got the option '--no-chart'"},
      {"check " + kSource + "configs/default.json --junit --json x.json",
       "--junit: expected a file name, got the option '--json'"},
      {"check " + kSource + "configs/default.json --baseline --update-baseline",
       "--baseline: expected a file name, got the option '--update-baseline'"},
      {"replay --json x.json --csv --backend", "--csv: expected a file name, got the option"},
      {"validate --set --verbose", "--set: expected KEY=VALUE, got the option '--verbose'"},
  };
  for (const Row& row : rows) {
    INFO(row.args);
    const auto r = RunMemsim(dir, row.args);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(row.message) != std::string::npos);
    CHECK(std::filesystem::is_empty(dir.path()));  // no file named after the option
  }
  // "-" is standard output, still accepted.
  const auto r = RunMemsim(dir, "run --iterations 1 --no-chart --json -");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\"schema_version\"") != std::string::npos);
}

}  // namespace
}  // namespace memsim
