// Issue 18's findings, one row per input that once crashed, overflowed or was accepted silently
// (inputs under tests/profile/data/findings/ and tests/cli/data/). Each runs the built binary:
// in the sanitizer build (.ci/run) a report would abort it, so every row also proves "no runtime
// error". Bad input exits 2 with one message naming the file and the field; valid input exits 0.
#include <catch2/catch.hpp>
#include <tinyxml2.h>

#include <algorithm>
#include <filesystem>

#include "cli/cli_test_util.h"

namespace memsim {
namespace {

using testing::ReadAll;
using testing::RunMemsim;
using testing::ScratchDir;

const std::string kFindings = std::string(MEMSIM_SOURCE_DIR) + "/tests/profile/data/findings/";
const std::string kCliData = std::string(MEMSIM_SOURCE_DIR) + "/tests/cli/data/";
const std::string kSim = std::string(MEMSIM_SOURCE_DIR) + "/tests/profile/data/memsim.csv";
const std::string kDefaultConfig = std::string(MEMSIM_SOURCE_DIR) + "/configs/default.json";

void CheckNoSanitizerReport(const testing::CommandResult& r) {
  CHECK(r.err.find("runtime error") == std::string::npos);
  CHECK(r.err.find("AddressSanitizer") == std::string::npos);
}

TEST_CASE("findings: profiles that overflowed or read out of bounds exit 2 naming the field",
          "[cli][findings]") {
  struct Row {
    const char* file;
    const char* format;
    std::string message;  // after "memsim compare: <path>"
  };
  const Row rows[] = {
      // nvidia_smi.cc: a header with "memory.used" but no column starting with it read f[-1].
      {"nvidia_smi_no_used_column.csv", "nvidia-smi",
       ":1: expected a column named 'memory.used [MiB]' (query "
       "--query-gpu=timestamp,memory.used,...)"},
      // clock.cc: days x 86400e9 overflowed from the year 2263.
      {"nvidia_smi_year_2263.csv", "nvidia-smi",
       ":2: timestamp: expected 'YYYY/MM/DD HH:MM:SS.mmm', got '2263/01/01 00:00:00.000'"},
      // nvidia_smi.cc: 99999999999999 MiB x 2^20 overflowed.
      {"nvidia_smi_huge_used.csv", "nvidia-smi",
       ":2: memory.used: expected '<integer> MiB' below 2^42 MiB, got '99999999999999 MiB'"},
      // reader.cc: a second sign was accepted, then us x 1000 overflowed.
      {"memsim_double_sign.csv", "memsim-csv",
       ":3: time_us: expected a number of microseconds within +-2^62 ns, got "
       "'--9223372036854775808'"},
      // reader.cc: sample times more than 292 years apart overflowed their difference.
      {"memsim_300_years.csv", "memsim-csv",
       ":2: time_us: expected a number of microseconds within +-2^62 ns, got '-9000000000000000'"},
      // chrome_trace.cc: an integer ts >= 1e16 us overflowed x 1000.
      {"chrome_trace_huge_ts.json", "torch-trace",
       ": no device [memory] events, expected a trace recorded with profile_memory=True (1 events "
       "skipped: 'ts' unreadable or beyond 2^62 ns)"},
      // snapshot.cc: time_us x 1000 overflowed.
      {"snapshot_huge_time.json", "torch-snapshot",
       ": /device_traces/0/0/time_us: expected microseconds from 0 to 2^62 ns, got "
       "10000000000000000"},
      // snapshot.cc: Round512(INT64_MAX) overflowed; sizes were not bounded.
      {"snapshot_huge_size.json", "torch-snapshot",
       ": /segments/0/blocks/0/size: expected a size from 0 to 2^62 bytes, got "
       "9223372036854775807"},
      // A negative total_size was reported at /segments/0 instead of the field.
      {"snapshot_negative_total.json", "torch-snapshot",
       ": /segments/0/total_size: expected a size from 0 to 2^62 bytes, got -5"},
      // A table cut after its first device was accepted.
      {"npu_smi_truncated.txt", "npu-smi",
       ":24: truncated npu-smi table: 1 device(s), expected 2 as in the first table"},
      // allocated: 1e300 was shown as '-'.
      {"megatron_huge.log", "megatron-log", ":1: allocated: expected MiB below 2^42, got '1e300'"},
  };
  for (const Row& row : rows) {
    INFO(row.file);
    ScratchDir dir("findings");
    const std::string path = kFindings + row.file;
    const auto r = RunMemsim(
        dir, "compare --simulated " + kSim + " --profile " + path + " --format " + row.format);
    CheckNoSanitizerReport(r);
    CHECK(r.exit_code == 2);
    CHECK(r.err == "memsim compare: " + path + row.message + "\n");
    CHECK(r.out.empty());
  }
}

TEST_CASE("findings: nvidia-smi times 280 years apart load", "[cli][findings]") {
  // Within +-2^62 ns of the epoch both; their difference fits (nvidia_smi.cc, pass grouping).
  ScratchDir dir("findings");
  const auto r = RunMemsim(dir, "compare --simulated " + kSim + " --profile " + kFindings +
                                    "nvidia_smi_280_years.csv --no-chart");
  CheckNoSanitizerReport(r);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("profile format: nvidia-smi") != std::string::npos);
}

TEST_CASE("findings: --skip beyond the profile's iterations exits 2", "[cli][findings]") {
  ScratchDir dir("findings");
  const std::string example = std::string(MEMSIM_SOURCE_DIR) + "/tests/profile/data/example/";
  const auto r = RunMemsim(dir, "compare --simulated " + example + "simulated.csv --profile " +
                                    example + "trace.json.gz --skip 1000000");
  CheckNoSanitizerReport(r);
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim compare: --skip 1000000: the profile " + example +
                     "trace.json.gz has 3 iteration(s); it would skip all of them\n");
}

