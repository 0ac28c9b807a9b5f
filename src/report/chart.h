// A terminal chart of the three curves (allocated, reserved, device) across init and the
// iterations. Each span (init, iteration 1, 2, ...) gets the same number of columns, so
// iterations line up whatever their simulated duration; within a column each curve shows its
// maximum. Areas are stacked because allocated <= reserved <= device always holds:
//   '#' allocated, '+' reserved but not allocated (cached blocks), '.' device outside the
//   allocator (idle baseline, context, communicator buffers).
// Fits `width` columns (>= 40); rows = `height` (>= 4).
#pragma once

#include <string>

#include "timeline/timeline.h"

namespace memsim::report {

struct ChartOptions {
  int width = 80;
  int height = 12;
  std::string title;
};

// Returns the chart text (several lines, each ending in '\n'); "" when there are no samples.
// Unknown values (kUnknownBytes) are left blank.
std::string FormatChart(const timeline::Timeline& timeline, const ChartOptions& options);

}  // namespace memsim::report
