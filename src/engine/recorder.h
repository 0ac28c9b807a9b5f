// Recorder: the engine Observer that keeps the simulated Timeline (two samples per op: after its
// allocations and after its frees) and summarises each span -- init (iteration 0) and every
// training iteration -- as the run report needs it (timeline::SpanSummary, timeline/span_summary.h:
// what a span is and how its peaks are taken).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/simulator.h"
#include "timeline/bounded_curve.h"
#include "timeline/span_summary.h"
#include "timeline/timeline.h"

namespace memsim::engine {

// Samples the Recorder keeps at most (BoundedCurve): 2^18 samples (12 MiB); above, the curve is
// down-sampled keeping every peak and trough. The per-span summaries stay exact.
inline constexpr std::size_t kMaxKeptSamples = std::size_t{1} << 18;

class Recorder final : public Observer {
 public:
  // `keep_samples` false keeps only the summaries (cheaper when the curve is not needed).
  explicit Recorder(bool keep_samples = true, std::size_t max_samples = kMaxKeptSamples)
      : keep_samples_(keep_samples), curve_(max_samples) {}

  void OnOpBoundary(const OpBoundary& b) override;
  void OnCommunicatorCreated(SimTimeUs time_us, const std::string& group) override;

  // Closes the last span and fixes the kept curve. REQUIRES: called once, after Simulate returns.
  void Finish();

  const timeline::Timeline& timeline() const { return timeline_; }
  timeline::Timeline TakeTimeline() { return std::move(timeline_); }
  // spans()[0] is init when the program has an init phase; then iterations 1..N in order.
  const std::vector<timeline::SpanSummary>& spans() const { return spans_; }

 private:
  void OpenSpan(int iteration, const OpBoundary& b);

  bool keep_samples_;
  timeline::BoundedCurve curve_;
  timeline::Timeline timeline_;
  std::vector<timeline::SpanSummary> spans_;
  bool open_ = false;
  Phase last_phase_ = Phase::kUnknown;
  // The state after the previous boundary (the start of the next span).
  Bytes last_allocated_ = 0, last_reserved_ = 0, last_device_ = -1;
  CategoryBytes last_by_category_{};
  SimTimeUs last_time_ = 0;
};

}  // namespace memsim::engine
