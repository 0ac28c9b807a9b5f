// Megatron's closed-form estimate of a rank's memory (build.h ComputeClosedFormEstimate).
#include <algorithm>
#include <cmath>

#include "workload/build.h"
#include "workload/model.h"

namespace memsim::workload {

using config::OptimizerKind;
using config::RecomputeGranularity;

namespace {

// Megatron-LM compute_weight_and_optimizer_memory for MoE layers, as since PR #4687
// (megatron/training/theoretical_memory_usage.py): an MoE layer holds attention and shared
// experts (TP-sharded), norms, router [E, h] (and the shared-expert gate) replicated, and the
// routed experts 2·h·ffn_e·E·(3/2 if gated) split over etp·ep and costed with the expert
// data-parallel size. dense_mlp_removed: the dense MLP the layer count above assumed for the
// rank's MoE layers (2·h·ffn·(3/2 if gated) each). Zero for a dense model.
struct MoeSplit {
  double replicated = 0, expert = 0, dense_mlp_removed = 0;
};
MoeSplit MoeParameters(const ModelDims& d, int r) {
  MoeSplit out;
  if (d.experts <= 1) return out;
  const double h = static_cast<double>(d.h), gated = d.gamma == 2 ? 1.5 : 1.0;
  for (int c = 0; c < d.v; ++c) {
    for (int i = 0; i < d.StageLayers(r); ++i) {
      if (!d.IsMoeLayer(d.FirstLayer(c, r) + i)) continue;
      out.dense_mlp_removed += 2 * h * d.ffn * gated - 2 * h * d.ffn_shared * gated;
      out.replicated += h * d.experts + (d.shared_gate ? h : 0.0);
      out.expert += 2 * h * d.ffn_e * d.experts * gated / (d.etp * d.ep);
    }
  }
  return out;
}

// Weight, grad and optimizer-state bytes per parameter (theoretical_memory_usage.py's 18 / 20, or
// 6 + 12/d and 4 + 16/d with the distributed optimizer). Without mixed precision: weights and
// grads, and Adam's two moments in the weights' dtype (fp32 under Megatron: 16, or 8 + 8/d
// distributed; a plain PyTorch run with bf16 weights: 8).
double BytesPerParameter(const ModelDims& d, const config::TrainingConfig& tc) {
  const bool dist = tc.use_distributed_optimizer;
  const double elem = static_cast<double>(d.param_bytes);
  const double state_elem = d.mixed ? 4.0 : elem;
  double bytes;
  if (!d.mixed) {
    bytes = dist ? 2 * elem + 2 * elem / d.dp_cp : 4 * elem;
  } else if (d.grad_bytes == 2) {
    bytes = dist ? 4 + 16.0 / d.dp_cp : 20;
  } else {
    bytes = dist ? 6 + 12.0 / d.dp_cp : 18;
  }
  if (tc.optimizer != OptimizerKind::kAdam) {  // Adafactor's factored state: taken as none
    const bool momentum = tc.optimizer == OptimizerKind::kSgd && tc.sgd_momentum > 0;
    bytes -= (momentum ? state_elem : 2 * state_elem) / (dist ? d.dp_cp : 1);
  }
  return bytes;
}

}  // namespace

ClosedFormEstimate ComputeClosedFormEstimate(const config::Setup& setup, int pipeline_rank) {
  const ModelDims d = ComputeDims(setup);
  const config::TrainingConfig& tc = setup.training;
  const int r = pipeline_rank;
  ClosedFormEstimate e;
  const double h = static_cast<double>(d.h);
  // compute_weight_and_optimizer_memory: per layer 2h²·((1 + g/a)·q/h + ffn/h·(3/2 if gated) +
  // 2/h) (attention, MLP, the two norms).
  const double per_layer = 2 * h * h *
                           ((1.0 + static_cast<double>(d.g) / d.a) * static_cast<double>(d.q) / h +
                            static_cast<double>(d.ffn) / h * (d.gamma == 2 ? 1.5 : 1.0) + 2 / h);
  // The rank's layers (Megatron's formula divides num_layers by PP; with an uneven split the
  // stage's own count, as get_num_layers_to_build gives it).
  const double layers_here = static_cast<double>(d.StageLayers(r)) * d.v;
  const double embedding = static_cast<double>(d.V) * h;
  double params = per_layer * layers_here;
  if (r == 0) params += embedding;
  if (r == d.p - 1) {
    params += h;  // final norm
    if (!d.tied || d.p > 1) params += embedding;
  }
  e.parameters_on_rank = params / d.t;
  const MoeSplit moe = MoeParameters(d, r);
  e.parameters_on_rank += moe.replicated + moe.expert - moe.dense_mlp_removed / d.t;
  const bool dist = tc.use_distributed_optimizer;
  e.bytes_per_parameter = BytesPerParameter(d, tc);
  // MoE (PR #4687): the expert parameters at the bytes of the expert data-parallel group.
  const double expert_bytes =
      d.edp == d.dp_cp || !dist ? e.bytes_per_parameter
                                : e.bytes_per_parameter - 12.0 / d.dp_cp + 12.0 / d.edp;
  e.weight_and_optimizer_bytes = static_cast<Bytes>(
      std::llround((e.parameters_on_rank - moe.expert) * e.bytes_per_parameter +
                   moe.expert * expert_bytes));
  // Activations per layer (Korthikanti et al. 2022 Table 2; theoretical_memory_usage.py), in
  // units of s·b·h with 16-bit activations, scaled to B_a.
  const double sbh = static_cast<double>(d.T) * h;
  const double t = d.t;
  const double masks = d.hidden_dropout ? 2.0 : 0.0;
  const double mlp =
      (d.gamma == 2 ? 6.0 : 4.0) * static_cast<double>(d.ffn) / h;  // 4ffn/h, 6 gated
  const double attn_s2 = static_cast<double>(d.a) * d.s / h * (d.attention_dropout ? 5.0 : 2.0);
  const bool core_saved = !tc.use_flash_attn && tc.recompute_granularity == RecomputeGranularity::kNone;
  double layer;
  if (tc.recompute_granularity == RecomputeGranularity::kFull) {
    layer = 2.0 * sbh / d.sigma;
  } else if (d.sp) {
    layer = sbh * (16.0 + masks + mlp + (core_saved ? attn_s2 : 0.0)) / t;
  } else {
    // sbh·(10 + 24/t) for ffn = 4h: replicated 4 (LN inputs) + 2 (QKV input) + 2 (MLP input)
    // + masks; split 6 (QKV) + 2 (proj input) + mlp.
    layer = sbh * (8.0 + masks + (8.0 + mlp) / t + (core_saved ? attn_s2 / t : 0.0));
  }
  layer *= static_cast<double>(d.act_bytes) / 2.0;
  e.activation_bytes_per_layer = static_cast<Bytes>(std::llround(layer));
  double in_flight = std::min(d.p - r, d.m);
  if (d.v > 1) in_flight = d.p * (1.0 + (d.p - 1.0) / (d.p * d.v)) - r;  // interleaved penalty
  if (d.p == 1) in_flight = 1;
  e.in_flight_micro_batches = static_cast<int>(std::ceil(in_flight));
  double act = layer * layers_here * in_flight;
  if (r == 0) {
    // Input ids (8sb) and embedding dropout mask (sbh) per in-flight micro-batch, over t.
    act += (8.0 * d.T + (d.hidden_dropout ? sbh : 0.0)) * in_flight / t;
  }
  if (r == d.p - 1) act += 4.0 * sbh * (1.0 + static_cast<double>(d.V) / h) / t;
  e.activation_bytes = static_cast<Bytes>(std::llround(act));
  e.total_bytes = e.weight_and_optimizer_bytes + e.activation_bytes;
  return e;
}

}  // namespace memsim::workload
