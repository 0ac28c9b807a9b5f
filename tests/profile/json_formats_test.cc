// Chrome trace and memory snapshot importers against hand-written fixtures (data/), plus their
// round trips and error messages.
#include <cmath>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "compare/compare.h"
#include "core/error.h"
#include "profile/profile.h"
#include "profile/writers.h"

namespace memsim::profile {
namespace {

using testing::DataPath;
using timeline::kUnknownBytes;

TEST_CASE("Chrome trace, new Kineto: relative ts, unsorted, CPU and device 1 events", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("trace_new.json"), Format::kTorchTrace);
  // Device 0 events sorted by ts: 5011000.000 (before ProfilerStep#3), 5012010.007,
  // 5013500.250 (both inside ProfilerStep#3 = [5012000.125, 5093000.625) -> iteration 4),
  // 5100000.001 (inside ProfilerStep#4 -> iteration 5). The CPU event (Device Type 0) and
  // device 1 are not in the curve. Times relative to the earliest, 5011000.000.
  REQUIRE(t.samples.size() == 4);
  CHECK(t.device_index == 0);
  CHECK(t.samples[0].time_us == 0);
  CHECK(t.samples[0].iteration == -1);
  CHECK(t.samples[0].allocated_bytes == 1073741824);
  CHECK(t.samples[1].time_us == 1010.007);
  CHECK(t.samples[1].iteration == 4);
  CHECK(t.samples[1].allocated_bytes == 2214592512);
  CHECK(t.samples[1].reserved_bytes == 4294967296);
  CHECK(t.samples[2].time_us == 2500.25);
  CHECK(t.samples[2].allocated_bytes == 2147483648);
  CHECK(t.samples[3].time_us == 89000.001);
  CHECK(t.samples[3].iteration == 5);
  CHECK(t.samples[3].reserved_bytes == 6442450944);
  CHECK(t.samples[3].device_bytes == kUnknownBytes);
  REQUIRE(t.markers.size() == 2);  // the gpu_user_annotation mirror is not an iteration
  CHECK(t.markers[0] == timeline::Marker{1000.125, 4, Phase::kUnknown, "ProfilerStep#3"});
  CHECK(t.markers[1] == timeline::Marker{82000.625, 5, Phase::kUnknown, "ProfilerStep#4"});
  LoadProfileOptions o;
  o.device_index = 1;
  const timeline::Timeline d1 = LoadProfile(DataPath("trace_new.json"), Format::kTorchTrace, o);
  REQUIRE(d1.samples.size() == 1);
  CHECK(d1.samples[0].reserved_bytes == 2000);
}

TEST_CASE("Chrome trace, old Kineto: absolute integer ts, Bytes only, and .json.gz", "[profile]") {
  for (const char* file : {"trace_old.json", "trace_old.json.gz"}) {
    INFO(file);
    const timeline::Timeline t = LoadProfile(DataPath(file), Format::kAuto);
    // No Total Allocated: Bytes integrated in ts order: +1 MiB at ..234, -1 MiB at ..250,
    // +2 MiB at ..300 -> 1 MiB, 0, 2 MiB at 0, 16, 66 us.
    REQUIRE(t.samples.size() == 3);
    CHECK(t.samples[0].allocated_bytes == 1048576);
    CHECK(t.samples[1].time_us == 16);
    CHECK(t.samples[1].allocated_bytes == 0);
    CHECK(t.samples[2].time_us == 66);
    CHECK(t.samples[2].allocated_bytes == 2097152);
    CHECK(t.samples[2].reserved_bytes == kUnknownBytes);
    CHECK(t.notes[0] == "detected torch-trace: JSON with traceEvents (Chrome trace)");
  }
}

TEST_CASE("memory snapshot: final state from segments, trace walked backwards", "[profile]") {
  const timeline::Timeline t = LoadProfile(DataPath("snapshot.json"), Format::kAuto);
  // Final: reserved 20971520 (device 0 segment), allocated = active = round512(7999999) =
  // 8000000. Undoing, newest first: oom (no change); free_completed +4194304 active;
  // free_requested +4194304 allocated; alloc B -4194304 both; alloc A -8000000 both;
  // segment_alloc -20971520 reserved. One sample before the first entry, one after each.
  REQUIRE(t.samples.size() == 7);
  const Bytes R = 20971520;
  const Bytes expected[7][4] = {
      // time_us, allocated, reserved, active
      {0, 0, 0, 0},                        // before segment_alloc (t = 100)
      {0, 0, R, 0},                        // after segment_alloc
      {20, 8000000, R, 8000000},           // alloc A at 120
      {200, 12194304, R, 12194304},        // alloc B at 300
      {800, 8000000, R, 12194304},         // free_requested at 900: allocated drops
      {800, 8000000, R, 8000000},          // free_completed at 900: active drops
      {1400, 8000000, R, 8000000},         // oom at 1500
  };
  for (int i = 0; i < 7; ++i) {
    INFO(i);
    CHECK(t.samples[i].time_us == expected[i][0]);
    CHECK(t.samples[i].allocated_bytes == expected[i][1]);
    CHECK(t.samples[i].reserved_bytes == expected[i][2]);
    CHECK(t.samples[i].active_bytes == expected[i][3]);
  }
}

compare::Report RoundTrip(const std::string& text, const std::string& name,
                          const timeline::Timeline& sim) {
  const std::string path = testing::TempPath(name);
  testing::WriteFile(path, text);
  return compare::Compare(LoadProfile(path, Format::kAuto), sim, {});
}

TEST_CASE("round trip: Chrome trace and snapshot within 0.5%", "[profile][compare]") {
  const timeline::Timeline sim = testing::KnownTimeline(6);
  const compare::Report trace = RoundTrip(testing::WriteChromeTrace(sim), "rt_trace.json", sim);
  REQUIRE(trace.iterations.size() == 6);  // ProfilerStep#0..5 -> iterations 1..6
  CHECK(trace.iterations[0].simulated_iteration == 1);
  CHECK(trace.iterations[0].phase_normalised);
  const compare::Report snap = RoundTrip(testing::WriteSnapshot(sim), "rt_snap.json", sim);
  CHECK(snap.iterations.size() == 5);  // detected from the curve: iterations 2..6
  for (const compare::Report* r : {&trace, &snap}) {
    REQUIRE(r->overall_error_pct.peak_allocated);
    CHECK(std::fabs(*r->overall_error_pct.peak_allocated) <= 0.5);
    CHECK(std::fabs(*r->overall_error_pct.peak_reserved) <= 0.5);
    REQUIRE(r->overall_curve_error_pct);
    CHECK(*r->overall_curve_error_pct <= 0.5);
    for (const auto& it : r->iterations) CHECK(std::fabs(*it.error_pct.peak_allocated) <= 0.5);
  }
}

TEST_CASE("Chrome trace with one iteration scaled by 10%", "[profile][compare]") {
  const timeline::Timeline sim = testing::KnownTimeline(4);
  timeline::Timeline scaled = sim;
  testing::ScaleIteration(scaled, 2, 1.10);
  const compare::Report r = RoundTrip(testing::WriteChromeTrace(scaled), "rt_trace10.json", sim);
  REQUIRE(r.iterations.size() == 4);
  for (const auto& it : r.iterations) {
    INFO(it.iteration);
    // (1.1 s - s) / s = +10% in iteration 2, 0 elsewhere.
    CHECK(*it.error_pct.peak_allocated == Approx(it.iteration == 2 ? 10.0 : 0.0).margin(1e-6));
  }
}

TEST_CASE("memory snapshot with one iteration scaled by 10%", "[profile][compare]") {
  // A snapshot has allocator data but no iteration markers. One iteration scaled by 10% breaks
  // the periodicity the detector relies on, so -- as a user would -- say how many iterations
  // the profile covers (--profile-iterations 6). Scaling iteration 4's bytes by 1.1 must show
  // as (1.1 s - s) / s = +10% on iteration 4 and 0 on the others.
  const timeline::Timeline sim = testing::KnownTimeline(6);
  timeline::Timeline scaled = sim;
  testing::ScaleIteration(scaled, 4, 1.10);
  const std::string path = testing::TempPath("rt_snap10.json");
  testing::WriteFile(path, testing::WriteSnapshot(scaled));
  compare::CompareOptions options;
  options.profile_iterations = 6;
  const compare::Report r = compare::Compare(LoadProfile(path, Format::kAuto), sim, options);
  REQUIRE(r.iterations.size() == 6);
  int scaled_seen = 0;
  for (const auto& it : r.iterations) {
    INFO("profile iteration " << it.iteration << " vs simulated " << it.simulated_iteration);
    REQUIRE(it.error_pct.peak_allocated);
    if (it.simulated_iteration == 4) {
      ++scaled_seen;
      CHECK(*it.error_pct.peak_allocated == Approx(10.0).margin(0.5));
    } else {
      CHECK(std::fabs(*it.error_pct.peak_allocated) <= 0.5);
    }
  }
  CHECK(scaled_seen == 1);
}

std::string Error(const std::string& path, Format f) {
  try {
    LoadProfile(path, f);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST_CASE("JSON errors: truncated, corrupt gzip, wrong kind, bad field", "[profile]") {
  std::ifstream in(DataPath("trace_old.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::string cut = testing::TempPath("cut.json");
  testing::WriteFile(cut, text.substr(0, 200));  // ends inside an event: offset 200 = the end
  CHECK(Error(cut, Format::kTorchTrace) ==
        cut + ": byte 200: truncated JSON (unexpected end of input), expected a Chrome trace JSON object");
  std::ifstream gz_in(DataPath("trace_old.json.gz"), std::ios::binary);
  std::stringstream gz;
  gz << gz_in.rdbuf();
  const std::string cut_gz = testing::TempPath("cut.json.gz");
  testing::WriteFile(cut_gz, gz.str().substr(0, 150));
  const std::string message = Error(cut_gz, Format::kTorchTrace);
  CHECK(message.rfind(cut_gz + ": byte ", 0) == 0);
  CHECK(message.find(": truncated gzip data, expected a complete .gz file") != std::string::npos);
  CHECK(Error(DataPath("snapshot.json"), Format::kTorchTrace) ==
        DataPath("snapshot.json") + ": no 'traceEvents' array, expected a PyTorch profiler Chrome trace");
  CHECK(Error(DataPath("trace_new.json"), Format::kTorchSnapshot) ==
        DataPath("trace_new.json") +
            ": /segments: expected a memory snapshot object with 'segments' and 'device_traces' "
            "arrays (torch.cuda.memory._snapshot())");
  const std::string bad = testing::TempPath("bad_snap.json");
  testing::WriteFile(bad, "{\"segments\": [], \"device_traces\": [[{\"action\": \"alloc\", "
                          "\"addr\": 1, \"size\": \"big\"}]]}");
  CHECK(Error(bad, Format::kTorchSnapshot) == bad + ": /device_traces/0/0/size: expected an integer");
  const std::string garbage = testing::TempPath("garbage.json");
  testing::WriteFile(garbage, "{\"traceEvents\": [}");
  // '}' is byte 17 (0-based) of {"traceEvents": [}
  CHECK(Error(garbage, Format::kTorchTrace) ==
        garbage + ": byte 17: invalid JSON (syntax error while parsing value - unexpected '}'; "
                  "expected '[', '{', or a literal), expected a Chrome trace JSON object");
}

}  // namespace
}  // namespace memsim::profile

namespace memsim::profile {
namespace {

TEST_CASE("memory snapshot: legacy bare segment list and the torch_npu variant", "[profile]") {
  // Legacy (F 2.2): the whole file is the list of segments; no trace: one sample, the final
  // state. Block without requested_size: history real_size 1000 + 24 = 1024 -> round512 = 1024.
  const std::string legacy = testing::TempPath("legacy_snap.json");
  testing::WriteFile(legacy,
                     "[{\"device\": 0, \"address\": 1, \"total_size\": 2097152, \"blocks\": ["
                     "{\"size\": 1024, \"state\": \"active_allocated\", \"history\": [{\"addr\": 1, "
                     "\"real_size\": 1000}, {\"addr\": 1, \"real_size\": 24}]},"
                     "{\"size\": 2096128, \"state\": \"inactive\"}]}]");
  const timeline::Timeline t = LoadProfile(legacy, Format::kAuto);
  REQUIRE(t.samples.size() == 1);
  CHECK(t.samples[0].reserved_bytes == 2097152);
  CHECK(t.samples[0].allocated_bytes == 1024);
  // torch_npu (A5): no time_us, a pool_id per entry, workspace_snapshot entries. Entries are
  // 1 us apart: segment_alloc 4 MiB, alloc 1 MiB, workspace_snapshot, free_requested 1 MiB.
  const std::string npu = testing::TempPath("npu_snap.json");
  testing::WriteFile(npu,
                     "{\"segments\": [{\"device\": 0, \"total_size\": 4194304, \"blocks\": "
                     "[{\"size\": 1048576, \"requested_size\": 1048576, \"state\": "
                     "\"active_pending_free\"}, {\"size\": 3145728, \"state\": \"inactive\"}]}],"
                     " \"device_traces\": [[{\"action\": \"segment_alloc\", \"addr\": 1, \"size\": "
                     "4194304, \"stream\": 0, \"pool_id\": 0}, {\"action\": \"alloc\", \"addr\": 1, "
                     "\"size\": 1048576, \"stream\": 0, \"pool_id\": 0}, {\"action\": "
                     "\"workspace_snapshot\", \"addr\": 0, \"size\": 0, \"pool_id\": 0}, {\"action\": "
                     "\"free_requested\", \"addr\": 1, \"size\": 1048576, \"stream\": 0, \"pool_id\": 0}]]}");
  const timeline::Timeline n = LoadProfile(npu, Format::kTorchSnapshot);
  REQUIRE(n.samples.size() == 5);
  CHECK(n.samples[2].time_us == 1);  // after the alloc (entry 1)
  CHECK(n.samples[2].allocated_bytes == 1048576);
  CHECK(n.samples[4].time_us == 3);
  CHECK(n.samples[4].allocated_bytes == 0);
  // The free was requested but never completed: the block is still active (its final state
  // says active_pending_free).
  CHECK(n.samples[4].active_bytes == 1048576);
}

}  // namespace
}  // namespace memsim::profile
