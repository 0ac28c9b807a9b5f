// PyTorch memory snapshot, JSON form (F§2; torch_npu's variant F§2.2 A5). The final state comes
// from `segments` and the curves from walking `device_traces[d]` backwards (F§2.4, as MemoryViz
// does), because the ring buffer may have dropped the oldest entries:
//   reserved  = sum of the device's segment total_size; undo segment_alloc/map (-size) and
//               segment_free/unmap (+size);
//   allocated = sum over active_allocated blocks; undo alloc (-size), free_requested (+size)
//               (the allocator's allocated_bytes drops at free_requested, F§2.2 table);
//   active    = sum over active_* blocks; undo alloc (-size), free_completed (+size).
// A trace entry's `size` is the requested size (orig_size, F§2.2), a block's requested_size too;
// both are rounded up to the allocator's 512-byte granule (PyTorch CUDACachingAllocator
// round_size, kMinBlockSize = 512) so the two agree. Estimate: a large block whose unsplit tail
// is kept (remainder <= 1 MiB) is larger than that; the imported allocated curve can be up to
// 1 MiB per such live block low. Time: `time_us` (epoch us) where present; otherwise (PyTorch
// <= 2.0, torch_npu) the entry index, 1 us apart. The snapshot has no iteration markers.
// Memory: the document is parsed whole (nlohmann DOM): about 5-10x the file size. Snapshots
// larger than a few GB should be trimmed with max_entries when recording.
#include <fstream>
#include <istream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "profile/importers.h"
#include "profile/json_error.h"
#include "profile/reader.h"

namespace memsim::profile::internal {
namespace {

using json = nlohmann::json;

int64_t Round512(int64_t bytes) { return bytes <= 0 ? 0 : (bytes + 511) / 512 * 512; }

[[noreturn]] void Fail(const std::string& path, const std::string& pointer, std::string_view what) {
  throw InputError(fmt::format("{}: {}: {}", path, pointer, what));
}

int64_t IntField(const std::string& path, const json& obj, const std::string& pointer,
                 const char* key, bool required, int64_t fallback = 0) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) Fail(path, pointer, fmt::format("expected '{}' (an integer)", key));
    return fallback;
  }
  if (!it->is_number_integer()) {
    Fail(path, pointer + "/" + key, "expected an integer");
  }
  return it->get<int64_t>();
}

}  // namespace

