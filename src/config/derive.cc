// The derived values of a Setup (derive.h).
#include "config/derive.h"

#include <fmt/core.h>

#include "config/stack.h"

namespace memsim::config::internal {

void Derive(Setup* s, const Origin& origin) {
  StackOf(s->training).Derive(s, origin);
  TrainingConfig& c = s->training;
  const int layers_per_stage = s->model.num_hidden_layers / c.pipeline_model_parallel_size;
  if (const std::optional<int> vstages = origin.virtual_stages_per_pipeline_rank) {
    c.num_layers_per_virtual_pipeline_stage = *vstages > 1 ? layers_per_stage / *vstages : 0;
  }
  if (c.num_layers_per_virtual_pipeline_stage == layers_per_stage && !UnevenPipeline(c)) {
    c.num_layers_per_virtual_pipeline_stage = 0;  // one chunk per stage: not interleaved
  }
  c.num_micro_batches = static_cast<int>(
      c.global_batch_size / (std::int64_t{c.micro_batch_size} * c.data_parallel_size));
  if (c.sequence_parallel && c.tensor_model_parallel_size == 1) {
    // Megatron arguments.py: "Disabling sequence parallelism because tensor model parallelism
    // is disabled" (a warning, not an error).
    c.sequence_parallel = false;
    s->notes.push_back(fmt::format("{}: switched off because tensor_model_parallel_size is 1, as "
                                   "Megatron does",
                                   origin.Training("sequence_parallel")));
  }
  s->model.padded_vocab_size = PaddedVocabSize(s->model, c);
}

}  // namespace memsim::config::internal
