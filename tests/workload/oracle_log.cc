#include "workload/oracle_log.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace memsim::workload::testing {
namespace {

bool OracleDeviceOnly(Category c) {
  return c == Category::kWorkspace || c == Category::kCommunication || c == Category::kOther;
}

bool OracleIsRecompute(const Op& op) { return op.name.rfind("recompute.", 0) == 0; }

// Alive bytes (the categories a CPU run has) after each op of iteration 1, and before its first.
struct OracleAliveTrack {
  std::vector<const Op*> ops;
  std::vector<Bytes> after;
  Bytes start = 0;
};

OracleAliveTrack OracleTrackIteration1(const Program& p) {
  std::map<TensorId, Bytes> size;
  OracleAliveTrack t;
  Bytes alive = 0;
  bool started = false;
  for (const Op& op : p.ops) {
    if (op.iteration == 1 && !started) {
      t.start = alive;
      started = true;
    }
    for (const TensorAlloc& a : op.allocs) {
      if (OracleDeviceOnly(a.category)) continue;
      size[a.id] = a.size_bytes;
      alive += a.size_bytes;
    }
    for (TensorId id : op.frees) {
      auto it = size.find(id);
      if (it == size.end()) continue;
      alive -= it->second;
      size.erase(it);
    }
    if (op.iteration == 1) {
      t.ops.push_back(&op);
      t.after.push_back(alive);
    }
  }
  return t;
}

// Which of memsim's ops a boundary's phase covers.
bool OracleInPhase(const std::string& phase, const Op& op) {
  if (phase == "fwd" || phase == "nograd") return op.phase == Phase::kForward;
  if (phase == "recompute") return op.phase == Phase::kBackward && OracleIsRecompute(op);
  return false;
}

// The op with the recompute prefix taken off, so that module names match in both phases.
Op OracleUnprefixed(const Op& op) {
  Op o;
  o.name = OracleIsRecompute(op) ? op.name.substr(std::string("recompute.").size()) : op.name;
  o.layer = op.layer;
  o.phase = op.phase;
  return o;
}

}  // namespace

std::vector<OracleBoundary> ReadOracleLog(const std::string& name) {
  const std::string path = std::string(MEMSIM_SOURCE_DIR) + "/tests/data/oracle/" + name + ".log";
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<OracleBoundary> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    OracleBoundary b;
    ls >> b.phase >> b.module >> b.where >> b.alive >> b.peak;
    INFO(path << ": " << line);
    REQUIRE(!ls.fail());
    b.label = b.phase + " " + b.module + " " + b.where;
    out.push_back(b);
  }
  REQUIRE(!out.empty());
  return out;
}

MemsimBoundaries MemsimAtBoundaries(const Program& p, const std::vector<OracleBoundary>& log,
                                    const ModuleOps& in_module) {
  const OracleAliveTrack t = OracleTrackIteration1(p);
  MemsimBoundaries m;
  auto last_of = [&](Phase ph) -> std::optional<Bytes> {
    std::optional<Bytes> v;
    for (size_t i = 0; i < t.ops.size(); ++i) {
      if (t.ops[i]->phase == ph) v = t.after[i] - t.start;
    }
    return v;
  };
  for (const OracleBoundary& b : log) {
    std::optional<Bytes> v;
    if (b.phase == "step") {
      if (b.module == "start") v = 0;
      if (b.module == "loss") v = last_of(Phase::kForward);
      if (b.module == "backward") v = last_of(Phase::kBackward);
      if (b.module == "optimizer") v = last_of(Phase::kOptimizerStep);
    } else {
      // pre: alive before the module's first op; post: alive after its last, in that phase.
      std::optional<size_t> first, last;
      for (size_t i = 0; i < t.ops.size(); ++i) {
        if (!OracleInPhase(b.phase, *t.ops[i]) || !in_module(b.module, OracleUnprefixed(*t.ops[i])))
          continue;
        if (!first) first = i;
        last = i;
      }
      if (first && b.where == "pre") v = (*first == 0 ? t.start : t.after[*first - 1]) - t.start;
      if (last && b.where == "post") v = t.after[*last] - t.start;
    }
    if (v) m.delta.emplace_back(b.label, *v);
  }
  return m;
}

std::vector<BoundaryCheck> CheckAgainstTable(const std::vector<OracleBoundary>& log,
                                             const MemsimBoundaries& memsim,
                                             const std::vector<GapRow>& table) {
  std::map<std::string, Bytes> ms(memsim.delta.begin(), memsim.delta.end());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < log.size(); ++i) index.emplace(log[i].label, i);
  for (const GapRow& row : table) {
    INFO("gap row " << row.name);
    REQUIRE(index.count(row.first) == 1);
    REQUIRE(index.count(row.last) == 1);
  }
  std::vector<BoundaryCheck> out;
  const Bytes real_start = log.front().alive;
  for (size_t i = 0; i < log.size(); ++i) {
    auto it = ms.find(log[i].label);
    if (it == ms.end()) continue;
    BoundaryCheck c;
    c.label = log[i].label;
    c.real = log[i].alive - real_start;
    c.memsim = it->second;
    for (const GapRow& row : table) {
      if (index.at(row.first) <= i && i <= index.at(row.last)) c.explained += row.bytes;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace memsim::workload::testing
