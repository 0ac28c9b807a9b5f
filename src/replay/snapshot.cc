#include "replay/snapshot.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/json_pointer.h"
#include "core/pickle.h"

namespace memsim::replay {
namespace {

using nlohmann::json;

// Pseudo streams for deferred frees start above every renumbered real stream.
constexpr alloc::StreamId kFirstPrivateStream = 1 << 30;

// Sizes read from a snapshot must be below 2^62 (estimate: far above any device memory, and low
// enough that adding two of them cannot overflow int64; Malloc itself refuses >= 2^60 as an
// out-of-memory, which stays the rule for replayed allocs).
constexpr std::uint64_t kMaxSnapshotBytes = std::uint64_t{1} << 62;

// A snapshot nests at most 9 levels (the root, /segments, a segment, its blocks, a block, its
// history, an entry, its frames, a frame; torch/cuda/memory.py _snapshot). memsim refuses more
// than 64 (the config reader's limit): a deeper document is not a snapshot, and an endless
// stream of '[' stops there.
constexpr int kMaxSnapshotDepth = 64;

// Receives, one at a time, the entries of the list that Builder streams instead of keeping.
class EntryStream {
 public:
  virtual ~EntryStream() = default;
  virtual void OnEntry(json entry) = 0;  // the next entry of the list
  virtual void OnEnd() = 0;              // the list closed
};

// Forwards the SAX events to nlohmann's DOM builder (iterative: a deep nesting costs heap, not
// stack) and keeps the byte offset of the first error, including number overflows (1e400),
// which nlohmann reports as out_of_range without a position. It also refuses a key repeated in
// one object, which the DOM would resolve silently to the last value (as the config reader
// does), naming it by JSON pointer. With a `stream`, the lists inside /device_traces stay empty
// in the document: the elements of /device_traces/<device_index> are built one at a time and
// handed to the stream, those of the other devices are checked (syntax, duplicate keys) and
// dropped, so memory does not grow with the trace.
class Builder {
 public:
  explicit Builder(json& root, EntryStream* stream = nullptr, int device_index = 0)
      : dom_(root, /*allow_exceptions=*/false), stream_(stream), device_index_(device_index) {}
  bool null() {
    Start(false);
    return Send([](auto& d) { return d.null(); }) && EndScalar();
  }
  bool boolean(bool v) {
    Start(false);
    return Send([v](auto& d) { return d.boolean(v); }) && EndScalar();
  }
  bool number_integer(json::number_integer_t v) {
    Start(false);
    return Send([v](auto& d) { return d.number_integer(v); }) && EndScalar();
  }
  bool number_unsigned(json::number_unsigned_t v) {
    Start(false);
    return Send([v](auto& d) { return d.number_unsigned(v); }) && EndScalar();
  }
  bool number_float(json::number_float_t v, const std::string& s) {
    Start(false);
    return Send([&](auto& d) { return d.number_float(v, s); }) && EndScalar();
  }
  bool string(std::string& v) {
    Start(false);
    return Send([&v](auto& d) { return d.string(v); }) && EndScalar();
  }
  bool binary(json::binary_t& v) {
    Start(false);
    return Send([&v](auto& d) { return d.binary(v); }) && EndScalar();
  }
  bool start_object(std::size_t n) {
    if (TooDeep()) return false;
    Start(false);
    levels_.push_back({true, objects_.size()});
    objects_.emplace_back();
    return Send([n](auto& d) { return d.start_object(n); });
  }
  bool key(std::string& v) {
    Object& o = objects_.back();
    if (!o.keys.insert(v).second) {
      duplicate_pointer = Pointer() + "/" + Escape(v);
      return false;
    }
    o.key = v;
    return Send([&v](auto& d) { return d.key(v); });
  }
  bool end_object() {
    levels_.pop_back();
    objects_.pop_back();
    return Send([](auto& d) { return d.end_object(); }) && EndContainer();
  }
  bool start_array(std::size_t n) {
    if (TooDeep()) return false;
    if (Start(true)) {
      // A device's list: empty in the document, its elements streamed or dropped.
      levels_.push_back({false, 0});
      list_depth_ = levels_.size();
      return dom_.start_array(0);
    }
    levels_.push_back({false, 0});
    return Send([n](auto& d) { return d.start_array(n); });
  }
  bool end_array() {
    levels_.pop_back();
    if (list_depth_ != 0 && levels_.size() + 1 == list_depth_) {
      list_depth_ = 0;
      if (capture_) stream_->OnEnd();
      capture_ = false;
      return dom_.end_array();
    }
    return Send([](auto& d) { return d.end_array(); }) && EndContainer();
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& /*token*/, const Exception& e) {
    error_byte = position;
    error_id = e.id;
    return false;
  }
  std::size_t error_byte = 0;
  int error_id = 0;
  std::string duplicate_pointer;  // set when a key repeats
  bool too_deep = false;          // set when a container would open level kMaxSnapshotDepth + 1

