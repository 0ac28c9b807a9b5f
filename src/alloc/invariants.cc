// CheckInvariants: walks every segment, pool and event queue and recounts every gauge
// (style.md rule 8). Slow (sorts all blocks); meant for tests, called after every operation.
#include <algorithm>
#include <vector>

#include <fmt/core.h>

#include "alloc/caching_allocator.h"

namespace memsim::alloc::internal {

struct CachingAllocator::Recount {
  AllocatorStats want;                  // the gauges' current values, recounted
  std::size_t free_mapped[2] = {0, 0};  // free mapped blocks per pool
  std::size_t unmapped[2] = {0, 0};     // free unmapped blocks per pool
  std::int64_t pending_events = 0;
};

std::string CachingAllocator::CheckInvariants() const {
  std::vector<std::vector<BlockIndex>> by_segment(segments_.size());
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (!b.live) continue;
    if (b.segment < 0 || b.segment >= static_cast<std::int32_t>(segments_.size()) ||
        !segments_[b.segment].live) {
      return fmt::format("block {} belongs to no live segment", i);
    }
    by_segment[b.segment].push_back(static_cast<BlockIndex>(i));
  }
  Recount r;
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    if (std::string e = CheckSegment(s, by_segment[s], r); !e.empty()) return e;
  }
  if (std::string e = CheckPools(r); !e.empty()) return e;
  return CheckHandlesAndGauges(r);
}

// Segment s and its blocks (`blocks`, sorted here by address): they tile it, and are counted.
std::string CachingAllocator::CheckSegment(std::size_t s, std::vector<BlockIndex>& blocks,
                                           Recount& r) const {
  const Segment& seg = segments_[s];
  if (!seg.live) {
    if (!blocks.empty()) return fmt::format("dead segment {} still has blocks", s);
    return "";
  }
  if (blocks.empty()) return fmt::format("live segment {} has no blocks", s);
  std::sort(blocks.begin(), blocks.end(),
            [this](BlockIndex a, BlockIndex b) { return blocks_[a].addr < blocks_[b].addr; });
  Bytes expect_addr = seg.base;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    if (std::string e = CheckBlockPlace(s, blocks, k, expect_addr); !e.empty()) return e;
    expect_addr += blocks_[blocks[k]].size_bytes;
    if (std::string e = RecountBlock(blocks[k], r); !e.empty()) return e;
  }
  if (expect_addr != seg.base + seg.size_bytes) {
    return fmt::format("segment {}: blocks cover {} of {} bytes", s, expect_addr - seg.base,
                       seg.size_bytes);
  }
  if (!seg.expandable) {
    Increase(r.want.segment, 1);
    if (seg.size_bytes >= MaxSplit()) Increase(r.want.oversize_segments, 1);
    if (seg.pool == kSmallPool && seg.size_bytes != kSmallBuffer) {
      return fmt::format("small segment {} is not 2 MiB", s);
    }
  }
  return "";
}

// The k-th block of segment s by address (`blocks`), expected at `expect_addr`: its size, its
// links to its neighbours, its segment's kind, and no free neighbour left unmerged before it.
std::string CachingAllocator::CheckBlockPlace(std::size_t s, const std::vector<BlockIndex>& blocks,
                                              std::size_t k, Bytes expect_addr) const {
  const Segment& seg = segments_[s];
  const BlockIndex bi = blocks[k];
  const Block& b = blocks_[bi];
  if (b.addr != expect_addr) return fmt::format("segment {}: gap or overlap at block {}", s, bi);
  if (b.size_bytes <= 0 || b.size_bytes % kMinBlockSize != 0) {
    return fmt::format("block {} has size {}", bi, b.size_bytes);
  }
  const BlockIndex want_prev = k == 0 ? kNoBlock : blocks[k - 1];
  const BlockIndex want_next = k + 1 == blocks.size() ? kNoBlock : blocks[k + 1];
  if (b.prev != want_prev || b.next != want_next) {
    return fmt::format("block {}: prev/next links disagree with address order", bi);
  }
  if (b.stream != seg.stream || b.pool != seg.pool || b.expandable != seg.expandable) {
    return fmt::format("block {}: stream/pool/kind differ from its segment", bi);
  }
  if (!seg.expandable && !b.mapped) return fmt::format("block {} unmapped", bi);
  const bool is_free = !b.allocated && b.event_count == 0;
  if (b.allocated && b.event_count != 0) return fmt::format("block {} allocated+pending", bi);
  if (k > 0) {
    const Block& p = blocks_[blocks[k - 1]];
    const bool p_free = !p.allocated && p.event_count == 0;
    if (is_free && p_free && p.mapped == b.mapped) {
      return fmt::format("adjacent free blocks {} and {} not merged", blocks[k - 1], bi);
    }
  }
  return "";
}

