// The caching-allocator model: malloc (search, GC, device allocation, release-and-retry, OOM),
// free with stream events, merging, empty_cache. Follows PyTorch c10/cuda/
// CUDACachingAllocator.cpp DeviceCachingAllocator (at commit 001074d2) and torch_npu
// NPUCachingAllocator.cpp (commits 0045d0d1, 165f15da); every function below names its
// counterpart, and docs/allocator-rules.md states their rules.
#include "alloc/caching_allocator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace memsim::alloc {
namespace internal {

CachingAllocator::CachingAllocator(const AllocatorOptions& options) : options_(options) {
  if (options_.max_split_size_bytes) max_split_bytes_ = *options_.max_split_size_bytes;
}

BlockIndex CachingAllocator::NewBlock() {
  BlockIndex b;
  if (!free_slots_.empty()) {
    b = free_slots_.back();
    free_slots_.pop_back();
    // A fresh Block, field by field (stream_uses, empty since DeleteBlock, keeps its capacity;
    // the pool entries are meaningless while in_pool is false).
    Block& blk = blocks_[b];
    blk.size_bytes = 0;
    blk.addr = 0;
    blk.requested_bytes = 0;
    blk.prev = kNoBlock;
    blk.next = kNoBlock;
    blk.stream = 0;
    blk.segment = -1;
    blk.event_count = 0;
    blk.gc_count_base = 0;
    blk.pool = kSmallPool;
    blk.allocated = false;
    blk.mapped = true;
    blk.expandable = false;
    blk.in_pool = false;
  } else {
    b = static_cast<BlockIndex>(blocks_.size());
    blocks_.emplace_back();
  }
  blocks_[b].live = true;
  return b;
}

void CachingAllocator::DeleteBlock(BlockIndex b) {
  blocks_[b].live = false;
  blocks_[b].stream_uses.clear();
  free_slots_.push_back(b);
}

std::int32_t CachingAllocator::NewSegment(Bytes size_bytes, StreamId stream, std::uint8_t pool,
                                          bool expandable, Bytes page_bytes) {
  Segment s;
  s.base = next_segment_addr_;
  s.size_bytes = size_bytes;
  s.page_bytes = page_bytes;
  s.stream = stream;
  s.pool = pool;
  s.expandable = expandable;
  s.live = true;
  // Keep every segment base 2 MiB-aligned (a multiple of every page and of the NPU 16 KiB).
  next_segment_addr_ += RoundUp(size_bytes, kRoundLarge);
  segments_.push_back(s);
  return static_cast<std::int32_t>(segments_.size() - 1);
}

void CachingAllocator::InsertIntoPool(BlockIndex b) {
  Block& blk = blocks_[b];
  Pool& pool = pools_[blk.pool];
  MEMSIM_CHECK(!blk.in_pool);
  if (blk.mapped) {
    // insert_into_blocks: resets the block's GC age.
    blk.gc_count_base = pool.get_free_blocks_call_count;
    blk.free_entry = pool.blocks.insert({blk.stream, blk.size_bytes, blk.addr, b}).first;
  } else {
    blk.unmapped_entry = pool.unmapped.insert({blk.stream, blk.addr, b}).first;
  }
  blk.in_pool = true;
}

void CachingAllocator::MoveEntry(BlockIndex b, FreeSet::iterator entry) {
  Block& blk = blocks_[b];
  Pool& pool = pools_[blk.pool];
  MEMSIM_CHECK(!blk.in_pool && blk.mapped && entry->stream == blk.stream);
  const FreeKey key{blk.stream, blk.size_bytes, blk.addr, b};
  const FreeKeyLess less;
  // Only the neighbour on the side the key moves towards can pass it. Shifting the entries a key
  // passes (instead of an erase and an insert) was measured too: it saves instructions when
  // pools are small (alloc_bench: about 8 free blocks) and costs more when keys move far
  // (`memsim run`: hundreds of free blocks per pool), so a key that passes any entry is erased
  // and inserted by search (docs/performance.md, 'Pool entries moved in place').
  const bool keeps_rank =
      less(key, *entry) ? entry == pool.blocks.begin() || less(*std::prev(entry), key)
                        : std::next(entry) == pool.blocks.end() || less(key, *std::next(entry));
  if (!keeps_rank) {
    pool.blocks.erase(entry);
    InsertIntoPool(b);
    return;
  }
  entry->size_bytes = key.size_bytes;
  entry->addr = key.addr;
  entry->block = b;
  blk.gc_count_base = pool.get_free_blocks_call_count;  // as insert_into_blocks
  blk.free_entry = entry;
  blk.in_pool = true;
}

void CachingAllocator::EraseFromPool(BlockIndex b) {
  Block& blk = blocks_[b];
  MEMSIM_CHECK(blk.in_pool);
  Pool& pool = pools_[blk.pool];
  if (blk.mapped) {
    pool.blocks.erase(blk.free_entry);
  } else {
    pool.unmapped.erase(blk.unmapped_entry);
  }
  blk.in_pool = false;
}

// docs/allocator-rules.md, 'Convention: capacity': a device allocation of n bytes fails when
// reserved + n > capacity. "Unbounded" stops at 2^62 bytes so that the byte counts can never
// overflow.
bool CachingAllocator::CapacityAllows(Bytes device_bytes) const {
  constexpr Bytes kUnboundedLimit = Bytes{1} << 62;
  if (device_bytes > kUnboundedLimit - stats_.reserved_bytes.current) return false;
  if (!options_.capacity_bytes) return true;
  return stats_.reserved_bytes.current + device_bytes <= *options_.capacity_bytes;
}

// allowed_memory_maximum = floor(F x capacity) ('Convention: memory fraction'). Without a capacity
// (SetCapacity made the device unbounded) the fraction limits nothing.
Bytes CachingAllocator::AllowedMemoryMaximum() const {
  if (!options_.memory_fraction || !options_.capacity_bytes) return kUnlimited;
  return static_cast<Bytes>(
      std::floor(*options_.memory_fraction * static_cast<double>(*options_.capacity_bytes)));
}

// set_fraction && garbage_collection_threshold > 0 (CUDACachingAllocator.cpp get_free_block /
// malloc).
bool CachingAllocator::GcEnabled() const {
  return options_.memory_fraction.has_value() && options_.garbage_collection_threshold > 0.0;
}

// ---- malloc ----

std::optional<BlockHandle> CachingAllocator::Malloc(Bytes size_bytes, StreamId stream) {
  MEMSIM_CHECK(size_bytes >= 0);
  // allocate(0) returns nullptr without touching anything; >= 1 EB throws before the device
  // allocator is reached (NativeCachingAllocator::allocate / malloc).
  if (size_bytes == 0 || size_bytes >= kMaxRequest) return std::nullopt;
  ProcessEvents();
  AllocParams p;
  p.stream = stream;
  p.size_bytes = RoundSize(size_bytes, options_);
  p.pool = IsSmall(p.size_bytes) ? kSmallPool : kLargePool;

  bool found = GetFreeBlock(p);
  if (!found) {
    // get_allocation_size, needed only for a new device allocation (a pure function of the
    // size: computing it here rather than before the search changes nothing).
    p.alloc_bytes = AllocationSize(p.size_bytes);
    if (GcEnabled()) GarbageCollectCachedBlocks();
    found = AllocBlock(p, false) || (ReleaseAvailableCachedBlocks(p) && AllocBlock(p, false));
    if (!found) {
      // CUDA: release_cached_blocks + alloc_block(isRetry); NPU: the same "free everything"
      // stage after a device synchronize (which release_cached_blocks implies here).
      ReleaseCachedBlocks();
      found = AllocBlock(p, true);
    }
    if (!found) {
      ++stats_.num_ooms;
      return std::nullopt;
    }
  }
  if (IsNpu() && options_.expandable_segments && p.size_bytes >= kSmallBuffer &&
      options_.base_addr_aligned_bytes != 0) {
    if (blocks_[p.block].in_pool) EraseFromPool(p.block);
    NpuAlignBlock(p);
  }
  const bool split = ShouldSplit(p.block, p.size_bytes);
  return AllocFoundBlock(p, size_bytes, split);
}

// get_free_block (docs/allocator-rules.md, 'Best-fit search and max_split_size'). The block found
// stays in its pool; AllocFoundBlock takes it out.
bool CachingAllocator::GetFreeBlock(AllocParams& p) {
  Pool& pool = pools_[p.pool];
  if (GcEnabled()) ++pool.get_free_blocks_call_count;
  auto it = pool.blocks.lower_bound(SizeQuery{p.stream, p.size_bytes});
  if (it == pool.blocks.end() || it->stream != p.stream) return false;
  if (blocks_[it->block].expandable && options_.expandable_segments) {
    // Best fit by the size the block could grow to: prefer a free block not followed by
    // unmapped space over the growable tail.
    auto expandable_size = [this](BlockIndex b) {
      const Block& blk = blocks_[b];
      const bool next_unmapped = blk.next != kNoBlock && !blocks_[blk.next].mapped;
      return blk.size_bytes + (next_unmapped ? blocks_[blk.next].size_bytes : 0);
    };
    auto next = std::next(it);
    while (blocks_[it->block].expandable && next != pool.blocks.end() &&
           next->stream == p.stream && expandable_size(next->block) < expandable_size(it->block)) {
      it = next++;
    }
  }
  const Bytes block_bytes = it->size_bytes;
  // Rule A: no oversize block for a request below max_split_size.
  if (p.size_bytes < MaxSplit() && block_bytes >= MaxSplit()) return false;
  // Rule B: oversize reuse only within the tolerance (max_non_split_rounding_mb on CUDA >= 2.6,
  // kLargeBuffer on NPU).
  const Bytes tolerance = IsNpu() ? kLargeBuffer : options_.max_non_split_rounding_bytes;
  if (p.size_bytes >= MaxSplit() && block_bytes >= p.size_bytes + tolerance) return false;
  p.block = it->block;
  return true;
}

// alloc_block (docs/allocator-rules.md, 'Getting new memory', step 2).
bool CachingAllocator::AllocBlock(AllocParams& p, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  if (options_.memory_fraction &&
      stats_.reserved_bytes.current + p.alloc_bytes > AllowedMemoryMaximum()) {
    return false;
  }
  if (options_.expandable_segments) {
    p.block = TryAllocateExpandableBlock(p);
    return p.block != kNoBlock;
  }
  if (!CapacityAllows(p.alloc_bytes)) return false;
  const std::int32_t seg = NewSegment(p.alloc_bytes, p.stream, p.pool, false, 0);
  const BlockIndex b = NewBlock();
  Block& blk = blocks_[b];
  blk.size_bytes = p.alloc_bytes;
  blk.addr = segments_[seg].base;
  blk.stream = p.stream;
  blk.pool = p.pool;
  blk.segment = seg;
  Increase(stats_.segment, 1);
  Increase(stats_.reserved_bytes, p.alloc_bytes);
  if (p.alloc_bytes >= MaxSplit()) Increase(stats_.oversize_segments, 1);
  ++stats_.num_device_alloc;
  Trace(TraceAction::kSegmentAlloc, blk.addr, p.alloc_bytes, p.alloc_bytes, p.stream, p.pool);
  p.block = b;
  return true;
}

// release_available_cached_blocks (docs/allocator-rules.md, 'Getting new memory', step 3).
bool CachingAllocator::ReleaseAvailableCachedBlocks(const AllocParams& p) {
  if (MaxSplit() == kUnlimited) return false;
  Pool& pool = pools_[p.pool];
  const Bytes key_bytes = std::max(p.size_bytes, MaxSplit());
  auto it = pool.blocks.lower_bound(SizeQuery{p.stream, key_bytes});
  // torch_npu NPUCachingAllocator.cpp, release_available_cached_blocks: npuSynchronizeDevice
  // after the max_split_size check and the lower_bound. It changes no pool, so `it` stays valid
  // and the blocks it makes ready are not candidates here ('NPU synchronisation').
  if (IsNpu()) SynchronizeDevice();
  if (it == pool.blocks.end() || it->stream != p.stream || blocks_[it->block].expandable) {
    // No single block is large enough: release oversize blocks from the largest down.
    if (it == pool.blocks.begin()) return false;
    Bytes released = 0;
    --it;
    while (released < key_bytes && it->size_bytes >= MaxSplit() && it->stream == p.stream) {
      auto cur = it;
      const bool is_first = cur == pool.blocks.begin();
      if (!is_first) --it;
      if (!blocks_[cur->block].expandable) {
        released += cur->size_bytes;
        ReleaseBlock(cur->block);
      }
      if (is_first) break;
    }
    return released >= key_bytes;
  }
  ReleaseBlock(it->block);
  return true;
}

// release_cached_blocks / empty_cache (docs/allocator-rules.md, 'empty_cache').
void CachingAllocator::ReleaseCachedBlocks() {
  SynchronizeAndFreeEvents();
  ReleaseBlocks(kLargePool);
  ReleaseBlocks(kSmallPool);
}

// release_blocks: whole free segments are freed; expandable free blocks are unmapped page-wise.
void CachingAllocator::ReleaseBlocks(std::uint8_t pool_id) {
  Pool& pool = pools_[pool_id];
  std::vector<BlockIndex> to_unmap;
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    const BlockIndex b = it->block;
    ++it;
    if (blocks_[b].expandable) {
      to_unmap.push_back(b);
    } else if (!blocks_[b].IsSplit()) {
      ReleaseBlock(b);
    }
  }
  for (BlockIndex b : to_unmap) {
    UnmapBlock(b);
    if (!blocks_[b].IsSplit() && !blocks_[b].mapped) ReleaseExpandableSegment(b);
  }
}

