#include "workload/recompute.h"

#include <algorithm>
#include <limits>

namespace memsim::workload {

std::vector<LayerRun> RecomputeRuns(const config::TrainingConfig& tc, int layers_per_chunk) {
  std::vector<LayerRun> runs;
  const int n = std::max(1, tc.recompute_num_layers);
  const int lc = layers_per_chunk;
  if (tc.recompute_granularity != config::RecomputeGranularity::kFull) {
    runs.push_back({0, lc - 1, false});
    return runs;
  }
  if (tc.recompute_method == config::RecomputeMethod::kUniform) {
    for (int i = 0; i < lc; i += n) runs.push_back({i, std::min(i + n, lc) - 1, true});
  } else {
    const int k = std::min(n, lc);
    for (int i = 0; i < k; ++i) runs.push_back({i, i, true});
    if (k < lc) runs.push_back({k, lc - 1, false});
  }
  return runs;
}

namespace {

// MindSpeed recompute_common.py should_recompute (at 028de58): a layer's priority is its index
// within its chunk ((layer_number - 1) % layer_per_chunk, vpp_rank 0 without
// --enable-recompute-layers-per-pp-rank); the first recompute_num_layers (full recompute's
// layers) are left out, then N layers (all when N is None) recompute the activation.
void ActivationFunctionLayers(const config::TrainingConfig& tc, SelectiveRecompute* s) {
  if (!tc.recompute_activation_function) return;
  const int full = tc.recompute_granularity == config::RecomputeGranularity::kFull
                       ? tc.recompute_num_layers
                       : 0;
  const int n = tc.recompute_activation_function_num_layers;
  s->act_fn_from = full;
  s->act_fn_to = n < 0 ? std::numeric_limits<int>::max() : full + n;
}

}  // namespace

SelectiveRecompute SelectiveModules(const config::TrainingConfig& tc, bool te_fused_norms) {
  SelectiveRecompute s;
  ActivationFunctionLayers(tc, &s);
  if (tc.recompute_granularity != config::RecomputeGranularity::kSelective) return s;
  for (const std::string& m : tc.recompute_modules) {
    if (m == "core_attn") s.core_attn = true;
    if (m == "mlp") s.mlp = true;
    if (m == "layernorm") s.layernorm = !te_fused_norms;
    if (m == "moe") s.moe = true;
    if (m == "moe_act") s.moe_act = true;
  }
  return s;
}

}  // namespace memsim::workload
