#include "engine/recorder.h"

#include <fmt/core.h>

namespace memsim::engine {

void Recorder::OpenSpan(int iteration, const OpBoundary& b) {
  if (open_) {
    timeline::SpanSummary& prev = spans_.back();
    prev.end_time_us = b.time_us;
  }
  timeline::SpanSummary s;
  s.iteration = iteration;
  s.start_time_us = b.time_us;
  s.start_allocated_bytes = last_allocated_;
  s.start_reserved_bytes = last_reserved_;
  // Before the first boundary nothing was reserved: the device shows baseline + context, which
  // the first boundary's device figure minus its reserved bytes gives exactly.
  s.start_device_bytes = last_device_ >= 0 ? last_device_ : b.device_bytes - b.reserved_bytes;
  s.start_by_category = last_by_category_;
  s.peak_allocated_bytes = last_allocated_;
  s.peak_reserved_bytes = last_reserved_;
  s.peak_device_bytes = s.start_device_bytes;
  s.peak_active_bytes = last_allocated_;
  s.by_category_at_peak = last_by_category_;
  s.peak_time_us = b.time_us;
  s.peak_phase = b.op->phase;
  s.peak_reserved_time_us = b.time_us;
  s.peak_reserved_phase = b.op->phase;
  spans_.push_back(s);
  open_ = true;
  if (keep_samples_) {
    timeline_.markers.push_back(
        {b.time_us, iteration, b.op->phase,
         iteration == 0 ? std::string("init") : fmt::format("iteration {}", iteration)});
  }
  last_phase_ = b.op->phase;
}

void Recorder::OnOpBoundary(const OpBoundary& b) {
  const workload::Op& op = *b.op;
  if (b.at_start && (!open_ || op.iteration > spans_.back().iteration)) {
    OpenSpan(op.iteration, b);
  } else if (keep_samples_ && b.at_start && op.stream == workload::kComputeStream &&
             op.phase != last_phase_) {
    timeline_.markers.push_back({b.time_us, op.iteration, op.phase, std::string(PhaseName(op.phase))});
    last_phase_ = op.phase;
  }
  timeline::SpanSummary& s = spans_.back();
  if (b.allocated_bytes > s.peak_allocated_bytes) {
    s.peak_allocated_bytes = b.allocated_bytes;
    s.peak_phase = op.phase;
    s.peak_op = op.name;
    s.peak_micro_batch = op.micro_batch;
    s.peak_time_us = b.time_us;
    s.by_category_at_peak = *b.allocated_by_category;
  }
  if (b.reserved_bytes > s.peak_reserved_bytes) {
    s.peak_reserved_bytes = b.reserved_bytes;
    s.peak_reserved_time_us = b.time_us;
    s.peak_reserved_phase = op.phase;
  }
  if (static_cast<int>(op.phase) < timeline::kNumSimulatedPhases) {
    timeline::PhasePeak& pp = s.phase_peaks[static_cast<size_t>(op.phase)];
    if (!pp.seen || b.allocated_bytes > pp.allocated_bytes) {
      pp = {true, b.allocated_bytes, op.name, op.micro_batch, b.time_us, *b.allocated_by_category};
    }
  }
  s.peak_device_bytes = std::max(s.peak_device_bytes, b.device_bytes);
  s.peak_active_bytes = std::max(s.peak_active_bytes, b.active_bytes);
  s.end_allocated_bytes = b.allocated_bytes;
  s.end_reserved_bytes = b.reserved_bytes;
  s.end_device_bytes = b.device_bytes;
  s.end_by_category = *b.allocated_by_category;
  s.end_time_us = b.time_us;
  last_allocated_ = b.allocated_bytes;
  last_reserved_ = b.reserved_bytes;
  last_device_ = b.device_bytes;
  last_by_category_ = *b.allocated_by_category;
  last_time_ = b.time_us;
  if (keep_samples_) {
    curve_.Add({b.time_us, op.iteration, op.phase, b.allocated_bytes, b.reserved_bytes,
                b.active_bytes, b.device_bytes});
  }
}

void Recorder::OnCommunicatorCreated(SimTimeUs time_us, const std::string& group) {
  if (keep_samples_ && !spans_.empty()) {
    timeline_.markers.push_back({time_us, spans_.back().iteration, Phase::kUnknown,
                                 fmt::format("communicator {} created", group)});
  }
}

void Recorder::Finish() {
  if (open_) spans_.back().end_time_us = last_time_;
  open_ = false;
  timeline_.source = "memsim";
  if (keep_samples_) {
    timeline_.samples = curve_.Take();
    if (curve_.bucket_size() > 1) {
      timeline_.notes.push_back(fmt::format(
          "curve down-sampled from {} samples to {} (lowest and highest of every {} in a row)",
          curve_.samples_added(), timeline_.samples.size(), curve_.bucket_size()));
    }
  }
}

}  // namespace memsim::engine
