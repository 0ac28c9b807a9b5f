// torch_npu profiler CSVs / folder and CANN npu_mem against hand-written fixtures (data/), plus
// round trips.
#include <cmath>
#include <filesystem>

#include <catch2/catch.hpp>

#include "compare/compare.h"
#include "core/error.h"
#include "profile/profile.h"
#include "profile/writers.h"

namespace memsim::profile {
namespace {

using testing::DataPath;
using timeline::kUnknownBytes;

// memory_record.csv device 0, sorted by time (t0 = APP row at ...100000.000):
//   APP 100000.000 device 3310.25 MiB = 3471048704 B                      -> 0 us
//   PTA 150000.000 256 / 1024 / 256 MiB                                   -> 50000 us
//   PTA 200001.250 512 / 1024 / 512                                       -> 100001.25 us
//   PTA 200950.000 510 / 1024 / 510                                       -> 100950 us
//   PTA 250000.000 1234.5673828125 (= 1234 + 581/1024) MiB = 1294537728 B -> 150000 us
//   APP 300000.000 device 3400.5 MiB = 3565682688 B                       -> 200000 us
// GE and PTA+GE rows are not imported; NPU:1 is another device.
void CheckMemoryRecord(const timeline::Timeline& t) {
  REQUIRE(t.samples.size() == 6);
  CHECK(t.samples[0].time_us == 0);
  CHECK(t.samples[0].device_bytes == 3471048704);
  CHECK(t.samples[0].allocated_bytes == kUnknownBytes);
  CHECK(t.samples[1].time_us == 50000);
  CHECK(t.samples[1].allocated_bytes == 256 * kMiB);
  CHECK(t.samples[1].reserved_bytes == 1024 * kMiB);
  CHECK(t.samples[2].time_us == 100001.25);  // trailing TAB stripped, ns kept
  CHECK(t.samples[2].active_bytes == 512 * kMiB);
  CHECK(t.samples[3].allocated_bytes == 510 * kMiB);
  CHECK(t.samples[4].allocated_bytes == 1294537728);
  CHECK(t.samples[4].reserved_bytes == 2048 * kMiB);
  CHECK(t.samples[5].time_us == 200000);
  CHECK(t.samples[5].device_bytes == 3565682688);
}

TEST_CASE("memory_record.csv: CRLF, TABs, unsorted rows, APP/GE/PTA+GE, two devices", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("memory_record.csv"), Format::kAuto);
  CheckMemoryRecord(t);
  for (const auto& s : t.samples) CHECK(s.iteration == -1);
  CHECK(t.notes[0] == "detected npu-profiler: torch_npu memory_record.csv header");
  CHECK(t.notes[2] == "rows not imported: 1 GE, 1 PTA+GE");
  LoadProfileOptions o;
  o.device_index = 1;
  const timeline::Timeline d1 = LoadProfile(DataPath("memory_record.csv"), Format::kNpuProfiler, o);
  REQUIRE(d1.samples.size() == 1);
  CHECK(d1.samples[0].reserved_bytes == 200 * kMiB);
}

TEST_CASE("*_ascend_pt folder: ProfilerStep spans from trace_view.json", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("rank0_ascend_pt"), Format::kAuto);
  CheckMemoryRecord(t);
  // ProfilerStep#1 = [140000, 240000) -> iteration 2; ProfilerStep#2 = [240000, 340000) -> 3.
  const int expected[6] = {-1, 2, 2, 2, 3, 3};
  for (int i = 0; i < 6; ++i) CHECK(t.samples[i].iteration == expected[i]);
  REQUIRE(t.markers.size() == 2);
  CHECK(t.markers[0].time_us == 40000);
  // npu_module_mem: latest MODULE_A 200.0 + MODULE_B 1024.0 = 1224.0 MiB at 200000.
  CHECK(t.notes.back() ==
        "npu_module_mem.csv: CANN components (2) peak at 1224.0 MiB together (memory outside "
        "the PyTorch allocator)");
}

TEST_CASE("operator_memory.csv: allocation and release totals, GE rows skipped", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("operator_memory.csv"), Format::kAuto);
  // aten::empty_strided: alloc at 200001.250 (512/1024/512), release at 200950.000
  // (510/1024/510); cann:: skipped; aten::add: release only at 300000.000 (400/1024/400).
  REQUIRE(t.samples.size() == 3);
  CHECK(t.samples[0].allocated_bytes == 512 * kMiB);
  CHECK(t.samples[1].time_us == 948.75);
  CHECK(t.samples[1].allocated_bytes == 510 * kMiB);
  CHECK(t.samples[2].time_us == 99998.75);
  CHECK(t.samples[2].active_bytes == 400 * kMiB);
}

TEST_CASE("CANN npu_mem.csv: Device rows preferred, KiB to bytes", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("npu_mem.csv"), Format::kAuto);
  REQUIRE(t.samples.size() == 2);
  CHECK(t.samples[0].device_bytes == 4 * kGiB);  // 4194304 KiB
  CHECK(t.samples[1].device_bytes == 5 * kGiB);
  CHECK(t.samples[1].time_us == 100000.5);
}

