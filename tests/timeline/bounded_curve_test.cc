// BoundedCurve (timeline/bounded_curve.h): bounded size, every peak and trough kept.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "timeline/bounded_curve.h"

namespace memsim::timeline {
namespace {

// A saw-tooth with a rising floor: allocated = 1000·i/period + (i % period) · 7 mod 97,
// reserved rising in steps, device = reserved + 5.
Sample At(std::int64_t i) {
  Sample s;
  s.time_us = static_cast<double>(i);
  s.iteration = static_cast<int>(i / 1000);
  s.allocated_bytes = 1000 * (i / 500) + (i * 7) % 97;
  s.reserved_bytes = 100000 + 64 * (i / 3000);
  s.active_bytes = s.allocated_bytes;
  s.device_bytes = s.reserved_bytes + 5;
  return s;
}

TEST_CASE("below its bound the curve keeps every sample", "[timeline]") {
  BoundedCurve c(64);
  for (int i = 0; i < 64; ++i) c.Add(At(i));
  const SampleVector kept = c.Take();
  REQUIRE(kept.size() == 64);
  for (int i = 0; i < 64; ++i) CHECK(kept[i] == At(i));
  CHECK(c.bucket_size() == 1);
}

TEST_CASE("above its bound the curve keeps the extremes in bounded size", "[timeline]") {
  constexpr std::size_t kMax = 256;
  constexpr std::int64_t kN = 100000;
  BoundedCurve c(kMax);
  Bytes max_alloc = 0, min_alloc = INT64_MAX, max_dev = 0;
  for (std::int64_t i = 0; i < kN; ++i) {
    const Sample s = At(i);
    max_alloc = std::max(max_alloc, s.allocated_bytes);
    min_alloc = std::min(min_alloc, s.allocated_bytes);
    max_dev = std::max(max_dev, s.device_bytes);
    c.Add(s);
  }
  CHECK(c.samples_added() == static_cast<std::size_t>(kN));
  const SampleVector kept = c.Take();
  CHECK(kept.size() <= kMax);
  CHECK(kept.size() >= kMax / 8);
  CHECK(c.bucket_size() > 1);
  // Every kept sample is one that was added, in time order.
  for (std::size_t k = 0; k < kept.size(); ++k) {
    CHECK(kept[k] == At(static_cast<std::int64_t>(kept[k].time_us)));
    if (k > 0) CHECK(kept[k - 1].time_us < kept[k].time_us);
  }
  // The extremes of the whole curve survive (each bucket keeps its own, and the whole curve's
  // extreme is its bucket's).
  auto has = [&](auto pred) { return std::any_of(kept.begin(), kept.end(), pred); };
  CHECK(has([&](const Sample& s) { return s.allocated_bytes == max_alloc; }));
  CHECK(has([&](const Sample& s) { return s.allocated_bytes == min_alloc; }));
  CHECK(has([&](const Sample& s) { return s.device_bytes == max_dev; }));
}

}  // namespace
}  // namespace memsim::timeline