// release_block: cudaFree of one whole free segment.
void CachingAllocator::ReleaseBlock(BlockIndex b) {
  Block& blk = blocks_[b];
  MEMSIM_CHECK(!blk.IsSplit() && !blk.expandable && !blk.allocated);
  EraseFromPool(b);
  const Bytes size = blk.size_bytes;
  Decrease(stats_.segment, 1);
  Decrease(stats_.reserved_bytes, size);
  if (size >= MaxSplit()) Decrease(stats_.oversize_segments, 1);
  ++stats_.num_device_free;
  Trace(TraceAction::kSegmentFree, blk.addr, size, size, blk.stream, blk.pool);
  segments_[blk.segment].live = false;
  DeleteBlock(b);
}

// garbage_collect_cached_blocks (docs/allocator-rules.md, 'Garbage collection'). On NPU
// (torch_npu NPUCachingAllocator.cpp, garbage_collect_cached_blocks) the device is synchronised
// after both early returns, just before the release loop; the blocks that were waiting on events
// return to their pools at the next process_events, so this GC cannot collect them
// ('NPU synchronisation').
void CachingAllocator::GarbageCollectCachedBlocks() {
  const Bytes gc_threshold = static_cast<Bytes>(
      options_.garbage_collection_threshold * static_cast<double>(AllowedMemoryMaximum()));
  const Bytes total = stats_.reserved_bytes.current;
  if (total <= gc_threshold) return;
  const Bytes target = total - gc_threshold;
  Pool& pool = pools_[kLargePool];
  auto age = [&pool](const Block& blk) {
    return static_cast<double>(pool.get_free_blocks_call_count - blk.gc_count_base);
  };
  double total_age = 0.0;
  int freeable = 0;
  for (const FreeKey& k : pool.blocks) {
    if (!blocks_[k.block].IsSplit()) {
      total_age += age(blocks_[k.block]);
      ++freeable;
    }
  }
  if (freeable == 0) return;
  if (IsNpu()) SynchronizeDevice();
  Bytes reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double age_threshold = total_age / freeable;
    freed = false;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      const BlockIndex b = it->block;
      ++it;
      const Block& blk = blocks_[b];
      if (!blk.IsSplit() && !blk.expandable && age(blk) >= age_threshold) {
        freed = true;
        reclaimed += blk.size_bytes;
        total_age -= age(blk);
        --freeable;
        ReleaseBlock(b);
      }
    }
  }
}

