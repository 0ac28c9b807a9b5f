// torch_npu profiler output (docs/profile-formats.md, 'torch_npu profiler output'; Ascend/pytorch
// torch_npu/profiler/analysis/prof_view/_memory_view_parser.py): memory_record.csv,
// operator_memory.csv, npu_module_mem.csv, or a whole *_ascend_pt folder, whose
// ASCEND_PROFILER_OUTPUT/trace_view.json gives the ProfilerStep#N spans.
// memory_record.csv: PTA rows (the torch_npu caching allocator) give allocated / reserved /
// active; APP rows (process-level device memory from CANN, "Total Reserved(MB)" =
// memory(KB)/1024) give device_bytes; GE, PTA+GE and WORKSPACE rows are counted, not imported
// (memsim models the PyTorch allocator). "MB" = MiB (torch_npu prof_common_func/_constant.py
// B_TO_MB = 1024.0**2). Timestamps are epoch us with 3 decimals and a trailing TAB (trimmed, read
// exactly). Rows are not sorted (_memory_view_parser.py generate_view): the SeriesBuilder sorts
// them in bounded memory (profile.h). operator_memory.csv (used when memory_record.csv is absent):
// each PTA row gives the allocator totals at its allocation and at its release; "cann::" (GE) rows
// are skipped.
#include <algorithm>
#include <array>
#include <map>

#include <fmt/core.h>

#include "core/error.h"
#include "profile/chrome_trace.h"
#include "profile/importers.h"
#include "profile/reader.h"

