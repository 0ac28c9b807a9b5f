#include "core/read_file.h"

#include <fmt/core.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace memsim {

std::optional<std::string> ReadBoundedFile(const std::string& path, std::string_view label,
                                           std::int64_t max_bytes, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text;
  char block[1 << 16];
  while (in.read(block, sizeof block) || in.gcount() > 0) {
    text.append(block, static_cast<std::size_t>(in.gcount()));
    if (static_cast<std::int64_t>(text.size()) > max_bytes) {
      throw InputError(fmt::format("{}: larger than memsim's limit of {} bytes ({} MiB) for {}",
                                   label, max_bytes, max_bytes >> 20, what));
    }
  }
  if (in.bad()) return std::nullopt;
  return text;
}

}  // namespace memsim
