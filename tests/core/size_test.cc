#include "core/size.h"

#include <catch2/catch.hpp>

#include "core/error.h"

namespace memsim {
namespace {

TEST_CASE("ParseSize: binary and decimal units", "[replay]") {
  CHECK(ParseSize("4096", "--capacity") == 4096);
  CHECK(ParseSize("0", "--capacity") == 0);
  CHECK(ParseSize("512B", "--capacity") == 512);
  CHECK(ParseSize("2KiB", "--capacity") == 2048);
  CHECK(ParseSize("3MiB", "--capacity") == 3 * 1048576);
  CHECK(ParseSize("80GiB", "--capacity") == 80LL * 1073741824);  // 80 x 2^30
  CHECK(ParseSize("80 GiB", "--capacity") == 80LL * 1073741824);
  CHECK(ParseSize("1TiB", "--capacity") == 1099511627776LL);      // 2^40
  CHECK(ParseSize("5KB", "--capacity") == 5000);
  CHECK(ParseSize("64MB", "--capacity") == 64000000);
  CHECK(ParseSize("80GB", "--capacity") == 80000000000LL);
}

TEST_CASE("ParseSize: errors name the option and the text", "[replay]") {
  const std::string units = "(an integer with an optional unit B, KiB, MiB, GiB, TiB, KB, MB, GB "
                            "or TB)";
  CHECK_THROWS_WITH(ParseSize("12XB", "--capacity"),
                    "--capacity: expected a size such as 80GiB " + units + ", got '12XB'");
  CHECK_THROWS_WITH(ParseSize("", "--capacity"),
                    "--capacity: expected a size such as 80GiB " + units + ", got ''");
  CHECK_THROWS_WITH(ParseSize("-1GiB", "--capacity"),
                    "--capacity: expected a size such as 80GiB " + units + ", got '-1GiB'");
  CHECK_THROWS_WITH(ParseSize("1.5GiB", "--capacity"),
                    "--capacity: expected a size such as 80GiB " + units + ", got '1.5GiB'");
  CHECK_THROWS_WITH(ParseSize("9000000000GiB", "--capacity"),
                    "--capacity: size '9000000000GiB' is too large");
  CHECK_THROWS_AS(ParseSize("99999999999999999999", "x"), InputError);
}

}  // namespace
}  // namespace memsim
