// Seeded, training-like allocator traces for the property test and the benchmark: parameters
// allocated once, then iterations of a forward pass (activations kept, temporaries freed soon),
// a backward pass (activations freed in reverse, gradient temporaries), an optimizer step, with
// some work on a second stream (record_stream + complete) and an occasional empty_cache.
// Sizes mix log-uniform tensor sizes with the allocator's boundaries (512 B, 1 MiB, 10 MiB,
// 2 MiB multiples). Deterministic: the same options give the same trace. Not a model of any
// real network; see workload/ for that.
#pragma once

#include <cstdint>

#include "replay/trace.h"

namespace memsim::replay {

struct SyntheticOptions {
  std::uint64_t seed = 1;
  std::int64_t operations = 10000;    // stop after about this many records
  int layers = 8;
  int activations_per_layer = 6;
  Bytes max_activation_bytes = 64 * kMiB;
  Bytes max_parameter_bytes = 128 * kMiB;
  int parameters = 24;
  bool second_stream = true;          // record_stream / complete on stream 1
  double empty_cache_per_iteration = 0.2;
};

Trace GenerateTrainingTrace(const SyntheticOptions& options);

}  // namespace memsim::replay