// should_split (docs/allocator-rules.md, 'Splitting').
bool CachingAllocator::ShouldSplit(BlockIndex b, Bytes size_bytes) const {
  const Block& blk = blocks_[b];
  const Bytes remaining = blk.size_bytes - size_bytes;
  if (blk.pool == kSmallPool || options_.expandable_segments) return remaining >= kMinBlockSize;
  return size_bytes < MaxSplit() && remaining > kSmallSize;
}

// alloc_found_block (docs/allocator-rules.md, 'Splitting'). A block still in its pool (found by
// GetFreeBlock) hands its pool entry to the remainder of a split.
BlockHandle CachingAllocator::AllocFoundBlock(const AllocParams& p, Bytes request_bytes,
                                              bool split) {
  BlockIndex b = p.block;
  const bool already_split = blocks_[b].IsSplit();
  const bool expandable = blocks_[b].expandable;
  const bool had_entry = blocks_[b].in_pool;
  const FreeSet::iterator entry = blocks_[b].free_entry;
  if (had_entry) {
    MEMSIM_CHECK(blocks_[b].mapped);
    blocks_[b].in_pool = false;
    if (!split) pools_[blocks_[b].pool].blocks.erase(entry);
  }
  if (split) {
    const BlockIndex remaining = b;
    b = NewBlock();
    Block& rem = blocks_[remaining];
    Block& blk = blocks_[b];
    blk.size_bytes = p.size_bytes;
    blk.addr = rem.addr;
    blk.stream = rem.stream;
    blk.pool = rem.pool;
    blk.segment = rem.segment;
    blk.expandable = rem.expandable;
    blk.prev = rem.prev;
    if (blk.prev != kNoBlock) blocks_[blk.prev].next = b;
    blk.next = remaining;
    rem.prev = b;
    rem.addr += p.size_bytes;
    rem.size_bytes -= p.size_bytes;
    if (had_entry) {
      MoveEntry(remaining, entry);
    } else {
      InsertIntoPool(remaining);
    }
    if (!expandable) {
      if (already_split) {
        Decrease(stats_.inactive_split_bytes, p.size_bytes);
      } else {
        Increase(stats_.inactive_split_bytes, rem.size_bytes);
        Increase(stats_.inactive_split, 1);
      }
    }
  } else if (already_split && !expandable) {
    Decrease(stats_.inactive_split_bytes, blocks_[b].size_bytes);
    Decrease(stats_.inactive_split, 1);
  }
  Block& blk = blocks_[b];
  blk.allocated = true;
  blk.requested_bytes = request_bytes;
  Increase(stats_.allocation, 1);
  Increase(stats_.allocated_bytes, blk.size_bytes);
  Increase(stats_.active, 1);
  Increase(stats_.active_bytes, blk.size_bytes);
  Increase(stats_.requested_bytes, request_bytes);
  if (blk.size_bytes >= MaxSplit()) Increase(stats_.oversize_allocations, 1);
  Trace(TraceAction::kAlloc, blk.addr, request_bytes, blk.size_bytes, blk.stream, blk.pool);
  if (!free_handles_.empty()) {
    const BlockHandle h = free_handles_.back();
    free_handles_.pop_back();
    handle_to_block_[h - 1] = b;
    return h;
  }
  handle_to_block_.push_back(b);
  return handle_to_block_.size();
}

