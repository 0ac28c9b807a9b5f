// DeviceModel: what npu-smi / nvidia-smi would show for one process on one device, and how much
// of the device the caching allocator may reserve (docs/architecture.md, device/). It models four
// terms outside the allocator's reserved bytes (docs/device-memory.md, 'Terms of the device
// curve'): the device's idle baseline, the per-process runtime context (from the first device call,
// i.e. time 0), communicator buffers (one per communicator group, created lazily at the group's
// first collective -- PyTorch ProcessGroupNCCL lazy init; torch_npu HCCL likewise;
// docs/training-memory.md, 'Start-up order' item 2 and 'Memory outside the allocator'), and other
// memory outside the allocator (Transformer Engine userbuffers, from time 0). Each term's size
// comes from device/communicators.h. It does not model other processes on the device. Sizes in
// bytes.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::device {

class DeviceModel {
 public:
  explicit DeviceModel(const config::Setup& setup);

  // A collective runs on `group` (e.g. "dp", "tp") of `ranks` ranks. Returns true iff this
  // created the group's communicator (its buffers now count), i.e. it is the group's first
  // collective.
  bool OnCollective(std::string_view group, int ranks);

  // An op allocated `bytes` of CUDA unified memory (workload::Op::managed_bytes).
  void OnManaged(Bytes bytes) { managed_bytes_ += bytes; }
  // Unified memory allocated so far (bitsandbytes' paged optimizer state).
  Bytes ManagedBytes() const { return managed_bytes_; }

  // Bytes this process holds outside the caching allocator: context + communicator buffers.
  // Unified memory is not among them: the driver evicts its pages to the host when a
  // cudaMalloc needs the room, so it never lowers AllocatorCapacity.
  Bytes OutsideAllocatorBytes() const;
  // What npu-smi / nvidia-smi shows used: reserved + idle baseline + outside-allocator bytes,
  // plus the unified memory resident on the device: all of it while the device has room, else
  // what fits in its total memory (pages beyond it stay on the host). bitsandbytes fills each
  // paged state on the device when it creates it (functional.py get_paged, then F.fill), which
  // migrates its pages there, and prefetches it to the device before each update
  // (optim/optimizer.py prefetch_state), so memsim takes it resident while it fits.
  Bytes DeviceBytes(Bytes reserved_bytes) const;
  // The most the caching allocator may reserve now: usable memory (the framework's total
  // capacity, which already excludes the idle baseline) minus outside-allocator bytes
  // (docs/interfaces.md, 'Capacity and out of memory'), never below 0.
  Bytes AllocatorCapacity(Bytes usable_memory_bytes) const;

  int NumCommunicators() const { return static_cast<int>(groups_.size()); }
  const config::DevicePreset& preset() const { return preset_; }

 private:
  config::DevicePreset preset_;
  Bytes fixed_bytes_ = 0;         // context + userbuffers
  Bytes communicator_bytes_ = 0;  // all communicators created so far
  Bytes managed_bytes_ = 0;       // CUDA unified memory allocated so far
  config::JobEnvironment env_;
  std::map<std::string, Bytes, std::less<>> groups_;  // communicators created so far
};

}  // namespace memsim::device
