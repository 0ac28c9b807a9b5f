// Property test: seeded random training-like traces (replay/synthetic.h) through every
// allocator flavour, with CheckInvariants (tiling, merging, pool membership, and a recount of
// every gauge) after each operation. Bounded: a few thousand operations per configuration.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "naive_model.h"
#include "replay/synthetic.h"
#include "replay/trace.h"

namespace memsim::alloc {
namespace {

struct Config {
  const char* name;
  Backend backend;
  const char* conf;
  Bytes capacity;  // 0 = unbounded
};

const Config kConfigs[] = {
    {"cuda default", Backend::kCuda, "", 0},
    {"cuda capacity", Backend::kCuda, "", 420 * kMiB},
    {"cuda max_split", Backend::kCuda, "max_split_size_mb:64,max_non_split_rounding_mb:8",
     420 * kMiB},
    {"cuda power2", Backend::kCuda, "roundup_power2_divisions:[2:8,64:4,>:2]", 0},
    {"cuda gc", Backend::kCuda,
     "garbage_collection_threshold:0.6,memory_fraction:0.8,max_split_size_mb:128", 600 * kMiB},
    {"cuda expandable", Backend::kCuda, "expandable_segments:True", 0},
    {"cuda expandable capacity", Backend::kCuda, "expandable_segments:True", 450 * kMiB},
    {"cuda expandable max_split", Backend::kCuda,
     "expandable_segments:True,max_split_size_mb:100", 0},
    {"npu default", Backend::kNpu, "", 0},
    {"npu gc", Backend::kNpu, "garbage_collection_threshold:0.5,memory_fraction:0.9", 560 * kMiB},
    {"npu expandable", Backend::kNpu, "expandable_segments:True", 480 * kMiB},
    {"npu expandable align 4", Backend::kNpu, "expandable_segments:True,base_addr_aligned_kb:4",
     0},
};

// Replays `trace`, checking the invariants after every operation.
AllocatorStats ReplayChecked(const replay::Trace& trace, Allocator& a) {
  std::vector<std::optional<BlockHandle>> handles(trace.ids.size());
  for (const replay::TraceRecord& r : trace.records) {
    switch (r.op) {
      case replay::TraceOp::kMalloc:
        handles[r.id] = a.Malloc(r.bytes, r.stream);
        break;
      case replay::TraceOp::kFree:
        if (handles[r.id]) a.Free(*handles[r.id]);
        handles[r.id].reset();
        break;
      case replay::TraceOp::kRecordStream:
        if (handles[r.id]) a.RecordStream(*handles[r.id], r.stream);
        break;
      case replay::TraceOp::kComplete:
        a.CompleteStream(r.stream);
        break;
      case replay::TraceOp::kEmptyCache:
        a.EmptyCache();
        break;
    }
    const std::string problem = a.CheckInvariants();
    if (!problem.empty()) {
      FAIL("after record " << r.line << " (" << replay::TraceOpName(r.op) << "): " << problem);
    }
  }
  return a.Stats();
}

TEST_CASE("property: random training-like traces keep every invariant", "[alloc]") {
  for (const Config& c : kConfigs) {
    for (std::uint64_t seed : {1u, 2u}) {
      INFO(c.name << ", seed " << seed);
      replay::SyntheticOptions so;
      so.seed = seed * 7919 + static_cast<std::uint64_t>(c.backend == Backend::kNpu);
      so.operations = 1500;
      const replay::Trace trace = replay::GenerateTrainingTrace(so);
      AllocatorOptions o = ParseAllocConf(c.conf, c.backend);
      if (c.capacity) o.capacity_bytes = c.capacity;
      ValidateOptions(o);
      auto a = NewCachingAllocator(o);
      const AllocatorStats first = ReplayChecked(trace, *a);
      // Deterministic: the plain replayer gives the same stats.
      auto b = NewCachingAllocator(o);
      CHECK(replay::Replay(trace, *b, false).stats == first);
      // Peaks dominate and counters are sane.
      CHECK(first.reserved_bytes.peak >= first.allocated_bytes.peak);
      CHECK(first.active_bytes.peak >= first.allocated_bytes.peak);
      if (c.capacity) CHECK(first.reserved_bytes.peak <= c.capacity);
      CHECK(first.num_ooms <= first.num_alloc_retries);
    }
  }
}

TEST_CASE("property: the capacity configurations do reach the out-of-memory path", "[alloc]") {
  // Guard against a generator change that silently stops exercising OOM / GC.
  replay::SyntheticOptions so;
  so.seed = 7919;
  so.operations = 1500;
  const replay::Trace trace = replay::GenerateTrainingTrace(so);
  AllocatorOptions o = ParseAllocConf("", Backend::kCuda);
  o.capacity_bytes = 420 * kMiB;
  auto a = NewCachingAllocator(o);
  const AllocatorStats s = replay::Replay(trace, *a, false).stats;
  CHECK(s.num_alloc_retries > 0);
  CHECK(s.num_ooms > 0);
}

TEST_CASE("differential: the model agrees with a naive model of the rules", "[alloc]") {
  for (const Config& c : kConfigs) {
    for (std::uint64_t seed : {11u, 12u}) {
      INFO(c.name << ", seed " << seed);
      replay::SyntheticOptions so;
      so.seed = seed;
      so.operations = 1200;
      const replay::Trace trace = replay::GenerateTrainingTrace(so);
      AllocatorOptions o = ParseAllocConf(c.conf, c.backend);
      if (c.capacity) o.capacity_bytes = c.capacity;
      auto a = NewCachingAllocator(o);
      testing::NaiveModel n(o);
      std::vector<std::optional<BlockHandle>> handles(trace.ids.size());
      std::vector<std::optional<Bytes>> addrs(trace.ids.size());
      for (const replay::TraceRecord& r : trace.records) {
        switch (r.op) {
          case replay::TraceOp::kMalloc:
            handles[r.id] = a->Malloc(r.bytes, r.stream);
            addrs[r.id] = n.Malloc(r.bytes, r.stream);
            REQUIRE(handles[r.id].has_value() == addrs[r.id].has_value());
            break;
          case replay::TraceOp::kFree:
            if (handles[r.id]) a->Free(*handles[r.id]);
            if (addrs[r.id]) n.Free(*addrs[r.id]);
            handles[r.id].reset();
            addrs[r.id].reset();
            break;
          case replay::TraceOp::kRecordStream:
            if (handles[r.id]) a->RecordStream(*handles[r.id], r.stream);
            if (addrs[r.id]) n.Record(*addrs[r.id], r.stream);
            break;
          case replay::TraceOp::kComplete:
            a->CompleteStream(r.stream);
            n.Complete(r.stream);
            break;
          case replay::TraceOp::kEmptyCache:
            a->EmptyCache();
            n.EmptyCache();
            break;
        }
        const AllocatorStats& s = a->Stats();
        INFO("record " << r.line << " " << replay::TraceOpName(r.op) << " " << r.bytes);
        REQUIRE(s.allocated_bytes.current == n.allocated.current);
        REQUIRE(s.reserved_bytes.current == n.reserved.current);
        REQUIRE(s.active_bytes.current == n.active.current);
        REQUIRE(s.requested_bytes.current == n.requested.current);
        REQUIRE(s.segment.current == n.segment.current);
        REQUIRE(s.inactive_split_bytes.current == n.InactiveSplitBytes());
        REQUIRE(s.num_alloc_retries == n.num_alloc_retries);
        REQUIRE(s.num_ooms == n.num_ooms);
      }
      const AllocatorStats& s = a->Stats();
      CHECK(s.allocated_bytes.peak == n.allocated.peak);
      CHECK(s.reserved_bytes.peak == n.reserved.peak);
      CHECK(s.active_bytes.peak == n.active.peak);
      CHECK(s.requested_bytes.peak == n.requested.peak);
      CHECK(s.segment.peak == n.segment.peak);
    }
  }
}

}  // namespace
}  // namespace memsim::alloc
