#include "report/steps.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/check.h"
#include "report/format.h"
#include "workload/batch_lengths.h"

namespace memsim::report {
namespace {

std::string JoinLengths(const std::vector<int>& lengths, const char* sep) {
  std::string out;
  for (size_t i = 0; i < lengths.size(); ++i) out += fmt::format("{}{}", i ? sep : "", lengths[i]);
  return out;
}

// "12.10 GiB after step 1, 14.02 after 10, ..." at steps 1, 10, 100, 1000 and the last.
std::string ReservedGrowth(const std::vector<timeline::SpanSummary>& spans) {
  std::string out;
  Bytes running = 0;
  const int last = spans.back().iteration;
  for (const timeline::SpanSummary& s : spans) {
    running = std::max(running, s.peak_reserved_bytes);
    if (s.iteration == 0) continue;
    const bool mark = s.iteration == 1 || s.iteration == 10 || s.iteration == 100 ||
                      s.iteration == 1000 || s.iteration == last;
    if (!mark) continue;
    out += out.empty() ? fmt::format("{} GiB by step {}", GiB(running), s.iteration)
                       : fmt::format(", {} by {}", GiB(running), s.iteration);
  }
  return out;
}

}  // namespace

Bytes NearestRankPercentile(std::vector<Bytes> values, double pct) {
  MEMSIM_CHECK(!values.empty() && pct > 0 && pct <= 100);
  const auto n = static_cast<double>(values.size());
  auto rank = static_cast<size_t>(std::ceil(pct / 100.0 * n));
  rank = std::clamp<size_t>(rank, 1, values.size());
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank - 1), values.end());
  return values[rank - 1];
}

StepStats ComputeStepStats(const engine::RunResult& run) {
  StepStats st;
  std::vector<Bytes> peaks;
  Bytes reserved_so_far = 0;
  for (const timeline::SpanSummary& s : run.Reported().spans) {
    if (s.iteration == 0) {
      reserved_so_far = s.peak_reserved_bytes;
      continue;
    }
    ++st.steps;
    peaks.push_back(s.peak_allocated_bytes);
    if (s.peak_allocated_bytes > st.max_peak_allocated) {
      st.max_peak_allocated = s.peak_allocated_bytes;
      st.max_step = s.iteration;
      st.max_micro_batch = s.peak_micro_batch;
    }
    st.max_peak_reserved = std::max(st.max_peak_reserved, s.peak_reserved_bytes);
    if (s.peak_reserved_bytes > reserved_so_far) {
      reserved_so_far = s.peak_reserved_bytes;
      st.reserved_last_grew = s.iteration;
    }
    const Bytes end_gap = s.end_reserved_bytes - s.end_allocated_bytes;
    if (end_gap > st.max_end_gap) {
      st.max_end_gap = end_gap;
      st.max_end_gap_step = s.iteration;
    }
    st.last_end_gap = end_gap;
    const Bytes peak_gap = s.peak_reserved_bytes - s.peak_allocated_bytes;
    if (peak_gap > st.max_peak_gap) {
      st.max_peak_gap = peak_gap;
      st.max_peak_gap_step = s.iteration;
    }
  }
  if (!peaks.empty()) {
    st.p99_peak_allocated = NearestRankPercentile(peaks, 99);
    st.median_peak_allocated = NearestRankPercentile(peaks, 50);
  }
  return st;
}

std::string FormatSteps(const engine::RunResult& run, const config::Setup& setup) {
  const config::TrainingConfig& tc = setup.training;
  if (!tc.data.Varies() || run.Reported().spans.size() < 2) return "";
  const StepStats st = ComputeStepStats(run);
  const std::vector<std::vector<int>> lengths = workload::MicroBatchLengths(tc, st.steps);
  std::string out = fmt::format(
      "\n{} steps of varying length ({} micro-batches of {} samples each, padded to the longest "
      "sample{}):\n",
      st.steps, tc.num_micro_batches, tc.micro_batch_size,
      tc.data.pad_to_multiple_of > 0 ? fmt::format(", a multiple of {}", tc.data.pad_to_multiple_of)
                                     : std::string());
  out += fmt::format("  peak allocated: max {} GiB at step {}, p99 {}, median {} GiB\n",
                     GiB(st.max_peak_allocated), st.max_step, GiB(st.p99_peak_allocated),
                     GiB(st.median_peak_allocated));
  if (st.max_step >= 1 && st.max_step <= static_cast<int>(lengths.size())) {
    const std::vector<int>& at = lengths[static_cast<size_t>(st.max_step - 1)];
    out += fmt::format("  step {}'s micro-batches: {} tokens{}\n", st.max_step,
                       JoinLengths(at, ", "),
                       st.max_micro_batch >= 0
                           ? fmt::format(" (peak in micro-batch {}, {} tokens)", st.max_micro_batch,
                                         at[static_cast<size_t>(st.max_micro_batch)])
                           : std::string());
  }
  out += fmt::format("  peak reserved: {}; last grew at step {}\n",
                     ReservedGrowth(run.Reported().spans), st.reserved_last_grew);
  out += fmt::format("  fragmentation (reserved - allocated): {} GiB cached unused at the last "
                     "step's end (max {} at step {}); peak reserved - peak allocated of a step: "
                     "max {} GiB (step {})\n",
                     GiB(st.last_end_gap), GiB(st.max_end_gap), st.max_end_gap_step,
                     GiB(st.max_peak_gap), st.max_peak_gap_step);
  return out;
}

std::string FormatStepsCsv(const engine::RunResult& run, const config::Setup& setup) {
  const std::vector<timeline::SpanSummary>& spans = run.Reported().spans;
  const std::vector<std::vector<int>> lengths =
      workload::MicroBatchLengths(setup.training, run.simulated_iterations);
  std::string out =
      "step,max_length,lengths,peak_allocated_bytes,peak_reserved_bytes,end_allocated_bytes,"
      "end_reserved_bytes,end_gap_bytes,peak_gap_bytes\n";
  for (const timeline::SpanSummary& s : spans) {
    if (s.iteration == 0) continue;
    const bool known = s.iteration <= static_cast<int>(lengths.size());
    const std::vector<int>* l = known ? &lengths[static_cast<size_t>(s.iteration - 1)] : nullptr;
    out += fmt::format("{},{},{},{},{},{},{},{},{}\n", s.iteration,
                       l ? fmt::format("{}", *std::max_element(l->begin(), l->end())) : "",
                       l ? JoinLengths(*l, ";") : "", s.peak_allocated_bytes,
                       s.peak_reserved_bytes, s.end_allocated_bytes, s.end_reserved_bytes,
                       s.end_reserved_bytes - s.end_allocated_bytes,
                       s.peak_reserved_bytes - s.peak_allocated_bytes);
  }
  return out;
}

}  // namespace memsim::report
