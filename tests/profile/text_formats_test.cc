// Importers of line-based formats, checked point by point against hand-written fixtures
// (tests/profile/data/, written from docs/profile-formats.md, not by the writers in writers.cc).
#include <algorithm>
#include <fstream>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "profile/profile.h"
#include "profile/writers.h"

namespace memsim::profile {
namespace {

using testing::DataPath;
using timeline::kUnknownBytes;

TEST_CASE("memsim-csv: CRLF, comment, blank line and empty fields", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("memsim.csv"), Format::kMemsimCsv);
  REQUIRE(t.samples.size() == 5);  // 5 data rows; the comment and the blank line are skipped
  CHECK(t.source == "memsim-csv");
  CHECK(t.samples[0].time_us == 0);
  CHECK(t.samples[0].iteration == 0);
  CHECK(t.samples[0].phase == Phase::kInit);
  CHECK(t.samples[0].allocated_bytes == 1048576);
  CHECK(t.samples[0].reserved_bytes == 2097152);
  CHECK(t.samples[0].active_bytes == kUnknownBytes);  // empty field: not recorded
  CHECK(t.samples[0].device_bytes == kUnknownBytes);
  CHECK(t.samples[1].time_us == 1500.5);
  CHECK(t.samples[1].phase == Phase::kForward);
  CHECK(t.samples[1].device_bytes == 6291456);
  CHECK(t.samples[3].phase == Phase::kOptimizerStep);
  CHECK(t.samples[4].time_us == 4000);
  CHECK(t.samples[4].iteration == 2);
  // Markers where iteration or phase changes: iteration 0 + init, iteration 1 + forward,
  // backward, optimizer_step, iteration 2 + forward = 3 iteration + 5 phase markers.
  CHECK(t.markers.size() == 8);
}

TEST_CASE("Megatron log: rank 0 by default, MiB to bytes, cumulative peaks", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("megatron.log"), Format::kMegatronLog);
  REQUIRE(t.samples.size() == 2);  // "(after 1 iterations)", "(after 2 iterations)"; the
                                   // checkpoint report and rank 1 are not samples
  CHECK(t.device_index == 0);
  CHECK(t.samples[0].iteration == 1);
  CHECK(t.samples[0].time_us == 1e6);  // nominal clock: iteration N at N x 1e6 us
  // Old Megatron (full float repr): 21874.3291015625 MiB = 21874 x 2^20 + 337/1024 x 2^20
  //   = 22936551424 + 345088 = 22936896512 bytes.
  CHECK(t.samples[0].allocated_bytes == 22936896512);
  CHECK(t.samples[0].reserved_bytes == 50112 * kMiB);
  CHECK(t.samples[0].device_bytes == kUnknownBytes);
  // New Megatron (.2f): 21874.33 MiB = round(21874.33 x 1048576) = 22936897454.
  CHECK(t.samples[1].allocated_bytes == 22936897454);
  CHECK(t.samples[1].device_bytes == 53248 * kMiB);  // "total device memory used"
  REQUIRE(t.reported_peaks.size() == 2);
  // 47210.91 MiB = round(47210.91 x 1048576) = 49504227164.
  CHECK(t.reported_peaks[0] == timeline::ReportedPeak{1, 49504227164, 50112 * kMiB});
  CHECK(t.reported_peaks[1] == timeline::ReportedPeak{2, 47300 * kMiB, 50176 * kMiB});
  LoadProfileOptions rank1;
  rank1.rank = 1;
  const timeline::Timeline r1 = LoadProfile(DataPath("megatron.log"), Format::kMegatronLog, rank1);
  REQUIRE(r1.samples.size() == 1);
  CHECK(r1.samples[0].allocated_bytes == 1000 * kMiB);
}

