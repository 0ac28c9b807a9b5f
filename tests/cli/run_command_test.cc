// `memsim run` and `memsim dump-program` end to end: exit codes, files, and bad input.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include "cli/cli_test_util.h"

namespace memsim {
namespace {

using testing::ReadAll;
using testing::RunMemsim;
using testing::ScratchDir;

TEST_CASE("memsim run: the embedded default runs from any directory and writes its files",
          "[cli]") {
  ScratchDir dir("run");
  const auto r = RunMemsim(dir, "run --json r.json --csv t.csv --megatron-report");
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("memsim run: llama2-7b") == 0);
  // One Megatron line per iteration (4 in the default config).
  size_t lines = 0;
  for (size_t at = r.out.find("[Rank 0] (after "); at != std::string::npos;
       at = r.out.find("[Rank 0] (after ", at + 1)) {
    ++lines;
  }
  CHECK(lines == 4);
  const std::string json = ReadAll(dir.path() / "r.json");
  CHECK(json.find("\"schema_version\": 1") != std::string::npos);
  CHECK(json.find("\"oom\": null") != std::string::npos);
  const std::string csv = ReadAll(dir.path() / "t.csv");
  // The totals first, then one column per category (issue 16; docs/profile-formats.md).
  CHECK(csv.rfind("time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes,"
                  "parameters_bytes,", 0) == 0);
}

TEST_CASE("memsim run: a predicted OOM is reported, recorded in JSON, and exits 0", "[cli]") {
  ScratchDir dir("run");
  const auto r = RunMemsim(dir, "run --capacity 8GiB --json r.json --no-chart");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("*** OUT OF MEMORY predicted: stage 0, iteration ") != std::string::npos);
  const std::string json = ReadAll(dir.path() / "r.json");
  CHECK(json.find("\"oom\": {") != std::string::npos);
  CHECK(json.find("\"usable_memory_bytes\": 8589934592") != std::string::npos);  // 8 × 2^30
}

TEST_CASE("memsim run: bad input exits 2 with one message and leaves no file", "[cli]") {
  ScratchDir dir("run");
  auto r = RunMemsim(dir, "run missing.json --json r.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("missing.json") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(dir.path() / "r.json"));
  r = RunMemsim(dir, "run --pipeline-rank 1");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim run: --pipeline-rank 1: expected 0..0 (pipeline_model_parallel_size 1)\n");
  r = RunMemsim(dir, "run --capacity 12XB");
  CHECK(r.exit_code == 2);
  // Out of range: the message's bounds are written in units --capacity accepts (no PiB).
  r = RunMemsim(dir, "run --capacity 1025TiB");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim run: --capacity 1025TiB: expected a size from 1MiB to 1024TiB (2^50 "
                 "bytes), e.g. 80GiB\n");
  r = RunMemsim(dir, "rnu");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("unknown subcommand 'rnu' (did you mean 'run'?)") != std::string::npos);
  // The same file for two outputs.
  r = RunMemsim(dir, "run --json same.out --csv same.out");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim run: same.out: named for two outputs\n");
  CHECK_FALSE(std::filesystem::exists(dir.path() / "same.out"));
  // An unwritable output path: exit 2, nothing half-written.
  r = RunMemsim(dir, "run --json no/such/dir/r.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("no/such/dir/r.json: cannot write") != std::string::npos);
  // --iterations is named as the user wrote it.
  // (10 iterations × 32768 / (1 × DP 4) = 8192 micro-batches × 32 layers = 2621440 layer
  // passes, above the limit of 2^21 = 2097152.)
  r = RunMemsim(dir, "run --iterations 10 --set training.global_batch_size=32768");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim run: --iterations 10: train_iters × micro-batches per iteration × "
                    "num_hidden_layers = 10 × 8192 × 32 = 2621440 layer passes exceed memsim's "
                    "limit of 2097152",
                    0) == 0);
  // An empty file or preset name is an error, not "not given".
  for (const char* option : {"--json", "--csv", "--device", "--model"}) {
    INFO(option);
    r = RunMemsim(dir, std::string("run ") + option + " \"\"");
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(std::string(option) + ": expected a path or a name, got an empty string") !=
          std::string::npos);
  }
}

