// profile/: importers of real memory profiles into a timeline::Timeline (docs/architecture.md;
// each format, its units and time base, and the upstream code that writes it are described in
// docs/profile-formats.md; the user's guide is docs/profiles.md).
// An importer only translates: it never guesses values the source does not hold (those stay
// kUnknownBytes) and never simulates. Time in the returned Timeline is microseconds since the
// earliest sample or marker of the file (importers keep nanosecond precision while reading).
// Iteration numbers follow memsim's convention (1 = first training iteration) where the source
// says which training iteration it saw; otherwise samples keep iteration -1 and compare/ detects
// iterations from the curve.
//
// Memory bound: every importer reads its file as a stream and keeps only memory samples, at most
// LoadProfileOptions::max_samples per device in the file (default 2^21 samples of 64
// bytes while reading = 128 MiB, plus up to 40 MiB during a decimation; the returned Timeline
// holds 48-byte samples); longer series are decimated by runs of 16 consecutive samples that keep
// each run's first, last, highest-allocated, highest-reserved and highest-device sample, so
// peaks stay exact. A 2 GB memory_record.csv therefore loads in one pass within that bound,
// whatever its row order. The memory snapshot keeps 24 bytes per trace entry besides (it is
// walked backwards); pre-1.10 Chrome traces keep their Bytes deltas whole.
//
// Errors: bad input throws memsim::InputError whose message starts with "<file>:<line>: " for
// line-based formats or "<file>: byte <offset>: " for JSON, and says what was expected.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "timeline/timeline.h"

namespace memsim::profile {

enum class Format {
  kAuto,
  kTorchTrace,
  kTorchSnapshot,
  kNpuProfiler,
  kNpuMem,
  kNpuSmi,
  kNvidiaSmi,
  kMegatronLog,
  kMemsimCsv,
};

// The profile formats, declared once: the command-line name (`compare --format`, also the
// Timeline::source an importer sets) and what the format is. `compare`'s option help and
// messages, and the format list of docs/profiles.md (tests/docs/vocabulary_test.cc), come from
// this table.
struct FormatInfo {
  Format format;
  std::string_view name;
  std::string_view description;
};

// Rows in Format order.
inline constexpr FormatInfo kFormatTable[] = {
    {Format::kAuto, "auto", "detected from the file's name and first bytes, or from a folder"},
    {Format::kTorchTrace, "torch-trace", "PyTorch profiler Chrome trace (.json, .json.gz)"},
    {Format::kTorchSnapshot, "torch-snapshot", "PyTorch memory snapshot, JSON or pickle"},
    {Format::kNpuProfiler, "npu-profiler", "torch_npu profiler CSVs or a whole *_ascend_pt folder"},
    {Format::kNpuMem, "npu-mem", "CANN npu_mem*.csv"},
    {Format::kNpuSmi, "npu-smi", "repeated `npu-smi info` text"},
    {Format::kNvidiaSmi, "nvidia-smi", "`nvidia-smi --query-gpu=... --format=csv` log"},
    {Format::kMegatronLog, "megatron-log", "Megatron report_memory lines"},
    {Format::kMemsimCsv, "memsim-csv",
     "memsim's own CSV timeline (docs/interfaces.md, 'CSV timeline')"},
};

constexpr bool FormatTableInEnumOrder() {
  for (size_t i = 0; i < std::size(kFormatTable); ++i) {
    if (static_cast<size_t>(kFormatTable[i].format) != i) return false;
  }
  return true;
}
static_assert(FormatTableInEnumOrder());

// The command-line name of `format`, and the format of a command-line name.
std::string_view FormatName(Format format);
std::optional<Format> FormatFromName(std::string_view name);
// Every command-line name in table order, joined: with "|" for an option's help
// ("auto|torch-trace|...|memsim-csv"), or as a list ("auto, torch-trace, ... or memsim-csv")
// when `last_separator` is given.
std::string FormatNames(std::string_view separator, std::string_view last_separator = {});

struct LoadProfileOptions {
  // Device to import: the `Device Id` / `NPU:<id>` / device ordinal / GPU index / chip position
  // as the format numbers it. -1: the lowest device that has data.
  int device_index = -1;
  // Megatron logs: the global rank whose lines are imported. -1: the lowest rank seen.
  int rank = -1;
  // Upper bound on samples kept in memory (see the header comment). REQUIRES: >= 16.
  size_t max_samples = size_t{1} << 21;
  // Nominal spacing of samples whose source has no clock (npu-smi without timestamps), in us.
  double nominal_interval_us = 1e6;
};

// What DetectFormat found, and why (printed by `compare`: "detected npu-smi: ...").
struct Detection {
  Format format = Format::kAuto;
  std::string reason;
};

// Guesses the format of `path` (a file, a .gz file, or a directory) from its name and first
// bytes. Throws InputError "<path>: cannot tell the profile format: ..." when nothing matches,
// when the file cannot be read, and "<path>: not a regular file ..." for a pipe or device (its
// first bytes cannot be read twice; --format names the format instead).
Detection DetectFormat(const std::string& path);

// The same decision from a file name and its first (decompressed) bytes; no I/O. Returns
// kAuto when nothing matches.
Detection DetectFormatFromContent(std::string_view path, std::string_view head);

// Reads `path` as `format` (kAuto: DetectFormat first). Throws InputError as described above,
// including for empty files, truncated files, a file of another kind, and a profile with no
// memory samples for the selected device.
timeline::Timeline LoadProfile(const std::string& path, Format format,
                               const LoadProfileOptions& options = {});

}  // namespace memsim::profile
