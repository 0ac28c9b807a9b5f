// Allocator::CanonicalState (allocator.h): equal exactly when later calls behave alike.
#include <catch2/catch.hpp>

#include "alloc/allocator.h"

namespace memsim::alloc {
namespace {

constexpr Bytes kMiB = Bytes{1} << 20;

TEST_CASE("a segment released and made again at a new address compares equal", "[alloc]") {
  // A: a 30 MiB request gets a 30 MiB segment (2 MiB-rounded above 10 MiB, get_allocation_size);
  // freed and emptied, the next segment lies above the first (allocator-rules.md 'Convention:
  // addresses'). B made its only segment at the first address. Canonically the same.
  const AllocatorOptions o;
  auto a = NewCachingAllocator(o);
  a->Free(*a->Malloc(30 * kMiB, 0));
  a->EmptyCache();
  const BlockHandle ha = *a->Malloc(30 * kMiB, 0);
  auto b = NewCachingAllocator(o);
  const BlockHandle hb = *b->Malloc(30 * kMiB, 0);
  CHECK(a->CanonicalState({ha}) == b->CanonicalState({hb}));
}

TEST_CASE("different splits, sizes or places compare unequal", "[alloc]") {
  const AllocatorOptions o;
  auto a = NewCachingAllocator(o);
  auto b = NewCachingAllocator(o);
  const BlockHandle a1 = *a->Malloc(12 * kMiB, 0);
  const BlockHandle b1 = *b->Malloc(14 * kMiB, 0);
  CHECK(a->CanonicalState({a1}) != b->CanonicalState({b1}));  // 12 MiB vs 14 MiB blocks
  // Two blocks of one 20 MiB buffer (requests below 10 MiB share one): the order in which the
  // caller lists them is part of the state.
  auto c = NewCachingAllocator(o);
  const BlockHandle c1 = *c->Malloc(2 * kMiB, 0);
  const BlockHandle c2 = *c->Malloc(2 * kMiB, 0);
  CHECK(c->CanonicalState({c1, c2}) != c->CanonicalState({c2, c1}));
  // A free cached block differs from no block.
  auto d = NewCachingAllocator(o);
  auto e = NewCachingAllocator(o);
  d->Free(*d->Malloc(30 * kMiB, 0));
  CHECK(d->CanonicalState({}) != e->CanonicalState({}));
}

}  // namespace
}  // namespace memsim::alloc
