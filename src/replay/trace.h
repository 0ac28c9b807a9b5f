// Allocator traces for `memsim replay` (docs/interfaces.md, 'Allocator traces'): the CSV grammar
// `op,id,bytes,stream`, PyTorch memory snapshots (snapshot.h) turned into the same operations,
// and the replayer that drives an Allocator with them, checking the id rules (a free of an id
// never seen, a malloc of a live id, a second free). No CLI11 here; errors are InputError with
// "<file>:<line>: ..." messages.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "alloc/allocator.h"
#include "core/units.h"

namespace memsim::replay {

enum class TraceOp : std::uint8_t { kMalloc, kFree, kRecordStream, kComplete, kEmptyCache };

std::string_view TraceOpName(TraceOp op);

// One operation. `id` indexes Trace::ids; -1 for complete / empty_cache.
struct TraceRecord {
  TraceOp op = TraceOp::kMalloc;
  std::int32_t id = -1;
  Bytes bytes = 0;
  alloc::StreamId stream = 0;
  std::int32_t line = 0;  // 1-based line in the CSV; entry index in a snapshot
  bool operator==(const TraceRecord&) const = default;
};

struct Trace {
  std::string file_name;             // for messages
  std::string location_word = "";    // "" for CSV (file:line), "entry " for snapshots
  std::vector<std::string> ids;      // interned ids
  std::vector<TraceRecord> records;
  // Snapshot replays only (snapshot.h): what the snapshot itself says, for the fidelity line.
  struct SnapshotFacts {
    std::int64_t segment_allocs = 0;  // segment_alloc + segment_map entries
    std::int64_t segment_frees = 0;   // segment_free + segment_unmap entries
    Bytes reserved_end_bytes = 0;     // sum of the device's segments' total_size
    std::int64_t skipped = 0;         // entries about blocks never seen allocated
    std::int64_t entries = 0;         // trace entries of the device
    // The document is a bare list of segments (torch.cuda.memory_snapshot(): the allocator's
    // state at one moment, no history), not _snapshot()'s dict.
    bool segment_list = false;
  };
  std::optional<SnapshotFacts> snapshot;
};

// A piece of untrusted input for an error message: bytes outside printable ASCII (0x20..0x7e)
// become \xNN, and more than 60 bytes are cut to the first 60 followed by "...".
std::string EchoField(std::string_view field);

// Parses the CSV form. Throws InputError "<file_name>:<line>: <what was wrong>".
Trace ParseCsvTrace(std::string_view text, std::string_view file_name);

// Whether `text` is the CSV form: not a pickle and its first non-blank character neither '{'
// nor '[' (a snapshot). Throws InputError for a pickle of a protocol memsim does not read, and
// "<file>:<line>: binary data: a NUL byte at byte N, ..." for a NUL byte among the first 4096
// bytes of what is not a pickle (binary data, /dev/zero, gzip, UTF-16).
bool IsCsvTrace(std::string_view text, std::string_view file_name);

// CSV or snapshot JSON, told apart by content (IsCsvTrace).
Trace ParseTrace(std::string_view text, std::string_view file_name, int device_index);

// One row of the replay timeline (--csv).
struct ReplayRow {
  TraceOp op;
  Bytes allocated_bytes, reserved_bytes, active_bytes;
};

struct ReplayResult {
  alloc::AllocatorStats stats;   // final; each gauge's .peak is the peak
  std::int64_t operations = 0;
  std::vector<ReplayRow> rows;   // filled iff requested
  // mallocs of 2^60 bytes or more, refused before the allocator as PyTorch does
  // (alloc::kMaxRequest), and the line (or entry) of the first.
  std::int64_t refused_mallocs = 0;
  std::int32_t first_refused_line = 0;
  std::string location_word;  // the replayed Trace's (Trace::location_word)
  std::optional<Trace::SnapshotFacts> snapshot;  // the replayed Trace's (Trace::snapshot)
};

// Receives the row of each operation as Replay goes (the --csv timeline, streamed to its file).
class ReplayRowSink {
 public:
  virtual ~ReplayRowSink() = default;
  virtual void OnRow(const ReplayRow& row) = 0;
};

// Replays `trace` through `allocator`. Throws InputError for the id rules of docs/interfaces.md
// ("<file>:<line>: free of id 'x' that was never allocated", ...). `rows` (nullptr: none) gets
// every operation's row; ReplayResult::rows stays empty.
ReplayResult Replay(const Trace& trace, alloc::Allocator& allocator, ReplayRowSink* rows);
// The same, keeping the rows in ReplayResult::rows when `keep_rows`.
ReplayResult Replay(const Trace& trace, alloc::Allocator& allocator, bool keep_rows);

// A CSV trace parsed and replayed as its text arrives, piece by piece: memory holds the ids and
// the allocator's state, never the text or the records. Errors as ParseCsvTrace and Replay, the
// first in file order (a malformed line or a broken id rule, whichever comes first).
class CsvReplay {
 public:
  CsvReplay(std::string_view file_name, alloc::Allocator& allocator, ReplayRowSink* rows);
  ~CsvReplay();
  CsvReplay(const CsvReplay&) = delete;
  CsvReplay& operator=(const CsvReplay&) = delete;
  // A hint before the first Feed: the file's size in bytes, so that the tables of ids are
  // reserved once instead of regrown (fewer page faults). Changes no result.
  void ReserveFor(std::size_t file_bytes);
  // `lines`: the next piece of the file, ending at a line end ('\n') unless it is the file's
  // last piece.
  void Feed(std::string_view lines);
  ReplayResult Finish();
  // The number of the line the next piece starts with (1-based), for the caller's messages.
  std::int64_t next_line() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// `memsim replay`: a trace's text (CSV or snapshot, as ParseTrace) replayed through `allocator`.
// A CSV trace is parsed and replayed in one pass, its records never held (memory: the ids and
// the allocator's state), so the first error in file order is the one reported, whether a
// malformed line or a broken id rule (ParseCsvTrace + Replay report every malformed line before
// any id rule). A snapshot is parsed whole first (ParseSnapshot), then replayed.
ReplayResult ReplayTraceText(std::string_view text, std::string_view file_name,
                             int device_index, alloc::Allocator& allocator,
                             ReplayRowSink* rows);

}  // namespace memsim::replay
