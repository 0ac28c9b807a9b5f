// The CSV trace grammar and the replay id rules of design.md "Allocator traces"; snapshot
// replays (reference/formats.md §2); `memsim replay` end to end (exit codes, --json, --csv).
#include "replay/trace.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "core/error.h"
#include "replay/snapshot.h"

namespace memsim::replay {
namespace {

constexpr Bytes MiB = kMiB;

alloc::AllocatorStats ReplayText(const std::string& text, alloc::AllocatorOptions o = {}) {
  const Trace t = ParseTrace(text, "t.csv", 0);
  auto a = alloc::NewCachingAllocator(o);
  return Replay(t, *a, false).stats;
}

std::string ErrorOf(const std::string& text, alloc::AllocatorOptions o = {}) {
  try {
    ReplayText(text, o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("csv: header, comments, blank lines, CRLF, omitted trailing fields", "[replay]") {
  const Trace t = ParseCsvTrace(
      "op,id,bytes,stream\r\n# a comment\r\n\r\n malloc , a , 1000 , 1 \r\nfree,a\r\n"
      "complete,,,1\r\nempty_cache\r\ncomplete,ignored,,2\n",
      "t.csv");
  REQUIRE(t.records.size() == 5);
  CHECK(t.records[0] == TraceRecord{TraceOp::kMalloc, 0, 1000, 1, 4});
  CHECK(t.records[1] == TraceRecord{TraceOp::kFree, 0, 0, 0, 5});
  CHECK(t.records[2] == TraceRecord{TraceOp::kComplete, -1, 0, 1, 6});
  CHECK(t.records[3] == TraceRecord{TraceOp::kEmptyCache, -1, 0, 0, 7});
  CHECK(t.records[4] == TraceRecord{TraceOp::kComplete, -1, 0, 2, 8});
  CHECK(t.ids == std::vector<std::string>{"a"});
  // The header may follow comments; after the first operation it is an unknown op.
  CHECK(ParseCsvTrace("# memsim trace\nop,id,bytes,stream\nmalloc,a,1\n", "t.csv").records.size()
        == 1);
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,1\nop,id,bytes,stream\n", "t.csv"),
                    "t.csv:2: unknown op 'op' (expected malloc, free, record_stream, complete, "
                    "empty_cache)");
}

TEST_CASE("csv: syntax errors name the line", "[replay]") {
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,10\nmallco,b,1\n", "trace.csv"),
                    "trace.csv:2: unknown op 'mallco' (expected malloc, free, record_stream, "
                    "complete, empty_cache)");
  CHECK_THROWS_WITH(ParseCsvTrace("MALLOC,a,10\n", "trace.csv"),
                    "trace.csv:1: unknown op 'MALLOC' (expected malloc, free, record_stream, "
                    "complete, empty_cache)");
  CHECK_THROWS_WITH(ParseCsvTrace("# c\nmalloc,a,-5\n", "trace.csv"),
                    "trace.csv:2: bytes: expected a non-negative integer below 2^63, got '-5'");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,1.5\n", "trace.csv"),
                    "trace.csv:1: bytes: expected a non-negative integer below 2^63, got '1.5'");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,9223372036854775808\n", "trace.csv"),
                    "trace.csv:1: bytes: expected a non-negative integer below 2^63, got "
                    "'9223372036854775808'");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,10,x\n", "trace.csv"),
                    "trace.csv:1: stream: expected a non-negative integer below 2^31, got 'x'");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,10,2147483648\n", "trace.csv"),
                    "trace.csv:1: stream: expected a non-negative integer below 2^31, got "
                    "'2147483648'");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,10,0,extra\n", "trace.csv"),
                    "trace.csv:1: too many fields (expected at most 4: op,id,bytes,stream)");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,,10\n", "trace.csv"), "trace.csv:1: malloc needs an id");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a\n", "trace.csv"), "trace.csv:1: malloc needs bytes");
  CHECK_THROWS_WITH(ParseCsvTrace("free\n", "trace.csv"), "trace.csv:1: free needs an id");
}

