#include "workload/schedule.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>

namespace memsim::workload {
namespace {

// Largest number of micro-batches (units) forwarded but not yet backwarded.
int MaxInFlight(const std::vector<ScheduleStep>& steps) {
  int live = 0, peak = 0;
  for (const ScheduleStep& s : steps) {
    live += s.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

TEST_CASE("no pipelining: forward then backward per micro-batch", "[workload]") {
  const auto steps = PipelineSchedule(1, 0, 3, 1);
  REQUIRE(steps.size() == 6);
  CHECK(steps[0] == ScheduleStep{true, 0, 0});
  CHECK(steps[1] == ScheduleStep{false, 0, 0});
  CHECK(steps[5] == ScheduleStep{false, 2, 0});
  CHECK(MaxInFlight(steps) == 1);
}

TEST_CASE("1F1B: warm-up min(p - r - 1, m), in flight min(p - r, m)", "[workload]") {
  // p = 4, m = 8: stage r holds min(4 - r, 8) micro-batches at its peak (1F1B warm-up,
  // schedules.py forward_backward_pipelining_without_interleaving).
  for (int r = 0; r < 4; ++r) {
    const auto steps = PipelineSchedule(4, r, 8, 1);
    CHECK(steps.size() == 16);
    CHECK(MaxInFlight(steps) == 4 - r);
    // The first backward comes after exactly warm-up + 1 = 4 - r forwards.
    const auto first_b =
        std::find_if(steps.begin(), steps.end(), [](const ScheduleStep& s) { return !s.forward; });
    CHECK(first_b - steps.begin() == 4 - r);
    CHECK(first_b->micro_batch == 0);
  }
  // m < p: stage 0 of p = 4 with m = 2 holds only 2.
  CHECK(MaxInFlight(PipelineSchedule(4, 0, 2, 1)) == 2);
}

TEST_CASE("interleaved 1F1B: every unit forward once, then backward once", "[workload]") {
  const int p = 4, m = 8, v = 2;
  for (int r = 0; r < p; ++r) {
    const auto steps = PipelineSchedule(p, r, m, v);
    REQUIRE(steps.size() == static_cast<size_t>(2 * m * v));
    std::set<std::pair<int, int>> fwd, bwd;
    for (const ScheduleStep& s : steps) {
      if (s.forward) {
        CHECK(fwd.insert({s.micro_batch, s.chunk}).second);
      } else {
        CHECK(fwd.count({s.micro_batch, s.chunk}) == 1);
        CHECK(bwd.insert({s.micro_batch, s.chunk}).second);
      }
    }
    // Warm-up (p - r - 1)·2 + (v - 1)·p units, then one more forward before the first backward.
    CHECK(MaxInFlight(steps) == std::min((p - r - 1) * 2 + (v - 1) * p + 1, m * v));
  }
  // The first forwards of stage 0 walk chunk 0 over micro-batches 0..p-1, then chunk 1.
  const auto steps = PipelineSchedule(p, 0, m, v);
  CHECK(steps[0] == ScheduleStep{true, 0, 0});
  CHECK(steps[3] == ScheduleStep{true, 3, 0});
  CHECK(steps[4] == ScheduleStep{true, 0, 1});
}

}  // namespace
}  // namespace memsim::workload
