// check, explain and compare on a DeepSpeed ZeRO run (the shipped ZeRO-2 example,
// configs/llama2-7b-a100-zero2-dp8.json) end to end through the binary, as on the other stacks.
#include <catch2/catch.hpp>
#include <string>

#include "cli/cli_test_util.h"

namespace memsim {
namespace {

using testing::RunMemsim;
using testing::ScratchDir;

const std::string kZero2 =
    std::string(MEMSIM_SOURCE_DIR) + "/configs/llama2-7b-a100-zero2-dp8.json";

TEST_CASE("memsim check on a ZeRO-2 run: fits, and matches its shipped baseline",
          "[check][cli][zero]") {
  ScratchDir dir("zero-check");
  const auto r = RunMemsim(dir, "check " + kZero2);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("ok ", 0) == 0);
  CHECK(r.out.find("stage 0: peak ") != std::string::npos);
  const std::string baselines = std::string(MEMSIM_SOURCE_DIR) + "/tests/baselines/";
  const auto b = RunMemsim(dir, "check " + kZero2 + " --baseline " + baselines);
  CHECK(b.exit_code == 0);
}

TEST_CASE("memsim explain on a ZeRO-2 run names ZeRO's own steps", "[report][explain][cli][zero]") {
  ScratchDir dir("zero-explain");
  const auto r = RunMemsim(dir, "explain " + kZero2 + " --width 100");
  REQUIRE(r.exit_code == 0);
  // The flat 16-bit buffer of DeepSpeedZeroOptimizer.__init__ is the largest new segment of init
  // (12.55 GiB of bf16 weights), and the step's fp32 gradient partition is an op of its own.
  CHECK_THAT(r.out, Catch::Contains("at init.zero.flatten (init)"));
  CHECK_THAT(r.out, Catch::Contains("zero.step.fp32_grad_partition"));
  CHECK_THAT(r.out, Catch::Contains("peak nvidia-smi"));
}

TEST_CASE("memsim compare on a ZeRO-2 run against its own timeline: no difference",
          "[compare][cli][zero]") {
  // The run's own CSV compared with the simulation must agree exactly (the wiring of a ZeRO
  // config through compare, as for the default config in compare_cli_test.cc).
  ScratchDir dir("zero-compare");
  const std::string small = kZero2 + " --set training.max_steps=2";
  REQUIRE(RunMemsim(dir, "run " + small + " --no-chart --csv run.csv").exit_code == 0);
  const auto c = RunMemsim(dir, "compare " + small + " --profile run.csv --tolerance 0.01");
  CHECK(c.exit_code == 0);
}

}  // namespace
}  // namespace memsim
