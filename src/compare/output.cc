// Text outputs of a compare::Report: table, overlay chart, JSON (docs/interfaces.md, 'compare
// and check JSON'). JSON is written by hand (no JSON library outside config/profile/report
// writers).
#include <algorithm>
#include <climits>
#include <cmath>

#include <fmt/core.h>

#include "compare/compare.h"

namespace memsim::compare {
namespace {

using timeline::kUnknownBytes;

constexpr int kWideTableColumns = 112;

std::string MiB(Bytes b) {
  if (b < 0) return "-";
  return fmt::format("{:.1f}", static_cast<double>(b) / static_cast<double>(kMiB));
}

std::string Pct(const std::optional<double>& p) {
  if (!p) return "-";
  return fmt::format("{:+.1f}%", *p);
}

std::string Cell(Bytes measured, Bytes simulated, const std::optional<double>& err) {
  if (measured < 0 && simulated < 0) return "-";
  return fmt::format("{} / {} ({})", MiB(measured), MiB(simulated), Pct(err));
}

// "20.58/20.35 +1.1%": a cell of the compact layout (GiB).
std::string CompactCell(Bytes measured, Bytes simulated, const std::optional<double>& err) {
  if (measured < 0 && simulated < 0) return "-";
  auto gib = [](Bytes b) {
    return b < 0 ? std::string("-") : fmt::format("{:.2f}", static_cast<double>(b) / kGiB);
  };
  return fmt::format("{}/{} {}", gib(measured), gib(simulated), Pct(err));
}

// `line` and a newline; wrapped at spaces to `width` columns (0: never), continuation indented.
std::string Fit(const std::string& line, int width) {
  if (width <= 0 || static_cast<int>(line.size()) <= width) return line + "\n";
  std::string out, current;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t end = line.find(' ', pos);
    if (end == std::string::npos) end = line.size();
    const std::string word = line.substr(pos, end - pos);
    if (!current.empty() && static_cast<int>(current.size() + 1 + word.size()) > width) {
      out += current + "\n";
      current = "  " + word;
    } else {
      current += (current.empty() ? "" : " ") + word;
    }
    pos = end + 1;
  }
  return out + current + "\n";
}

std::string JsonNumber(Bytes b) { return b < 0 ? "null" : fmt::format("{}", b); }
std::string JsonNumber(const std::optional<double>& d) {
  return d ? fmt::format("{:.4f}", *d) : "null";
}
std::string JsonNumber(const std::optional<int>& i) { return i ? fmt::format("{}", *i) : "null"; }

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonPeaks(const Peaks& p) {
  return fmt::format(
      "{{\"peak_allocated_bytes\": {}, \"peak_reserved_bytes\": {}, \"peak_device_bytes\": {}, "
      "\"end_allocated_bytes\": {}, \"end_reserved_bytes\": {}}}",
      JsonNumber(p.peak_allocated_bytes), JsonNumber(p.peak_reserved_bytes),
      JsonNumber(p.peak_device_bytes), JsonNumber(p.end_allocated_bytes),
      JsonNumber(p.end_reserved_bytes));
}

// measured - simulated per field; null where either side is unknown.
std::string JsonErrorBytes(const Peaks& m, const Peaks& s) {
  auto diff = [](Bytes a, Bytes b) { return a < 0 || b < 0 ? std::string("null") : fmt::format("{}", a - b); };
  return fmt::format(
      "{{\"peak_allocated\": {}, \"peak_reserved\": {}, \"peak_device\": {}, "
      "\"end_allocated\": {}, \"end_reserved\": {}}}",
      diff(m.peak_allocated_bytes, s.peak_allocated_bytes),
      diff(m.peak_reserved_bytes, s.peak_reserved_bytes),
      diff(m.peak_device_bytes, s.peak_device_bytes), diff(m.end_allocated_bytes, s.end_allocated_bytes),
      diff(m.end_reserved_bytes, s.end_reserved_bytes));
}

std::string JsonErrors(const PeakErrors& e) {
  return fmt::format(
      "{{\"peak_allocated\": {}, \"peak_reserved\": {}, \"peak_device\": {}, "
      "\"end_allocated\": {}, \"end_reserved\": {}}}",
      JsonNumber(e.peak_allocated), JsonNumber(e.peak_reserved), JsonNumber(e.peak_device),
      JsonNumber(e.end_allocated), JsonNumber(e.end_reserved));
}

}  // namespace

