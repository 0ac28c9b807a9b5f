// The shipped training configs (configs/*.json, not the device presets under configs/devices/),
// sorted by path, for tests that walk them all. MEMSIM_SOURCE_DIR comes from CMakeLists.txt.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace memsim::testing {

inline std::vector<std::string> ShippedConfigs() {
  std::vector<std::string> paths;
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(MEMSIM_SOURCE_DIR) / "configs")) {
    if (e.is_regular_file() && e.path().extension() == ".json") paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace memsim::testing
