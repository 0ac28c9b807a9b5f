// Device preset JSON (docs/config.md "Device preset") -> DevicePreset.
#include <fmt/core.h>

#include "config/parts.h"

namespace memsim::config::internal {

namespace {

// memsim's bound on every byte figure of a preset: 2^50 bytes (1 PiB), about 7000 times the
// largest device memory shipped (h200-141g), so that sums and products of these figures in the
// allocator and engine stay far from int64 overflow and from the 2^60-byte request limit.
constexpr Bytes kMaxDeviceBytes = Bytes{1} << 50;
// Bounds on the throughput figures (0 = unknown: the workload then falls back to its default).
// Lowest: 1 GFLOP/s and 1 MB/s, far below any accelerator, so time estimates stay finite and
// meaningful; highest: 1e18 FLOP/s (1000 times a B200's dense bf16 peak) and 1e16 B/s (about 1000
// times an H200's HBM3e bandwidth).
constexpr double kMinFlops = 1e9, kMaxFlops = 1e18;
constexpr double kMinBandwidth = 1e6, kMaxBandwidth = 1e16;

// The preset's "nccl" block (device/communicators.h). NCCL's MAXCHANNELS is 32 (NVIDIA/nccl
// src/include/device.h); NVLS_NCHANNELS is bounded the same.
NcclTopology ReadNcclTopology(const Source& source, const Json& object, const std::string& pointer) {
  ObjectReader n(source, object, pointer);
  NcclTopology t;
  t.coll_channels = n.IntInRange("coll_channels", 1, 32).value_or(0);
  if (t.coll_channels == 0) Fail(n.At("coll_channels"), "missing key, expected 1 to 32");
  t.p2p_read = n.Bool("p2p_read").value_or(false);
  t.all_nvlink = n.Bool("all_nvlink").value_or(true);
  t.nvls_channels = n.IntInRange("nvls_channels", 0, 32).value_or(0);
  n.RejectUnknown({"coll_channels", "p2p_read", "all_nvlink", "nvls_channels"});
  return t;
}

}  // namespace

DevicePreset ReadDevicePreset(const Source& source, const Json& object, const std::string& pointer) {
  ObjectReader r(source, object, pointer);
  DevicePreset d;
  std::optional<std::string> name = r.String("name");
  if (!name || name->empty()) Fail(r.At("name"), "missing key, expected the preset's name");
  d.name = *name;
  std::optional<std::string> backend = r.Choice("allocator_backend", {"cuda", "npu"});
  if (!backend) Fail(r.At("allocator_backend"), "missing key, expected 'cuda' or 'npu'");
  d.allocator_backend = *backend == "npu" ? alloc::Backend::kNpu : alloc::Backend::kCuda;
  auto bytes = [&](const char* key, bool required_positive) -> Bytes {
    const Json* v = r.Get(key);
    if (v == nullptr) {
      if (required_positive) Fail(r.At(key), "missing key, expected a positive number of bytes");
      return 0;
    }
    const Bytes lo = required_positive ? 1 : 0;
    bool ok = false;
    if (v->is_number_unsigned()) {
      ok = v->get<std::uint64_t>() >= static_cast<std::uint64_t>(lo) &&
           v->get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxDeviceBytes);
    } else if (v->is_number_integer()) {
      ok = v->get<std::int64_t>() >= lo && v->get<std::int64_t>() <= kMaxDeviceBytes;
    }
    if (!ok) {
      Fail(r.At(key), fmt::format("expected an integer number of bytes from {} to 2^50 (1 PiB), got {}",
                                  lo, Describe(*v)));
    }
    return v->get<std::int64_t>();
  };
  d.total_memory_bytes = bytes("total_memory_bytes", true);
  d.usable_memory_bytes = bytes("usable_memory_bytes", true);
  if (d.usable_memory_bytes > d.total_memory_bytes) {
    Fail(r.At("usable_memory_bytes"),
         fmt::format("{} exceeds total_memory_bytes {}", d.usable_memory_bytes, d.total_memory_bytes));
  }
  d.idle_baseline_bytes = bytes("idle_baseline_bytes", false);
  d.context_bytes = bytes("context_bytes", false);
  d.context_eager_bytes = bytes("context_eager_bytes", false);
  d.communicator_buffer_bytes = bytes("communicator_buffer_bytes", false);
  if (const Json* nccl = r.Get("nccl")) d.nccl = ReadNcclTopology(source, *nccl, r.PointerOf("nccl"));
  // 0 (unknown) or a number in [lo, hi].
  auto rate = [&](ObjectReader& o, const char* key, double lo, double hi, const char* range) {
    const Json* v = o.Get(key);
    if (v == nullptr) return 0.0;
    const double x = v->is_number() ? v->get<double>() : -1;
    if (!v->is_number() || !(x == 0 || (x >= lo && x <= hi))) {
      Fail(o.At(key), fmt::format("expected 0 (unknown) or a number from {}, got {}", range,
                                  Describe(*v)));
    }
    return x;
  };
  if (const Json* flops = r.Get("peak_flops")) {
    ObjectReader f(source, *flops, r.PointerOf("peak_flops"));
    constexpr const char* kRange = "1e9 to 1e18 FLOP/s";
    d.peak_flops_bf16 = rate(f, "bf16", kMinFlops, kMaxFlops, kRange);
    d.peak_flops_fp16 = rate(f, "fp16", kMinFlops, kMaxFlops, kRange);
    d.peak_flops_fp32 = rate(f, "fp32", kMinFlops, kMaxFlops, kRange);
    f.RejectUnknown({"bf16", "fp16", "fp32"});
  }
  d.memory_bandwidth_bytes_per_s = rate(r, "memory_bandwidth_bytes_per_s", kMinBandwidth,
                                        kMaxBandwidth, "1e6 to 1e16 bytes/s");
  if (const Json* sources = r.Get("sources")) {
    ObjectReader s(source, *sources, r.PointerOf("sources"));
    for (auto it = sources->begin(); it != sources->end(); ++it) {
      std::optional<std::string> text = s.String(it.key());
      if (text) d.sources[it.key()] = *text;
    }
  }
  r.Skip("description");
  r.RejectUnknown({"name", "allocator_backend", "total_memory_bytes", "usable_memory_bytes",
                   "idle_baseline_bytes", "context_bytes", "context_eager_bytes",
                   "communicator_buffer_bytes", "nccl",
                   "peak_flops", "memory_bandwidth_bytes_per_s", "sources", "description"});
  return d;
}

}  // namespace memsim::config::internal
