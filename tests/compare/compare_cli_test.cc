// `memsim compare` end to end through the binary: exit 0 / 1 (tolerance) / 2 (bad profile), and
// the bad-input message printed once on stderr.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>
#include <sys/wait.h>

#include "profile/writers.h"

namespace memsim {
namespace {

struct Run {
  int exit_code;
  std::string err;
};

Run RunMemsim(const std::string& args) {
  const std::string err_path = testing::TempPath("cli_stderr.txt");
  const std::string cmd =
      std::string(MEMSIM_BINARY) + " " + args + " > /dev/null 2> " + err_path;
  const int status = std::system(cmd.c_str());
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

TEST_CASE("memsim compare exit codes", "[compare]") {
  const timeline::Timeline sim = testing::KnownTimeline();
  timeline::Timeline scaled = sim;
  testing::ScaleIteration(scaled, 3, 1.10);
  const std::string sim_path = testing::TempPath("cli_sim.csv");
  const std::string scaled_path = testing::TempPath("cli_scaled.csv");
  const std::string json_path = testing::TempPath("cli_report.json");
  testing::WriteFile(sim_path, testing::WriteMemsimCsv(sim));
  testing::WriteFile(scaled_path, testing::WriteMemsimCsv(scaled));
  // Peak error +10% (iteration 3 scaled): within 12%, beyond 5%.
  CHECK(RunMemsim("compare --simulated " + sim_path + " --profile " + scaled_path +
                  " --tolerance 12% --json " + json_path).exit_code == 0);
  CHECK(std::ifstream(json_path).good());
  CHECK(RunMemsim("compare --simulated " + sim_path + " --profile " + scaled_path +
                  " --tolerance 5").exit_code == 1);
  const std::string bad = testing::TempPath("cli_bad.csv");
  testing::WriteFile(bad, "time_us,allocated_bytes\n0,-5\n");
  const Run r = RunMemsim("compare --simulated " + sim_path + " --profile " + bad);
  CHECK(r.exit_code == 2);
  CHECK(r.err == "memsim compare: " + bad +
                     ":2: allocated_bytes: expected a non-negative integer number of bytes, got "
                     "'-5'\n");
  CHECK(RunMemsim("compare --simulated " + sim_path + " --profile " + sim_path + " --format nope")
            .exit_code == 2);
  const Run typo = RunMemsim("compare --simulated " + sim_path + " --profile " + sim_path +
                             " --format nvidia-smy");  // one edit from nvidia-smi
  CHECK(typo.exit_code == 2);
  CHECK(typo.err ==
        "memsim compare: --format: expected auto, torch-trace, torch-snapshot, npu-profiler, "
        "npu-mem, npu-smi, nvidia-smi, megatron-log or memsim-csv, got 'nvidia-smy' (did you "
        "mean 'nvidia-smi'?)\n");
  // Truncated gzip, empty file, wrong kind: exit 2 with the loader's one-line message.
  const std::string cut = testing::TempPath("cli_cut.json.gz");
  {
    std::ifstream gz(testing::DataPath("trace_old.json.gz"), std::ios::binary);
    std::stringstream bytes;
    bytes << gz.rdbuf();
    testing::WriteFile(cut, bytes.str().substr(0, 100));
  }
  const Run truncated = RunMemsim("compare --simulated " + sim_path + " --profile " + cut);
  CHECK(truncated.exit_code == 2);
  CHECK(truncated.err.rfind("memsim compare: " + cut + ": byte ", 0) == 0);
  const std::string empty = testing::TempPath("cli_empty.csv");
  testing::WriteFile(empty, "");
  const Run empty_run = RunMemsim("compare --simulated " + sim_path + " --profile " + empty);
  CHECK(empty_run.exit_code == 2);
  CHECK(empty_run.err == "memsim compare: " + empty + ": empty file, expected a memory profile\n");
  const Run wrong = RunMemsim("compare --simulated " + sim_path + " --format torch-trace --profile " +
                              testing::DataPath("megatron.log"));
  CHECK(wrong.exit_code == 2);
  // The middle is nlohmann's own wording; memsim's frame is pinned (36 = the suffix length).
  CHECK(wrong.err.rfind("memsim compare: " + testing::DataPath("megatron.log") + ": byte ", 0) == 0);
  CHECK(wrong.err.find(": invalid JSON (") != std::string::npos);
  CHECK(wrong.err.substr(wrong.err.size() - 36) == "expected a Chrome trace JSON object\n");
}

TEST_CASE("memsim compare CONFIG against the CSV of memsim run: no difference", "[compare]") {
  // The simulation compared with its own timeline (`memsim run --csv`) must agree exactly, so a
  // 0.01% tolerance passes: this checks the wiring of CONFIG -> engine -> compare.
  // 4 micro-batches and 3 iterations (init, a first and two steady ones) keep it short under the
  // sanitizers; the wiring does not depend on the run's length.
  const std::string config = std::string(MEMSIM_SOURCE_DIR) +
                             "/configs/default.json --set training.global_batch_size=16 "
                             "--set training.train_iters=3";
  const std::string csv = testing::TempPath("cli_run.csv");
  REQUIRE(RunMemsim("run " + config + " --no-chart --csv " + csv).exit_code == 0);
  const std::string json = testing::TempPath("cli_self.json");
  CHECK(RunMemsim("compare " + config + " --profile " + csv + " --tolerance 0.01 --json " + json)
            .exit_code == 0);
  std::ifstream in(json);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().find("\"failed\": false") != std::string::npos);
}

}  // namespace
}  // namespace memsim