std::string FormatTable(const Report& r, int width) {
  // The wide layout (MiB, 3 x 30 columns) needs 112 columns; narrower terminals get GiB cells.
  const bool compact = width > 0 && width < kWideTableColumns;
  std::string out;
  out += fmt::format("profile format: {}    pipeline rank: {}\n", r.format, r.pipeline_rank);
  out += Fit(fmt::format("alignment: {}", r.alignment), width);
  for (const std::string& n : r.notes) out += Fit(fmt::format("note: {}", n), width);
  if (compact) {
    out += Fit(fmt::format("values: measured/simulated GiB, error = (measured - simulated) / "
                           "simulated{}",
                           r.cumulative_peaks ? "; peaks cumulative since the process started" : ""),
               width);
  } else {
    out += fmt::format("values: measured / simulated MiB (error = (measured - simulated) / simulated){}\n",
                       r.cumulative_peaks ? "; peaks are cumulative since the process started" : "");
  }
  const int cell = compact ? 19 : 30;
  auto cell_of = [&](Bytes m, Bytes s, const std::optional<double>& e) {
    return compact ? CompactCell(m, s, e) : Cell(m, s, e);
  };
  out += fmt::format("{:>5} {:>4}  {:<{}} {:<{}} {:<{}} {:>{}}\n", "iter", "sim", "peak allocated", cell,
                     "peak reserved", cell, "peak device", cell, "curve", compact ? 6 : 7);
  for (const IterationResult& it : r.iterations) {
    const auto& c = it.curve_error_pct;
    const auto curve = c.allocated ? c.allocated : c.reserved ? c.reserved : c.device;
    out += fmt::format(
        "{:>5} {:>4}  {:<{}} {:<{}} {:<{}} {:>{}}\n", it.iteration, it.simulated_iteration,
        cell_of(it.measured.peak_allocated_bytes, it.simulated.peak_allocated_bytes,
                it.error_pct.peak_allocated),
        cell,
        cell_of(it.measured.peak_reserved_bytes, it.simulated.peak_reserved_bytes,
                it.error_pct.peak_reserved),
        cell,
        cell_of(it.measured.peak_device_bytes, it.simulated.peak_device_bytes, it.error_pct.peak_device),
        cell, curve ? fmt::format("{:.1f}%", *curve) : "-", compact ? 6 : 7);
  }
  out += fmt::format(
      "{:>10}  {:<{}} {:<{}} {:<{}} {:>{}}\n", "overall",
      cell_of(r.overall_measured.peak_allocated_bytes, r.overall_simulated.peak_allocated_bytes,
              r.overall_error_pct.peak_allocated),
      cell,
      cell_of(r.overall_measured.peak_reserved_bytes, r.overall_simulated.peak_reserved_bytes,
              r.overall_error_pct.peak_reserved),
      cell,
      cell_of(r.overall_measured.peak_device_bytes, r.overall_simulated.peak_device_bytes,
              r.overall_error_pct.peak_device),
      cell, r.overall_curve_error_pct ? fmt::format("{:.1f}%", *r.overall_curve_error_pct) : "-",
      compact ? 6 : 7);
  if (r.converged_device_measured >= 0) {
    out += fmt::format("converged device level: {}\n",
                       cell_of(r.converged_device_measured, r.converged_device_simulated,
                               r.converged_device_error_pct));
  }
  auto iter = [](const std::optional<int>& i) { return i ? fmt::format("{}", *i) : "-"; };
  out += fmt::format("reserved stops growing after iteration: measured {}, simulated {}\n",
                     iter(r.steady_state_measured), iter(r.steady_state_simulated));
  if (r.tolerance_pct) {
    out += fmt::format("tolerance {:.1f}%: {}\n", *r.tolerance_pct,
                       r.failed ? "FAILED (a peak error exceeds it)" : "ok");
  }
  return out;
}

