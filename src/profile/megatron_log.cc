// Megatron-LM report_memory lines (megatron/training/utils.py report_memory;
// docs/profile-formats.md, 'Megatron report_memory'):
//   [Rank 0] (after 10 iterations) memory (MB) | allocated: 21874.33 | max allocated: 47210.91 |
//   reserved: 50112.00 | max reserved: 50112.00[ | total device memory used: 51200.00]
// "MB" is MiB (Megatron divides by 1024*1024). Only "(after N iterations)" reports become samples
// (iteration N, the end of training iteration N in memsim's 1-based numbering); checkpoint
// reports are skipped and counted. The log has no clock: sample time is N x nominal interval.
// "max allocated" / "max reserved" are peaks since the process started: they go to
// Timeline::reported_peaks, never into the samples.
// Three more kinds of line say what the run was (Timeline::statements, for compare's diagnosis):
//   training.py training_log:   " iteration  10/  10 | ... | number of skipped iterations:  10 |"
//   training.py get_model:      " > number of parameters on (tensor, pipeline) model parallel
//                                 rank (0, 0): 124439808" (releases since NVIDIA/Megatron-LM
//                                 #4967 name three ranks: (tensor, gtp_weight_remat, pipeline))
//   theoretical_memory_usage.py report_theoretical_memory: "Theoretical memory footprints:
//                                 weight and optimizer=2121.85 MB, activation=... MB, total=... MB"
#include <map>
#include <set>

#include <fmt/core.h>

#include "core/error.h"
#include "profile/importers.h"
#include "profile/reader.h"

