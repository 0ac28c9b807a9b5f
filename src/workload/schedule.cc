#include "workload/schedule.h"

#include <algorithm>

#include "core/check.h"

namespace memsim::workload {

std::vector<ScheduleStep> PipelineSchedule(int p, int rank, int m, int v) {
  MEMSIM_CHECK(p >= 1 && rank >= 0 && rank < p && m >= 1 && v >= 1);
  std::vector<ScheduleStep> out;
  if (p == 1 && v == 1) {
    for (int j = 0; j < m; ++j) {
      out.push_back({true, j, 0});
      out.push_back({false, j, 0});
    }
    return out;
  }
  // Unit k of the forward order: `get_schedule_table` walks micro-batch groups of size G, and
  // inside a group every chunk over the group's micro-batches. Backward unit k is the same
  // micro-batch with the chunk mirrored (v - 1 - chunk).
  const int G = p;
  std::vector<ScheduleStep> table;
  for (int first = 0; first < m; first += G) {
    const int last = std::min(first + G, m);
    for (int c = 0; c < v; ++c) {
      for (int j = first; j < last; ++j) table.push_back({true, j, c});
    }
  }
  const int units = m * v;
  const int warmup =
      v == 1 ? std::min(p - rank - 1, m) : std::min((p - rank - 1) * 2 + (v - 1) * G, units);
  auto fwd = [&](int k) { return table[k]; };
  auto bwd = [&](int k) {
    return ScheduleStep{false, table[k].micro_batch, v - 1 - table[k].chunk};
  };
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int i = 0; i < units - warmup; ++i) {
    out.push_back(fwd(warmup + i));
    out.push_back(bwd(i));
  }
  for (int k = units - warmup; k < units; ++k) out.push_back(bwd(k));
  return out;
}

}  // namespace memsim::workload
