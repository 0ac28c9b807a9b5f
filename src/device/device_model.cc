#include "device/device_model.h"

#include <algorithm>

namespace memsim::device {

bool DeviceModel::OnCollective(std::string_view group) {
  if (group.empty() || groups_.find(group) != groups_.end()) return false;
  groups_.emplace(group);
  return true;
}

Bytes DeviceModel::OutsideAllocatorBytes() const {
  return preset_.context_bytes + NumCommunicators() * preset_.communicator_buffer_bytes;
}

Bytes DeviceModel::DeviceBytes(Bytes reserved_bytes) const {
  return reserved_bytes + preset_.idle_baseline_bytes + OutsideAllocatorBytes();
}

Bytes DeviceModel::AllocatorCapacity(Bytes usable_memory_bytes) const {
  return std::max<Bytes>(0, usable_memory_bytes - OutsideAllocatorBytes());
}

}  // namespace memsim::device
