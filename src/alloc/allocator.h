// The caching-allocator model: PyTorch's CUDACachingAllocator (DeviceCachingAllocator) and
// torch_npu's NPUCachingAllocator, one device, behind a small interface. The rules it follows,
// each with its upstream function, are in docs/allocator-rules.md (cited by heading). It knows
// nothing of phases, time, JSON or printing. Sizes are bytes (int64); streams are small
// non-negative integers. Ownership: the caller owns the Allocator; blocks are referred to by
// BlockHandle, never pointer.
//
// Where the real allocator leaves a choice open (addresses, event timing, capacity) the model
// follows docs/allocator-rules.md, 'memsim conventions'. Version choices (current behaviour by
// default) are listed in docs/decisions/allocator-versions.md. Layout: rounding.{h,cc} (sizes),
// options.cc (the PYTORCH_*_ALLOC_CONF parser), caching_allocator.cc
// (malloc/free/pools/events/OOM/GC), expandable.cc (expandable segments), invariants.cc
// (CheckInvariants), stats.h (stat table).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/units.h"

namespace memsim::alloc {

enum class Backend { kCuda, kNpu };

using StreamId = std::int32_t;
// Identifies one live allocation. A handle passed to Free may be returned again by a later
// Malloc (the handle table stays as large as the most allocations ever live at once, not the
// number of mallocs: issue 17's bounded memory), so a caller must drop a handle when it frees it.
using BlockHandle = std::uint64_t;

// The options of PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF (docs/allocator-rules.md,
// 'Options'), plus the conventions 'Convention: capacity' and 'Convention: memory fraction'.
struct AllocatorOptions {
  Backend backend = Backend::kCuda;
  // Device bytes the allocator may reserve; nullopt = unbounded ('Convention: capacity').
  std::optional<Bytes> capacity_bytes;
  // max_split_size_mb × 2^20; nullopt = unlimited (SIZE_MAX).
  std::optional<Bytes> max_split_size_bytes;
  // max_non_split_rounding_mb × 2^20 (CUDA only; default kLargeBuffer = 20 MiB).
  Bytes max_non_split_rounding_bytes = 20 * kMiB;
  // Divisions per power-of-two interval [2^(20+i), 2^(21+i)), i = 0..15; 0 = off.
  std::array<int, 16> roundup_power2_divisions{};
  // garbage_collection_threshold in (0, 1); 0 = off.
  double garbage_collection_threshold = 0.0;
  // set_per_process_memory_fraction; needs capacity_bytes.
  std::optional<double> memory_fraction;
  bool expandable_segments = false;
  // NPU base_addr_aligned_kb × 1024 (default 16 KiB, range 0..16 KiB).
  Bytes base_addr_aligned_bytes = 16 * kKiB;

  bool operator==(const AllocatorOptions&) const = default;
};

// A gauge as c10 `Stat`: current value and running maximum (docs/allocator-rules.md, 'Statistics',
// 'Convention: peaks').
struct Gauge {
  Bytes current = 0;
  Bytes peak = 0;
  bool operator==(const Gauge&) const = default;
};

// torch.cuda.memory_stats() names, aggregate ("all") pool (c10 DeviceStats;
// docs/allocator-rules.md, 'Statistics').
struct AllocatorStats {
  Gauge allocated_bytes;
  Gauge reserved_bytes;
  Gauge active_bytes;
  Gauge requested_bytes;
  Gauge inactive_split_bytes;
  Gauge allocation;
  Gauge active;
  Gauge segment;
  Gauge inactive_split;
  Gauge oversize_allocations;
  Gauge oversize_segments;
  // Monotone counters: alloc_block(isRetry = true) calls; OOMs reported
  // (docs/allocator-rules.md, 'Getting new memory', steps 4 and 5).
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  // Device allocations / frees: cudaMalloc or a page mapping / cudaFree or a page unmapping
  // (c10 DeviceStats num_device_alloc / num_device_free). A snapshot's segment_alloc +
  // segment_map events count the same thing.
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  bool operator==(const AllocatorStats&) const = default;
};

// What happened in the allocator, as PyTorch's TraceEntry records it for memory snapshots
// (c10/cuda/CUDACachingAllocator.h `TraceEntry`; torch_npu NPUCachingAllocator.h the same): a
// device allocation or mapping of a segment, a block handed out, a free requested by the caller,
// the block back in its pool (at once, or after its stream events completed), a segment given
// back. Addresses follow docs/allocator-rules.md, 'Convention: addresses'.
enum class TraceAction : std::uint8_t {
  kSegmentAlloc, kSegmentMap, kAlloc, kFreeRequested, kFreeCompleted, kSegmentUnmap, kSegmentFree
};
struct TraceEvent {
  TraceAction action = TraceAction::kAlloc;
  Bytes addr = 0;
  // alloc / free_*: the caller's requested size (TraceEntry records orig_size / requested_size);
  // segment_*: the bytes allocated, mapped, unmapped or freed.
  Bytes size_bytes = 0;
  Bytes block_bytes = 0;  // alloc / free_*: the block's size after rounding and splitting
  StreamId stream = 0;
  std::uint8_t pool = 0;  // 0 small, 1 large
  bool operator==(const TraceEvent&) const = default;
};
// Receives TraceEvents as they happen (attachAllocatorTraceTracker in PyTorch).
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void OnTrace(const TraceEvent& event) = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;

