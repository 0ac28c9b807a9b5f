#include "core/checked.h"

#include <cmath>

#include "core/check.h"

namespace memsim {

std::optional<std::int64_t> CheckedAdd(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<std::int64_t> CheckedSub(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<std::int64_t> CheckedMul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

bool TimeInRange(std::int64_t ns) { return ns >= -kMaxAbsTimeNs && ns <= kMaxAbsTimeNs; }

std::optional<std::int64_t> ToTimeNs(std::int64_t count, std::int64_t ns_per_unit) {
  MEMSIM_CHECK(ns_per_unit > 0);
  const auto ns = CheckedMul(count, ns_per_unit);
  if (!ns || !TimeInRange(*ns)) return std::nullopt;
  return ns;
}

namespace {
// Rounds a finite double within [-limit, limit] to int64; nullopt otherwise (also for NaN).
std::optional<std::int64_t> RoundWithin(double v, std::int64_t limit) {
  const double bound = static_cast<double>(limit);  // 2^62, exact
  if (!(v >= -bound && v <= bound)) return std::nullopt;
  return std::llround(v);
}
}  // namespace

std::optional<std::int64_t> ToTimeNs(double count, double ns_per_unit) {
  MEMSIM_CHECK(ns_per_unit > 0);
  return RoundWithin(count * ns_per_unit, kMaxAbsTimeNs);
}

std::optional<std::int64_t> AddTimeNs(std::int64_t a, std::int64_t b) {
  const auto ns = CheckedAdd(a, b);
  if (!ns || !TimeInRange(*ns)) return std::nullopt;
  return ns;
}

std::optional<Bytes> ToBytes(std::int64_t count, Bytes bytes_per_unit) {
  MEMSIM_CHECK(bytes_per_unit > 0);
  const auto bytes = CheckedMul(count, bytes_per_unit);
  if (!bytes || *bytes > kMaxInputBytes || *bytes < -kMaxInputBytes) return std::nullopt;
  return bytes;
}

std::optional<Bytes> ToBytes(double count, double bytes_per_unit) {
  MEMSIM_CHECK(bytes_per_unit > 0);
  return RoundWithin(count * bytes_per_unit, kMaxInputBytes);
}

}  // namespace memsim
