// The CSV trace grammar and the replay id rules of docs/interfaces.md, 'Allocator traces';
// snapshot replays (docs/interfaces.md, 'Snapshot replay'); `memsim replay` end to end (exit codes,
// --json, --csv).
#include "replay/trace.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "cli/cli_test_util.h"
#include <fmt/core.h>

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

// replay/trace.cc reads plain `malloc`/`free` lines in one pass and every other line with the
// full parser; a blank around a field sends the same line to the full parser, so each pair below
// must give the same record (the numbers are the text's own: 18 digits is the longest bytes
// field and 9 the longest stream field the one-pass reader takes, the next lengths go through
// the full parser).
TEST_CASE("csv: the one-pass reader and the full parser give the same records", "[replay]") {
  const std::vector<std::string> lines = {
      "malloc,a,1000,1",     "free,a,,3",           "malloc,b,5,",         "free,b,7,0",
      "malloc,c,999999999999999999,123456789",      "free,c,0,0",
      "malloc,d,1000000000000000000,2147483647",    "malloc,id with space,1,0"};
  std::string plain, padded;
  for (const std::string& line : lines) {
    plain += line + "\n";
    padded += " " + line + "\r\n";  // blanks and CR: the full parser only
  }
  const Trace a = ParseCsvTrace(plain, "t.csv");
  const Trace b = ParseCsvTrace(padded, "t.csv");
  REQUIRE(a.records.size() == lines.size());
  CHECK(a.records == b.records);
  CHECK(a.ids == b.ids);
  CHECK(a.records[1] == TraceRecord{TraceOp::kFree, 0, 0, 3, 2});
  CHECK(a.records[2] == TraceRecord{TraceOp::kMalloc, 1, 5, 0, 3});
  CHECK(a.records[4] == TraceRecord{TraceOp::kMalloc, 2, 999999999999999999, 123456789, 5});
  CHECK(a.records[6] == TraceRecord{TraceOp::kMalloc, 3, 1000000000000000000, 2147483647, 7});
  CHECK(a.ids.back() == "id with space");
  // Lines the one-pass reader declines are still reported by the full parser.
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,10\nmalloc,b,,0\n", "t.csv"),
                    "t.csv:2: malloc needs bytes");
  CHECK_THROWS_WITH(ParseCsvTrace("free,a,12a,0\n", "t.csv"),
                    "t.csv:1: bytes: expected a non-negative integer below 2^63, got '12a'");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,1,0,\n", "t.csv"),
                    "t.csv:1: too many fields (expected at most 4: op,id,bytes,stream)");
}

// The one-pass reader looks for an id's end 8 bytes at a time (byte by byte in the last 7
// bytes of the text) and hashes an id's last 1 to 7 bytes as one word; the full parser reads
// the same id from a padded line. Ids of every length from 1 to 20 bytes, and ids with a tab or
// a control byte inside (which the one-pass reader declines), are malloc'd on plain lines and
// freed on padded ones: each must be interned once, the free naming the malloc's id.
TEST_CASE("csv: both readers intern an id alike, whatever its length", "[replay]") {
  std::vector<std::string> ids;
  for (int n = 1; n <= 20; ++n) ids.push_back(std::string(n - 1, 'k') + static_cast<char>('a' + n));
  ids.push_back("tab\tinside");
  ids.push_back(std::string("ctl\x01") + "inside");
  std::string text;
  for (const std::string& id : ids) text += "malloc," + id + ",1,0\n";
  for (const std::string& id : ids) text += " free," + id + " \n";
  text += "malloc,q,1";  // a last line shorter than 8 bytes, without a line end
  const Trace t = ParseCsvTrace(text, "t.csv");
  REQUIRE(t.records.size() == 2 * ids.size() + 1);
  REQUIRE(t.ids.size() == ids.size() + 1);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    CHECK(t.ids[k] == ids[k]);
    CHECK(t.records[k].id == static_cast<std::int32_t>(k));
    CHECK(t.records[ids.size() + k].id == static_cast<std::int32_t>(k));
  }
  CHECK(t.records.back() == TraceRecord{TraceOp::kMalloc, static_cast<std::int32_t>(ids.size()), 1,
                                        0, static_cast<std::int32_t>(2 * ids.size() + 1)});
}