 private:
  bool TooDeep() {
    too_deep = levels_.size() >= static_cast<std::size_t>(kMaxSnapshotDepth);
    return too_deep;
  }
  struct Level {
    bool object;
    std::size_t n;  // object: index in objects_; list: elements started so far
  };
  struct Object {
    std::string key;                 // the member being read
    std::unordered_set<std::string> keys;  // membership tests only
  };
  static std::string Escape(std::string_view key) { return EscapePointerToken(key); }
  // Called as a value starts: counts it as the next element of the enclosing list, and returns
  // whether it is a list of /device_traces to stream (`is_array` and a stream given); an element
  // of the streamed list starts a fresh entry.
  bool Start(bool is_array) {
    if (!levels_.empty() && !levels_.back().object) ++levels_.back().n;
    if (list_depth_ != 0) {
      if (capture_ && levels_.size() == list_depth_) {
        entry_ = json();
        entry_dom_.emplace(entry_, /*allow_exceptions=*/false);
      }
      return false;
    }
    if (!is_array || stream_ == nullptr || levels_.size() != 2 || !levels_[0].object ||
        levels_[1].object || objects_[levels_[0].n].key != "device_traces") {
      return false;
    }
    capture_ = levels_[1].n - 1 == static_cast<std::size_t>(device_index_) && device_index_ >= 0;
    return true;
  }
  // Sends one event to where the current value goes: the document, the current entry, or
  // nowhere (an element of a device not replayed).
  template <class F>
  bool Send(F f) {
    if (list_depth_ == 0) return f(dom_);
    if (!capture_) return true;
    return f(*entry_dom_);
  }
  // After a scalar or a container closed: an entry of the streamed list is complete.
  bool EndScalar() { return EndContainer(); }
  bool EndContainer() {
    if (capture_ && list_depth_ != 0 && levels_.size() == list_depth_) {
      entry_dom_.reset();
      stream_->OnEntry(std::move(entry_));
    }
    return true;
  }
  // The pointer of the innermost open object.
  std::string Pointer() const {
    std::string p;
    for (std::size_t i = 0; i + 1 < levels_.size(); ++i) {
      const Level& l = levels_[i];
      p += l.object ? "/" + Escape(objects_[l.n].key) : fmt::format("/{}", l.n - 1);
    }
    return p;
  }
  std::vector<Level> levels_;
  std::vector<Object> objects_;
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  EntryStream* stream_;  // not owned; null: everything goes to the document
  int device_index_;
  std::size_t list_depth_ = 0;  // levels_.size() inside a device's list; 0 outside
  bool capture_ = false;        // that list is device_index_'s
  json entry_;                  // the entry being built
  std::optional<nlohmann::detail::json_sax_dom_parser<json>> entry_dom_;
};

// A short description of a value for messages; never recursive (no dump of containers).
std::string Describe(const json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "a list";
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true);
  if (s.size() > 60) s = s.substr(0, 60) + "...";
  return s;
}

class Reader {
 public:
  explicit Reader(std::string_view file) : file_(file) {}

  InputError Fail(const std::string& pointer, const std::string& what) const {
    return InputError(fmt::format("{}: {}: {}", file_, pointer, what));
  }

