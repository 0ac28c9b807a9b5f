// Bad input found by trying to break `memsim`: every case is one InputError message, asserted
// verbatim, never a crash, an abort in a later module or a silently absurd simulation.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "test_util.h"

namespace memsim::config {
namespace {

using testing::Data;
using testing::ErrorOf;

// Writes `text` to a file of its own in the temporary directory and returns its path.
std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("memsim_hardening_" + std::to_string(getpid()) + "_" + name))
                               .string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result Run(const std::string& args) {
  const std::string command = std::string(MEMSIM_BINARY) + " " + args + " 2>&1";
  Result r;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

LoadOptions Set(std::vector<std::string> overrides) {
  LoadOptions o;
  o.overrides = std::move(overrides);
  return o;
}

TEST_CASE("a short unknown key gets no far-fetched suggestion", "[config]") {
  // "foo" vs "fp8": 2 edits; a 3-letter word allows max(1, 3/3) = 1 edit.
  CHECK(ErrorOf(Data("good.json"), Set({"training.foo=1"})) == "--set training.foo=1: unknown key");
  // One edit still suggests: "fp9" -> "fp8".
  CHECK(ErrorOf(Data("good.json"), Set({"training.fp9=1"})) ==
        "--set training.fp9=1: unknown key (did you mean 'fp8'?)");
  // A swap of adjacent letters is one edit: "rnu" -> "run"; "fp8" is 2 edits from "foo".
  CHECK(ClosestMatch("rnu", {"run", "check"}) == "run");
  CHECK(ClosestMatch("foo", {"fp8"}) == "");
}


TEST_CASE("JSON nested deeper than 64 levels is rejected while parsing", "[config]") {
  // 100000 '[': the 65th, at byte offset 64 of line 1, opens level 65 (column 65).
  const std::string deep = WriteTemp("deep.json", std::string(100000, '[') + std::string(100000, ']'));
  CHECK(ErrorOf(deep) == deep + ":1:65: JSON nested deeper than memsim's limit of 64 levels");
  // Brackets inside strings do not count; the 65th object opens on line 2, column 1 + 64 = 65
  // after a first line of one '{' and the key.
  std::string text = "{\"a[[[[\":\n";
  for (int i = 0; i < 100; ++i) text += "{\"k\":";
  const std::string objects = WriteTemp("deep_objects.json", text);
  CHECK(ErrorOf(objects) ==
        objects + ":2:" + std::to_string(1 + 63 * 5) + ": JSON nested deeper than memsim's limit of 64 levels");
  // 64 levels are fine (then the config is not an object).
  const std::string ok = WriteTemp("deep_ok.json", std::string(64, '[') + std::string(64, ']'));
  CHECK(ErrorOf(ok).find("expected an object") != std::string::npos);
  // A --set value is held to the same limit.
  CHECK(ErrorOf(Data("good.json"), Set({"training.seed=" + std::string(65, '[')})) ==
        "--set training.seed=" + std::string(65, '[') +
            ": value nested deeper than memsim's limit of 64 levels");
  // Through the binary: one line, exit 2.
  const Result r = Run("validate " + deep);
  CHECK(r.exit_code == 2);
  CHECK(r.output == "memsim validate: " + deep + ":1:65: JSON nested deeper than memsim's limit of 64 levels\n");
}

TEST_CASE("duplicate keys are still found at depth, with their full pointer", "[config]") {
  const std::string path = WriteTemp("dup.json", "{\"a\": [0, {\"b~/\": {\"c\": 1, \"c\": 2}}]}");
  CHECK(ErrorOf(path) == path + ": /a/1/b~0~1/c: duplicate key");
}

TEST_CASE("invalid UTF-8 and long values are echoed safely", "[config]") {
  // Each invalid byte shows as U+FFFD (UTF-8 EF BF BD); no nlohmann type_error escapes.
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(ErrorOf(Data("good.json"), Set({"training.precision=\xff\xfe"})) ==
        "--set training.precision=" + fffd + fffd + ": expected one of 'fp32', 'fp16', 'bf16', got \"" +
            fffd + fffd + "\"");
  // A 100-character value is echoed as its first 77 characters and "...".
  const std::string x(100, 'x');
  CHECK(ErrorOf(Data("good.json"), Set({"training.framework=" + x})) ==
        "unsupported: --set training.framework=" + x.substr(0, 77) + "...: framework '" +
            x.substr(0, 77) + "...' (memsim models Megatron-LM only)");
  // Through the binary (printf writes the two bytes; /bin/sh has no $'...').
  const Result r = Run("validate " + Data("good.json") +
                       " --set \"$(printf 'training.precision=\\377\\376')\"");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "memsim validate: --set training.precision=" + fffd + fffd +
                        ": expected one of 'fp32', 'fp16', 'bf16', got \"" + fffd + fffd + "\"\n");
}

}  // namespace
}  // namespace memsim::config