// ---- free ----

void CachingAllocator::Free(BlockHandle handle) {
  MEMSIM_CHECK(handle >= 1 && handle <= handle_to_block_.size());
  const BlockIndex b = handle_to_block_[handle - 1];
  MEMSIM_CHECK(b != kNoBlock && blocks_[b].allocated);
  handle_to_block_[handle - 1] = kNoBlock;
  free_handles_.push_back(handle);
  Block& blk = blocks_[b];
  blk.allocated = false;
  Decrease(stats_.allocation, 1);
  Decrease(stats_.allocated_bytes, blk.size_bytes);
  if (blk.size_bytes >= MaxSplit()) Decrease(stats_.oversize_allocations, 1);
  Trace(TraceAction::kFreeRequested, blk.addr, blk.requested_bytes, blk.size_bytes, blk.stream,
        blk.pool);
  if (!blk.stream_uses.empty()) {
    // insert_events: one event per used stream; the block stays active until all complete.
    for (StreamId s : blk.stream_uses) {
      events_[s].queue.push_back({next_event_seq_++, b});
      ++pending_events_;
    }
    blk.event_count = static_cast<std::int32_t>(blk.stream_uses.size());
    blk.stream_uses.clear();
    return;
  }
  FreeBlock(b);
}

void CachingAllocator::RecordStream(BlockHandle handle, StreamId stream) {
  MEMSIM_CHECK(handle >= 1 && handle <= handle_to_block_.size());
  const BlockIndex b = handle_to_block_[handle - 1];
  MEMSIM_CHECK(b != kNoBlock);
  Block& blk = blocks_[b];
  // CUDA ignores the block's own stream; torch_npu's recordStream inserts it anyway
  // (docs/allocator-rules.md, 'record_stream and events').
  if (stream == blk.stream && !IsNpu()) return;
  auto it = std::lower_bound(blk.stream_uses.begin(), blk.stream_uses.end(), stream);
  if (it == blk.stream_uses.end() || *it != stream) blk.stream_uses.insert(it, stream);
}

