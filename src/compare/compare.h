// compare/: puts a measured Timeline (profile/) next to a simulated one and says, iteration by
// iteration, where and by how much they differ (docs/architecture.md, compare/; docs/profiles.md).
// It neither reads files nor simulates: the CLI loads the profile, runs the engine and hands both
// Timelines over, so everything here is a pure function of its arguments.
//
// Alignment (in this order of preference):
//  1. iteration numbers the profile carries (ProfilerStep#N -> N+1, Megatron "after N
//     iterations", memsim-csv's column): measured iteration k is compared with simulated k, or
//     with the last simulated iteration when the simulation ran fewer (its steady state);
//  2. otherwise, where the profile has allocator-level data (allocated or reserved), iterations
//     are detected from the periodic curve (DetectIterations) and numbered 1.. in profile order;
//  3. device-level samples without markers (npu-smi, nvidia-smi, npu_mem) are compared on the
//     peak and on the level reached after convergence only, unless --profile-iterations N splits
//     the profile into N equal iterations.
// --skip N drops the profile's first N iterations (after 1 or 2).
//
// Errors: peak error_pct = (measured - simulated) / simulated x 100: +10 means the real run used
// 10% more than memsim predicted. Curve error (docs/interfaces.md, 'compare and check JSON'): both
// curves resampled at 200 points of iteration-normalised time (phase-normalised where both have
// phases), mean |measured - simulated| as % of the measured peak of that curve in that iteration.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "timeline/timeline.h"

namespace memsim::compare {

struct CompareOptions {
  int skip = 0;                // drop the profile's first N iterations
  int profile_iterations = 0;  // > 0: the profile covers this many iterations (no markers)
  std::optional<double> tolerance_pct;  // fail when |overall peak error_pct| exceeds it
  int curve_points = 200;               // 200 points per iteration (docs/interfaces.md)
  int pipeline_rank = 0;                // reported only
  std::string format;                   // reported only ("torch-trace", ...)
};

// Peaks of one span; kUnknownBytes where the curve is absent.
struct Peaks {
  Bytes peak_allocated_bytes = timeline::kUnknownBytes;
  Bytes peak_reserved_bytes = timeline::kUnknownBytes;
  Bytes peak_device_bytes = timeline::kUnknownBytes;
  Bytes end_allocated_bytes = timeline::kUnknownBytes;
  Bytes end_reserved_bytes = timeline::kUnknownBytes;
  bool operator==(const Peaks&) const = default;
};

// (measured - simulated) / simulated x 100 per field; nullopt where either side is unknown.
struct PeakErrors {
  std::optional<double> peak_allocated, peak_reserved, peak_device, end_allocated, end_reserved;
};

struct CurveErrors {
  std::optional<double> allocated, reserved, device;  // % of the measured peak
};

struct IterationResult {
  int iteration = 0;            // the profile's iteration (memsim numbering)
  int simulated_iteration = 0;  // the simulated iteration it is compared with
  Peaks measured, simulated;
  PeakErrors error_pct;
  CurveErrors curve_error_pct;
  bool phase_normalised = false;
};

struct Report {
  std::string format;
  int pipeline_rank = 0;
  std::string alignment;  // one line: how iterations were found
  // Megatron "max allocated" is cumulative since the process started; the simulated side is then
  // the maximum over init and iterations so far (docs/interfaces.md, 'JSON report').
  bool cumulative_peaks = false;
  std::vector<IterationResult> iterations;
  std::optional<int> steady_state_measured, steady_state_simulated;
  Peaks overall_measured, overall_simulated;
  PeakErrors overall_error_pct;
  std::optional<double> overall_curve_error_pct;  // mean of the iterations' allocated (else
                                                  // reserved, else device) curve error
  // Device level reached after convergence: median of the last 20% of samples.
  Bytes converged_device_measured = timeline::kUnknownBytes;
  Bytes converged_device_simulated = timeline::kUnknownBytes;
  std::optional<double> converged_device_error_pct;
  std::optional<double> tolerance_pct;
  bool failed = false;  // an overall peak error exceeds the tolerance
  // Iterations found in the profile before --skip dropped any (0 when none were found).
  int measured_iterations = 0;
  std::vector<std::string> notes;
  // The overlay: one curve (chart_curve: "allocated", "reserved" or "device") of both sides,
  // resampled at curve_points per aligned iteration and concatenated (the whole run when no
  // iteration is identifiable). Same length; kUnknownBytes where a side has no value.
  std::string chart_curve;
  std::vector<Bytes> chart_measured, chart_simulated;
};

// Compares; never throws for well-formed Timelines (an empty side gives a Report with notes).
Report Compare(const timeline::Timeline& measured, const timeline::Timeline& simulated,
               const CompareOptions& options);

// Labels the samples of `t` (those with iteration -1) with iterations detected from the
// periodic allocated curve (reserved, then device, when allocated is absent). expected_count > 0
// fixes the number of iterations: the profile is taken to end with the last, boundaries are
// followed backwards from the end at the level iteration N starts at, and iteration 1 holds
// everything before iteration 2. Returns the number of iterations found (0: none; `t` is then
// unchanged). Method (docs/profiles.md "Alignment"): the curve resampled at 2048 points; the
// candidate periods are the autocorrelation peaks above 0.3 r(0) that exceed every r in
// [P/2, 0.95 P] or stand 3% of r(0) above their neighbouring peaks; boundaries are the rise
// after the point of each period nearest to the anchor's level (the low point in the middle of
// the profile, within 2% of the curve's range), extended both ways; the shortest candidate
// whose iterations repeat (peaks within 2% of the range) is taken.
int DetectIterations(timeline::Timeline& t, int expected_count);

// Text outputs. FormatTable: one row per iteration plus the overall row and notes; `width` 0
// prints the wide layout (MiB cells, 112 columns), a width under 112 GiB cells (80 columns) with
// the notes wrapped to it.
// FormatChart: measured ('*') over simulated ('o'; '#' where both fall in one cell) for the
// allocated curve (reserved / device when absent) of the aligned iterations, `width` x `height`
// characters plus axes. FormatJson (schema_version 1): docs/interfaces.md,
// 'compare and check JSON'.
std::string FormatTable(const Report& report, int width = 0);
std::string FormatChart(const Report& report, int width = 72, int height = 16);
std::string FormatJson(const Report& report);

}  // namespace memsim::compare
