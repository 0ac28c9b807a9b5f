// Recompute policies (Megatron-core --recompute-granularity, --recompute-method,
// --recompute-num-layers, --recompute-modules; megatron/core/transformer/transformer_block.py
// _checkpointed_forward, transformer_layer.py):
// - full: runs of layers of a model chunk are checkpointed (tensor_parallel.checkpoint):
//   their forward runs under no_grad keeping only the run's input, and is re-run with grad in
//   backward. "uniform" splits the chunk into runs of recompute_num_layers layers; "block"
//   checkpoints the first recompute_num_layers layers one by one and runs the rest normally.
// - selective: the listed modules of every layer are recomputed (module.h SelectiveRecompute).
#pragma once

#include <vector>

#include "config/setup.h"
#include "workload/modules/module.h"

namespace memsim::workload {

// A run of layers [first, last] of a model chunk (indices within the chunk).
struct LayerRun {
  int first = 0, last = 0;
  bool checkpointed = false;
};

// REQUIRES: layers_per_chunk >= 1. Without full recompute: one run, not checkpointed.
std::vector<LayerRun> RecomputeRuns(const config::TrainingConfig& tc, int layers_per_chunk);

// The modules selective recompute re-runs; none unless recompute_granularity is "selective".
// Megatron's default list is {"core_attn"} (transformer_config.py __post_init__).
// te_fused_norms: the norms are fused into the next linear (Transformer Engine spec), where
// "layernorm" has nothing to recompute (the layer's norms are IdentityOp).
SelectiveRecompute SelectiveModules(const config::TrainingConfig& tc, bool te_fused_norms);

}  // namespace memsim::workload
