// `memsim replay` reads traces in one pass (replay::ReplayTraceText, issue 17): a CSV trace is
// parsed and replayed line by line without holding its records, a JSON snapshot is read with a
// SAX handler that builds one entry at a time. Both must give what the whole-file readers
// (ParseCsvTrace + Replay, TraceFromSnapshot of the parsed document) give: the same stats, the
// same rows, the same messages, except the documented order of CSV errors.
#include <algorithm>
#include <string>
#include <vector>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "alloc/allocator.h"
#include "cli/cli_test_util.h"
#include "core/error.h"
#include "replay/snapshot.h"
#include "replay/synthetic.h"
#include "replay/trace.h"

namespace memsim::replay {
namespace {

std::string ToCsv(const Trace& t) {
  std::string out = "op,id,bytes,stream\n";
  for (const TraceRecord& r : t.records) {
    out += fmt::format("{},{},{},{}\n", TraceOpName(r.op),
                       r.id >= 0 ? t.ids[static_cast<std::size_t>(r.id)] : "", r.bytes,
                       r.stream);
  }
  return out;
}

class Rows final : public ReplayRowSink {
 public:
  void OnRow(const ReplayRow& r) override {
    rows.push_back({r.allocated_bytes, r.reserved_bytes, r.active_bytes, static_cast<int>(r.op)});
  }
  std::vector<std::vector<std::int64_t>> rows;
};

std::string ErrorOf(auto&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("streamed CSV replay equals parse-then-replay", "[replay][stream]") {
  SyntheticOptions so;
  so.seed = 7;
  so.operations = 20000;
  const std::string csv = ToCsv(GenerateTrainingTrace(so));
  for (const char* conf : {"", "expandable_segments:True"}) {
    const alloc::AllocatorOptions o = alloc::ParseAllocConf(conf, alloc::Backend::kCuda);
    auto a = alloc::NewCachingAllocator(o);
    auto b = alloc::NewCachingAllocator(o);
    Rows held, streamed;
    const ReplayResult ra = Replay(ParseCsvTrace(csv, "t.csv"), *a, &held);
    const ReplayResult rb = ReplayTraceText(csv, "t.csv", 0, *b, &streamed);
    CHECK(ra.stats == rb.stats);
    CHECK(ra.operations == rb.operations);
    CHECK(held.rows == streamed.rows);
  }
}

TEST_CASE("streamed CSV replay reports the first error in file order", "[replay][stream]") {
  // Line 2 breaks an id rule, line 3 is malformed: the one-pass reader stops at line 2; parsing
  // the whole file first stops at line 3 (docs/interfaces.md, 'Allocator traces').
  const std::string text = "malloc,a,10\nfree,b\nmallco,c,1\n";
  auto a = alloc::NewCachingAllocator({});
  CHECK(ErrorOf([&] { ReplayTraceText(text, "t.csv", 0, *a, nullptr); }) ==
        "t.csv:2: free of id 'b' that was never allocated");
  CHECK(ErrorOf([&] { ParseCsvTrace(text, "t.csv"); }) ==
        "t.csv:3: unknown op 'mallco' (expected malloc, free, record_stream, complete, "
        "empty_cache)");
}

TEST_CASE("memsim replay reads a CSV trace in blocks: lines cut by a block join up",
          "[replay][stream]") {
  // More than two of the CLI's 4 MiB blocks, CRLF line ends, a 5 MiB comment line (longer than
  // a block), no newline after the last line: the CLI must count the same operations and end in
  // the same state as the whole text replayed at once.
  SyntheticOptions so;
  so.seed = 11;
  so.operations = 300000;
  std::string text = ToCsv(GenerateTrainingTrace(so));
  text.insert(text.find('\n', text.size() / 3) + 1, "#" + std::string(5 << 20, 'x') + "\n");
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  crlf.resize(crlf.size() - 2);  // the last line without its line end
  REQUIRE(crlf.size() > (std::size_t{9} << 20));
  auto a = alloc::NewCachingAllocator({});
  const ReplayResult whole = ReplayTraceText(crlf, "big.csv", 0, *a, nullptr);
  testing::ScratchDir dir("stream");
  dir.Write("big.csv", crlf);
  const testing::CommandResult r = testing::RunMemsim(dir, "replay big.csv --json out.json");
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(testing::ReadAll(dir.path() / "out.json"));
  CHECK(j["operations"] == whole.operations);
  CHECK(j["final"]["allocated_bytes"] == whole.stats.allocated_bytes.current);
  CHECK(j["peak"]["reserved_bytes"] == whole.stats.reserved_bytes.peak);
  CHECK(j["final"]["segment"] == whole.stats.segment.current);
  // An id error on the last line names it: lines are counted across blocks (the comment line
  // is one line).
  const auto lines = std::count(crlf.begin(), crlf.end(), '\n') + 2;
  dir.Write("bad.csv", crlf + "\r\nfree,never_allocated\r\n");
  const testing::CommandResult bad = testing::RunMemsim(dir, "replay bad.csv");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err == fmt::format("memsim replay: bad.csv:{}: free of id 'never_allocated' that "
                               "was never allocated\n",
                               lines));
}

// The streamed snapshot reader and the DOM walk on the same text.
void CheckSameAsDom(const std::string& text, int device) {
  const std::string streamed =
      ErrorOf([&] { (void)ParseSnapshot(text, "s.json", device); });
  const std::string dom = ErrorOf(
      [&] { (void)TraceFromSnapshot(nlohmann::json::parse(text), "s.json", device); });
  CHECK(streamed == dom);
  if (dom != "(no error)") return;
  const Trace s = ParseSnapshot(text, "s.json", device);
  const Trace d = TraceFromSnapshot(nlohmann::json::parse(text), "s.json", device);
  CHECK(s.records == d.records);
  CHECK(s.ids == d.ids);
  REQUIRE(s.snapshot.has_value());
  CHECK(s.snapshot->segment_allocs == d.snapshot->segment_allocs);
  CHECK(s.snapshot->segment_frees == d.snapshot->segment_frees);
  CHECK(s.snapshot->reserved_end_bytes == d.snapshot->reserved_end_bytes);
  CHECK(s.snapshot->skipped == d.snapshot->skipped);
  CHECK(s.snapshot->entries == d.snapshot->entries);
}

TEST_CASE("streamed snapshot reader equals the whole-document reader", "[replay][stream]") {
  const std::string two_devices = R"({"device_traces": [
    [{"action": "alloc", "addr": 1, "size": 512, "stream": 3}, {"x": [1, {"y": 2}]}],
    [{"action": "alloc", "addr": 100, "size": 1048576, "stream": 9},
     {"action": "free_requested", "addr": 100, "size": 1048576, "stream": 9},
     {"action": "free_completed", "addr": 100, "size": 1048576, "stream": 9},
     {"action": "alloc", "addr": 200, "size": 4096, "stream": 5, "frames": [{"name": "f"}]},
     {"action": "free_requested", "addr": 200, "size": 4096, "stream": 5},
     {"action": "segment_alloc", "addr": 0, "size": 2097152},
     {"action": "free_completed", "addr": 200, "size": 4096, "stream": 5},
     {"action": "free_requested", "addr": 7},
     {"action": "oom"}]
  ], "segments": [{"total_size": 2097152, "device": 1}, {"total_size": 512}]})";
  CheckSameAsDom(two_devices, 1);
  // Device 0's second entry has no action: an error only when device 0 is replayed.
  CheckSameAsDom(two_devices, 0);
  CheckSameAsDom(two_devices, 2);
  // An entry error comes after the document's own checks, wherever it sits in the text.
  CheckSameAsDom(R"({"device_traces": [[{"action": "bogus"}]], "segments": [{"size": 1}]})", 0);
  CheckSameAsDom(R"({"device_traces": [[5, {"action": "bogus"}]]})", 0);
  CheckSameAsDom(R"({"device_traces": [{"not": "a list"}]})", 0);
  CheckSameAsDom(R"({"device_traces": [[]]})", 0);
  CheckSameAsDom(R"({"device_traces": []})", 0);
  CheckSameAsDom(R"([{"total_size": 1024, "device": 0}])", 0);
  CheckSameAsDom(R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 2},
    {"action": "free_requested", "addr": 1}]]})", 0);
}

