// Expandable segments (expandable_segments:True; docs/allocator-rules.md,
// 'Expandable segments'): one reserved virtual range per
// segment, physical pages (2 MiB small pool, 20 MiB large pool) mapped on demand and unmapped
// page-wise by empty_cache. Follows CUDACachingAllocator.cpp try_allocate_expandable_block,
// find_expandable_block, map_block, unmap_block, release_expandable_segment, and the torch_npu
// base-address alignment split (NPUCachingAllocator.cpp malloc). Mapping changes reserved_bytes but
// never `segment`; blocks of expandable segments never count in inactive_split.
#include "alloc/caching_allocator.h"

#include <algorithm>
#include <limits>

#include "core/check.h"

namespace memsim::alloc::internal {
namespace {

constexpr Bytes kNoCapacityVirtualBytes = Bytes{1} << 40;  // 1 TiB ('Convention: expandable range')

}  // namespace

BlockIndex CachingAllocator::TryAllocateExpandableBlock(const AllocParams& p) {
  BlockIndex candidate = FindExpandableBlock(p);
  if (candidate == kNoBlock) return kNoBlock;
  // candidate is unmapped -> *, or free -> unmapped -> *, with room for p.size_bytes.
  if (!blocks_[candidate].mapped &&
      !MapBlock(candidate, std::min(blocks_[candidate].size_bytes, p.size_bytes))) {
    return kNoBlock;
  }
  while (blocks_[candidate].size_bytes < p.size_bytes) {
    // free -> unmapped: map part of the unmapped neighbour; it absorbs the free block.
    const Bytes remaining = p.size_bytes - blocks_[candidate].size_bytes;
    const BlockIndex next = blocks_[candidate].next;
    MEMSIM_CHECK(next != kNoBlock && !blocks_[next].mapped);
    if (!MapBlock(next, std::min(remaining, blocks_[next].size_bytes))) return kNoBlock;
    candidate = next;
  }
  EraseFromPool(candidate);
  return candidate;
}

BlockIndex CachingAllocator::FindExpandableBlock(const AllocParams& p) {
  Pool& pool = pools_[p.pool];
  auto allocatable = [this](BlockIndex b) {
    return b != kNoBlock && !blocks_[b].allocated && blocks_[b].event_count == 0 &&
           blocks_[b].stream_uses.empty();
  };
  auto has_room = [&](BlockIndex b) {
    Bytes bytes = 0;
    while (bytes < p.size_bytes && allocatable(b)) {
      bytes += blocks_[b].size_bytes;
      b = blocks_[b].next;
    }
    return bytes >= p.size_bytes;
  };
  for (auto it = pool.unmapped.lower_bound({p.stream, std::numeric_limits<Bytes>::min(),
                                            std::numeric_limits<BlockIndex>::min()});
       it != pool.unmapped.end() && it->stream == p.stream; ++it) {
    BlockIndex c = it->block;
    // The lowest-address unmapped range, or the free block just before it.
    if (allocatable(blocks_[c].prev)) c = blocks_[c].prev;
    if (has_room(c)) return c;
  }
  // A new segment: ceil(1.125 x capacity / page) pages (ExpandableSegment;
  // 'Convention: expandable range').
  const Bytes page = p.pool == kSmallPool ? kSmallBuffer : kLargeBuffer;
  Bytes virtual_bytes = RoundUp(kNoCapacityVirtualBytes, page);
  if (options_.capacity_bytes) {
    // ceil(9 C / 8 page) without overflow: C = q (8 page) + r.
    const Bytes c = *options_.capacity_bytes;
    const Bytes q = c / (8 * page), r = c % (8 * page);
    const Bytes pages = std::max<Bytes>(9 * q + CeilDiv(9 * r, 8 * page), 1);
    virtual_bytes = pages * page;
  }
  // The real allocator would reserve the range and then fail to map it; no stats change.
  if (virtual_bytes < p.size_bytes) return kNoBlock;
  const std::int32_t seg = NewSegment(virtual_bytes, p.stream, p.pool, true, page);
  const BlockIndex b = NewBlock();
  Block& blk = blocks_[b];
  blk.size_bytes = virtual_bytes;
  blk.addr = segments_[seg].base;
  blk.stream = p.stream;
  blk.pool = p.pool;
  blk.segment = seg;
  blk.expandable = true;
  blk.mapped = false;
  InsertIntoPool(b);
  return b;
}

// map_block: maps whole pages covering size_bytes from the start of the unmapped block `b`,
// then merges with free mapped neighbours. Fails (nothing changes) when the pages do not fit
// the capacity ('Convention: capacity').
bool CachingAllocator::MapBlock(BlockIndex b, Bytes size_bytes) {
  const Segment& seg = segments_[blocks_[b].segment];
  MEMSIM_CHECK(!blocks_[b].mapped && size_bytes <= blocks_[b].size_bytes);
  MEMSIM_CHECK((blocks_[b].addr - seg.base) % seg.page_bytes == 0);
  const Bytes mapped_bytes = RoundUp(size_bytes, seg.page_bytes);
  MEMSIM_CHECK(mapped_bytes <= blocks_[b].size_bytes);
  if (!CapacityAllows(mapped_bytes)) return false;
  EraseFromPool(b);
  const Bytes mapped_addr = blocks_[b].addr;
  blocks_[b].mapped = true;
  if (mapped_bytes < blocks_[b].size_bytes) {
    const BlockIndex rest = NewBlock();
    Block& r = blocks_[rest];
    Block& blk = blocks_[b];
    r.size_bytes = blk.size_bytes - mapped_bytes;
    r.addr = blk.addr + mapped_bytes;
    r.stream = blk.stream;
    r.pool = blk.pool;
    r.segment = blk.segment;
    r.expandable = true;
    r.mapped = false;
    r.prev = b;
    r.next = blk.next;
    if (r.next != kNoBlock) blocks_[r.next].prev = rest;
    blk.next = rest;
    blk.size_bytes = mapped_bytes;
    InsertIntoPool(rest);
  }
  TryMergeBlocks(b, blocks_[b].prev);
  TryMergeBlocks(b, blocks_[b].next);
  InsertIntoPool(b);
  Increase(stats_.reserved_bytes, mapped_bytes);
  ++stats_.num_device_alloc;
  Trace(TraceAction::kSegmentMap, mapped_addr, mapped_bytes, mapped_bytes, blocks_[b].stream,
        blocks_[b].pool);
  return true;
}

// unmap_block: unmaps the whole pages inside the free block `b`; partial pages at either end
// stay mapped as free blocks.
void CachingAllocator::UnmapBlock(BlockIndex b) {
  const Segment& seg = segments_[blocks_[b].segment];
  const Bytes page = seg.page_bytes;
  const Bytes rel = blocks_[b].addr - seg.base;
  const Bytes begin = RoundUp(rel, page);
  const Bytes end = (rel + blocks_[b].size_bytes) / page * page;
  if (begin >= end) return;
  EraseFromPool(b);
  const Bytes before = begin - rel;
  const Bytes after = rel + blocks_[b].size_bytes - end;
  auto make_piece = [&](Bytes addr, Bytes size) {
    const BlockIndex piece = NewBlock();
    Block& x = blocks_[piece];
    const Block& blk = blocks_[b];
    x.size_bytes = size;
    x.addr = addr;
    x.stream = blk.stream;
    x.pool = blk.pool;
    x.segment = blk.segment;
    x.expandable = true;
    x.mapped = true;
    return piece;
  };
  if (before > 0) {
    const BlockIndex piece = make_piece(blocks_[b].addr, before);
    Block& x = blocks_[piece];
    x.prev = blocks_[b].prev;
    x.next = b;
    if (x.prev != kNoBlock) blocks_[x.prev].next = piece;
    blocks_[b].prev = piece;
    InsertIntoPool(piece);
  }
  if (after > 0) {
    const BlockIndex piece = make_piece(seg.base + end, after);
    Block& x = blocks_[piece];
    x.prev = b;
    x.next = blocks_[b].next;
    if (x.next != kNoBlock) blocks_[x.next].prev = piece;
    blocks_[b].next = piece;
    InsertIntoPool(piece);
  }
  blocks_[b].addr = seg.base + begin;
  blocks_[b].size_bytes = end - begin;
  blocks_[b].mapped = false;
  TryMergeBlocks(b, blocks_[b].prev);
  TryMergeBlocks(b, blocks_[b].next);
  InsertIntoPool(b);
  Decrease(stats_.reserved_bytes, end - begin);
  ++stats_.num_device_free;
  Trace(TraceAction::kSegmentUnmap, seg.base + begin, end - begin, end - begin, blocks_[b].stream,
        blocks_[b].pool);
}

// release_expandable_segment: a wholly unmapped segment is destroyed.
void CachingAllocator::ReleaseExpandableSegment(BlockIndex b) {
  MEMSIM_CHECK(!blocks_[b].mapped && !blocks_[b].IsSplit());
  EraseFromPool(b);
  segments_[blocks_[b].segment].live = false;
  DeleteBlock(b);
}

// torch_npu NPUCachingAllocator.cpp malloc: with expandable segments and a rounded size >= 2 MiB, a
// block whose address is not base_addr_aligned from the segment base ('Convention: NPU pad') gives
// up a free leading fragment so the allocation starts aligned, if the rest still holds the request.
void CachingAllocator::NpuAlignBlock(AllocParams& p) {
  const BlockIndex b = p.block;
  const Bytes align = options_.base_addr_aligned_bytes;
  const Bytes rel = blocks_[b].addr - segments_[blocks_[b].segment].base;
  if (rel % align == 0) return;
  const Bytes offset = align - rel % align;
  if (offset + p.size_bytes > blocks_[b].size_bytes) return;
  const BlockIndex frag = NewBlock();
  Block& f = blocks_[frag];
  Block& blk = blocks_[b];
  f.size_bytes = offset;
  f.addr = blk.addr;
  f.stream = blk.stream;
  f.pool = blk.pool;
  f.segment = blk.segment;
  f.expandable = blk.expandable;
  f.mapped = true;
  f.prev = blk.prev;
  f.next = b;
  if (f.prev != kNoBlock) blocks_[f.prev].next = frag;
  blk.prev = frag;
  blk.addr += offset;
  blk.size_bytes -= offset;
  InsertIntoPool(frag);
}

}  // namespace memsim::alloc::internal
