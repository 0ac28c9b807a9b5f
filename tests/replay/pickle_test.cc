// Pickled memory snapshots (core/pickle.h; docs/profile-formats.md, 'PyTorch memory snapshot'):
// the reader's opcodes and limits, and the synthetic fixtures of tools/make_pickle_fixture.py
// replaying exactly as their JSON twins.
#include "core/pickle.h"

#include <string>

#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "cli/cli_test_util.h"
#include "core/error.h"
#include "profile/profile.h"
#include "replay/trace.h"

namespace memsim {
namespace {

using nlohmann::json;

std::string Fixture(const std::string& name) {
  return memsim::testing::ReadAll(std::string(MEMSIM_SOURCE_DIR) + "/tests/replay/data/" + name);
}

std::string ErrorOf(const std::string& bytes) {
  try {
    PickleToJson(bytes, "p.pickle");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("pickle: values, tuples, memo references and 64-bit integers", "[replay][pickle]") {
  // {"a": (1, -1, 2^63, 2^64 - 1), "b": [None, True, False, 0.5], "c": <memo 1, the tuple>}
  std::string q;
  q += "\x80\x04";                       // PROTO 4
  q += "}\x94";                          // EMPTY_DICT, MEMOIZE -> memo 0
  q += "(";                              // MARK (items of the dict)
  q += std::string("\x8c\x01" "a", 3);  // SHORT_BINUNICODE "a"
  q += "(";                              // MARK (the tuple)
  q += std::string("K\x01", 2);          // BININT1 1
  q += std::string("J\xff\xff\xff\xff", 5);                                      // BININT -1
  q += std::string("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00", 11);          // LONG1 2^63
  q += std::string("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00", 11);          // LONG1 2^64-1
  q += "t\x94";                          // TUPLE, MEMOIZE -> memo 1
  q += std::string("\x8c\x01" "b", 3);
  q += "](N\x88\x89";                    // EMPTY_LIST MARK NONE NEWTRUE NEWFALSE
  q += std::string("G\x3f\xe0\x00\x00\x00\x00\x00\x00", 9);  // BINFLOAT 0.5 (big-endian)
  q += "e";                              // APPENDS
  q += std::string("\x8c\x01" "c", 3);
  q += std::string("h\x01", 2);          // BINGET 1: the same tuple
  q += "u.";                             // SETITEMS STOP
  const json j = PickleToJson(q, "p.pickle");
  const json tuple = {1, -1, std::uint64_t{1} << 63, ~std::uint64_t{0}};
  CHECK(j["a"] == tuple);
  CHECK(j["b"] == json({nullptr, true, false, 0.5}));
  CHECK(j["c"] == tuple);
}

TEST_CASE("pickle: malformed and unsupported input is one message naming the byte",
          "[replay][pickle]") {
  CHECK(ErrorOf(std::string("\x80\x02}", 3)) == "p.pickle: pickle byte 3: ends before the STOP opcode");
  CHECK(ErrorOf(std::string("\x80\x02X\xff\x00\x00\x00" "ab.", 10)) ==
        "p.pickle: pickle byte 2: a length runs past the end of the file");
  CHECK(ErrorOf(std::string("\x80\x02" "cos\nsystem\n.", 13)) ==
        "p.pickle: pickle byte 2: unsupported opcode 0x63; memsim reads pickles of dicts, lists, "
        "tuples, strings, numbers, None and booleans only (torch.cuda.memory._dump_snapshot)");
  CHECK(ErrorOf(std::string("\x80\x02h\x05.", 5)) ==
        "p.pickle: pickle byte 2: memo reference 5 never stored");
  CHECK(ErrorOf(std::string("\x80\x02K\x01K\x02.", 7)) ==
        "p.pickle: pickle byte 6: STOP with an unbalanced stack (a truncated or malformed pickle)");
  CHECK(ErrorOf(std::string("\x80\x02K\x01" "a.", 6)) ==
        "p.pickle: pickle byte 4: stack underflow");
  CHECK(ErrorOf(std::string("\x80\x02\x8a\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00.", 15)) ==
        "p.pickle: pickle byte 2: an integer beyond 64 bits");
  // A list that contains itself: memo 0 is the list, appended to itself.
  CHECK(ErrorOf(std::string("\x80\x02]q\x00h\x00" "a.", 9)) ==
        "p.pickle: pickle byte 0: nested deeper than 200 levels (or a reference cycle)");
  // 30 nested pairs (x, x) of the one below: 2^30 values from 65 bytes.
  std::string b("\x80\x02K\x00", 4);  // the innermost value: 0
  for (int i = 0; i < 30; ++i) b += "2\x86";  // DUP, TUPLE2: (x, x)
  b += ".";
  CHECK(ErrorOf(b) == "p.pickle: pickle byte 0: shared references expand to too many values");
  // SHORT_BINUNICODE (0x8c) of 1 byte, 0xff: not UTF-8 (a lone byte above 0x7f), nor is the
  // encoded surrogate ED A0 80 (U+D800), nor the overlong C0 80 (U+0000 in two bytes).
  CHECK(ErrorOf(std::string("\x80\x02\x8c\x01\xff.", 6)) ==
        "p.pickle: pickle byte 2: a string that is not valid UTF-8");
  CHECK(ErrorOf(std::string("\x80\x02\x8c\x03\xed\xa0\x80.", 8)) ==
        "p.pickle: pickle byte 2: a string that is not valid UTF-8");
  CHECK(ErrorOf(std::string("\x80\x02\x8c\x02\xc0\x80.", 7)) ==
        "p.pickle: pickle byte 2: a string that is not valid UTF-8");
  // Valid multi-byte UTF-8 (U+00E9, U+4E2D, U+1F600) is read.
  CHECK(ErrorOf(std::string("\x80\x02\x8c\x09\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80.", 14))
            .empty());
  CHECK(!LooksLikePickle(std::string("\x80\x01", 2)));
  CHECK(LooksLikePickle(std::string("\x80\x05", 2)));
}

// The synthetic fixture (tools/make_pickle_fixture.py) replayed on CUDA: 4 MiB and 6 MiB blocks
// from one 20 MiB segment (requests between 1 and 10 MiB get a kLargeBuffer segment;
// docs/allocator-rules.md, 'Getting new memory'), so the allocated peak is 4 + 6 = 10 MiB; the
// 1 MiB request (<= kSmallSize) takes a 2 MiB small-pool segment, so reserved ends at
// 20 + 2 = 22 MiB. Pickle and JSON twin give the same trace and the same replay.
TEST_CASE("pickle: a prefix says whether more bytes could change the result",
          "[replay][pickle]") {
  // For a reader of a pipe: an error the bytes so far already hold, or the whole pickle (its
  // STOP), ends the reading; running out of bytes does not.
  const std::string whole = Fixture("snapshot-synthetic.pickle");
  CHECK_FALSE(PickleNeedsMoreBytes(whole));                            // STOP reached
  CHECK_FALSE(PickleNeedsMoreBytes(whole + "endless garbage"));        // bytes after STOP unread
  CHECK(PickleNeedsMoreBytes(whole.substr(0, whole.size() / 2)));      // cut in the middle
  CHECK(PickleNeedsMoreBytes(whole.substr(0, 2)));                     // PROTO only
  CHECK(PickleNeedsMoreBytes(std::string("\x80\x02X\xff\xff\xff\x7f", 7)));  // a length past the end
  // 'y' (0x79) is no opcode memsim reads: the error of the whole, at byte 2, is already there.
  const std::string endless = "\x80\x02" + std::string(1000, 'y');
  CHECK_FALSE(PickleNeedsMoreBytes(endless));
  CHECK(ErrorOf(endless.substr(0, 3)) == ErrorOf(endless));
}

TEST_CASE("pickle: the synthetic fixtures replay as their JSON twins", "[replay][pickle]") {
  for (const std::string name : {"snapshot-synthetic", "snapshot-npu-synthetic"}) {
    CAPTURE(name);
    const replay::Trace from_pickle = replay::ParseTrace(Fixture(name + ".pickle"), "f", 0);
    const replay::Trace from_json = replay::ParseTrace(Fixture(name + ".json"), "f", 0);
    CHECK(from_pickle.ids == from_json.ids);
    CHECK(from_pickle.records == from_json.records);
    REQUIRE(from_pickle.snapshot);
    CHECK(from_pickle.snapshot->reserved_end_bytes == from_json.snapshot->reserved_end_bytes);
    CHECK(from_pickle.snapshot->segment_allocs == 1);
    auto a = alloc::NewCachingAllocator({});
    auto b = alloc::NewCachingAllocator({});
    const replay::ReplayResult ra = replay::Replay(from_pickle, *a, true);
    const replay::ReplayResult rb = replay::Replay(from_json, *b, true);
    CHECK(ra.stats == rb.stats);
    CHECK(ra.stats.allocated_bytes.peak == 10 * kMiB);
    CHECK(ra.stats.reserved_bytes.current == 22 * kMiB);
  }
}

// `compare` reads the same fixtures through the profile importer (detected by content): the
// pickle and its JSON twin give the same Timeline.
TEST_CASE("pickle: compare's snapshot importer reads the fixtures as their JSON twins",
          "[replay][pickle]") {
  for (const std::string name : {"snapshot-synthetic", "snapshot-npu-synthetic"}) {
    CAPTURE(name);
    const std::string dir = std::string(MEMSIM_SOURCE_DIR) + "/tests/replay/data/";
    const timeline::Timeline a =
        profile::LoadProfile(dir + name + ".pickle", profile::Format::kAuto, {});
    const timeline::Timeline b =
        profile::LoadProfile(dir + name + ".json", profile::Format::kAuto, {});
    CHECK(a.samples == b.samples);
    CHECK(a.source == "torch-snapshot");
    REQUIRE(!a.samples.empty());
    CHECK(a.samples.back().reserved_bytes == 20 * kMiB);  // the fixture's one segment
  }
}


// A pickle whose top value is a list: torch.cuda.memory_snapshot() (a bare list of segments).
// The bytes are pickle.dumps(value, protocol=4) (pickletools.dis gives the opcodes): PROTO 4,
// FRAME, EMPTY_LIST, MEMOIZE, ... APPEND, STOP.
const std::string kPickledSegmentList(
    "\x80\x04\x95<\x00\x00\x00\x00\x00\x00\x00]\x94}\x94(\x8c\x06" "device\x94K\x00\x8c\x07"
    "address\x94K\x00\x8c\ntotal_size\x94J\x00\x00 \x00\x8c\x06" "blocks\x94]\x94ua.",
    71);  // [{"device": 0, "address": 0, "total_size": 2097152, "blocks": []}]
const std::string kPickledIntList("\x80\x04\x95\t\x00\x00\x00\x00\x00\x00\x00]\x94(K\x01K\x02" "e.",
                                  20);  // [1, 2]

TEST_CASE("pickle: compare detects a protocol-4 pickle whose top value is a list of segments",
          "[replay][pickle]") {
  REQUIRE(kPickledSegmentList.size() == 71);
  REQUIRE(kPickledSegmentList.back() == '.');
  const profile::Detection d =
      profile::DetectFormatFromContent("segments.pickle", kPickledSegmentList);
  CHECK(d.format == profile::Format::kTorchSnapshot);
  CHECK(d.reason == "pickle with total_size (memory snapshot: a list of segments)");
  // A pickled list that is no snapshot is named a pickle, not an unknown format.
  memsim::testing::ScratchDir dir("pickle");
  const std::string path = dir.Write("ints.pickle", kPickledIntList).string();
  std::string error;
  try {
    profile::DetectFormat(path);
  } catch (const InputError& e) {
    error = e.what();
  }
  CHECK(error == path +
                     ": a Python pickle, but not a memory snapshot: no 'segments', "
                     "'device_traces' or 'total_size' in its first bytes "
                     "(torch.cuda.memory._snapshot() pickles a dict with segments and "
                     "device_traces; torch.cuda.memory_snapshot() a list of segments)");
}

TEST_CASE("pickle: replay of a pickled list of segments says it holds no history",
          "[replay][pickle]") {
  memsim::testing::ScratchDir dir("pickle");
  dir.Write("segments.pickle", kPickledSegmentList);
  dir.Write("empty.pickle", std::string("\x80\x04]\x94.", 5));  // pickle.dumps([], 4)
  for (const char* name : {"segments.pickle", "empty.pickle"}) {
    CAPTURE(name);
    const auto r = memsim::testing::RunMemsim(dir, std::string("replay ") + name);
    CHECK(r.exit_code == 2);
    CHECK(r.err == std::string("memsim replay: ") + name +
                       ": nothing to replay: a list of segments (torch.cuda.memory_snapshot(): "
                       "the allocator's state at one moment, no history of allocations); record "
                       "one with torch.cuda.memory._record_memory_history() and save "
                       "torch.cuda.memory._snapshot()\n");
  }
  // A dict with no device_traces: no allocator events either.
  // pickle.dumps({"segments": []}, 4)
  dir.Write("dict.pickle", std::string("\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08"
                                       "segments\x94]\x94s.",
                                       28));
  const auto r = memsim::testing::RunMemsim(dir, "replay dict.pickle");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: dict.pickle: nothing to replay: a memory snapshot with no "
                 "allocator events (no device_traces entries for the device); record one with "
                 "torch.cuda.memory._record_memory_history() and save "
                 "torch.cuda.memory._snapshot()\n");
}

}  // namespace
}  // namespace memsim
