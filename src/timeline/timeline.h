// Timeline: memory over time, simulated or imported from a real profile (docs/architecture.md,
// timeline/). Samples are in time order; a value the source cannot know is kUnknownBytes.
// Time is microseconds since the start of the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/categories.h"
#include "core/huge_page_allocator.h"
#include "core/units.h"

namespace memsim::timeline {

inline constexpr Bytes kUnknownBytes = -1;

struct Sample {
  SimTimeUs time_us = 0;
  int iteration = -1;  // 0 = init, 1.. = training iteration, -1 = unknown
  Phase phase = Phase::kUnknown;
  Bytes allocated_bytes = kUnknownBytes;
  Bytes reserved_bytes = kUnknownBytes;
  Bytes active_bytes = kUnknownBytes;
  Bytes device_bytes = kUnknownBytes;  // what npu-smi / nvidia-smi shows
  bool operator==(const Sample&) const = default;
};

// Samples in time order. A curve is megabytes filled once: its buffer takes huge pages where the
// system offers them (core/huge_page_allocator.h), a fault per 2 MiB instead of per 4 KiB.
using SampleVector = std::vector<Sample, HugePageAllocator<Sample>>;

// A boundary: the start of an iteration or of a phase within it.
struct Marker {
  SimTimeUs time_us = 0;
  int iteration = -1;
  Phase phase = Phase::kUnknown;
  std::string label;
  bool operator==(const Marker&) const = default;
};

// A peak the source reports itself, cumulative from the start of the process to the end of
// `iteration` (Megatron report_memory "max allocated" / "max reserved", MiB converted to bytes).
struct ReportedPeak {
  int iteration = -1;
  Bytes max_allocated_bytes = kUnknownBytes;
  Bytes max_reserved_bytes = kUnknownBytes;
  bool operator==(const ReportedPeak&) const = default;
};

// What a training log says about itself, for compare's diagnosis (profile/megatron_log.cc reads
// Megatron-LM's lines); each field absent when the log does not say it.
struct LogStatements {
  // Sum of training_log's "number of skipped iterations: K" over its lines (K counts the
  // iterations of one log interval; Megatron resets it after each line), and the last
  // "iteration N/M" among those lines.
  std::optional<int> skipped_iterations;
  std::optional<int> last_logged_iteration;
  // get_model's " > number of parameters on (tensor, pipeline) model parallel rank (t, p): N"
  // (newer releases put more ranks between the parentheses; tensor is the first, pipeline the
  // last).
  struct RankParameters {
    int tensor_rank = 0;
    int pipeline_rank = 0;
    std::int64_t count = 0;
    bool operator==(const RankParameters&) const = default;
  };
  std::vector<RankParameters> parameters;
  // report_theoretical_memory's "Theoretical memory footprints: weight and optimizer=W MB,
  // activation=A MB, total=T MB" (MB = MiB), converted to bytes.
  std::optional<Bytes> theoretical_weight_and_optimizer_bytes;
  std::optional<Bytes> theoretical_activation_bytes;
  bool operator==(const LogStatements&) const = default;
};

struct Timeline {
  SampleVector samples;
  std::vector<Marker> markers;
  std::string source;  // "memsim" or the profile format name
  // Added by profile/: the device (ordinal as the source numbers it) the samples belong to,
  // -1 when unknown or simulated.
  int device_index = -1;
  // Added by profile/: cumulative peaks reported by the source (Megatron logs); empty otherwise.
  std::vector<ReportedPeak> reported_peaks;
  // Added by profile/: one line each about what the importer detected, skipped or decimated
  // ("skipped 3 CPU [memory] events"), printed by `compare`.
  std::vector<std::string> notes;
  // Added by profile/ for training logs: what the log says about the run.
  LogStatements statements;
  bool operator==(const Timeline&) const = default;
};

}  // namespace memsim::timeline