TEST_CASE("a snapshot prefix says whether more bytes could change the result", "[replay][stream]") {
  // For `memsim replay` of a pipe: the reading stops once the bytes so far hold the error the
  // whole would give, and ParseSnapshot of those bytes reports it.
  const std::string ok = R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, )";
  CHECK(SnapshotNeedsMoreBytes(ok));  // cut inside an entry
  CHECK(SnapshotNeedsMoreBytes(ok + "\"size\": 51"));  // cut inside a number
  CHECK(SnapshotNeedsMoreBytes(R"({"segments": [], "device_traces": [[]]} )"));  // whole: blanks may follow
  // A syntax error before the last byte: the same message from the prefix as from more.
  const std::string bad = R"({"segments": [], "device_traces": [[x)";
  CHECK_FALSE(SnapshotNeedsMoreBytes(bad + "yyyy"));
  CHECK(ErrorOf([&] { ParseSnapshot(bad + "yyyy", "s.json", 0); }) ==
        ErrorOf([&] { ParseSnapshot(bad + std::string(100, 'y'), "s.json", 0); }));
  // Data after the document is an error already there.
  CHECK_FALSE(SnapshotNeedsMoreBytes(R"({"segments": [], "device_traces": [[]]} x)"));
  // 65 levels: a snapshot nests at most 9; `yes '{"a":'` stops at level 65.
  std::string deep;
  for (int i = 0; i < 65; ++i) deep += "{\"a\":\n";
  CHECK(SnapshotNeedsMoreBytes(deep.substr(0, deep.size() - 6)));  // 64 levels so far
  CHECK_FALSE(SnapshotNeedsMoreBytes(deep));
  // The 65th '{' is on line 65, byte 6 × 64 + 1 = 385 (1-based).
  CHECK(ErrorOf([&] { ParseSnapshot(deep, "s.json", 0); }) ==
        "s.json:65: JSON nested deeper than memsim's limit of 64 levels (byte 385; a memory "
        "snapshot nests at most 9)");
  // A pickle: PickleNeedsMoreBytes (pickle_test.cc).
  CHECK_FALSE(SnapshotNeedsMoreBytes(std::string("\x80\x02yyy", 5)));
  CHECK(SnapshotNeedsMoreBytes(std::string("\x80\x02", 2)));
}

}  // namespace
}  // namespace memsim::replay