TEST_CASE("memsim run: an output that cannot be written leaves no other output behind", "[cli]") {
  ScratchDir dir("run");
  // /dev/full accepts open(2) and fails every write with ENOSPC (null(4)); the JSON, a regular
  // file, must then not appear, and the message says it was not written.
  auto r = RunMemsim(dir, "run --no-chart --html /dev/full --json ok.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("memsim run: /dev/full: cannot write: ", 0) == 0);
  CHECK(r.err.find("; not written either: ok.json\n") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.out.empty());
  CHECK_FALSE(std::filesystem::exists(dir.path() / "ok.json"));
  CHECK_FALSE(std::filesystem::exists(dir.path() / "ok.json.tmp-memsim"));
  // /dev/null is written in place and the regular output is written too.
  r = RunMemsim(dir, "run --no-chart --html /dev/null --json ok.json");
  CHECK(r.exit_code == 0);
  CHECK(std::filesystem::exists(dir.path() / "ok.json"));
}

TEST_CASE("memsim run: a named pipe with no reader is refused at once, not waited on", "[cli]") {
  ScratchDir dir("run");
  const std::filesystem::path fifo = dir.path() / "out.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // timeout(1) turns a hang (the defect: open(2) of a FIFO blocks until a reader comes) into
  // exit 124 rather than a stuck test.
  const std::string err = dir.path().string() + ".fifo-err";
  for (const std::string flag : {"--json", "--csv"}) {
    const std::string cmd = "cd '" + dir.path().string() + "' && timeout 60 '" MEMSIM_BINARY
                            "' run --no-chart " + flag + " out.fifo 2> '" + err + "'";
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK(ReadAll(err) == "memsim run: out.fifo: cannot write: a named pipe (FIFO) with no "
                          "reader; start its reader first or choose a regular file\n");
  }
  std::filesystem::remove(err);
}

TEST_CASE("memsim run: --snapshot-iterations names the snapshot's window and says what it left",
          "[cli]") {
  ScratchDir dir("run");
  auto r = RunMemsim(dir, "run --set training.global_batch_size=16 --iterations 3 --no-chart "
                          "--snapshot s.pickle --snapshot-iterations 1");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("--snapshot s.pickle: init and iterations 1..1 of the 3 simulated: ") !=
        std::string::npos);
  CHECK(r.out.find("--snapshot-iterations N names the window (0: every iteration)\n") !=
        std::string::npos);
  CHECK(RunMemsim(dir, "replay s.pickle --backend npu").exit_code == 0);
  // The whole short run fits the default window: nothing left out, nothing said.
  r = RunMemsim(dir, "run --set training.global_batch_size=16 --iterations 3 --no-chart "
                     "--snapshot s.pickle");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("--snapshot s.pickle:") == std::string::npos);
  r = RunMemsim(dir, "run --no-chart --snapshot s.pickle --snapshot-iterations -1");
  CHECK(r.exit_code == 2);
}

TEST_CASE("memsim run: --set takes one KEY=VALUE each time, the config may follow it", "[cli]") {
  ScratchDir dir("run");
  const auto r = RunMemsim(dir, "run --set training.train_iters=2 " + std::string(MEMSIM_SOURCE_DIR) +
                                    "/configs/default.json --set training.micro_batch_size=2 --no-chart");
  CHECK(r.exit_code == 0);
  // global 64 / (micro-batch 2 × DP 4) = 8 micro-batches; two iterations in the table.
  CHECK(r.out.find("micro-batch 2 x 8 per iteration") != std::string::npos);
  CHECK(r.out.find("\n   2 ") != std::string::npos);
  CHECK(r.out.find("\n   3 ") == std::string::npos);
}

TEST_CASE("memsim dump-program prints one op a line", "[cli]") {
  ScratchDir dir("dump");
  const auto r = RunMemsim(dir, "dump-program --iterations 1");
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("# program: pipeline_rank=0 iterations=1 ops=", 0) == 0);
  CHECK(r.out.find("+layer0.attn.qkv.weight:") != std::string::npos);
}

}  // namespace
}  // namespace memsim

