#include "replay/trace.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>

#include <fmt/core.h>

#include "alloc/rounding.h"
#include "core/check.h"
#include "core/error.h"
#include "core/huge_page_allocator.h"
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

// When the first line of a file is the header of a memory timeline that memsim writes (a
// different CSV: `run --csv`, the memsim-csv profile format, or `replay --csv`), what the file
// is and what replay reads instead (docs/interfaces.md, 'Allocator traces' and 'CSV timeline').
std::optional<std::string> TimelineHeader(std::string_view line) {
  bool memory_columns = false;
  for (std::string_view rest = line; !memory_columns;) {
    const std::size_t comma = rest.find(',');
    memory_columns = Trim(rest.substr(0, comma)) == "allocated_bytes";
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (!memory_columns) return std::nullopt;
  constexpr std::string_view kExpected =
      "replay reads an allocator trace, lines op,id,bytes,stream, or a PyTorch memory snapshot "
      "(docs/interfaces.md, 'Allocator traces')";
  if (line.starts_with("op_index,")) {
    return fmt::format("a `memsim replay --csv` timeline (header op_index,op,allocated_bytes,...: "
                       "the stats after each operation), not an allocator trace; {}; replay the "
                       "trace it was written from",
                       kExpected);
  }
  return fmt::format("a memory timeline (header with allocated_bytes: `memsim run --csv` or a "
                     "memsim-csv profile), not an allocator trace; {}; a timeline is a profile "
                     "for `memsim compare --profile` (docs/interfaces.md, 'CSV timeline')",
                     kExpected);
}

// The op of a CSV line (ops are lower case); false for any other name.
bool OpNamed(std::string_view name, TraceOp& op) {
  static constexpr TraceOp kOps[] = {TraceOp::kMalloc, TraceOp::kFree, TraceOp::kRecordStream,
                                     TraceOp::kComplete, TraceOp::kEmptyCache};
  for (TraceOp o : kOps) {
    if (name == TraceOpName(o)) {
      op = o;
      return true;
    }
  }
  return false;
}

// The message for a stream written one field early, empty when there is none: record_stream and
// complete take their stream in the 4th field, so a bytes field given without a stream
// (`record_stream,w,1` for `record_stream,w,,1`) is an error rather than stream 0. With the stream
// given too, bytes are ignored (bench/alloc_bench.cc --write-csv writes every field of every op).
std::string MisplacedStreamMessage(TraceOp op, const std::string_view (&fields)[4]) {
  if ((op != TraceOp::kRecordStream && op != TraceOp::kComplete) || fields[2].empty() ||
      !fields[3].empty()) {
    return {};
  }
  return fmt::format("{}: the stream is the 4th field (op,id,bytes,stream) and the 3rd is not "
                     "used: write {}",
                     TraceOpName(op),
                     op == TraceOp::kComplete ? "complete,,,STREAM" : "record_stream,ID,,STREAM");
}

// Interns ids: each distinct id is copied once, into one character arena; a line's id is
// looked up as a view of the text, without allocating (open addressing, linear probing, load at
// most 1/2, each slot keeping 32 bits of the id's hash so that most probes compare no text).
// Memory per distinct id: its characters, a 4-byte end offset and 2 to 4 slots of 8 bytes.
class IdInterner {
 public:
  IdInterner() : slots_(1024) {}

  // Any hash gives the same indices (they number ids in order of first appearance); this one
  // reads 8 bytes at a time and ends with the 64-bit finalizer of MurmurHash3 (fmix64), so that
  // the low bits, which pick the slot, depend on every byte.
  static std::uint32_t Hash(std::string_view id) {
    const char* p = id.data();
    std::size_t n = id.size();
    std::uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    for (; n >= 8; n -= 8, p += 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
      h ^= h >> 32;
    }
    h ^= Tail(p, n);
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return static_cast<std::uint32_t>(h);
  }
  // The last n < 8 bytes as one little-endian word (byte k in bits 8k..8k+7, the rest 0), read
  // with at most three loads instead of a loop: for n >= 4 two 4-byte loads that overlap (the
  // shared bytes are the same bytes, so or-ing them changes nothing), for n < 4 three single
  // bytes (again the same byte where they coincide).
  static std::uint64_t Tail(const char* p, std::size_t n) {
    auto byte = [p](std::size_t k) { return std::uint64_t{static_cast<unsigned char>(p[k])}; };
    if (n >= 4) {
      std::uint32_t lo, hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + n - 4, 4);
      if constexpr (std::endian::native == std::endian::little) {
        return lo | (std::uint64_t{hi} << (8 * (n - 4)));
      }
      std::uint64_t v = 0;
      for (std::size_t k = 0; k < n; ++k) v |= byte(k) << (8 * k);
      return v;
    }
    if (n == 0) return 0;
    return byte(0) | byte(n / 2) << (8 * (n / 2)) | byte(n - 1) << (8 * (n - 1));
  }
  // Asks the cache for the slot where a lookup of an id of this hash starts.
  void Prefetch(std::uint32_t hash) const {
    __builtin_prefetch(&slots_[hash & (slots_.size() - 1)]);
  }
  // The index of `id` (whose Hash is `hash`), added if new.
  std::int32_t Intern(std::string_view id, std::uint32_t hash) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = hash & mask;
    while (slots_[i].index >= 0) {
      if (slots_[i].hash == hash && Name(slots_[i].index) == id) return slots_[i].index;
      i = (i + 1) & mask;
    }
    return Add(id, hash, i);
  }
  std::size_t size() const { return ends_.size(); }
  // Room for `ids` ids of `chars` characters in all, taken once (a hint: a table that grows by
  // doubling copies itself into fresh memory, and every fresh page costs a page fault).
  void Reserve(std::size_t ids, std::size_t chars) {
    ends_.reserve(ids);
    arena_.reserve(chars);
  }
  std::string_view Name(std::int32_t index) const {
    const auto k = static_cast<std::size_t>(index);
    const std::size_t begin = k == 0 ? 0 : ends_[k - 1];
    return std::string_view(arena_).substr(begin, ends_[k] - begin);
  }

 private:
  struct Slot {
    std::uint32_t hash = 0;
    std::int32_t index = -1;  // -1: empty
  };
  // A new id into the empty slot i (out of line: the lookup above stays small where inlined).
  [[gnu::noinline]] std::int32_t Add(std::string_view id, std::uint32_t hash, std::size_t i) {
    const auto index = static_cast<std::int32_t>(ends_.size());
    arena_.append(id);
    ends_.push_back(static_cast<std::uint32_t>(arena_.size()));  // the file is below 2^31 bytes
    slots_[i] = {hash, index};
    if (2 * ends_.size() > slots_.size()) Grow();
    return index;
  }
  void Grow() {
    std::vector<Slot, HugePageAllocator<Slot>> slots(2 * slots_.size());
    const std::size_t mask = slots.size() - 1;
    for (const Slot& s : slots_) {
      if (s.index < 0) continue;
      std::size_t i = s.hash & mask;
      while (slots[i].index >= 0) i = (i + 1) & mask;
      slots[i] = s;
    }
    slots_.swap(slots);
  }

  // Large for long traces (tens of MB), hence on huge pages where the kernel allows.
  std::basic_string<char, std::char_traits<char>, HugePageAllocator<char>> arena_;  // every id,
                                                                                      // back to back
  std::vector<std::uint32_t, HugePageAllocator<std::uint32_t>> ends_;  // end of id k in arena_
  std::vector<Slot, HugePageAllocator<Slot>> slots_;
};

