// Bad input found by trying to break `memsim`: every case is one InputError message, asserted
// verbatim, never a crash, an abort in a later module or a silently absurd simulation.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "test_util.h"

namespace memsim::config {
namespace {

using testing::Data;
using testing::ErrorOf;

LoadOptions Set(std::vector<std::string> overrides) {
  LoadOptions o;
  o.overrides = std::move(overrides);
  return o;
}

TEST_CASE("a short unknown key gets no far-fetched suggestion", "[config]") {
  // "foo" vs "fp8": 2 edits; a 3-letter word allows max(1, 3/3) = 1 edit.
  CHECK(ErrorOf(Data("good.json"), Set({"training.foo=1"})) == "--set training.foo=1: unknown key");
  // One edit still suggests: "fp9" -> "fp8".
  CHECK(ErrorOf(Data("good.json"), Set({"training.fp9=1"})) ==
        "--set training.fp9=1: unknown key (did you mean 'fp8'?)");
  // A swap of adjacent letters is one edit: "rnu" -> "run"; "fp8" is 2 edits from "foo".
  CHECK(ClosestMatch("rnu", {"run", "check"}) == "run");
  CHECK(ClosestMatch("foo", {"fp8"}) == "");
}


}  // namespace
}  // namespace memsim::config
