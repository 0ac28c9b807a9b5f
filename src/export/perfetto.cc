// Chrome trace event format: "JSON Object Format" with traceEvents, ph C / X / M, ts and dur in
// µs (Trace Event Format document, Google; Perfetto's JSON importer reads the same).
#include <array>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "export/exports.h"
#include "workload/program.h"

namespace memsim::exports {
namespace {

// Thread ids: one per stream (stream + 1), then the span and phase tracks.
constexpr int kIterationTid = 10;
constexpr int kPhaseTid = 11;

std::string Quote(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

class Writer {
 public:
  explicit Writer(int pid) : pid_(pid) { out_ = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"; }

  void Metadata(int tid, std::string_view what, std::string_view name) {
    Begin();
    out_ += fmt::format(R"({{"ph":"M","pid":{},"tid":{},"ts":0,"name":"{}","args":{{"name":{}}}}})",
                        pid_, tid, what, Quote(name));
  }
  void Counter(std::string_view name, SimTimeUs ts, Bytes bytes) {
    Begin();
    out_ += fmt::format(R"({{"ph":"C","pid":{},"tid":0,"ts":{:.3f},"name":{},"args":{{"bytes":{}}}}})",
                        pid_, ts, Quote(name), bytes);
  }
  void Slice(int tid, std::string_view name, SimTimeUs ts, SimTimeUs dur, std::string_view args) {
    Begin();
    out_ += fmt::format(
        R"({{"ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"name":{},"args":{{{}}}}})", pid_,
        tid, ts, dur < 0 ? 0.0 : dur, Quote(name), args);
  }
  std::string Finish() { return std::move(out_) + "\n]}\n"; }

 private:
  void Begin() {
    if (!first_) out_ += ",\n";
    first_ = false;
  }
  int pid_;
  bool first_ = true;
  std::string out_;
};

// One counter track per curve; an event only where the value changes.
void Counters(const RunDetail& d, Writer& w) {
  constexpr int kTotals = 3;
  std::array<Bytes, kTotals + kNumCategories> last;
  last.fill(-1);
  std::array<std::string, kTotals + kNumCategories> names = {"allocated", "reserved", "device"};
  for (int c = 0; c < kNumCategories; ++c) {
    names[kTotals + c] = fmt::format("category {}", CategoryName(static_cast<Category>(c)));
  }
  for (const CategorySample& s : d.samples) {
    std::array<Bytes, kTotals + kNumCategories> v{};
    v[0] = s.allocated_bytes;
    v[1] = s.reserved_bytes;
    v[2] = s.device_bytes;
    for (int c = 0; c < kNumCategories; ++c) v[kTotals + c] = s.by_category[c];
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] == last[i]) continue;
      w.Counter(names[i], s.time_us, v[i]);
      last[i] = v[i];
    }
  }
}

void Spans(const RunDetail& d, Writer& w) {
  for (const timeline::SpanSummary& s : d.spans) {
    w.Slice(kIterationTid, s.iteration == 0 ? "init" : fmt::format("iteration {}", s.iteration),
            s.start_time_us, s.end_time_us - s.start_time_us,
            fmt::format(R"("iteration":{},"peak_allocated_bytes":{},"peak_reserved_bytes":{})",
                        s.iteration, s.peak_allocated_bytes, s.peak_reserved_bytes));
  }
  // A phase runs from its marker to the next marker (or the end of the last span).
  const SimTimeUs end = d.spans.empty() ? 0 : d.spans.back().end_time_us;
  for (size_t i = 0; i < d.markers.size(); ++i) {
    const timeline::Marker& m = d.markers[i];
    const SimTimeUs next = i + 1 < d.markers.size() ? d.markers[i + 1].time_us : end;
    w.Slice(kPhaseTid, PhaseName(m.phase), m.time_us, next - m.time_us,
            fmt::format(R"("iteration":{})", m.iteration));
  }
}

}  // namespace

std::string ChromeTraceJson(const RunDetail& d) {
  Writer w(d.pipeline_rank);
  w.Metadata(0, "process_name", fmt::format("memsim pipeline stage {}", d.pipeline_rank));
  w.Metadata(0, "thread_name", "memory");
  w.Metadata(workload::kComputeStream + 1, "thread_name", "compute stream");
  w.Metadata(workload::kCommStream + 1, "thread_name", "communication stream");
  w.Metadata(kIterationTid, "thread_name", "iterations");
  w.Metadata(kPhaseTid, "thread_name", "phases");
  Counters(d, w);
  for (const OpSlice& op : d.ops) {
    w.Slice(op.stream + 1, op.name, op.start_us, op.end_us - op.start_us,
            fmt::format(R"("iteration":{},"phase":"{}","micro_batch":{})", op.iteration,
                        PhaseName(op.phase), op.micro_batch));
  }
  Spans(d, w);
  return w.Finish();
}

}  // namespace memsim::exports
