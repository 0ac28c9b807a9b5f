// Golden output of the README's compare example (tests/profile/data/example/, made by
// make_example.py): the table and the overlay chart, byte for byte. To regenerate on purpose:
// MEMSIM_UPDATE_GOLDEN=1 ./build/memsim_tests "[golden]" and review the diff.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "compare/compare.h"
#include "profile/profile.h"
#include "profile/writers.h"

namespace memsim::compare {
namespace {

TEST_CASE("README example: table and chart match the golden file", "[compare][golden]") {
  const std::string dir = std::string(MEMSIM_SOURCE_DIR) + "/tests/profile/data/example/";
  const timeline::Timeline measured = profile::LoadProfile(dir + "trace.json.gz", profile::Format::kAuto);
  const timeline::Timeline simulated =
      profile::LoadProfile(dir + "simulated.csv", profile::Format::kMemsimCsv);
  CompareOptions o;
  o.tolerance_pct = 5;
  o.format = measured.source;
  const Report r = Compare(measured, simulated, o);
  const std::string out = FormatTable(r) + "\n" + FormatChart(r);
  const std::string golden = std::string(MEMSIM_SOURCE_DIR) + "/tests/compare/data/example_report.txt";
  if (std::getenv("MEMSIM_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(golden, std::ios::binary) << out;
  }
  std::ifstream in(golden, std::ios::binary);
  std::stringstream expected;
  expected << in.rdbuf();
  CHECK(out == expected.str());
  CHECK(r.failed);  // reserved +14.3% > 5%
}

}  // namespace
}  // namespace memsim::compare
