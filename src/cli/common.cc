#include "cli/common.h"

#include <charconv>
#include <cstdlib>

#include <fmt/core.h>

#include "core/error.h"
#include "core/size.h"

namespace memsim::cli {

Bytes ParseSizeArg(std::string_view text, std::string_view option) {
  return ParseSize(text, option);
}

double ParsePercentArg(std::string_view text, std::string_view option) {
  std::string s(text);
  if (!s.empty() && s.back() == '%') s.pop_back();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0.0) || v >= 100.0) {
    throw InputError(fmt::format("{} {}: expected a percentage in [0, 100), e.g. 5 or 5%", option, text));
  }
  return v;
}

std::optional<int> CheckPipelineRank(int rank, const config::Setup& setup) {
  if (rank == -1) return std::nullopt;
  const int p = setup.training.pipeline_model_parallel_size;
  if (rank < 0 || rank >= p) {
    throw InputError(fmt::format("--pipeline-rank {}: expected 0..{} (pipeline_model_parallel_size {})",
                                 rank, p - 1, p));
  }
  return rank;
}

int TerminalWidth(int requested) {
  if (requested > 0) return std::max(40, requested);
  if (const char* c = std::getenv("COLUMNS")) {
    int v = 0;
    const std::string_view s(c);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size() && v >= 40) return v;
  }
  return 80;
}

std::string FormatVerboseNotes(const config::Setup& setup) {
  std::string out;
  for (const std::string& note : setup.notes) out += "  note: " + note + "\n";
  return out;
}

}  // namespace memsim::cli
