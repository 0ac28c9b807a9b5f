#include "core/comm_group.h"

namespace memsim {

std::optional<CommGroup> CommGroupFromName(std::string_view name) {
  for (const CommGroupInfo& row : kCommGroupTable) {
    if (name == row.name) return row.group;
  }
  return std::nullopt;
}

std::optional<CommGroup> CommGroupForBufferKey(std::string_view key) {
  if (key.empty()) return std::nullopt;
  for (const CommGroupInfo& row : kCommGroupTable) {
    if (row.nccl_options.empty()) continue;
    if (key == row.name || key == row.nccl_options || key == row.older_nccl_options) {
      return row.group;
    }
  }
  return std::nullopt;
}

std::string BufferKeyNames() {
  std::string out;
  int left = 0;
  for (const CommGroupInfo& row : kCommGroupTable) left += row.nccl_options.empty() ? 0 : 1;
  for (const CommGroupInfo& row : kCommGroupTable) {
    if (row.nccl_options.empty()) continue;
    --left;
    out += row.name;
    out += left == 0 ? "" : left == 1 ? " and " : ", ";
  }
  return out;
}

}  // namespace memsim
