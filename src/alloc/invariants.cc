// CheckInvariants: walks every segment, pool and event queue and recounts every gauge
// (style.md rule 8). Slow (sorts all blocks); meant for tests, called after every operation.
#include <algorithm>
#include <vector>

#include <fmt/core.h>

#include "alloc/caching_allocator.h"

namespace memsim::alloc::internal {

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
  AllocatorStats want;
  std::size_t free_mapped[2] = {0, 0}, unmapped[2] = {0, 0};
  std::int64_t pending_events = 0;
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    const Segment& seg = segments_[s];
    auto& list = by_segment[s];
    if (!seg.live) {
      if (!list.empty()) return fmt::format("dead segment {} still has blocks", s);
      continue;
    }
    if (list.empty()) return fmt::format("live segment {} has no blocks", s);
    std::sort(list.begin(), list.end(),
              [this](BlockIndex a, BlockIndex b) { return blocks_[a].addr < blocks_[b].addr; });
    Bytes expect_addr = seg.base;
    for (std::size_t k = 0; k < list.size(); ++k) {
      const BlockIndex bi = list[k];
      const Block& b = blocks_[bi];
      if (b.addr != expect_addr) return fmt::format("segment {}: gap or overlap at block {}", s, bi);
      if (b.size_bytes <= 0 || b.size_bytes % kMinBlockSize != 0) {
        return fmt::format("block {} has size {}", bi, b.size_bytes);
      }
      expect_addr += b.size_bytes;
      const BlockIndex want_prev = k == 0 ? kNoBlock : list[k - 1];
      const BlockIndex want_next = k + 1 == list.size() ? kNoBlock : list[k + 1];
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
        const Block& p = blocks_[list[k - 1]];
        const bool p_free = !p.allocated && p.event_count == 0;
        if (is_free && p_free && p.mapped == b.mapped) {
          return fmt::format("adjacent free blocks {} and {} not merged", list[k - 1], bi);
        }
      }
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
        pending_events += b.event_count;
      } else {
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
        (b.mapped ? free_mapped : unmapped)[b.pool]++;
        if (b.mapped && !b.expandable && b.IsSplit()) {
          Increase(want.inactive_split, 1);
          Increase(want.inactive_split_bytes, b.size_bytes);
        }
      }
    }
    if (expect_addr != seg.base + seg.size_bytes) {
      return fmt::format("segment {}: blocks cover {} of {} bytes", s, expect_addr - seg.base,
                         seg.size_bytes);
    }
    if (!seg.expandable) {
      Increase(want.segment, 1);
      if (seg.size_bytes >= MaxSplit()) Increase(want.oversize_segments, 1);
      if (seg.pool == kSmallPool && seg.size_bytes != kSmallBuffer) {
        return fmt::format("small segment {} is not 2 MiB", s);
      }
    }
  }
  for (int p = 0; p < 2; ++p) {
    if (pools_[p].blocks.size() != free_mapped[p] || pools_[p].unmapped.size() != unmapped[p]) {
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
  if (pending_events != pending_events_) {
    return fmt::format("{} events pending, blocks expect {}", pending_events_, pending_events);
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