TEST_CASE("csv: a stream written in the bytes place of record_stream / complete is an error",
          "[replay]") {
  // docs/interfaces.md 'Allocator traces': the fields are op,id,bytes,stream; record_stream and
  // complete use only the stream, so `record_stream,w,1` (3 fields) would mean stream 0.
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,w,4194304\nrecord_stream,w,1\n", "t.csv"),
                    "t.csv:2: record_stream: the stream is the 4th field (op,id,bytes,stream) and "
                    "the 3rd is not used: write record_stream,ID,,STREAM");
  CHECK_THROWS_WITH(ParseCsvTrace("complete,,1\n", "t.csv"),
                    "t.csv:1: complete: the stream is the 4th field (op,id,bytes,stream) and the "
                    "3rd is not used: write complete,,,STREAM");
  // With the stream given, the bytes are ignored (alloc_bench --write-csv writes all 4 fields).
  const Trace t = ParseCsvTrace("malloc,w,512,0\nrecord_stream,w,0,1\ncomplete,,0,1\n", "t.csv");
  REQUIRE(t.records.size() == 3);
  CHECK(t.records[1].stream == 1);
  CHECK(t.records[2].stream == 1);
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

TEST_CASE("csv: binary and long fields are escaped and cut in messages", "[replay]") {
  // Bytes outside 0x20..0x7e print as \xNN; an echoed field keeps its first 60 bytes + "...".
  CHECK(EchoField("ab c") == "ab c");
  CHECK(EchoField(std::string("a\0\x1b\x7f\xff", 5)) == "a\\x00\\x1b\\x7f\\xff");
  CHECK(EchoField(std::string(61, 'x')) == std::string(60, 'x') + "...");
  CHECK(EchoField(std::string(60, 'x')) == std::string(60, 'x'));
  CHECK_THROWS_WITH(ParseCsvTrace(std::string("\x89PNG\x1a\x00,a,1\n", 11), "t.csv"),
                    "t.csv:1: unknown op '\\x89PNG\\x1a\\x00' (expected malloc, free, "
                    "record_stream, complete, empty_cache)");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,1\x01\n", "t.csv"),
                    "t.csv:1: bytes: expected a non-negative integer below 2^63, got '1\\x01'");
  CHECK_THROWS_WITH(ParseCsvTrace("malloc,a,1," + std::string(70, '9') + "\n", "t.csv"),
                    "t.csv:1: stream: expected a non-negative integer below 2^31, got '" +
                        std::string(60, '9') + "...'");
  // Ids echoed by the replay rules are escaped too.
  CHECK(ErrorOf("free,\x1b[31m\n") == "t.csv:1: free of id '\\x1b[31m' that was never allocated");
}

// The CSV timelines memsim writes are other formats: their header says what the file is and
// what replay reads instead (docs/interfaces.md, 'Allocator traces', 'CSV timeline').
TEST_CASE("csv: a memory timeline is named, not parsed as a trace", "[replay]") {
  constexpr const char* kReads =
      "replay reads an allocator trace, lines op,id,bytes,stream, or a PyTorch memory snapshot "
      "(docs/interfaces.md, 'Allocator traces')";
  CHECK_THROWS_WITH(
      ParseTrace("time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,"
                 "device_bytes,parameters_bytes\n0,1,forward,512,2097152,512,2097152,512\n",
                 "t.csv", 0),
      fmt::format("t.csv:1: a memory timeline (header with allocated_bytes: `memsim run --csv` or "
                  "a memsim-csv profile), not an allocator trace; {}; a timeline is a profile "
                  "for `memsim compare --profile` (docs/interfaces.md, 'CSV timeline')",
                  kReads));
  // After comments too; the profile format's columns in any order.
  CHECK_THROWS_WITH(ParseTrace("# recorded\nallocated_bytes,time_us\n512,0\n", "t.csv", 0),
                    Catch::StartsWith("t.csv:2: a memory timeline"));
  CHECK_THROWS_WITH(
      ParseTrace("op_index,op,allocated_bytes,reserved_bytes,active_bytes\n1,malloc,512,2097152,"
                 "512\n",
                 "t.csv", 0),
      fmt::format("t.csv:1: a `memsim replay --csv` timeline (header op_index,op,"
                  "allocated_bytes,...: the stats after each operation), not an allocator trace; "
                  "{}; replay the trace it was written from",
                  kReads));
  // Only as the first line: later it is a malformed line like any other.
  CHECK_THROWS_WITH(ParseTrace("malloc,a,1\ntime_us,allocated_bytes\n", "t.csv", 0),
                    Catch::StartsWith("t.csv:2: unknown op 'time_us'"));
}