// Reads the CSV grammar line by line and hands each operation to `on_record` (a callable
// taking a const TraceRecord&) as it is read: nothing but the interned ids is kept. The text may
// come in pieces (Feed once per piece, each ending at a line end except the file's last). Throws
// InputError "<file_name>:<line>: <what was wrong>" for a malformed line.
class CsvLines {
 public:
  CsvLines(std::string_view file_name, IdInterner& interner)
      : file_name_(file_name), interner_(interner) {}

  // Lines are parsed a batch ahead and the table slots of their ids prefetched, so that the
  // cache misses of a large id table overlap; ids are then interned and the operations handed
  // on in line order, and a malformed line is reported only after the lines before it.
  template <class OnRecord>
  void Feed(std::string_view text, OnRecord&& on_record) {
    if (first_piece_ && text.substr(0, 3) == "\xEF\xBB\xBF") {
      text.remove_prefix(3);  // UTF-8 byte-order mark
    }
    first_piece_ = false;
    constexpr int kBatch = 16;
    Parsed batch[kBatch];
    std::size_t pos = 0;
    while (pos < text.size()) {
      int n = 0;
      std::optional<InputError> error;
      while (n < kBatch && pos < text.size()) {
        std::size_t eol = 0;
        if (FastParse(text, pos, batch[n], eol)) {
          pos = eol + 1;
          interner_.Prefetch(batch[n].hash);
          ++n;
          continue;
        }
        eol = text.find('\n', pos);
        if (eol == std::string_view::npos) eol = text.size();
        const std::string_view line = text.substr(pos, eol - pos);
        pos = eol + 1;
        try {
          if (!Parse(line, batch[n])) continue;
        } catch (const InputError& e) {
          error = e;
          pos = text.size();
          break;
        }
        if (batch[n].uses_id) interner_.Prefetch(batch[n].hash);
        ++n;
      }
      for (int k = 0; k < n; ++k) {
        Parsed& p = batch[k];
        if (p.uses_id) {
          // ids index as int32 (TraceRecord::id); a file this large is refused, not wrapped.
          if (interner_.size() == static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
            throw InputError(fmt::format("{}:{}: more than 2^31 - 1 distinct ids", file_name_,
                                         p.record.line));
          }
          p.record.id = interner_.Intern(p.id, p.hash);
        }
        on_record(p.record);
      }
      if (error) throw *error;
    }
  }