namespace memsim::profile::internal {
namespace {

bool FileExists(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f) std::fclose(f);
  return f != nullptr && !IsDirectory(path);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Column positions by header name; Fail()s when a required one is missing.
std::vector<int> Columns(const LineReader& in, const std::vector<std::string>& header,
                         const std::vector<std::string_view>& names, std::string_view expected) {
  std::vector<int> at(names.size(), -1);
  for (size_t i = 0; i < header.size(); ++i) {
    for (size_t n = 0; n < names.size(); ++n) {
      if (header[i] == names[n]) at[n] = static_cast<int>(i);
    }
  }
  for (size_t n = 0; n < names.size(); ++n) {
    if (at[n] < 0) in.Fail(fmt::format("expected the {} header (column '{}' is missing)", expected, names[n]));
  }
  return at;
}

// "NPU:3" -> 3; "CPU" -> nullopt.
std::optional<int> NpuIndex(const LineReader& in, std::string_view text) {
  if (text == "CPU") return std::nullopt;
  if (!StartsWith(text, "NPU:")) in.Fail(fmt::format("Device Type: expected 'NPU:<id>', got '{}'", text));
  auto v = ParseInt(text.substr(4));
  if (!v || *v < 0 || *v > 65535) in.Fail(fmt::format("Device Type: expected 'NPU:<id>', got '{}'", text));
  return static_cast<int>(*v);
}

// An "(MB)" field (MiB as a float) to bytes; empty -> kUnknownBytes.
Bytes MiBField(const LineReader& in, std::string_view column, std::string_view text) {
  if (text.empty()) return timeline::kUnknownBytes;
  auto v = ParseDouble(text);
  const std::optional<Bytes> bytes = v && *v >= 0 ? MiBToBytes(*v) : std::nullopt;
  if (!bytes) in.Fail(fmt::format("{}: expected a number of MiB below 2^42, got '{}'", column, text));
  return *bytes;
}

TimeNs TimeField(const LineReader& in, std::string_view column, std::string_view text) {
  auto t = ParseMicrosToNs(text);
  if (!t) in.Fail(fmt::format("{}: expected epoch microseconds such as 1751500000200001.250, got '{}'", column, text));
  return *t;
}

using Builders = std::map<int, SeriesBuilder>;

SeriesBuilder& BuilderFor(Builders& b, int device, size_t max_samples) {
  return b.try_emplace(device, max_samples).first->second;
}

// `in` has read the header line `line`.
void ReadMemoryRecord(LineReader& in, std::string_view line, size_t max_samples, Builders* out,
                      std::map<std::string, int64_t>* skipped) {
  const std::vector<int> col =
      Columns(in, SplitCsv(line),
              {"Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
               "Total Active(MB)", "Device Type"},
              "memory_record.csv 'Component,Timestamp(us),Total Allocated(MB),...'");
  size_t fields = SplitCsv(line).size();
  while (in.Next(&line)) {
    if (Trim(line).empty()) continue;
    const std::vector<std::string> f = SplitCsv(line);
    if (f.size() != fields) in.Fail(fmt::format("expected {} fields as in the header, got {}", fields, f.size()));
    const std::string& component = f[col[0]];
    auto device = NpuIndex(in, f[col[5]]);
    if (!device) {
      ++(*skipped)["CPU"];
      continue;
    }
    timeline::Sample s;
    if (component == "PTA") {
      s.allocated_bytes = MiBField(in, "Total Allocated(MB)", f[col[2]]);
      s.reserved_bytes = MiBField(in, "Total Reserved(MB)", f[col[3]]);
      s.active_bytes = MiBField(in, "Total Active(MB)", f[col[4]]);
    } else if (component == "APP") {
      // The APP "Total Allocated(MB)" may hold unconverted KiB: ignored.
      s.device_bytes = MiBField(in, "Total Reserved(MB)", f[col[3]]);
      if (s.device_bytes < 0) continue;
    } else if (component == "GE" || component == "PTA+GE" || component == "WORKSPACE") {
      ++(*skipped)[component];
      continue;
    } else {
      in.Fail(fmt::format("Component: expected PTA, GE, PTA+GE, APP or WORKSPACE, got '{}'", component));
    }
    BuilderFor(*out, *device, max_samples).Add(TimeField(in, "Timestamp(us)", f[col[1]]), s);
  }
}

// `in` has read the header line `line`.
void ReadOperatorMemory(LineReader& in, std::string_view line, size_t max_samples, Builders* out,
                        std::map<std::string, int64_t>* skipped) {
  const std::vector<std::string> header = SplitCsv(line);
  const std::vector<int> col = Columns(
      in, header,
      {"Name", "Allocation Time(us)", "Release Time(us)", "Allocation Total Allocated(MB)",
       "Allocation Total Reserved(MB)", "Allocation Total Active(MB)", "Release Total Allocated(MB)",
       "Release Total Reserved(MB)", "Release Total Active(MB)", "Device Type"},
      "operator_memory.csv 'Name,Size(KB),Allocation Time(us),...'");
  while (in.Next(&line)) {
    if (Trim(line).empty()) continue;
    const std::vector<std::string> f = SplitCsv(line);
    if (f.size() != header.size()) {
      in.Fail(fmt::format("expected {} fields as in the header, got {}", header.size(), f.size()));
    }
    if (StartsWith(f[col[0]], "cann::")) {
      ++(*skipped)["GE"];
      continue;
    }
    auto device = NpuIndex(in, f[col[9]]);
    if (!device) continue;
    for (int half = 0; half < 2; ++half) {  // allocation, release
      const std::string& when = f[col[1 + half]];
      if (when.empty()) continue;  // outside the profiling window
      timeline::Sample s;
      s.allocated_bytes = MiBField(in, header[col[3 + 3 * half]], f[col[3 + 3 * half]]);
      s.reserved_bytes = MiBField(in, header[col[4 + 3 * half]], f[col[4 + 3 * half]]);
      s.active_bytes = MiBField(in, header[col[5 + 3 * half]], f[col[5 + 3 * half]]);
      BuilderFor(*out, *device, max_samples).Add(TimeField(in, header[col[1 + half]], when), s);
    }
  }
}

// npu_module_mem.csv: the peak of the summed component memory per device, for a note.
std::string ModuleMemNote(const std::string& path) {
  LineReader in(path);
  std::string_view line;
  if (!in.Next(&line)) return "";
  const std::vector<int> col = Columns(in, SplitCsv(line),
                                       {"Component", "Timestamp(us)", "Total Reserved(MB)"},
                                       "npu_module_mem.csv 'Device_id,Component,Timestamp(us),...'");
  std::map<std::string, Bytes> latest;
  std::map<TimeNs, std::vector<std::pair<std::string, Bytes>>> by_time;
  while (in.Next(&line)) {
    if (Trim(line).empty()) continue;
    const std::vector<std::string> f = SplitCsv(line);
    if (f.size() <= static_cast<size_t>(std::max({col[0], col[1], col[2]}))) in.Fail("too few fields");
    by_time[TimeField(in, "Timestamp(us)", f[col[1]])].emplace_back(
        f[col[0]], MiBField(in, "Total Reserved(MB)", f[col[2]]));
  }
  Bytes peak = 0;
  for (const auto& [t, rows] : by_time) {
    for (const auto& [c, b] : rows) latest[c] = b;
    Bytes sum = 0;
    for (const auto& [c, b] : latest) sum += std::max<Bytes>(b, 0);
    peak = std::max(peak, sum);
  }
  return fmt::format("npu_module_mem.csv: CANN components ({}) peak at {:.1f} MiB together "
                     "(memory outside the PyTorch allocator)",
                     latest.size(), static_cast<double>(peak) / kMiB);
}

// The files of a profiler folder that are read (each "" when absent).
struct ProfilerFiles {
  std::string memory_record, operator_memory, trace_view, module_mem;
};

// The files in the folder `path` (a *_ascend_pt folder or its ASCEND_PROFILER_OUTPUT). Throws
// InputError when it has neither memory_record.csv nor operator_memory.csv.
ProfilerFiles FindProfilerFiles(const std::string& path) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (IsDirectory(dir + "/ASCEND_PROFILER_OUTPUT")) dir += "/ASCEND_PROFILER_OUTPUT";
  auto pick = [&](const char* name) {
    const std::string p = dir + "/" + name;
    return FileExists(p) ? p : std::string();
  };
  ProfilerFiles files;
  files.memory_record = pick("memory_record.csv");
  files.operator_memory = pick("operator_memory.csv");
  files.trace_view = pick("trace_view.json");
  files.module_mem = pick("npu_module_mem.csv");
  if (files.memory_record.empty() && files.operator_memory.empty()) {
    throw InputError(fmt::format(
        "{}: no memory_record.csv or operator_memory.csv, expected torch_npu profiler output "
        "recorded with profile_memory=True (ASCEND_PROFILER_OUTPUT/memory_record.csv)",
        dir));
  }
  return files;
}

}  // namespace

