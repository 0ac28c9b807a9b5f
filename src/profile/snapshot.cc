// PyTorch memory snapshot, JSON form (docs/profile-formats.md, 'PyTorch memory snapshot';
// torch_npu's variant from torch_npu/csrc/npu/Module.cpp). The final state comes
// from `segments` and the curves from walking `device_traces[d]` backwards (as
// torch/utils/viz/MemoryViz.js does), because the ring buffer may have dropped the oldest entries:
//   reserved  = sum of the device's segment total_size; undo segment_alloc/map (-size) and
//               segment_free/unmap (+size);
//   allocated = sum over active_allocated blocks; undo alloc (-size), free_requested (+size)
//               (the allocator's allocated_bytes drops at free_requested);
//   active    = sum over active_* blocks; undo alloc (-size), free_completed (+size).
// A trace entry's `size` is the requested size (orig_size), a block's requested_size too;
// both are rounded up to the allocator's 512-byte granule (PyTorch CUDACachingAllocator
// round_size, kMinBlockSize = 512) so the two agree. Estimate: a large block whose unsplit tail
// is kept (remainder <= 1 MiB) is larger than that; the imported allocated curve can be up to
// 1 MiB per such live block low. Time: `time_us` (epoch us) where present; otherwise (PyTorch
// <= 2.0, torch_npu) the entry index, 1 us apart. The snapshot has no iteration markers.
// Memory: read with a SAX parser (stack frames are skipped, never stored); kept are 24 bytes per
// trace entry of every device plus per-device sums, then the usual bounded series (profile.h).
#include <filesystem>
#include <istream>
#include <map>
#include <set>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/pickle.h"
#include "profile/importers.h"
#include "profile/json_error.h"
#include "profile/reader.h"