TEST_CASE("findings: an output that is also an input is refused before anything is written",
          "[cli][findings]") {
  ScratchDir dir("findings");
  const std::string config = ReadAll(kCliData + "good.json");
  const std::string trace = ReadAll(kCliData + "replay_small.csv");
  const std::string profile =
      ReadAll(std::string(MEMSIM_SOURCE_DIR) + "/tests/profile/data/trace_new.json");
  dir.Write("c.json", config);
  dir.Write("t.csv", trace);
  dir.Write("t.json", profile);
  struct Row {
    const char* args;
    const char* err;
  };
  const Row rows[] = {
      {"run c.json --json c.json",
       "memsim run: c.json: is also the input c.json; choose another output file\n"},
      // Compared by identity, not by spelling.
      {"run c.json --csv ./c.json",
       "memsim run: ./c.json: is also the input c.json; choose another output file\n"},
      {"replay t.csv --csv t.csv",
       "memsim replay: t.csv: is also the input t.csv; choose another output file\n"},
      {"compare --simulated t.csv --profile t.json --json t.json",
       "memsim compare: t.json: is also the input t.json; choose another output file\n"},
  };
  for (const Row& row : rows) {
    INFO(row.args);
    const auto r = RunMemsim(dir, row.args);
    CheckNoSanitizerReport(r);
    CHECK(r.exit_code == 2);
    CHECK(r.err == row.err);
  }
  CHECK(ReadAll(dir.path() / "c.json") == config);
  CHECK(ReadAll(dir.path() / "t.csv") == trace);
  CHECK(ReadAll(dir.path() / "t.json") == profile);
  // Nothing else was left behind (no temporary, no probe).
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 3);
}

