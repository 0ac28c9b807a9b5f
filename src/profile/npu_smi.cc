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

// One pass over an npu-smi log: the open table, the chips read in it, one series per chip.
class NpuSmiReader {
 public:
  NpuSmiReader(const std::string& path, const LoadProfileOptions& options)
      : path_(path), options_(options), in_(path) {}

  timeline::Timeline Read() {
    std::string_view line;
    while (in_.Next(&line)) {
      const std::string_view t = Trim(line);
      if (t.empty()) continue;
      if (t[0] != '|' && t[0] != '+') {
        if (auto when = ParseWallClock(t)) {
          pending_time_ = *when;
          have_pending_time_ = true;
        }
        continue;  // prompts, banners of other tools
      }
      if (t[0] == '+') continue;  // borders
      OnRow(t);
    }
    if (row_a_) in_.Fail("truncated npu-smi table: expected the second row of the last device");
    if (in_devices_ && tables_ > 0) EndTable();
    return Finish();
  }

 private:
  // A '|' row of a table.
  void OnRow(std::string_view t) {
    std::vector<std::string_view> cells = Cells(t);
    if (cells.size() == 3 && StartsWith(cells[0], "NPU") && StartsWith(cells[1], "Health")) {
      OpenTable();
      return;
    }
    if (!in_devices_) return;
    if (t.find("Process id") != std::string_view::npos) {
      if (row_a_) in_.Fail("truncated npu-smi table: expected the second row of the last device");
      EndTable();
      return;
    }
    if (cells.size() != 3) return;
    if (!row_a_) {
      row_a_ = std::string(t);
      row_a_line_ = in_.line_number();
      return;
    }
    AddChip(cells[2]);
    row_a_.reset();
  }

  // Header row A was just read; row B follows ("Chip | Bus-Id | AICore(%) Memory-Usage(MB)
  // HBM-Usage(MB)").
  void OpenTable() {
    if (row_a_) {
      throw InputError(fmt::format(
          "{}:{}: truncated npu-smi table: expected the second row of the device on line {}",
          path_, in_.line_number(), row_a_line_));
    }
    if (in_devices_) EndTable();
    table_line_ = in_.line_number();
    std::string_view next;
    if (!in_.Next(&next)) in_.Fail("truncated npu-smi table: expected the second header row");
    has_hbm_ = next.find("HBM-Usage") != std::string_view::npos;
    if (next.find("Memory-Usage") == std::string_view::npos && !has_hbm_) {
      in_.Fail("expected 'Memory-Usage(MB)' or 'HBM-Usage(MB)' in the npu-smi header");
    }
    in_devices_ = true;
    chip_position_ = 0;
    ++tables_;
    if (have_pending_time_) {
      table_time_ = pending_time_;
      timed_ = true;
    } else {
      if (timed_) in_.Fail("expected a timestamp line before this npu-smi table, as before the first");
      table_time_ = static_cast<TimeNs>((tables_ - 1) * options_.nominal_interval_us * 1000.0);
    }
    have_pending_time_ = false;
  }

  // A table ends at its process section, the next table's header or the end of the file; one
  // with no device rows, or fewer than the first table, was cut off.
  void EndTable() {
    if (chip_position_ == 0) {
      throw InputError(fmt::format("{}:{}: truncated npu-smi table: no device rows after its header",
                                   path_, table_line_));
    }
    if (first_table_chips_ < 0) first_table_chips_ = chip_position_;
    if (chip_position_ < first_table_chips_) {
      throw InputError(fmt::format(
          "{}:{}: truncated npu-smi table: {} device(s), expected {} as in the first table", path_,
          table_line_, chip_position_, first_table_chips_));
    }
    in_devices_ = false;
  }

  // Row B: chip id [phy-id] | bus-id | aicore  mem_used / mem_total [hbm_used / hbm_total];
  // `memory` is its third cell.
  void AddChip(std::string_view memory) {
    std::string cell(memory);
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (std::sregex_iterator m(cell.begin(), cell.end(), pair_re_), end; m != end; ++m) {
      const auto used = ParseInt((*m)[1].str()), total = ParseInt((*m)[2].str());
      if (!used || !total || !ToBytes(*total, kMiB)) {
        in_.Fail(fmt::format("expected '<used> / <total>' MB below 2^42 in '{}'", memory));
      }
      pairs.emplace_back(*used, *total);
    }
    if (pairs.empty()) {
      in_.Fail(fmt::format("expected '<used> / <total>' memory figures in '{}'", memory));
    }
    const auto [used_mib, total_mib] = has_hbm_ ? pairs.back() : pairs.front();
    if (used_mib > total_mib) {
      in_.Fail(fmt::format("memory used {} MB exceeds the total {} MB", used_mib, total_mib));
    }
    timeline::Sample s;
    s.device_bytes = used_mib * kMiB;  // used <= total, and total x 2^20 fits (checked above)
    auto [b, inserted] = builders_.try_emplace(chip_position_, options_.max_samples);
    b->second.Add(table_time_, s);
    ++chip_position_;
  }

  // The chosen device's series (options.device_index, else the first).
  timeline::Timeline Finish() {
    if (tables_ == 0) {
      if (in_.line_number() == 0) in_.Fail("empty file, expected npu-smi info output");
      in_.Fail("no npu-smi device table ('| NPU   Name | Health | ...'), expected npu-smi info output");
    }
    if (builders_.empty()) in_.Fail("no device rows in the npu-smi tables");
    int device = builders_.begin()->first;
    if (options_.device_index >= 0) {
      if (!builders_.count(options_.device_index)) {
        throw InputError(fmt::format("{}: no samples for device {} (devices in the file: 0-{})",
                                     path_, options_.device_index, builders_.rbegin()->first));
      }
      device = options_.device_index;
    }
    timeline::Timeline out = builders_.at(device).Finish({}, Format::kNpuSmi);
    out.device_index = device;
    out.notes.push_back(fmt::format("device {} of {} ({}), {} tables{}", device, builders_.size(),
                                    has_hbm_ ? "HBM-Usage" : "Memory-Usage", tables_,
                                    timed_ ? "" : ", no timestamps: tables 1 nominal interval apart"));
    return out;
  }

  const std::string& path_;
  const LoadProfileOptions& options_;
  LineReader in_;
  const std::regex pair_re_{R"((\d+)\s*/\s*(\d+))"};
  std::map<int, SeriesBuilder> builders_;  // by chip position
  bool have_pending_time_ = false;         // a timestamp line waiting for its table
  TimeNs pending_time_ = 0;
  TimeNs table_time_ = 0;
  int tables_ = 0;
  bool timed_ = false;
  bool in_devices_ = false, has_hbm_ = false;
  int chip_position_ = 0;
  std::optional<std::string> row_a_;  // first row of a device pair
  int64_t row_a_line_ = 0;
  int64_t table_line_ = 0;  // line of the open table's header
  int first_table_chips_ = -1;
};

}  // namespace

timeline::Timeline LoadNpuSmi(const std::string& path, const LoadProfileOptions& options) {
  return NpuSmiReader(path, options).Read();
}

}  // namespace memsim::profile::internal