  // The lines read so far (blank lines and comments too).
  std::int32_t lines_read() const { return line_no_; }

 private:
  // One line's operation, its id not interned yet.
  struct Parsed {
    TraceRecord record;
    std::string_view id;
    std::uint32_t hash = 0;
    bool uses_id = false;
  };

  InputError Fail(const std::string& what) const {
    return InputError(fmt::format("{}:{}: {}", file_name_, line_no_, what));
  }

  // Reads plain decimal digits from `c` on, accumulating them into `value` (modulo 2^64: the
  // caller bounds the count); returns the first character that is not a digit.
  static const char* Digits(const char* c, const char* end, std::uint64_t& value) {
    std::uint64_t v = 0;
    for (; c != end; ++c) {
      const auto d = static_cast<unsigned>(static_cast<unsigned char>(*c)) - unsigned{'0'};
      if (d > 9) break;
      v = 10 * v + d;
    }
    value = v;
    return c;
  }

  // Where the id that starts at c ends for FastParse: at the first ',' or byte below 0x21
  // (blank, '\t', '\r', '\n' and other control characters: FastParse then declines the line,
  // which is not of its form, and Parse reads it), or at end. 8 bytes at a time where 8 remain:
  // (x - 0x01..01 * n) & ~x & 0x80..80 marks the lowest byte of x below n exactly (marks above
  // it may be false, and only the lowest is used); a ',' is a zero byte of x ^ ",,,,,,,,".
  static const char* IdEnd(const char* c, const char* end) {
    if constexpr (std::endian::native == std::endian::little) {
      constexpr std::uint64_t kOnes = 0x0101010101010101ULL;
      constexpr std::uint64_t kHigh = 0x8080808080808080ULL;
      auto below = [](std::uint64_t x, unsigned char n) { return (x - kOnes * n) & ~x & kHigh; };
      while (end - c >= 8) {
        std::uint64_t w;
        std::memcpy(&w, c, 8);
        const std::uint64_t m = below(w ^ (kOnes * ','), 1) | below(w, 0x21);
        if (m != 0) return c + std::countr_zero(m) / 8;
        c += 8;
      }
    }
    while (c != end && *c != ',' && static_cast<unsigned char>(*c) >= 0x21) ++c;
    return c;
  }