  // Allocates size_bytes on `stream`. Returns the handle, or nullopt when the request failed
  // after the whole out-of-memory path (num_ooms counted). Requests of 2^60 bytes or more fail
  // up front without touching the stats (as PyTorch); 0 bytes returns nullopt and changes
  // nothing (as allocate(0)). REQUIRES: size_bytes >= 0.
  virtual std::optional<BlockHandle> Malloc(Bytes size_bytes, StreamId stream) = 0;
  // Frees a live block (allocated drops now; the block returns to its pool once the events of
  // streams recorded on it complete).
  virtual void Free(BlockHandle block) = 0;
  // record_stream: the block is also used on `stream`.
  virtual void RecordStream(BlockHandle block, StreamId stream) = 0;
  // All work queued so far on `stream` has finished (docs/allocator-rules.md,
  // 'Convention: stream events').
  virtual void CompleteStream(StreamId stream) = 0;
  // torch.cuda.empty_cache(): synchronize, then release every whole free segment
  // (release_cached_blocks; docs/allocator-rules.md, 'empty_cache').
  virtual void EmptyCache() = 0;
  // Changes the device capacity ('Convention: capacity'); nullopt = unbounded (up to 2^62 bytes; a
  // memory_fraction then limits nothing). Existing segments and expandable ranges stay.
  virtual void SetCapacity(std::optional<Bytes> capacity_bytes) = 0;
  // reset_peak_memory_stats(): every peak := current.
  virtual void ResetPeakStats() = 0;
  virtual const AllocatorStats& Stats() const = 0;
  // Every later event goes to `sink` (nullptr: none). The sink must outlive its use. Default: the
  // allocator records nothing.
  virtual void SetTraceSink(TraceSink* /*sink*/) {}
  // Walks every segment and pool; returns "" iff all invariants hold, else a description.
  virtual std::string CheckInvariants() const = 0;
  // The allocator's state up to where its segments lie: two allocators with equal canonical
  // states answer every later sequence of calls alike (same sizes, splits, stats, failures),
  // with the blocks of `handles` (live blocks, in the caller's order) at the same places. The
  // encoding: the current value of every gauge (peaks and monotone counters left out), then
  // each live segment in address order (sizes, stream, pool, kind) with its blocks in address
  // order (offset in the segment, size, requested size, stream, allocated, mapped, pending
  // events, record_stream targets, age for garbage collection), each stream's outstanding
  // events (their blocks' places), then the places of `handles`. Segments are named by their
  // rank in address order, so a segment released and allocated again at a new address compares
  // equal: new segments always lie above every existing one (allocator-rules.md 'Convention:
  // addresses'), so only the order of addresses, which this keeps, decides anything. Used by the
  // engine to detect a steady state (engine/simulator.h). Cost: O(blocks log blocks).
  virtual std::vector<std::int64_t> CanonicalState(const std::vector<BlockHandle>& handles) const = 0;
};

// REQUIRES: ValidateOptions(options) does not throw.
std::unique_ptr<Allocator> NewCachingAllocator(const AllocatorOptions& options);

// Parses the PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF syntax ("k:v,k:v", spaces
// ignored, keys case-sensitive, True/False also lower case) for `backend`, plus the memsim
// pseudo-option memory_fraction:F ('Convention: memory fraction'). Keys: cuda max_split_size_mb,
// max_non_split_rounding_mb, roundup_power2_divisions (N or [K:v,...,>:v]),
// garbage_collection_threshold, expandable_segments, memory_fraction; npu the same without
// max_non_split_rounding_mb, plus base_addr_aligned_kb. Starts from `base` (defaults).
// Throws InputError "<what>: ..." for an unknown key (with "did you mean"), a key of the other
// backend, a malformed value or one out of range. Does not check cross-option rules: call
// ValidateOptions on the result (after setting capacity_bytes).
AllocatorOptions ParseAllocConf(std::string_view conf, Backend backend,
                                std::string_view what = "--alloc-conf",
                                AllocatorOptions base = {});

// Checks the ranges and the cross-option rules of docs/interfaces.md, 'Allocator traces':
// max_split_size > 20 MiB, garbage_collection_threshold in [0, 1) (0 = off), memory_fraction in
// [0, 1] and only with a capacity, base_addr_aligned_bytes in [0, 16 KiB],
// roundup_power2_divisions 0 or a power of two; on NPU expandable_segments (default False there, so
// only ever set explicitly) together with max_split_size or a GC threshold is rejected, as
// torch_npu's parseArgs does (NPUAllocatorConfig.cpp; docs/allocator-rules.md, 'Expandable
// segments'). Throws InputError naming `what`.
void ValidateOptions(const AllocatorOptions& options, std::string_view what = "--alloc-conf");

std::string_view BackendName(Backend backend);

}  // namespace memsim::alloc
