// Units shared by every module: sizes are signed 64-bit byte counts, time is
// microseconds of simulated time. MiB = 2^20 bytes. Nothing here allocates.
#pragma once

#include <cstdint>

namespace memsim {

// A byte count. Signed so that differences (iteration-over-iteration change) are natural.
using Bytes = std::int64_t;

// Simulated time in microseconds since the start of the run (docs/interfaces.md, 'Units and time').
using SimTimeUs = double;

inline constexpr Bytes kKiB = Bytes{1} << 10;
inline constexpr Bytes kMiB = Bytes{1} << 20;
inline constexpr Bytes kGiB = Bytes{1} << 30;

// Integer ceil(a / b) for a >= 0, b > 0.
constexpr Bytes CeilDiv(Bytes a, Bytes b) { return (a + b - 1) / b; }
// Round a >= 0 up to a multiple of b > 0.
constexpr Bytes RoundUp(Bytes a, Bytes b) { return CeilDiv(a, b) * b; }

namespace literals {
constexpr Bytes operator""_B(unsigned long long v) { return static_cast<Bytes>(v); }
constexpr Bytes operator""_KiB(unsigned long long v) { return static_cast<Bytes>(v) * kKiB; }
constexpr Bytes operator""_MiB(unsigned long long v) { return static_cast<Bytes>(v) * kMiB; }
constexpr Bytes operator""_GiB(unsigned long long v) { return static_cast<Bytes>(v) * kGiB; }
}  // namespace literals

}  // namespace memsim