  // A required member of an object.
  const json& Member(const json& object, const std::string& pointer, const char* key,
                     const char* expected) const {
    auto it = object.find(key);
    if (it == object.end()) throw Fail(pointer + "/" + key, fmt::format("missing, expected {}", expected));
    return *it;
  }

  std::string_view String(const json& v, const std::string& pointer) const {
    if (!v.is_string()) throw Fail(pointer, fmt::format("expected a string, got {}", Describe(v)));
    return v.get_ref<const std::string&>();
  }

  // A non-negative integer <= max (JSON integers only: 1.0 or 1e3 are refused).
  std::uint64_t Unsigned(const json& v, const std::string& pointer, std::uint64_t max,
                         const char* expected) const {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() <= max) return v.get<std::uint64_t>();
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() >= 0 &&
        static_cast<std::uint64_t>(v.get<std::int64_t>()) <= max) {
      return static_cast<std::uint64_t>(v.get<std::int64_t>());
    }
    throw Fail(pointer, fmt::format("expected {}, got {}", expected, Describe(v)));
  }

  Bytes Size(const json& v, const std::string& pointer) const {
    return static_cast<Bytes>(Unsigned(v, pointer, kMaxSnapshotBytes - 1,
                                       "a non-negative integer below 2^62 (bytes)"));
  }
  std::uint64_t Address(const json& v, const std::string& pointer) const {
    return Unsigned(v, pointer, std::numeric_limits<std::uint64_t>::max(),
                    "a non-negative integer below 2^64");
  }
  int Device(const json& v, const std::string& pointer) const {
    return static_cast<int>(Unsigned(v, pointer, std::numeric_limits<std::int32_t>::max(),
                                     "a device index, an integer from 0 to 2147483647"));
  }

 private:
  std::string_view file_;
};

// Reads `/segments` (or the legacy bare list, base ""): the sum of total_size over the
// segments of `device_index`, every segment checked whatever its device.
Bytes ReservedAtEnd(const Reader& r, const json& segments, const std::string& base,
                    int device_index) {
  if (!segments.is_array()) {
    throw r.Fail(base.empty() ? "/" : base, fmt::format("expected a list of segments, got {}",
                                                        Describe(segments)));
  }
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const std::string p = fmt::format("{}/{}", base, i);
    const json& seg = segments[i];
    if (!seg.is_object()) throw r.Fail(p, fmt::format("expected an object, got {}", Describe(seg)));
    const Bytes size = r.Size(r.Member(seg, p, "total_size", "the segment's size in bytes"),
                              p + "/total_size");
    auto dev = seg.find("device");
    const int device = dev == seg.end() ? 0 : r.Device(*dev, p + "/device");
    if (device != device_index) continue;
    // Both terms are below 2^62, so the sum cannot wrap before the check.
    sum += static_cast<std::uint64_t>(size);
    if (sum >= kMaxSnapshotBytes) {
      throw r.Fail(p + "/total_size",
                   fmt::format("the segments of device {} add up to 2^62 bytes or more",
                               device_index));
    }
  }
  return static_cast<Bytes>(sum);
}

// The address of entry `e` when it is a well-formed free_completed entry; nullopt otherwise
// (a malformed one is reported when the loop reaches it).
std::optional<std::uint64_t> FreeCompletedAddress(const json& e) {
  if (!e.is_object()) return std::nullopt;
  auto action = e.find("action");
  if (action == e.end() || !action->is_string() ||
      action->get_ref<const std::string&>() != "free_completed") {
    return std::nullopt;
  }
  auto addr = e.find("addr");
  if (addr == e.end() || !addr->is_number_integer()) return std::nullopt;
  if (!addr->is_number_unsigned() && addr->get<std::int64_t>() < 0) return std::nullopt;
  return addr->get<std::uint64_t>();
}

