#include "compare/compare.h"

#include <map>

#include <catch2/catch.hpp>

#include "profile/writers.h"

namespace memsim::compare {
namespace {

using timeline::Sample;
using timeline::Timeline;

// Two one-iteration timelines whose allocated curves differ by a known amount.
Timeline Flat(Bytes allocated, int iteration_count) {
  Timeline t;
  for (int k = 1; k <= iteration_count; ++k) {
    for (int i = 0; i < 10; ++i) {
      Sample s;
      s.time_us = ((k - 1) * 10 + i) * 100.0;
      s.iteration = k;
      s.allocated_bytes = allocated;
      t.samples.push_back(s);
    }
  }
  return t;
}

TEST_CASE("peak error and curve error of constant curves", "[compare]") {
  // measured 110 MiB, simulated 100 MiB: peak error (110 - 100) / 100 = +10%;
  // curve error |110 - 100| / 110 (measured peak) = 9.0909%.
  const Report r = Compare(Flat(110 * kMiB, 2), Flat(100 * kMiB, 2), {});
  REQUIRE(r.iterations.size() == 2);
  CHECK(*r.iterations[0].error_pct.peak_allocated == Approx(10.0));
  CHECK(*r.iterations[0].curve_error_pct.allocated == Approx(100.0 / 11.0));
  CHECK(!r.iterations[0].error_pct.peak_reserved);  // unknown on both sides
  CHECK(*r.overall_curve_error_pct == Approx(100.0 / 11.0));
  CHECK(!r.failed);
}

TEST_CASE("tolerance: fails iff |overall peak error| exceeds it", "[compare]") {
  CompareOptions o;
  o.tolerance_pct = 10.5;
  CHECK(!Compare(Flat(110 * kMiB, 1), Flat(100 * kMiB, 1), o).failed);  // 10% <= 10.5%
  o.tolerance_pct = 9.5;
  CHECK(Compare(Flat(110 * kMiB, 1), Flat(100 * kMiB, 1), o).failed);  // 10% > 9.5%
  CHECK(Compare(Flat(90 * kMiB, 1), Flat(100 * kMiB, 1), o).failed);   // |-10%| > 9.5%
}

TEST_CASE("measured iterations beyond the simulated ones meet the last simulated", "[compare]") {
  const Report r = Compare(Flat(100 * kMiB, 5), Flat(100 * kMiB, 2), {});
  REQUIRE(r.iterations.size() == 5);
  CHECK(r.iterations[4].iteration == 5);
  CHECK(r.iterations[4].simulated_iteration == 2);
}

TEST_CASE("the skip option drops the profile's first iterations", "[compare]") {
  CompareOptions o;
  o.skip = 2;
  const Report r = Compare(Flat(100 * kMiB, 4), Flat(100 * kMiB, 4), o);
  REQUIRE(r.iterations.size() == 2);
  CHECK(r.iterations[0].iteration == 3);
  CHECK(r.iterations[0].simulated_iteration == 3);
}

Timeline WithoutIterations(Timeline t) {
  for (Sample& s : t.samples) {
    s.iteration = -1;
    s.phase = Phase::kUnknown;
  }
  t.markers.clear();
  return t;
}

TEST_CASE("iterations detected from the periodic allocated curve", "[compare]") {
  // KnownTimeline(6): init, iteration 1 (starts at 2048 MiB), iterations 2-6 (start at 3072 MiB
  // once the optimizer states exist). Detection anchors in the middle and keeps the boundaries
  // at the 3072 MiB level: iterations 2..6 = 5 iterations, each of 18 samples.
  const Timeline sim = testing::KnownTimeline(6);
  Timeline t = WithoutIterations(sim);
  REQUIRE(DetectIterations(t, 0) == 5);
  for (size_t i = 0; i < t.samples.size(); ++i) {
    INFO(i);
    const int expected = sim.samples[i].iteration >= 2 ? sim.samples[i].iteration - 1 : -1;
    CHECK(t.samples[i].iteration == expected);
  }
  // Compared from the simulated steady state (iteration 2) on: all errors 0.
  const Report r = Compare(WithoutIterations(sim), sim, {});
  REQUIRE(r.iterations.size() == 5);
  CHECK(r.iterations[0].simulated_iteration == 2);
  for (const auto& it : r.iterations) {
    CHECK(*it.error_pct.peak_allocated == Approx(0).margin(1e-9));
    CHECK(*it.curve_error_pct.allocated < 0.5);
  }
  // Detected iterations are the repeating ones, numbered from the first repeat: where the
  // profile's reserved stops growing is not known from them, and is not reported in their
  // numbering next to the simulated one (iteration 2 here: the optimizer states appear in 1).
  CHECK_FALSE(r.steady_state_measured.has_value());
  CHECK(r.steady_state_simulated == 2);
  // With the profile's own iteration numbers it is known: the same curve gives iteration 2 too.
  CHECK(Compare(sim, sim, {}).steady_state_measured == r.steady_state_simulated);
}

TEST_CASE("device-level profile: peak and converged level", "[compare]") {
  // Measured device curve: 1000 MiB rising to a plateau of 5000 MiB; simulated plateau 4000:
  // peak error (5000 - 4000) / 4000 = +25%; converged level (median of the last 20%) likewise.
  Timeline m, s;
  for (int i = 0; i < 50; ++i) {
    Sample a;
    a.time_us = i * 1000.0;
    a.device_bytes = (i < 10 ? 1000 + 400 * i : 5000) * kMiB;
    m.samples.push_back(a);
    Sample b = a;
    b.device_bytes = (i < 10 ? 1000 + 300 * i : 4000) * kMiB;
    b.iteration = i / 10 + 1;
    s.samples.push_back(b);
  }
  const Report r = Compare(m, s, {});
  CHECK(r.iterations.empty());
  CHECK(*r.overall_error_pct.peak_device == Approx(25.0));
  CHECK(r.converged_device_measured == 5000 * kMiB);
  CHECK(*r.converged_device_error_pct == Approx(25.0));
  CompareOptions o;
  o.profile_iterations = 5;  // split into 5 equal iterations: each matches simulated k
  const Report split = Compare(m, s, o);
  CHECK(split.iterations.size() == 5);
}

TEST_CASE("JSON report follows the documented schema", "[compare]") {
  const Report r = Compare(Flat(110 * kMiB, 1), Flat(100 * kMiB, 1), {});
  const std::string json = FormatJson(r);
  CHECK(json.rfind("{\"schema_version\": 1, \"format\": ", 0) == 0);
  CHECK(json.find("\"iterations\": [{\"iteration\": 1, ") != std::string::npos);
  CHECK(json.find("\"steady_state_iteration\": {\"measured\": null, \"simulated\": null}") !=
        std::string::npos);
  CHECK(json.find("\"peak_allocated_bytes\": 115343360") != std::string::npos);  // 110 x 2^20
  // error_bytes: (110 - 100) MiB = 10485760; end values likewise.
  CHECK(json.find("\"error_bytes\": {\"peak_allocated\": 10485760, \"peak_reserved\": null, "
                  "\"peak_device\": null, \"end_allocated\": 10485760, \"end_reserved\": null}") !=
        std::string::npos);
  CHECK(!FormatTable(r).empty());
  CHECK(!FormatChart(r).empty());
}

}  // namespace
}  // namespace memsim::compare

