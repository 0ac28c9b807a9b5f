// Functions of a loaded Setup (setup.h): views the workload asks for, computed from its fields.
#include "config/setup.h"

#include <string>
#include <utility>

#include "config/stack.h"
#include "core/check.h"

namespace memsim::config {

const PyTorchOptions* TrainingConfig::pytorch() const {
  if (const auto* hf = std::get_if<HfTrainerOptions>(&stack)) return hf;
  if (const auto* titan = std::get_if<TorchtitanOptions>(&stack)) return titan;
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
  const PyTorchOptions* p = c.pytorch();
  MEMSIM_CHECK(p != nullptr);  // a stack asked for a block its reader did not set: a bug
  return *p;
}
const HfTrainerOptions& HfTrainerOf(const TrainingConfig& c) {
  const HfTrainerOptions* h = c.hf_trainer();
  MEMSIM_CHECK(h != nullptr);
  return *h;
}

DataParallelWrapper DataParallelOf(const TrainingConfig& c) { return StackOf(c).Wrapper(c); }

bool UnevenPipeline(const TrainingConfig& c) {
  return c.decoder_first_pipeline_num_layers > 0 || c.decoder_last_pipeline_num_layers > 0;
}

std::vector<int> StageLayerCounts(const ModelConfig& m, const TrainingConfig& c) {
  const int pp = c.pipeline_model_parallel_size;
  const int first = c.decoder_first_pipeline_num_layers, last = c.decoder_last_pipeline_num_layers;
  const int middle_stages = pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  const int middle = middle_stages > 0
                         ? (m.num_hidden_layers - first - last) / middle_stages
                         : 0;
  std::vector<int> out(static_cast<std::size_t>(pp), UnevenPipeline(c) ? middle : m.num_hidden_layers / pp);
  if (first > 0) out.front() = first;
  if (last > 0) out.back() = last;
  return out;
}

std::int64_t PaddedVocabSize(const ModelConfig& m, const TrainingConfig& c) {
  if (!StackOf(c).Traits().pads_vocab) return m.vocab_size;
  const std::int64_t multiple =
      std::int64_t{m.make_vocab_size_divisible_by} * c.tensor_model_parallel_size;
  return (m.vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace memsim::config
