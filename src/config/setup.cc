// Functions of a loaded Setup (setup.h): views the workload asks for, computed from its fields.
#include "config/setup.h"

#include "config/stack.h"

namespace memsim::config {

DataParallelWrapper DataParallelOf(const TrainingConfig& c) { return StackOf(c).Wrapper(c); }

std::int64_t PaddedVocabSize(const ModelConfig& m, const TrainingConfig& c) {
  if (!StackOf(c).Traits().pads_vocab) return m.vocab_size;
  const std::int64_t multiple =
      std::int64_t{m.make_vocab_size_divisible_by} * c.tensor_model_parallel_size;
  return (m.vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace memsim::config
