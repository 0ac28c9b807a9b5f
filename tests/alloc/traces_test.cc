// Hand-derived traces beyond the conformance table (conformance_test.cc): several streams with
// record_stream / complete, torch_npu's same-stream deferral, the out-of-memory path with pending
// frees, expandable segments with holes and capacity, and garbage-collection ages. Each expected
// number is derived in the comments from the rules in docs/allocator-rules.md (headings cited in
// quotes).
#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "alloc_test_util.h"

namespace memsim::alloc {
namespace {

using testing::AllocFixture;
constexpr Bytes MiB = kMiB;

AllocatorOptions Conf(const char* conf, Backend backend = Backend::kCuda, Bytes capacity = 0) {
  AllocatorOptions o = ParseAllocConf(conf, backend);
  if (capacity > 0) o.capacity_bytes = capacity;
  ValidateOptions(o);
  return o;
}

TEST_CASE("streams: a recorded block returns to its pool at the malloc after complete",
          "[alloc]") {
  AllocFixture f;
  f.Run("malloc a 4MiB 0; malloc b 4MiB 1");
  // One 20 MiB buffer per stream (no cross-stream reuse, 'Pools and segment sizes').
  CHECK(f.Reserved() == 40 * MiB);
  f.Run("record a 1; free a");
  // allocated drops now; a stays active until stream 1's event completes ('Free and merge').
  CHECK(f.Allocated() == 4 * MiB);
  CHECK(f.Active() == 8 * MiB);
  f.Run("malloc c 4MiB 0");
  // c splits the 16 MiB tail of stream 0's buffer (a is not in the pool): [a][c][12 MiB].
  CHECK(f.Reserved() == 40 * MiB);
  CHECK(f.Active() == 12 * MiB);
  f.Run("complete 1");
  // complete only marks the event done; the block is freed by the next malloc
  // ('Convention: stream events').
  CHECK(f.Active() == 12 * MiB);
  f.Run("malloc d 1000 1");
  // process_events frees a: it cannot merge (c is allocated), so a is a 4 MiB inactive split.
  // d (1024 B, small pool, stream 1) takes a new 2 MiB segment.
  CHECK(f.Allocated() == 8 * MiB + 1024);
  CHECK(f.Active() == 8 * MiB + 1024);
  CHECK(f.Reserved() == 42 * MiB);
  CHECK(f.Segments() == 3);
  // Inactive splits: a (4 MiB) and the 12 MiB tail in stream 0's buffer, the 16 MiB tail of
  // stream 1's buffer, the 2 MiB - 1024 remainder of d's segment.
  CHECK(f.S().inactive_split.current == 4);
  CHECK(f.S().inactive_split_bytes.current == 32 * MiB + 2 * MiB - 1024);
}

TEST_CASE("streams: a block recorded on two streams waits for both", "[alloc]") {
  AllocFixture f;
  f.Run("malloc a 12MiB 0; record a 1; record a 2; free a; complete 1; malloc b 1000 0");
  // One of two events done: a stays active (12 MiB) and b adds 1024.
  CHECK(f.Active() == 12 * MiB + 1024);
  f.Run("complete 2; malloc c 12MiB 0");
  // Both done: a's 12 MiB segment is whole and free again; c reuses it (no new segment).
  CHECK(f.Reserved() == 12 * MiB + 2 * MiB);
  CHECK(f.Segments() == 2);
  CHECK(f.Active() == 12 * MiB + 1024);
}

TEST_CASE("streams: empty_cache synchronizes pending frees first", "[alloc]") {
  AllocFixture f;
  f.Run("malloc a 12MiB 0; record a 3; free a; empty_cache");
  // synchronize_and_free_events frees a; its whole segment is then released ('empty_cache').
  CHECK(f.Active() == 0);
  CHECK(f.Reserved() == 0);
}

TEST_CASE("npu: record_stream on the block's own stream still defers the free", "[alloc]") {
  SECTION("npu") {
    AllocFixture f(Conf("", Backend::kNpu));
    f.Run("malloc a 1000 0; record a 0; free a");
    // 1000 + 32 -> 1536 B; the same-stream record inserts an event ('record_stream and events').
    CHECK(f.Allocated() == 0);
    CHECK(f.Active() == 1536);
    f.Run("malloc b 1000 0");
    // a is still pending: b is cut from the remainder after a: [a][b][2 MiB - 3072].
    CHECK(f.S().inactive_split.current == 1);
    CHECK(f.S().inactive_split_bytes.current == 2 * MiB - 3072);
    f.Run("complete 0; malloc c 1000 0");
    // a is freed (it cannot merge: b is allocated, nothing before it) and, being the
    // smallest free block >= 1536 on stream 0, is reused whole by c.
    CHECK(f.Allocated() == 2 * 1536);
    CHECK(f.S().inactive_split.current == 1);
    CHECK(f.S().inactive_split_bytes.current == 2 * MiB - 3072);
  }
  SECTION("cuda ignores it") {
    AllocFixture f;
    f.Run("malloc a 1000 0; record a 0; free a");
    CHECK(f.Active() == 0);
  }
}

TEST_CASE("oom path: release_cached_blocks frees pending blocks before the retry", "[alloc]") {
  AllocFixture f(Conf("", Backend::kCuda, 50 * MiB));
  f.Run("malloc a 30MiB 0; record a 1; free a; malloc b 30MiB 0");
  // b: no free block (a pending); 30 + 30 > 50 fails; release_cached_blocks synchronizes
  // (a becomes a whole free segment) and frees it; the retry succeeds.
  CHECK(f.Reserved() == 30 * MiB);
  CHECK(f.Segments() == 1);
  CHECK(f.S().num_alloc_retries == 1);
  CHECK(f.S().num_ooms == 0);
  CHECK(f.S().reserved_bytes.peak == 30 * MiB);
}

TEST_CASE("oom path: partly used segments are not released", "[alloc]") {
  AllocFixture f(Conf("", Backend::kCuda, 40 * MiB));
  f.Run("malloc a 4MiB; malloc b 4MiB; free a; malloc c 30MiB");
  // a and b share a 20 MiB buffer; after free a it is still split (b allocated), so
  // release_cached_blocks frees nothing; 20 + 30 > 40 twice: one retry, one OOM.
  CHECK(f.Reserved() == 20 * MiB);
  CHECK(f.S().num_alloc_retries == 1);
  CHECK(f.S().num_ooms == 1);
  CHECK(f.Allocated() == 4 * MiB);
}

TEST_CASE("gc: only blocks at least as old as the average are released", "[alloc]") {
  // allowed = floor(0.5 x 200 MiB) = 100 MiB; GC starts above 0.5 x 100 = 50 MiB.
  const char* script =
      "malloc a 30MiB 0; malloc b 30MiB 0; free a; malloc x 10MiB 1; free x; "
      "malloc y 10MiB 1; free y; malloc c 40MiB 0";
  // Large-pool get_free_block calls: a 1, b 2, x 3, y 4 (reuses x's segment), c 5.
  // a was inserted at count 2, y's segment at 4. At c: ages a 3, y 1; average 2.
  SECTION("with gc") {
    AllocFixture f(Conf("memory_fraction:0.5,garbage_collection_threshold:0.5",
                        Backend::kCuda, 200 * MiB));
    f.Run(script);
    // 70 MiB reserved > 50: target 20; a (age 3 >= 2) is freed (30 >= 20, stop); y's 10 MiB
    // segment stays. c: 40 + 40 <= 100: a new 40 MiB segment. 30 + 10 + 40 = 80 MiB.
    CHECK(f.Reserved() == 80 * MiB);
    CHECK(f.Segments() == 3);
    CHECK(f.S().num_alloc_retries == 0);
    CHECK(f.Allocated() == 70 * MiB);
  }
  SECTION("without gc the fraction forces the retry path") {
    AllocFixture f(Conf("memory_fraction:0.5", Backend::kCuda, 200 * MiB));
    f.Run(script);
    // 70 + 40 > 100: alloc_block fails; release_cached_blocks frees a and y's segment;
    // the retry succeeds: 30 + 40 = 70 MiB.
    CHECK(f.Reserved() == 70 * MiB);
    CHECK(f.Segments() == 2);
    CHECK(f.S().num_alloc_retries == 1);
  }
}

TEST_CASE("max_split: release_available frees oversize blocks from the largest down",
          "[alloc]") {
  AllocFixture f(Conf("max_split_size_mb:40", Backend::kCuda, 150 * MiB));
  f.Run("malloc a 50MiB; malloc b 60MiB; free a; free b; malloc c 100MiB");
  // c (100 MiB): lower_bound finds nothing >= 100 MiB; 110 + 100 > 150 fails.
  // release_available: key = 100 MiB; walk down from the largest: b (60, released 60 < 100),
  // a (50, released 110): enough. Then 100 MiB is allocated: reserved 100 MiB, no retry.
  CHECK(f.Reserved() == 100 * MiB);
  CHECK(f.Segments() == 1);
  CHECK(f.S().num_alloc_retries == 0);
  CHECK(f.S().oversize_segments.current == 1);
  CHECK(f.S().oversize_allocations.current == 1);
}

TEST_CASE("expandable: one segment per stream, pages per pool", "[alloc]") {
  AllocFixture f(Conf("expandable_segments:True"));
  f.Run("malloc a 5MiB 0; malloc b 5MiB 1; malloc c 1000 0");
  // Two large-pool segments (one per stream), one 20 MiB page each; one small 2 MiB page.
  CHECK(f.Reserved() == 42 * MiB);
  CHECK(f.Segments() == 0);
  // Expandable blocks never count in inactive_split ('Expandable segments').
  CHECK(f.S().inactive_split.current == 0);
}

TEST_CASE("expandable: a hole left by empty_cache is mapped again", "[alloc]") {
  AllocFixture f(Conf("expandable_segments:True"));
  f.Run("malloc a 30MiB; malloc b 5MiB; free a; empty_cache");
  // E4: [0,20) unmapped, [20,30) free, [30,35) b, [35,40) free, 20 MiB reserved.
  CHECK(f.Reserved() == 20 * MiB);
  f.Run("malloc c 25MiB");
  // No free block >= 25 MiB. The lowest unmapped range [0,20) plus the free [20,30) after it
  // holds 30 MiB: page [0,20) is mapped and merges into [0,30); c splits off 25 MiB.
  CHECK(f.Reserved() == 40 * MiB);
  CHECK(f.Allocated() == 30 * MiB);
  f.Run("free b; free c; empty_cache");
  // Everything free merges into [0,40) and both pages are unmapped.
  CHECK(f.Reserved() == 0);
}

TEST_CASE("expandable: capacity stops the mapping, stats unchanged by the OOM", "[alloc]") {
  AllocFixture f(Conf("expandable_segments:True", Backend::kCuda, 40 * MiB));
  f.Run("malloc a 30MiB");
  // Two pages (40 MiB) mapped, a 10 MiB free tail.
  CHECK(f.Reserved() == 40 * MiB);
  CHECK_FALSE(f.Malloc("b", 15 * MiB));
  // Growing the tail needs one more page: 40 + 20 > 40. empty_cache-style release cannot unmap
  // part of a page ([30,40) holds no whole page); the retry fails too.
  CHECK(f.Reserved() == 40 * MiB);
  CHECK(f.S().num_alloc_retries == 1);
  CHECK(f.S().num_ooms == 1);
  f.Run("free a; malloc b 15MiB");
  // All 40 MiB free and merged: b splits it without mapping anything.
  CHECK(f.Reserved() == 40 * MiB);
  CHECK(f.Allocated() == 15 * MiB);
}

TEST_CASE("expandable: the free block not followed by unmapped space is preferred", "[alloc]") {
  AllocFixture f(Conf("expandable_segments:True"));
  f.Run("malloc a 6MiB; malloc b 6MiB; malloc c 4MiB; free a");
  // One 20 MiB page: [a 6][b 6][c 4][4 free tail]; free a leaves [0,6) free.
  // Free blocks: a (6 MiB, expandable size 6) and the tail (4 MiB + unmapped rest).
  f.Run("malloc d 3MiB");
  // lower_bound(3 MiB) finds the 4 MiB tail first, but its expandable size (4 MiB + the rest
  // of the virtual range) exceeds a's 6 MiB, so the search moves on to a: d at [0,3).
  f.Run("malloc e 6MiB");
  // Had d taken the tail, a's 6 MiB would now serve e. Instead the free blocks are [3,6)
  // (3 MiB) and the 4 MiB tail: e must grow the tail by one more 20 MiB page.
  CHECK(f.Reserved() == 40 * MiB);
  CHECK(f.Allocated() == 6 * MiB + 4 * MiB + 3 * MiB + 6 * MiB);
}

TEST_CASE("npu expandable: blocks of >= 2 MiB start 16 KiB-aligned", "[alloc]") {
  AllocFixture f(Conf("expandable_segments:True", Backend::kNpu));
  f.Run("malloc a 1572864; malloc b 3MiB");
  // a: 1.5 MiB + 32 -> 1,573,376 B (large pool: > 1 MiB), one 20 MiB page mapped.
  // b: 3 MiB + 32 -> 3,146,240 B >= 2 MiB; the free tail starts at 1,573,376, which is
  // 512 past a 16 KiB boundary (1,573,376 mod 16,384 = 512): a 15,872 B fragment is left
  // free and b starts at 1,589,248. The tail is 20 MiB - 1,589,248 - 3,146,240 = 16,236,032 B.
  CHECK(f.Allocated() == 1573376 + 3146240);
  CHECK(f.Reserved() == 20 * MiB);
  f.Run("malloc e 16251872");
  // 16,251,872 + 32 = 16,251,904 B > the 16,236,032 B tail: one more page is mapped.
  // (Without the fragment the tail would be 16,251,904 B and fit exactly; see below.)
  CHECK(f.Reserved() == 40 * MiB);
}

TEST_CASE("base_addr_aligned_kb:0 turns the npu alignment off", "[alloc]") {
  AllocFixture f(Conf("expandable_segments:True,base_addr_aligned_kb:0", Backend::kNpu));
  f.Run("malloc a 1572864; malloc b 3MiB; malloc e 16251872");
  // No fragment: the tail is 20 MiB - 1,573,376 - 3,146,240 = 16,251,904 B and e fits exactly.
  CHECK(f.Reserved() == 20 * MiB);
  CHECK(f.Allocated() == 20 * MiB);
}

TEST_CASE("power2 list: '>' fills the intervals after the last key", "[alloc]") {
  AllocatorOptions o = Conf("roundup_power2_divisions:[256:4,>:2]");
  // The first entry fills every lower interval: [1 MiB, 512 MiB) -> 4; '>' fills [512 MiB, ...).
  for (int i = 0; i <= 8; ++i) CHECK(o.roundup_power2_divisions[i] == 4);
  for (int i = 9; i < 16; ++i) CHECK(o.roundup_power2_divisions[i] == 2);
  AllocFixture f(o);
  f.Run("malloc a 600MiB");
  // 600 MiB in [512, 1024) with 2 divisions: step 256 MiB -> 768 MiB.
  CHECK(f.Allocated() == 768 * MiB);
}

}  // namespace
}  // namespace memsim::alloc

