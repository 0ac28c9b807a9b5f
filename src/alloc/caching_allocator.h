// Internal to src/alloc/: the data structures of the caching-allocator model, shared by the
// files that implement its mechanisms (caching_allocator.cc: malloc/free/pools/events/OOM/GC;
// expandable.cc: expandable segments; invariants.cc: CheckInvariants). Other modules use
// allocator.h only.
//
// Glossary (docs/glossary.md): a *segment* is one device allocation (cudaMalloc), or for
// expandable segments one reserved virtual range mapped page by page; a *block* is a contiguous
// piece of a segment, allocated, pending (freed by the caller, waiting for stream events) or
// free; a free mapped block sits in its *pool* (small or large), ordered by (stream, size,
// address) as BlockComparatorSize in PyTorch's CUDACachingAllocator.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "alloc/allocator.h"
#include "alloc/rounding.h"

namespace memsim::alloc::internal {

using BlockIndex = std::int32_t;
inline constexpr BlockIndex kNoBlock = -1;
inline constexpr Bytes kUnlimited = INT64_MAX;  // max_split_size default (SIZE_MAX)

enum PoolId : std::uint8_t { kSmallPool = 0, kLargePool = 1 };

// The order of a pool: (stream, size, address); `block` never decides, since no two free blocks
// of a pool share an address. The fields other than `stream` are mutable so that a pool entry can
// be given to another block, or follow its block's new size and address, in place when the new
// key keeps its position (CachingAllocator::MoveEntry checks the neighbours): many splits and
// merges change a block's key without changing its rank, and then cost no tree search.
struct FreeKey {
  StreamId stream;
  mutable Bytes size_bytes;
  mutable Bytes addr;
  mutable BlockIndex block;
};

// A best-fit query: the first key of `stream` with at least `size_bytes`.
struct SizeQuery {
  StreamId stream;
  Bytes size_bytes;
};

// The pool order of FreeKey (stream, size, address), written out field by field (cheaper than a
// defaulted <=>), and a SizeQuery's place in it.
struct FreeKeyLess {
  using is_transparent = void;
  bool operator()(const FreeKey& a, const FreeKey& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size_bytes != b.size_bytes) return a.size_bytes < b.size_bytes;
    return a.addr < b.addr;
  }
  bool operator()(const FreeKey& a, const SizeQuery& q) const {
    return a.stream < q.stream || (a.stream == q.stream && a.size_bytes < q.size_bytes);
  }
  bool operator()(const SizeQuery& q, const FreeKey& a) const {
    return q.stream < a.stream || (q.stream == a.stream && q.size_bytes <= a.size_bytes);
  }
};

struct UnmappedKey {
  StreamId stream;
  Bytes addr;
  BlockIndex block;
  auto operator<=>(const UnmappedKey&) const = default;
};

// Recycles the nodes of one pool's sets: a freed node goes to a free list and the next insert
// takes it back, so the steady state of malloc/free allocates no memory (a speed measure only;
// the sets' order and contents are those of std::allocator). Shared by copies (the sets keep
// their own copy of the allocator), owned by the Pool, which is neither copied nor moved.
class NodeArena {
 public:
  NodeArena() = default;
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  ~NodeArena() {
    for (void* chunk : chunks_) ::operator delete(chunk);
  }
  void* Take(std::size_t bytes) {
    if (bytes != node_bytes_) {
      if (node_bytes_ != 0) return ::operator new(bytes);  // a second node type: plain new
      node_bytes_ = bytes;
    }
    if (free_ != nullptr) {
      void* p = free_;
      free_ = *static_cast<void**>(free_);
      return p;
    }
    if (next_ == end_) {
      constexpr std::size_t kNodesPerChunk = 256;
      char* chunk = static_cast<char*>(::operator new(node_bytes_ * kNodesPerChunk));
      chunks_.push_back(chunk);
      next_ = chunk;
      end_ = chunk + node_bytes_ * kNodesPerChunk;
    }
    void* p = next_;
    next_ += node_bytes_;
    return p;
  }
  void Give(void* p, std::size_t bytes) {
    if (bytes != node_bytes_) {
      ::operator delete(p);
      return;
    }
    *static_cast<void**>(p) = free_;
    free_ = p;
  }

 private:
  std::size_t node_bytes_ = 0;  // the one node size served from chunks
  void* free_ = nullptr;        // free list threaded through the freed nodes
  char* next_ = nullptr;
  char* end_ = nullptr;
  std::vector<char*> chunks_;
};

