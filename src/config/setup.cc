// Functions of a loaded Setup (setup.h): views the workload asks for, computed from its fields.
#include "config/setup.h"

namespace memsim::config {

DataParallelWrapper DataParallelOf(const TrainingConfig& c) {
  if (c.framework == "pytorch") return SingleDevice{c.zero_grad_set_to_none};
  if (c.use_megatron_fsdp) return MegatronFsdp{c.fsdp_sharding};
  return MegatronDdp{c.use_distributed_optimizer};
}

}  // namespace memsim::config
