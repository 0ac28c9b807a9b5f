// `memsim replay TRACE`: replays an allocator trace (CSV or PyTorch snapshot JSON) through the
// caching-allocator model and prints the final and peak stats (docs/interfaces.md, 'Allocator
// traces').
#include <fmt/core.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "alloc/allocator.h"
#include "alloc/stats.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/huge_page_allocator.h"
#include "replay/snapshot.h"
#include "replay/trace.h"
#include "report/format.h"

namespace memsim::cli {
namespace {

struct ReplayArgs {
  std::string trace;
  std::string backend = "cuda";
  std::string capacity;
  std::string alloc_conf;
  int device_index = -1;  // -1: not given (device 0 of a snapshot)
  std::string json;
  std::string csv;
};

// Traces must be below 2^31 bytes (estimate of a sane bound: a snapshot of the 100k-entry ring
// buffer is tens of MB). It keeps line numbers, ids and entry indices inside int32, and stops a
// read of an endless file such as /dev/zero instead of hanging until memory runs out.
constexpr std::size_t kMaxTraceBytes = std::size_t{1} << 31;

// A CSV line is short (an op, an id, two integers); one of more than 2^20 bytes (1 MiB, an
// estimate far above any real id) without a line end is refused when seen instead of being
// buffered up to kMaxTraceBytes (an endless stream such as `yes | tr -d '\n'`).
constexpr std::size_t kMaxCsvLineBytes = std::size_t{1} << 20;

// The text read from a trace: on huge pages where the kernel allows, since a snapshot is read
// whole (tens of MB) and every 4 KiB page would cost a page fault (core/huge_page_allocator.h).
using TraceText = std::basic_string<char, std::char_traits<char>, HugePageAllocator<char>>;

// A trace file read in blocks (no per-line allocation; a pipe or device works too).
class TraceFile {
 public:
  explicit TraceFile(const std::string& path) : path_(path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      throw InputError(fmt::format("cannot read trace '{}': it is a directory", path));
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) Fail(errno);
    if (Size() >= kMaxTraceBytes) {  // refused before a byte is read
      ::close(fd_);
      TooLarge();
    }
  }
  ~TraceFile() { ::close(fd_); }
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  // The size of a regular file in bytes; 0 for a pipe or device.
  std::size_t Size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    return static_cast<std::size_t>(st.st_size);
  }
  bool IsRegular() const {
    struct stat st {};
    return ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
  }

  // Appends the next block (up to 4 MiB) to `buffer`; returns true at the end of the file.
  bool ReadMore(TraceText& buffer) {
    constexpr std::size_t kBlock = std::size_t{4} << 20;
    const std::size_t at = buffer.size();
    buffer.resize(at + kBlock);
    ::ssize_t n;
    do {
      n = ::read(fd_, buffer.data() + at, kBlock);
    } while (n < 0 && errno == EINTR);
    if (n < 0) Fail(errno);
    buffer.resize(at + static_cast<std::size_t>(n));
    total_ += static_cast<std::size_t>(n);
    if (total_ >= kMaxTraceBytes) TooLarge();
    return n == 0;
  }

 private:
  [[noreturn]] void TooLarge() const {
    throw InputError(fmt::format(
        "cannot read trace '{}': 2 GiB or larger (the limit is 2^31 bytes)", path_));
  }
  [[noreturn]] void Fail(int err) const {
    throw InputError(fmt::format("cannot read trace '{}': {}", path_, std::strerror(err)));
  }

  std::string path_;
  int fd_ = -1;
  std::size_t total_ = 0;
};