// Binary input is refused from its first bytes (a NUL byte among the first 4096), not read as
// one endless line.
TEST_CASE("csv: binary data is refused at once", "[replay]") {
  constexpr const char* kReads =
      "not an allocator trace; replay reads lines op,id,bytes,stream or a PyTorch memory "
      "snapshot (docs/interfaces.md, 'Allocator traces')";
  CHECK_THROWS_WITH(ParseTrace(std::string(64, '\0'), "z.bin", 0),
                    fmt::format("z.bin:1: binary data: a NUL byte at byte 0, {}", kReads));
  CHECK_THROWS_WITH(ParseTrace(std::string("malloc,a,1\n\x89PNG\r\n\x1a\n\0\0", 21), "p.csv", 0),
                    fmt::format("p.csv:4: binary data: a NUL byte at byte 19, {}", kReads));
  CHECK_THROWS_WITH(ParseTrace(std::string("\x1f\x8b\x08\x00", 4), "s.gz", 0),
                    fmt::format("s.gz:1: gzip data (decompress it first): a NUL byte at byte 3, {}",
                                kReads));
  CHECK_THROWS_WITH(ParseTrace(std::string("\xff\xfem\0", 4), "u.csv", 0),
                    Catch::StartsWith("u.csv:1: UTF-16 text (save it as UTF-8): a NUL byte at "
                                      "byte 3"));
  // A NUL byte after the first 4096 bytes is a malformed line like any other.
  const std::string late = std::string(4096, '#') + std::string("\nmalloc\0,a,1\n", 13);
  CHECK_THROWS_WITH(ParseTrace(late, "l.csv", 0), Catch::StartsWith("l.csv:2: unknown op"));
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
      "snap.json: /device_traces/0/0/size: expected a non-negative integer below 2^62 (bytes), "
      "got -4");
  CHECK_THROWS_WITH(
      ParseTrace(R"({"device_traces": [[{"action": "allocate", "addr": 1, "size": 4}]]})",
                 "snap.json", 0),
      "snap.json: /device_traces/0/0/action: unknown action 'allocate'");
}