namespace memsim::alloc {
namespace {

TEST_CASE("boundaries: rounding, pools and the large-pool split rule", "[alloc]") {
  // (request, allocated after one malloc, reserved), derived from 'Rounding', 'Pools and segment
  // sizes' and 'Splitting':
  auto [request, allocated, reserved] = GENERATE(table<Bytes, Bytes, Bytes>({
      {1, 512, 2 * MiB},                    // minimum block 512
      {512, 512, 2 * MiB},
      {513, 1024, 2 * MiB},                 // next multiple of 512
      {1 * MiB, 1 * MiB, 2 * MiB},          // largest small-pool size
      {1 * MiB + 1, 1 * MiB + 512, 20 * MiB},  // large pool, 20 MiB buffer
      {10 * MiB - 512, 10 * MiB - 512, 20 * MiB},  // < kMinLargeAlloc: 20 MiB buffer, split
      {10 * MiB, 10 * MiB, 10 * MiB},       // own segment, no remainder
      // 19 MiB + 512: segment 20 MiB, remainder 1 MiB - 512 <= 1 MiB: not split.
      {19 * MiB + 512, 20 * MiB, 20 * MiB},
      // 19 MiB: remainder exactly 1 MiB: not split (the rule is remaining > 1 MiB).
      {19 * MiB, 20 * MiB, 20 * MiB},
      // 19 MiB - 512: remainder 1 MiB + 512 > 1 MiB: split.
      {19 * MiB - 512, 19 * MiB - 512, 20 * MiB},
  }));
  INFO("request " << request);
  AllocFixture f;
  f.Run("malloc a " + std::to_string(request));
  CHECK(f.Allocated() == allocated);
  CHECK(f.Reserved() == reserved);
}

TEST_CASE("boundaries: the small-pool split rule (remaining >= 512)", "[alloc]") {
  AllocFixture f;
  // In one 2 MiB small segment: a (1 MiB) leaves 1 MiB; b (1 MiB - 1024) leaves 1024 (split);
  // c (512) leaves 512 (>= 512: split); d (512) takes the rest exactly.
  f.Run("malloc a 1MiB; malloc b 1047552; malloc c 512; malloc d 512");
  CHECK(f.Allocated() == 2 * MiB);
  CHECK(f.Segments() == 1);
  CHECK(f.S().inactive_split.current == 0);
}

}  // namespace
}  // namespace memsim::alloc