TEST_CASE("nvidia-smi csv without index: row position, repeated header, [N/A]", "[profile]") {
  const timeline::Timeline gpu0 = LoadProfile(DataPath("nvidia_smi.csv"), Format::kNvidiaSmi);
  // GPU 0 rows: 11.482 40512, 12.482 41000, 13.481 [N/A] (skipped), 14.000 39000.
  REQUIRE(gpu0.samples.size() == 3);
  CHECK(gpu0.samples[0].time_us == 0);
  CHECK(gpu0.samples[0].device_bytes == 40512 * kMiB);
  CHECK(gpu0.samples[1].time_us == 1e6);
  CHECK(gpu0.samples[1].device_bytes == 41000 * kMiB);
  CHECK(gpu0.samples[2].time_us == 2.518e6);  // 14.000 - 11.482 s
  CHECK(gpu0.samples[2].device_bytes == 39000 * kMiB);
  CHECK(gpu0.samples[0].allocated_bytes == kUnknownBytes);
  LoadProfileOptions second;
  second.device_index = 1;
  const timeline::Timeline gpu1 = LoadProfile(DataPath("nvidia_smi.csv"), Format::kNvidiaSmi, second);
  // GPU 1 rows: .483 1873, 12.484 1873, 13.482 1900 (second row of the pass whose first row
  // was [N/A]), 14.001 1873; times relative to 11.483.
  REQUIRE(gpu1.samples.size() == 4);
  CHECK(gpu1.samples[2].device_bytes == 1900 * kMiB);
  CHECK(gpu1.samples[2].time_us == 1.999e6);
}

TEST_CASE("nvidia-smi csv with index, nounits, across midnight and new year", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("nvidia_smi_index.csv"), Format::kNvidiaSmi);
  REQUIRE(t.samples.size() == 2);
  CHECK(t.samples[0].device_bytes == 40512 * kMiB);
  CHECK(t.samples[1].device_bytes == 40600 * kMiB);
  CHECK(t.samples[1].time_us == 250000);  // 23:59:59.900 -> 00:00:00.150 next day = 250 ms
}

// docs/profile-formats.md: `--format=csv,noheader,nounits` of the advised query
// timestamp,index,memory.used,memory.total has 4 fields a row, read in that order; a headerless
// row of another field count cannot be told apart and is refused, asking for the header.
TEST_CASE("nvidia-smi csv noheader: the advised query's 4 columns, or the header asked for",
          "[profile]") {
  const std::string path = testing::TempPath("nvsmi_noheader.csv");
  {
    std::ofstream out(path);
    out << "2026/12/02 05:00:00.000, 0, 40512, 81559\n"
           "2026/12/02 05:00:00.001, 1, 1873, 81559\n"
           "2026/12/02 05:00:00.500, 0, 41000, 81559\n"
           "2026/12/02 05:00:00.501, 1, 1900, 81559\n";
  }
  CHECK(DetectFormat(path).format == Format::kNvidiaSmi);
  LoadProfileOptions second;
  second.device_index = 1;
  const timeline::Timeline t = LoadProfile(path, Format::kNvidiaSmi, second);
  REQUIRE(t.samples.size() == 2);  // GPU 1 by the index column: 1873 then 1900 MiB, 500 ms on
  CHECK(t.samples[0].device_bytes == 1873 * kMiB);
  CHECK(t.samples[1].device_bytes == 1900 * kMiB);
  CHECK(t.samples[1].time_us == 500000);
  CHECK(std::find(t.notes.begin(), t.notes.end(),
                  "no header: columns read as timestamp, index, memory.used [MiB], memory.total "
                  "(the query of docs/profile-formats.md)") != t.notes.end());
  {
    std::ofstream out(path);
    out << "2026/12/02 05:00:00.000, 0, GPU-1234, 40512, 81559\n";
  }
  CHECK_THROWS_WITH(LoadProfile(path, Format::kNvidiaSmi),
                    Catch::Contains(":1: expected the nvidia-smi CSV header") &&
                        Catch::Contains("this row has 5 fields: keep the header (--format=csv)"));
}

TEST_CASE("npu-smi info with date lines: HBM column, 5-digit used value, two NPUs", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("npu_smi.txt"), Format::kNpuSmi);
  REQUIRE(t.samples.size() == 2);
  CHECK(t.samples[0].device_bytes == 41872 * kMiB);  // "41872/ 65536": HBM used, MB = MiB
  CHECK(t.samples[1].device_bytes == 45000 * kMiB);
  CHECK(t.samples[1].time_us == 2e6);  // 14:03:11 -> 14:03:13
  LoadProfileOptions second;
  second.device_index = 1;
  const timeline::Timeline t1 = LoadProfile(DataPath("npu_smi.txt"), Format::kNpuSmi, second);
  REQUIRE(t1.samples.size() == 2);
  CHECK(t1.samples[0].device_bytes == 3355 * kMiB);
}