std::string SnapshotError(const std::string& text) {
  try {
    ParseTrace(text, "snap.json", 0);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("snapshot: every number is range-checked, sums cannot overflow", "[replay]") {
  const std::string expected_size =
      "expected a non-negative integer below 2^62 (bytes), got ";
  // Negative, 2^64 - 1, 2^63 - 1, a float and a string are all refused by pointer.
  CHECK(SnapshotError(R"({"segments": [{"device": 0, "total_size": -5}]})") ==
        "snap.json: /segments/0/total_size: " + expected_size + "-5");
  CHECK(SnapshotError(R"({"segments": [{"total_size": 18446744073709551615}]})") ==
        "snap.json: /segments/0/total_size: " + expected_size + "18446744073709551615");
  CHECK(SnapshotError(R"({"segments": [{"total_size": 1}, {"total_size": 9223372036854775807}]})")
        == "snap.json: /segments/1/total_size: " + expected_size + "9223372036854775807");
  CHECK(SnapshotError(R"({"segments": [{"total_size": 2.0}]})") ==
        "snap.json: /segments/0/total_size: " + expected_size + "2.0");
  CHECK(SnapshotError(R"({"segments": [{"total_size": "2"}]})") ==
        "snap.json: /segments/0/total_size: " + expected_size + "\"2\"");
  CHECK(SnapshotError(R"({"segments": [{"device": 0}]})") ==
        "snap.json: /segments/0/total_size: missing, expected the segment's size in bytes");
  CHECK(SnapshotError(R"({"segments": [5]})") == "snap.json: /segments/0: expected an object, got 5");
  CHECK(SnapshotError(R"({"segments": {"a": 1}})") ==
        "snap.json: /segments: expected a list of segments, got an object");
  // The legacy bare list: pointers start at the root.
  CHECK(SnapshotError(R"([{"total_size": -1}])") == "snap.json: /0/total_size: " + expected_size +
                                                        "-1");
  // A segment of another device is checked too, though it does not count.
  CHECK(SnapshotError(R"({"segments": [{"device": 1, "total_size": -1}]})") ==
        "snap.json: /segments/0/total_size: " + expected_size + "-1");
  // 2^32 used to be truncated to device 0; devices are ints in [0, 2^31).
  const std::string expected_device =
      "expected a device index, an integer from 0 to 2147483647, got ";
  CHECK(SnapshotError(R"({"segments": [{"device": 4294967296, "total_size": 1}]})") ==
        "snap.json: /segments/0/device: " + expected_device + "4294967296");
  CHECK(SnapshotError(R"({"segments": [{"device": -1, "total_size": 1}]})") ==
        "snap.json: /segments/0/device: " + expected_device + "-1");
  // Two segments of 2^61 add up to 2^62: refused at the second. 2^61 = 2305843009213693952.
  CHECK(SnapshotError(
            R"({"segments": [{"total_size": 2305843009213693952}, {"total_size": 2305843009213693952}]})")
        == "snap.json: /segments/1/total_size: the segments of device 0 add up to 2^62 bytes or "
           "more");
  // 2^61 + (2^61 - 1) = 2^62 - 1 = 4611686018427387903 is the largest total accepted; segments
  // of device 1 do not add to device 0's sum.
  const Trace t = ParseTrace(
      R"({"segments": [{"total_size": 2305843009213693952}, {"device": 1, "total_size": 2305843009213693952},
                       {"device": 0, "total_size": 2305843009213693951}]})",
      "snap.json", 0);
  REQUIRE(t.snapshot);
  CHECK(t.snapshot->reserved_end_bytes == 4611686018427387903);
  // Entry sizes follow the same rule: 2^62 = 4611686018427387904 is refused; 2^60 is accepted
  // and replays as the specified out-of-memory no-op (Malloc refuses >= 2^60), as does its free.
  CHECK(SnapshotError(
            R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 4611686018427387904}]]})")
        == "snap.json: /device_traces/0/0/size: " + expected_size + "4611686018427387904");
  const Trace huge = ParseTrace(
      R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 1152921504606846976},
                             {"action": "free_requested", "addr": 1},
                             {"action": "free_completed", "addr": 1}]]})",
      "snap.json", 0);
  auto a = alloc::NewCachingAllocator({});
  const alloc::AllocatorStats s = Replay(huge, *a, false).stats;
  CHECK(s.reserved_bytes.peak == 0);
  CHECK(s.num_ooms == 0);
}