// Reads the rest of a snapshot into `buffer` (`eof`: already at the end). A pipe or device
// (whose size is not known in advance) is checked as it grows, at 4 MiB and every 4x more: the
// reading stops once the bytes so far already hold the error the whole would give (an endless
// or garbage stream, refused at its first bad byte instead of at the 2 GiB limit) or a whole
// pickle. A regular file is read whole (its size was checked when opened).
void ReadSnapshotRest(TraceFile& file, TraceText& buffer, bool eof) {
  const bool check = !file.IsRegular();
  std::size_t next_check = std::size_t{4} << 20;
  while (!eof) {
    eof = file.ReadMore(buffer);
    if (check && !eof && buffer.size() >= next_check) {
      if (!replay::SnapshotNeedsMoreBytes(buffer)) return;
      next_check = buffer.size() * 4;
    }
  }
}

// Replays the trace file. A CSV trace is parsed and replayed block by block
// (replay::CsvReplay): neither its text nor its records are held, only a block and the ids. A
// snapshot (told by its first non-blank character or pickle header) is read whole first.
replay::ReplayResult ReplayFile(TraceFile& file, const ReplayArgs& args,
                                alloc::Allocator& allocator, replay::ReplayRowSink* rows) {
  TraceText buffer;
  bool eof = file.ReadMore(buffer);
  // Leading blanks: only the bytes read since are scanned (scanning the whole buffer after each
  // read of a pipe made an endless stream of blank lines quadratic: a hang).
  std::size_t scanned = 0;
  while (!eof && buffer.find_first_not_of(" \t\r\n", scanned) == std::string::npos) {
    if (buffer.size() > kMaxCsvLineBytes) {
      throw InputError(fmt::format("{}: only blanks in the first {} bytes: not a trace (expected "
                                   "lines op,id,bytes,stream or a PyTorch memory snapshot)",
                                   args.trace, kMaxCsvLineBytes));
    }
    scanned = buffer.size();
    eof = file.ReadMore(buffer);
  }
  if (!replay::IsCsvTrace(buffer, args.trace)) {
    ReadSnapshotRest(file, buffer, eof);
    return replay::ReplayTraceText(buffer, args.trace, std::max(args.device_index, 0), allocator,
                                   rows);
  }
  if (args.device_index >= 0) {  // it picks nothing here: said rather than ignored
    throw InputError(fmt::format("--device-index {}: applies to a snapshot (its device_traces); "
                                 "{} is a CSV trace of one allocator",
                                 args.device_index, args.trace));
  }
  replay::CsvReplay csv(args.trace, allocator, rows);
  csv.ReserveFor(file.Size());
  while (!eof) {
    // Whole lines go to the replay; a line cut by the block waits for the next one.
    const std::size_t end = buffer.rfind('\n');
    if (end != std::string::npos) {
      csv.Feed(std::string_view(buffer).substr(0, end + 1));
      buffer.erase(0, end + 1);
    } else if (buffer.size() > kMaxCsvLineBytes) {
      throw InputError(fmt::format("{}:{}: no line end in the first {} bytes of the line: not a "
                                   "CSV trace (expected lines op,id,bytes,stream; "
                                   "docs/interfaces.md, 'Allocator traces')",
                                   args.trace, csv.next_line(), kMaxCsvLineBytes));
    }
    eof = file.ReadMore(buffer);
  }
  csv.Feed(buffer);
  return csv.Finish();
}

std::int64_t StatValue(const alloc::StatInfo& s, const alloc::AllocatorStats& stats, bool peak) {
  if (s.kind == alloc::StatKind::kCounter) return stats.*(s.counter);
  const alloc::Gauge& g = stats.*(s.gauge);
  return peak ? g.peak : g.current;
}

std::string JsonStats(const alloc::AllocatorStats& stats, bool peak) {
  std::string out = "{";
  bool first = true;
  for (const alloc::StatInfo& s : alloc::kStatTable) {
    if (!s.in_replay_json) continue;
    out += fmt::format("{}\"{}\": {}", first ? "" : ", ", s.name, StatValue(s, stats, peak));
    first = false;
  }
  return out + "}";
}

