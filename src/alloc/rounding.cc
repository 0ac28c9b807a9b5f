#include "alloc/rounding.h"

#include <bit>
#include <cstdint>

#include "core/check.h"

namespace memsim::alloc {

int Power2Interval(Bytes size_bytes) {
  const int log2 = std::bit_width(static_cast<std::uint64_t>(size_bytes)) - 1;
  const int index = log2 - 20;
  if (index < 0) return 0;
  if (index > kPower2Intervals - 1) return kPower2Intervals - 1;
  return index;
}

Bytes RoundUpPower2Division(Bytes size_bytes, int divisions) {
  const auto size = static_cast<std::uint64_t>(size_bytes);
  if (std::has_single_bit(size)) return size_bytes;
  MEMSIM_CHECK(divisions >= 2 && std::has_single_bit(static_cast<unsigned>(divisions)));
  const std::uint64_t floor = std::bit_floor(size);
  const std::uint64_t step = floor / static_cast<std::uint64_t>(divisions);
  if (step == 0) return static_cast<Bytes>(floor << 1);
  return static_cast<Bytes>(((size + step - 1) / step) * step);
}

Bytes RoundSize(Bytes request_bytes, const AllocatorOptions& options) {
  const Bytes size = request_bytes + (options.backend == Backend::kNpu ? kNpuPad : 0);
  if (size < kMinBlockSize) return kMinBlockSize;
  const int divisions = options.roundup_power2_divisions[Power2Interval(size)];
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    return RoundUpPower2Division(size, divisions);
  }
  return RoundUp(size, kMinBlockSize);
}

Bytes AllocationSize(Bytes rounded_bytes) {
  if (rounded_bytes <= kSmallSize) return kSmallBuffer;
  if (rounded_bytes < kMinLargeAlloc) return kLargeBuffer;
  return RoundUp(rounded_bytes, kRoundLarge);
}

}  // namespace memsim::alloc
