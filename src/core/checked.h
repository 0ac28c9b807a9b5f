// Checked arithmetic for quantities read from input: a count times its unit (microseconds to
// nanoseconds, MiB to bytes) and the sums of such values. Every importer converts through these,
// so no input, however large, overflows a signed 64-bit value (undefined behaviour); a result out
// of range is nullopt and the caller reports the file and field. Times are nanoseconds, sizes
// bytes. Nothing here throws or allocates.
#pragma once

#include <cstdint>
#include <optional>

#include "core/units.h"

namespace memsim {

// The largest time magnitude accepted from input: 2^62 ns (about 146 years) on either side of
// zero, so the difference of any two accepted times fits in int64 (SeriesBuilder relies on it).
inline constexpr std::int64_t kMaxAbsTimeNs = std::int64_t{1} << 62;
// The largest byte count accepted from input: 2^62 bytes (4 EiB).
inline constexpr Bytes kMaxInputBytes = Bytes{1} << 62;

// a + b, a - b, a x b; nullopt iff the exact result does not fit in int64.
std::optional<std::int64_t> CheckedAdd(std::int64_t a, std::int64_t b);
std::optional<std::int64_t> CheckedSub(std::int64_t a, std::int64_t b);
std::optional<std::int64_t> CheckedMul(std::int64_t a, std::int64_t b);

// True iff |ns| <= kMaxAbsTimeNs.
bool TimeInRange(std::int64_t ns);
// count x ns_per_unit, iff the result is a time in range. REQUIRES: ns_per_unit > 0.
std::optional<std::int64_t> ToTimeNs(std::int64_t count, std::int64_t ns_per_unit);
// The same for a finite double, rounded to the nearest nanosecond; nullopt for NaN and infinity.
std::optional<std::int64_t> ToTimeNs(double count, double ns_per_unit);
// a + b iff the result is a time in range (a span's end from its start and duration).
std::optional<std::int64_t> AddTimeNs(std::int64_t a, std::int64_t b);

// count x bytes_per_unit, iff |result| <= kMaxInputBytes. REQUIRES: bytes_per_unit > 0.
std::optional<Bytes> ToBytes(std::int64_t count, Bytes bytes_per_unit);
// The same for a finite double, rounded to the nearest byte; nullopt for NaN and infinity.
std::optional<Bytes> ToBytes(double count, double bytes_per_unit);

}  // namespace memsim
