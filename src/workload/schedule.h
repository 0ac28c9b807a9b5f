// Pipeline schedules (docs/training-memory.md, 'Pipeline schedules'): the order in which one
// pipeline rank runs the forward and backward passes of its micro-batches and model chunks in one
// iteration. Source: NVIDIA/Megatron-LM `megatron/core/pipeline_parallel/schedules.py`
// (`forward_backward_no_pipelining`, `forward_backward_pipelining_without_interleaving`,
// `forward_backward_pipelining_with_interleaving`, `get_schedule_table`).
#pragma once

#include <vector>

namespace memsim::workload {

struct ScheduleStep {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;  // model chunk (VPP); 0 without interleaving
  bool operator==(const ScheduleStep&) const = default;
};

// REQUIRES: p >= 1, 0 <= rank < p, m >= 1, v >= 1 (v > 1 only with p > 1).
// p = 1: F(j), B(j) for every micro-batch j (no pipelining).
// v = 1: 1F1B with warm-up w = min(p - rank - 1, m) forwards, m - w steady (F, B) pairs and w
//        cool-down backwards; rank holds min(p - rank, m) micro-batches at its peak.
// v > 1: interleaved 1F1B over m·v units with micro-batch groups of G = p; warm-up
//        min((p - rank - 1)·2 + (v - 1)·G, m·v); backward units visit chunks in reverse.
std::vector<ScheduleStep> PipelineSchedule(int p, int rank, int m, int v);

}  // namespace memsim::workload