namespace memsim::profile::internal {
namespace {

using json = nlohmann::json;

// A pickled snapshot is read whole into memory: at most this many bytes (an estimate, above the
// largest snapshot torch's default ring buffer of 100,000 entries per device writes).
constexpr size_t kMaxPickleBytes = size_t{4} << 30;

// The rest of the (decompressed) file from `buf`, whose first byte has been peeked, refused
// beyond kMaxPickleBytes. Bytes whose count is not known in advance (a pipe, gzip data) are
// checked as they grow, at 4 MiB and every 4x more: the reading stops once they already hold
// the error the whole would give (an endless or garbage stream, refused at its first bad opcode
// instead of at 4 GiB) or the whole pickle (core/pickle.h PickleNeedsMoreBytes).
std::string ReadWhole(GzStreamBuf& buf, const std::string& path) {
  std::error_code ec;
  const bool check = buf.Compressed() || !std::filesystem::is_regular_file(path, ec);
  size_t next_check = size_t{4} << 20;
  std::string out;
  std::vector<char> chunk(1 << 16);
  while (true) {
    const std::streamsize n = buf.sgetn(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    if (n <= 0) break;
    out.append(chunk.data(), static_cast<size_t>(n));
    if (out.size() > kMaxPickleBytes) {
      throw InputError(fmt::format("{}: a pickled snapshot larger than 4 GiB", path));
    }
    if (check && out.size() >= next_check) {
      if (!PickleNeedsMoreBytes(out)) break;
      next_check = out.size() * 4;
    }
  }
  return out;
}

// REQUIRES: bytes <= kMaxInputBytes (every size is bounded as it is read).
int64_t Round512(int64_t bytes) { return bytes <= 0 ? 0 : (bytes + 511) / 512 * 512; }

enum class Action : std::uint8_t {
  kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kMarker
};

struct Entry {
  int64_t time_us = -1;  // -1: absent
  int64_t size = 0;
  Action action = Action::kMarker;
};

struct Final {
  int64_t reserved = 0, allocated = 0, active = 0;
};

// A snapshot nests at most 9 levels (root, /segments, a segment, its blocks, a block, its
// history, an entry, its frames, a frame; torch/cuda/memory.py _snapshot).
constexpr size_t kMaxDepth = kMaxJsonProfileDepth;
const char* const kTooDeep =
    "nested deeper than memsim's limit of 64 levels (a memory snapshot nests at most 9)";

const char* const kNotSnapshot =
    "expected a memory snapshot object with 'segments' and 'device_traces' arrays "
    "(torch.cuda.memory._snapshot())";

// Paths, as frame sequences from the root object (legacy: the root is the segment array):
//   /segments/i/{device,total_size}            segment fields
//   /segments/i/blocks/b/{size,requested_size,state}, .../history/h/real_size
//   /device_traces/d/n/{action,size,time_us}   trace entries
class Handler : public nlohmann::json_sax<json> {
 public:
  explicit Handler(const std::string& path) : path_(path) {}

  std::map<int, Final> finals;
  std::map<int, std::vector<Entry>> traces;
  std::optional<size_t> error_position;
  std::string error;
  bool saw_segments = false;

  bool null() override { return Scalar(Kind::kOther, 0, ""); }
  bool boolean(bool) override { return Scalar(Kind::kOther, 0, ""); }
  bool number_integer(number_integer_t v) override { return Scalar(Kind::kInt, v, ""); }
  bool number_unsigned(number_unsigned_t v) override {
    return Scalar(Kind::kInt, v > static_cast<number_unsigned_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v), "");
  }
  bool number_float(number_float_t, const string_t&) override { return Scalar(Kind::kOther, 0, ""); }
  bool string(string_t& v) override { return Scalar(Kind::kString, 0, v); }
  bool binary(binary_t&) override { return Scalar(Kind::kOther, 0, ""); }

  bool start_object(std::size_t) override {
    if (frames_.size() >= kMaxDepth) return Fail(Pointer(), kTooDeep);
    BeginValue();
    if (frames_.empty()) legacy_ = false;
    frames_.push_back(Frame{false, {}, -1, {}});
    switch (Where()) {
      case Place::kSegment: segment_ = Segment{}; break;
      case Place::kBlock: block_ = Block{}; break;
      case Place::kEntry: entry_ = Entry{}; entry_action_.clear(); entry_has_size_ = false; break;
      default: break;
    }
    return true;
  }
  bool end_object() override {
    const Place place = Where();
    if (place == Place::kSegment) {
      if (segment_.total < 0) return Fail(Pointer(), "expected 'total_size' (an integer)");
      Final& f = finals[segment_.device];
      if (!Accumulate(&f.reserved, segment_.total) || !Accumulate(&f.allocated, segment_.allocated) ||
          !Accumulate(&f.active, segment_.active)) {
        return Fail(Pointer(), "the segments' sizes add up beyond 2^62 bytes");
      }
    } else if (place == Place::kBlock) {
      if (block_.state.empty()) return Fail(Pointer(), "expected a block with a 'state' string");
      if (block_.size < 0) return Fail(Pointer(), "expected 'size' (an integer)");
      const int64_t requested =
          block_.requested >= 0 ? block_.requested : block_.has_history ? block_.history : block_.size;
      if ((block_.state == "active_allocated" &&
           !Accumulate(&segment_.allocated, Round512(requested))) ||
          (block_.state.rfind("active_", 0) == 0 && !Accumulate(&segment_.active, Round512(requested)))) {
        return Fail(Pointer(), "the blocks' sizes add up beyond 2^62 bytes");
      }
    } else if (place == Place::kEntry) {
      if (!FinishEntry()) return false;
    }
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (frames_.size() >= kMaxDepth) return Fail(Pointer(), kTooDeep);
    BeginValue();
    if (frames_.empty()) {
      legacy_ = true;  // a bare list of segments (older snapshots, as _memory_viz.py accepts)
      saw_segments = true;
    } else if (frames_.size() == 1 && !legacy_ && frames_[0].key == "segments") {
      saw_segments = true;
    }
    frames_.push_back(Frame{true, {}, -1, {}});
    if (Where() == Place::kDeviceTrace) traces[static_cast<int>(frames_[1].index)];
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return true;
  }
  bool key(string_t& k) override {
    // Twice in one object, the streamed sums would count both ("segments" twice: reserved
    // doubled); the replay reader refuses it too (replay/snapshot.h).
    if (!frames_.back().keys.Insert(k)) return Fail(Pointer() + "/" + k, "duplicate key");
    frames_.back().key = k;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    if (!semantic_) {
      error_position = position;
      error = ex.what();
    }
    return false;
  }
  bool semantic_failed() const { return semantic_; }

 private:
  enum class Kind { kInt, kString, kOther };
  enum class Place {
    kOther, kSegments, kSegment, kBlock, kHistoryItem, kTraces, kDeviceTrace, kEntry
  };
  struct Frame {
    bool array;
    std::string key;
    int64_t index;
    ObjectKeys keys;  // objects: the keys given so far
  };
  struct Segment {
    int device = 0;
    int64_t total = -1, allocated = 0, active = 0;
  };
  struct Block {
    int64_t size = -1, requested = -1, history = 0;
    bool has_history = false;
    std::string state;
  };

  void BeginValue() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }

