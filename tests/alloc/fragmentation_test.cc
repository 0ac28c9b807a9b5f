// Fragmentation from allocations whose sizes vary step to step (data of varying sample
// lengths, docs/config.md 'Sample lengths'): a small sequence whose reserved and allocated bytes
// are derived by hand from the caching allocator's rules (docs/allocator-rules.md; PyTorch
// c10/cuda/CUDACachingAllocator.cpp: round_size, get_allocation_size, get_free_block,
// should_split), and expandable segments' answer to it (E-rows of conformance_test.cc).
#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "alloc_test_util.h"

namespace memsim::alloc {
namespace {

using testing::AllocFixture;

// Three "steps", each one activation sized by its batch's length: 12 MiB (short batch), 16 MiB
// (long batch), 12 MiB (short again), freed at each step's end.
constexpr const char* kVariedSteps[] = {"malloc a 12MiB; free a", "malloc b 16MiB; free b",
                                  "malloc c 12MiB; free c"};

TEST_CASE("a longer batch after a shorter one cannot reuse the cached block and grows reserved",
          "[alloc][fragmentation]") {
  AllocFixture f;
  // Step 1: 12 MiB >= kMinLargeAlloc (10 MiB): get_allocation_size rounds to 2 MiB, a 12 MiB
  // segment of its own; freed, it stays cached: reserved 12 MiB, allocated 0.
  f.Run(kVariedSteps[0]);
  CHECK(f.Reserved() == 12 * kMiB);
  CHECK(f.Allocated() == 0);
  // Step 2, before the free: get_free_block finds no cached block >= 16 MiB (the only one is
  // 12 MiB), so a new 16 MiB segment: reserved 12 + 16 = 28 MiB, allocated 16 MiB; the 12 MiB
  // cached block is reserved - allocated = 12 MiB nobody uses.
  f.Malloc("b", 16 * kMiB);
  CHECK(f.Reserved() == 28 * kMiB);
  CHECK(f.Allocated() == 16 * kMiB);
  CHECK(f.Reserved() - f.Allocated() == 12 * kMiB);
  f.Free("b");
  // Step 3: best fit picks the 12 MiB block exactly (no split: remainder 0); nothing new is
  // reserved, and the 16 MiB segment stays cached: reserved - allocated = 16 MiB.
  f.Malloc("c", 12 * kMiB);
  CHECK(f.Reserved() == 28 * kMiB);
  CHECK(f.Reserved() - f.Allocated() == 16 * kMiB);
  f.Free("c");
  CHECK(f.S().reserved_bytes.peak == 28 * kMiB);
}

TEST_CASE("expandable segments serve the same varied steps from one mapped range",
          "[alloc][fragmentation]") {
  AllocFixture f(ParseAllocConf("expandable_segments:True", Backend::kCuda));
  // Step 1: a large request maps 20 MiB pages (E2 of conformance_test.cc): 12 MiB needs one
  // page, reserved 20 MiB; the block is split (the 8 MiB tail > kLargeBuffer 1 MiB) and merges
  // back on the free.
  f.Run(kVariedSteps[0]);
  CHECK(f.Reserved() == 20 * kMiB);
  // Step 2: the 20 MiB free block of the mapped page fits 16 MiB: nothing new is mapped,
  // reserved stays 20 MiB (28 MiB without expandable segments).
  f.Malloc("b", 16 * kMiB);
  CHECK(f.Reserved() == 20 * kMiB);
  CHECK(f.Allocated() == 16 * kMiB);
  CHECK(f.Reserved() - f.Allocated() == 4 * kMiB);
  f.Free("b");
  f.Run(kVariedSteps[2]);
  CHECK(f.S().reserved_bytes.peak == 20 * kMiB);
}

}  // namespace
}  // namespace memsim::alloc
