// The shared pieces of profile/: exact number and clock parsing, and the bounded-memory
// SeriesBuilder (peaks kept exactly when a long, unsorted series is decimated).
#include "profile/reader.h"

#include <catch2/catch.hpp>
#include <fmt/core.h>

#include "profile/clock.h"
#include "profile/profile.h"
#include "profile/writers.h"

namespace memsim::profile::internal {
namespace {

TEST_CASE("ParseMicrosToNs reads decimal microseconds exactly", "[profile]") {
  auto [text, ns] = GENERATE(table<const char*, int64_t>({
      {"1751500000200001.250", 1751500000200001250},  // epoch us + 3-digit ns (F 3.2)
      {"5012000.125", 5012000125},
      {"12", 12000},
      {"1.5", 1500},             // zero-padded reading: 1 us + 500 ns
      {" 7.000\t", 7000},        // trailing TAB (F 3.8)
      {"-3.0005", -3001},        // 4th decimal rounds half up
      {"1712345678901234", 1712345678901234000},
  }));
  INFO(text);
  CHECK(ParseMicrosToNs(text) == ns);
  CHECK(!ParseMicrosToNs("abc"));
  CHECK(!ParseMicrosToNs("1.2.3"));
  CHECK(!ParseMicrosToNs(""));
}

TEST_CASE("ParseWallClock: nvidia-smi, ISO 8601, date(1), epoch seconds", "[profile]") {
  // 2025-07-02 14:03:11 UTC = 1751464991 s since the epoch (calendar.timegm).
  const int64_t base = 1751464991LL * 1'000'000'000;
  CHECK(ParseWallClock("2025/07/02 14:03:11.482") == base + 482'000'000);
  CHECK(ParseWallClock("2025-07-02T14:03:11.482Z") == base + 482'000'000);
  CHECK(ParseWallClock("2025-07-02 14:03:11") == base);
  CHECK(ParseWallClock("Wed Jul  2 14:03:11 CST 2025") == base);
  CHECK(ParseWallClock("Wed Jul 2 14:03:11 2025") == base);
  CHECK(ParseWallClock("1751464991.482") == base + 482'000'000);
  CHECK(!ParseWallClock("2025/13/02 14:03:11"));
  CHECK(!ParseWallClock("| 0 910X | OK |"));
  CHECK(!ParseWallClock("42"));
}

TEST_CASE("SeriesBuilder keeps at most max_samples and every peak", "[profile]") {
  SeriesBuilder b(64);
  // 10000 samples added in a scrambled order (multiplier 7919 is prime to 10000, so i -> 7919 i
  // mod 10000 visits every index once); allocated = index, except one spike at index 4321.
  for (int64_t i = 0; i < 10000; ++i) {
    const int64_t k = (i * 7919) % 10000;
    timeline::Sample s;
    s.allocated_bytes = k == 4321 ? 1'000'000 : k;
    s.reserved_bytes = 20000 - k;
    b.Add(k * 1000, s);
  }
  CHECK(b.size() <= 64);
  timeline::Timeline t = b.Finish({}, Format::kMemsimCsv);
  CHECK(t.samples.size() <= 64);
  Bytes max_allocated = 0, max_reserved = 0;
  for (const auto& s : t.samples) {
    max_allocated = std::max(max_allocated, s.allocated_bytes);
    max_reserved = std::max(max_reserved, s.reserved_bytes);
  }
  CHECK(max_allocated == 1'000'000);  // the spike survives
  CHECK(max_reserved == 20000);       // index 0
  CHECK(t.samples.front().time_us == 0);
  for (size_t i = 1; i < t.samples.size(); ++i) CHECK(t.samples[i - 1].time_us <= t.samples[i].time_us);
  REQUIRE(t.notes.size() == 1);
  CHECK(t.notes[0] == fmt::format("kept {} of 10000 samples (bounded memory: at most 64; peaks "
                                   "kept exactly)", t.samples.size()));
}

TEST_CASE("a long unsorted memory_record.csv loads in bounded memory", "[profile]") {
  // 50000 PTA rows, written in a scrambled time order; allocated = (k mod 1000) MiB with one
  // 9999 MiB spike at k = 31337. With max_samples 1000 the import keeps <= 1000 samples and the
  // spike.
  std::string csv =
      "Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),Stream "
      "Ptr,Device Type\r\n";
  for (int64_t i = 0; i < 50000; ++i) {
    const int64_t k = (i * 7919) % 50000;
    csv += fmt::format("PTA,{}.000\t,{}.0,10000.0,1.0,1,NPU:0\r\n", 1751500000000000 + k * 10,
                       k == 31337 ? 9999 : k % 1000);
  }
  const std::string path = testing::TempPath("long_record.csv");
  testing::WriteFile(path, csv);
  LoadProfileOptions o;
  o.max_samples = 1000;
  const timeline::Timeline t = LoadProfile(path, Format::kNpuProfiler, o);
  CHECK(t.samples.size() <= 1000);
  Bytes peak = 0;
  for (const auto& s : t.samples) peak = std::max(peak, s.allocated_bytes);
  CHECK(peak == 9999 * kMiB);
  CHECK(t.samples.back().time_us == 499990);  // the last row, k = 49999: 49999 x 10 us
}

}  // namespace
}  // namespace memsim::profile::internal
