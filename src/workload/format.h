// FormatProgram: the text form of a Program for `memsim dump-program`, one op a line:
//   <iteration> <phase> mb=<micro-batch|-> layer=<layer|-> s<stream> <name> <duration>us
//   [+<label>:<bytes>:<category> ...] [-<label> ...] [rs=<label>@<stream> ...] [coll=<group>]
//   [sync] [empty_cache]
// Frees and record_streams name the tensor by its label (ids are internal). Deterministic.
#pragma once

#include <string>

#include "workload/program.h"

namespace memsim::workload {

std::string FormatProgram(const Program& program);

}  // namespace memsim::workload
