// `memsim replay TRACE`: replays an allocator trace (CSV or PyTorch snapshot JSON) through the
// caching-allocator model and prints the final and peak stats (design.md "Allocator traces").
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include "alloc/allocator.h"
#include "alloc/stats.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/size.h"
#include "replay/trace.h"

namespace memsim::cli {
namespace {

struct ReplayArgs {
  std::string trace;
  std::string backend = "cuda";
  std::string capacity;
  std::string alloc_conf;
  int device_index = 0;
  std::string json;
  std::string csv;
};

// Traces must be below 2^31 bytes (estimate of a sane bound: a snapshot of the 100k-entry ring
// buffer is tens of MB). It keeps line numbers, ids and entry indices inside int32, and stops a
// read of an endless file such as /dev/zero instead of hanging until memory runs out.
constexpr std::size_t kMaxTraceBytes = std::size_t{1} << 31;

std::string ReadFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(fmt::format("cannot read trace '{}': it is a directory", path));
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw InputError(fmt::format("cannot read trace '{}': {}", path, std::strerror(errno)));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    out.append(buf, n);
    if (out.size() >= kMaxTraceBytes) {
      std::fclose(f);
      throw InputError(
          fmt::format("cannot read trace '{}': 2 GiB or larger (the limit is 2^31 bytes)", path));
    }
    if (n < sizeof buf) break;
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) {
    throw InputError(fmt::format("cannot read trace '{}': {}", path, std::strerror(err)));
  }
  return out;
}

// One output file of a run: where it goes and its whole content.
struct OutputFile {
  std::string path;
  std::string content;
};

// Writes every file or none: first each content goes to a temporary file created next to its
// target (mkstemp, so concurrent runs do not collide), and only when all of them are written
// are they renamed over their targets. A failure removes the temporaries, and the targets this
// call already renamed (a rename fails only in odd cases, such as the directory vanishing).
// A target that exists and is not a regular file (a directory, /dev/null, a FIFO) is refused
// rather than replaced. Throws InputError "<path>: cannot write: <reason>".
void WriteAllOrNothing(const std::vector<OutputFile>& files) {
  std::vector<std::string> temps;  // temps[i] belongs to files[i]
  auto remove_temps = [&](std::size_t from) {
    for (std::size_t j = from; j < temps.size(); ++j) ::unlink(temps[j].c_str());
  };
  auto fail = [&](const std::string& path, const std::string& reason) {
    remove_temps(0);
    return InputError(fmt::format("{}: cannot write: {}", path, reason));
  };
  const mode_t mask = ::umask(0);
  ::umask(mask);
  for (const OutputFile& f : files) {
    struct stat st;
    if (::stat(f.path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      throw fail(f.path, "not a regular file");
    }
    std::string temp = f.path + ".tmp-memsim-XXXXXX";
    const int fd = ::mkstemp(temp.data());
    if (fd < 0) throw fail(f.path, std::strerror(errno));
    temps.push_back(temp);
    std::size_t done = 0;
    while (done < f.content.size()) {
      const ssize_t n = ::write(fd, f.content.data() + done, f.content.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        ::close(fd);
        throw fail(f.path, std::strerror(err));
      }
      done += static_cast<std::size_t>(n);
    }
    // mkstemp creates 0600; give the file the mode a plain create would.
    const bool ok = ::fchmod(fd, 0666 & ~mask) == 0;
    const int err = errno;
    if (::close(fd) != 0 || !ok) throw fail(f.path, std::strerror(ok ? errno : err));
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (::rename(temps[i].c_str(), files[i].path.c_str()) != 0) {
      const int err = errno;
      for (std::size_t j = 0; j < i; ++j) ::unlink(files[j].path.c_str());
      remove_temps(i);
      throw InputError(fmt::format("{}: cannot write: {}", files[i].path, std::strerror(err)));
    }
  }
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

int RunReplay(const ReplayArgs& args) {
  const alloc::Backend backend =
      args.backend == "npu" ? alloc::Backend::kNpu : alloc::Backend::kCuda;
  alloc::AllocatorOptions options = alloc::ParseAllocConf(args.alloc_conf, backend);
  if (!args.capacity.empty()) options.capacity_bytes = ParseSize(args.capacity, "--capacity");
  alloc::ValidateOptions(options);
  if (args.device_index < 0) throw InputError("--device-index must be >= 0");
  if (!args.json.empty() && args.json == args.csv) {
    throw InputError(fmt::format("--json and --csv name the same file '{}'", args.json));
  }
  const std::string text = ReadFile(args.trace);
  const replay::Trace trace = replay::ParseTrace(text, args.trace, args.device_index);
  auto allocator = alloc::NewCachingAllocator(options);
  const replay::ReplayResult result = replay::Replay(trace, *allocator, !args.csv.empty());
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
  std::string fidelity_json;
  if (trace.snapshot) {
    const auto& f = *trace.snapshot;
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
  std::vector<OutputFile> outputs;
  if (!args.json.empty()) {
    outputs.push_back({args.json,
        fmt::format("{{\"schema_version\": 1, \"memsim_version\": \"{}\", \"backend\": \"{}\", "
                    "\"operations\": {}, \"final\": {}, \"peak\": {}{}}}\n",
                    MEMSIM_VERSION, alloc::BackendName(backend), result.operations,
                    JsonStats(stats, false), JsonStats(stats, true), fidelity_json)});
  }
  if (!args.csv.empty()) {
    std::string csv = "op_index,op,allocated_bytes,reserved_bytes,active_bytes\n";
    csv.reserve(result.rows.size() * 40 + csv.size());
    for (std::size_t i = 0; i < result.rows.size(); ++i) {
      const replay::ReplayRow& r = result.rows[i];
      csv += fmt::format("{},{},{},{},{}\n", i + 1, replay::TraceOpName(r.op), r.allocated_bytes,
                         r.reserved_bytes, r.active_bytes);
    }
    outputs.push_back({args.csv, std::move(csv)});
  }
  WriteAllOrNothing(outputs);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

Action AddReplayCommand(CLI::App& sub) {
  auto args = std::make_shared<ReplayArgs>();
  sub.add_option("TRACE", args->trace, "allocator trace: CSV op,id,bytes,stream or a PyTorch "
                                       "memory snapshot (JSON)")
      ->required();
  sub.add_option("--backend", args->backend, "allocator flavour: cuda (default) or npu")
      ->check(CLI::IsMember({"cuda", "npu"}));
  sub.add_option("--capacity", args->capacity,
                 "device capacity for the allocator, e.g. 80GiB (default: unbounded)");
  sub.add_option("--alloc-conf", args->alloc_conf,
                 "allocator options in PYTORCH_CUDA_ALLOC_CONF syntax, \"k:v,...\"");
  sub.add_option("--device-index", args->device_index,
                 "device whose device_traces a snapshot replays (default 0)");
  sub.add_option("--json", args->json, "write the final and peak stats as JSON");
  sub.add_option("--csv", args->csv, "write a timeline, one row per operation");
  return [args]() -> int { return RunReplay(*args); };
}

}  // namespace memsim::cli