TEST_CASE("replay: id rules", "[replay]") {
  CHECK(ErrorOf("free,x\n") == "t.csv:1: free of id 'x' that was never allocated");
  CHECK(ErrorOf("malloc,a,1\nrecord_stream,b,,1\n") ==
        "t.csv:2: record_stream of id 'b' that was never allocated");
  CHECK(ErrorOf("malloc,a,1\nmalloc,a,1\n") ==
        "t.csv:2: malloc of id 'a' that is still allocated (since line 1)");
  CHECK(ErrorOf("malloc,a,1\nfree,a\nfree,a\n") ==
        "t.csv:3: free of id 'a' that is not allocated (freed at line 2)");
  CHECK(ErrorOf("malloc,a,1\nfree,a\nrecord_stream,a,,1\n") ==
        "t.csv:3: record_stream of id 'a' that is not allocated (freed at line 2)");
  // An id can be reused after its free.
  CHECK(ErrorOf("malloc,a,1\nfree,a\nmalloc,a,1\nfree,a\n") == "(no error)");
}

TEST_CASE("replay: zero-byte, oversized and failed mallocs leave nothing behind", "[replay]") {
  // malloc of 0 bytes does nothing; its frees do nothing (allocate(0)).
  alloc::AllocatorStats s = ReplayText("malloc,z,0\nfree,z\nfree,z\nrecord_stream,z,,1\n");
  CHECK(s == alloc::AllocatorStats{});
  // >= 2^60 bytes fails before the allocator's stats are touched (no num_ooms).
  s = ReplayText("malloc,h,1152921504606846976\nfree,h\n");
  CHECK(s == alloc::AllocatorStats{});
  // Just below 2^60, eight times: "unbounded" stops at 2^62 reserved bytes (no overflow).
  std::string many;
  for (int i = 0; i < 8; ++i) many += "malloc,m" + std::to_string(i) + ",1152921504606846975\n";
  s = ReplayText(many);
  CHECK(s.reserved_bytes.current == 4 * 1152921504606846976LL);  // 4 x 2^60 = 2^62
  CHECK(s.num_ooms == 4);
  // A failed malloc counts (retry + OOM) and its id stays unallocated.
  alloc::AllocatorOptions o;
  o.capacity_bytes = 10 * MiB;
  s = ReplayText("malloc,big,20971520\nrecord_stream,big,,1\nfree,big\nmalloc,big,1000\n", o);
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.allocated_bytes.current == 1024);  // the later malloc of 1000 bytes
}

TEST_CASE("replay: pending frees stay pending at the end", "[replay]") {
  const alloc::AllocatorStats s = ReplayText("malloc,a,12582912,0\nrecord_stream,a,,1\nfree,a\n");
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.active_bytes.current == 12 * MiB);
}

// ---- snapshots ----

const char* kSnapshot = R"({
  "segments": [
    {"device": 0, "address": 139900000000000, "total_size": 20971520, "allocated_size": 8388608,
     "active_size": 8388608, "requested_size": 8000000, "stream": 0, "segment_type": "large",
     "segment_pool_id": [0, 0], "is_expandable": false, "frames": [], "blocks": []},
    {"device": 1, "address": 1, "total_size": 2097152, "stream": 0, "blocks": []}
  ],
  "device_traces": [[
    {"action": "segment_alloc", "addr": 139900000000000, "size": 20971520, "stream": 0},
    {"action": "alloc", "addr": 139900000000000, "size": 8388608, "stream": 0},
    {"action": "alloc", "addr": 139900008388608, "size": 4194304, "stream": 0},
    {"action": "free_requested", "addr": 139900008388608, "size": 4194304, "stream": 0},
    {"action": "free_completed", "addr": 139900008388608, "size": 4194304, "stream": 0},
    {"action": "free_requested", "addr": 5, "size": 512, "stream": 0},
    {"action": "oom", "device_free": 1048576, "size": 107374182400, "stream": 0}
  ], []]
})";

