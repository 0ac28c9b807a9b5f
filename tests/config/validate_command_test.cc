// `memsim validate` end to end: runs the built binary (MEMSIM_BINARY) and checks its output and
// exit code.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

#include "cli/cli_test_util.h"

#include "test_util.h"

namespace memsim::config {
namespace {

using Result = ::memsim::testing::CombinedResult;

Result Run(const std::string& args) { return ::memsim::testing::RunMemsimCombined(args); }

TEST_CASE("memsim validate prints one line per config and exits 0 when all load", "[config]") {
  const Result r = Run("validate " + testing::Data("file_model.json"));
  CHECK(r.exit_code == 0);
  // tiny-llama: 16 samples / (micro-batch 1 × DP 2) = 8 micro-batches.
  CHECK(r.output == "ok: " + testing::Data("file_model.json") +
                        ": tiny-llama on ascend-910b-64g, TP2 PP2 DP2, seq 512, micro-batch 1, 8 "
                        "micro-batches per iteration\n");
}

TEST_CASE("memsim validate loads the embedded default without arguments", "[config]") {
  const Result r = Run("validate");
  CHECK(r.exit_code == 0);
  CHECK(r.output == "ok: <embedded>/configs/default.json: llama2-7b on ascend-910b-64g, TP2 PP1 "
                    "DP4, seq 4096, micro-batch 1, 16 micro-batches per iteration\n");
}

TEST_CASE("memsim validate reports errors on stderr and exits 2", "[config]") {
  const Result r = Run("validate " + testing::Data("negative_size.json") + " " +
                       testing::Data("file_model.json"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("memsim validate: " + testing::Data("negative_size.json") +
                      ": /training/micro_batch_size: expected a positive integer, got -1\n") !=
        std::string::npos);
  CHECK(r.output.find("ok: " + testing::Data("file_model.json")) != std::string::npos);
}

}  // namespace
}  // namespace memsim::config
