// memsim-csv (docs/interfaces.md, 'CSV timeline'): time_us,iteration,phase,allocated_bytes,
// reserved_bytes,active_bytes,device_bytes; written by `memsim run --csv` and by
// tools/record_profile.py (docs/profiles.md). Columns are matched by name (any order; only
// time_us and one byte column are required); an empty field is a value the recorder could not
// know; '#' lines are comments.
#include <array>
#include <optional>

#include <fmt/core.h>

#include "core/error.h"
#include "profile/importers.h"
#include "profile/reader.h"

namespace memsim::profile::internal {
namespace {

constexpr std::array<std::string_view, 7> kColumns = {
    "time_us",        "iteration",    "phase",       "allocated_bytes",
    "reserved_bytes", "active_bytes", "device_bytes"};

// Markers where the iteration or the phase changes (the file holds no separate markers).
void AddIterationAndPhaseMarkers(timeline::Timeline& out) {
  int last_iteration = -2;
  Phase last_phase = Phase::kUnknown;
  for (const timeline::Sample& s : out.samples) {
    if (s.iteration != last_iteration) {
      out.markers.push_back({s.time_us, s.iteration, Phase::kUnknown,
                             fmt::format("iteration {}", s.iteration)});
      last_phase = Phase::kUnknown;
    }
    if (s.phase != last_phase && s.phase != Phase::kUnknown) {
      out.markers.push_back({s.time_us, s.iteration, s.phase, std::string(PhaseName(s.phase))});
    }
    last_iteration = s.iteration;
    last_phase = s.phase;
  }
}

}  // namespace

timeline::Timeline LoadMemsimCsv(const std::string& path, const LoadProfileOptions& options) {
  LineReader in(path);
  SeriesBuilder series(options.max_samples);
  std::array<int, 7> column{};
  column.fill(-1);
  size_t num_fields = 0;
  bool have_header = false;
  std::string_view line;
  while (in.Next(&line)) {
    if (Trim(line).empty() || Trim(line)[0] == '#') continue;
    std::vector<std::string> f = SplitCsv(line);
    if (!have_header) {
      for (size_t i = 0; i < f.size(); ++i) {
        for (size_t c = 0; c < kColumns.size(); ++c) {
          if (f[i] == kColumns[c]) column[c] = static_cast<int>(i);
        }
      }
      if (column[0] < 0 || (column[3] < 0 && column[4] < 0 && column[5] < 0 && column[6] < 0)) {
        in.Fail(
            "expected the memsim-csv header "
            "'time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes'");
      }
      num_fields = f.size();
      have_header = true;
      continue;
    }
    if (f.size() != num_fields) {
      in.Fail(fmt::format("expected {} fields as in the header, got {}", num_fields, f.size()));
    }
    auto field = [&](int c) -> std::string_view {
      return column[c] < 0 ? std::string_view{} : std::string_view(f[column[c]]);
    };
    timeline::Sample s;
    auto t = ParseMicrosToNs(field(0));
    if (!t) {
      in.Fail(fmt::format("time_us: expected a number of microseconds within +-2^62 ns, got '{}'",
                          field(0)));
    }
    if (!field(1).empty()) {
      auto v = ParseInt(field(1));
      if (!v || *v < -1 || *v > 1'000'000'000) {
        in.Fail(fmt::format("iteration: expected an integer from -1 to 10^9, got '{}'", field(1)));
      }
      s.iteration = static_cast<int>(*v);
    }
    if (!field(2).empty()) {
      auto p = PhaseFromName(field(2));
      if (!p) {
        in.Fail(fmt::format(
            "phase: expected init, forward, backward, optimizer_step or unknown, got '{}'",
            field(2)));
      }
      s.phase = *p;
    }
    Bytes* targets[4] = {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.device_bytes};
    for (int c = 3; c < 7; ++c) {
      if (field(c).empty()) continue;
      auto v = ParseInt(field(c));
      if (!v || *v < 0) {
        in.Fail(fmt::format("{}: expected a non-negative integer number of bytes, got '{}'",
                            kColumns[c], field(c)));
      }
      *targets[c - 3] = *v;
    }
    series.Add(*t, s);
  }
  if (!have_header) in.Fail("empty file, expected the memsim-csv header and samples");
  if (series.size() == 0) in.Fail("no samples after the header, expected at least one row");
  timeline::Timeline out = series.Finish({}, Format::kMemsimCsv);
  AddIterationAndPhaseMarkers(out);
  return out;
}

}  // namespace memsim::profile::internal
