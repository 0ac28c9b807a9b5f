// Functions of a loaded Setup (setup.h): views the workload asks for, computed from its fields.
#include "config/setup.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "config/stack.h"

namespace memsim::config {

const PyTorchOptions* TrainingConfig::pytorch() const {
  if (const auto* hf = std::get_if<HfTrainerOptions>(&stack)) return hf;
  return std::get_if<PyTorchOptions>(&stack);
}
PyTorchOptions* TrainingConfig::pytorch() {
  return const_cast<PyTorchOptions*>(std::as_const(*this).pytorch());
}
const HfTrainerOptions* TrainingConfig::hf_trainer() const {
  return std::get_if<HfTrainerOptions>(&stack);
}
HfTrainerOptions* TrainingConfig::hf_trainer() { return std::get_if<HfTrainerOptions>(&stack); }

const PyTorchOptions& PyTorchOf(const TrainingConfig& c) {
  if (const PyTorchOptions* p = c.pytorch()) return *p;
  throw std::logic_error("training config of framework \"" + c.framework +
                         "\" holds no PyTorchOptions block");
}
const HfTrainerOptions& HfTrainerOf(const TrainingConfig& c) {
  if (const HfTrainerOptions* h = c.hf_trainer()) return *h;
  throw std::logic_error("training config of framework \"" + c.framework +
                         "\" holds no HfTrainerOptions block");
}

DataParallelWrapper DataParallelOf(const TrainingConfig& c) { return StackOf(c).Wrapper(c); }

std::int64_t PaddedVocabSize(const ModelConfig& m, const TrainingConfig& c) {
  if (!StackOf(c).Traits().pads_vocab) return m.vocab_size;
  const std::int64_t multiple =
      std::int64_t{m.make_vocab_size_divisible_by} * c.tensor_model_parallel_size;
  return (m.vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace memsim::config