  // Where the innermost frame is (for objects: the object itself).
  Place Where() const {
    const size_t b = legacy_ ? 0 : 1;  // frames_[b] is the segments array
    const size_t n = frames_.size();
    const bool in_segments = legacy_ ? n >= 1 && frames_[0].array
                                     : n >= 2 && frames_[0].key == "segments" && frames_[1].array;
    if (in_segments) {
      if (n == b + 1) return Place::kSegments;
      if (n == b + 2 && !frames_[b + 1].array) return Place::kSegment;
      if (n == b + 4 && frames_[b + 1].key == "blocks" && frames_[b + 2].array && !frames_[b + 3].array) {
        return Place::kBlock;
      }
      if (n == b + 6 && frames_[b + 1].key == "blocks" && frames_[b + 3].key == "history" &&
          !frames_[b + 5].array) {
        return Place::kHistoryItem;
      }
      return Place::kOther;
    }
    if (!legacy_ && n >= 2 && frames_[0].key == "device_traces" && frames_[1].array) {
      if (n == 2) return Place::kTraces;
      if (n == 3 && frames_[2].array) return Place::kDeviceTrace;
      if (n == 4 && frames_[2].array && !frames_[3].array) return Place::kEntry;
    }
    return Place::kOther;
  }

  std::string Pointer() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.array) {
        if (f.index >= 0) p += fmt::format("/{}", f.index);
      } else if (!f.key.empty() && &f != &frames_.back()) {
        p += "/" + f.key;
      }
    }
    return p;
  }

  // *total += bytes iff the sum stays within kMaxInputBytes.
  static bool Accumulate(int64_t* total, int64_t bytes) {
    const std::optional<int64_t> sum = CheckedAdd(*total, bytes);
    if (!sum || *sum > kMaxInputBytes) return false;
    *total = *sum;
    return true;
  }

  bool Fail(const std::string& pointer, std::string_view what) {
    error = fmt::format("{}: {}: {}", path_, pointer.empty() ? "/" : pointer, what);
    semantic_ = true;
    return false;
  }

  // A scalar: its key is frames_.back().key (objects only).
  bool Scalar(Kind kind, int64_t v, const std::string& text) {
    BeginValue();
    if (frames_.empty()) return Fail("/segments", kNotSnapshot);
    const Frame& f = frames_.back();
    if (f.array) return true;
    const std::string& k = f.key;
    const Place place = Where();
    auto need_int = [&]() {
      if (kind == Kind::kInt) return true;
      return Fail(Pointer() + "/" + k, "expected an integer");
    };
    // A size: an integer from 0 to 2^62 (core/checked.h), reported at the field.
    auto need_size = [&]() {
      if (!need_int()) return false;
      if (v >= 0 && v <= kMaxInputBytes) return true;
      return Fail(Pointer() + "/" + k, fmt::format("expected a size from 0 to 2^62 bytes, got {}", v));
    };
    if (frames_.size() == 1 && !legacy_ && (k == "segments" || k == "device_traces")) {
      return Fail("/" + k, k == "segments" ? kNotSnapshot : "expected an array of per-device arrays");
    }
    switch (place) {
      case Place::kSegment:
        if (k == "device") {
          if (!need_int()) return false;
          segment_.device = static_cast<int>(v);
        } else if (k == "total_size") {
          if (!need_size()) return false;
          segment_.total = v;
        }
        break;
      case Place::kBlock:
        if (k == "size") {
          if (!need_size()) return false;
          block_.size = v;
        } else if (k == "requested_size") {
          if (!need_size()) return false;
          block_.requested = v;
        } else if (k == "state") {
          if (kind != Kind::kString) return Fail(Pointer(), "expected a block with a 'state' string");
          block_.state = text;
        }
        break;
      case Place::kHistoryItem:
        if (k == "real_size" && kind == Kind::kInt) {
          if (!need_size()) return false;
          if (!Accumulate(&block_.history, v)) {
            return Fail(Pointer() + "/" + k, "the history's sizes add up beyond 2^62 bytes");
          }
          block_.has_history = true;
        }
        break;
      case Place::kEntry:
        if (k == "action") {
          if (kind != Kind::kString) return Fail(Pointer(), "expected a trace entry with an 'action' string");
          entry_action_ = text;
        } else if (k == "size") {
          if (!need_size()) return false;
          entry_.size = v;
          entry_has_size_ = true;
        } else if (k == "time_us") {
          if (!need_int()) return false;
          if (v < 0 || !ToTimeNs(v, 1000)) {
            return Fail(Pointer() + "/" + k,
                        fmt::format("expected microseconds from 0 to 2^62 ns, got {}", v));
          }
          entry_.time_us = v;
        }
        break;
      default:
        break;
    }
    return true;
  }

  bool FinishEntry() {
    const std::string& a = entry_action_;
    if (a.empty()) return Fail(Pointer(), "expected a trace entry with an 'action' string");
    if (a == "alloc") entry_.action = Action::kAlloc;
    else if (a == "free_requested") entry_.action = Action::kFreeRequested;
    else if (a == "free_completed") entry_.action = Action::kFreeCompleted;
    else if (a == "segment_alloc" || a == "segment_map") entry_.action = Action::kSegmentAlloc;
    else if (a == "segment_free" || a == "segment_unmap") entry_.action = Action::kSegmentFree;
    else if (a == "snapshot" || a == "oom" || a == "workspace_snapshot") entry_.action = Action::kMarker;
    else {
      return Fail(Pointer() + "/action",
                  fmt::format("expected alloc, free_requested, free_completed, segment_alloc, "
                              "segment_free, segment_map, segment_unmap, snapshot or oom, got '{}'",
                              a));
    }
    if (entry_.action != Action::kMarker && !entry_has_size_) {
      return Fail(Pointer(), "expected 'size' (an integer)");
    }
    traces[static_cast<int>(frames_[1].index)].push_back(entry_);
    return true;
  }

  std::string path_;
  std::vector<Frame> frames_;
  bool legacy_ = false;
  bool semantic_ = false;
  Segment segment_;
  Block block_;
  Entry entry_;
  std::string entry_action_;
  bool entry_has_size_ = false;
};

