// memsim's allocator conformance cases (docs/allocator-rules.md, 'Conformance cases': core,
// max_split/power2, OOM/GC, expandable E1-E4, NPU N1-N7), one table row each. The comment above
// each row derives its expected numbers from the rules of docs/allocator-rules.md; the rows an
// upstream PyTorch or torch_npu test asserts are listed there. Out of scope: CUDA-graph private
// pools and the no-pad NPU.
#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "alloc_test_util.h"

namespace memsim::alloc {
namespace {

using testing::AllocFixture;
constexpr Bytes MiB = kMiB;
constexpr Bytes kUnchecked = -1;

struct Case {
  const char* id;
  Backend backend;
  const char* conf;   // --alloc-conf syntax
  Bytes capacity;     // 0 = unbounded
  const char* script;
  Bytes allocated, reserved, segments;
  // Extra checks, kUnchecked when the row gives none.
  Bytes requested = kUnchecked, inactive_split = kUnchecked, inactive_split_bytes = kUnchecked;
  Bytes active = kUnchecked, retries = kUnchecked, ooms = kUnchecked;
  Bytes oversize_allocations = kUnchecked;
};

constexpr Backend C = Backend::kCuda;
constexpr Backend N = Backend::kNpu;

const Case kCases[] = {
    // ---- core ----
    // 1: 1000 -> 1024 (512-rounding), small pool, 2 MiB segment; 2 MiB - 1024 = 2,096,128 left,
    //    >= 512 so split: one inactive split block.
    {"1", C, "", 0, "malloc a 1000", 1024, 2 * MiB, 1, 1000, 1, 2096128},
    // 2: the free merges a with the remainder into one whole 2 MiB free segment (still reserved).
    {"2", C, "", 0, "malloc a 1000; free a", 0, 2 * MiB, 1, 0, 0, 0},
    // 3: empty_cache frees the whole free segment.
    {"3", C, "", 0, "malloc a 1000; free a; empty_cache", 0, 0, 0},
    // 4: a splits the 2 MiB segment (1 MiB left >= 512); b takes the exact 1 MiB remainder
    //    (remaining 0, no split); c needs a second 2 MiB segment.
    {"4", C, "", 0, "malloc a 1MiB; malloc b 1MiB; malloc c 1MiB", 3 * MiB, 4 * MiB, 2},
    // 5: 4096 x 512 B tile one 2 MiB segment exactly (the 4095th leaves 512 >= 512: split).
    {"5", C, "", 0, "rep 4096 malloc 512", 2 * MiB, 2 * MiB, 1, kUnchecked, 0, 0},
    // 5b: the 4097th needs a new segment: allocated 2 MiB + 512.
    {"5b", C, "", 0, "rep 4097 malloc 512", 2097664, 4 * MiB, 2},
    // 6: 1 MiB + 1 -> 1 MiB + 512 > 1 MiB: large pool, < 10 MiB: a 20 MiB buffer.
    {"6", C, "", 0, "malloc a 1048577", 1049088, 20 * MiB, 1},
    // 7: six 3 MiB blocks fill 18 MiB of the first 20 MiB buffer (each remainder > 1 MiB so
    //    split); the 7th does not fit the 2 MiB tail and takes a second buffer: 21 MiB / 40 MiB.
    {"7", C, "", 0, "rep 7 malloc 3MiB", 22020096, 40 * MiB, 2},
    // 8: a (10 MiB - 512 < 10 MiB) gets a 20 MiB buffer, split (remainder 10 MiB + 512 > 1 MiB);
    //    b (10 MiB) reuses that 10,486,272 B remainder whole (512 left <= 1 MiB: no split).
    {"8", C, "", 0, "malloc a 10485248; malloc b 10MiB", 20 * MiB, 20 * MiB, 1},
    // 9: exactly 10 MiB is not < kMinLargeAlloc: its own 10 MiB segment, no remainder.
    {"9", C, "", 0, "malloc a 10MiB", 10 * MiB, 10 * MiB, 1},
    // 10: 10 MiB + 1 -> 10,486,272; segment rounded to 12 MiB; remainder 2,096,640 > 1 MiB: split.
    {"10", C, "", 0, "malloc a 10485761", 10486272, 12 * MiB, 1},
    // 11: b (12 MiB) reuses the cached 20 MiB buffer (best fit), 8 MiB left as inactive split.
    {"11", C, "", 0, "malloc a 5MiB; free a; malloc b 12MiB", 12 * MiB, 20 * MiB, 1, 12 * MiB, 1,
     8 * MiB},
    // 12: 19.5 MiB -> a 20 MiB segment (2 MiB rounding); remainder 512 KiB <= 1 MiB: no split,
    //     allocated counts the whole block; requested keeps 20,447,232.
    {"12", C, "", 0, "malloc a 20447232", 20 * MiB, 20 * MiB, 1, 20447232},
    // 13: reuse of the cached 20 MiB buffer without split (remainder 512 KiB).
    {"13", C, "", 0, "malloc a 5MiB; free a; malloc b 20447232", 20 * MiB, 20 * MiB, 1},
    // 14: see the walk-through in tests below; ends with nothing reserved.
    {"14", C, "", 0,
     "malloc a 4MiB; malloc b 4MiB; malloc c 4MiB; free b; free c; free a; empty_cache", 0, 0, 0},
    // 15: 1024 (2 MiB small seg), 4 MiB (20 MiB buffer), 30 MiB (own 30 MiB segment): 52 MiB.
    //     After freeing a and c, empty_cache frees the 2 MiB and 30 MiB whole free segments.
    {"15", C, "", 0, "malloc a 1024; malloc b 4MiB; malloc c 30MiB; free a; free c; empty_cache",
     4 * MiB, 20 * MiB, 1},
    // 16: b (25 MiB) splits the cached 30 MiB segment (5 MiB remainder > 1 MiB).
    {"16", C, "", 0, "malloc a 30MiB; free a; malloc b 25MiB", 25 * MiB, 30 * MiB, 1},
    // 17: c (28 MiB): the smallest free block >= 28 MiB is a's 30 MiB; split (2 MiB > 1 MiB).
    {"17", C, "", 0, "malloc a 30MiB; malloc b 50MiB; free a; free b; malloc c 28MiB", 28 * MiB,
     80 * MiB, 2},
    // 18: no cross-stream reuse: b on stream 2 gets its own 2 MiB segment.
    {"18", C, "", 0, "malloc a 1MiB 1; free a; malloc b 1MiB 2", 1 * MiB, 4 * MiB, 2},
    // 19: a's free waits for stream 2's event; b cannot reuse a: second 12 MiB segment.
    {"19", C, "", 0, "malloc a 12MiB 0; record a 2; free a; malloc b 12MiB 0", 12 * MiB, 24 * MiB,
     2, kUnchecked, kUnchecked, kUnchecked, 24 * MiB},
    // 19 (completed): stream 2's event done before malloc b: b reuses a's segment.
    {"19c", C, "", 0, "malloc a 12MiB 0; record a 2; free a; complete 2; malloc b 12MiB 0",
     12 * MiB, 12 * MiB, 1},

    // ---- max_split_size_mb:40 and roundup_power2_divisions ----
    // 20: 45 MiB >= 40 and 50 < 45 + 20: b takes the whole 50 MiB block (oversize, no split).
    {"20", C, "max_split_size_mb:40", 0, "malloc a 50MiB; free a; malloc b 45MiB", 50 * MiB,
     50 * MiB, 1, 45 * MiB, kUnchecked, kUnchecked, kUnchecked, kUnchecked, kUnchecked, 1},
    // 21: rule A: 30 MiB < 40 and the only candidate (50 MiB) is oversize: new 30 MiB segment.
    {"21", C, "max_split_size_mb:40", 0, "malloc a 50MiB; free a; malloc b 30MiB", 30 * MiB,
     80 * MiB, 2},
    // 22: rule B: 100 >= 79 + 20: refused; b gets an 80 MiB segment (2 MiB rounding), no split
    //     (79 >= max_split).
    {"22", C, "max_split_size_mb:40", 0, "malloc a 100MiB; free a; malloc b 79MiB", 80 * MiB,
     180 * MiB, 2},
    // 22 variant: 81 MiB: 100 < 81 + 20: the whole 100 MiB block is reused.
    {"22b", C, "max_split_size_mb:40", 0, "malloc a 100MiB; free a; malloc b 81MiB", 100 * MiB,
     100 * MiB, 1},
    // 23: d = 4 in the [64, 128) MiB interval: floor 64 MiB, step 16 MiB: 84 -> 96 MiB.
    {"23", C, "roundup_power2_divisions:4", 0, "malloc a 88080384", 96 * MiB, 96 * MiB, 1,
     88080384},
    // 23 default: exactly 84 MiB.
    {"23d", C, "", 0, "malloc a 88080384", 84 * MiB, 84 * MiB, 1},
    // 23 list: 84 MiB in [64,128) uses 8 divisions: step 8 MiB -> 88 MiB.
    {"23l", C, "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", 0,
     "malloc a 88080384", 88 * MiB, 88 * MiB, 1},
    // 23 list: 400 MiB in [256,512) uses 2 divisions: step 128 MiB -> 512 MiB.
    {"23l2", C, "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", 0,
     "malloc a 400MiB", 512 * MiB, 512 * MiB, 1},
    // 24: 1200 <= 512 x 4, so plain 512-rounding: 1536.
    {"24", C, "roundup_power2_divisions:4", 0, "malloc a 1200", 1536, 2 * MiB, 1},

    // ---- out of memory and garbage collection ----
    // 25: capacity 1000 MiB: the second 512 MiB malloc fails (512 + 512 > 1000), nothing is
    //     releasable, the retry fails: retries 1, ooms 1. After free a, b reuses a's block.
    {"25", C, "", 1000 * MiB, "malloc a 512MiB; malloc b 512MiB; free a; malloc b 512MiB",
     512 * MiB, 512 * MiB, 1, kUnchecked, kUnchecked, kUnchecked, kUnchecked, 1, 1},
    // 26: capacity 100 MiB: 60 + 70 > 100 fails; release_cached_blocks frees a's segment; the
    //     retry succeeds: retries 1, ooms 0.
    {"26", C, "", 100 * MiB, "malloc a 60MiB; free a; malloc b 70MiB", 70 * MiB, 70 * MiB, 1,
     kUnchecked, kUnchecked, kUnchecked, kUnchecked, 1, 0},
    // 27: capacity 70 MiB, max_split 40: rule A refuses the 50 MiB block; 50 + 30 > 70 fails;
    //     release_available (key 40 MiB) frees the 50 MiB block; success without a retry.
    {"27", C, "max_split_size_mb:40", 70 * MiB, "malloc a 50MiB; free a; malloc b 30MiB",
     30 * MiB, 30 * MiB, 1, kUnchecked, kUnchecked, kUnchecked, kUnchecked, 0, 0},
    // 28: allowed = 0.5 x 200 MiB = 100 MiB, GC at 50 MiB. Before c: 60 MiB cached > 50; both
    //     free 30 MiB blocks have age 1 = average: both freed, then c is a fresh 40 MiB segment.
    {"28", C, "memory_fraction:0.5,garbage_collection_threshold:0.5", 200 * MiB,
     "malloc a 30MiB; malloc b 30MiB; free a; free b; malloc c 40MiB", 40 * MiB, 40 * MiB, 1},
    // 28 without GC: c gets a third segment: 100 MiB reserved.
    {"28n", C, "memory_fraction:0.5", 200 * MiB,
     "malloc a 30MiB; malloc b 30MiB; free a; free b; malloc c 40MiB", 40 * MiB, 100 * MiB, 3},

    // ---- expandable segments ----
    // E1: one 2 MiB small page mapped; the segment stat is never incremented.
    {"E1", C, "expandable_segments:True", 0, "malloc a 1000", 1024, 2 * MiB, 0},
    // E2: a maps one 20 MiB page (17 MiB free tail); b extends the tail by one more page
    //     (37 MiB) and splits off 25 MiB, leaving 12 MiB.
    {"E2", C, "expandable_segments:True", 0, "malloc a 3MiB; malloc b 25MiB", 28 * MiB, 40 * MiB,
     0},
    // E3: the frees merge everything into one 40 MiB free block; empty_cache unmaps both pages.
    {"E3", C, "expandable_segments:True", 0,
     "malloc a 3MiB; malloc b 25MiB; free a; free b; empty_cache", 0, 0, 0},
    // E4: a maps 2 pages (40 MiB), b takes 5 MiB of the 10 MiB tail; free a leaves [0,30)
    //     free; empty_cache unmaps only the whole page [0,20); [20,30) and [35,40) stay mapped.
    {"E4", C, "expandable_segments:True", 0, "malloc a 30MiB; malloc b 5MiB; free a; empty_cache",
     5 * MiB, 20 * MiB, 0},

    // ---- NPU ----
    // N1: ceil((4096 + 32) / 512) x 512 = 4608; small pool, 2 MiB segment.
    {"N1", N, "", 0, "malloc a 4096", 4608, 2 * MiB, 1, 4096},
    // N2: 167,772,160 + 32 -> 167,772,672; segment rounded to 2 MiB: 162 MiB = 169,869,312;
    //     remainder 2,096,640 > 1 MiB: split.
    {"N2", N, "", 0, "malloc a 167772160", 167772672, 169869312, 1},
    // N3: 1 MiB + 32 > 1 MiB: large pool, 20 MiB buffer; allocated 1 MiB + 512.
    {"N3", N, "", 0, "malloc a 1MiB", 1049088, 20 * MiB, 1},
    // N4: 1,048,544 + 32 = 1 MiB exactly: small pool; two fill one 2 MiB segment.
    {"N4", N, "", 0, "malloc a 1048544; malloc b 1048544", 2 * MiB, 2 * MiB, 1},
    // N5: 10 MiB + 32 -> 10,486,272; 12 MiB segment.
    {"N5", N, "", 0, "malloc a 10MiB", 10486272, 12 * MiB, 1},
    // N6: 480 + 32 = 512 fits 4096 per segment exactly.
    {"N6a", N, "", 0, "rep 4096 malloc 480", 2 * MiB, 2 * MiB, 1},
    // N6: 512 + 32 -> 1024: only 2048 per 2 MiB; the 2049th opens a second segment.
    {"N6b", N, "", 0, "rep 2049 malloc 512", 2098176, 4 * MiB, 2},
    // N7: 20 MiB + 32 -> 20 MiB + 512; segment 22 MiB; remainder 2 MiB - 512 > 1 MiB: split.
    {"N7", N, "", 0, "malloc a 20MiB", 20972032, 22 * MiB, 1},
};

TEST_CASE("allocator conformance cases", "[alloc]") {
  for (const Case& c : kCases) {
    SECTION(c.id) {
      AllocatorOptions options = ParseAllocConf(c.conf, c.backend);
      if (c.capacity > 0) options.capacity_bytes = c.capacity;
      ValidateOptions(options);
      AllocFixture f(options);
      f.Run(c.script);
      INFO("case " << c.id);
      CHECK(f.Allocated() == c.allocated);
      CHECK(f.Reserved() == c.reserved);
      CHECK(f.Segments() == c.segments);
      if (c.requested != kUnchecked) CHECK(f.Requested() == c.requested);
      if (c.inactive_split != kUnchecked) CHECK(f.S().inactive_split.current == c.inactive_split);
      if (c.inactive_split_bytes != kUnchecked) {
        CHECK(f.S().inactive_split_bytes.current == c.inactive_split_bytes);
      }
      if (c.active != kUnchecked) CHECK(f.Active() == c.active);
      if (c.retries != kUnchecked) CHECK(f.S().num_alloc_retries == c.retries);
      if (c.ooms != kUnchecked) CHECK(f.S().num_ooms == c.ooms);
      if (c.oversize_allocations != kUnchecked) {
        CHECK(f.S().oversize_allocations.current == c.oversize_allocations);
      }
    }
  }
}

TEST_CASE("case 14 walk-through: inactive_split as blocks merge", "[alloc]") {
  AllocFixture f;
  f.Run("malloc a 4MiB; malloc b 4MiB; malloc c 4MiB");
  // Three 4 MiB blocks in one 20 MiB buffer; the 8 MiB tail is one inactive split block.
  CHECK(f.Allocated() == 12 * MiB);
  CHECK(f.S().inactive_split.current == 1);
  CHECK(f.S().inactive_split_bytes.current == 8 * MiB);
  CHECK(f.Reserved() == 20 * MiB);
  f.Free("b");  // b cannot merge (a and c allocated): 2 blocks, 8 + 4 MiB.
  CHECK(f.Allocated() == 8 * MiB);
  CHECK(f.S().inactive_split.current == 2);
  CHECK(f.S().inactive_split_bytes.current == 12 * MiB);
  f.Free("c");  // c merges with b and the tail: one 16 MiB block.
  CHECK(f.Allocated() == 4 * MiB);
  CHECK(f.S().inactive_split.current == 1);
  CHECK(f.S().inactive_split_bytes.current == 16 * MiB);
  f.Free("a");  // the whole segment is free: no split block left.
  CHECK(f.S().inactive_split.current == 0);
  CHECK(f.S().inactive_split_bytes.current == 0);
  CHECK(f.Reserved() == 20 * MiB);
  CHECK(f.Segments() == 1);
  f.EmptyCache();
  CHECK(f.Reserved() == 0);
  CHECK(f.Segments() == 0);
}

TEST_CASE("case 15 intermediate: 52 MiB in 3 segments before empty_cache", "[alloc]") {
  AllocFixture f;
  f.Run("malloc a 1024; malloc b 4MiB; malloc c 30MiB; free a; free c");
  // 2 MiB (small) + 20 MiB (4 MiB request) + 30 MiB = 52 MiB.
  CHECK(f.Allocated() == 4 * MiB);
  CHECK(f.Reserved() == 52 * MiB);
  CHECK(f.Segments() == 3);
}

TEST_CASE("case 19: a pending free keeps active bytes", "[alloc]") {
  AllocFixture f;
  f.Run("malloc a 12MiB 0; record a 2; free a");
  CHECK(f.Allocated() == 0);       // allocated drops at free()
  CHECK(f.Active() == 12 * MiB);   // active waits for stream 2's event
  CHECK(f.Requested() == 12 * MiB);
}

TEST_CASE("case 25: a failed malloc leaves the stats unchanged", "[alloc]") {
  AllocatorOptions o;
  o.capacity_bytes = 1000 * MiB;
  AllocFixture f(o);
  CHECK(f.Malloc("a", 512 * MiB));
  CHECK_FALSE(f.Malloc("b", 512 * MiB));
  CHECK(f.Allocated() == 512 * MiB);
  CHECK(f.Reserved() == 512 * MiB);
  CHECK(f.S().num_alloc_retries == 1);
  CHECK(f.S().num_ooms == 1);
}

}  // namespace
}  // namespace memsim::alloc
