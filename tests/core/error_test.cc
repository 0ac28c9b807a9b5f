#include "core/error.h"

#include <catch2/catch.hpp>

namespace memsim {
namespace {

TEST_CASE("ClosestMatch suggests the nearest key within the edit limit", "[core]") {
  const std::vector<std::string> keys = {"seq_length", "micro_batch_size", "global_batch_size"};
  // "seq_lenght" is two transpositions-as-substitutions away from "seq_length".
  CHECK(ClosestMatch("seq_lenght", keys) == "seq_length");
  CHECK(ClosestMatch("micro_batch", keys) == "");  // 5 edits > max(1, 11/3) = 3
  CHECK(ClosestMatch("totally_different", keys) == "");
}

}  // namespace
}  // namespace memsim