// Adds block bi to the recount; a free block must sit in its pool, without stream uses.
std::string CachingAllocator::RecountBlock(BlockIndex bi, Recount& r) const {
  const Block& b = blocks_[bi];
  AllocatorStats& want = r.want;
  const bool is_free = !b.allocated && b.event_count == 0;
  if (b.mapped) {
    Increase(want.reserved_bytes, b.size_bytes);
  }
  if (b.allocated) {
    Increase(want.allocation, 1);
    Increase(want.allocated_bytes, b.size_bytes);
    if (b.size_bytes >= MaxSplit()) Increase(want.oversize_allocations, 1);
  }
  if (!is_free) {
    Increase(want.active, 1);
    Increase(want.active_bytes, b.size_bytes);
    Increase(want.requested_bytes, b.requested_bytes);
    r.pending_events += b.event_count;
    return "";
  }
  if (!b.stream_uses.empty()) return fmt::format("free block {} has stream uses", bi);
  const Pool& pool = pools_[b.pool];
  bool in_pool = false;
  if (b.mapped) {
    // The block's remembered entry is its own (MoveEntry rewrites entries in place).
    auto it = pool.blocks.find({b.stream, b.size_bytes, b.addr, bi});
    in_pool = b.in_pool && it != pool.blocks.end() && it->block == bi &&
              it == FreeSet::const_iterator(b.free_entry);
  } else {
    in_pool = b.in_pool && pool.unmapped.count({b.stream, b.addr, bi}) == 1;
  }
  if (!in_pool) return fmt::format("free block {} missing from its pool", bi);
  (b.mapped ? r.free_mapped : r.unmapped)[b.pool]++;
  if (b.mapped && !b.expandable && b.IsSplit()) {
    Increase(want.inactive_split, 1);
    Increase(want.inactive_split_bytes, b.size_bytes);
  }
  return "";
}

// The pools hold exactly the free blocks counted, in their order.
std::string CachingAllocator::CheckPools(const Recount& r) const {
  for (int p = 0; p < 2; ++p) {
    if (pools_[p].blocks.size() != r.free_mapped[p] ||
        pools_[p].unmapped.size() != r.unmapped[p]) {
      return fmt::format("pool {} holds stale entries", p);
    }
    // Entries rewritten in place must keep the pool's order (stream, size, address).
    const FreeKey* prev = nullptr;
    for (const FreeKey& k : pools_[p].blocks) {
      if (prev != nullptr && !FreeKeyLess()(*prev, k)) {
        return fmt::format("pool {} out of order at block {}", p, k.block);
      }
      prev = &k;
    }
  }
  return "";
}

// Pending events, live handles and every gauge against the recount.
std::string CachingAllocator::CheckHandlesAndGauges(const Recount& r) const {
  if (r.pending_events != pending_events_) {
    return fmt::format("{} events pending, blocks expect {}", pending_events_, r.pending_events);
  }
  std::int64_t live_handles = 0;
  for (BlockIndex b : handle_to_block_) {
    if (b == kNoBlock) continue;
    ++live_handles;
    if (!blocks_[b].live || !blocks_[b].allocated) return "a live handle names a free block";
  }
  if (live_handles != stats_.allocation.current) return "live handles differ from allocation";
  auto gauge = [&](const char* name, const Gauge& have, const Gauge& recount) -> std::string {
    if (have.current != recount.current) {
      return fmt::format("{}: current {} but recount {}", name, have.current, recount.current);
    }
    if (have.peak < have.current) return fmt::format("{}: peak below current", name);
    return "";
  };
  const AllocatorStats& want = r.want;
  for (std::string e :
       {gauge("allocated_bytes", stats_.allocated_bytes, want.allocated_bytes),
        gauge("reserved_bytes", stats_.reserved_bytes, want.reserved_bytes),
        gauge("active_bytes", stats_.active_bytes, want.active_bytes),
        gauge("requested_bytes", stats_.requested_bytes, want.requested_bytes),
        gauge("inactive_split_bytes", stats_.inactive_split_bytes, want.inactive_split_bytes),
        gauge("allocation", stats_.allocation, want.allocation),
        gauge("active", stats_.active, want.active),
        gauge("segment", stats_.segment, want.segment),
        gauge("inactive_split", stats_.inactive_split, want.inactive_split),
        gauge("oversize_allocations", stats_.oversize_allocations, want.oversize_allocations),
        gauge("oversize_segments", stats_.oversize_segments, want.oversize_segments)}) {
    if (!e.empty()) return e;
  }
  return "";
}

}  // namespace memsim::alloc::internal