void CachingAllocator::CompleteStream(StreamId stream) {
  auto it = events_.find(stream);
  if (it == events_.end()) return;
  it->second.done_seq = next_event_seq_;
  events_may_have_completed_ = true;
}

// process_events: completed events in ascending stream id, FIFO per stream ('Convention: stream
// events').
void CachingAllocator::ProcessEvents() {
  if (!events_may_have_completed_) return;
  events_may_have_completed_ = false;
  for (auto it = events_.begin(); it != events_.end();) {
    StreamEvents& ev = it->second;
    while (ev.head < ev.queue.size() && ev.queue[ev.head].seq < ev.done_seq) {
      const BlockIndex b = ev.queue[ev.head++].block;
      --pending_events_;
      if (--blocks_[b].event_count == 0) FreeBlock(b);
    }
    // A drained queue is dropped: a later `complete` only concerns later events.
    it = ev.head == ev.queue.size() ? events_.erase(it) : std::next(it);
  }
}

// c10_npu::npuSynchronizeDevice: the device drains, so every event recorded so far has
// completed; the allocator notices at its next process_events.
void CachingAllocator::SynchronizeDevice() {
  if (pending_events_ == 0) return;
  for (auto& [stream, ev] : events_) {
    ev.done_seq = next_event_seq_;
  }
  events_may_have_completed_ = true;
}

