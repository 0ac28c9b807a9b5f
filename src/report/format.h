// Small formatting and output helpers shared by the reporters. Sizes are printed in GiB / MiB
// (powers of two: MiB = 2^20, GiB = 2^30).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/units.h"

namespace memsim::report {

// "12.34" (GiB with two decimals), sign kept for negative values.
std::string GiB(Bytes bytes);
// "+1.25" / "-0.50" / "0.00": a change in GiB with an explicit sign.
std::string SignedGiB(Bytes bytes);
// A change with an explicit sign in the unit that suits it: "+6.28 GiB", "-3.0 MiB", "0 B".
std::string SignedHuman(Bytes bytes);
// "1234.56" (MiB with two decimals).
std::string MiB(Bytes bytes);
// Human size picking the unit: "512 B", "3.0 MiB", "12.34 GiB".
std::string HumanBytes(Bytes bytes);

// Writes several files all or nothing: every content goes to its temporary file first (in the
// target's directory); only when all of them were written are they renamed into place, so no
// half-written file is ever left behind. "-" writes to standard output (last); an existing path
// that is not a regular file (/dev/null, a pipe) is written in place, never replaced, and
// before any rename, opened without blocking (a named pipe with no reader is an error, not a
// hang). On failure no target is touched and the temporaries are removed; throws InputError
// naming the first path that could not be written (a directory, a missing folder, no
// permission, /dev/full) and the regular outputs left unwritten because of it ("; not written
// either: r.json"), or a path named twice. (A rename failing after others succeeded is not
// rolled back; renames within one directory fail only if the directory changes meanwhile.)
void WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files);

// An output written piece by piece while the work runs (a full-resolution timeline), so it is
// never held in memory: into a temporary file next to `path` (its own name, so several may be
// open for one path), renamed into place by WriteFilesAtomically with the other outputs, and
// removed when dropped uncommitted. "-" (standard output) is held in memory and written at the
// commit; a device file (/dev/null, a pipe) is written in place as it comes.
class StreamedFile {
 public:
  // Throws InputError "<path>: cannot write: <why>".
  explicit StreamedFile(std::string path);
  ~StreamedFile();
  StreamedFile(const StreamedFile&) = delete;
  StreamedFile& operator=(const StreamedFile&) = delete;

  // Write errors are kept and reported by WriteFilesAtomically.
  void Append(std::string_view text);
  const std::string& path() const { return path_; }

 private:
  friend void WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>&,
                                   const std::vector<StreamedFile*>&);
  // Closes the file; throws InputError naming path() on any write error.
  void Close();

  std::string path_;
  std::string tmp_;       // "" for "-" and device files
  std::FILE* f_ = nullptr;
  std::string held_;      // "-" only
  int error_ = 0;
  bool committed_ = false;
};

// WriteFilesAtomically for `files` and the `streamed` outputs together: all are closed, then
// renamed into place only when every one was written; on failure the streamed temporaries are
// removed too.
void WriteFilesAtomically(const std::vector<std::pair<std::string, std::string>>& files,
                          const std::vector<StreamedFile*>& streamed);

// WriteFilesAtomically for `files`, some of which are in the directory `dir` ("" = none), made
// first with its missing parents; when the writing fails, the directories made here are removed
// again, so that a failure leaves nothing behind. Throws InputError "<dir>: cannot create the
// directory: <why>", or WriteFilesAtomically's.
void WriteFilesIntoDirectory(const std::vector<std::pair<std::string, std::string>>& files,
                             const std::string& dir);

// Checks, before any work, that every output path ("" entries are skipped) can be written as
// WriteFilesAtomically will write it, and that none is one of `inputs` or names a file twice.
// Files are compared by identity (std::filesystem::equivalent), so "./c.json", a hard link or
// a symlink to c.json all count as c.json. A named pipe is opened here, without blocking, and
// held open until written: one with no reader fails now rather than after the work. Throws
// InputError naming the output: "<out>: is also the input <in>; choose another output file" or
// "<out>: cannot write: <why>". Writes nothing: the probe file it creates is removed at once.
void CheckOutputs(const std::vector<std::string>& outputs, const std::vector<std::string>& inputs);

}  // namespace memsim::report