// Turns the entries of one device's trace into operations, one entry at a time (the DOM walk
// and the streaming reader share it). Entry i is converted knowing entry i + 1 (nullptr when
// last): a free_requested followed at once by its free_completed is one free.
class EntryConverter {
 public:
  EntryConverter(const Reader& r, std::string base, Trace& trace, Trace::SnapshotFacts& facts)
      : r_(r), base_(std::move(base)), trace_(trace), facts_(facts) {}

  // Returns true when `next` was consumed as part of entry i.
  bool Convert(std::size_t i, const json& e, const json* next) {
    const std::string p = fmt::format("{}/{}", base_, i);
    if (!e.is_object()) {
      throw r_.Fail(p, fmt::format("expected an object, got {}", Describe(e)));
    }
    const std::string_view action =
        r_.String(r_.Member(e, p, "action", "a string"), p + "/action");
    const auto line = static_cast<std::int32_t>(i);
    if (action == "segment_alloc" || action == "segment_map") {
      ++facts_.segment_allocs;
    } else if (action == "segment_free" || action == "segment_unmap") {
      ++facts_.segment_frees;
    } else if (action == "snapshot" || action == "oom" || action == "workspace_snapshot") {
      // markers
    } else if (action == "alloc") {
      Alloc(e, p, line);
    } else if (action == "free_requested") {
      return FreeRequested(e, p, line, next);
    } else if (action == "free_completed") {
      const std::uint64_t addr =
          r_.Address(r_.Member(e, p, "addr", "the block's address"), p + "/addr");
      auto it = live_.find(addr);
      if (it == live_.end() || it->second.private_stream < 0) {
        ++facts_.skipped;
        return false;
      }
      trace_.records.push_back({TraceOp::kComplete, -1, 0, it->second.private_stream, line});
      live_.erase(it);
    } else {
      throw r_.Fail(p + "/action", fmt::format("unknown action '{}'", EchoField(action)));
    }
    return false;
  }

 private:
  void Alloc(const json& e, const std::string& p, std::int32_t line) {
    const std::uint64_t addr =
        r_.Address(r_.Member(e, p, "addr", "the block's address"), p + "/addr");
    const Bytes size = r_.Size(r_.Member(e, p, "size", "the size in bytes"), p + "/size");
    auto s = e.find("stream");
    const std::uint64_t raw_stream = s == e.end() ? 0 : r_.Address(*s, p + "/stream");
    auto [sit, fresh] =
        streams_.try_emplace(raw_stream, static_cast<alloc::StreamId>(streams_.size()));
    (void)fresh;
    if (live_.count(addr)) {
      throw r_.Fail(p + "/addr", fmt::format("alloc at address {} that is still allocated", addr));
    }
    const auto id = static_cast<std::int32_t>(trace_.ids.size());
    trace_.ids.push_back(fmt::format("0x{:x}", addr));
    live_[addr] = {id};
    trace_.records.push_back({TraceOp::kMalloc, id, size, sit->second, line});
  }

  bool FreeRequested(const json& e, const std::string& p, std::int32_t line, const json* next) {
    const std::uint64_t addr =
        r_.Address(r_.Member(e, p, "addr", "the block's address"), p + "/addr");
    auto it = live_.find(addr);
    if (it == live_.end() || it->second.private_stream >= 0) {
      ++facts_.skipped;
      return false;
    }
    // free_block right away emits free_completed as the very next entry.
    if (next != nullptr && FreeCompletedAddress(*next) == addr) {
      trace_.records.push_back({TraceOp::kFree, it->second.id, 0, 0, line});
      live_.erase(it);
      return true;  // the free_completed is part of this free
    }
    it->second.private_stream = next_private_++;
    trace_.records.push_back(
        {TraceOp::kRecordStream, it->second.id, 0, it->second.private_stream, line});
    trace_.records.push_back({TraceOp::kFree, it->second.id, 0, 0, line});
    return false;
  }

  struct Live {
    std::int32_t id;
    alloc::StreamId private_stream = -1;  // >= 0 while a deferred free is pending
  };
  const Reader& r_;
  std::string base_;
  Trace& trace_;
  Trace::SnapshotFacts& facts_;
  std::map<std::uint64_t, alloc::StreamId> streams_;  // raw handle -> 0, 1, ...
  std::unordered_map<std::uint64_t, Live> live_;      // by address; lookups only
  alloc::StreamId next_private_ = kFirstPrivateStream;
};