// synchronize_and_free_events: every outstanding event completes and its block is freed now.
void CachingAllocator::SynchronizeAndFreeEvents() {
  if (pending_events_ == 0) return;
  SynchronizeDevice();
  ProcessEvents();
}

// try_merge_blocks: returns the bytes absorbed from `src`, 0 if not mergeable.
Bytes CachingAllocator::TryMergeBlocks(BlockIndex dst, BlockIndex src) {
  if (!CanMerge(dst, src)) return 0;
  EraseFromPool(src);
  return MergeInto(dst, src);
}

bool CachingAllocator::CanMerge(BlockIndex dst, BlockIndex src) const {
  if (src == kNoBlock) return false;
  const Block& s = blocks_[src];
  return !s.allocated && s.event_count == 0 && s.stream_uses.empty() &&
         s.mapped == blocks_[dst].mapped;
}

Bytes CachingAllocator::MergeInto(BlockIndex dst, BlockIndex src) {
  MEMSIM_CHECK(!blocks_[src].in_pool);
  Block& d = blocks_[dst];
  const Block& s = blocks_[src];
  if (d.prev == src) {
    d.addr = s.addr;
    d.prev = s.prev;
    if (d.prev != kNoBlock) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != kNoBlock) blocks_[d.next].prev = dst;
  }
  const Bytes subsumed = s.size_bytes;
  d.size_bytes += subsumed;
  DeleteBlock(src);
  return subsumed;
}

