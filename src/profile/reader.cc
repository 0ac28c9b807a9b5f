#include "profile/reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

#include <fmt/core.h>

#include "core/check.h"
#include "core/error.h"

namespace memsim::profile::internal {
namespace {

constexpr size_t kChunkBytes = 1 << 16;

gzFile OpenGz(const std::string& path) {
  if (IsDirectory(path)) throw InputError(fmt::format("{}: is a directory, expected a file", path));
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  gzbuffer(gz, kChunkBytes);
  return gz;
}

// Reads up to n bytes; throws on corrupt or truncated gzip data. `offset` is the decompressed
// offset so far (for the message).
size_t ReadGz(gzFile gz, const std::string& path, char* out, size_t n, int64_t offset) {
  const int got = gzread(gz, out, static_cast<unsigned>(n));
  int errnum = Z_OK;
  const char* message = gzerror(gz, &errnum);
  if (got < 0 || (errnum != Z_OK && errnum != Z_BUF_ERROR)) {
    throw InputError(fmt::format("{}: byte {}: corrupt gzip data ({}), expected a complete .gz file",
                                 path, offset, message));
  }
  // zlib reports a gzip stream cut short as Z_BUF_ERROR at the end.
  if (got == 0 && errnum == Z_BUF_ERROR) {
    throw InputError(fmt::format(
        "{}: byte {}: truncated gzip data, expected a complete .gz file", path, offset));
  }
  return static_cast<size_t>(got);
}

}  // namespace

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

LineReader::LineReader(const std::string& path) : path_(path), gz_(OpenGz(path)) {}

LineReader::~LineReader() {
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
}

void LineReader::Fail(std::string_view message) const {
  if (line_number_ == 0) throw InputError(fmt::format("{}: {}", path_, message));
  throw InputError(fmt::format("{}:{}: {}", path_, line_number_, message));
}

bool LineReader::Fill() {
  if (eof_) return false;
  buffer_.erase(0, begin_);
  begin_ = 0;
  const size_t old = buffer_.size();
  buffer_.resize(old + kChunkBytes);
  const size_t got = ReadGz(static_cast<gzFile>(gz_), path_, buffer_.data() + old, kChunkBytes,
                            bytes_read_);
  buffer_.resize(old + got);
  if (std::memchr(buffer_.data() + old, '\0', got) != nullptr) {
    const size_t at = static_cast<size_t>(
        static_cast<const char*>(std::memchr(buffer_.data() + old, '\0', got)) - buffer_.data());
    throw InputError(fmt::format("{}: byte {}: binary data (a NUL byte), expected text", path_,
                                 bytes_read_ + static_cast<int64_t>(at - old)));
  }
  bytes_read_ += static_cast<int64_t>(got);
  if (got == 0) eof_ = true;
  return got > 0;
}

bool LineReader::Next(std::string_view* line) {
  for (;;) {
    const size_t nl = buffer_.find('\n', begin_);
    if (nl != std::string::npos) {
      line_.assign(buffer_, begin_, nl - begin_);
      begin_ = nl + 1;
      break;
    }
    if (!Fill()) {
      if (begin_ >= buffer_.size()) return false;
      line_.assign(buffer_, begin_, std::string::npos);  // last line without '\n'
      begin_ = buffer_.size();
      break;
    }
  }
  ++line_number_;
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  if (line_number_ == 1 && StartsWith(line_, "\xEF\xBB\xBF")) line_.erase(0, 3);
  *line = line_;
  return true;
}

GzStreamBuf::GzStreamBuf(const std::string& path)
    : path_(path), gz_(OpenGz(path)), buffer_(kChunkBytes) {}

bool GzStreamBuf::Compressed() const { return gzdirect(static_cast<gzFile>(gz_)) == 0; }

GzStreamBuf::~GzStreamBuf() {
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
}

GzStreamBuf::int_type GzStreamBuf::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  const size_t got = ReadGz(static_cast<gzFile>(gz_), path_, buffer_.data(), buffer_.size(), offset_);
  offset_ += static_cast<int64_t>(got);
  if (got == 0) return traits_type::eof();
  setg(buffer_.data(), buffer_.data(), buffer_.data() + got);
  return traits_type::to_int_type(*gptr());
}