TEST_CASE("findings: bad options are rejected before the simulation", "[cli][findings]") {
  ScratchDir dir("findings");
  // The config does not exist: had the simulation come first, that would be the message.
  auto r = RunMemsim(dir, "run missing.json --width 5");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim run: --width 5: expected 40 to 1000 columns\n");
  r = RunMemsim(dir, "run missing.json --json no/such/dir/r.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "memsim run: no/such/dir/r.json: cannot write: cannot create a file in no/such/dir (No "
        "such file or directory)\n");
  // A path that exists but cannot be written: the message says why, not "No such file".
  r = RunMemsim(dir, "run missing.json --json /proc/version");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim run: /proc/version: cannot write: cannot create a file in /proc (", 0) ==
        0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("findings: config errors name the field and the --set text", "[cli][findings]") {
  ScratchDir dir("findings");
  const std::string path = kCliData + "seq_length_1e400.json";
  auto r = RunMemsim(dir, "validate " + path);
  CheckNoSanitizerReport(r);
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim validate: " + path +
                     ": /training/seq_length: out of range for a number: beyond the largest "
                     "64-bit float, about 1.8e308 (IEEE 754 binary64)\n");
  // Errors inside a --set value name the --set text, not the embedded default config.
  r = RunMemsim(dir, "validate --set 'allocator.roundup_power2_divisions={\"64\":3}'");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim validate: --set allocator.roundup_power2_divisions={\"64\":3}: /64: ",
                    0) == 0);
  r = RunMemsim(dir, "validate --set 'training.recompute_modules=[\"x\"]'");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim validate: --set training.recompute_modules=[\"x\"]: /0: ", 0) == 0);
}

TEST_CASE("findings: replay says what it refused and rejects an empty trace", "[cli][findings]") {
  ScratchDir dir("findings");
  auto r = RunMemsim(dir, "replay " + kCliData + "replay_2p60.csv");
  CheckNoSanitizerReport(r);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("note: 1 malloc(s) of 2^60 bytes or more refused before the allocator, as "
                   "PyTorch does (first at " +
                   kCliData + "replay_2p60.csv:4); they change no stat\n") != std::string::npos);
  r = RunMemsim(dir, "replay " + kCliData + "replay_empty.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: " + kCliData +
                     "replay_empty.csv: nothing to replay: no operations, expected lines "
                     "op,id,bytes,stream or a snapshot with device_traces entries\n");
}

TEST_CASE("findings: check with a bad config still writes JUnit and JSON, and exits 2",
          "[cli][findings][check]") {
  ScratchDir dir("findings");
  dir.Write("good.json", ReadAll(kCliData + "good.json"));
  dir.Write("bad.json", "{\"training\": 3}");
  const auto r = RunMemsim(dir, "check good.json bad.json --junit j.xml --json c.json");
  CheckNoSanitizerReport(r);
  CHECK(r.exit_code == 2);
  tinyxml2::XMLDocument doc;
  REQUIRE(doc.LoadFile((dir.path() / "j.xml").c_str()) == tinyxml2::XML_SUCCESS);
  const auto* suites = doc.FirstChildElement("testsuites");
  REQUIRE(suites != nullptr);
  CHECK(suites->IntAttribute("errors") == 1);
  CHECK(suites->IntAttribute("failures") == 0);
  bool good_passed = false, bad_errored = false;
  for (const auto* suite = suites->FirstChildElement("testsuite"); suite != nullptr;
       suite = suite->NextSiblingElement("testsuite")) {
    const std::string name = suite->Attribute("name");
    const auto* testcase = suite->FirstChildElement("testcase");
    REQUIRE(testcase != nullptr);
    if (name == "good.json") {
      good_passed = testcase->FirstChildElement("failure") == nullptr &&
                    testcase->FirstChildElement("error") == nullptr;
    }
    if (name == "bad.json") {
      const auto* error = testcase->FirstChildElement("error");
      bad_errored = error != nullptr &&
                    std::string(error->Attribute("message")).rfind("bad.json: /training: ", 0) == 0;
    }
  }
  CHECK(good_passed);
  CHECK(bad_errored);
  const std::string json = ReadAll(dir.path() / "c.json");
  CHECK(json.find("\"verdict\": \"error\"") != std::string::npos);
  CHECK(json.find("\"verdict\": \"ok\"") != std::string::npos);
}

