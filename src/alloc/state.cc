// CanonicalState (allocator.h): the allocator's state with segments named by address rank.
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "alloc/caching_allocator.h"
#include "core/check.h"

namespace memsim::alloc::internal {
namespace {

void PutGauges(const AllocatorStats& s, std::vector<std::int64_t>& out) {
  for (const Gauge* g : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                         &s.requested_bytes, &s.inactive_split_bytes, &s.allocation, &s.active,
                         &s.segment, &s.inactive_split, &s.oversize_allocations,
                         &s.oversize_segments}) {
    out.push_back(g->current);
  }
}

}  // namespace

std::vector<std::int64_t> CachingAllocator::CanonicalState(
    const std::vector<BlockHandle>& handles) const {
  std::vector<std::int64_t> out;
  PutGauges(stats_, out);
  std::vector<std::int32_t> segs;
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    if (segments_[s].live) segs.push_back(static_cast<std::int32_t>(s));
  }
  std::sort(segs.begin(), segs.end(),
            [this](std::int32_t a, std::int32_t b) { return segments_[a].base < segments_[b].base; });
  std::vector<std::int64_t> rank(segments_.size(), -1);
  for (std::size_t r = 0; r < segs.size(); ++r) rank[segs[r]] = static_cast<std::int64_t>(r);
  std::vector<BlockIndex> live;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i].live) live.push_back(static_cast<BlockIndex>(i));
  }
  std::sort(live.begin(), live.end(), [this, &rank](BlockIndex a, BlockIndex b) {
    const std::int64_t ra = rank[blocks_[a].segment], rb = rank[blocks_[b].segment];
    return ra != rb ? ra < rb : blocks_[a].addr < blocks_[b].addr;
  });
  // A block's place: (segment rank, offset in the segment).
  auto place = [this, &rank](BlockIndex b, std::vector<std::int64_t>& o) {
    const Block& blk = blocks_[b];
    o.push_back(rank[blk.segment]);
    o.push_back(blk.addr - segments_[blk.segment].base);
  };
  out.push_back(static_cast<std::int64_t>(segs.size()));
  for (std::int32_t s : segs) {
    const Segment& seg = segments_[s];
    out.insert(out.end(), {seg.size_bytes, seg.page_bytes, seg.stream, seg.pool, seg.expandable});
  }
  out.push_back(static_cast<std::int64_t>(live.size()));
  for (BlockIndex b : live) {
    const Block& blk = blocks_[b];
    place(b, out);
    const std::uint64_t age = GcEnabled() ? pools_[blk.pool].get_free_blocks_call_count - blk.gc_count_base : 0;
    out.insert(out.end(), {blk.size_bytes, blk.requested_bytes, blk.stream, blk.allocated,
                           blk.mapped, blk.event_count, static_cast<std::int64_t>(age),
                           static_cast<std::int64_t>(blk.stream_uses.size())});
    out.insert(out.end(), blk.stream_uses.begin(), blk.stream_uses.end());
  }
  for (const auto& [stream, ev] : events_) {
    out.push_back(stream);
    out.push_back(static_cast<std::int64_t>(ev.queue.size() - ev.head));
    for (std::size_t i = ev.head; i < ev.queue.size(); ++i) {
      out.push_back(ev.queue[i].seq >= ev.done_seq ? 1 : 0);
      place(ev.queue[i].block, out);
    }
  }
  out.push_back(events_may_have_completed_);
  for (BlockHandle h : handles) {
    MEMSIM_CHECK(h >= 1 && h <= handle_to_block_.size() && handle_to_block_[h - 1] != kNoBlock);
    place(handle_to_block_[h - 1], out);
  }
  return out;
}

}  // namespace memsim::alloc::internal