TEST_CASE("npu errors", "[profile]") {
  const std::string module_only = DataPath("rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/npu_module_mem.csv");
  CHECK_THROWS_WITH(LoadProfile(module_only, Format::kNpuProfiler),
                    module_only +
                        ": npu_module_mem.csv holds CANN component memory only, expected "
                        "memory_record.csv or operator_memory.csv (or the whole *_ascend_pt folder)");
  const std::string empty_dir = testing::TempPath("empty_ascend_pt");
  std::filesystem::create_directories(empty_dir);
  CHECK_THROWS_WITH(LoadProfile(empty_dir, Format::kAuto),
                    empty_dir +
                        ": no memory_record.csv or operator_memory.csv, expected torch_npu profiler "
                        "output recorded with profile_memory=True "
                        "(ASCEND_PROFILER_OUTPUT/memory_record.csv)");
  const std::string bad = testing::TempPath("bad_record.csv");
  testing::WriteFile(bad,
                     "Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total "
                     "Active(MB),Stream Ptr,Device Type\r\nPTA,1751500000200001.250\t,5l2.0,1024.0,"
                     "512.0,1,NPU:0\r\n");
  CHECK_THROWS_WITH(LoadProfile(bad, Format::kNpuProfiler),
                    bad + ":2: Total Allocated(MB): expected a number of MiB below 2^42, got '5l2.0'");
  const std::string bad_mem = testing::TempPath("bad_npu_mem.csv");
  testing::WriteFile(bad_mem, "Device_id,event,hbm(KB),timestamp(us)\n0,Device,12,noon\n");
  CHECK_THROWS_WITH(LoadProfile(bad_mem, Format::kNpuMem),
                    bad_mem + ":2: timestamp(us): expected microseconds, got 'noon'");
}

TEST_CASE("round trip: operator_memory.csv in an ascend folder within 0.5%, a 10% iteration",
          "[profile][compare]") {
  // The folder has operator_memory.csv but no memory_record.csv, so the allocator totals come
  // from the operator rows (the cann:: row is skipped) and the iterations from trace_view.json.
  const timeline::Timeline sim = testing::KnownTimeline(4);
  const std::string dir = testing::TempPath("rt_ascend_ops_pt");
  testing::WriteAscendFolder(sim, dir, /*operator_memory=*/true);
  const compare::Report r = compare::Compare(LoadProfile(dir, Format::kAuto), sim, {});
  REQUIRE(r.iterations.size() == 4);
  CHECK(std::fabs(*r.overall_error_pct.peak_allocated) <= 0.5);
  CHECK(std::fabs(*r.overall_error_pct.peak_reserved) <= 0.5);
  CHECK(*r.overall_curve_error_pct <= 0.5);
  timeline::Timeline scaled = sim;
  testing::ScaleIteration(scaled, 2, 1.10);
  testing::WriteAscendFolder(scaled, dir, /*operator_memory=*/true);
  const compare::Report s = compare::Compare(LoadProfile(dir, Format::kAuto), sim, {});
  REQUIRE(s.iterations.size() == 4);
  for (const auto& it : s.iterations) {
    INFO(it.iteration);
    // (1.1 s - s) / s = +10% in iteration 2 only.
    CHECK(*it.error_pct.peak_allocated == Approx(it.iteration == 2 ? 10.0 : 0.0).margin(1e-6));
  }
}

TEST_CASE("round trip: ascend folder and npu_mem within 0.5%, a 10% iteration", "[profile][compare]") {
  const timeline::Timeline sim = testing::KnownTimeline(4);
  const std::string dir = testing::TempPath("rt_ascend_pt");
  testing::WriteAscendFolder(sim, dir);
  const compare::Report folder = compare::Compare(LoadProfile(dir, Format::kAuto), sim, {});
  REQUIRE(folder.iterations.size() == 4);
  CHECK(std::fabs(*folder.overall_error_pct.peak_allocated) <= 0.5);
  CHECK(std::fabs(*folder.overall_error_pct.peak_reserved) <= 0.5);
  CHECK(std::fabs(*folder.overall_error_pct.peak_device) <= 0.5);
  CHECK(*folder.overall_curve_error_pct <= 0.5);

  const std::string mem = testing::TempPath("rt_npu_mem.csv");
  testing::WriteFile(mem, testing::WriteNpuMem(sim));
  const compare::Report npu_mem = compare::Compare(LoadProfile(mem, Format::kAuto), sim, {});
  CHECK(std::fabs(*npu_mem.overall_error_pct.peak_device) <= 0.5);
  CHECK(std::fabs(*npu_mem.converged_device_error_pct) <= 0.5);

  timeline::Timeline scaled = sim;
  testing::ScaleIteration(scaled, 3, 1.10);
  testing::WriteAscendFolder(scaled, dir);
  const compare::Report r = compare::Compare(LoadProfile(dir, Format::kAuto), sim, {});
  REQUIRE(r.iterations.size() == 4);
  for (const auto& it : r.iterations) {
    INFO(it.iteration);
    // (1.1 s - s) / s = +10% in iteration 3; the MiB floats of the CSV round to the byte.
    CHECK(*it.error_pct.peak_allocated == Approx(it.iteration == 3 ? 10.0 : 0.0).margin(1e-6));
  }
}

}  // namespace
}  // namespace memsim::profile