TEST_CASE("snapshot: device_traces replay with a fidelity record", "[replay]") {
  const Trace t = ParseTrace(kSnapshot, "snap.json", 0);
  REQUIRE(t.snapshot.has_value());
  CHECK(t.snapshot->segment_allocs == 1);
  CHECK(t.snapshot->reserved_end_bytes == 20 * MiB);  // device 0's segments only
  CHECK(t.snapshot->skipped == 1);                    // the free of address 5 never allocated
  auto a = alloc::NewCachingAllocator({});
  const alloc::AllocatorStats s = Replay(t, *a, false).stats;
  // 8 MiB (< 10 MiB: a 20 MiB buffer, split), then 4 MiB from the remainder, then freed.
  CHECK(s.allocated_bytes.current == 8 * MiB);
  CHECK(s.reserved_bytes.current == 20 * MiB);
  CHECK(s.num_device_alloc == 1);
}

TEST_CASE("snapshot: a late free_completed defers the block's return", "[replay]") {
  const char* snap = R"({"segments": [], "device_traces": [[
    {"action": "alloc", "addr": 100, "size": 12582912, "stream": 7},
    {"action": "free_requested", "addr": 100, "size": 12582912, "stream": 7},
    {"action": "alloc", "addr": 200, "size": 12582912, "stream": 7},
    {"action": "free_completed", "addr": 100, "size": 12582912, "stream": 7},
    {"action": "alloc", "addr": 300, "size": 12582912, "stream": 7}
  ]]})";
  const Trace t = ParseTrace(snap, "snap.json", 0);
  auto a = alloc::NewCachingAllocator({});
  const alloc::AllocatorStats s = Replay(t, *a, false).stats;
  // The second alloc cannot reuse the first (still in use): a second 12 MiB segment, active
  // 24 MiB. The third comes after free_completed: the first block returns to the pool at that
  // malloc and is reused, so active never exceeds 24 MiB.
  CHECK(s.reserved_bytes.current == 24 * MiB);
  CHECK(s.allocated_bytes.current == 24 * MiB);
  CHECK(s.active_bytes.peak == 24 * MiB);
  CHECK(s.num_device_alloc == 2);
}

TEST_CASE("snapshot: malformed input", "[replay]") {
  CHECK_THROWS_WITH(ParseTrace("{\n\"segments\": [,]\n}", "snap.json", 0),
                    "snap.json:2: malformed JSON snapshot (byte 16)");
  CHECK_THROWS_WITH(ParseTrace(R"({"x": 1})", "snap.json", 0),
                    "snap.json: not a PyTorch memory snapshot (no 'segments' or 'device_traces')");
  CHECK_THROWS_WITH(ParseTrace(kSnapshot, "snap.json", 3),
                    "snap.json: device index 3 not in the snapshot (2 device traces)");
  CHECK_THROWS_WITH(
      ParseTrace(R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": -4}]]})",
                 "snap.json", 0),
      "snap.json:entry 0: 'size' must be a non-negative integer");
  CHECK_THROWS_WITH(
      ParseTrace(R"({"device_traces": [[{"action": "allocate", "addr": 1, "size": 4}]]})",
                 "snap.json", 0),
      "snap.json:entry 0: unknown action 'allocate'");
}

// ---- the command line ----

struct Run {
  int exit_code;
  std::string out, err;
};

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("memsim_replay_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::filesystem::path Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return path_ / name;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

Run Memsim(const TempDir& dir, const std::string& args) {
  const auto out = dir.path() / "stdout", err = dir.path() / "stderr";
  const std::string cmd = "cd '" + dir.path().string() + "' && '" MEMSIM_BINARY "' " + args +
                          " > '" + out.string() + "' 2> '" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, Slurp(out), Slurp(err)};
}

