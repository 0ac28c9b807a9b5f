#include "report/format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

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

namespace {

bool IsSpecialFile(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  return !ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
         !std::filesystem::is_directory(status);
}

std::string CannotWrite(const std::string& path, int err) {
  return fmt::format("{}: cannot write: {}", path, std::strerror(err));
}

bool IsFifo(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// Output device files opened by OpenInPlace before the work, kept open until written (so a pipe's
// reader, once found, is not sent an end of file by a probe closing it).
std::map<std::string, std::FILE*>& HeldOpen() {
  static std::map<std::string, std::FILE*> held;
  return held;
}

// Opens an existing device file or pipe for writing without ever blocking: a named pipe with no
// reader would block open(2) forever (fifo(7)); O_NONBLOCK makes that ENXIO instead, after which
// the descriptor is made blocking again for the writes. Throws InputError naming `path`.
std::FILE* OpenInPlace(const std::string& path) {
  auto it = HeldOpen().find(path);
  if (it != HeldOpen().end()) {
    std::FILE* f = it->second;
    HeldOpen().erase(it);
    return f;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENXIO && IsFifo(path)) {
      throw InputError(fmt::format(
          "{}: cannot write: a named pipe (FIFO) with no reader; start its reader first or "
          "choose a regular file",
          path));
    }
    throw InputError(CannotWrite(path, errno));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  std::FILE* f = flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0
                     ? nullptr
                     : ::fdopen(fd, "wb");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    throw InputError(CannotWrite(path, err));
  }
  return f;
}

// Writes `content` to `path` directly (stdout, or a device / pipe that must not be replaced).
void WriteInPlace(const std::string& path, std::string_view content) {
  std::FILE* f = path == "-" ? stdout : OpenInPlace(path);
  const bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  const int write_err = errno;
  const bool closed = path == "-" ? std::fflush(f) == 0 : std::fclose(f) == 0;
  if (!ok || !closed) throw InputError(CannotWrite(path, ok ? errno : write_err));
}

// Writes the temporary file of `path`; returns its name. Throws InputError naming `path`.
std::string WriteTemporary(const std::string& path, std::string_view content) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(fmt::format("{}: cannot write: is a directory", path));
  }
  const std::string tmp = path + ".tmp-memsim";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw InputError(CannotWrite(path, errno));
  const bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw InputError(CannotWrite(path, err));
  }
  return tmp;
}

}  // namespace

void WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files) {
  WriteFilesAtomically(files, {});
}

StreamedFile::StreamedFile(std::string path) : path_(std::move(path)) {
  if (path_ == "-") return;
  std::error_code ec;
  if (std::filesystem::is_directory(path_, ec)) {
    throw InputError(fmt::format("{}: cannot write: is a directory", path_));
  }
  if (!IsSpecialFile(path_)) {
    static int counter = 0;
    tmp_ = fmt::format("{}.tmp-memsim-{}", path_, ++counter);
  }
  if (tmp_.empty()) {
    f_ = OpenInPlace(path_);
    return;
  }
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (f_ == nullptr) throw InputError(CannotWrite(path_, errno));
}

StreamedFile::~StreamedFile() {
  if (f_ != nullptr) std::fclose(f_);
  if (!committed_ && !tmp_.empty()) std::remove(tmp_.c_str());
}

void StreamedFile::Append(std::string_view text) {
  if (path_ == "-") {
    held_.append(text);
  } else if (error_ == 0 && std::fwrite(text.data(), 1, text.size(), f_) != text.size()) {
    error_ = errno;
  }
}

void StreamedFile::Close() {
  if (f_ == nullptr) return;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (error_ == 0 && !closed) error_ = errno;
  if (error_ != 0) throw InputError(CannotWrite(path_, error_));
}

namespace {

// "; not written either: a.json, b.csv" for the regular files among `targets` other than
// `failed` (a failure leaves every one of them unwritten), or "".
std::string NotWritten(const std::vector<std::string>& targets, const std::string& failed) {
  std::string names;
  for (const std::string& path : targets) {
    if (path == failed || path == "-" || IsSpecialFile(path)) continue;
    names += (names.empty() ? "" : ", ") + path;
  }
  return names.empty() ? "" : fmt::format("; not written either: {}", names);
}

}  // namespace

void WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files,
                          const std::vector<StreamedFile*>& streamed) {
  std::vector<std::string> targets;
  for (const auto& [path, content] : files) targets.push_back(path);
  for (const StreamedFile* f : streamed) targets.push_back(f->path());
  for (size_t i = 0; i < targets.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (targets[i] == targets[j] && targets[i] != "-" && !IsSpecialFile(targets[i])) {
        throw InputError(fmt::format("{}: named for two outputs", targets[i]));
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> staged;  // temporary, target
  // The output being written when a write fails (the message names it first).
  std::string current;
  try {
    for (const auto& [path, content] : files) {
      if (path == "-" || IsSpecialFile(path)) continue;
      current = path;
      staged.emplace_back(WriteTemporary(path, content), path);
    }
    // A streamed output written in place (a device, a pipe) reports its write errors here.
    for (StreamedFile* f : streamed) {
      current = f->path();
      f->Close();
      if (!f->tmp_.empty()) staged.emplace_back(f->tmp_, f->path());
    }
    // Device files and pipes are written before any rename, so that one failing (/dev/full)
    // leaves none of the other outputs behind.
    for (const auto& [path, content] : files) {
      if (path == "-" || !IsSpecialFile(path)) continue;
      current = path;
      WriteInPlace(path, content);
    }
  } catch (const InputError& e) {
    for (const auto& [tmp, path] : staged) std::remove(tmp.c_str());
    throw InputError(fmt::format("{}{}", e.what(), NotWritten(targets, current)));
  }
  for (const auto& [tmp, path] : staged) {
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      for (const auto& [t, p] : staged) std::remove(t.c_str());
      throw InputError(CannotWrite(path, err));
    }
  }
  for (StreamedFile* f : streamed) f->committed_ = true;
  for (const auto& [path, content] : files) {
    if (path == "-") WriteInPlace(path, content);
  }
  for (StreamedFile* f : streamed) {
    if (f->path() == "-") WriteInPlace("-", f->held_);
  }
}

void WriteFilesIntoDirectory(const std::vector<std::pair<std::string, std::string>>& files,
                             const std::string& dir) {
  std::vector<std::filesystem::path> made;  // the missing directories, the innermost first
  std::error_code ec;
  if (!dir.empty()) {
    for (std::filesystem::path p = dir; !p.empty() && !std::filesystem::exists(p, ec);
         p = p.parent_path()) {
      made.push_back(p);
      if (p == p.parent_path()) break;
    }
    std::filesystem::create_directories(dir, ec);
    if (ec) throw InputError(fmt::format("{}: cannot create the directory: {}", dir, ec.message()));
  }
  try {
    WriteFilesAtomically(files);
  } catch (const InputError&) {
    for (const std::filesystem::path& p : made) std::filesystem::remove(p, ec);
    throw;
  }
}

namespace {

// True iff a and b name the same existing file.
bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool same = std::filesystem::equivalent(a, b, ec);
  return !ec && same;
}

// Creates and removes the temporary file WriteTemporary would create; throws InputError naming
// `path` when that fails.
void ProbeWritable(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(fmt::format("{}: cannot write: is a directory", path));
  }
  const std::string tmp = path + ".tmp-memsim";
  const bool existed = std::filesystem::exists(tmp, ec);
  std::FILE* f = std::fopen(tmp.c_str(), "ab");
  if (f == nullptr) {
    const int err = errno;
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    throw InputError(fmt::format("{}: cannot write: cannot create a file in {} ({})", path,
                                 dir.empty() ? "." : dir.string(), std::strerror(err)));
  }
  std::fclose(f);
  if (!existed) std::remove(tmp.c_str());
}

}  // namespace

void CheckOutputs(const std::vector<std::string>& outputs, const std::vector<std::string>& inputs) {
  std::vector<std::string> seen;
  for (const std::string& out : outputs) {
    if (out.empty() || out == "-") continue;
    for (const std::string& in : inputs) {
      if (!in.empty() && SameFile(out, in)) {
        throw InputError(
            fmt::format("{}: is also the input {}; choose another output file", out, in));
      }
    }
    for (const std::string& other : seen) {
      if (other == out || SameFile(other, out)) {
        throw InputError(fmt::format("{}: named for two outputs", out));
      }
    }
    seen.push_back(out);
    if (IsFifo(out)) {
      // Found now, before the work, rather than blocking or failing after it.
      if (HeldOpen().count(out) == 0) HeldOpen().emplace(out, OpenInPlace(out));
    } else if (!IsSpecialFile(out)) {
      ProbeWritable(out);
    }
  }
}

}  // namespace memsim::report