std::string ReadHead(const std::string& path, size_t max_bytes) {
  gzFile gz = OpenGz(path);
  std::string head(max_bytes, '\0');
  size_t got = 0;
  try {
    got = ReadGz(gz, path, head.data(), max_bytes, 0);
  } catch (...) {
    gzclose(gz);
    throw;
  }
  gzclose(gz);
  head.resize(got);
  return head;
}

bool ObjectKeys::Insert(const std::string& key) {
  constexpr size_t kFew = 16;
  if (many_.empty()) {
    if (std::find(few_.begin(), few_.end(), key) != few_.end()) return false;
    if (few_.size() < kFew) {
      few_.push_back(key);
      return true;
    }
    many_.insert(few_.begin(), few_.end());
    few_.clear();
  }
  return many_.insert(key).second;
}

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::vector<std::string> SplitCsv(std::string_view line) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"' && Trim(field).empty()) {
      quoted = true;
      field.clear();
    } else if (c == ',') {
      fields.emplace_back(Trim(field));
      field.clear();
    } else {
      field += c;
    }
  }
  fields.emplace_back(Trim(field));
  return fields;
}

std::optional<int64_t> ParseInt(std::string_view s) {
  s = Trim(s);
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> ParseDouble(std::string_view s) {
  s = Trim(s);
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

std::optional<TimeNs> ParseMicrosToNs(std::string_view s) {
  s = Trim(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  // One sign only: from_chars below would accept a second '-'.
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) return std::nullopt;
  // Exponent form ("1.5e+06"): fall back to double, still exact enough for relative times.
  if (s.find_first_of("eE") != std::string_view::npos) {
    auto d = ParseDouble(s);
    if (!d) return std::nullopt;
    const std::optional<TimeNs> ns = ToTimeNs(*d, 1000.0);
    if (!ns) return std::nullopt;
    return negative ? -*ns : *ns;
  }
  const size_t dot = s.find('.');
  std::string_view whole = s.substr(0, dot);
  std::string_view frac = dot == std::string_view::npos ? std::string_view{} : s.substr(dot + 1);
  if (whole.empty() && frac.empty()) return std::nullopt;
  int64_t us = 0;
  if (!whole.empty()) {
    auto [p, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), us);
    if (ec != std::errc() || p != whole.data() + whole.size()) return std::nullopt;
  }
  int64_t ns = 0;
  for (size_t i = 0; i < frac.size(); ++i) {
    if (frac[i] < '0' || frac[i] > '9') return std::nullopt;
    if (i < 3) ns = ns * 10 + (frac[i] - '0');
  }
  for (size_t i = frac.size(); i < 3; ++i) ns *= 10;
  if (frac.size() > 3 && frac[3] >= '5') ++ns;
  const std::optional<TimeNs> whole_ns = ToTimeNs(us, 1000);
  const std::optional<TimeNs> total = whole_ns ? AddTimeNs(*whole_ns, ns) : std::nullopt;
  if (!total) return std::nullopt;
  return negative ? -*total : *total;
}

std::optional<int64_t> MiBToBytes(double mib) { return ToBytes(mib, static_cast<double>(kMiB)); }
std::optional<int64_t> KiBToBytes(double kib) { return ToBytes(kib, static_cast<double>(kKiB)); }

SeriesBuilder::SeriesBuilder(size_t max_samples) : max_samples_(std::max<size_t>(max_samples, 16)) {}

void SeriesBuilder::Add(TimeNs time_ns, const timeline::Sample& sample) {
  // Every importer converts times through core/checked.h, so Finish's differences cannot overflow.
  MEMSIM_CHECK(TimeInRange(time_ns));
  if (samples_.size() >= max_samples_) Decimate();
  samples_.push_back(RawSample{time_ns, next_sequence_++, sample});
}

namespace {
bool Earlier(const RawSample& a, const RawSample& b) {
  return std::tie(a.time_ns, a.sequence) < std::tie(b.time_ns, b.sequence);
}
}  // namespace

void SeriesBuilder::Decimate() {
  decimated_ = true;
  std::sort(samples_.begin(), samples_.end(), Earlier);
  std::vector<RawSample> kept;
  kept.reserve(samples_.size() / 16 * 5 + 5);  // at most 5 of every 16
  constexpr size_t kGroup = 16;
  for (size_t begin = 0; begin < samples_.size(); begin += kGroup) {
    const size_t end = std::min(samples_.size(), begin + kGroup);
    size_t picks[5] = {begin, end - 1, begin, begin, begin};
    for (size_t i = begin; i < end; ++i) {
      const timeline::Sample& s = samples_[i].sample;
      if (s.allocated_bytes > samples_[picks[2]].sample.allocated_bytes) picks[2] = i;
      if (s.reserved_bytes > samples_[picks[3]].sample.reserved_bytes) picks[3] = i;
      if (s.device_bytes > samples_[picks[4]].sample.device_bytes) picks[4] = i;
    }
    std::sort(std::begin(picks), std::end(picks));
    for (size_t k = 0; k < 5; ++k) {
      if (k > 0 && picks[k] == picks[k - 1]) continue;
      kept.push_back(samples_[picks[k]]);
    }
  }
  samples_.swap(kept);
}

timeline::Timeline SeriesBuilder::Finish(std::vector<RawSpan> spans, Format format) {
  std::sort(samples_.begin(), samples_.end(), Earlier);
  std::stable_sort(spans.begin(), spans.end(), [](const RawSpan& a, const RawSpan& b) {
    return std::tie(a.start_ns, a.iteration) < std::tie(b.start_ns, b.iteration);
  });
  TimeNs t0 = samples_.empty() ? 0 : samples_.front().time_ns;
  for (const RawSpan& s : spans) {
    MEMSIM_CHECK(TimeInRange(s.start_ns) && TimeInRange(s.end_ns));
    t0 = std::min(t0, s.start_ns);
  }
  timeline::Timeline out;
  out.source = FormatName(format);
  out.samples.reserve(samples_.size());
  // Iteration spans and phase spans, each sorted by start; walk them alongside the samples.
  std::vector<const RawSpan*> iters, phases;
  for (const RawSpan& s : spans) (s.phase == Phase::kUnknown ? iters : phases).push_back(&s);
  size_t it = 0, ph = 0;
  for (const RawSample& raw : samples_) {
    timeline::Sample s = raw.sample;
    s.time_us = static_cast<double>(raw.time_ns - t0) / 1000.0;
    while (it < iters.size() && iters[it]->end_ns <= raw.time_ns) ++it;
    if (s.iteration < 0 && it < iters.size() && iters[it]->start_ns <= raw.time_ns) {
      s.iteration = iters[it]->iteration;
    }
    while (ph < phases.size() && phases[ph]->end_ns <= raw.time_ns) ++ph;
    if (s.phase == Phase::kUnknown && ph < phases.size() && phases[ph]->start_ns <= raw.time_ns) {
      s.phase = phases[ph]->phase;
      if (s.iteration < 0) s.iteration = phases[ph]->iteration;
    }
    out.samples.push_back(s);
  }
  for (const RawSpan& s : spans) {
    out.markers.push_back(timeline::Marker{static_cast<double>(s.start_ns - t0) / 1000.0,
                                           s.iteration, s.phase, s.label});
  }
  if (decimated_) {
    out.notes.push_back(fmt::format(
        "kept {} of {} samples (bounded memory: at most {}; peaks kept exactly)", samples_.size(),
        next_sequence_, max_samples_));
  }
  return out;
}

}  // namespace memsim::profile::internal