TEST_CASE("findings: explain says when the job runs out of memory (--capacity)",
          "[cli][findings]") {
  ScratchDir dir("findings");
  // The default config needs 12.55 GiB for its grad buffer on top of 12.59 GiB of parameters
  // at init: 20 GiB cannot hold them.
  const auto r = RunMemsim(dir, "explain --capacity 20GiB");
  CheckNoSanitizerReport(r);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("*** OUT OF MEMORY predicted: stage 0, iteration 0, init\n", 0) == 0);
  const auto fits = RunMemsim(dir, "explain");
  CHECK(fits.out.find("OUT OF MEMORY") == std::string::npos);
}

TEST_CASE("findings: integer options beyond int or not integers are named in memsim's words",
          "[cli][findings]") {
  ScratchDir dir("findings");
  // CLI11 said "Could not convert: --skip = 99999999999", and for -1 printed the range of
  // CLI::NonNegativeNumber with a 300-digit upper bound. The options are checked before the
  // config is read (missing.json does not exist).
  const std::pair<std::string, std::string> cases[] = {
      {"compare missing.json --profile p --skip -1",
       "memsim: --skip: -1 is out of range: expected a non-negative integer (0 to 2147483647)\n"},
      {"compare missing.json --profile p --skip 99999999999",
       "memsim: --skip: 99999999999 is out of range: expected a non-negative integer (0 to "
       "2147483647)\n"},
      {"compare missing.json --profile p --profile-iterations 0",
       "memsim: --profile-iterations: 0 is out of range: expected a positive integer (1 to "
       "2147483647)\n"},
      {"compare missing.json --profile p --device-index -1",
       "memsim: --device-index: -1 is out of range: expected a non-negative integer (0 to "
       "2147483647)\n"},
      {"compare missing.json --profile p --rank x",
       "memsim: --rank: expected a non-negative integer, got 'x'\n"},
      {"replay missing.csv --device-index 4294967296",
       "memsim: --device-index: 4294967296 is out of range: expected a non-negative integer (0 "
       "to 2147483647)\n"},
      {"run missing.json --iterations 0",
       "memsim: --iterations: 0 is out of range: expected a positive integer (1 to "
       "2147483647)\n"},
      {"run missing.json --width 1e3", "memsim: --width: expected an integer, got '1e3'\n"},
      {"explain missing.json --pipeline-rank -2147483648",
       "memsim: --pipeline-rank: -2147483648 is out of range: expected an integer (-2147483647 "
       "to 2147483647)\n"},
  };
  for (const auto& [args, message] : cases) {
    INFO(args);
    const auto r = RunMemsim(dir, args);
    CHECK(r.exit_code == 2);
    CHECK(r.err == message + "Run 'memsim --help' for usage.\n");
    CHECK(r.out.empty());
  }
}

TEST_CASE("findings: compare --simulated refuses the options that change a simulation",
          "[cli][findings]") {
  ScratchDir dir("findings");
  // They were ignored without a word: --simulated is a timeline already simulated.
  for (const std::string option : {"--model llama3-8b", "--device h100-80g",
                                   "--set training.seq_length=2", "--iterations 3",
                                   "--pipeline-rank 0"}) {
    INFO(option);
    const auto r = RunMemsim(dir, "compare --simulated '" + kSim + "' --profile '" + kSim + "' " +
                                      option);
    CHECK(r.exit_code == 2);
    const std::string flag = option.substr(0, option.find(' '));
    CHECK(r.err == "memsim compare: " + flag +
                       " applies to the CONFIG compare simulates; with --simulated " + kSim +
                       " there is no simulation to change\n");
  }
  // A profile that numbers its iterations: --profile-iterations is said to be ignored.
  const auto r = RunMemsim(dir, "compare --simulated '" + kSim + "' --profile '" + kSim +
                                    "' --profile-iterations 5 --no-chart");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("note: --profile-iterations 5 ignored: the profile numbers its iterations "
                   "itself\n") != std::string::npos);
}