// Streams the snapshot at `path` (JSON, or a pickle read as its JSON text) through `h`.
// Throws InputError on a malformed file.
void ReadSnapshotInto(const std::string& path, Handler& h) {
  // A pickle (torch.cuda.memory._dump_snapshot) is unpickled whole, then read as its JSON
  // text by the same handler; a JSON file is streamed. The file is opened once and its first
  // byte peeked, not consumed: a pipe cannot be read twice (`--profile <(zcat s.json.gz)`).
  // A pickle starts with PROTO (0x80), which no JSON text does (core/pickle.h).
  GzStreamBuf buf(path);
  const bool pickled = buf.sgetc() == 0x80;
  std::istream in(&buf);
  const bool ok =
      pickled ? json::sax_parse(PickleToJson(ReadWhole(buf, path), path).dump(), &h,
                                json::input_format_t::json, /*strict=*/true)
              : json::sax_parse(in, &h, json::input_format_t::json, /*strict=*/true);
  if (h.semantic_failed()) throw InputError(h.error);
  if (!ok || h.error_position) {
    throw InputError(JsonErrorMessage(path, h.error_position.value_or(0), h.error,
                                      "a memory snapshot JSON object"));
  }
}

// The device read: `requested` (--device-index), else the lowest with trace entries, else with
// segments. Throws InputError when the snapshot has no such device, or none at all.
int ChooseDevice(const std::string& path, const Handler& h, int requested) {
  int device = requested;
  for (const auto& [d, entries] : h.traces) {
    if (device < 0 && !entries.empty()) device = d;
  }
  if (device < 0 && !h.finals.empty()) device = h.finals.begin()->first;
  if (requested >= 0 && !h.finals.count(device) && !h.traces.count(device)) {
    // A device the snapshot never saw would compare as an empty profile (all zeros).
    std::set<int> seen;
    for (const auto& [d, f] : h.finals) seen.insert(d);
    for (const auto& [d, t] : h.traces) seen.insert(d);
    std::string list;
    for (const int d : seen) list += fmt::format("{}{}", list.empty() ? "" : ", ", d);
    throw InputError(fmt::format("{}: no segments and no trace entries for device {} (devices in "
                                 "the snapshot: {})",
                                 path, device, list.empty() ? "none" : list));
  }
  if (device < 0) {
    throw InputError(fmt::format("{}: no segments and no trace entries, expected a snapshot "
                                 "recorded with _record_memory_history(enabled='all')", path));
  }
  return device;
}