namespace memsim::alloc {
namespace {

// NPU synchronisation (docs/allocator-rules.md, 'NPU synchronisation'; torch_npu
// NPUCachingAllocator.cpp, garbage_collect_cached_blocks and release_available_cached_blocks):
// the GC synchronises only after both early returns, release_available_cached_blocks after its
// max_split_size check, and a synchronise only marks events done: the waiting block returns to its
// pool at the next malloc's process_events. NPU sizes: request + 32 rounded up to 512 B, so
// N MiB becomes N MiB + 512; c (1000 B) becomes 1536 B in a 2 MiB small segment.
// GC settings below: allowed = floor(0.5 x 200 MiB) = 100 MiB, GC runs above 0.5 x 100 = 50 MiB.
constexpr const char* kGcConf = "memory_fraction:0.5,garbage_collection_threshold:0.5";

TEST_CASE("npu sync: a GC at or under its threshold returns without synchronising", "[alloc]") {
  AllocFixture f(Conf(kGcConf, Backend::kNpu, 200 * MiB));
  f.Run("malloc a 30MiB 0; record a 1; free a; malloc b 10MiB 0");
  // a: a 32 MiB segment, split (tail 2 MiB - 512 > 1 MiB). b (10 MiB + 512, a 12 MiB segment)
  // misses the cache; GC: reserved 32 MiB <= 50 MiB, early return, no synchronise.
  CHECK(f.Reserved() == 44 * MiB);
  CHECK(f.Active() == 40 * MiB + 1024);
  f.Run("malloc c 1000 0");
  // Stream 1 never completed and nothing synchronised: a is still active.
  CHECK(f.Active() == 40 * MiB + 1024 + 1536);
  f.Run("complete 1; malloc d 1000 0");
  // Now a returns; d shares c's small segment.
  CHECK(f.Active() == 10 * MiB + 512 + 2 * 1536);
}

TEST_CASE("npu sync: a GC with no freeable block returns without synchronising", "[alloc]") {
  AllocFixture f(Conf(kGcConf, Backend::kNpu, 200 * MiB));
  f.Run("malloc a 60MiB 0; record a 1; free a; malloc b 30MiB 0");
  // a: a 62 MiB segment, split. b (30 MiB + 512, a 32 MiB segment) misses. GC: 62 > 50, but the
  // large pool holds only a's split tail: no freeable block, early return, no synchronise.
  // 62 + 32 = 94 <= 100: a new segment, no retry. (Synchronising first would have returned a
  // whole, at age 0 = the average, and released it: 32 MiB.)
  CHECK(f.Reserved() == 94 * MiB);
  CHECK(f.Segments() == 2);
  CHECK(f.S().num_alloc_retries == 0);
  f.Run("malloc c 1000 0");
  CHECK(f.Active() == 90 * MiB + 1024 + 1536);
}

TEST_CASE("npu sync: a GC that releases synchronises, the waiting block returns at the next malloc",
          "[alloc]") {
  const char* script =
      "malloc a 30MiB 0; malloc x 30MiB 0; record a 1; free a; free x; malloc b 40MiB 0";
  SECTION("npu") {
    AllocFixture f(Conf(kGcConf, Backend::kNpu, 200 * MiB));
    f.Run(script);
    // a, x: 32 MiB segments; free x merges its tail: one whole 32 MiB block. b (40 MiB + 512,
    // a 42 MiB segment) misses. GC: 64 > 50, target 14 MiB; freeable: x alone, age 1 (b's
    // lookup) = the average: released. The synchronise marks a's event done but a stays out of
    // the pool. 32 + 42 = 74 MiB.
    CHECK(f.Reserved() == 74 * MiB);
    CHECK(f.Active() == 70 * MiB + 1024);
    f.Run("malloc c 1000 0");
    // No complete: process_events frees a because of the GC's synchronise; a merges with its
    // tail, a whole 32 MiB block. c misses the small pool, so the GC runs again: 74 > 50, and a
    // (age 0 = the average) is released; c adds a 2 MiB segment: 42 + 2 MiB.
    CHECK(f.Active() == 40 * MiB + 512 + 1536);
    CHECK(f.Reserved() == 44 * MiB);
  }
  SECTION("cuda") {
    AllocFixture f(Conf(kGcConf, Backend::kCuda, 200 * MiB));
    f.Run(script + std::string("; malloc c 1000 0"));
    // a, x: 30 MiB segments; GC (60 > 50) releases x; 30 + 40 + 2 MiB. CUDA's GC does not
    // synchronise: a is still active.
    CHECK(f.Reserved() == 72 * MiB);
    CHECK(f.Active() == 70 * MiB + 1024);
  }
}

TEST_CASE("npu sync: release_available_cached_blocks with nothing to release, events pending",
          "[alloc]") {
  const char* script = "malloc a 50MiB 0; record a 1; free a; malloc b 30MiB 0";
  SECTION("npu") {
    AllocFixture f(Conf("max_split_size_mb:40", Backend::kNpu, 70 * MiB));
    f.Run(script);
    // a: 50 MiB + 512 -> a 52 MiB segment, oversize, not split. b: 30 MiB + 512 -> 32 MiB.
    // 52 + 32 > 70 fails. release_available: key max(b, 40 MiB) = 40 MiB, the pool is empty
    // (a waits on its event): it synchronises and returns false. release_cached_blocks frees a
    // (synchronize_and_free_events) and its segment; the retry succeeds.
    CHECK(f.Reserved() == 32 * MiB);
    CHECK(f.S().num_alloc_retries == 1);
  }
  SECTION("cuda") {
    AllocFixture f(Conf("max_split_size_mb:40", Backend::kCuda, 70 * MiB));
    f.Run(script);
    // 50 + 30 > 70; the same path without the synchronise: one retry.
    CHECK(f.Reserved() == 30 * MiB);
    CHECK(f.S().num_alloc_retries == 1);
  }
}

TEST_CASE("npu sync: release_available_cached_blocks releases an oversize block, events pending",
          "[alloc]") {
  const char* script =
      "malloc a 50MiB 0; malloc x 50MiB 0; record a 1; free a; free x; malloc b 30MiB 0; "
      "malloc c 1000 0";
  SECTION("npu") {
    AllocFixture f(Conf("max_split_size_mb:40", Backend::kNpu, 120 * MiB));
    f.Run("malloc a 50MiB 0; malloc x 50MiB 0; record a 1; free a; free x; malloc b 30MiB 0");
    // a, x: 52 MiB oversize segments. b (32 MiB) may not take x (oversize block, small request).
    // 104 + 32 > 120. release_available: key 40 MiB, lower_bound finds x; synchronise; x is
    // released: 52 + 32 = 84 MiB, no retry. a (52 MiB, unsplit) is still active.
    CHECK(f.Reserved() == 84 * MiB);
    CHECK(f.S().num_alloc_retries == 0);
    CHECK(f.Active() == 82 * MiB + 512);
    f.Run("malloc c 1000 0");
    // The synchronise marked a's event done: process_events returns a to the pool.
    CHECK(f.Active() == 30 * MiB + 512 + 1536);
    CHECK(f.Reserved() == 86 * MiB);
  }
  SECTION("cuda") {
    AllocFixture f(Conf("max_split_size_mb:40", Backend::kCuda, 120 * MiB));
    f.Run(script);
    // 50 + 50 + 30 > 120: x released, no retry; no synchronise: a stays active.
    CHECK(f.Reserved() == 82 * MiB);
    CHECK(f.Active() == 80 * MiB + 1024);
  }
}

}  // namespace
}  // namespace memsim::alloc
