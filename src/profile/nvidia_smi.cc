// nvidia-smi --query-gpu=timestamp[,index],memory.used[,memory.total] --format=csv[,noheader]
// [,nounits] logs (without a header: HeaderlessColumns) (docs/profile-formats.md, 'nvidia-smi CSV'). Header "timestamp, memory.used
// [MiB], memory.total [MiB]"; a space follows each comma; values "40512 MiB" (or "40512" with
// nounits); one row per GPU per sample; the header may repeat. memory.used is device-wide, so it
// becomes device_bytes. Device of a row: the `index` column, else the position of the row within
// its sample, where a sample is a run of rows whose timestamps lie within 10 ms of the run's first
// row (nvidia-smi queries all GPUs in one pass; adding `index` to the query is advised).
#include <map>

#include <fmt/core.h>

#include "core/error.h"
#include "profile/clock.h"
#include "profile/importers.h"
#include "profile/reader.h"

namespace memsim::profile::internal {
namespace {

constexpr TimeNs kSamePassNs = 10'000'000;

struct Columns {
  int timestamp = -1, index = -1, used = -1;
  size_t count = 0;
  int64_t used_unit = kMiB;  // from the header's "[MiB]"
};

// Bytes from "40512 MiB", "40512", "[N/A]" (nullopt); throws on anything else.
std::optional<int64_t> ParseAmount(const LineReader& in, std::string_view text, int64_t unit) {
  const std::string_view original = Trim(text);
  text = original;
  if (!text.empty() && text.front() == '[') return std::nullopt;  // [N/A], [Not Supported], ...
  if (text.size() > 4 && text.substr(text.size() - 4) == " MiB") {
    text.remove_suffix(4);
    unit = kMiB;
  }
  const auto v = ParseInt(text);
  const std::optional<int64_t> bytes = v && *v >= 0 ? ToBytes(*v, unit) : std::nullopt;
  if (!bytes) {
    in.Fail(fmt::format("memory.used: expected '<integer> MiB' below 2^42 MiB, got '{}'", original));
  }
  return *bytes;
}

// noheader: the columns are those of a query whose order the field count tells (nvidia-smi
// prints the fields in query order): 2 "timestamp, memory.used"; 3 "timestamp, memory.used,
// memory.total"; 4 the query docs/profile-formats.md advises, "timestamp, index, memory.used,
// memory.total". Anything else cannot be told apart: refused, asking for the header.
Columns HeaderlessColumns(const LineReader& in, const std::vector<std::string>& f) {
  if (!ParseWallClock(f[0])) {
    in.Fail(
        "expected the nvidia-smi CSV header 'timestamp, memory.used [MiB], ...' (run "
        "nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv)");
  }
  if (f.size() < 2 || f.size() > 4) {
    in.Fail(fmt::format(
        "expected the nvidia-smi CSV header 'timestamp, memory.used [MiB], ...'; without it "
        "(noheader) only the rows of --query-gpu=timestamp,memory.used[,memory.total] or "
        "timestamp,index,memory.used,memory.total are read, and this row has {} fields: keep "
        "the header (--format=csv)",
        f.size()));
  }
  if (f.size() == 4) return Columns{0, 1, 2, f.size(), kMiB};
  return Columns{0, -1, 1, f.size(), kMiB};
}

// The columns a header row `f` names. Throws InputError when it lacks timestamp or memory.used,
// or gives memory.used in another unit than MiB.
Columns HeaderColumns(const LineReader& in, const std::vector<std::string>& f) {
  Columns c;
  for (size_t i = 0; i < f.size(); ++i) {
    const std::string_view name = f[i];
    if (StartsWith(name, "timestamp")) c.timestamp = static_cast<int>(i);
    if (name == "index" || StartsWith(name, "index ")) c.index = static_cast<int>(i);
    if (StartsWith(name, "memory.used")) {
      c.used = static_cast<int>(i);
      if (name.find("[MiB]") == std::string_view::npos &&
          name.find('[') != std::string_view::npos) {
        in.Fail(fmt::format("expected memory.used in [MiB], got '{}'", name));
      }
    }
  }
  if (c.timestamp < 0) {
    in.Fail("expected a 'timestamp' column (query --query-gpu=timestamp,memory.used,...)");
  }
  if (c.used < 0) {
    in.Fail("expected a column named 'memory.used [MiB]' (query --query-gpu=timestamp,memory.used,...)");
  }
  c.count = f.size();
  return c;
}

// The notes of the timeline `out` of one GPU out of `gpus`: how devices and columns were told
// apart, and the [N/A] values skipped.
void AddNotes(timeline::Timeline& out, size_t gpus, const Columns& cols, bool headerless,
              int unavailable) {
  out.notes.push_back(fmt::format("GPU {} of {}, {} samples{}", out.device_index, gpus,
                                  out.samples.size(),
                                  cols.index < 0 && gpus > 1
                                      ? " (no index column: GPU = row position within a sample)"
                                      : ""));
  if (headerless) {
    out.notes.push_back(cols.index >= 0
                            ? "no header: columns read as timestamp, index, memory.used [MiB], "
                              "memory.total (the query of docs/profile-formats.md)"
                            : fmt::format("no header: columns read as timestamp, memory.used [MiB]{}",
                                          cols.count == 3 ? ", memory.total" : ""));
  }
  if (unavailable > 0) out.notes.push_back(fmt::format("skipped {} [N/A] values", unavailable));
}

}  // namespace

timeline::Timeline LoadNvidiaSmi(const std::string& path, const LoadProfileOptions& options) {
  LineReader in(path);
  Columns cols;
  bool have_columns = false;
  bool headerless = false;
  std::map<int, SeriesBuilder> builders;
  int unavailable = 0;
  TimeNs pass_start = 0;
  int pass_position = 0;
  std::string_view line;
  while (in.Next(&line)) {
    if (Trim(line).empty()) continue;
    std::vector<std::string> f = SplitCsv(line);
    if (line.find("memory.used") != std::string_view::npos) {  // a header, maybe repeated
      cols = HeaderColumns(in, f);
      have_columns = true;
      continue;
    }
    if (!have_columns) {
      cols = HeaderlessColumns(in, f);
      have_columns = true;
      headerless = true;
    }
    if (f.size() != cols.count) {
      in.Fail(fmt::format("expected {} fields as in the header, got {}", cols.count, f.size()));
    }
    auto t = ParseWallClock(f[cols.timestamp]);
    if (!t) {
      in.Fail(fmt::format("timestamp: expected 'YYYY/MM/DD HH:MM:SS.mmm', got '{}'",
                          f[cols.timestamp]));
    }
    int device = 0;
    if (cols.index >= 0) {
      auto v = ParseInt(f[cols.index]);
      if (!v || *v < 0 || *v > 65535) {
        in.Fail(fmt::format("index: expected a GPU index, got '{}'", f[cols.index]));
      }
      device = static_cast<int>(*v);
    } else {
      // Both times are within kMaxAbsTimeNs (ParseWallClock), so the difference cannot overflow.
      if (pass_position == 0 || *t - pass_start > kSamePassNs) {
        pass_start = *t;
        pass_position = 0;
      }
      device = pass_position++;
    }
    auto used = ParseAmount(in, f[cols.used], cols.used_unit);
    if (!used) {
      ++unavailable;
      continue;
    }
    timeline::Sample s;
    s.device_bytes = *used;
    auto [b, inserted] = builders.try_emplace(device, options.max_samples);
    b->second.Add(*t, s);
  }
  if (!have_columns) in.Fail("empty file, expected the nvidia-smi CSV header and samples");
  if (builders.empty()) {
    in.Fail("no memory.used values, expected at least one sample row");
  }
  int device = builders.begin()->first;
  if (options.device_index >= 0) {
    if (!builders.count(options.device_index)) {
      throw InputError(fmt::format("{}: no samples for GPU {} (GPUs in the file: 0-{})", path,
                                   options.device_index, builders.rbegin()->first));
    }
    device = options.device_index;
  }
  timeline::Timeline out = builders.at(device).Finish({}, Format::kNvidiaSmi);
  out.device_index = device;
  AddNotes(out, builders.size(), cols, headerless, unavailable);
  return out;
}

}  // namespace memsim::profile::internal
