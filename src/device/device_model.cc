#include "device/device_model.h"

#include <algorithm>

#include "device/communicators.h"

namespace memsim::device {

DeviceModel::DeviceModel(const config::Setup& setup)
    : preset_(setup.device), fixed_bytes_(ContextBytes(setup) + UserbufferBytes(setup)),
      env_(setup.training.env) {}

bool DeviceModel::OnCollective(std::string_view group, int ranks) {
  if (group.empty() || groups_.find(group) != groups_.end()) return false;
  const Bytes bytes = CommunicatorBytes(preset_, env_, group, ranks);
  groups_.emplace(std::string(group), bytes);
  communicator_bytes_ += bytes;
  return true;
}

Bytes DeviceModel::OutsideAllocatorBytes() const { return fixed_bytes_ + communicator_bytes_; }

Bytes DeviceModel::DeviceBytes(Bytes reserved_bytes) const {
  const Bytes used = reserved_bytes + preset_.idle_baseline_bytes + OutsideAllocatorBytes();
  const Bytes room = preset_.total_memory_bytes > 0
                         ? std::max<Bytes>(0, preset_.total_memory_bytes - used)
                         : managed_bytes_;
  return used + std::min(managed_bytes_, room);
}

Bytes DeviceModel::AllocatorCapacity(Bytes usable_memory_bytes) const {
  return std::max<Bytes>(0, usable_memory_bytes - OutsideAllocatorBytes());
}

}  // namespace memsim::device