namespace memsim {
namespace {

TEST_CASE("memsim run: words after a launch script are the script's own arguments", "[cli]") {
  testing::ScratchDir dir("run-script-args");
  const std::string script = std::string(MEMSIM_SOURCE_DIR) +
                             "/tests/data/launch_scripts/eval_pai_run_mcore_qwen3.sh";
  // Pai-Megatron-Patch's run_mcore_qwen3.sh takes 27 arguments: ENV dsw, MODEL_SIZE A3B, batch
  // 1 / 8, learning rates, sequence 128 / 128, bf16, TP 1, PP 1, CP 1, ETP 1, EP 4, ... (its
  // header). The world size comes from `python -c` (not run), so --set gives DP 8.
  const auto r = testing::RunMemsim(
      dir, "run --megatron-args " + script +
               " --device h100-80g --no-chart --set training.data_parallel_size=8 -- dsw A3B 1 8 "
               "1e-5 1e-6 128 128 bf16 1 1 1 1 4 true true true false sel false 100000 /d /v "
               "none 10000000000 10000 /o");
  REQUIRE(r.exit_code == 0);
  // Qwen3-30B-A3B as the A3B branch builds it: h 2048, 48 layers, 32 heads x 128, 4 query
  // groups, q/k norms of 128, 128 experts of 768 (SwiGLU), router 128 x 2048, vocabulary 151936
  // untied. A layer: q 8,388,608 + k, v 2 x 1,048,576 + o 8,388,608 + norms 4096 + q/k norms
  // 256 = 18,878,720 attention and norms, router 262,144, experts 128 x 3 x 768 x 2048 =
  // 603,979,776: 623,120,640; x 48 = 29,909,790,720; embedding and output layer 2 x 151936 x
  // 2048 = 622,329,856; final norm 2048: 30,532,122,624 (the model's published 30.5 B).
  // On a rank at EP 4: 32 experts, 150,994,944 a layer: (18,878,720 + 262,144 + 150,994,944) x
  // 48 + 622,329,856 + 2048 = 8,788,850,688.
  CHECK(r.out.find("parameters: 30532122624 (30.53 B) total, 8788850688 (8.79 B) on this rank") !=
        std::string::npos);
  CHECK(r.err.find("read with the script arguments 'dsw A3B 1 8") != std::string::npos);
  // A config file beside the launch is still refused (not taken as $1).
  const auto both = testing::RunMemsim(dir, "run x.json --megatron-args " + script);
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("give no training config too (got 'x.json')") != std::string::npos);
}

TEST_CASE("memsim run: --script-var sets a launch script's variable without editing it", "[cli]") {
  testing::ScratchDir dir("run-script-var");
  const std::string script = std::string(MEMSIM_SOURCE_DIR) +
                             "/tests/data/launch_scripts/megatron_train_llama3_8b_h100_fp8.sh";
  // The script sets DTYPE="fp8" at line 39 and adds its FP8 flags when DTYPE is fp8; pinned to
  // bf16, none is passed. Llama-3 8B as the script builds it: 8,030,261,248 parameters
  // (tests/config/launch_scripts_test.cc derives them), all on the one rank (TP 1, PP 1).
  const auto r = testing::RunMemsim(dir, "run --megatron-args " + script +
                                             " --script-var DTYPE=bf16 --device h100-80g --no-chart");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("parameters: 8030261248 (8.03 B) total") != std::string::npos);
  CHECK(r.err.find("--script-var DTYPE=bf16: the script's own assignment at line 39 skipped") !=
        std::string::npos);
  // Bad uses: a name that is not a shell name, and --script-var without a launch script.
  const auto bad = testing::RunMemsim(dir, "run --megatron-args " + script + " --script-var 1X=2");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--script-var 1X=2: expected NAME=VALUE") != std::string::npos);
  const auto alone = testing::RunMemsim(dir, "run --script-var DTYPE=bf16");
  CHECK(alone.exit_code == 2);
  CHECK(alone.err.find("--script-var") != std::string::npos);
}

// A misspelt --script-var changes nothing; when the launch is then refused (here for the FP8
// flags of the branch the script's own DTYPE="fp8" takes), the refusal says the name was unused.
TEST_CASE("memsim run: a refused launch says which --script-var the script never used", "[cli]") {
  testing::ScratchDir dir("run-script-var-typo");
  const std::string script = std::string(MEMSIM_SOURCE_DIR) +
                             "/tests/data/launch_scripts/megatron_train_llama3_8b_h100_fp8.sh";
  const auto r = testing::RunMemsim(dir, "run --megatron-args " + script +
                                             " --script-var DTPYE=bf16 --device h100-80g --no-chart");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--fp8-format") != std::string::npos);
  CHECK(r.err.find("note: " + script + ": --script-var DTPYE=bf16: the script neither sets nor "
                   "reads $DTPYE; it changes nothing") != std::string::npos);
}

}  // namespace
}  // namespace memsim
