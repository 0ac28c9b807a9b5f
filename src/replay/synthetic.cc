#include "replay/synthetic.h"

#include <cmath>
#include <string>
#include <vector>

namespace memsim::replay {
namespace {

// splitmix64: tiny, seedable, identical everywhere.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  std::int64_t Below(std::int64_t n) { return static_cast<std::int64_t>(Next() % n); }

 private:
  std::uint64_t state_;
};

// A tensor size: mostly log-uniform in [1, max], sometimes right at an allocator boundary.
Bytes TensorBytes(Rng& rng, Bytes max_bytes) {
  static constexpr Bytes kEdges[] = {512,          kMiB,          10 * kMiB, 2 * kMiB, 20 * kMiB,
                                     19 * kMiB,    9 * kMiB,      1000,      4096,     kMiB - 32,
                                     18 * kMiB + 1, 100 * kMiB};
  if (rng.Below(8) == 0) {
    const Bytes edge = kEdges[rng.Below(std::size(kEdges))];
    const Bytes b = edge + (rng.Below(3) - 1) * (rng.Below(2) ? 1 : 512);
    return b > 0 ? b : 1;
  }
  const double lo = std::log(1.0), hi = std::log(static_cast<double>(max_bytes));
  return std::max<Bytes>(1, static_cast<Bytes>(std::exp(lo + (hi - lo) * rng.Uniform())));
}

class Builder {
 public:
  explicit Builder(Trace& t) : t_(t) {}
  std::int32_t Malloc(Bytes bytes, alloc::StreamId stream) {
    const auto id = static_cast<std::int32_t>(t_.ids.size());
    t_.ids.push_back("t" + std::to_string(id));
    Add({TraceOp::kMalloc, id, bytes, stream, 0});
    return id;
  }
  void Free(std::int32_t id) { Add({TraceOp::kFree, id, 0, 0, 0}); }
  void Record(std::int32_t id, alloc::StreamId s) { Add({TraceOp::kRecordStream, id, 0, s, 0}); }
  void Complete(alloc::StreamId s) { Add({TraceOp::kComplete, -1, 0, s, 0}); }
  void EmptyCache() { Add({TraceOp::kEmptyCache, -1, 0, 0, 0}); }
  std::int64_t size() const { return static_cast<std::int64_t>(t_.records.size()); }

 private:
  void Add(TraceRecord r) {
    r.line = static_cast<std::int32_t>(t_.records.size() + 1);
    t_.records.push_back(r);
  }
  Trace& t_;
};

}  // namespace

Trace GenerateTrainingTrace(const SyntheticOptions& o) {
  Trace trace;
  trace.file_name = "synthetic";
  trace.records.reserve(static_cast<std::size_t>(o.operations) + 64);
  Rng rng(o.seed);
  Builder b(trace);
  for (int i = 0; i < o.parameters; ++i) b.Malloc(TensorBytes(rng, o.max_parameter_bytes), 0);
  std::vector<std::int32_t> saved;
  while (b.size() < o.operations) {
    // Forward.
    for (int layer = 0; layer < o.layers && b.size() < o.operations; ++layer) {
      for (int k = 0; k < o.activations_per_layer; ++k) {
        const std::int32_t tmp = b.Malloc(TensorBytes(rng, o.max_activation_bytes), 0);
        saved.push_back(b.Malloc(TensorBytes(rng, o.max_activation_bytes), 0));
        b.Free(tmp);
      }
      if (o.second_stream && rng.Below(3) == 0) {
        // A collective on stream 1 whose output is then used on stream 0.
        const std::int32_t buf = b.Malloc(TensorBytes(rng, o.max_activation_bytes), 1);
        b.Record(buf, 0);
        b.Free(buf);
        if (rng.Below(2) == 0) b.Complete(0);
        const std::int32_t in = saved.back();
        saved.pop_back();
        b.Record(in, 1);
        b.Free(in);
        if (rng.Below(2) == 0) b.Complete(1);
      }
    }
    // Backward.
    while (!saved.empty()) {
      const std::int32_t grad = b.Malloc(TensorBytes(rng, o.max_activation_bytes), 0);
      b.Free(saved.back());
      saved.pop_back();
      b.Free(grad);
    }
    // Optimizer step.
    std::vector<std::int32_t> step;
    for (int i = 0; i < 4; ++i) step.push_back(b.Malloc(TensorBytes(rng, o.max_parameter_bytes), 0));
    for (std::int32_t id : step) b.Free(id);
    if (o.second_stream) b.Complete(1);
    if (rng.Uniform() < o.empty_cache_per_iteration) b.EmptyCache();
  }
  return trace;
}

}  // namespace memsim::replay