  // The common line, read in one pass from text[pos]: `malloc,ID,BYTES,STREAM` or
  // `free,ID,BYTES,STREAM`, the id without ',' or a byte below 0x21 (blank, control), bytes
  // (below 10^18) and stream (below 10^9) plain digits or empty, bytes given for malloc. Such a line yields exactly what
  // Parse yields for it and `eol` is its end; for any other line nothing changes and Parse reads
  // it (and reports what is wrong with it).
  bool FastParse(std::string_view text, std::size_t pos, Parsed& out, std::size_t& eol) {
    if (line_no_ == std::numeric_limits<std::int32_t>::max()) return false;
    const char* c = text.data() + pos;
    const char* const end = text.data() + text.size();
    auto starts_with = [&c, end](std::string_view word) {
      return static_cast<std::size_t>(end - c) >= word.size() &&
             std::memcmp(c, word.data(), word.size()) == 0;
    };
    TraceRecord r;
    if (starts_with("malloc,")) {
      r.op = TraceOp::kMalloc;
      c += 7;
    } else if (starts_with("free,")) {
      r.op = TraceOp::kFree;
      c += 5;
    } else {
      return false;
    }
    const char* const id_begin = c;
    c = IdEnd(c, end);
    if (c == end || *c != ',' || c == id_begin) return false;
    const std::string_view id(id_begin, static_cast<std::size_t>(c - id_begin));
    constexpr std::ptrdiff_t kBytesDigits = 18;  // < 10^18 < 2^63
    constexpr std::ptrdiff_t kStreamDigits = 9;  // < 10^9 < 2^31
    const char* const bytes_begin = ++c;
    std::uint64_t value = 0;
    c = Digits(c, end, value);
    if (c == end || *c != ',' || c - bytes_begin > kBytesDigits) return false;
    if (c == bytes_begin && r.op == TraceOp::kMalloc) return false;  // malloc needs bytes
    r.bytes = static_cast<std::int64_t>(value);
    const char* const stream_begin = ++c;
    c = Digits(c, end, value);
    if ((c != end && *c != '\n') || c - stream_begin > kStreamDigits) return false;
    r.stream = static_cast<alloc::StreamId>(value);
    header_allowed_ = false;
    r.line = ++line_no_;
    out.record = r;
    out.uses_id = true;
    out.id = id;
    out.hash = IdInterner::Hash(id);
    eol = static_cast<std::size_t>(c - text.data());
    return true;
  }

  // Reads one line into `out`; false for a blank line, a comment or the header.
  bool Parse(std::string_view line, Parsed& out) {
    auto fail = [this](const std::string& what) { return Fail(what); };
    std::int32_t& line_no = line_no_;
    bool& header_allowed = header_allowed_;
    if (line_no == std::numeric_limits<std::int32_t>::max()) {
      throw fail("more than 2^31 - 1 lines");
    }
    ++line_no;
    const std::string_view trimmed = Trim(line);
    if (trimmed.empty() || trimmed.front() == '#') return false;
    const bool is_first = header_allowed;
    header_allowed = false;
    if (is_first) {
      if (std::optional<std::string> what = TimelineHeader(trimmed)) throw fail(*what);
    }
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
      return false;  // header
    }
    TraceRecord& r = out.record;
    r = TraceRecord{};
    r.line = line_no;
    const std::string_view op = fields[0];
    if (!OpNamed(op, r.op)) {
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
    out.uses_id = uses_id;
    if (uses_id) {
      if (fields[1].empty()) throw fail(fmt::format("{} needs an id", op));
      out.id = fields[1];
      out.hash = IdInterner::Hash(out.id);
    }
    if (r.op == TraceOp::kMalloc && fields[2].empty()) throw fail("malloc needs bytes");
    if (std::string m = MisplacedStreamMessage(r.op, fields); !m.empty()) throw fail(m);
    return true;
  }

  std::string_view file_name_;
  IdInterner& interner_;
  std::int32_t line_no_ = 0;
  bool header_allowed_ = true;  // until the first line that is not blank or a comment
  bool first_piece_ = true;
};

// Applies operations to an allocator one at a time, checking the id rules of
// docs/interfaces.md; `name` gives an id's text for messages. `Alloc` holds the state per id:
// HugePageAllocator for a CSV replay, which reserves it once from the file's size; the plain
// allocator for a Trace replayed repeatedly (alloc_bench), where freed heap memory is reused.
template <class IdName, template <class> class Alloc = std::allocator>
class Replayer {
 public:
  Replayer(std::string_view file_name, std::string_view location_word, IdName name,
           alloc::Allocator& allocator, ReplayRowSink* rows)
      : file_name_(file_name),
        location_word_(location_word),
        name_(name),
        allocator_(allocator),
        rows_(rows) {}

  void Apply(const TraceRecord& r) {
    switch (r.op) {
      case TraceOp::kMalloc: Malloc(r); break;
      case TraceOp::kFree:
      case TraceOp::kRecordStream: FreeOrRecord(r); break;
      case TraceOp::kComplete: allocator_.CompleteStream(r.stream); break;
      case TraceOp::kEmptyCache: allocator_.EmptyCache(); break;
    }
    ++result_.operations;
    if (rows_ != nullptr) {
      const alloc::AllocatorStats& s = allocator_.Stats();
      rows_->OnRow({r.op, s.allocated_bytes.current, s.reserved_bytes.current,
                    s.active_bytes.current});
    }
  }

