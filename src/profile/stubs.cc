#include "core/error.h"
#include "profile/importers.h"
namespace memsim::profile::internal {
timeline::Timeline LoadNpuProfiler(const std::string&, const LoadProfileOptions&) { throw UnsupportedError("x"); }
timeline::Timeline LoadNpuMem(const std::string&, const LoadProfileOptions&) { throw UnsupportedError("x"); }
}
