// The partition layout of DeepSpeed's ZeRO stage 1 / 2 optimizer (DeepSpeedZeroOptimizer,
// deepspeed/runtime/zero/stage_1_and_2.py, v0.16.9), a pure function apart from the wrapper that
// applies it (deepspeed_zero.cc) so that a test can check it against a hand derivation.
// Per optimizer param group, DeepSpeedZeroOptimizer.__init__ flattens the group's trainable
// 16-bit parameters, in the group's order (round_robin_gradients false, the default), into one
// buffer padded at its end to a multiple of nccl_start_alignment_factor (2) × dp
// (flatten_dense_tensors_aligned, runtime/utils.py align_dense_tensors), and splits it into dp
// equal partitions (get_data_parallel_partitions); rank r updates partition r. A parameter is "in
// the partition" when its range overlaps it (get_partition_info): those gradients are the ones
// copy_grads_in_partition keeps, whole, in grads_in_partition (the sum of their numel).
// Not modelled: round_robin_gradients (a warning where set). Counts in elements.
#pragma once

#include <cstdint>
#include <vector>

#include "workload/model.h"

namespace memsim::workload {

// stage_1_and_2.py: self.nccl_start_alignment_factor = 2 (4-byte alignment of 2-byte elements).
inline constexpr std::int64_t kZeroAlignmentFactor = 2;

struct ZeroGroupLayout {
  std::vector<int> params;          // the group's parameter indices, in flat order
  std::vector<bool> in_partition;   // per entry of `params`: overlaps the rank's partition
  std::int64_t numel = 0;           // the parameters' elements (orig_group_numel)
  std::int64_t padded = 0;          // bit16_groups_flat numel: numel rounded up to 2·dp
  std::int64_t partition = 0;       // padded / dp, the fp32 partition and its state
  std::int64_t grads_in_partition = 0;  // sum of the numel of the parameters in the partition
};

// The layout of `group` (indices into `params`, frozen ones skipped: the optimizer holds only
// trainable parameters) for data-parallel rank `rank` of `dp`. REQUIRES: dp >= 1, 0 <= rank < dp.
ZeroGroupLayout LayoutZeroGroup(const std::vector<ParamTensor>& params,
                                const std::vector<int>& group, int dp, int rank);

}  // namespace memsim::workload
