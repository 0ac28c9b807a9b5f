// Size arithmetic of the caching allocator: request rounding (with the NPU pad and
// roundup_power2_divisions), pool choice and the device-allocation size. Pure functions of the
// options; no state. All sizes in bytes. Rules: docs/allocator-rules.md,
// 'Constants', 'Rounding', 'Pools and segment sizes'.
#pragma once

#include <array>

#include "alloc/allocator.h"
#include "core/units.h"

namespace memsim::alloc {

// Constants of PyTorch c10/cuda/CUDACachingAllocator.cpp (top of file) and torch_npu
// NPUCachingAllocator.cpp (docs/allocator-rules.md, 'Constants').
inline constexpr Bytes kMinBlockSize = 512;         // rounding unit and minimum split remainder
inline constexpr Bytes kSmallSize = 1 * kMiB;       // largest request of the small pool
inline constexpr Bytes kSmallBuffer = 2 * kMiB;     // small-pool segment / expandable page
inline constexpr Bytes kLargeBuffer = 20 * kMiB;    // large buffer / expandable page / tolerance
inline constexpr Bytes kMinLargeAlloc = 10 * kMiB;  // requests below this share a 20 MiB buffer
inline constexpr Bytes kRoundLarge = 2 * kMiB;      // rounding of larger device allocations
// torch_npu round_size adds this pad before rounding (docs/allocator-rules.md, 'NPU differences',
// 'Convention: NPU pad').
inline constexpr Bytes kNpuPad = 32;
// NativeCachingAllocator::allocate refuses requests of 1 EB (2^60) or more up front.
inline constexpr Bytes kMaxRequest = Bytes{1} << 60;

// Number of roundup_power2_divisions intervals: [2^(20+i), 2^(21+i)), i = 0..15 (c10
// AllocatorConfig.h kRoundUpPowerOfTwoIntervals).
inline constexpr int kPower2Intervals = 16;

// Interval index of `size_bytes` for roundup_power2_divisions: floor(log2) - 20 clamped to
// [0, 15] (c10 AllocatorConfig::roundup_power2_divisions).
int Power2Interval(Bytes size_bytes);

// roundup_power2_next_division (c10 CUDACachingAllocator.cpp): a power of two stays; else round
// up to a multiple of floor_pow2(size) / divisions (2 x floor when that step is 0).
// REQUIRES: divisions is a power of two >= 2.
Bytes RoundUpPower2Division(Bytes size_bytes, int divisions);

// round_size (docs/allocator-rules.md, 'Rounding'): adds the NPU pad, then max(512, multiple of
// 512) or the power-of-two division when divisions d > 1 and size > 512 d.
Bytes RoundSize(Bytes request_bytes, const AllocatorOptions& options);

// True iff the rounded size goes to the small pool (<= 1 MiB, get_pool; 'Pools and segment sizes').
inline bool IsSmall(Bytes rounded_bytes) { return rounded_bytes <= kSmallSize; }

// get_allocation_size ('Pools and segment sizes'): 2 MiB, 20 MiB below 10 MiB, else 2 MiB-rounded.
Bytes AllocationSize(Bytes rounded_bytes);

}  // namespace memsim::alloc
