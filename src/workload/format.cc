#include "workload/format.h"

#include <fmt/format.h>

#include <iterator>
#include <unordered_map>

namespace memsim::workload {

std::string FormatProgram(const Program& program) {
  // Lookup only (no decisions from iteration order).
  std::unordered_map<TensorId, const std::string*> labels;
  std::string out;
  fmt::format_to(std::back_inserter(out), "# program: pipeline_rank={} iterations={} ops={}\n",
                 program.pipeline_rank, program.num_iterations, program.ops.size());
  auto label = [&](TensorId id) -> std::string {
    auto it = labels.find(id);
    return it == labels.end() ? fmt::format("#{}", id) : *it->second;
  };
  for (const Op& op : program.ops) {
    auto it = std::back_inserter(out);
    fmt::format_to(it, "{} {} mb=", op.iteration, PhaseName(op.phase));
    if (op.micro_batch >= 0)
      fmt::format_to(it, "{}", op.micro_batch);
    else
      out += '-';
    out += " layer=";
    if (op.layer >= 0)
      fmt::format_to(it, "{}", op.layer);
    else
      out += '-';
    fmt::format_to(it, " s{} {} {:.1f}us", op.stream, op.name, op.duration_us);
    for (const TensorAlloc& a : op.allocs) {
      labels[a.id] = &a.label;
      fmt::format_to(it, " +{}:{}:{}", a.label, a.size_bytes, CategoryName(a.category));
    }
    for (TensorId id : op.frees) fmt::format_to(it, " -{}", label(id));
    for (const auto& [id, stream] : op.record_streams) {
      fmt::format_to(it, " rs={}@{}", label(id), stream);
    }
    if (!op.collective_group.empty()) fmt::format_to(it, " coll={}", op.collective_group);
    if (op.synchronize) out += " sync";
    if (op.empty_cache) out += " empty_cache";
    if (op.managed_bytes != 0) fmt::format_to(it, " managed={}", op.managed_bytes);
    out += '\n';
  }
  return out;
}

}  // namespace memsim::workload
