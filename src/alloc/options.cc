// The PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF parser and the option checks
// (docs/allocator-rules.md, 'Options'; c10 AllocatorConfig.cpp parseArgs, CUDAAllocatorConfig.cpp,
// torch_npu NPUAllocatorConfig.cpp; docs/interfaces.md, 'Allocator traces', for the accepted keys
// and ranges).
#include <algorithm>
#include <bit>
#include <charconv>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "alloc/allocator.h"
#include "alloc/rounding.h"
#include "core/error.h"

namespace memsim::alloc {
namespace {

const std::vector<std::string>& KeysFor(Backend backend) {
  static const std::vector<std::string> cuda = {
      "max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions",
      "garbage_collection_threshold", "expandable_segments", "memory_fraction"};
  static const std::vector<std::string> npu = {
      "max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold",
      "expandable_segments", "memory_fraction", "base_addr_aligned_kb"};
  return backend == Backend::kCuda ? cuda : npu;
}

[[noreturn]] void Fail(std::string_view what, const std::string& message) {
  throw InputError(fmt::format("{}: {}", what, message));
}

std::int64_t ParseInt(std::string_view what, std::string_view key, std::string_view v) {
  std::int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() || out < 0) {
    Fail(what, fmt::format("{} expects a non-negative integer, got '{}'", key, v));
  }
  return out;
}

double ParseDouble(std::string_view what, std::string_view key, std::string_view v) {
  std::string s(v);
  std::size_t used = 0;
  double out = 0;
  try {
    out = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size()) {
    Fail(what, fmt::format("{} expects a number, got '{}'", key, v));
  }
  return out;
}

int ParseDivisions(std::string_view what, std::string_view v) {
  const std::int64_t d = ParseInt(what, "roundup_power2_divisions", v);
  if (d != 0 && !std::has_single_bit(static_cast<std::uint64_t>(d))) {
    Fail(what, fmt::format("roundup_power2_divisions: divisions must be 0 or a power of two, "
                           "got {}",
                           d));
  }
  if (d > (1 << 20)) Fail(what, fmt::format("roundup_power2_divisions: {} is too large", d));
  return static_cast<int>(d);
}

// "[64:8,128:2,>:1]" (spaces already removed). Entry K (MB, a power of two) sets interval
// log2(K); the first entry's value also fills every lower interval; ">" fills the intervals
// after the last explicit key (newer AcceleratorAllocatorConfig parser,
// 'Convention: power-of-two list').
void ParseDivisionList(std::string_view what, std::string_view list,
                       std::array<int, 16>& divisions) {
  std::string_view body = list.substr(1, list.size() - 2);
  if (body.empty()) Fail(what, "roundup_power2_divisions: empty list");
  bool first = true;
  int last_index = 0;
  while (!body.empty()) {
    const std::size_t comma = body.find(',');
    std::string_view entry = body.substr(0, comma);
    body = comma == std::string_view::npos ? std::string_view() : body.substr(comma + 1);
    if (comma != std::string_view::npos && body.empty()) {
      Fail(what, "roundup_power2_divisions: trailing ',' in list");
    }
    const std::size_t colon = entry.find(':');
    if (colon == std::string_view::npos) {
      Fail(what, fmt::format("roundup_power2_divisions: expected K:v in list, got '{}'", entry));
    }
    std::string_view k = entry.substr(0, colon);
    const int v = ParseDivisions(what, entry.substr(colon + 1));
    if (k == ">") {
      for (int i = last_index + 1; i < kPower2Intervals; ++i) divisions[i] = v;
      continue;
    }
    const std::int64_t mb = ParseInt(what, "roundup_power2_divisions", k);
    if (mb == 0 || !std::has_single_bit(static_cast<std::uint64_t>(mb))) {
      Fail(what, fmt::format("roundup_power2_divisions: interval {} is not a power of two", k));
    }
    const int index =
        std::min(static_cast<int>(std::bit_width(static_cast<std::uint64_t>(mb))) - 1, kPower2Intervals - 1);
    if (first) {
      for (int i = 0; i < index; ++i) divisions[i] = v;
      first = false;
    }
    divisions[index] = v;
    last_index = index;
  }
}

bool ParseBool(std::string_view what, std::string_view key, std::string_view v) {
  if (v == "True" || v == "true") return true;
  if (v == "False" || v == "false") return false;
  Fail(what, fmt::format("{} expects True or False, got '{}'", key, v));
}

// Fails unless `key` is an option of `backend`'s allocator: naming the other backend when it is
// one of its options, else suggesting the closest key.
void CheckKnownKey(std::string_view what, Backend backend, const std::string& key) {
  const auto& keys = KeysFor(backend);
  if (std::find(keys.begin(), keys.end(), key) != keys.end()) return;
  const auto& other = KeysFor(backend == Backend::kCuda ? Backend::kNpu : Backend::kCuda);
  if (std::find(other.begin(), other.end(), key) != other.end()) {
    Fail(what, fmt::format("'{}' is not an option of the {} backend", key, BackendName(backend)));
  }
  std::string message = fmt::format("unknown key '{}'", key);
  const std::string guess = ClosestMatch(key, keys);
  if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
  Fail(what, message);
}

// Sets the option `key` (a known key) of `o` from `value`.
void ApplyOption(std::string_view what, const std::string& key, std::string_view value,
                 AllocatorOptions& o) {
  if (key == "max_split_size_mb") {
    const std::int64_t mb = ParseInt(what, key, value);
    // Older parsers demand > kLargeBuffer / MiB (docs/interfaces.md, 'Allocator traces').
    if (mb <= kLargeBuffer / kMiB) {
      Fail(what, fmt::format("max_split_size_mb must be > 20, got {}", mb));
    }
    if (mb > (Bytes{1} << 40)) Fail(what, "max_split_size_mb is too large");
    o.max_split_size_bytes = mb * kMiB;
  } else if (key == "max_non_split_rounding_mb") {
    const std::int64_t mb = ParseInt(what, key, value);
    if (mb > (Bytes{1} << 40)) Fail(what, "max_non_split_rounding_mb is too large");
    o.max_non_split_rounding_bytes = mb * kMiB;
  } else if (key == "roundup_power2_divisions") {
    if (!value.empty() && value.front() == '[') {
      if (value.back() != ']') Fail(what, "roundup_power2_divisions: missing ']'");
      o.roundup_power2_divisions = {};
      ParseDivisionList(what, value, o.roundup_power2_divisions);
    } else {
      o.roundup_power2_divisions.fill(ParseDivisions(what, value));
    }
  } else if (key == "garbage_collection_threshold") {
    const double t = ParseDouble(what, key, value);
    if (!(t > 0.0 && t < 1.0)) {
      Fail(what, fmt::format("garbage_collection_threshold must be in (0, 1), got {}", value));
    }
    o.garbage_collection_threshold = t;
  } else if (key == "expandable_segments") {
    o.expandable_segments = ParseBool(what, key, value);
  } else if (key == "memory_fraction") {
    const double f = ParseDouble(what, key, value);
    if (!(f >= 0.0 && f <= 1.0)) {
      Fail(what, fmt::format("memory_fraction must be in [0, 1], got {}", value));
    }
    o.memory_fraction = f;
  } else if (key == "base_addr_aligned_kb") {
    const std::int64_t kb = ParseInt(what, key, value);
    if (kb > 16) Fail(what, fmt::format("base_addr_aligned_kb must be in [0, 16], got {}", kb));
    o.base_addr_aligned_bytes = kb * kKiB;
  }
}

}  // namespace

