// SpanSummary: what a run reports of one span of the simulated curve -- init (iteration 0) or a
// training iteration -- and of its peaks (docs/interfaces.md, 'JSON report'). A span runs from the
// start of its first op to the start of the next span's first op; its peaks are running maxima
// over the samples inside it (the allocator's own peak is a running maximum too, so a transient
// inside an op counts; docs/allocator-rules.md, 'Convention: peaks'). Plain data: the engine's
// Recorder (engine/recorder.h) fills it, the reports and exports read it.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "core/categories.h"
#include "core/units.h"

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

}  // namespace memsim::timeline