TEST_CASE("snapshot: wrong types become messages with a JSON pointer", "[replay]") {
  // The tester's case: a free_requested followed by an entry whose action is a number used to
  // escape as nlohmann type_error.302.
  CHECK(SnapshotError(R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 4},
      {"action": "free_requested", "addr": 1}, {"action": 5, "addr": 1}]]})") ==
        "snap.json: /device_traces/0/2/action: expected a string, got 5");
  CHECK(SnapshotError(R"({"device_traces": [[{"addr": 1}]]})") ==
        "snap.json: /device_traces/0/0/action: missing, expected a string");
  CHECK(SnapshotError(R"({"device_traces": [[5]]})") ==
        "snap.json: /device_traces/0/0: expected an object, got 5");
  CHECK(SnapshotError(R"({"device_traces": [{"action": "alloc"}]})") ==
        "snap.json: /device_traces/0: expected a list of entries, got an object");
  CHECK(SnapshotError(R"({"device_traces": 7})") ==
        "snap.json: /device_traces: expected a list of lists, got 7");
  const std::string expected_addr = "expected a non-negative integer below 2^64, got ";
  CHECK(SnapshotError(R"({"device_traces": [[{"action": "alloc", "addr": "0x10", "size": 4}]]})")
        == "snap.json: /device_traces/0/0/addr: " + expected_addr + "\"0x10\"");
  CHECK(SnapshotError(R"({"device_traces": [[{"action": "alloc", "addr": 16}]]})") ==
        "snap.json: /device_traces/0/0/size: missing, expected the size in bytes");
  CHECK(SnapshotError(
            R"({"device_traces": [[{"action": "alloc", "addr": 16, "size": 4, "stream": -1}]]})")
        == "snap.json: /device_traces/0/0/stream: " + expected_addr + "-1");
  // A malformed entry right after a free_requested is reported at its own pointer, not taken
  // as the free's free_completed.
  CHECK(SnapshotError(R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 4},
      {"action": "free_requested", "addr": 1}, {"action": "free_completed", "addr": 1.0}]]})")
        == "snap.json: /device_traces/0/2/addr: " + expected_addr + "1.0");
  CHECK(SnapshotError(R"({"device_traces": [[{"action": "free_completed", "addr": null}]]})") ==
        "snap.json: /device_traces/0/0/addr: " + expected_addr + "null");
  // Long or binary values are cut and escaped ("\u0001" is the byte 0x01).
  CHECK(SnapshotError(R"({"device_traces": [[{"action": "x\u0001"}]]})") ==
        "snap.json: /device_traces/0/0/action: unknown action 'x\\x01'");
  CHECK(SnapshotError("{\"device_traces\": [[{\"action\": \"" + std::string(100, 'a') + "\"}]]}") ==
        "snap.json: /device_traces/0/0/action: unknown action '" + std::string(60, 'a') +
            "...'");
  // A number beyond double range is a JSON error with its byte: in
  // {"segments": [{"total_size": 1e400}]} the token 1e400 occupies bytes 30..34 (1-based), and
  // the position is that of the token's last byte.
  CHECK(SnapshotError(R"({"segments": [{"total_size": 1e400}]})") ==
        "snap.json:1: malformed JSON snapshot (byte 34, number out of range)");
}

TEST_CASE("snapshot: a repeated key is an error, not a silent last-wins", "[replay]") {
  CHECK(SnapshotError(
            R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 4, "size": 8}]]})") ==
        "snap.json: /device_traces/0/0/size: duplicate key");
  CHECK(SnapshotError(R"({"segments": [], "device_traces": [], "segments": []})") ==
        "snap.json: /segments: duplicate key");
  // Pointers escape '~' and '/' (RFC 6901); keys the reader ignores are checked too.
  CHECK(SnapshotError(R"({"segments": [{"total_size": 1, "frames": [{}, {"a/b": 1, "a/b": 2}]}]})")
        == "snap.json: /segments/0/frames/1/a~1b: duplicate key");
  // The same key in sibling objects is fine.
  CHECK(SnapshotError(R"({"segments": [{"total_size": 1}, {"total_size": 2}]})") == "(no error)");
}

