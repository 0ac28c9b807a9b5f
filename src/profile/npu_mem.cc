// CANN npu_mem*.csv (docs/profile-formats.md, 'CANN npu_mem files'): columns event (APP | Device),
// ddr(KB), hbm(KB), memory(KB), timestamp(us), Device_id, in an order that varies by CANN version
// (matched by name). KB = KiB. device_bytes: the `Device` rows (whole-device usage, what npu-smi
// shows) where present, else the `APP` rows (this process); of a row, hbm(KB) when non-zero, else
// memory(KB) (unsupported columns print 0). No iteration markers: compared on peak and converged
// level.
#include <map>

#include <fmt/core.h>

#include "core/error.h"
#include "profile/importers.h"
#include "profile/reader.h"

namespace memsim::profile::internal {

timeline::Timeline LoadNpuMem(const std::string& path, const LoadProfileOptions& options) {
  LineReader in(path);
  std::string_view line;
  if (!in.Next(&line)) in.Fail("empty file, expected the CANN npu_mem header (event, hbm(KB), memory(KB), timestamp(us), ...)");
  const std::vector<std::string> header = SplitCsv(line);
  int event = -1, hbm = -1, memory = -1, time = -1, device_col = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string& h = header[i];
    if (h == "event" || h == "Event") event = static_cast<int>(i);
    if (h == "hbm(KB)") hbm = static_cast<int>(i);
    if (h == "memory(KB)") memory = static_cast<int>(i);
    if (h == "timestamp(us)" || h == "Timestamp(us)") time = static_cast<int>(i);
    if (h == "Device_id" || h == "Device") device_col = device_col < 0 ? static_cast<int>(i) : device_col;
  }
  if (event < 0 || time < 0 || (hbm < 0 && memory < 0)) {
    in.Fail("expected the CANN npu_mem header with event, hbm(KB) or memory(KB), and timestamp(us)");
  }
  // (device, is_device_row) -> series
  std::map<std::pair<int, bool>, SeriesBuilder> series;
  while (in.Next(&line)) {
    if (Trim(line).empty()) continue;
    const std::vector<std::string> f = SplitCsv(line);
    if (f.size() != header.size()) {
      in.Fail(fmt::format("expected {} fields as in the header, got {}", header.size(), f.size()));
    }
    const std::string& ev = f[event];
    if (ev != "APP" && ev != "Device") in.Fail(fmt::format("event: expected APP or Device, got '{}'", ev));
    int device = 0;
    if (device_col >= 0) {
      std::string_view d = f[device_col];
      if (StartsWith(d, "NPU:")) d.remove_prefix(4);
      auto v = ParseInt(d);
      if (!v || *v < 0) in.Fail(fmt::format("Device_id: expected a device id, got '{}'", f[device_col]));
      device = static_cast<int>(*v);
    }
    auto kib = [&](int c) -> double {
      if (c < 0) return 0;
      auto v = ParseDouble(f[c]);
      if (!v || *v < 0) in.Fail(fmt::format("{}: expected a number of KiB, got '{}'", header[c], f[c]));
      return *v;
    };
    const double h = kib(hbm), m = kib(memory);
    auto t = ParseMicrosToNs(f[time]);
    if (!t) in.Fail(fmt::format("{}: expected microseconds, got '{}'", header[time], f[time]));
    timeline::Sample s;
    const int used_col = h > 0 ? hbm : memory;
    const std::optional<int64_t> used = KiBToBytes(h > 0 ? h : m);
    if (!used) {
      in.Fail(fmt::format("{}: expected KiB below 2^52, got '{}'", header[used_col], f[used_col]));
    }
    s.device_bytes = *used;
    series.try_emplace({device, ev == "Device"}, options.max_samples).first->second.Add(*t, s);
  }
  if (series.empty()) in.Fail("no rows after the header, expected npu_mem samples");
  int device = series.begin()->first.first;
  if (options.device_index >= 0) device = options.device_index;
  auto it = series.find({device, true});
  const bool device_rows = it != series.end();
  if (!device_rows) it = series.find({device, false});
  if (it == series.end()) {
    throw InputError(fmt::format("{}: no rows for device {}", path, device));
  }
  timeline::Timeline out = it->second.Finish({}, Format::kNpuMem);
  out.device_index = device;
  out.notes.push_back(fmt::format("device {}, {} rows ({} usage)", device, out.samples.size(),
                                  device_rows ? "whole-device" : "APP process"));
  return out;
}

}  // namespace memsim::profile::internal