// What the streaming reader made of /device_traces/<device_index> when it is a list: the
// entries were converted as they were read and are not in the document.
struct StreamedEntries {
  std::size_t count = 0;
  Trace trace;                   // records and ids
  Trace::SnapshotFacts facts;    // segment counts and skipped entries
  std::optional<InputError> first_error;  // of the first entry that could not be converted
};

// TraceFromSnapshot, with the entries of the replayed device taken from `streamed` when given.
Trace FromDocument(const json& doc, std::string_view file_name, int device_index,
                   StreamedEntries* streamed) {
  const Reader r(file_name);
  Trace trace;
  trace.file_name = std::string(file_name);
  trace.location_word = "entry ";
  Trace::SnapshotFacts facts;
  auto fail = [&](const std::string& what) {
    return InputError(fmt::format("{}: {}", file_name, what));
  };
  // Legacy form: a bare list of segments, no traces.
  const json* traces = nullptr;
  if (doc.is_array()) {
    facts.segment_list = true;
    facts.reserved_end_bytes = ReservedAtEnd(r, doc, "", device_index);
  } else if (doc.is_object()) {
    auto segments = doc.find("segments");
    auto found = doc.find("device_traces");
    if (segments == doc.end() && found == doc.end()) {
      throw fail("not a PyTorch memory snapshot (no 'segments' or 'device_traces')");
    }
    if (segments != doc.end()) {
      facts.reserved_end_bytes = ReservedAtEnd(r, *segments, "/segments", device_index);
    }
    if (found != doc.end()) traces = &*found;
  } else {
    throw fail("not a PyTorch memory snapshot (expected a JSON object)");
  }
  if (traces) {
    if (!traces->is_array()) {
      throw r.Fail("/device_traces",
                   fmt::format("expected a list of lists, got {}", Describe(*traces)));
    }
    if (device_index < 0 || static_cast<std::size_t>(device_index) >= traces->size()) {
      if (!traces->empty() || device_index != 0) {
        throw fail(fmt::format("device index {} not in the snapshot ({} device traces)",
                               device_index, traces->size()));
      }
    } else {
      const std::string base = fmt::format("/device_traces/{}", device_index);
      const json& entries = (*traces)[static_cast<std::size_t>(device_index)];
      if (!entries.is_array()) {
        throw r.Fail(base, fmt::format("expected a list of entries, got {}", Describe(entries)));
      }
      const std::size_t count = streamed ? streamed->count : entries.size();
      // Keeps entry indices, ids and the private streams (2^30 + one per deferred free, at
      // most half the entries) inside int32.
      if (count > (std::size_t{1} << 30)) throw r.Fail(base, "more than 2^30 entries");
      facts.entries = static_cast<std::int64_t>(count);
      if (streamed) {
        if (streamed->first_error) throw *streamed->first_error;
        trace.ids = std::move(streamed->trace.ids);
        trace.records = std::move(streamed->trace.records);
        facts.segment_allocs = streamed->facts.segment_allocs;
        facts.segment_frees = streamed->facts.segment_frees;
        facts.skipped = streamed->facts.skipped;
      } else {
        EntryConverter converter(r, base, trace, facts);
        for (std::size_t i = 0; i < entries.size(); ++i) {
          const json* next = i + 1 < entries.size() ? &entries[i + 1] : nullptr;
          if (converter.Convert(i, entries[i], next)) ++i;
        }
      }
    }
  }
  trace.snapshot = facts;
  return trace;
}

