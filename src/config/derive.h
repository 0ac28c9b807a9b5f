// Internal to config/: the values of a Setup that follow from others, computed once, after the
// rules on what was written (CheckWritten, rules.h) and before those on derived values
// (CheckDerived). Each derivation that changes what the config said appends a note naming the
// key (through `origin`), as Megatron prints a warning where it does the same.
#pragma once

#include <cstdint>

#include "config/origin.h"
#include "config/setup.h"

namespace memsim::config::internal {

// Fills, in this order:
// - training.accumulate_allreduce_grads_in_fp32 true for bf16 with framework "megatron"
//   (validate_args in megatron/training/arguments.py requires it);
// - training.num_layers_per_virtual_pipeline_stage from num_virtual_stages_per_pipeline_rank as
//   written; 0 (not interleaved) when it equals the layers per stage;
// - training.num_micro_batches = global_batch_size / (micro_batch_size × data_parallel_size)
//   (Megatron get_num_microbatches(), megatron/core/num_microbatches_calculator.py; with framework
//   "pytorch" the gradient accumulation steps);
// - training.sequence_parallel false at TP 1 (validate_args disables it with a warning);
// - model.padded_vocab_size (PaddedVocabSize).
// REQUIRES: CheckWritten(*s, origin) passed.
void Derive(Setup* s, const Origin& origin);

}  // namespace memsim::config::internal
