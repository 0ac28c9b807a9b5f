// Internal to profile/: one loader per format, each in its own file (profile.h dispatches).
// Each reads `path` as a stream and throws InputError as profile.h describes.
#pragma once

#include <string>

#include "profile/profile.h"

namespace memsim::profile::internal {

timeline::Timeline LoadMemsimCsv(const std::string& path, const LoadProfileOptions& options);
timeline::Timeline LoadMegatronLog(const std::string& path, const LoadProfileOptions& options);
timeline::Timeline LoadNvidiaSmi(const std::string& path, const LoadProfileOptions& options);
timeline::Timeline LoadNpuSmi(const std::string& path, const LoadProfileOptions& options);
timeline::Timeline LoadChromeTrace(const std::string& path, const LoadProfileOptions& options);
timeline::Timeline LoadSnapshot(const std::string& path, const LoadProfileOptions& options);
timeline::Timeline LoadNpuProfiler(const std::string& path, const LoadProfileOptions& options);
timeline::Timeline LoadNpuMem(const std::string& path, const LoadProfileOptions& options);

}  // namespace memsim::profile::internal
