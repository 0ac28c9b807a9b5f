// Recorder: an engine Observer that keeps the simulated Timeline (two samples per op: after its
// allocations and after its frees) and summarises each span -- init (iteration 0) and every
// training iteration -- as the run report needs it (docs/interfaces.md, 'JSON report'). A span runs
// from the start of its first op to the start of the next span's first op; its peaks are running
// maxima over the samples inside it (the allocator's own peak is a running maximum too, so a
// transient inside an op counts; docs/allocator-rules.md, 'Convention: peaks').
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/simulator.h"
#include "timeline/bounded_curve.h"
#include "timeline/timeline.h"

namespace memsim::timeline {

// The allocated peak within one phase of a span: what the run report compares between
// iterations, so that a forward peak is set against a forward peak (like with like).
struct PhasePeak {
  bool seen = false;  // false: the span has no op of this phase
  Bytes allocated_bytes = 0;
  std::string op;
  int micro_batch = -1;
  SimTimeUs time_us = 0;
  CategoryBytes by_category{};
  bool operator==(const PhasePeak&) const = default;
};

// Phases with a PhasePeak: init, forward, backward, optimizer_step (Phase::kUnknown excluded).
inline constexpr int kNumSimulatedPhases = 4;

struct SpanSummary {
  int iteration = 0;  // 0 = init
  SimTimeUs start_time_us = 0;
  SimTimeUs end_time_us = 0;
  Bytes start_allocated_bytes = 0;  // just before the span's first op
  Bytes start_reserved_bytes = 0;
  Bytes start_device_bytes = 0;
  Bytes end_allocated_bytes = 0;  // after the span's last op
  Bytes end_reserved_bytes = 0;
  Bytes end_device_bytes = 0;
  Bytes peak_allocated_bytes = 0;
  Bytes peak_reserved_bytes = 0;
  Bytes peak_device_bytes = 0;
  Bytes peak_active_bytes = 0;
  // Where allocated peaked: phase, op, micro-batch, and the category split at that moment.
  Phase peak_phase = Phase::kInit;
  std::string peak_op;
  int peak_micro_batch = -1;
  SimTimeUs peak_time_us = 0;
  CategoryBytes by_category_at_peak{};
  CategoryBytes start_by_category{};
  CategoryBytes end_by_category{};
  // Time at which reserved reached its span maximum (first time).
  SimTimeUs peak_reserved_time_us = 0;
  Phase peak_reserved_phase = Phase::kInit;
  // Indexed by static_cast<int>(Phase); first maximum wins, like the span's own peak.
  std::array<PhasePeak, kNumSimulatedPhases> phase_peaks{};

  const PhasePeak& PeakOf(Phase phase) const { return phase_peaks[static_cast<size_t>(phase)]; }
  bool operator==(const SpanSummary&) const = default;
};

// Samples the Recorder keeps at most (BoundedCurve): 2^18 samples (12 MiB); above, the curve is
// down-sampled keeping every peak and trough. The per-span summaries stay exact.
inline constexpr std::size_t kMaxKeptSamples = std::size_t{1} << 18;

class Recorder final : public engine::Observer {
 public:
  // `keep_samples` false keeps only the summaries (cheaper when the curve is not needed).
  explicit Recorder(bool keep_samples = true, std::size_t max_samples = kMaxKeptSamples)
      : keep_samples_(keep_samples), curve_(max_samples) {}

  void OnOpBoundary(const engine::OpBoundary& b) override;
  void OnCommunicatorCreated(SimTimeUs time_us, const std::string& group) override;

  // Closes the last span and fixes the kept curve. REQUIRES: called once, after Simulate returns.
  void Finish();

  const Timeline& timeline() const { return timeline_; }
  Timeline TakeTimeline() { return std::move(timeline_); }
  // spans()[0] is init when the program has an init phase; then iterations 1..N in order.
  const std::vector<SpanSummary>& spans() const { return spans_; }

 private:
  void OpenSpan(int iteration, const engine::OpBoundary& b);

  bool keep_samples_;
  BoundedCurve curve_;
  Timeline timeline_;
  std::vector<SpanSummary> spans_;
  bool open_ = false;
  Phase last_phase_ = Phase::kUnknown;
  // The state after the previous boundary (the start of the next span).
  Bytes last_allocated_ = 0, last_reserved_ = 0, last_device_ = -1;
  CategoryBytes last_by_category_{};
  SimTimeUs last_time_ = 0;
};

}  // namespace memsim::timeline