timeline::Timeline LoadNpuProfiler(const std::string& path, const LoadProfileOptions& options) {
  const bool folder = IsDirectory(path);
  ProfilerFiles files;
  if (folder) files = FindProfilerFiles(path);
  std::string& memory_record = files.memory_record;
  std::string& operator_memory = files.operator_memory;
  const std::string& trace_view = files.trace_view;
  const std::string& module_mem = files.module_mem;
  // The file is opened once: its header line says which CSV it is, and a pipe cannot be read
  // twice (`--profile <(zcat memory_record.csv.gz) --format npu-profiler`).
  const std::string used = memory_record.empty() ? (operator_memory.empty() ? path : operator_memory)
                                                 : memory_record;
  LineReader in(used);
  std::string_view header;
  const bool has_header = in.Next(&header);
  if (!folder) {
    if (StartsWith(header, "Component,")) {
      memory_record = path;
    } else if (StartsWith(header, "Name,")) {
      operator_memory = path;
    } else if (StartsWith(header, "Device_id,Component,")) {
      throw InputError(fmt::format(
          "{}: npu_module_mem.csv holds CANN component memory only, expected memory_record.csv or "
          "operator_memory.csv (or the whole *_ascend_pt folder)",
          path));
    } else {
      in.Fail(!has_header ? "empty file, expected a torch_npu memory_record.csv or operator_memory.csv"
                          : "expected a torch_npu memory_record.csv header "
                            "'Component,Timestamp(us),Total Allocated(MB),...' or operator_memory.csv "
                            "header 'Name,Size(KB),Allocation Time(us),...'");
    }
  } else if (!has_header) {
    in.Fail(memory_record.empty() ? "empty file, expected the operator_memory.csv header"
                                  : "empty file, expected the memory_record.csv header");
  }
  Builders builders;
  std::map<std::string, int64_t> skipped;
  if (!memory_record.empty()) {
    ReadMemoryRecord(in, header, options.max_samples, &builders, &skipped);
  } else {
    ReadOperatorMemory(in, header, options.max_samples, &builders, &skipped);
  }
  if (builders.empty()) {
    throw InputError(fmt::format("{}: no PTA or APP rows for an NPU, expected allocator records", used));
  }
  int device = builders.begin()->first;
  if (options.device_index >= 0) {
    if (!builders.count(options.device_index)) {
      throw InputError(fmt::format("{}: no rows for NPU:{} (devices in the file: {})", used,
                                   options.device_index, [&] {
                                     std::string s;
                                     for (const auto& [k, v] : builders) s += fmt::format("{}NPU:{}", s.empty() ? "" : ", ", k);
                                     return s;
                                   }()));
    }
    device = options.device_index;
  }
  std::vector<RawSpan> spans;
  if (!trace_view.empty()) spans = ScanChromeTrace(trace_view, 16).spans;
  const size_t steps = std::count_if(spans.begin(), spans.end(),
                                     [](const RawSpan& s) { return s.phase == Phase::kUnknown; });
  timeline::Timeline out =
      builders.at(device).Finish(std::move(spans), Format::kNpuProfiler);
  out.device_index = device;
  out.notes.push_back(fmt::format("NPU:{} from {}{}", device, BaseName(used),
                                  trace_view.empty() ? ""
                                                     : fmt::format(", {} ProfilerStep spans from trace_view.json", steps)));
  if (!skipped.empty()) {
    std::string s;
    for (const auto& [k, v] : skipped) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", v, k);
    out.notes.push_back("rows not imported: " + s);
  }
  if (!module_mem.empty()) {
    const std::string note = ModuleMemNote(module_mem);
    if (!note.empty()) out.notes.push_back(note);
  }
  return out;
}

}  // namespace memsim::profile::internal
