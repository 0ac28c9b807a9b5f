// The report over many steps of varying length (report/steps.h): percentiles, the peak step,
// reserved growth and fragmentation from per-step summaries built by hand.
#include <catch2/catch.hpp>

#include "report/steps.h"

namespace memsim::report {
namespace {

timeline::SpanSummary Span(int k, Bytes peak_alloc, Bytes peak_resv, Bytes end_alloc, Bytes end_resv) {
  timeline::SpanSummary s;
  s.iteration = k;
  s.peak_allocated_bytes = peak_alloc;
  s.peak_reserved_bytes = peak_resv;
  s.end_allocated_bytes = end_alloc;
  s.end_reserved_bytes = end_resv;
  s.peak_micro_batch = k == 0 ? -1 : 1;
  return s;
}

TEST_CASE("nearest-rank percentiles of the step peaks", "[report][steps]") {
  // N = 10: p99 is the ceil(9.9) = 10th smallest, the median the 5th.
  const std::vector<Bytes> v = {5, 1, 9, 3, 7, 2, 8, 4, 10, 6};
  CHECK(NearestRankPercentile(v, 99) == 10);
  CHECK(NearestRankPercentile(v, 50) == 5);
  CHECK(NearestRankPercentile({42}, 99) == 42);
}

TEST_CASE("step stats: the peak step, when reserved last grew, reserved minus allocated",
          "[report][steps]") {
  engine::RunResult run;
  run.stages.resize(1);
  run.stages[0].spans = {Span(0, 10, 20, 10, 20), Span(1, 30, 40, 10, 40), Span(2, 50, 60, 10, 60),
                         Span(3, 40, 60, 10, 60), Span(4, 50, 60, 12, 60)};
  const StepStats st = ComputeStepStats(run);
  CHECK(st.steps == 4);
  CHECK(st.max_peak_allocated == 50);
  CHECK(st.max_step == 2);  // the first of the two steps at 50
  CHECK(st.max_micro_batch == 1);
  CHECK(st.p99_peak_allocated == 50);     // ceil(3.96) = 4th smallest of 30, 40, 50, 50
  CHECK(st.median_peak_allocated == 40);  // 2nd smallest
  CHECK(st.max_peak_reserved == 60);
  CHECK(st.reserved_last_grew == 2);      // 40 > 20 at step 1, 60 > 40 at step 2, then flat
  CHECK(st.max_end_gap == 50);            // 60 - 10 at step 2
  CHECK(st.max_end_gap_step == 2);
  CHECK(st.last_end_gap == 48);           // 60 - 12
  CHECK(st.max_peak_gap == 20);           // 60 - 40 at step 3
  CHECK(st.max_peak_gap_step == 3);
}

}  // namespace
}  // namespace memsim::report
