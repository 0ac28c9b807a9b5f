// The "allocator" block of a training config -> alloc::AllocatorOptions, with the ranges and
// backend rules of the PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF parsers: PyTorch's
// c10/cuda/CUDAAllocatorConfig.cpp (CUDAAllocatorConfig::parseArgs; from PyTorch 2.8 the shared
// options in c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig) and torch_npu's
// torch_npu/csrc/core/npu/NPUAllocatorConfig.cpp (parseArgs). docs/config.md "Allocator block"
// lists the keys; the same syntax is --alloc-conf's.
#include <algorithm>
#include <bit>
#include <cctype>
#include <map>

#include <fmt/core.h>

#include "config/parts.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

const std::vector<std::string> kCudaKeys = {
    "expandable_segments",  "max_split_size_mb",            "max_non_split_rounding_mb",
    "roundup_power2_divisions", "garbage_collection_threshold", "memory_fraction"};
const std::vector<std::string> kNpuKeys = {
    "expandable_segments",  "max_split_size_mb", "roundup_power2_divisions",
    "garbage_collection_threshold", "memory_fraction", "base_addr_aligned_kb"};

bool IsPowerOfTwo(std::int64_t v) { return v > 0 && std::has_single_bit(static_cast<std::uint64_t>(v)); }

// roundup_power2_divisions: an int for all 16 intervals, or {"<K MB>": divisions, ..., ">": d}
// (parseRoundUpPower2Divisions in the files above; key K sets the interval of sizes in
// [K MB, 2K MB)). Keys are taken in ascending numeric order (PyTorch takes the written order,
// which is ascending in every documented example); the first entry also fills the intervals below
// it and ">" fills the intervals after the last numbered key, as AcceleratorAllocatorConfig does
// (the older CUDAAllocatorConfig parser starts that fill at the last numbered key itself).
std::array<int, 16> ReadRoundup(const Source& source, const Json& v, const std::string& pointer) {
  std::array<int, 16> out{};
  const std::string at = source.At(pointer);
  if (v.is_number_integer()) {
    const std::int64_t d = v.get<std::int64_t>();
    if (d != 0 && (!IsPowerOfTwo(d) || d > 1024)) {
      Fail(at, fmt::format("expected a power of two (divisions per power-of-two interval), got {}",
                           Describe(v)));
    }
    out.fill(static_cast<int>(d));
    return out;
  }
  if (!v.is_object()) {
    Fail(at, fmt::format("expected an integer or an object such as {{\"64\": 8, \"128\": 2, \">\": 1}}, "
                         "got {}",
                         Describe(v)));
  }
  std::map<std::int64_t, int> entries;  // K in MB -> divisions
  std::optional<int> rest;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string key_at = source.At(Child(pointer, it.key()));
    if (!it->is_number_integer() || (it->get<std::int64_t>() != 0 && !IsPowerOfTwo(it->get<std::int64_t>())) ||
        it->get<std::int64_t>() > 1024) {
      Fail(key_at, fmt::format("expected a power of two or 0 (divisions), got {}", Describe(*it)));
    }
    const int d = it->get<int>();
    if (it.key() == ">") {
      rest = d;
      continue;
    }
    const std::string& k = it.key();
    const bool digits = !k.empty() && k.size() < 7 &&
                        std::all_of(k.begin(), k.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits || !IsPowerOfTwo(std::stoll(k))) {
      Fail(key_at, "expected a size in MB that is a power of two (\"1\" .. \"32768\") or \">\"");
    }
    entries[std::stoll(k)] = d;
  }
  int last = -1;
  bool first = true;
  for (const auto& [mb, d] : entries) {
    const int index = std::min(15, std::countr_zero(static_cast<std::uint64_t>(mb)));
    if (first) {
      std::fill(out.begin(), out.begin() + index, d);
      first = false;
    }
    out[index] = d;
    last = index;
  }
  if (rest) std::fill(out.begin() + (last + 1), out.end(), *rest);
  return out;
}

}  // namespace