// free_block (docs/allocator-rules.md, 'Free and merge').
void CachingAllocator::FreeBlock(BlockIndex b) {
  const Bytes original_bytes = blocks_[b].size_bytes;
  const Bytes requested = blocks_[b].requested_bytes;
  Trace(TraceAction::kFreeCompleted, blocks_[b].addr, requested, original_bytes, blocks_[b].stream,
        blocks_[b].pool);
  std::int64_t net_blocks = 0;
  Bytes net_bytes = 0;
  // try_merge_blocks with each neighbour, then insert_into_blocks; b takes over the pool entry of
  // the larger merged neighbour (the nearest to b's new key), the other's entry is erased.
  Pool& pool = pools_[blocks_[b].pool];
  FreeSet::iterator entry;
  Bytes entry_bytes = 0;  // 0: no entry taken
  const BlockIndex candidates[2] = {blocks_[b].prev, blocks_[b].next};
  for (BlockIndex c : candidates) {
    if (!CanMerge(b, c)) continue;
    Block& s = blocks_[c];
    MEMSIM_CHECK(s.in_pool && s.mapped);
    if (s.size_bytes > entry_bytes) {
      if (entry_bytes > 0) pool.blocks.erase(entry);
      entry = s.free_entry;
      entry_bytes = s.size_bytes;
    } else {
      pool.blocks.erase(s.free_entry);
    }
    s.in_pool = false;
    const Bytes subsumed = MergeInto(b, c);
    net_blocks -= 1;
    net_bytes -= subsumed;
  }
  if (entry_bytes > 0) {
    MoveEntry(b, entry);
  } else {
    InsertIntoPool(b);
  }
  const Block& blk = blocks_[b];
  if (blk.IsSplit()) {
    net_blocks += 1;
    net_bytes += blk.size_bytes;
  }
  if (!blk.expandable) {
    if (net_blocks > 0) Increase(stats_.inactive_split, net_blocks);
    if (net_blocks < 0) Decrease(stats_.inactive_split, -net_blocks);
    if (net_bytes > 0) Increase(stats_.inactive_split_bytes, net_bytes);
    if (net_bytes < 0) Decrease(stats_.inactive_split_bytes, -net_bytes);
  }
  blocks_[b].requested_bytes = 0;
  Decrease(stats_.active, 1);
  Decrease(stats_.active_bytes, original_bytes);
  Decrease(stats_.requested_bytes, requested);
}

void CachingAllocator::EmptyCache() { ReleaseCachedBlocks(); }

void CachingAllocator::SetCapacity(std::optional<Bytes> capacity_bytes) {
  options_.capacity_bytes = capacity_bytes;
}

void CachingAllocator::ResetPeakStats() {
  for (Gauge* g : {&stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                   &stats_.requested_bytes, &stats_.inactive_split_bytes, &stats_.allocation,
                   &stats_.active, &stats_.segment, &stats_.inactive_split,
                   &stats_.oversize_allocations, &stats_.oversize_segments}) {
    g->peak = g->current;
  }
}

}  // namespace internal

std::unique_ptr<Allocator> NewCachingAllocator(const AllocatorOptions& options) {
  return std::make_unique<internal::CachingAllocator>(options);
}

}  // namespace memsim::alloc