// The --csv timeline, one row per operation counted from 1, written as the replay goes.
class CsvRows final : public replay::ReplayRowSink {
 public:
  explicit CsvRows(const std::string& path)
      : file_(path), buffer_("op_index,op,allocated_bytes,reserved_bytes,active_bytes\n") {}
  void OnRow(const replay::ReplayRow& r) override {
    // At most 19 + 13 + 3 × 20 + 5 characters, written into a fixed array with std::to_chars
    // (the decimal text fmt's "{}" gives an integer, at a fraction of a format string's cost).
    char row[128];
    char* p = row;
    char* const end = row + sizeof(row);
    auto number = [&p, end](std::int64_t v, char after) {
      p = std::to_chars(p, end - 1, v).ptr;  // room for `after` whatever happens
      *p++ = after;
    };
    number(++index_, ',');
    const std::string_view op = replay::TraceOpName(r.op);
    std::memcpy(p, op.data(), op.size());
    p += op.size();
    *p++ = ',';
    number(r.allocated_bytes, ',');
    number(r.reserved_bytes, ',');
    number(r.active_bytes, '\n');
    buffer_.append(row, p);
    if (buffer_.size() >= (std::size_t{1} << 16)) {
      file_.Append(buffer_);
      buffer_.clear();
    }
  }
  report::StreamedFile& file() {
    file_.Append(buffer_);
    buffer_.clear();
    return file_;
  }

 private:
  report::StreamedFile file_;
  std::string buffer_;
  std::int64_t index_ = 0;
};

// Why a trace gave no operation: a CSV with no op lines, or a snapshot without allocator history
// (a bare list of segments, or a dict whose device_traces list is empty or absent).
std::string NothingToReplay(const std::string& trace, const replay::ReplayResult& result) {
  constexpr const char* kRecord =
      "record one with torch.cuda.memory._record_memory_history() and save "
      "torch.cuda.memory._snapshot()";
  if (!result.snapshot) {
    return fmt::format("{}: nothing to replay: no operations, expected lines op,id,bytes,stream "
                       "or a snapshot with device_traces entries",
                       trace);
  }
  if (result.snapshot->segment_list) {
    return fmt::format("{}: nothing to replay: a list of segments (torch.cuda.memory_snapshot(): "
                       "the allocator's state at one moment, no history of allocations); {}",
                       trace, kRecord);
  }
  return fmt::format("{}: nothing to replay: a memory snapshot with no allocator events (no "
                     "device_traces entries for the device); {}",
                     trace, kRecord);
}