  // Room for the state of `ids` ids, taken once (see IdInterner::Reserve).
  void Reserve(std::size_t ids) { ids_.reserve(ids); }

  ReplayResult Finish() {
    result_.stats = allocator_.Stats();
    return std::move(result_);
  }

 private:
  enum class IdState : std::uint8_t { kNeverSeen, kLive, kFreed, kNoop };
  struct IdInfo {  // 12 bytes: one per distinct id
    std::int32_t line = 0;      // line of the last malloc / free
    std::uint32_t handle = 0;   // alloc::BlockHandle: at most one per malloc, below 2^32
    IdState state = IdState::kNeverSeen;
  };

  IdInfo& Info(std::int32_t id) {
    const auto k = static_cast<std::size_t>(id);
    if (k >= ids_.size()) ids_.resize(std::max(k + 1, 2 * ids_.size()));
    return ids_[k];
  }
  const char* Where() const { return location_word_.empty() ? "line" : "entry"; }
  InputError Fail(const TraceRecord& r, const std::string& what) const {
    return InputError(fmt::format("{}:{}{}: {}", file_name_, location_word_, r.line, what));
  }

  void Malloc(const TraceRecord& r) {
    IdInfo& info = Info(r.id);
    if (info.state == IdState::kLive) {
      throw Fail(r, fmt::format("malloc of id '{}' that is still allocated (since {} {})",
                                EchoField(name_(r.id)), Where(), info.line));
    }
    info.line = r.line;
    // malloc of 0 bytes does nothing, as allocate(0); Malloc refuses >= 2^60 up front.
    std::optional<alloc::BlockHandle> h;
    if (r.bytes > 0) h = allocator_.Malloc(r.bytes, r.stream);
    if (r.bytes >= alloc::kMaxRequest && result_.refused_mallocs++ == 0) {
      result_.first_refused_line = r.line;
    }
    if (h) {
      MEMSIM_CHECK(*h <= std::numeric_limits<std::uint32_t>::max());
      info.state = IdState::kLive;
      info.handle = static_cast<std::uint32_t>(*h);
    } else {
      info.state = IdState::kNoop;
    }
  }

  void FreeOrRecord(const TraceRecord& r) {
    IdInfo& info = Info(r.id);
    const char* what = r.op == TraceOp::kFree ? "free" : "record_stream";
    if (info.state == IdState::kNeverSeen) {
      throw Fail(r, fmt::format("{} of id '{}' that was never allocated", what,
                                EchoField(name_(r.id))));
    }
    if (info.state == IdState::kFreed) {
      throw Fail(r, fmt::format("{} of id '{}' that is not allocated (freed at {} {})", what,
                                EchoField(name_(r.id)), Where(), info.line));
    }
    if (info.state == IdState::kNoop) return;  // failed or zero-byte malloc
    if (r.op == TraceOp::kFree) {
      allocator_.Free(info.handle);
      info.state = IdState::kFreed;
      info.line = r.line;
    } else {
      allocator_.RecordStream(info.handle, r.stream);
    }
  }

  std::string_view file_name_;
  std::string_view location_word_;
  IdName name_;
  alloc::Allocator& allocator_;
  ReplayRowSink* rows_;
  std::vector<IdInfo, Alloc<IdInfo>> ids_;
  ReplayResult result_;
};

// A trace is text (CSV or JSON) or a pickle (told apart before this). A NUL byte among the
// first kSniffBytes bytes means binary data (an image, an archive, /dev/zero, UTF-16 text), which
// is refused at once rather than read as one endless line. "<file>:<line>: ...".
void CheckNotBinary(std::string_view text, std::string_view file_name) {
  constexpr std::size_t kSniffBytes = 4096;
  const std::string_view head = text.substr(0, kSniffBytes);
  const std::size_t nul = head.find('\0');
  if (nul == std::string_view::npos) return;
  const auto line = 1 + std::count(head.begin(), head.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
  const std::string_view what =
      head.starts_with("\x1f\x8b")                                  ? "gzip data (decompress it first)"
      : head.starts_with("\xff\xfe") || head.starts_with("\xfe\xff") ? "UTF-16 text (save it as UTF-8)"
                                                                     : "binary data";
  throw InputError(fmt::format("{}:{}: {}: a NUL byte at byte {}, not an allocator trace; replay "
                               "reads lines op,id,bytes,stream or a PyTorch memory snapshot "
                               "(docs/interfaces.md, 'Allocator traces')",
                               file_name, line, what, nul));
}

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
  IdInterner interner;
  CsvLines(file_name, interner).Feed(text, [&trace](const TraceRecord& r) {
    trace.records.push_back(r);
  });
  trace.ids.reserve(interner.size());
  for (std::size_t k = 0; k < interner.size(); ++k) {
    trace.ids.emplace_back(interner.Name(static_cast<std::int32_t>(k)));
  }
  return trace;
}