std::string_view BackendName(Backend backend) {
  return backend == Backend::kCuda ? "cuda" : "npu";
}

AllocatorOptions ParseAllocConf(std::string_view conf, Backend backend, std::string_view what,
                                AllocatorOptions base) {
  AllocatorOptions o = base;
  o.backend = backend;
  std::string text;
  for (char c : conf) {
    if (c != ' ' && c != '\t') text += c;
  }
  std::string_view rest = text;
  std::vector<std::string> seen;  // keys given so far; a repeated key is an error
  while (!rest.empty()) {
    // A comma inside [...] belongs to the list.
    std::size_t end = 0;
    int depth = 0;
    while (end < rest.size() && (rest[end] != ',' || depth > 0)) {
      if (rest[end] == '[') ++depth;
      if (rest[end] == ']') --depth;
      ++end;
    }
    std::string_view item = rest.substr(0, end);
    rest = end < rest.size() ? rest.substr(end + 1) : std::string_view();
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      Fail(what, fmt::format("expected key:value, got '{}'", item));
    }
    const std::string key(item.substr(0, colon));
    const std::string_view value = item.substr(colon + 1);
    CheckKnownKey(what, backend, key);
    // c10 keeps the last value of a repeated key; the JSON configs refuse duplicates, so this
    // parser does too rather than let one of two values win silently.
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      Fail(what, fmt::format("duplicate key '{}'", key));
    }
    seen.push_back(key);
    ApplyOption(what, key, value, o);
  }
  return o;
}

void ValidateOptions(const AllocatorOptions& o, std::string_view what) {
  if (o.max_split_size_bytes && *o.max_split_size_bytes <= kLargeBuffer) {
    Fail(what, "max_split_size_mb must be > 20");
  }
  if (o.max_non_split_rounding_bytes < 0) Fail(what, "max_non_split_rounding_mb must be >= 0");
  for (int d : o.roundup_power2_divisions) {
    if (d < 0 || (d != 0 && !std::has_single_bit(static_cast<unsigned>(d)))) {
      Fail(what, "roundup_power2_divisions: divisions must be 0 or a power of two");
    }
  }
  if (!(o.garbage_collection_threshold >= 0.0 && o.garbage_collection_threshold < 1.0)) {
    Fail(what, "garbage_collection_threshold must be in (0, 1)");
  }
  if (o.memory_fraction) {
    if (!(*o.memory_fraction >= 0.0 && *o.memory_fraction <= 1.0)) {
      Fail(what, "memory_fraction must be in [0, 1]");
    }
    if (!o.capacity_bytes) Fail(what, "memory_fraction needs a device capacity (--capacity)");
  }
  if (o.capacity_bytes && *o.capacity_bytes < 0) Fail(what, "capacity must be >= 0");
  if (o.base_addr_aligned_bytes < 0 || o.base_addr_aligned_bytes > 16 * kKiB ||
      o.base_addr_aligned_bytes % kKiB != 0) {
    Fail(what, "base_addr_aligned_kb must be an integer in [0, 16]");
  }
  if (o.backend == Backend::kNpu && o.expandable_segments &&
      (o.max_split_size_bytes || o.garbage_collection_threshold > 0.0)) {
    Fail(what,
         "on npu, expandable_segments:True cannot be combined with max_split_size_mb or "
         "garbage_collection_threshold (torch_npu rejects it)");
  }
}

}  // namespace memsim::alloc
