// Helpers for the config tests: the test-data directory and "the message LoadSetup throws".
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/load.h"
#include "core/error.h"

namespace memsim::config::testing {

inline std::string DataDir() { return std::string(MEMSIM_SOURCE_DIR) + "/tests/config/data"; }
inline std::string Data(const std::string& name) { return DataDir() + "/" + name; }

// Writes `text` to `name` in a scratch directory of this process (named by its id, so that
// parallel test runs do not collide) and returns the file's path.
inline std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("memsim-config-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << text;
  return (dir / name).string();
}

// The message of the InputError LoadSetup throws, or "(no error)".
inline std::string ErrorOf(const std::string& path, const LoadOptions& options = {}) {
  try {
    LoadSetup(path, options);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// True iff LoadSetup throws UnsupportedError.
inline bool IsUnsupported(const std::string& path, const LoadOptions& options = {}) {
  try {
    LoadSetup(path, options);
  } catch (const UnsupportedError&) {
    return true;
  } catch (const InputError&) {
    return false;
  }
  return false;
}

}  // namespace memsim::config::testing