TEST_CASE("findings: compare --iterations simulates that many iterations, as run does",
          "[cli][findings]") {
  ScratchDir dir("findings");
  // memsim.csv numbers iterations 1 and 2. The default config simulates 4 (train_iters), so
  // measured iteration 2 is set against simulated 2; with --iterations 1 the simulation has only
  // iteration 1, against which the later measured ones are set (column "sim").
  const std::string& config = kDefaultConfig;
  const std::string common = "compare '" + config + "' --profile '" + kSim + "' --no-chart --width 100";
  const auto all = RunMemsim(dir, common);
  CheckNoSanitizerReport(all);
  CHECK(all.out.find("\n    2    2  ") != std::string::npos);
  const auto one = RunMemsim(dir, common + " --iterations 1");
  CHECK(one.exit_code == all.exit_code);
  CHECK(one.out.find("\n    2    1  ") != std::string::npos);
}

TEST_CASE("findings: --megatron-args -- ARGS after the other options", "[cli][findings]") {
  ScratchDir dir("findings");
  // CLI11 took the "--" after --megatron-args (an option whose FILE is optional) as the end of
  // its values, so ARGS were read as memsim's own options: "The following arguments were not
  // expected". `--megatron-args --device X -- ARGS` worked.
  const std::string args =
      " -- --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
      "--max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1000 --bf16 "
      "--nproc_per_node 1";
  const auto before = RunMemsim(dir, "validate --megatron-args --device h100-80g" + args);
  const auto after = RunMemsim(dir, "validate --device h100-80g --megatron-args" + args);
  CHECK(before.exit_code == 0);
  CHECK(after.exit_code == 0);
  CHECK(after.out == before.out);
  CHECK(after.err == before.err);
}

TEST_CASE("findings: a Megatron flag given twice with other values is a warning",
          "[cli][findings]") {
  ScratchDir dir("findings");
  // argparse keeps the last value; memsim did too, without a word.
  const auto r = RunMemsim(
      dir, "validate --device h100-80g --megatron-args -- --num-layers 2 --hidden-size 64 "
           "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
           "--micro-batch-size 1 --vocab-size 1000 --bf16 --nproc_per_node 1 --micro-batch-size 2 "
           "--bf16");
  CHECK(r.exit_code == 0);
  CHECK(r.err == "warning: --megatron-args --micro-batch-size: given again with '2' ('1' "
                 "before); the last taken, as argparse does\n");
  CHECK(r.out.find("micro-batch 2,") != std::string::npos);
}

// `producer | memsim ARGS` in `dir`, through the shell.
testing::CommandResult RunPiped(const ScratchDir& dir, const std::string& producer,
                                const std::string& args) {
  const std::string out = dir.path().string() + ".stdout", err = dir.path().string() + ".stderr";
  const std::string cmd = "cd '" + dir.path().string() + "' && " + producer + " | '" MEMSIM_BINARY
                          "' " + args + " > '" + out + "' 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadAll(out), ReadAll(err)};
}

TEST_CASE("findings: an endless or garbage snapshot stream stops at its first bad byte",
          "[cli][findings]") {
  ScratchDir dir("findings");
  // replay read a snapshot from a pipe up to its 2 GiB limit (4 GB of memory, 14-29 s) before
  // parsing it; compare read a pickle up to 4 GiB. The producers here are cut at 64 MiB so
  // that a regression still ends.
  auto r = RunPiped(dir, "yes '{\"a\":' | head -c 67108864", "replay /dev/stdin");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: /dev/stdin:65: JSON nested deeper than memsim's limit of 64 "
                 "levels (byte 385; a memory snapshot nests at most 9)\n");
  r = RunPiped(dir, "(printf '\\200\\002'; yes) | head -c 67108864", "replay /dev/stdin");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim replay: /dev/stdin: pickle byte 2: unsupported opcode 0x79;", 0) == 0);
  r = RunPiped(dir, "(printf '\\200\\002'; yes) | head -c 67108864",
               "compare missing.json --format torch-snapshot --profile /dev/stdin");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim compare: /dev/stdin: pickle byte 2: unsupported opcode 0x79;", 0) == 0);
  // Blank lines only: the scan for the first non-blank byte was quadratic (a hang).
  r = RunPiped(dir, "yes '' | head -c 67108864", "replay /dev/stdin");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: /dev/stdin: only blanks in the first 1048576 bytes: not a trace "
                 "(expected lines op,id,bytes,stream or a PyTorch memory snapshot)\n");
  // A regular file of 2 GiB (sparse) is refused before a byte is read.
  std::filesystem::resize_file(dir.Write("big.json", "{"), std::uintmax_t{1} << 31);
  r = RunMemsim(dir, "replay big.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: cannot read trace 'big.json': 2 GiB or larger (the limit is 2^31 "
                 "bytes)\n");
}

