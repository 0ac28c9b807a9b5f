// The files `memsim run` writes for the viewers people already use (docs/interfaces.md,
// 'Exports'): a CSV with one column per category, a Chrome / Perfetto trace (ui.perfetto.dev,
// chrome://tracing), a PyTorch memory snapshot (pytorch.org/memory_viz) and a self-contained HTML
// report. Pure functions from a RunDetail (detail.h) to the bytes of the file; the CLI writes
// them (report::WriteFilesAtomically). Nothing here reads the network or the file system.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "export/detail.h"
#include "timeline/timeline.h"

namespace memsim::exports {

// docs/interfaces.md, 'CSV timeline': time_us,iteration,phase,allocated_bytes,reserved_bytes,
// active_bytes,device_bytes, then one `<category>_bytes` column per category (docs/interfaces.md,
// 'Categories'), which sum to allocated_bytes on every row.
std::string CategoryCsv(const RunDetail& detail);
// The same CSV a row at a time (`run --csv` streamed): its header line, and one sample's line
// appended to `out`.
std::string CategoryCsvHeader();
void AppendCategoryCsvRow(std::string& out, const CategorySample& sample);

// Chrome trace event format (JSON object form, "traceEvents"), as ui.perfetto.dev and
// chrome://tracing read it: counter events ("ph":"C", one numeric arg "bytes") for allocated,
// reserved, device and each category, written when the value changes; each op a complete event
// ("ph":"X", "dur") on a thread per stream; init and iterations on one thread, phases on another;
// thread and process names as metadata events ("ph":"M"). Every event has pid (the pipeline
// rank), tid and ts (µs).
std::string ChromeTraceJson(const RunDetail& detail);

// The simulated allocator as the memory snapshot torch.cuda.memory._dump_snapshot writes
// (docs/profile-formats.md, 'PyTorch memory snapshot'), pickled with protocol 2: `segments`
// (the state at the end of the window) and `device_traces` (one list, device 0: every
// segment_alloc / segment_map / alloc / free_requested / free_completed / segment_unmap /
// segment_free with addr, size, stream, time_us and frames naming the tensor and the op).
// The window: init and iterations 1..`iterations` (0 or more than were simulated: the whole
// run), so that a long MoE run stays small enough for pytorch.org/memory_viz to open.
// REQUIRES: detail collected with allocator_events.
std::string MemorySnapshotPickle(const RunDetail& detail, int iterations = 0);

// How many of detail.allocator_events MemorySnapshotPickle(detail, iterations) writes: those
// before the start of iteration `iterations` + 1.
size_t SnapshotEventsKept(const RunDetail& detail, int iterations);

// `run --snapshot`'s default window keeps at most this many trace entries: every simulated
// iteration when they fit, else the most whole iterations from the start that fit (at least
// one). memsim's choice, not a measured limit of the viewer: it holds every entry in the browser,
// and a Qwen3-30B-A3B stage's 1.3 million entries (254 MB, about 195 bytes each) did not open
// (issue 32); 300,000 entries are about 60 MB.
inline constexpr size_t kSnapshotEntryBudget = 300000;

// The window of the default --snapshot: the iterations to pass to MemorySnapshotPickle (0: all).
int DefaultSnapshotIterations(const RunDetail& detail);

// One measured curve for the HTML report (compare --html).
struct MeasuredCurve {
  std::string label;  // e.g. the profile's file name and format
  timeline::Timeline timeline;
  double time_offset_us = 0;  // added to the measured times so they sit on the simulated ones
};

struct HtmlInput {
  std::string title;      // e.g. "llama2-7b on ascend-910b-64g, TP2 PP1 DP4"
  std::string header;     // the run header text (shown as preformatted text)
  std::string table;      // the per-iteration table text
  std::vector<RunDetail> stages;  // every pipeline stage (one selectable curve each)
  int reported_stage = 0;         // index into stages shown first
  std::optional<MeasuredCurve> measured;
};

// The report's title from a run header's first line ("memsim run: llama2-7b ... on ..."),
// without the "memsim <command>: " prefix.
std::string TitleOf(std::string_view header);

// One HTML file that opens offline: uPlot (third_party/uplot, MIT) and the data inlined; the
// allocated / reserved / device curves with zoom, a stacked area by category, a pipeline-stage
// selector and the per-iteration table. Contains no URL that would be fetched.
// Samples are reduced to at most `max_points` per stage (keeping each bucket's maximum).
std::string HtmlReport(const HtmlInput& input, int max_points = 4000);

}  // namespace memsim::exports
