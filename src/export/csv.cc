#include <fmt/format.h>

#include <iterator>

#include "export/exports.h"

namespace memsim::exports {

std::string CategoryCsvHeader() {
  std::string out =
      "time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes";
  for (int c = 0; c < kNumCategories; ++c) {
    out += fmt::format(",{}_bytes", CategoryName(static_cast<Category>(c)));
  }
  out += "\n";
  return out;
}

void AppendCategoryCsvRow(std::string& out, const CategorySample& s) {
  fmt::memory_buffer row;  // on the stack up to 500 characters; appended to `out` at once
  auto it = std::back_inserter(row);
  fmt::format_to(it, "{:.3f},{},{},{},{},{},{}", s.time_us, s.iteration, PhaseName(s.phase),
                 s.allocated_bytes, s.reserved_bytes, s.active_bytes, s.device_bytes);
  for (std::int64_t b : s.by_category) fmt::format_to(it, ",{}", b);
  row.push_back('\n');
  out.append(row.data(), row.size());
}

std::string CategoryCsv(const RunDetail& detail) {
  std::string out = CategoryCsvHeader();
  for (const CategorySample& s : detail.samples) AppendCategoryCsvRow(out, s);
  return out;
}

}  // namespace memsim::exports
