// Functions of a loaded Setup (setup.h): views the workload asks for, computed from its fields.
#include "config/setup.h"

namespace memsim::config {

bool PyTorchLoop(const TrainingConfig& c) {
  return c.framework == "pytorch" || c.framework == "hf-trainer";
}

DataParallelWrapper DataParallelOf(const TrainingConfig& c) {
  if (PyTorchLoop(c) && c.data_parallel_size > 1) {
    return TorchDdp{c.zero_grad_set_to_none, c.ddp_bucket_cap_mb, c.ddp_find_unused_parameters,
                    c.ddp_gradient_as_bucket_view};
  }
  if (PyTorchLoop(c)) return SingleDevice{c.zero_grad_set_to_none};
  if (c.use_megatron_fsdp) return MegatronFsdp{c.fsdp_sharding};
  return MegatronDdp{c.use_distributed_optimizer};
}

std::int64_t PaddedVocabSize(const ModelConfig& m, const TrainingConfig& c) {
  if (PyTorchLoop(c)) return m.vocab_size;
  const std::int64_t multiple =
      std::int64_t{m.make_vocab_size_divisible_by} * c.tensor_model_parallel_size;
  return (m.vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace memsim::config
