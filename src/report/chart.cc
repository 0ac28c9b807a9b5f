#include "report/chart.h"

#include <algorithm>
#include <map>
#include <vector>

#include <fmt/core.h>

namespace memsim::report {
namespace {

constexpr int kAxisWidth = 8;  // "123.4G |"

struct Column {
  Bytes allocated = timeline::kUnknownBytes;
  Bytes reserved = timeline::kUnknownBytes;
  Bytes device = timeline::kUnknownBytes;
};

}  // namespace

std::string FormatChart(const timeline::Timeline& tl, const ChartOptions& options) {
  if (tl.samples.empty()) return "";
  const int width = std::max(40, options.width);
  const int height = std::max(4, options.height);
  const int plot_width = width - kAxisWidth - 1;

  // Spans in order of first appearance: iteration -> [first sample, last sample].
  std::map<int, std::pair<size_t, size_t>> spans;
  std::pair<size_t, size_t>* current = nullptr;  // the span of the previous sample
  for (size_t i = 0; i < tl.samples.size(); ++i) {
    // Samples come in runs of one iteration: look the span up only when the iteration changes.
    if (current == nullptr || tl.samples[i].iteration != tl.samples[i - 1].iteration) {
      current = &spans.try_emplace(tl.samples[i].iteration, i, i).first->second;
    }
    current->second = i;
  }
  const int num_spans = static_cast<int>(spans.size());
  const int per_span = std::max(1, plot_width / num_spans);
  std::vector<Column> columns(static_cast<size_t>(per_span * num_spans));
  Bytes top = 1;
  int span_index = 0;
  for (const auto& [iteration, range] : spans) {
    const auto [first, last] = range;
    const SimTimeUs t0 = tl.samples[first].time_us;
    const SimTimeUs t1 = tl.samples[last].time_us;
    for (size_t i = first; i <= last; ++i) {
      const timeline::Sample& s = tl.samples[i];
      if (s.iteration != iteration) continue;
      int c = t1 > t0 ? static_cast<int>((s.time_us - t0) / (t1 - t0) * per_span) : 0;
      c = std::clamp(c, 0, per_span - 1);
      Column& col = columns[static_cast<size_t>(span_index * per_span + c)];
      col.allocated = std::max(col.allocated, s.allocated_bytes);
      col.reserved = std::max(col.reserved, s.reserved_bytes);
      col.device = std::max(col.device, s.device_bytes);
      top = std::max({top, s.allocated_bytes, s.reserved_bytes, s.device_bytes});
    }
    ++span_index;
  }
  // Columns no sample fell into repeat their left neighbour (the curve is a step function).
  for (size_t c = 1; c < columns.size(); ++c) {
    if (columns[c].allocated < 0 && columns[c].reserved < 0 && columns[c].device < 0 &&
        c % static_cast<size_t>(per_span) != 0) {
      columns[c] = columns[c - 1];
    }
  }

  std::string out;
  if (!options.title.empty()) out += options.title + "\n";
  const double top_gib = static_cast<double>(top) / kGiB;
  for (int row = height - 1; row >= 0; --row) {
    // A cell is filled when the curve reaches the middle of its band.
    const double level = (row + 0.5) / height * static_cast<double>(top);
    std::string label = (row == height - 1 || row == 0 || row == height / 2)
                            ? fmt::format("{:6.1f}G", top_gib * (row + 1) / height)
                            : std::string(7, ' ');
    out += label + "|";
    for (const Column& col : columns) {
      char ch = ' ';
      if (col.device >= 0 && static_cast<double>(col.device) >= level) ch = '.';
      if (col.reserved >= 0 && static_cast<double>(col.reserved) >= level) ch = '+';
      if (col.allocated >= 0 && static_cast<double>(col.allocated) >= level) ch = '#';
      out += ch;
    }
    out += "\n";
  }
  out += std::string(7, ' ') + "+" + std::string(columns.size(), '-') + "\n";
  std::string axis(columns.size() + 8, ' ');
  span_index = 0;
  for (const auto& [iteration, range] : spans) {
    std::string name = iteration == 0 ? "init" : iteration < 0 ? "?" : fmt::format("it{}", iteration);
    if (static_cast<int>(name.size()) > per_span) name = name.substr(0, static_cast<size_t>(per_span));
    const size_t pos = 8 + static_cast<size_t>(span_index * per_span);
    axis.replace(pos, name.size(), name);
    ++span_index;
  }
  while (!axis.empty() && axis.back() == ' ') axis.pop_back();
  out += axis + "\n";
  out += "        # allocated   + reserved (cached)   . device (npu-smi/nvidia-smi)\n";
  return out;
}

}  // namespace memsim::report