// The entries of the streamed list converted as they arrive, each with the next one as its
// look-ahead; the first conversion error is kept (reported after the document's own checks,
// as when the whole document is read first) and stops the conversion.
class StreamedConversion final : public EntryStream {
 public:
  StreamedConversion(std::string_view file_name, int device_index)
      : reader_(file_name),
        converter_(reader_, fmt::format("/device_traces/{}", device_index), out.trace,
                   out.facts) {}
  void OnEntry(json entry) override {
    const std::size_t i = out.count++;
    if (!pending_) {
      pending_ = std::move(entry);
    } else if (Take(i - 1, *pending_, &entry)) {
      pending_.reset();
    } else {
      pending_ = std::move(entry);
    }
  }
  void OnEnd() override {
    if (pending_) Take(out.count - 1, *pending_, nullptr);
    pending_.reset();
    ended = true;
  }

  StreamedEntries out;
  bool ended = false;  // the list was seen whole

 private:
  bool Take(std::size_t i, const json& e, const json* next) {
    if (out.first_error) return false;
    try {
      return converter_.Convert(i, e, next);
    } catch (const InputError& error) {
      out.first_error = error;
      return false;
    }
  }
  Reader reader_;
  EntryConverter converter_;
  std::optional<json> pending_;  // entry out.count - 1, not converted yet
};

Trace StreamSnapshotJson(std::string_view text, std::string_view file_name, int device_index) {
  json doc;
  StreamedConversion conversion(file_name, device_index);
  {
    Builder builder(doc, &conversion, device_index);
    if (!json::sax_parse(text.begin(), text.end(), &builder)) {
      if (!builder.duplicate_pointer.empty()) {
        throw InputError(
            fmt::format("{}: {}: duplicate key", file_name, builder.duplicate_pointer));
      }
      if (builder.too_deep) {
        // The parser accepted everything before that container, so the scan finds it too.
        const std::size_t at = FindJsonTooDeep(text, kMaxSnapshotDepth).value_or(0);
        const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(at), '\n');
        throw InputError(fmt::format("{}:{}: JSON nested deeper than memsim's limit of {} levels "
                                     "(byte {}; a memory snapshot nests at most 9)",
                                     file_name, line, kMaxSnapshotDepth, at + 1));
      }
      const std::size_t byte = builder.error_byte;
      const std::size_t end = std::min<std::size_t>(byte == 0 ? 0 : byte - 1, text.size());
      const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(end), '\n');
      throw InputError(fmt::format("{}:{}: malformed JSON snapshot (byte {}{})", file_name, line,
                                   byte, builder.error_id == 406 ? ", number out of range" : ""));
    }
  }
  return FromDocument(doc, file_name, device_index, conversion.ended ? &conversion.out : nullptr);
}

}  // namespace

Trace TraceFromSnapshot(const nlohmann::json& doc, std::string_view file_name, int device_index) {
  return FromDocument(doc, file_name, device_index, nullptr);
}

namespace {

// SAX events of a JSON prefix, checked for syntax and depth only (nothing kept).
class PrefixCheck {
 public:
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool key(std::string&) { return true; }
  bool start_object(std::size_t) { return Open(); }
  bool end_object() { return Close(); }
  bool start_array(std::size_t) { return Open(); }
  bool end_array() { return Close(); }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& /*token*/, const Exception&) {
    error_byte = position;
    return false;
  }
  std::size_t error_byte = 0;
  bool too_deep = false;

 private:
  bool Open() {
    too_deep = ++depth_ > kMaxSnapshotDepth;
    return !too_deep;
  }
  bool Close() {
    --depth_;
    return true;
  }
  int depth_ = 0;
};

}  // namespace

bool SnapshotNeedsMoreBytes(std::string_view prefix) {
  if (LooksLikePickle(prefix)) return PickleNeedsMoreBytes(prefix);
  PrefixCheck check;
  if (json::sax_parse(prefix.begin(), prefix.end(), &check)) return true;  // bytes may follow
  // nlohmann counts the end of the input as one more character read: an error there is the
  // prefix ending, one before it is in the bytes already read.
  return !check.too_deep && check.error_byte > prefix.size();
}

Trace ParseSnapshot(std::string_view text, std::string_view file_name, int device_index) {
  if (LooksLikePickle(text)) {
    return TraceFromSnapshot(PickleToJson(text, file_name), file_name, device_index);
  }
  return StreamSnapshotJson(text, file_name, device_index);
}

}  // namespace memsim::replay
