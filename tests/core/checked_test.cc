// core/checked.h: boundary rows at the limits every importer relies on (issue 18).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/checked.h"

namespace memsim {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

TEST_CASE("checked: add, sub and mul are nullopt exactly when int64 overflows", "[core]") {
  CHECK(CheckedAdd(kMax - 1, 1) == kMax);
  CHECK_FALSE(CheckedAdd(kMax, 1));
  CHECK(CheckedAdd(kMin, 0) == kMin);
  CHECK_FALSE(CheckedAdd(kMin, -1));
  CHECK(CheckedSub(0, kMax) == -kMax);
  CHECK_FALSE(CheckedSub(0, kMin));
  CHECK(CheckedMul(std::int64_t{1} << 31, std::int64_t{1} << 31) == std::int64_t{1} << 62);
  CHECK_FALSE(CheckedMul(std::int64_t{1} << 32, std::int64_t{1} << 31));
  CHECK_FALSE(CheckedMul(-1, kMin));
}

TEST_CASE("checked: times stay within +-2^62 ns", "[core]") {
  // 2^62 ns = 4,611,686,018,427,387,904 ns: the limit itself is in range, one more is not.
  CHECK(ToTimeNs(std::int64_t{4611686018427387}, 1000) == 4611686018427387000);
  CHECK_FALSE(ToTimeNs(std::int64_t{4611686018427388}, 1000));
  CHECK(ToTimeNs(-std::int64_t{4611686018427387}, 1000) == -4611686018427387000);
  CHECK_FALSE(ToTimeNs(std::int64_t{10'000'000'000'000'000}, 1000));  // the Chrome-trace finding
  CHECK_FALSE(ToTimeNs(kMax, 2));
  CHECK(ToTimeNs(1.5, 1000.0) == 1500);
  CHECK_FALSE(ToTimeNs(std::nan(""), 1000.0));
  CHECK_FALSE(ToTimeNs(1e300, 1000.0));
  CHECK(AddTimeNs(kMaxAbsTimeNs - 1, 1) == kMaxAbsTimeNs);
  CHECK_FALSE(AddTimeNs(kMaxAbsTimeNs, 1));
  CHECK(TimeInRange(-kMaxAbsTimeNs));
  CHECK_FALSE(TimeInRange(kMin));
}

TEST_CASE("checked: byte counts stay within +-2^62", "[core]") {
  CHECK(ToBytes(std::int64_t{1} << 42, kMiB) == std::int64_t{1} << 62);
  CHECK_FALSE(ToBytes((std::int64_t{1} << 42) + 1, kMiB));
  CHECK_FALSE(ToBytes(std::int64_t{99999999999999}, kMiB));  // the nvidia-smi finding
  CHECK(ToBytes(0.5, 1024.0) == 512);
  CHECK_FALSE(ToBytes(1e300, static_cast<double>(kMiB)));  // the Megatron-log finding
  CHECK_FALSE(ToBytes(-std::numeric_limits<double>::infinity(), 1.0));
}

}  // namespace
}  // namespace memsim