bool IsCsvTrace(std::string_view text, std::string_view file_name) {
  if (LooksLikePickle(text)) return false;
  if (!text.empty() && static_cast<unsigned char>(text[0]) == 0x80) {
    throw InputError(fmt::format("{}: a pickle of protocol {}; memsim reads pickled snapshots of "
                                 "protocols 2 to 5",
                                 file_name, text.size() > 1 ? static_cast<unsigned char>(text[1]) : 0));
  }
  CheckNotBinary(text, file_name);
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    return c != '{' && c != '[';
  }
  return true;
}

Trace ParseTrace(std::string_view text, std::string_view file_name, int device_index) {
  if (!IsCsvTrace(text, file_name)) return ParseSnapshot(text, file_name, device_index);
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
  auto name = [&trace](std::int32_t id) -> std::string_view { return trace.ids[id]; };
  Replayer<decltype(name)> replayer(trace.file_name, trace.location_word, name, allocator, rows);
  for (const TraceRecord& r : trace.records) replayer.Apply(r);
  ReplayResult result = replayer.Finish();
  result.location_word = trace.location_word;
  result.snapshot = trace.snapshot;
  return result;
}

// The CSV reader and a Replayer fed by it; ids are named by the interner.
struct CsvReplay::State {
  struct Names {
    const IdInterner* interner;
    std::string_view operator()(std::int32_t id) const { return interner->Name(id); }
  };
  State(std::string_view file_name, alloc::Allocator& allocator, ReplayRowSink* rows)
      : name(file_name),
        lines(name, interner),
        replayer(name, "", Names{&interner}, allocator, rows) {}
  std::string name;
  IdInterner interner;
  CsvLines lines;
  Replayer<Names, HugePageAllocator> replayer;
};

CsvReplay::CsvReplay(std::string_view file_name, alloc::Allocator& allocator,
                     ReplayRowSink* rows)
    : state_(std::make_unique<State>(file_name, allocator, rows)) {}

CsvReplay::~CsvReplay() = default;

void CsvReplay::ReserveFor(std::size_t file_bytes) {
  // Estimates, not limits (a guess: only memory use depends on them, never a result): a line
  // that brings a new id takes at least about 16 bytes ("malloc,ID,BYTES,S" and the line end;
  // the benchmark trace of alloc_bench --write-csv takes 41 bytes per id), and ids take at most
  // half of the text. Capped so that a large file reserves no more than about 0.5 GB of address
  // space; past an estimate the tables grow as before.
  constexpr std::size_t kMaxIds = std::size_t{1} << 24;
  constexpr std::size_t kMaxChars = std::size_t{1} << 28;
  const std::size_t ids = std::min(file_bytes / 16, kMaxIds);
  state_->interner.Reserve(ids, std::min(file_bytes / 2, kMaxChars));
  state_->replayer.Reserve(ids);
}

void CsvReplay::Feed(std::string_view lines) {
  Replayer<State::Names, HugePageAllocator>& replayer = state_->replayer;
  state_->lines.Feed(lines, [&replayer](const TraceRecord& r) { replayer.Apply(r); });
}

ReplayResult CsvReplay::Finish() { return state_->replayer.Finish(); }

std::int64_t CsvReplay::next_line() const { return std::int64_t{state_->lines.lines_read()} + 1; }

ReplayResult ReplayTraceText(std::string_view text, std::string_view file_name,
                             int device_index, alloc::Allocator& allocator,
                             ReplayRowSink* rows) {
  if (!IsCsvTrace(text, file_name)) {
    return Replay(ParseTrace(text, file_name, device_index), allocator, rows);
  }
  CsvReplay replay(file_name, allocator, rows);
  replay.Feed(text);
  return replay.Finish();
}

}  // namespace memsim::replay
