// Repeated `npu-smi info` output (docs/profile-formats.md, 'npu-smi info'), optionally with a
// timestamp line before each table (e.g. `while true; do date; npu-smi info; sleep 1; done`). Each
// table is one sample per chip. Device rows come in pairs of three '|'-separated cells; the header
// pair says whether an HBM-Usage(MB) column exists: then the last "used / total" pair of row B is
// HBM, else the first (Memory-Usage, 310P/310B DDR). "MB" is MiB (64 GiB HBM prints as 65536).
// Device index = position of the chip in the table (0-based): the NPU id for single-chip cards; on
// A3 (two chips per NPU) NPU n chip c is device 2n+c. Tables without a timestamp line are spaced by
// the nominal interval.
#include <map>
#include <regex>

#include <fmt/core.h>

#include "core/error.h"
#include "profile/clock.h"
#include "profile/importers.h"
#include "profile/reader.h"

namespace memsim::profile::internal {
namespace {

std::vector<std::string_view> Cells(std::string_view line) {
  std::vector<std::string_view> cells;
  // "| a | b | c |" -> a, b, c
  size_t p = 1;
  while (p < line.size()) {
    const size_t bar = line.find('|', p);
    if (bar == std::string_view::npos) break;
    cells.push_back(Trim(line.substr(p, bar - p)));
    p = bar + 1;
  }
  return cells;
}

}  // namespace

timeline::Timeline LoadNpuSmi(const std::string& path, const LoadProfileOptions& options) {
  LineReader in(path);
  std::map<int, SeriesBuilder> builders;
  bool have_pending_time = false;  // a timestamp line waiting for its table
  TimeNs pending_time = 0;
  TimeNs table_time = 0;
  int tables = 0;
  bool timed = false;
  bool in_devices = false, has_hbm = false;
  int chip_position = 0;
  std::optional<std::string> row_a;  // first row of a device pair
  int64_t row_a_line = 0;
  int64_t table_line = 0;  // line of the open table's header
  int first_table_chips = -1;
  // A table ends at its process section, the next table's header or the end of the file; one
  // with no device rows, or fewer than the first table, was cut off.
  auto end_table = [&]() {
    if (chip_position == 0) {
      throw InputError(fmt::format("{}:{}: truncated npu-smi table: no device rows after its header",
                                   path, table_line));
    }
    if (first_table_chips < 0) first_table_chips = chip_position;
    if (chip_position < first_table_chips) {
      throw InputError(fmt::format(
          "{}:{}: truncated npu-smi table: {} device(s), expected {} as in the first table", path,
          table_line, chip_position, first_table_chips));
    }
    in_devices = false;
  };
  const std::regex pair_re(R"((\d+)\s*/\s*(\d+))");
  std::string_view line;
  while (in.Next(&line)) {
    const std::string_view t = Trim(line);
    if (t.empty()) continue;
    if (t[0] != '|' && t[0] != '+') {
      if (auto when = ParseWallClock(t)) {
        pending_time = *when;
        have_pending_time = true;
      }
      continue;  // prompts, banners of other tools
    }
    if (t[0] == '+') continue;  // borders
    std::vector<std::string_view> cells = Cells(t);
    if (cells.size() == 3 && StartsWith(cells[0], "NPU") && StartsWith(cells[1], "Health")) {
      if (row_a) {
        throw InputError(fmt::format(
            "{}:{}: truncated npu-smi table: expected the second row of the device on line {}",
            path, in.line_number(), row_a_line));
      }
      if (in_devices) end_table();
      table_line = in.line_number();
      // Header row A; row B follows ("Chip | Bus-Id | AICore(%) Memory-Usage(MB) HBM-Usage(MB)").
      std::string_view next;
      if (!in.Next(&next)) in.Fail("truncated npu-smi table: expected the second header row");
      has_hbm = next.find("HBM-Usage") != std::string_view::npos;
      if (next.find("Memory-Usage") == std::string_view::npos && !has_hbm) {
        in.Fail("expected 'Memory-Usage(MB)' or 'HBM-Usage(MB)' in the npu-smi header");
      }
      in_devices = true;
      chip_position = 0;
      ++tables;
      if (have_pending_time) {
        table_time = pending_time;
        timed = true;
      } else {
        if (timed) in.Fail("expected a timestamp line before this npu-smi table, as before the first");
        table_time = static_cast<TimeNs>((tables - 1) * options.nominal_interval_us * 1000.0);
      }
      have_pending_time = false;
      continue;
    }
    if (!in_devices) continue;
    if (t.find("Process id") != std::string_view::npos) {
      if (row_a) in.Fail("truncated npu-smi table: expected the second row of the last device");
      end_table();
      continue;
    }
    if (cells.size() != 3) continue;
    if (!row_a) {
      row_a = std::string(t);
      row_a_line = in.line_number();
      continue;
    }
    // Row B: chip id [phy-id] | bus-id | aicore  mem_used / mem_total [hbm_used / hbm_total]
    std::string cell(cells[2]);
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (std::sregex_iterator m(cell.begin(), cell.end(), pair_re), end; m != end; ++m) {
      const auto used = ParseInt((*m)[1].str()), total = ParseInt((*m)[2].str());
      if (!used || !total || !ToBytes(*total, kMiB)) {
        in.Fail(fmt::format("expected '<used> / <total>' MB below 2^42 in '{}'", cells[2]));
      }
      pairs.emplace_back(*used, *total);
    }
    if (pairs.empty()) {
      in.Fail(fmt::format("expected '<used> / <total>' memory figures in '{}'", cells[2]));
    }
    const auto [used_mib, total_mib] = has_hbm ? pairs.back() : pairs.front();
    if (used_mib > total_mib) {
      in.Fail(fmt::format("memory used {} MB exceeds the total {} MB", used_mib, total_mib));
    }
    timeline::Sample s;
    s.device_bytes = used_mib * kMiB;  // used <= total, and total x 2^20 fits (checked above)
    auto [b, inserted] = builders.try_emplace(chip_position, options.max_samples);
    b->second.Add(table_time, s);
    ++chip_position;
    row_a.reset();
  }
  if (row_a) in.Fail("truncated npu-smi table: expected the second row of the last device");
  if (in_devices && tables > 0) end_table();
  if (tables == 0) {
    if (in.line_number() == 0) in.Fail("empty file, expected npu-smi info output");
    in.Fail("no npu-smi device table ('| NPU   Name | Health | ...'), expected npu-smi info output");
  }
  if (builders.empty()) in.Fail("no device rows in the npu-smi tables");
  int device = builders.begin()->first;
  if (options.device_index >= 0) {
    if (!builders.count(options.device_index)) {
      throw InputError(fmt::format("{}: no samples for device {} (devices in the file: 0-{})",
                                   path, options.device_index, builders.rbegin()->first));
    }
    device = options.device_index;
  }
  timeline::Timeline out = builders.at(device).Finish({}, Format::kNpuSmi);
  out.device_index = device;
  out.notes.push_back(fmt::format("device {} of {} ({}), {} tables{}", device, builders.size(),
                                  has_hbm ? "HBM-Usage" : "Memory-Usage", tables,
                                  timed ? "" : ", no timestamps: tables 1 nominal interval apart"));
  return out;
}

}  // namespace memsim::profile::internal