int RunReplay(const ReplayArgs& args) {
  const alloc::Backend backend =
      args.backend == "npu" ? alloc::Backend::kNpu : alloc::Backend::kCuda;
  alloc::AllocatorOptions options = alloc::ParseAllocConf(args.alloc_conf, backend);
  if (!args.capacity.empty()) options.capacity_bytes = ParseSizeArg(args.capacity, "--capacity");
  alloc::ValidateOptions(options);
  if (!args.json.empty() && args.json == args.csv) {
    throw InputError(fmt::format("--json and --csv name the same file '{}'", args.json));
  }
  report::CheckOutputs({args.json, args.csv}, {args.trace});
  TraceFile file(args.trace);  // opened first: an unreadable trace is reported before outputs
  auto allocator = alloc::NewCachingAllocator(options);
  std::unique_ptr<CsvRows> csv;
  if (!args.csv.empty()) csv = std::make_unique<CsvRows>(args.csv);
  // Parsed and replayed in one pass (CSV); the --csv rows go to a temporary file as they come.
  const replay::ReplayResult result = ReplayFile(file, args, *allocator, csv.get());
  if (result.operations == 0) throw InputError(NothingToReplay(args.trace, result));
  const alloc::AllocatorStats& stats = result.stats;

  std::string out = fmt::format("memsim replay: {} operations from {} ({} backend)\n",
                                result.operations, args.trace, alloc::BackendName(backend));
  out += fmt::format("{:<22} {:>16} {:>16}\n", "stat", "final", "peak");
  for (const alloc::StatInfo& s : alloc::kStatTable) {
    if (s.kind == alloc::StatKind::kGauge) {
      out += fmt::format("{:<22} {:>16} {:>16}\n", s.name, StatValue(s, stats, false),
                         StatValue(s, stats, true));
    } else {
      out += fmt::format("{:<22} {:>16}\n", s.name, StatValue(s, stats, false));
    }
  }
  if (result.refused_mallocs > 0) {
    // As NativeCachingAllocator::allocate, these fail before the allocator: no stats change.
    out += fmt::format(
        "note: {} malloc(s) of 2^60 bytes or more refused before the allocator, as PyTorch "
        "does (first at {}:{}{}); they change no stat\n",
        result.refused_mallocs, args.trace, result.location_word, result.first_refused_line);
  }
  std::string fidelity_json;
  if (result.snapshot) {
    const auto& f = *result.snapshot;
    const bool match = f.segment_allocs == stats.num_device_alloc &&
                       f.reserved_end_bytes == stats.reserved_bytes.current;
    out += fmt::format(
        "fidelity: segment allocations (segment_alloc + segment_map) snapshot {} replay {}; "
        "reserved at end snapshot {} replay {}; {}; {} of {} entries skipped (block never seen "
        "allocated)\n",
        f.segment_allocs, stats.num_device_alloc, f.reserved_end_bytes,
        stats.reserved_bytes.current, match ? "match" : "MISMATCH", f.skipped, f.entries);
    fidelity_json = fmt::format(
        ", \"fidelity\": {{\"snapshot_segment_allocs\": {}, \"replay_segment_allocs\": {}, "
        "\"snapshot_segment_frees\": {}, \"replay_segment_frees\": {}, "
        "\"snapshot_reserved_end_bytes\": {}, \"replay_reserved_end_bytes\": {}, "
        "\"skipped_entries\": {}, \"match\": {}}}",
        f.segment_allocs, stats.num_device_alloc, f.segment_frees, stats.num_device_free,
        f.reserved_end_bytes, stats.reserved_bytes.current, f.skipped, match ? "true" : "false");
  }
  // All outputs are rendered first and written all or nothing (an unwritable --csv must not
  // leave a fresh --json behind).
  std::vector<std::pair<std::string, std::string>> outputs;
  if (!args.json.empty()) {
    outputs.push_back(
        {args.json,
         fmt::format("{{\"schema_version\": 1, \"memsim_version\": \"{}\", \"backend\": \"{}\", "
                     "\"operations\": {}, \"final\": {}, \"peak\": {}{}}}\n",
                     MEMSIM_VERSION, alloc::BackendName(backend), result.operations,
                     JsonStats(stats, false), JsonStats(stats, true), fidelity_json)});
  }
  std::vector<report::StreamedFile*> streamed;
  if (csv) streamed.push_back(&csv->file());
  report::WriteFilesAtomically(outputs, streamed);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

Action AddReplayCommand(CLI::App& sub) {
  auto args = std::make_shared<ReplayArgs>();
  sub.add_option("TRACE", args->trace,
                 "allocator trace: CSV op,id,bytes,stream or a PyTorch "
                 "memory snapshot (JSON)")
      ->required()
      ->check(NonEmpty);
  sub.add_option("--backend", args->backend, "allocator flavour: cuda (default) or npu")
      ->check(CLI::IsMember({"cuda", "npu"}));
  sub.add_option("--capacity", args->capacity,
                 "device capacity for the allocator, e.g. 80GiB (default: unbounded)");
  sub.add_option("--alloc-conf", args->alloc_conf,
                 "allocator options in PYTORCH_CUDA_ALLOC_CONF syntax, \"k:v,...\"");
  sub.add_option("--device-index", args->device_index,
                 "device whose device_traces a snapshot replays (default 0)")
      ->check(NonNegativeInt);
  sub.add_option("--json", args->json, "write the final and peak stats as JSON")->check(NonEmpty);
  sub.add_option("--csv", args->csv, "write a timeline, one row per operation")->check(NonEmpty);
  return [args]() -> int { return RunReplay(*args); };
}

}  // namespace memsim::cli
