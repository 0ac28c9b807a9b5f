#include "replay/trace.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <limits>

#include <fmt/core.h>

#include "alloc/rounding.h"
#include "core/error.h"
#include "core/pickle.h"
#include "replay/snapshot.h"

namespace memsim::replay {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// Parses a non-negative decimal integer <= max; false otherwise.
bool ParseNonNegative(std::string_view s, std::int64_t max, std::int64_t& out) {
  if (s.empty() || s.front() < '0' || s.front() > '9') return false;
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return false;
  if (v > static_cast<std::uint64_t>(max)) return false;
  out = static_cast<std::int64_t>(v);
  return true;
}

// Interns ids: each distinct id is copied once, into Trace::ids; a line's id is looked up as a
// view of the text, without allocating (open addressing, linear probing, load at most 1/2).
class IdInterner {
 public:
  explicit IdInterner(std::vector<std::string>& ids) : ids_(ids), slots_(1024, -1) {}

  // The index of `id` in ids_, added if new; `added` says which.
  std::int32_t Intern(std::string_view id, bool& added) {
    std::size_t mask = slots_.size() - 1;
    std::size_t i = std::hash<std::string_view>{}(id) & mask;
    while (slots_[i] >= 0) {
      if (ids_[static_cast<std::size_t>(slots_[i])] == id) {
        added = false;
        return slots_[i];
      }
      i = (i + 1) & mask;
    }
    added = true;
    const auto index = static_cast<std::int32_t>(ids_.size());
    ids_.emplace_back(id);
    slots_[i] = index;
    if (2 * ids_.size() > slots_.size()) Grow();
    return index;
  }

 private:
  void Grow() {
    std::vector<std::int32_t> slots(2 * slots_.size(), -1);
    const std::size_t mask = slots.size() - 1;
    for (std::size_t k = 0; k < ids_.size(); ++k) {
      std::size_t i = std::hash<std::string_view>{}(ids_[k]) & mask;
      while (slots[i] >= 0) i = (i + 1) & mask;
      slots[i] = static_cast<std::int32_t>(k);
    }
    slots_.swap(slots);
  }

  std::vector<std::string>& ids_;
  std::vector<std::int32_t> slots_;  // index into ids_, or -1
};

}  // namespace

std::string_view TraceOpName(TraceOp op) {
  switch (op) {
    case TraceOp::kMalloc: return "malloc";
    case TraceOp::kFree: return "free";
    case TraceOp::kRecordStream: return "record_stream";
    case TraceOp::kComplete: return "complete";
    case TraceOp::kEmptyCache: return "empty_cache";
  }
  return "?";
}

std::string EchoField(std::string_view field) {
  constexpr std::size_t kMaxEcho = 60;
  std::string out;
  for (unsigned char c : field.substr(0, kMaxEcho)) {
    if (c < 0x20 || c > 0x7e) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (field.size() > kMaxEcho) out += "...";
  return out;
}

Trace ParseCsvTrace(std::string_view text, std::string_view file_name) {
  Trace trace;
  trace.file_name = std::string(file_name);
  IdInterner interner(trace.ids);
  // One record per line at most: reserving the line count keeps the records' vector from
  // growing by copies (peak memory about the text plus the records).
  trace.records.reserve(static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) + 1);
  std::int32_t line_no = 0;
  bool header_allowed = true;  // until the first line that is not blank or a comment
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 byte-order mark
  auto fail = [&](const std::string& what) {
    return InputError(fmt::format("{}:{}: {}", file_name, line_no, what));
  };
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line_no == std::numeric_limits<std::int32_t>::max()) {
      throw fail("more than 2^31 - 1 lines");
    }
    ++line_no;
    const std::string_view trimmed = Trim(line);
    if (trimmed.empty() || trimmed.front() == '#') continue;
    const bool is_first = header_allowed;
    header_allowed = false;
    std::string_view fields[4];
    int n = 0;
    std::string_view rest = line;
    while (true) {
      const std::size_t comma = rest.find(',');
      if (n == 4) throw fail("too many fields (expected at most 4: op,id,bytes,stream)");
      fields[n++] = Trim(rest.substr(0, comma));
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    if (is_first && fields[0] == "op" && fields[1] == "id" && fields[2] == "bytes" &&
        fields[3] == "stream") {
      continue;  // header
    }
    TraceRecord r;
    r.line = line_no;
    const std::string_view op = fields[0];
    if (op == "malloc") {
      r.op = TraceOp::kMalloc;
    } else if (op == "free") {
      r.op = TraceOp::kFree;
    } else if (op == "record_stream") {
      r.op = TraceOp::kRecordStream;
    } else if (op == "complete") {
      r.op = TraceOp::kComplete;
    } else if (op == "empty_cache") {
      r.op = TraceOp::kEmptyCache;
    } else {
      throw fail(fmt::format(
          "unknown op '{}' (expected malloc, free, record_stream, complete, empty_cache)",
          EchoField(op)));
    }
    if (!fields[2].empty()) {
      if (!ParseNonNegative(fields[2], std::numeric_limits<std::int64_t>::max(), r.bytes)) {
        throw fail(fmt::format("bytes: expected a non-negative integer below 2^63, got '{}'",
                               EchoField(fields[2])));
      }
    }
    if (!fields[3].empty()) {
      std::int64_t s = 0;
      if (!ParseNonNegative(fields[3], std::numeric_limits<std::int32_t>::max(), s)) {
        throw fail(fmt::format("stream: expected a non-negative integer below 2^31, got '{}'",
                               EchoField(fields[3])));
      }
      r.stream = static_cast<alloc::StreamId>(s);
    }
    const bool uses_id = r.op == TraceOp::kMalloc || r.op == TraceOp::kFree ||
                         r.op == TraceOp::kRecordStream;
    if (uses_id) {
      if (fields[1].empty()) throw fail(fmt::format("{} needs an id", op));
      // ids index as int32 (TraceRecord::id); a file this large is refused, not wrapped.
      if (trace.ids.size() == static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
        throw fail("more than 2^31 - 1 distinct ids");
      }
      bool added = false;
      r.id = interner.Intern(fields[1], added);
    }
    if (r.op == TraceOp::kMalloc && fields[2].empty()) throw fail("malloc needs bytes");
    trace.records.push_back(r);
  }
  return trace;
}

