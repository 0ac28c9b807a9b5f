// Internal to profile/: the streaming (SAX) reader of Chrome trace JSON shared by the PyTorch
// profiler importer (chrome_trace.cc) and the torch_npu folder importer (trace_view.json's
// ProfilerStep spans). Memory held: the selected events only, never the document.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "profile/profile.h"
#include "profile/reader.h"

namespace memsim::profile::internal {

struct ChromeTraceScan {
  // [memory] samples per device id (CPU events, Device Type 0, excluded), absolute ns.
  std::map<int, SeriesBuilder> devices;
  // Devices whose events lack "Total Allocated": their Bytes deltas, integrated after sorting
  // (pre-1.10 traces; docs/profile-formats.md, 'PyTorch profiler trace'). Kept whole: such traces
  // are small.
  std::map<int, std::vector<std::pair<TimeNs, int64_t>>> deltas;
  std::vector<RawSpan> spans;  // ProfilerStep#N -> iteration N + 1; phase annotations
  int64_t cpu_events = 0;
  int64_t oom_events = 0;
  int64_t bad_ts_events = 0;  // [memory] events whose ts is unreadable or beyond kMaxAbsTimeNs
  bool has_trace_events = false;
  bool relative_ts = false;  // baseTimeNanoseconds present (Kineto 2024+)
};

// Scans `path` (.json or .json.gz). Throws InputError "<path>: byte N: ..." on malformed JSON.
ChromeTraceScan ScanChromeTrace(const std::string& path, size_t max_samples);

}  // namespace memsim::profile::internal
