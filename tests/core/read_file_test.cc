// ReadBoundedFile (core/read_file.h): the size bound and the binary-data probe, messages verbatim.
#include "core/read_file.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace memsim {
namespace {

std::string WriteScratch(const std::string& name, const std::string& bytes) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("memsim_read_file_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST_CASE("ReadBoundedFile: the whole text up to the bound, an error one byte above", "[core]") {
  const std::string at_bound = WriteScratch("a.txt", std::string(1024, 'x'));
  CHECK(ReadBoundedFile(at_bound, "a.txt", 1024, "a test file") == std::string(1024, 'x'));
  const std::string above = WriteScratch("b.txt", std::string(1025, 'x'));
  // 1024 >> 20 = 0 MiB: the message gives both figures as computed.
  CHECK_THROWS_WITH(ReadBoundedFile(above, "b.txt", 1024, "a test file"),
                    "b.txt: larger than memsim's limit of 1024 bytes (0 MiB) for a test file");
}

TEST_CASE("ReadBoundedFile: a NUL in the first 4096 bytes is binary data, later, text", "[core]") {
  const std::string early = WriteScratch("c.bin", std::string(4095, 'x') + '\0');
  CHECK_THROWS_WITH(ReadBoundedFile(early, "c.bin", 1 << 20, "a test file"),
                    "c.bin: binary data (a NUL byte at byte 4095), not a test file");
  // A log ending in NUL padding (a crashed job's) is read; its parser decides.
  const std::string late = std::string(4096, 'x') + std::string(8, '\0');
  CHECK(ReadBoundedFile(WriteScratch("d.log", late), "d.log", 1 << 20, "a test file") == late);
  CHECK_FALSE(ReadBoundedFile("/nonexistent/memsim", "x", 1, "a test file").has_value());
  CHECK_FALSE(
      ReadBoundedFile(std::filesystem::temp_directory_path().string(), "tmp", 1, "a test file")
          .has_value());
}

}  // namespace
}  // namespace memsim