namespace memsim::compare {
namespace {

TEST_CASE("detection finds the iteration, not the micro-batch period", "[compare]") {
  // 10 iterations of 8 micro-batches: each micro-batch rises 4 x 100 MiB and falls back to
  // base + 10 MiB (gradients kept); the optimizer step then returns to the base, the lowest
  // level. 8 x 8 + 1 = 65 samples per iteration, one every 10 us. The micro-batch period (8
  // samples) also repeats, but the iteration period (65) is the shortest lag that rises above
  // the decaying micro-batch autocorrelation.
  Timeline t;
  double now = 0;
  Bytes allocated = 1000 * kMiB;
  auto emit = [&] {
    Sample s;
    s.time_us = now;
    s.allocated_bytes = allocated;
    t.samples.push_back(s);
    now += 10;
  };
  emit();
  for (int k = 0; k < 10; ++k) {
    for (int mb = 0; mb < 8; ++mb) {
      for (int i = 0; i < 4; ++i) {
        allocated += 100 * kMiB;
        emit();
      }
      for (int i = 0; i < 4; ++i) {
        allocated -= 100 * kMiB;
        if (i == 3 && mb == 0) allocated += 10 * kMiB;  // gradients appear in micro-batch 1
        emit();
      }
    }
    allocated -= 10 * kMiB;  // the step: back to the base
    emit();
  }
  const int n = DetectIterations(t, 0);
  CHECK(n >= 8);
  std::map<int, int> samples_per_iteration;
  for (const Sample& s : t.samples) {
    if (s.iteration >= 1) ++samples_per_iteration[s.iteration];
  }
  REQUIRE(static_cast<int>(samples_per_iteration.size()) == n);
  for (const auto& [k, count] : samples_per_iteration) {
    INFO(k);
    CHECK(count == 65);
  }
}

}  // namespace
}  // namespace memsim::compare
