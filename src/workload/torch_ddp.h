// PyTorch DistributedDataParallel's bucket assignment (torch/csrc/distributed/c10d/reducer.cpp
// compute_bucket_assignment_by_size), the one rule both its gradient buckets and its start-up
// broadcast of the module states use; a pure function, apart from the wrapper that applies it
// (torch_ddp.cc) so that a test can check it against a hand derivation. Sizes in bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/units.h"

namespace memsim::workload {

// One tensor handed to the assignment: its index (what the buckets list), its bytes
// (numel × element_size) and a key standing for its (dtype, device): tensors of different keys
// never share a bucket.
struct DdpTensor {
  int index = 0;
  Bytes bytes = 0;
  int dtype = 0;
};

// The buckets, each a list of tensor indices in the order given. Per dtype key, tensors are taken
// in order and a bucket closes as soon as it holds at least the current limit (so one tensor over
// the limit makes a bucket of its own); each closed bucket advances to the next limit, the last
// limit repeating. The open buckets of each key close at the end (in key order; PyTorch walks an
// unordered_map there, so with several keys its order is unspecified). With
// `sort_by_min_index` (PyTorch: no tensor_indices given, the construction-time assignment)
// the buckets are sorted by their smallest index; without it (the rebuilt assignment, tensors in
// gradient-ready order) they stay in the order they closed.
// REQUIRES: limits non-empty, each > 0.
std::vector<std::vector<int>> DdpBucketAssignment(const std::vector<DdpTensor>& tensors,
                                                  const std::vector<Bytes>& limits,
                                                  bool sort_by_min_index);

// dist._DEFAULT_FIRST_BUCKET_BYTES (torch/distributed/distributed_c10d.py): 1 MiB.
inline constexpr Bytes kDdpFirstBucketBytes = Bytes{1} << 20;
// DistributedDataParallel(bucket_cap_mb=None) takes 25: 25 MiB.
inline constexpr double kDdpDefaultBucketCapMb = 25;
// DistributedDataParallel.__init__: self.broadcast_bucket_size = int(250 * 1024 * 1024).
inline constexpr Bytes kDdpBroadcastBucketBytes = Bytes{250} << 20;

}  // namespace memsim::workload
