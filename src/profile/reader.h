// Internal to profile/: the pieces every importer shares. A LineReader streams a plain or
// gzip-compressed file line by line (zlib reads both); text helpers parse numbers exactly
// (decimal microseconds to integer nanoseconds, as docs/profile-formats.md asks); a SeriesBuilder
// holds the samples of one device in bounded memory and turns them, with iteration / phase spans,
// into a Timeline. Nothing here is part of the public interface (profile.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <streambuf>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/checked.h"
#include "profile/profile.h"
#include "timeline/timeline.h"

namespace memsim::profile::internal {

using TimeNs = std::int64_t;

// Reads a file line by line; '\n' or "\r\n" ends a line; a UTF-8 BOM at the start is dropped.
// Gzip input (by content, not name) is decompressed on the fly. Throws InputError for an
// unreadable file, corrupt or truncated gzip data, and NUL bytes in text ("binary data").
class LineReader {
 public:
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Sets *line to the next line (without its end) and returns true, or returns false at the end.
  // The view stays valid until the next call.
  bool Next(std::string_view* line);
  // 1-based number of the line last returned.
  int64_t line_number() const { return line_number_; }
  const std::string& path() const { return path_; }
  // "<path>:<line>: " + message (just "<path>: " before the first line), as an InputError.
  [[noreturn]] void Fail(std::string_view message) const;

 private:
  bool Fill();
  std::string path_;
  void* gz_ = nullptr;  // gzFile
  std::string buffer_;
  size_t begin_ = 0;
  bool eof_ = false;
  std::string line_;
  int64_t line_number_ = 0;
  int64_t bytes_read_ = 0;
};

// A std::streambuf over a plain or gzip file, for the JSON readers (nlohmann::json reads an
// std::istream). underflow() throws InputError on corrupt or truncated gzip data.
class GzStreamBuf : public std::streambuf {
 public:
  explicit GzStreamBuf(const std::string& path);
  ~GzStreamBuf() override;
  GzStreamBuf(const GzStreamBuf&) = delete;
  GzStreamBuf& operator=(const GzStreamBuf&) = delete;
  // True when the bytes are decompressed from gzip data (known once the first byte is read):
  // then, as for a pipe, their count is not the file's size.
  bool Compressed() const;

 protected:
  int_type underflow() override;

 private:
  std::string path_;
  void* gz_ = nullptr;
  std::vector<char> buffer_;
  int64_t offset_ = 0;
};

// Up to `max_bytes` leading (decompressed) bytes of `path`. Throws InputError when unreadable.
std::string ReadHead(const std::string& path, size_t max_bytes);
// True iff `path` names a directory.
bool IsDirectory(const std::string& path);

// The keys of one JSON object a SAX reader is in, to refuse a key given twice (the parser passes
// both; a document would keep the last silently, and a streaming reader would add both up): a
// few keys in a vector, more in a hash set (a hostile object of 10^6 keys stays linear).
class ObjectKeys {
 public:
  // False when `key` was already given in this object.
  bool Insert(const std::string& key);

 private:
  std::vector<std::string> few_;
  std::unordered_set<std::string> many_;
};

// JSON profiles nest a few levels (a snapshot at most 9, a Chrome trace about 5); memsim refuses
// more than 64, as its config reader does, so an endless stream of '[' stops there.
inline constexpr size_t kMaxJsonProfileDepth = 64;

std::string_view Trim(std::string_view s);
// Splits one CSV record on commas; double-quoted fields may contain commas ("" is a quote).
// Fields are trimmed of spaces and TABs (torch_npu timestamps end in a TAB).
std::vector<std::string> SplitCsv(std::string_view line);
bool StartsWith(std::string_view s, std::string_view prefix);

// Exact parsers; nullopt unless the whole (trimmed) text is the number.
std::optional<int64_t> ParseInt(std::string_view s);
std::optional<double> ParseDouble(std::string_view s);
// Decimal microseconds ("1751500000200001.250", "12", "5012000.125") to integer nanoseconds,
// exactly; digits beyond the third decimal are rounded half up. Negative values allowed (one
// sign); nullopt beyond kMaxAbsTimeNs (core/checked.h).
std::optional<TimeNs> ParseMicrosToNs(std::string_view s);
// A count of MiB (or KiB) written as a float, to bytes, rounded to the nearest byte; nullopt
// beyond kMaxInputBytes or for NaN / infinity (core/checked.h).
std::optional<int64_t> MiBToBytes(double mib);
std::optional<int64_t> KiBToBytes(double kib);

// A sample while importing: absolute time in ns plus the order it was read in (the tie-break
// that keeps sorting deterministic).
struct RawSample {
  TimeNs time_ns = 0;
  int64_t sequence = 0;
  timeline::Sample sample;
};

// A span of one iteration (phase kUnknown) or of one phase within an iteration.
struct RawSpan {
  TimeNs start_ns = 0;
  TimeNs end_ns = 0;  // exclusive
  int iteration = -1;
  Phase phase = Phase::kUnknown;
  std::string label;
};

// Collects samples in any order (REQUIRES: times and span bounds within kMaxAbsTimeNs), keeping at most `max_samples` (see profile.h): when full, it
// sorts by time and replaces each run of 16 consecutive samples by its first, last,
// highest-allocated, highest-reserved and highest-device samples.
class SeriesBuilder {
 public:
  explicit SeriesBuilder(size_t max_samples);
  void Add(TimeNs time_ns, const timeline::Sample& sample);
  size_t size() const { return samples_.size(); }
  bool decimated() const { return decimated_; }
  int64_t added() const { return next_sequence_; }

  // Sorts by time, makes times relative to the earliest sample or span start, labels samples
  // with the iteration and phase of the spans that contain them (where the sample has none), and
  // emits one Marker per span. The Timeline's source is `format`'s name (profile.h).
  timeline::Timeline Finish(std::vector<RawSpan> spans, Format format);

 private:
  void Decimate();
  size_t max_samples_;
  std::vector<RawSample> samples_;
  int64_t next_sequence_ = 0;
  bool decimated_ = false;
};

}  // namespace memsim::profile::internal
