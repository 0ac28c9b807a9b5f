#include "core/read_file.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace memsim {
namespace {

constexpr std::size_t kBinaryProbeBytes = 4096;

}  // namespace

std::optional<std::string> ReadBoundedFile(const std::string& path, std::string_view label,
                                           std::int64_t max_bytes, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text;
  char block[1 << 16];
  while (in.read(block, sizeof block) || in.gcount() > 0) {
    const auto n = static_cast<std::size_t>(in.gcount());
    // A NUL byte in the first 4 KiB: binary data (or /dev/zero), refused at once instead of
    // read up to the size bound; no text memsim reads (JSON, a shell script, a log) starts so. A
    // NUL later on is left to the parser (a crashed job's log can end in NUL padding).
    if (text.size() < kBinaryProbeBytes) {
      const std::size_t probe = std::min(n, kBinaryProbeBytes - text.size());
      if (const void* nul = std::memchr(block, '\0', probe); nul != nullptr) {
        const std::size_t at =
            text.size() + static_cast<std::size_t>(static_cast<const char*>(nul) - block);
        throw InputError(
            fmt::format("{}: binary data (a NUL byte at byte {}), not {}", label, at, what));
      }
    }
    text.append(block, n);
    if (static_cast<std::int64_t>(text.size()) > max_bytes) {
      throw InputError(fmt::format("{}: larger than memsim's limit of {} bytes ({} MiB) for {}",
                                   label, max_bytes, max_bytes >> 20, what));
    }
  }
  if (in.bad()) return std::nullopt;
  return text;
}

std::string WhyUnreadable(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "a directory, not a file";
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::strerror(errno);
  std::fclose(f);
  return "a read error";
}

}  // namespace memsim