// A std allocator over a NodeArena; single-object allocations only go to the arena.
template <class T>
struct ArenaAllocator {
  using value_type = T;
  NodeArena* arena;
  explicit ArenaAllocator(NodeArena* a) : arena(a) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& o) : arena(o.arena) {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    if (n != 1) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(arena->Take(sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) {
    if (n != 1) {
      ::operator delete(p);
      return;
    }
    arena->Give(p, sizeof(T));
  }
  template <class U>
  bool operator==(const ArenaAllocator<U>& o) const {
    return arena == o.arena;
  }
};

using FreeSet = std::set<FreeKey, FreeKeyLess, ArenaAllocator<FreeKey>>;
using UnmappedSet = std::set<UnmappedKey, std::less<UnmappedKey>, ArenaAllocator<UnmappedKey>>;

// CUDACachingAllocator.cpp `struct Block`. Invariant: blocks of one segment tile it in address
// order via prev/next. A recycled slot is reset field by field in CachingAllocator::NewBlock: a
// new field needs its reset there.
struct Block {
  Bytes size_bytes = 0;
  Bytes addr = 0;
  Bytes requested_bytes = 0;  // the caller's un-rounded size while allocated or pending
  BlockIndex prev = kNoBlock;
  BlockIndex next = kNoBlock;
  StreamId stream = 0;
  std::int32_t segment = -1;
  std::int32_t event_count = 0;  // > 0 iff pending (freed, stream events outstanding)
  std::uint64_t gc_count_base = 0;
  std::uint8_t pool = kSmallPool;
  bool allocated = false;
  bool mapped = true;
  bool expandable = false;
  bool live = false;                  // slot in use
  bool in_pool = false;               // in pools_[pool]: `free_entry` or `unmapped_entry` is set
  std::vector<StreamId> stream_uses;  // record_stream targets, sorted, unique
  // The block's entry in pools_[pool].blocks (mapped) or .unmapped while in_pool, so that taking
  // it out costs no search (std::set iterators stay valid until their element is erased).
  FreeSet::iterator free_entry;
  UnmappedSet::iterator unmapped_entry;
  bool IsSplit() const { return prev != kNoBlock || next != kNoBlock; }
};

// CUDACachingAllocator.cpp `BlockPool`.
struct Pool {
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  NodeArena free_nodes;
  NodeArena unmapped_nodes;
  FreeSet blocks{ArenaAllocator<FreeKey>(&free_nodes)};  // free, mapped blocks
  UnmappedSet unmapped{ArenaAllocator<UnmappedKey>(&unmapped_nodes)};  // unmapped ranges of
                                                                        // expandable segments
  std::uint64_t get_free_blocks_call_count = 0;  // GC age clock
};

struct Segment {
  Bytes base = 0;
  Bytes size_bytes = 0;  // device allocation size, or the virtual range of an expandable one
  Bytes page_bytes = 0;  // expandable only
  StreamId stream = 0;
  std::uint8_t pool = kSmallPool;
  bool expandable = false;
  bool live = false;
};

// One recorded stream event (insert_events): done once its stream's done_seq passes seq.
struct StreamEvents {
  struct Event {
    std::uint64_t seq;
    BlockIndex block;
  };
  std::vector<Event> queue;  // FIFO from `head`
  std::size_t head = 0;
  std::uint64_t done_seq = 0;  // events with seq < done_seq have completed
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(const AllocatorOptions& options);

  std::optional<BlockHandle> Malloc(Bytes size_bytes, StreamId stream) override;
  void Free(BlockHandle block) override;
  void RecordStream(BlockHandle block, StreamId stream) override;
  void CompleteStream(StreamId stream) override;
  void EmptyCache() override;
  void SetCapacity(std::optional<Bytes> capacity_bytes) override;
  void ResetPeakStats() override;
  const AllocatorStats& Stats() const override { return stats_; }
  std::string CheckInvariants() const override;
  void SetTraceSink(TraceSink* sink) override { trace_ = sink; }
  std::vector<std::int64_t> CanonicalState(const std::vector<BlockHandle>& handles) const override;

 private:
  struct AllocParams {
    StreamId stream = 0;
    Bytes size_bytes = 0;   // rounded
    Bytes alloc_bytes = 0;  // get_allocation_size
    std::uint8_t pool = kSmallPool;
    BlockIndex block = kNoBlock;
  };

  // caching_allocator.cc
  bool GetFreeBlock(AllocParams& p);
  bool AllocBlock(AllocParams& p, bool is_retry);
  bool ReleaseAvailableCachedBlocks(const AllocParams& p);
  void ReleaseCachedBlocks();
  void GarbageCollectCachedBlocks();
  bool ShouldSplit(BlockIndex b, Bytes size_bytes) const;
  BlockHandle AllocFoundBlock(const AllocParams& p, Bytes request_bytes, bool split);
  void FreeBlock(BlockIndex b);
  Bytes TryMergeBlocks(BlockIndex dst, BlockIndex src);
  void ProcessEvents();
  void SynchronizeAndFreeEvents();
  // npuSynchronizeDevice: every recorded event is marked done; the blocks waiting on them stay
  // out of their pools until the next ProcessEvents.
  void SynchronizeDevice();
  void ReleaseBlocks(std::uint8_t pool);
  void ReleaseBlock(BlockIndex b);
  void InsertIntoPool(BlockIndex b);
  void EraseFromPool(BlockIndex b);
  // Puts the free mapped block `b` (not in its pool) into its pool through `entry`, an entry of
  // that pool no block owns any more: rewritten in place when b's key keeps the entry's rank,
  // else erased and b inserted (the result is that of InsertIntoPool).
  void MoveEntry(BlockIndex b, FreeSet::iterator entry);
  // Whether src is free and of dst's kind (mapped or not), so that try_merge_blocks merges it.
  bool CanMerge(BlockIndex dst, BlockIndex src) const;
  // Merges the block src, out of its pool, into its neighbour dst; returns src's bytes.
  Bytes MergeInto(BlockIndex dst, BlockIndex src);
  BlockIndex NewBlock();
  void DeleteBlock(BlockIndex b);
  std::int32_t NewSegment(Bytes size_bytes, StreamId stream, std::uint8_t pool, bool expandable,
                          Bytes page_bytes);
  bool CapacityAllows(Bytes device_bytes) const;
  bool GcEnabled() const;
  Bytes AllowedMemoryMaximum() const;
  Bytes MaxSplit() const { return max_split_bytes_; }
  bool IsNpu() const { return options_.backend == Backend::kNpu; }
  // Sends one event to the trace sink, if any.
  void Trace(TraceAction action, Bytes addr, Bytes size_bytes, Bytes block_bytes, StreamId stream,
             std::uint8_t pool) {
    if (trace_ != nullptr) trace_->OnTrace({action, addr, size_bytes, block_bytes, stream, pool});
  }

  // expandable.cc
  BlockIndex TryAllocateExpandableBlock(const AllocParams& p);
  BlockIndex FindExpandableBlock(const AllocParams& p);
  bool MapBlock(BlockIndex b, Bytes size_bytes);
  void UnmapBlock(BlockIndex b);
  void ReleaseExpandableSegment(BlockIndex b);
  void NpuAlignBlock(AllocParams& p);

  // invariants.cc: the parts of CheckInvariants, each returning its first violation ("" if none).
  struct Recount;  // what the walk over the segments counts, for the pools and gauges
  std::string CheckSegment(std::size_t s, std::vector<BlockIndex>& blocks, Recount& r) const;
  std::string CheckBlockPlace(std::size_t s, const std::vector<BlockIndex>& blocks, std::size_t k,
                              Bytes expect_addr) const;
  std::string RecountBlock(BlockIndex bi, Recount& r) const;
  std::string CheckPools(const Recount& r) const;
  std::string CheckHandlesAndGauges(const Recount& r) const;

  AllocatorOptions options_;
  Bytes max_split_bytes_ = kUnlimited;
  AllocatorStats stats_;
  Pool pools_[2];
  std::vector<Block> blocks_;
  std::vector<BlockIndex> free_slots_;
  std::vector<Segment> segments_;
  Bytes next_segment_addr_ = Bytes{1} << 40;  // allocator-rules.md 'Convention: addresses'
  std::map<StreamId, StreamEvents> events_;   // allocator-rules.md 'Convention: stream events'
  std::uint64_t next_event_seq_ = 0;
  std::int64_t pending_events_ = 0;
  bool events_may_have_completed_ = false;
  std::vector<BlockIndex> handle_to_block_;  // index = handle - 1; kNoBlock once freed
  std::vector<BlockHandle> free_handles_;   // freed handles, reused last-freed first
  TraceSink* trace_ = nullptr;               // not owned
};

inline void Increase(Gauge& g, Bytes v) {
  g.current += v;
  if (g.current > g.peak) g.peak = g.current;
}
inline void Decrease(Gauge& g, Bytes v) { g.current -= v; }

}  // namespace memsim::alloc::internal