timeline::Timeline LoadSnapshot(const std::string& path, const LoadProfileOptions& options) {
  json doc;
  {
    GzStreamBuf buf(path);
    std::istream in(&buf);
    try {
      doc = json::parse(in);
    } catch (const json::parse_error& e) {
      throw InputError(JsonErrorMessage(path, e.byte, e.what(), "a memory snapshot JSON object"));
    }
  }
  // Legacy shape: a bare list of segments (F§2.2).
  if (doc.is_array()) doc = json{{"segments", doc}, {"device_traces", json::array()}};
  if (!doc.is_object() || !doc.contains("segments") || !doc["segments"].is_array()) {
    Fail(path, "/segments",
         "expected a memory snapshot object with 'segments' and 'device_traces' arrays "
         "(torch.cuda.memory._snapshot())");
  }
  const json& segments = doc["segments"];
  const json empty = json::array();
  const json& traces = doc.contains("device_traces") ? doc["device_traces"] : empty;
  if (!traces.is_array()) Fail(path, "/device_traces", "expected an array of per-device arrays");
  // Device: the requested one, else the lowest with trace entries, else with segments.
  int device = options.device_index;
  if (device < 0) {
    for (size_t d = 0; d < traces.size() && device < 0; ++d) {
      if (traces[d].is_array() && !traces[d].empty()) device = static_cast<int>(d);
    }
    for (size_t i = 0; i < segments.size() && device < 0; ++i) {
      if (segments[i].is_object() && segments[i].contains("device") &&
          segments[i]["device"].is_number_integer()) {
        device = segments[i]["device"].get<int>();
      }
    }
  }
  if (device < 0) {
    throw InputError(fmt::format("{}: no segments and no trace entries, expected a snapshot "
                                 "recorded with _record_memory_history(enabled='all')", path));
  }
  // Final state.
  int64_t reserved = 0, allocated = 0, active = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string ptr = fmt::format("/segments/{}", i);
    const json& seg = segments[i];
    if (!seg.is_object()) Fail(path, ptr, "expected a segment object");
    if (IntField(path, seg, ptr, "device", false, 0) != device) continue;
    reserved += IntField(path, seg, ptr, "total_size", true);
    if (!seg.contains("blocks") || !seg["blocks"].is_array()) {
      Fail(path, ptr + "/blocks", "expected an array of blocks");
    }
    for (size_t b = 0; b < seg["blocks"].size(); ++b) {
      const std::string bptr = fmt::format("{}/blocks/{}", ptr, b);
      const json& block = seg["blocks"][b];
      if (!block.is_object() || !block.contains("state") || !block["state"].is_string()) {
        Fail(path, bptr, "expected a block with a 'state' string");
      }
      const std::string state = block["state"];
      const int64_t size = IntField(path, block, bptr, "size", true);
      // requested_size: newer; legacy blocks carry history[].real_size (F§2.2).
      int64_t requested = size;
      if (block.contains("requested_size")) {
        requested = IntField(path, block, bptr, "requested_size", true);
      } else if (block.contains("history") && block["history"].is_array()) {
        requested = 0;
        for (const json& h : block["history"]) {
          if (h.is_object() && h.contains("real_size") && h["real_size"].is_number_integer()) {
            requested += h["real_size"].get<int64_t>();
          }
        }
      }
      if (state == "active_allocated") allocated += Round512(requested);
      if (state.rfind("active_", 0) == 0) active += Round512(requested);
    }
  }
  // Walk the trace backwards; record the state after each entry.
  const json& trace = static_cast<size_t>(device) < traces.size() ? traces[device] : empty;
  if (!trace.is_array()) Fail(path, fmt::format("/device_traces/{}", device), "expected an array");
  struct State {
    TimeNs time_ns;
    int64_t allocated, reserved, active;
  };
  std::vector<State> after(trace.size());
  bool timed = !trace.empty();
  for (const json& e : trace) timed = timed && e.is_object() && e.contains("time_us");
  int64_t skipped = 0;
  for (size_t n = trace.size(); n-- > 0;) {
    const std::string ptr = fmt::format("/device_traces/{}/{}", device, n);
    const json& e = trace[n];
    if (!e.is_object() || !e.contains("action") || !e["action"].is_string()) {
      Fail(path, ptr, "expected a trace entry with an 'action' string");
    }
    const std::string action = e["action"];
    const TimeNs t = timed ? IntField(path, e, ptr, "time_us", true) * 1000
                           : static_cast<TimeNs>(n) * 1000;
    after[n] = {t, allocated, reserved, active};
    const int64_t size = IntField(path, e, ptr, "size", action != "snapshot" && action != "oom" &&
                                                            action != "workspace_snapshot");
    const int64_t rounded = Round512(size);
    if (action == "alloc") {
      allocated -= rounded;
      active -= rounded;
    } else if (action == "free_requested") {
      allocated += rounded;
    } else if (action == "free_completed") {
      active += rounded;
    } else if (action == "segment_alloc" || action == "segment_map") {
      reserved -= size;
    } else if (action == "segment_free" || action == "segment_unmap") {
      reserved += size;
    } else if (action == "snapshot" || action == "oom" || action == "workspace_snapshot") {
      // markers
    } else {
      Fail(path, ptr + "/action",
           fmt::format("expected alloc, free_requested, free_completed, segment_alloc, "
                       "segment_free, segment_map, segment_unmap, snapshot or oom, got '{}'",
                       action));
    }
  }
  SeriesBuilder series(options.max_samples);
  auto add = [&](TimeNs t, int64_t a, int64_t r, int64_t act) {
    timeline::Sample s;
    // The ring buffer may start with frees of blocks allocated before it: clamp at 0 (counted).
    if (a < 0 || r < 0 || act < 0) ++skipped;
    s.allocated_bytes = std::max<int64_t>(a, 0);
    s.reserved_bytes = std::max<int64_t>(r, 0);
    s.active_bytes = std::max<int64_t>(act, 0);
    series.Add(t, s);
  };
  // The state before the first entry, then after each.
  add(after.empty() ? 0 : after.front().time_ns, allocated, reserved, active);
  for (const State& s : after) add(s.time_ns, s.allocated, s.reserved, s.active);
  timeline::Timeline out = series.Finish({}, "torch-snapshot");
  out.device_index = device;
  out.notes.push_back(fmt::format("device {}, {} trace entries, {}; allocated from requested "
                                  "sizes rounded to 512 B (estimate)",
                                  device, trace.size(),
                                  timed ? "time_us clock" : "no time_us: entries 1 us apart"));
  if (skipped > 0) {
    out.notes.push_back(fmt::format("{} states before the ring buffer's oldest entry clamped at 0",
                                    skipped));
  }
  return out;
}

}  // namespace memsim::profile::internal