TEST_CASE("findings: standard output that cannot be written is exit 2", "[cli][findings]") {
  ScratchDir dir("findings");
  // `memsim validate --print-config > c.json` on a full disk exited 0 with c.json cut short.
  const std::string& config = kDefaultConfig;
  for (const std::string& args : {"validate '" + config + "' --print-config",
                                  "validate '" + config + "'",
                                  "dump-program '" + config + "' --iterations 1"}) {
    INFO(args);
    const std::string err = dir.path().string() + ".stderr";
    const std::string cmd = "'" MEMSIM_BINARY "' " + args + " > /dev/full 2> '" + err + "'";
    const int status = std::system(cmd.c_str());
    CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 2);
    const std::string name = args.substr(0, args.find(' '));
    CHECK(ReadAll(err).rfind("memsim " + name + ": standard output: cannot write: ", 0) == 0);
  }
}

TEST_CASE("findings: options that act only with another one say so", "[cli][findings]") {
  ScratchDir dir("findings");
  // Both were ignored without a word: --tolerance is the growth allowed over a --baseline,
  // --allow-unsupported lets a launch's unsupported flags through.
  const std::string& config = kDefaultConfig;
  auto r = RunMemsim(dir, "check '" + config + "' --tolerance 3");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim check: --tolerance: applies to the comparison with --baseline FILE|DIR, "
                 "which is not given (--margin is the headroom asked of the usable memory)\n");
  CHECK(r.out.empty());
  r = RunMemsim(dir, "run '" + config + "' --allow-unsupported");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim: --allow-unsupported requires --megatron-args\nRun 'memsim --help' for "
                 "usage.\n");
}

TEST_CASE("findings: compare --rank and --device-index where they pick nothing", "[cli][findings]") {
  ScratchDir dir("findings");
  // --rank was ignored for every format but a Megatron log, --device-index for a Megatron log
  // (read per rank) and a memsim-csv timeline (one device).
  const std::string& config = kDefaultConfig;
  const std::string data = std::string(MEMSIM_SOURCE_DIR) + "/tests/profile/data/";
  auto r = RunMemsim(dir, "compare '" + config + "' --profile '" + data + "snapshot.json' --rank 3");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim compare: --rank 3: applies to a Megatron log (its [Rank N] lines); " +
                     data + "snapshot.json is torch-snapshot (--device-index picks its device)\n");
  r = RunMemsim(dir, "compare '" + config + "' --profile '" + data + "megatron.log' --device-index 1");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim compare: --device-index 1: " + data +
                     "megatron.log is megatron-log, read per rank (--rank N picks one)\n");
  r = RunMemsim(dir, "compare '" + config + "' --profile '" + kSim + "' --device-index 0");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim compare: --device-index 0: " + kSim + " is memsim-csv, one device's "
                                                                "timeline\n");
  // replay: a CSV trace is one allocator's.
  dir.Write("t.csv", "malloc,a,512,0\nfree,a\n");
  r = RunMemsim(dir, "replay t.csv --device-index 0 --csv out.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim replay: --device-index 0: applies to a snapshot (its device_traces); "
                 "t.csv is a CSV trace of one allocator\n");
  CHECK_FALSE(std::filesystem::exists(dir.path() / "out.csv"));
}

}  // namespace
}  // namespace memsim