std::string FormatChart(const Report& r, int width, int height) {
  const auto& m = r.chart_measured;
  const auto& s = r.chart_simulated;
  if (m.empty() || width < 8 || height < 4) return "";
  // The vertical axis spans the values shown (not from 0), so differences stay visible.
  Bytes hi = 0, lo = INT64_MAX;
  for (const auto* curve : {&m, &s}) {
    for (Bytes v : *curve) {
      if (v < 0) continue;
      hi = std::max(hi, v);
      lo = std::min(lo, v);
    }
  }
  if (hi <= 0) return "";
  if (hi == lo) lo = 0;
  const double span = static_cast<double>(hi - lo);
  std::vector<std::string> grid(height, std::string(width, ' '));
  auto row_of = [&](Bytes v) {
    return height - 1 -
           static_cast<int>(std::lround(static_cast<double>(v - lo) / span * (height - 1)));
  };
  const size_t n = m.size();
  for (int x = 0; x < width; ++x) {
    // Each column shows the maximum of its share of the points (peaks stay visible).
    const size_t from = n * x / width, to = std::max(from + 1, n * (x + 1) / width);
    Bytes mv = kUnknownBytes, sv = kUnknownBytes;
    for (size_t i = from; i < to && i < n; ++i) {
      mv = std::max(mv, m[i]);
      sv = std::max(sv, s[i]);
    }
    if (sv >= 0) grid[row_of(sv)][x] = 'o';
    if (mv >= 0) {
      char& c = grid[row_of(mv)][x];
      c = c == 'o' ? '#' : '*';
    }
  }
  std::string out = fmt::format("{} MiB: measured '*', simulated 'o', both '#'\n", r.chart_curve);
  for (int y = 0; y < height; ++y) {
    const double level =
        (static_cast<double>(lo) + span * (height - 1 - y) / (height - 1)) / static_cast<double>(kMiB);
    out += fmt::format("{:>9.0f} |{}\n", level, grid[y]);
  }
  out += fmt::format("{:>9} +{}\n", "", std::string(width, '-'));
  out += fmt::format("{:>9}  {}\n", "",
                     r.iterations.empty() ? "time (whole profile)"
                                          : fmt::format("iterations {}..{}, each normalised",
                                                        r.iterations.front().iteration,
                                                        r.iterations.back().iteration));
  return out;
}

std::string FormatJson(const Report& r) {
  std::string out = "{\"schema_version\": 1";
  out += fmt::format(", \"format\": {}, \"pipeline_rank\": {}, \"alignment\": {}",
                     JsonString(r.format), r.pipeline_rank, JsonString(r.alignment));
  out += fmt::format(", \"cumulative_peaks\": {}", r.cumulative_peaks ? "true" : "false");
  out += ", \"iterations\": [";
  for (size_t i = 0; i < r.iterations.size(); ++i) {
    const IterationResult& it = r.iterations[i];
    const auto& c = it.curve_error_pct;
    out += fmt::format(
        "{}{{\"iteration\": {}, \"simulated_iteration\": {}, \"measured\": {}, \"simulated\": {}, "
        "\"error_bytes\": {}, \"error_pct\": {}, \"curve_error_pct\": {}, \"curve_error_pct_by_curve\": "
        "{{\"allocated\": {}, \"reserved\": {}, \"device\": {}}}, \"phase_normalised\": {}}}",
        i == 0 ? "" : ", ", it.iteration, it.simulated_iteration, JsonPeaks(it.measured),
        JsonPeaks(it.simulated), JsonErrorBytes(it.measured, it.simulated), JsonErrors(it.error_pct),
        JsonNumber(c.allocated ? c.allocated : c.reserved ? c.reserved : c.device),
        JsonNumber(c.allocated), JsonNumber(c.reserved), JsonNumber(c.device),
        it.phase_normalised ? "true" : "false");
  }
  out += "]";
  out += fmt::format(", \"steady_state_iteration\": {{\"measured\": {}, \"simulated\": {}}}",
                     JsonNumber(r.steady_state_measured), JsonNumber(r.steady_state_simulated));
  out += fmt::format(
      ", \"overall\": {{\"measured\": {}, \"simulated\": {}, \"error_bytes\": {}, \"error_pct\": {}, "
      "\"curve_error_pct\": {}, \"converged_device_bytes\": {{\"measured\": {}, \"simulated\": {}, "
      "\"error_pct\": {}}}, \"tolerance_pct\": {}, \"failed\": {}}}",
      JsonPeaks(r.overall_measured), JsonPeaks(r.overall_simulated),
      JsonErrorBytes(r.overall_measured, r.overall_simulated), JsonErrors(r.overall_error_pct),
      JsonNumber(r.overall_curve_error_pct), JsonNumber(r.converged_device_measured),
      JsonNumber(r.converged_device_simulated), JsonNumber(r.converged_device_error_pct),
      JsonNumber(r.tolerance_pct), r.failed ? "true" : "false");
  out += ", \"notes\": [";
  for (size_t i = 0; i < r.notes.size(); ++i) {
    out += (i == 0 ? "" : ", ") + JsonString(r.notes[i]);
  }
  out += "]}\n";
  return out;
}

}  // namespace memsim::compare
