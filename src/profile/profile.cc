#include "profile/profile.h"

#include <filesystem>

#include <fmt/core.h>

#include "core/error.h"
#include "core/pickle.h"
#include "profile/clock.h"
#include "profile/importers.h"
#include "profile/reader.h"

namespace memsim::profile {
namespace {

bool Contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

std::string_view FileName(std::string_view path) {
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string_view FormatName(Format format) { return kFormatTable[static_cast<int>(format)].name; }

std::optional<Format> FormatFromName(std::string_view name) {
  for (const FormatInfo& row : kFormatTable) {
    if (row.name == name) return row.format;
  }
  return std::nullopt;
}

std::string FormatNames(std::string_view separator, std::string_view last_separator) {
  std::string out;
  const size_t n = std::size(kFormatTable);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n && !last_separator.empty() ? last_separator : separator;
    out += kFormatTable[i].name;
  }
  return out;
}

Detection DetectFormatFromContent(std::string_view path, std::string_view head) {
  const std::string_view name = FileName(path);
  if (LooksLikePickle(head)) {
    if (Contains(head, "device_traces") || Contains(head, "segments")) {
      return {Format::kTorchSnapshot, "pickle with segments / device_traces (memory snapshot)"};
    }
    // torch.cuda.memory_snapshot() pickled: a bare list of segment dicts, each with total_size
    // (torch/cuda/memory.py; the form _memory_viz.py still accepts). Its top value is a list, so
    // the key names above never occur.
    if (Contains(head, "total_size")) {
      return {Format::kTorchSnapshot, "pickle with total_size (memory snapshot: a list of segments)"};
    }
    return {Format::kAuto, ""};
  }
  std::string_view body = internal::Trim(head);
  if (internal::StartsWith(body, "\xEF\xBB\xBF")) body.remove_prefix(3);
  // The first line that is not a '#' comment.
  std::string_view first_line;
  for (std::string_view rest = body; !rest.empty();) {
    const size_t nl = rest.find('\n');
    first_line = internal::Trim(rest.substr(0, nl));
    if (first_line.empty() || first_line[0] != '#') break;
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
  }
  const bool json = !body.empty() &&
                    (body[0] == '{' || (body[0] == '[' && internal::Trim(body.substr(1)).substr(0, 1) == "{"));
  if (json) {
    if (Contains(body, "\"traceEvents\"") || Contains(body, "\"ph\"")) {
      return {Format::kTorchTrace, "JSON with traceEvents (Chrome trace)"};
    }
    if (Contains(body, "\"device_traces\"") || Contains(body, "\"segments\"") ||
        Contains(body, "\"total_size\"")) {
      return {Format::kTorchSnapshot, "JSON with segments / device_traces (memory snapshot)"};
    }
    return {Format::kAuto, ""};
  }
  if (internal::StartsWith(first_line, "time_us,")) {
    return {Format::kMemsimCsv, "CSV header time_us,iteration,phase,... (memsim-csv)"};
  }
  if (internal::StartsWith(first_line, "Component,Timestamp(us),Total Allocated(MB)")) {
    return {Format::kNpuProfiler, "torch_npu memory_record.csv header"};
  }
  if (internal::StartsWith(first_line, "Name,Size(KB),Allocation Time(us)")) {
    return {Format::kNpuProfiler, "torch_npu operator_memory.csv header"};
  }
  if (internal::StartsWith(first_line, "Device_id,Component,Timestamp(us),Total Reserved(MB)")) {
    return {Format::kNpuProfiler, "torch_npu npu_module_mem.csv header"};
  }
  if (Contains(first_line, "hbm(KB)") || Contains(first_line, "memory(KB)")) {
    return {Format::kNpuMem, "CANN npu_mem CSV header (event, ddr(KB), hbm(KB), ...)"};
  }
  if (Contains(first_line, "memory.used")) {
    return {Format::kNvidiaSmi, "CSV header with memory.used (nvidia-smi --query-gpu)"};
  }
  if (Contains(body, " memory (MB) | allocated: ")) {
    return {Format::kMegatronLog, "'memory (MB) | allocated:' lines (Megatron report_memory)"};
  }
  if (Contains(body, "npu-smi") || (Contains(body, "| NPU") && Contains(body, "Health"))) {
    return {Format::kNpuSmi, "npu-smi info tables"};
  }
  {
    std::vector<std::string> f = internal::SplitCsv(first_line);
    if (f.size() >= 2 && f.size() <= 4 && internal::ParseWallClock(f[0])) {
      return {Format::kNvidiaSmi,
              "rows 'timestamp[, index], memory.used, ...' (nvidia-smi csv,noheader)"};
    }
  }
  (void)name;
  return {Format::kAuto, ""};
}

Detection DetectFormat(const std::string& path) {
  if (internal::IsDirectory(path)) {
    const std::string_view name = FileName(path);
    if (name.size() >= 9 && name.substr(name.size() - 9) == "ascend_pt") {
      return {Format::kNpuProfiler, "a *_ascend_pt folder (torch_npu profiler)"};
    }
    return {Format::kNpuProfiler, "a folder (read as torch_npu profiler output: ASCEND_PROFILER_OUTPUT/*.csv)"};
  }
  // A pipe (/dev/stdin, <(...)) can be read only once: the bytes detection reads would be gone
  // before the reader starts.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw InputError(fmt::format(
        "{}: not a regular file (a pipe or device); --format auto detects the format from the "
        "first bytes, which a pipe cannot give twice: name the format with --format (e.g. "
        "--format memsim-csv) or save the profile to a file",
        path));
  }
  const std::string head = internal::ReadHead(path, 64 * 1024);
  if (internal::Trim(head).empty()) {
    throw InputError(fmt::format("{}: empty file, expected a memory profile", path));
  }
  Detection d = DetectFormatFromContent(path, head);
  if (d.format == Format::kAuto && LooksLikePickle(head)) {
    throw InputError(fmt::format(
        "{}: a Python pickle, but not a memory snapshot: no 'segments', 'device_traces' or "
        "'total_size' in its first bytes (torch.cuda.memory._snapshot() pickles a dict with "
        "segments and device_traces; torch.cuda.memory_snapshot() a list of segments)",
        path));
  }
  if (d.format == Format::kAuto) {
    throw InputError(fmt::format(
        "{}: cannot tell the profile format from its first bytes; expected one of torch-trace, "
        "torch-snapshot, npu-profiler, npu-mem, npu-smi, nvidia-smi, megatron-log, memsim-csv "
        "(name it with --format)",
        path));
  }
  return d;
}

timeline::Timeline LoadProfile(const std::string& path, Format format,
                               const LoadProfileOptions& options) {
  std::string detected;
  if (format == Format::kAuto) {
    Detection d = DetectFormat(path);
    format = d.format;
    detected = fmt::format("detected {}: {}", FormatName(format), d.reason);
  }
  timeline::Timeline out;
  switch (format) {
    case Format::kMemsimCsv: out = internal::LoadMemsimCsv(path, options); break;
    case Format::kMegatronLog: out = internal::LoadMegatronLog(path, options); break;
    case Format::kNvidiaSmi: out = internal::LoadNvidiaSmi(path, options); break;
    case Format::kNpuSmi: out = internal::LoadNpuSmi(path, options); break;
    case Format::kTorchTrace: out = internal::LoadChromeTrace(path, options); break;
    case Format::kTorchSnapshot: out = internal::LoadSnapshot(path, options); break;
    case Format::kNpuProfiler: out = internal::LoadNpuProfiler(path, options); break;
    case Format::kNpuMem: out = internal::LoadNpuMem(path, options); break;
    case Format::kAuto: break;
  }
  if (!detected.empty()) out.notes.insert(out.notes.begin(), detected);
  return out;
}

}  // namespace memsim::profile
