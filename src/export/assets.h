// Internal to export/: the files of third_party/uplot/ (uPlot 1.6.32, MIT; third_party/uplot/
// README.md says how they were obtained), compiled in by src/export/embed_assets.cmake.
#pragma once

#include <string_view>

namespace memsim::exports::internal {

std::string_view UplotJs();       // uPlot.iife.min.js: defines the global uPlot
std::string_view UplotCss();      // uPlot.min.css
std::string_view UplotLicense();  // LICENSE (MIT)

}  // namespace memsim::exports::internal