// The gauges at one moment of the trace.
struct State {
  TimeNs time_ns = 0;
  int64_t allocated = 0, reserved = 0, active = 0;
};

// Walks `trace` (of `device`) backwards from the snapshot's final state `end`, recording the state
// after each entry (at time_us, or entries 1 us apart when not `timed`); `*before` gets the gauges
// before the first entry. Throws InputError when the sizes add up beyond int64.
std::vector<State> StatesAfterEntries(const std::string& path, int device,
                                      const std::vector<Entry>& trace, const Final& end,
                                      bool timed, State* before) {
  std::vector<State> after(trace.size());
  int64_t reserved = end.reserved, allocated = end.allocated, active = end.active;
  for (size_t n = trace.size(); n-- > 0;) {
    const Entry& e = trace[n];
    // time_us was bounded when read (ToTimeNs); n is far below 2^62 / 1000.
    const TimeNs t = timed ? e.time_us * 1000 : static_cast<TimeNs>(n) * 1000;
    after[n] = {t, allocated, reserved, active};
    const int64_t rounded = Round512(e.size);
    int64_t* gauges[2] = {nullptr, nullptr};
    int64_t delta = rounded;
    switch (e.action) {
      case Action::kAlloc: gauges[0] = &allocated; gauges[1] = &active; delta = -rounded; break;
      case Action::kFreeRequested: gauges[0] = &allocated; break;
      case Action::kFreeCompleted: gauges[0] = &active; break;
      case Action::kSegmentAlloc: gauges[0] = &reserved; delta = -e.size; break;
      case Action::kSegmentFree: gauges[0] = &reserved; delta = e.size; break;
      case Action::kMarker: break;
    }
    for (int64_t* g : gauges) {
      // Each size is at most 2^62, but many of them can still add up beyond int64.
      const std::optional<int64_t> next = g ? CheckedAdd(*g, delta) : std::nullopt;
      if (g && !next) {
        throw InputError(fmt::format("{}: /device_traces/{}/{}/size: the trace's sizes add up "
                                     "beyond 2^63 bytes",
                                     path, device, n));
      }
      if (g) *g = *next;
    }
  }
  *before = {after.empty() ? 0 : after.front().time_ns, allocated, reserved, active};
  return after;
}

}  // namespace

timeline::Timeline LoadSnapshot(const std::string& path, const LoadProfileOptions& options) {
  Handler h(path);
  ReadSnapshotInto(path, h);
  if (!h.saw_segments) throw InputError(fmt::format("{}: /segments: {}", path, kNotSnapshot));
  const int device = ChooseDevice(path, h, options.device_index);
  const Final end = h.finals.count(device) ? h.finals.at(device) : Final{};
  const std::vector<Entry> empty;
  const std::vector<Entry>& trace = h.traces.count(device) ? h.traces.at(device) : empty;
  bool timed = !trace.empty();
  for (const Entry& e : trace) timed = timed && e.time_us >= 0;
  State before;
  const std::vector<State> after = StatesAfterEntries(path, device, trace, end, timed, &before);
  SeriesBuilder series(options.max_samples);
  int64_t clamped = 0;
  auto add = [&](const State& state) {
    timeline::Sample s;
    // The ring buffer may start with frees of blocks allocated before it: clamp at 0 (counted).
    if (state.allocated < 0 || state.reserved < 0 || state.active < 0) ++clamped;
    s.allocated_bytes = std::max<int64_t>(state.allocated, 0);
    s.reserved_bytes = std::max<int64_t>(state.reserved, 0);
    s.active_bytes = std::max<int64_t>(state.active, 0);
    series.Add(state.time_ns, s);
  };
  // The state before the first entry, then after each.
  add(before);
  for (const State& s : after) add(s);
  timeline::Timeline out = series.Finish({}, Format::kTorchSnapshot);
  out.device_index = device;
  out.notes.push_back(fmt::format("device {}, {} trace entries, {}; allocated from requested "
                                  "sizes rounded to 512 B (estimate)",
                                  device, trace.size(),
                                  timed ? "time_us clock" : "no time_us: entries 1 us apart"));
  if (clamped > 0) {
    out.notes.push_back(fmt::format("{} states before the ring buffer's oldest entry clamped at 0",
                                    clamped));
  }
  return out;
}

}  // namespace memsim::profile::internal