TEST_CASE("memsim replay: bad traces exit 2 with one message", "[replay]") {
  TempDir dir;
  dir.Write("bad.csv", "malloc,a,10\nmallco,b,1\n");
  Run r = Memsim(dir, "replay bad.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "memsim replay: bad.csv:2: unknown op 'mallco' (expected malloc, free, record_stream, "
        "complete, empty_cache)\n");
  dir.Write("neg.csv", "malloc,a,-1\n");
  r = Memsim(dir, "replay neg.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "memsim replay: neg.csv:1: bytes: expected a non-negative integer below 2^63, got '-1'\n");
  dir.Write("never.csv", "malloc,a,10\nfree,b\n");
  r = Memsim(dir, "replay never.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: never.csv:2: free of id 'b' that was never allocated\n");
  dir.Write("live.csv", "malloc,a,10\nmalloc,a,10\n");
  r = Memsim(dir, "replay live.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "memsim replay: live.csv:2: malloc of id 'a' that is still allocated (since line 1)\n");
  dir.Write("bad.json", "{\"device_traces\": [[}");
  r = Memsim(dir, "replay bad.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: bad.json:1: malformed JSON snapshot (byte 21)\n");
  r = Memsim(dir, "replay missing.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: cannot read trace 'missing.csv': No such file or directory\n");
  dir.Write("ok.csv", "malloc,a,10\n");
  r = Memsim(dir, "replay ok.csv --alloc-conf memory_fraction:0.5");
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "memsim replay: --alloc-conf: memory_fraction needs a device capacity (--capacity)\n");
  r = Memsim(dir, "replay ok.csv --backend npu --alloc-conf max_non_split_rounding_mb:30");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: --alloc-conf: 'max_non_split_rounding_mb' is not an option of "
                 "the npu backend\n");
  r = Memsim(dir, "replay ok.csv --capacity 10XB");
  CHECK(r.exit_code == 2);
}

TEST_CASE("memsim replay: --json and --csv", "[replay]") {
  TempDir dir;
  // Case 19 of allocator.md §11 plus the OOM path: a (12 MiB) recorded on stream 2 and freed
  // stays active; b cannot reuse it (24 MiB reserved, 2 segments, active 24 MiB); c (30 MiB):
  // 24 + 30 > 42 MiB capacity; release_cached_blocks synchronizes a's free and releases its
  // segment (12 MiB reserved, active 12 MiB); the retry succeeds: 42 MiB everywhere. Peak
  // active is therefore 42 MiB = 44,040,192, never a + b + c.
  dir.Write("t.csv",
            "op,id,bytes,stream\nmalloc,a,12582912,0\nrecord_stream,a,,2\nfree,a\n"
            "malloc,b,12582912,0\nmalloc,c,31457280\n");
  const Run r = Memsim(dir, "replay t.csv --capacity 42MiB --json out.json --csv out.csv");
  REQUIRE(r.exit_code == 0);
  CHECK(Slurp(dir.path() / "out.json") ==
        "{\"schema_version\": 1, \"memsim_version\": \"" MEMSIM_VERSION
        "\", \"backend\": \"cuda\", \"operations\": 5, "
        "\"final\": {\"allocated_bytes\": 44040192, \"reserved_bytes\": 44040192, "
        "\"active_bytes\": 44040192, \"requested_bytes\": 44040192, \"inactive_split_bytes\": 0, "
        "\"segment\": 2, \"num_alloc_retries\": 1, \"num_ooms\": 0}, "
        "\"peak\": {\"allocated_bytes\": 44040192, \"reserved_bytes\": 44040192, "
        "\"active_bytes\": 44040192, \"requested_bytes\": 44040192, \"inactive_split_bytes\": 0, "
        "\"segment\": 2, \"num_alloc_retries\": 1, \"num_ooms\": 0}}\n");
  CHECK(Slurp(dir.path() / "out.csv") ==
        "op_index,op,allocated_bytes,reserved_bytes,active_bytes\n"
        "1,malloc,12582912,12582912,12582912\n"
        "2,record_stream,12582912,12582912,12582912\n"
        "3,free,0,12582912,12582912\n"
        "4,malloc,12582912,25165824,25165824\n"
        "5,malloc,44040192,44040192,44040192\n");
}

}  // namespace
}  // namespace memsim::replay