TEST_CASE("npu-smi info A3 layout: two chips per NPU are devices 0 and 1", "[profile]") {
  LoadProfileOptions o;
  o.device_index = 1;  // NPU 0 chip 1 (the row pair whose power reads '-')
  const timeline::Timeline t = LoadProfile(DataPath("npu_smi_a3.txt"), Format::kNpuSmi, o);
  REQUIRE(t.samples.size() == 1);
  CHECK(t.samples[0].device_bytes == 18000 * kMiB);
  CHECK(LoadProfile(DataPath("npu_smi_a3.txt"), Format::kNpuSmi).samples[0].device_bytes ==
        20480 * kMiB);
}

TEST_CASE("npu-smi info 310P layout: Memory-Usage only, no timestamps", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("npu_smi_310p.txt"), Format::kNpuSmi);
  REQUIRE(t.samples.size() == 2);
  CHECK(t.samples[0].device_bytes == 1450 * kMiB);
  CHECK(t.samples[1].device_bytes == 2900 * kMiB);
  CHECK(t.samples[1].time_us == 1e6);  // no clock: tables 1 nominal interval (1 s) apart
}

TEST_CASE("auto detection names every format", "[profile]") {
  struct Row {
    const char* file;
    Format format;
  };
  const Row rows[] = {{"memsim.csv", Format::kMemsimCsv},
                      {"megatron.log", Format::kMegatronLog},
                      {"nvidia_smi.csv", Format::kNvidiaSmi},
                      {"nvidia_smi_index.csv", Format::kNvidiaSmi},
                      {"npu_smi.txt", Format::kNpuSmi},
                      {"npu_smi_310p.txt", Format::kNpuSmi},
                      {"trace_new.json", Format::kTorchTrace},
                      {"trace_old.json.gz", Format::kTorchTrace},
                      {"snapshot.json", Format::kTorchSnapshot},
                      {"memory_record.csv", Format::kNpuProfiler},
                      {"operator_memory.csv", Format::kNpuProfiler},
                      {"rank0_ascend_pt", Format::kNpuProfiler},
                      {"npu_mem.csv", Format::kNpuMem}};
  for (const Row& row : rows) {
    INFO(row.file);
    CHECK(DetectFormat(DataPath(row.file)).format == row.format);
  }
  const timeline::Timeline t = LoadProfile(DataPath("npu_smi.txt"), Format::kAuto);
  REQUIRE(!t.notes.empty());
  CHECK(t.notes[0] == "detected npu-smi: npu-smi info tables");
}

}  // namespace
}  // namespace memsim::profile

namespace memsim::profile {
namespace {

TEST_CASE("tools/record_profile.py output (its --selftest) reads back", "[profile]") {
  // data/recorded.csv = `tools/record_profile.py --selftest`: a scripted allocator, 2048 MiB
  // after init, forward +4 x 256 MiB, backward -1024 MiB, step +512 then -512 MiB; reserved =
  // the running maximum rounded up to 512 MiB; device = reserved + 3000 MiB. Each phase()
  // writes the ending phase's peak, then the new phase's first sample; close() ends the last.
  const timeline::Timeline t = LoadProfile(testing::DataPath("recorded.csv"), Format::kAuto);
  REQUIRE(t.samples.size() == 21);  // init: 1 + 1 peak; 3 iterations x 3 phases x 2; close: 1
  for (size_t i = 1; i < t.samples.size(); ++i) CHECK(t.samples[i - 1].time_us <= t.samples[i].time_us);
  // Iteration 1 forward: starts at 2048 MiB, peaks at 2048 + 1024 = 3072 MiB.
  CHECK(t.samples[2].iteration == 1);
  CHECK(t.samples[2].phase == Phase::kForward);
  CHECK(t.samples[2].allocated_bytes == 2048 * kMiB);
  CHECK(t.samples[3].allocated_bytes == 3072 * kMiB);
  CHECK(t.samples[3].reserved_bytes == 3072 * kMiB);
  CHECK(t.samples[3].device_bytes == timeline::kUnknownBytes);  // peak rows: allocator only
  CHECK(t.samples[4].device_bytes == (3072 + 3000) * kMiB);
  // Optimizer step of iteration 1: peak 2048 + 512 = 2560 MiB.
  CHECK(t.samples[7].phase == Phase::kOptimizerStep);
  CHECK(t.samples[7].allocated_bytes == 2560 * kMiB);
}

}  // namespace
}  // namespace memsim::profile