TEST_CASE("snapshot: a deep nesting is an error, not a stack overflow", "[replay]") {
  // 10^6 nested lists inside the device's trace: refused as the parser opens level 65 (a
  // snapshot nests at most 9), so the time does not grow with the depth (it took 8 s for
  // 5 * 10^6 levels when the whole was parsed).
  constexpr int kDepth = 1000000;
  const std::string deep = "{\"device_traces\": [[" + std::string(kDepth, '[') +
                           std::string(kDepth, ']') + "]]}";
  // `{"device_traces": [[` is 20 bytes and 3 levels: level 65 opens at byte 20 + 62 = 82.
  CHECK(SnapshotError(deep) == "snap.json:1: JSON nested deeper than memsim's limit of 64 levels "
                               "(byte 82; a memory snapshot nests at most 9)");
  // Unclosed: the same error, at the 65th '['.
  const std::string open = "[" + std::string(kDepth, '[');
  CHECK(SnapshotError(open) == "snap.json:1: JSON nested deeper than memsim's limit of 64 levels "
                               "(byte 65; a memory snapshot nests at most 9)");
  // 64 levels are read (here: the device's entry is a list, not an object).
  const std::string at_limit = "{\"device_traces\": [[" + std::string(61, '[') +
                               std::string(61, ']') + "]]}";
  CHECK(SnapshotError(at_limit) == "snap.json: /device_traces/0/0: expected an object, got a list");
}

// ---- the command line ----

using Run = testing::CommandResult;

std::string Slurp(const std::filesystem::path& p) { return testing::ReadAll(p); }

class TempDir : public testing::ScratchDir {
 public:
  TempDir() : ScratchDir("replay") {}
};

Run Memsim(const TempDir& dir, const std::string& args) { return testing::RunMemsim(dir, args); }

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
  r = Memsim(dir, "replay ok.csv --alloc-conf max_split_size_mb:100,max_split_size_mb:200");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: --alloc-conf: duplicate key 'max_split_size_mb'\n");
  r = Memsim(dir, "replay ok.csv --capacity 10XB");
  CHECK(r.exit_code == 2);
  // The same range as run's --capacity (cli/common.h ParseSizeArg: 1 MiB to 2^50 bytes): a device
  // of 0 bytes would make every malloc an out-of-memory and still exit 0.
  r = Memsim(dir, "replay ok.csv --capacity 0");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: --capacity 0: expected a size from 1MiB to 1024TiB (2^50 bytes), "
                 "e.g. 80GiB\n");
  CHECK(r.out.empty());
}

TEST_CASE("memsim replay: malformed snapshots and binary traces exit 2", "[replay]") {
  TempDir dir;
  dir.Write("neg.json", R"({"segments": [{"device": 0, "total_size": -5}]})");
  Run r = Memsim(dir, "replay neg.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: neg.json: /segments/0/total_size: expected a non-negative "
                 "integer below 2^62 (bytes), got -5\n");
  CHECK(r.out.empty());
  dir.Write("dev.json", R"({"segments": [{"device": 4294967296, "total_size": 1}]})");
  r = Memsim(dir, "replay dev.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: dev.json: /segments/0/device: expected a device index, an "
                 "integer from 0 to 2147483647, got 4294967296\n");
  dir.Write("type.json", R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 4},
      {"action": "free_requested", "addr": 1}, {"action": 5, "addr": 1}]]})");
  r = Memsim(dir, "replay type.json --json out.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: type.json: /device_traces/0/2/action: expected a string, got 5\n");
  CHECK(!std::filesystem::exists(dir.path() / "out.json"));
  dir.Write("bin.csv", std::string("malloc,a,1\n\x7f" "ELF\x02\x01,b\n"));
  r = Memsim(dir, "replay bin.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: bin.csv:2: unknown op '\\x7fELF\\x02\\x01' (expected malloc, "
                 "free, record_stream, complete, empty_cache)\n");
}

TEST_CASE("memsim replay: endless and binary input stops at once", "[replay]") {
  TempDir dir;
  // /dev/zero: binary from its first byte (it used to be read up to the 2 GiB trace limit).
  Run r = Memsim(dir, "replay /dev/zero");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: /dev/zero:1: binary data: a NUL byte at byte 0, not an allocator "
                 "trace; replay reads lines op,id,bytes,stream or a PyTorch memory snapshot "
                 "(docs/interfaces.md, 'Allocator traces')\n");
  // Text without a line end: refused once a line passes 2^20 bytes, as soon as more than the
  // first 4 MiB block of it is read (here line 2, 6 MiB long: as an endless stream would be).
  dir.Write("long.csv", "malloc,a,1\n" + std::string(std::size_t{6} << 20, 'x'));
  r = Memsim(dir, "replay long.csv --csv rows.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: long.csv:2: no line end in the first 1048576 bytes of the line: "
                 "not a CSV trace (expected lines op,id,bytes,stream; docs/interfaces.md, "
                 "'Allocator traces')\n");
  CHECK(!std::filesystem::exists(dir.path() / "rows.csv"));
  // A `memsim run --csv` timeline names itself.
  dir.Write("timeline.csv", "time_us,iteration,phase,allocated_bytes,reserved_bytes,"
                            "active_bytes,device_bytes\n0,0,init,0,0,0,0\n");
  r = Memsim(dir, "replay timeline.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err.starts_with("memsim replay: timeline.csv:1: a memory timeline (header with "
                          "allocated_bytes: `memsim run --csv` or a memsim-csv profile)"));
}