alloc::AllocatorOptions ReadAllocatorBlock(const Source& source, const Json& object,
                                           const std::string& pointer, alloc::Backend backend) {
  ObjectReader outer(source, object, pointer);
  const bool npu = backend == alloc::Backend::kNpu;
  const std::vector<std::string>& keys = npu ? kNpuKeys : kCudaKeys;
  const std::vector<std::string>& other_keys = npu ? kCudaKeys : kNpuKeys;
  // alloc_conf string: the environment-variable syntax, parsed and checked by alloc's own
  // parser (the same one `memsim replay --alloc-conf` uses); not together with the JSON keys.
  if (std::optional<std::string> conf = outer.String("alloc_conf")) {
    for (const std::string& k : outer.Unread()) {
      if (k != "alloc_conf") Fail(outer.At(k), "give either alloc_conf or the separate keys, not both");
    }
    const std::string what = outer.At("alloc_conf");
    alloc::AllocatorOptions base_options;
    base_options.backend = backend;
    alloc::AllocatorOptions parsed = alloc::ParseAllocConf(*conf, backend, what, base_options);
    // The capacity comes from the device preset later; a memory_fraction only needs one to exist.
    alloc::AllocatorOptions with_capacity = parsed;
    with_capacity.capacity_bytes = Bytes{1} << 40;
    alloc::ValidateOptions(with_capacity, what);
    return parsed;
  }
  const Source* src = &source;
  const Json* block = &object;
  const std::string& base = pointer;
  ObjectReader r(*src, *block, base);
  const char* env = npu ? "PYTORCH_NPU_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
  for (const std::string& k : r.Unread()) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end() &&
        std::find(other_keys.begin(), other_keys.end(), k) != other_keys.end()) {
      Fail(r.At(k), fmt::format("not an option of {} (the device's allocator is {})", env,
                                npu ? "npu" : "cuda"));
    }
  }
  std::vector<std::string> known = keys;
  known.push_back("alloc_conf");
  alloc::AllocatorOptions o;
  o.backend = backend;
  std::optional<bool> expandable = r.Bool("expandable_segments");
  o.expandable_segments = expandable.value_or(false);
  if (const Json* v = r.Get("max_split_size_mb")) {
    // PyTorch: "CachingAllocator option max_split_size_mb too small, must be > 20" (older
    // parsers; torch_npu likewise).
    if (!v->is_number_integer() || v->get<std::int64_t>() <= 20 ||
        v->get<std::int64_t>() > (std::int64_t{1} << 40)) {
      Fail(r.At("max_split_size_mb"), fmt::format("expected an integer > 20 (MiB) or null, got {}", Describe(*v)));
    }
    o.max_split_size_bytes = v->get<std::int64_t>() * kMiB;
  }
  if (const Json* v = r.Get("max_non_split_rounding_mb")) {
    // CUDAAllocatorConfig::parseMaxNonSplitRoundingSize: must be > kLargeBuffer (20 MiB).
    if (!v->is_number_integer() || v->get<std::int64_t>() <= 20 ||
        v->get<std::int64_t>() > (std::int64_t{1} << 40)) {
      Fail(r.At("max_non_split_rounding_mb"), fmt::format("expected an integer > 20 (MiB), got {}", Describe(*v)));
    }
    o.max_non_split_rounding_bytes = v->get<std::int64_t>() * kMiB;
  }
  if (const Json* v = r.Get("roundup_power2_divisions")) {
    o.roundup_power2_divisions = ReadRoundup(*src, *v, r.PointerOf("roundup_power2_divisions"));
  }
  std::optional<double> gc = r.Number("garbage_collection_threshold", 0, 1, true, true);
  o.garbage_collection_threshold = gc.value_or(0.0);
  o.memory_fraction = r.Number("memory_fraction", 0, 1, true, false);
  if (std::optional<int> kb = r.IntInRange("base_addr_aligned_kb", 0, 16)) {
    o.base_addr_aligned_bytes = Bytes{*kb} * kKiB;
  }
  // torch_npu rejects an explicit expandable_segments:True together with max_split_size_mb or
  // garbage_collection_threshold (NPUAllocatorConfig::parseArgs; when expandable segments are on
  // only by default, those options switch them off with a warning instead).
  if (npu && expandable.value_or(false) && (o.max_split_size_bytes || gc)) {
    Fail(r.At("expandable_segments"),
         fmt::format("torch_npu rejects expandable_segments true together with {}",
                     o.max_split_size_bytes ? "max_split_size_mb" : "garbage_collection_threshold"));
  }
  r.RejectUnknown(known);
  return o;
}

}  // namespace memsim::config::internal