namespace memsim::profile::internal {
namespace {

struct Report {
  double allocated_mib = 0, max_allocated_mib = 0, reserved_mib = 0, max_reserved_mib = 0;
  std::optional<double> device_mib;
};

// Reads "<key>: <number>" at *pos (after optional spaces), advancing past it. A number that is
// not a byte count in range (core/checked.h) fails the line.
bool ReadField(const LineReader& in, std::string_view line, size_t* pos, std::string_view key,
               double* value) {
  std::string_view rest = line.substr(*pos);
  const std::string_view bar = "| ";
  if (!StartsWith(rest, bar)) return false;
  rest.remove_prefix(bar.size());
  if (!StartsWith(rest, key) || !StartsWith(rest.substr(key.size()), ": ")) return false;
  rest.remove_prefix(key.size() + 2);
  const size_t end = rest.find(' ');
  auto v = ParseDouble(rest.substr(0, end));
  if (!v || *v < 0) return false;
  if (!MiBToBytes(*v)) {
    in.Fail(fmt::format("{}: expected MiB below 2^42, got '{}'", key, rest.substr(0, end)));
  }
  *value = *v;
  *pos = end == std::string_view::npos ? line.size() : line.size() - rest.size() + end + 1;
  return true;
}

// The integer after `key` (spaces allowed before it), or nullopt.
std::optional<int64_t> IntAfter(std::string_view line, std::string_view key) {
  const size_t k = line.find(key);
  if (k == std::string_view::npos) return std::nullopt;
  std::string_view rest = Trim(line.substr(k + key.size()));
  size_t end = 0;
  while (end < rest.size() && rest[end] >= '0' && rest[end] <= '9') ++end;
  return ParseInt(rest.substr(0, end));
}

// The MiB figure after `key` ("weight and optimizer=2121.85 MB"), or nullopt.
std::optional<double> MiBAfter(std::string_view line, std::string_view key) {
  const size_t k = line.find(key);
  if (k == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(k + key.size());
  const size_t end = rest.find(" MB");
  if (end == std::string_view::npos) return std::nullopt;
  auto v = ParseDouble(rest.substr(0, end));
  if (!v || *v < 0) return std::nullopt;
  return v;
}

// Reads the lines that say what the run was into `st`; returns true iff `line` was one of them.
// A recognised line with a malformed number fails the load (naming the line).
bool ReadStatement(const LineReader& in, std::string_view line, timeline::LogStatements* st) {
  if (line.find("number of skipped iterations:") != std::string_view::npos) {
    auto skipped = IntAfter(line, "number of skipped iterations:");
    if (!skipped || *skipped < 0) in.Fail("expected 'number of skipped iterations: <integer>'");
    st->skipped_iterations = static_cast<int>(st->skipped_iterations.value_or(0) + *skipped);
    if (auto it = IntAfter(line, " iteration "); it && *it >= 0) {
      st->last_logged_iteration = static_cast<int>(*it);
    }
    return true;
  }
  const std::string_view params = "number of parameters on (";
  if (const size_t p = line.find(params); p != std::string_view::npos) {
    const std::string_view fail =
        "expected ' > number of parameters on (tensor, pipeline) model parallel rank (t, p): N'";
    const size_t open = line.find("rank (", p);
    const size_t close = open == std::string_view::npos ? open : line.find("): ", open);
    if (close == std::string_view::npos) in.Fail(fail);
    std::vector<int64_t> ranks;
    std::string_view list = line.substr(open + 6, close - open - 6);
    while (!list.empty()) {
      const size_t comma = list.find(',');
      auto v = ParseInt(Trim(list.substr(0, comma)));
      if (!v || *v < 0) in.Fail(fail);
      ranks.push_back(*v);
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
    auto count = ParseInt(Trim(line.substr(close + 3)));
    if (ranks.size() < 2 || !count || *count < 0) in.Fail(fail);
    st->parameters.push_back({static_cast<int>(ranks.front()), static_cast<int>(ranks.back()), *count});
    return true;
  }
  if (line.find("Theoretical memory footprints: ") != std::string_view::npos) {
    auto weight = MiBAfter(line, "weight and optimizer=");
    auto activation = MiBAfter(line, "activation=");
    if (!weight) {
      in.Fail("expected 'Theoretical memory footprints: weight and optimizer=<MB> MB, ...'");
    }
    st->theoretical_weight_and_optimizer_bytes = MiBToBytes(*weight);
    if (activation) st->theoretical_activation_bytes = MiBToBytes(*activation);
    return true;
  }
  return false;
}

// One report_memory line: its rank, and the iteration it was made after (none for the other
// reports, at checkpoints).
struct ReportLine {
  int rank = 0;
  std::optional<int> iteration;
  Report report;
};

// Reads the report_memory line `line` whose " memory (MB) | " starts at `at`.
ReportLine ReadReportLine(const LineReader& in, std::string_view line, size_t at,
                          std::string_view anchor) {
  ReportLine out;
  // Rank: "[Rank N]" before the name; absent on some forks (then rank 0).
  std::string_view head = line.substr(0, at);
  const size_t r = head.find("[Rank ");
  if (r != std::string_view::npos) {
    const size_t close = head.find(']', r);
    auto v = close == std::string_view::npos ? std::nullopt
                                              : ParseInt(head.substr(r + 6, close - r - 6));
    if (!v || *v < 0) in.Fail("expected '[Rank <integer>]' before the memory report");
    out.rank = static_cast<int>(*v);
    head = head.substr(close + 1);
  }
  Report& rep = out.report;
  size_t pos = at + anchor.size() - 2;  // at "| allocated"
  double device = 0;
  if (!ReadField(in, line, &pos, "allocated", &rep.allocated_mib) ||
      !ReadField(in, line, &pos, "max allocated", &rep.max_allocated_mib) ||
      !ReadField(in, line, &pos, "reserved", &rep.reserved_mib) ||
      !ReadField(in, line, &pos, "max reserved", &rep.max_reserved_mib)) {
    in.Fail(
        "expected 'memory (MB) | allocated: <MiB> | max allocated: <MiB> | reserved: <MiB> | "
        "max reserved: <MiB>'");
  }
  if (pos < line.size() && ReadField(in, line, &pos, "total device memory used", &device)) {
    rep.device_mib = device;
  }
  // "(after N iterations)"
  head = Trim(head);
  const std::string_view after = "(after ";
  const size_t a = head.find(after);
  const size_t it_end = head.find(" iterations)");
  if (a == std::string_view::npos || it_end == std::string_view::npos || it_end < a) return out;
  auto iteration = ParseInt(head.substr(a + after.size(), it_end - a - after.size()));
  if (!iteration || *iteration < 0 || *iteration > 1'000'000'000) {
    in.Fail("expected '(after <integer> iterations)' before 'memory (MB)'");
  }
  out.iteration = static_cast<int>(*iteration);
  return out;
}

// One rank's reports (by iteration) as samples at iteration x the nominal interval, and the
// peaks since the process started that they print.
timeline::Timeline RankTimeline(const std::map<int, Report>& reports,
                                const LoadProfileOptions& options) {
  SeriesBuilder series(options.max_samples);
  std::vector<timeline::ReportedPeak> peaks;
  for (const auto& [iteration, rep] : reports) {
    timeline::Sample s;
    s.iteration = iteration;
    // ReadField checked every value.
    s.allocated_bytes = MiBToBytes(rep.allocated_mib).value();
    s.reserved_bytes = MiBToBytes(rep.reserved_mib).value();
    if (rep.device_mib) s.device_bytes = MiBToBytes(*rep.device_mib).value();
    const TimeNs t = static_cast<TimeNs>(iteration * options.nominal_interval_us * 1000.0);
    series.Add(t, s);
    peaks.push_back({iteration, MiBToBytes(rep.max_allocated_mib).value(),
                     MiBToBytes(rep.max_reserved_mib).value()});
  }
  timeline::Timeline out = series.Finish({}, Format::kMegatronLog);
  for (timeline::Sample& s : out.samples) {
    s.time_us = s.iteration * options.nominal_interval_us;  // keep the nominal clock absolute
  }
  out.reported_peaks = std::move(peaks);
  return out;
}

}  // namespace

timeline::Timeline LoadMegatronLog(const std::string& path, const LoadProfileOptions& options) {
  LineReader in(path);
  // rank -> iteration -> report (ordered: deterministic).
  std::map<int, std::map<int, Report>> reports;
  int skipped_other = 0;
  std::string_view line;
  const std::string_view anchor = " memory (MB) | ";
  timeline::LogStatements statements;
  while (in.Next(&line)) {
    if (ReadStatement(in, line, &statements)) continue;
    const size_t at = line.find(anchor);
    if (at == std::string_view::npos) continue;
    const ReportLine report = ReadReportLine(in, line, at, anchor);
    if (!report.iteration) {
      ++skipped_other;
      continue;
    }
    reports[report.rank][*report.iteration] = report.report;
  }
  if (reports.empty()) {
    if (in.line_number() == 0) in.Fail("empty file, expected Megatron report_memory lines");
    in.Fail(
        "no '(after N iterations) memory (MB) | allocated: ...' line, expected Megatron "
        "report_memory output");
  }
  int rank = reports.begin()->first;
  if (options.rank >= 0) {
    if (!reports.count(options.rank)) {
      std::string seen;
      for (const auto& [k, v] : reports) seen += fmt::format("{}{}", seen.empty() ? "" : ", ", k);
      throw InputError(fmt::format("{}: no report_memory lines for rank {} (ranks in the file: {})",
                                   path, options.rank, seen));
    }
    rank = options.rank;
  }
  timeline::Timeline out = RankTimeline(reports[rank], options);
  out.statements = std::move(statements);
  out.device_index = rank;
  out.notes.push_back(fmt::format(
      "rank {} ({} report_memory lines; no clock: iteration N placed at N x {} us)", rank,
      reports[rank].size(), options.nominal_interval_us));
  if (reports.size() > 1) {
    out.notes.push_back(fmt::format("{} ranks in the log; --rank picks another",
                                    reports.size()));
  }
  if (skipped_other > 0) {
    out.notes.push_back(fmt::format("skipped {} reports not made after an iteration", skipped_other));
  }
  return out;
}

}  // namespace memsim::profile::internal