TEST_CASE("memsim replay: outputs are written all or nothing", "[replay]") {
  TempDir dir;
  dir.Write("ok.csv", "malloc,a,10\n");
  std::filesystem::create_directory(dir.path() / "sub");
  // Every file the command writes, beside the inputs and the captured stdout / stderr.
  auto written = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
      const std::string n = e.path().lexically_relative(dir.path()).string();
      if (n != "ok.csv" && n != "sub" && n != "stdout" && n != "stderr") names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  // The tester's case: a writable --json and an unwritable --csv leave nothing behind.
  Run r = Memsim(dir, "replay ok.csv --json good.json --csv nodir/x.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: nodir/x.csv: cannot write: cannot create a file in nodir (No such "
                 "file or directory)\n");
  CHECK(r.out.empty());
  CHECK(written().empty());
  // Either order; an existing target keeps its old content.
  dir.Write("good.csv", "old\n");
  r = Memsim(dir, "replay ok.csv --json nodir/x.json --csv good.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: nodir/x.json: cannot write: cannot create a file in nodir (No such "
                 "file or directory)\n");
  CHECK(Slurp(dir.path() / "good.csv") == "old\n");
  CHECK(written() == std::vector<std::string>{"good.csv"});
  // A directory is refused, not replaced, and the other output is not written either.
  r = Memsim(dir, "replay ok.csv --json good.csv --csv sub");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: sub: cannot write: is a directory\n");
  CHECK(Slurp(dir.path() / "good.csv") == "old\n");
  CHECK(written() == std::vector<std::string>{"good.csv"});
  r = Memsim(dir, "replay ok.csv --json same.out --csv same.out");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: --json and --csv name the same file 'same.out'\n");
  // /dev/null is written in place, never replaced (report::WriteFilesAtomically).
  r = Memsim(dir, "replay ok.csv --json /dev/null --csv good.csv");
  CHECK(r.exit_code == 0);
  CHECK(std::filesystem::is_character_file("/dev/null"));
  std::filesystem::remove(dir.path() / "good.csv");
  // Success writes both, no temporaries left. 10 bytes round up to 512 (the minimum block
  // size) and a small request gets a 2 MiB = 2097152-byte segment (kSmallBuffer).
  r = Memsim(dir, "replay ok.csv --json good.json --csv good.csv");
  CHECK(r.exit_code == 0);
  CHECK(written() == std::vector<std::string>{"good.csv", "good.json"});
  CHECK(Slurp(dir.path() / "good.csv") ==
        "op_index,op,allocated_bytes,reserved_bytes,active_bytes\n1,malloc,512,2097152,512\n");
}

TEST_CASE("memsim replay: --json and --csv", "[replay]") {
  TempDir dir;
  // Conformance case 19 (conformance_test.cc) plus the OOM path: a (12 MiB) recorded on stream 2
  // and freed stays active; b cannot reuse it (24 MiB reserved, 2 segments, active 24 MiB); c (30
  // MiB): 24 + 30 > 42 MiB capacity; release_cached_blocks synchronizes a's free and releases its
  // segment (12 MiB reserved, active 12 MiB); the retry succeeds: 42 MiB everywhere. Peak active is
  // therefore 42 MiB = 44,040,192, never a + b + c.
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