Trace ParseTrace(std::string_view text, std::string_view file_name, int device_index) {
  if (LooksLikePickle(text)) return ParseSnapshot(text, file_name, device_index);
  if (!text.empty() && static_cast<unsigned char>(text[0]) == 0x80) {
    throw InputError(fmt::format("{}: a pickle of protocol {}; memsim reads pickled snapshots of "
                                 "protocols 2 to 5",
                                 file_name, text.size() > 1 ? static_cast<unsigned char>(text[1]) : 0));
  }
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (c == '{' || c == '[') return ParseSnapshot(text, file_name, device_index);
    break;
  }
  return ParseCsvTrace(text, file_name);
}

namespace {

class RowVector final : public ReplayRowSink {
 public:
  explicit RowVector(std::vector<ReplayRow>& rows) : rows_(rows) {}
  void OnRow(const ReplayRow& row) override { rows_.push_back(row); }

 private:
  std::vector<ReplayRow>& rows_;
};

}  // namespace

ReplayResult Replay(const Trace& trace, alloc::Allocator& allocator, bool keep_rows) {
  ReplayResult result;
  if (!keep_rows) return Replay(trace, allocator, static_cast<ReplayRowSink*>(nullptr));
  std::vector<ReplayRow> rows;
  rows.reserve(trace.records.size());
  RowVector sink(rows);
  result = Replay(trace, allocator, &sink);
  result.rows = std::move(rows);
  return result;
}

ReplayResult Replay(const Trace& trace, alloc::Allocator& allocator, ReplayRowSink* rows) {
  enum class IdState : std::uint8_t { kNeverSeen, kLive, kFreed, kNoop };
  struct IdInfo {
    IdState state = IdState::kNeverSeen;
    std::int32_t line = 0;  // line of the last malloc / free
    alloc::BlockHandle handle = 0;
  };
  std::vector<IdInfo> ids(trace.ids.size());
  ReplayResult result;
  const char* where = trace.location_word.empty() ? "line" : "entry";
  auto fail = [&](const TraceRecord& r, const std::string& what) {
    return InputError(
        fmt::format("{}:{}{}: {}", trace.file_name, trace.location_word, r.line, what));
  };
  for (const TraceRecord& r : trace.records) {
    switch (r.op) {
      case TraceOp::kMalloc: {
        IdInfo& info = ids[r.id];
        if (info.state == IdState::kLive) {
          throw fail(r, fmt::format("malloc of id '{}' that is still allocated (since {} {})",
                                    EchoField(trace.ids[r.id]), where, info.line));
        }
        info.line = r.line;
        // malloc of 0 bytes does nothing, as allocate(0); Malloc refuses >= 2^60 up front.
        std::optional<alloc::BlockHandle> h;
        if (r.bytes > 0) h = allocator.Malloc(r.bytes, r.stream);
        if (r.bytes >= alloc::kMaxRequest && result.refused_mallocs++ == 0) {
          result.first_refused_line = r.line;
        }
        if (h) {
          info.state = IdState::kLive;
          info.handle = *h;
        } else {
          info.state = IdState::kNoop;
        }
        break;
      }
      case TraceOp::kFree:
      case TraceOp::kRecordStream: {
        IdInfo& info = ids[r.id];
        const char* what = r.op == TraceOp::kFree ? "free" : "record_stream";
        if (info.state == IdState::kNeverSeen) {
          throw fail(r, fmt::format("{} of id '{}' that was never allocated", what,
                                    EchoField(trace.ids[r.id])));
        }
        if (info.state == IdState::kFreed) {
          throw fail(r, fmt::format("{} of id '{}' that is not allocated (freed at {} {})",
                                    what, EchoField(trace.ids[r.id]), where, info.line));
        }
        if (info.state == IdState::kNoop) break;  // failed or zero-byte malloc
        if (r.op == TraceOp::kFree) {
          allocator.Free(info.handle);
          info.state = IdState::kFreed;
          info.line = r.line;
        } else {
          allocator.RecordStream(info.handle, r.stream);
        }
        break;
      }
      case TraceOp::kComplete:
        allocator.CompleteStream(r.stream);
        break;
      case TraceOp::kEmptyCache:
        allocator.EmptyCache();
        break;
    }
    ++result.operations;
    if (rows != nullptr) {
      const alloc::AllocatorStats& s = allocator.Stats();
      rows->OnRow({r.op, s.allocated_bytes.current, s.reserved_bytes.current,
                   s.active_bytes.current});
    }
  }
  result.stats = allocator.Stats();
  return result;
}

}  // namespace memsim::replay
