#include "report/format.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/core.h>

#include "core/error.h"

namespace memsim::report {

std::string GiB(Bytes bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB); }

std::string SignedGiB(Bytes bytes) {
  const double v = static_cast<double>(bytes) / kGiB;
  if (fmt::format("{:.2f}", v) == "0.00" || fmt::format("{:.2f}", v) == "-0.00") return "0.00";
  return fmt::format("{:+.2f}", v);
}

std::string SignedHuman(Bytes bytes) {
  if (bytes == 0) return "0 B";
  return (bytes > 0 ? "+" : "") + HumanBytes(bytes);
}

std::string MiB(Bytes bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kMiB); }

std::string HumanBytes(Bytes bytes) {
  const Bytes a = bytes < 0 ? -bytes : bytes;
  if (a >= kGiB) return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB);
  if (a >= kMiB) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / kMiB);
  if (a >= kKiB) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / kKiB);
  return fmt::format("{} B", bytes);
}

void WriteFileAtomically(const std::string& path, std::string_view content) {
  if (path == "-") {
    std::fwrite(content.data(), 1, content.size(), stdout);
    std::fflush(stdout);
    return;
  }
  const std::string tmp = path + ".tmp-memsim";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    throw InputError(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  }
  const bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw InputError(fmt::format("{}: cannot write: {}", path, std::strerror(err)));
  }
}

}  // namespace memsim::report
