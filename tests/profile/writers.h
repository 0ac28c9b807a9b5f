// Test helpers: a known "simulated" Timeline and writers that turn a Timeline into each profile
// format, for the round-trip tests (write -> profile::LoadProfile -> compare::Compare). They are
// deliberately simple and separate from the readers; the hand-written fixtures under data/ guard
// against a writer and a reader sharing one misreading of docs/profile-formats.md.
#pragma once

#include <string>

#include "timeline/timeline.h"

namespace memsim::testing {

// Four iterations after an init phase, one sample every 1000 us (derivation in writers.cc):
// static 2048 MiB (+1024 MiB optimizer states from iteration 1's step), forward adds 8 x 256 MiB,
// backward frees them, the step holds a 512 MiB temporary; reserved = running maximum of
// allocated rounded up to 512 MiB; device = reserved + 3000 MiB.
timeline::Timeline KnownTimeline(int iterations = 4);

// Multiplies allocated / reserved / active / device of every sample of `iteration` by `factor`.
void ScaleIteration(timeline::Timeline& t, int iteration, double factor);

// A temporary path in the system temp directory, unique per process and name; anything there
// is removed first.
std::string TempPath(const std::string& name);
void WriteFile(const std::string& path, const std::string& text);

std::string WriteMemsimCsv(const timeline::Timeline& t);
// One report_memory line per iteration end, rank 0, MiB with 2 decimals; "max" cumulative.
std::string WriteMegatronLog(const timeline::Timeline& t);
// nvidia-smi csv with an index column (GPU 0 = t, GPU 1 = a flat 1 GiB), one row pair per sample.
std::string WriteNvidiaSmiCsv(const timeline::Timeline& t);
// npu-smi info tables with a `date` line before each, one table per sample (device_bytes).
std::string WriteNpuSmi(const timeline::Timeline& t);

// PyTorch Chrome trace, new Kineto style (baseTimeNanoseconds, relative ts with 3 decimals):
// a ProfilerStep#(k-1) span per iteration k >= 1, forward/backward/optimizer_step annotations,
// one [memory] event per sample with Total Allocated / Total Reserved, written in reverse order
// (traces are not time-sorted).
std::string WriteChromeTrace(const timeline::Timeline& t);
// Memory snapshot JSON: allocated changes as alloc / free_requested / free_completed of blocks,
// reserved changes as segment_alloc / segment_free; final segments hold the live blocks.
std::string WriteSnapshot(const timeline::Timeline& t);

// torch_npu *_ascend_pt folder at `dir` (created): ASCEND_PROFILER_OUTPUT/memory_record.csv
// (APP rows first for device_bytes, then PTA rows newest first; MiB floats, epoch us with a
// trailing TAB, CRLF) and trace_view.json with ProfilerStep#(k-1) spans (string ts).
// With `operator_memory`, the folder holds operator_memory.csv instead of memory_record.csv: one
// aten:: row per sample whose allocation half carries the sample's allocator totals (release
// half empty, as for a tensor still alive when profiling stopped), unsorted, plus a cann:: row
// that must be skipped.
void WriteAscendFolder(const timeline::Timeline& t, const std::string& dir,
                       bool operator_memory = false);
// CANN npu_mem.csv: one Device row per sample (hbm(KB) = device_bytes / 1024), plus APP rows.
std::string WriteNpuMem(const timeline::Timeline& t);

}  // namespace memsim::testing

namespace memsim::testing {
// Path of a fixture under tests/profile/data/.
inline std::string DataPath(const std::string& name) {
  return std::string(MEMSIM_SOURCE_DIR) + "/tests/profile/data/" + name;
}
}  // namespace memsim::testing
