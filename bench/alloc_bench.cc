// Allocator benchmark (not a test): replays a seeded training-like trace (replay/synthetic.h)
// through the caching-allocator model and reports operations per second. Results go to
// docs/performance.md. Usage: alloc_bench [operations] [repeats]  (defaults 2000000, 5).
// `alloc_bench --write-csv FILE [operations]` writes the same seeded trace as a CSV trace
// (docs/interfaces.md, 'Allocator traces') for timing `memsim replay` end to end.
// Wall-clock time is read here only; the model itself never reads a clock.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "alloc/allocator.h"
#include "replay/synthetic.h"
#include "replay/trace.h"

namespace {

using memsim::alloc::AllocatorOptions;
using memsim::alloc::Backend;

struct Config {
  const char* name;
  Backend backend;
  const char* conf;
  memsim::Bytes capacity;
};

// The trace as CSV lines op,id,bytes,stream; returns the process exit code.
int WriteCsv(const memsim::replay::Trace& trace, const char* path) {
  std::FILE* f = std::fopen(path, "wb");
  if (f == nullptr) {
    std::perror(path);
    return 2;
  }
  std::fputs("op,id,bytes,stream\n", f);
  for (const auto& r : trace.records) {
    const std::string op(memsim::replay::TraceOpName(r.op));
    const char* id = r.id >= 0 ? trace.ids[static_cast<std::size_t>(r.id)].c_str() : "";
    std::fprintf(f, "%s,%s,%lld,%d\n", op.c_str(), id, static_cast<long long>(r.bytes),
                 static_cast<int>(r.stream));
  }
  return std::fclose(f) == 0 ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "--write-csv") {
    memsim::replay::SyntheticOptions so;
    so.seed = 42;
    so.operations = argc > 3 ? std::atoll(argv[3]) : 2000000;
    return WriteCsv(memsim::replay::GenerateTrainingTrace(so), argv[2]);
  }
  const std::int64_t operations = argc > 1 ? std::atoll(argv[1]) : 2000000;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  memsim::replay::SyntheticOptions so;
  so.seed = 42;
  so.operations = operations;
  const auto gen_start = std::chrono::steady_clock::now();
  const memsim::replay::Trace trace = memsim::replay::GenerateTrainingTrace(so);
  const double gen_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - gen_start).count();
  std::int64_t mallocs = 0, frees = 0;
  for (const auto& r : trace.records) {
    mallocs += r.op == memsim::replay::TraceOp::kMalloc;
    frees += r.op == memsim::replay::TraceOp::kFree;
  }
  std::printf("trace: %zu operations (%lld malloc, %lld free), generated in %.2f s\n",
              trace.records.size(), static_cast<long long>(mallocs),
              static_cast<long long>(frees), gen_s);
  const Config configs[] = {
      {"cuda default", Backend::kCuda, "", 0},
      {"cuda expandable_segments", Backend::kCuda, "expandable_segments:True", 0},
      {"cuda max_split+gc, 2 GiB", Backend::kCuda,
       "max_split_size_mb:128,garbage_collection_threshold:0.6,memory_fraction:0.9",
       2 * memsim::kGiB},
      {"npu default", Backend::kNpu, "", 0},
  };
  for (const Config& c : configs) {
    AllocatorOptions o = memsim::alloc::ParseAllocConf(c.conf, c.backend);
    if (c.capacity) o.capacity_bytes = c.capacity;
    memsim::alloc::ValidateOptions(o);
    double best = 1e30;
    memsim::alloc::AllocatorStats stats;
    for (int i = 0; i < repeats; ++i) {
      auto a = memsim::alloc::NewCachingAllocator(o);
      const auto start = std::chrono::steady_clock::now();
      const auto result = memsim::replay::Replay(trace, *a, false);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::min(best, s);
      stats = result.stats;
    }
    const double n = static_cast<double>(trace.records.size());
    std::printf(
        "%-28s best of %d: %.3f s  %.2f M ops/s  %.2f M malloc+free/s  (peak reserved %.1f "
        "MiB, ooms %lld)\n",
        c.name, repeats, best, n / best / 1e6, static_cast<double>(mallocs + frees) / best / 1e6,
        static_cast<double>(stats.reserved_bytes.peak) / memsim::kMiB,
        static_cast<long long>(stats.num_ooms));
  }
  return 0;
}
