// Device preset JSON (design.md "Device preset") -> DevicePreset.
#include <fmt/core.h>

#include "config/parts.h"

namespace memsim::config::internal {

DevicePreset ReadDevicePreset(const Source& source, const Json& object) {
  ObjectReader r(source, object, "");
  DevicePreset d;
  std::optional<std::string> name = r.String("name");
  if (!name || name->empty()) Fail(r.At("name"), "missing key, expected the preset's name");
  d.name = *name;
  std::optional<std::string> backend = r.Choice("allocator_backend", {"cuda", "npu"});
  if (!backend) Fail(r.At("allocator_backend"), "missing key, expected 'cuda' or 'npu'");
  d.allocator_backend = *backend == "npu" ? alloc::Backend::kNpu : alloc::Backend::kCuda;
  auto bytes = [&](const char* key, bool required_positive) -> Bytes {
    std::optional<std::int64_t> v = r.NonNegativeInt64(key);
    if (!v) {
      if (required_positive) Fail(r.At(key), "missing key, expected a positive number of bytes");
      return 0;
    }
    if (required_positive && *v == 0) Fail(r.At(key), "expected a positive number of bytes, got 0");
    return *v;
  };
  d.total_memory_bytes = bytes("total_memory_bytes", true);
  d.usable_memory_bytes = bytes("usable_memory_bytes", true);
  if (d.usable_memory_bytes > d.total_memory_bytes) {
    Fail(r.At("usable_memory_bytes"),
         fmt::format("{} exceeds total_memory_bytes {}", d.usable_memory_bytes, d.total_memory_bytes));
  }
  d.idle_baseline_bytes = bytes("idle_baseline_bytes", false);
  d.context_bytes = bytes("context_bytes", false);
  d.communicator_buffer_bytes = bytes("communicator_buffer_bytes", false);
  if (const Json* flops = r.Get("peak_flops")) {
    ObjectReader f(source, *flops, r.PointerOf("peak_flops"));
    constexpr double kMax = 1e18;
    d.peak_flops_bf16 = f.Number("bf16", 0, kMax, false, false).value_or(0);
    d.peak_flops_fp16 = f.Number("fp16", 0, kMax, false, false).value_or(0);
    d.peak_flops_fp32 = f.Number("fp32", 0, kMax, false, false).value_or(0);
    f.RejectUnknown({"bf16", "fp16", "fp32"});
  }
  d.memory_bandwidth_bytes_per_s =
      r.Number("memory_bandwidth_bytes_per_s", 0, 1e16, false, false).value_or(0);
  if (const Json* sources = r.Get("sources")) {
    ObjectReader s(source, *sources, r.PointerOf("sources"));
    for (auto it = sources->begin(); it != sources->end(); ++it) {
      std::optional<std::string> text = s.String(it.key());
      if (text) d.sources[it.key()] = *text;
    }
  }
  r.Skip("description");
  r.RejectUnknown({"name", "allocator_backend", "total_memory_bytes", "usable_memory_bytes",
                   "idle_baseline_bytes", "context_bytes", "communicator_buffer_bytes",
                   "peak_flops", "memory_bandwidth_bytes_per_s", "sources", "description"});
  return d;
}

}  // namespace memsim::config::internal
