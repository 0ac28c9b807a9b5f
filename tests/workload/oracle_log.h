// The oracle's recorded logs (tests/data/oracle/*.log, written by tools/oracle/record.py: one
// training step of the real modelling code on CPU, bytes counted by a wrapper of PyTorch's CPU
// allocator) and memsim's Program for the same tiny config, lined up module boundary by module
// boundary, with a gap table that names every difference.
//
// A boundary is "<phase> <module> <pre|post>". The compared quantity is the bytes alive at the
// boundary less the bytes alive when the step starts, in each: the oracle's counts every CPU
// storage; memsim's counts every category but the device-only ones (workspaces, communication
// buffers, other), which a CPU run has none of.
//
// The gap table: one row per named difference, `bytes` = real − memsim (positive: memsim holds
// less than the real code, i.e. frees earlier or never allocates; negative: memsim holds more),
// active on the log's boundaries from `first` to `last` inclusive (in log order). At each compared
// boundary, real − memsim must equal the sum of the active rows. Sizes in bytes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "workload/program.h"

namespace memsim::workload::testing {

struct OracleBoundary {
  std::string label;  // "fwd layers.0.self_attn post"
  std::string phase, module, where;
  Bytes alive = 0;  // bytes alive at the boundary
  Bytes peak = 0;   // the highest alive since the previous boundary
};

// The boundaries of tests/data/oracle/<name>.log, in order. Fails the test (REQUIRE) when the
// file is missing or a line is malformed.
std::vector<OracleBoundary> ReadOracleLog(const std::string& name);

// Why memsim and the real code differ on a row of the gap table.
enum class GapReason {
  kVersion,        // the oracle's code (transformers 4.36, CPU) differs from what memsim models
  kMemsimShorter,  // memsim frees it earlier than the real code (memsim too low: to fix)
  kMemsimLonger,   // memsim holds it longer, or makes a tensor the real code does not
  kSetup,          // what the harness allocates outside the model (inputs, static caches)
};

struct GapRow {
  std::string name;  // what the tensor is, and the code that makes / frees it
  GapReason reason;
  Bytes bytes;        // real − memsim while active
  std::string first;  // the first boundary where it applies (a label of the log)
  std::string last;   // the last one (inclusive)
};

// memsim's alive bytes at a boundary of the log, less its alive bytes at the step's start; the
// ops that make up each module are picked by `in_module(module, op)`. Returns false when memsim
// has no op of that module (the boundary is not compared).
using ModuleOps = std::function<bool(const std::string& module, const Op& op)>;
struct MemsimBoundaries {
  // By label; only those found.
  std::vector<std::pair<std::string, Bytes>> delta;
};
MemsimBoundaries MemsimAtBoundaries(const Program& p, const std::vector<OracleBoundary>& log,
                                    const ModuleOps& in_module);

// One compared boundary: real and memsim deltas from the step start, and what the table explains.
struct BoundaryCheck {
  std::string label;
  Bytes real = 0, memsim = 0, explained = 0;
};
std::vector<BoundaryCheck> CheckAgainstTable(const std::vector<OracleBoundary>& log,
                                             const MemsimBoundaries& memsim,
                                             const std::vector<GapRow>& table);

}  // namespace memsim::workload::testing
