#include "core/error.h"
#include "profile/importers.h"
namespace memsim::profile::internal {
timeline::Timeline LoadChromeTrace(const std::string&, const LoadProfileOptions&) { throw UnsupportedError("torch-trace"); }
timeline::Timeline LoadSnapshot(const std::string&, const LoadProfileOptions&) { throw UnsupportedError("x"); }
timeline::Timeline LoadNpuProfiler(const std::string&, const LoadProfileOptions&) { throw UnsupportedError("x"); }
timeline::Timeline LoadNpuMem(const std::string&, const LoadProfileOptions&) { throw UnsupportedError("x"); }
}
