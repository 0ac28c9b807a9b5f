// Estimates of what not-modelled flags change (not_modelled.h).
#include "workload/not_modelled.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/core.h>

#include "workload/build.h"
#include "workload/model.h"

namespace memsim::workload {
namespace {

using config::RecomputeGranularity;

// What the estimators share: the rank's dims, static sizes and activation multiplicity.
struct RankView {
  ModelDims d;
  StaticSizes sizes;
  int dense_layers = 0;  // dense (non-MoE) transformer layers on the rank, all chunks
  int layers = 0;        // transformer layers on the rank, all chunks
  int in_flight = 1;     // micro-batches whose activations a 1F1B stage holds: min(p - r, m)
  bool full_recompute = false;
};

RankView ViewOf(const config::Setup& setup, int r) {
  RankView v{ComputeDims(setup), ComputeStaticSizes(setup, r)};
  for (int c = 0; c < v.d.v; ++c) {
    for (int i = 0; i < v.d.Lc; ++i) {
      ++v.layers;
      if (!v.d.IsMoeLayer(c * v.d.p * v.d.Lc + r * v.d.Lc + i)) ++v.dense_layers;
    }
  }
  v.in_flight = std::max(1, std::min(v.d.p - r, v.d.m));
  v.full_recompute = setup.training.recompute_granularity == RecomputeGranularity::kFull;
  return v;
}

// The flag's first value as a positive integer, else `fallback`.
int IntValue(const config::NotModelled& f, int fallback) {
  if (f.values.empty()) return fallback;
  int n = 0;
  const std::string& s = f.values[0];
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  return ec == std::errc() && end == s.data() + s.size() && n > 0 ? n : fallback;
}

std::string Gi(double elements) { return fmt::format("{:.3g} G", elements / 1e9); }

// MindSpeed docs/zh/features/reuse-fp32-param.md ("使用效果"): the fp32 main parameters share the
// bf16 parameters' storage plus a residual, which saves sizeof(bf16) × parameters, divided by
// DP with the distributed optimizer (mindspeed/core/memory/reuse_param/reuse_distrib_optimizer.py).
void ReuseFp32Param(const RankView& v, bool dist, NotModelledEstimate* e) {
  if (!v.d.mixed || v.d.param_bytes != 2) {
    e->basis = "no saving: the parameters are not 16-bit with fp32 main copies";
    return;
  }
  const int dp = dist ? v.d.dp_cp : 1;
  e->about_bytes = 2 * v.sizes.parameter_count / dp;
  e->basis = fmt::format("2 bytes x {} parameters of the rank{} (MindSpeed reuse-fp32-param.md)",
                         Gi(static_cast<double>(v.sizes.parameter_count)),
                         dist ? fmt::format(" / DP {}", dp) : std::string());
}

// MindSpeed docs/zh/features/activation-function-recompute.md: the activation function's output
// ([s, b, ffn/t], the input of fc2) is freed after fc2's forward and recomputed before fc2's
// backward; --recompute-activation-function-num-layers N limits it to N layers.
void ActivationRecompute(const RankView& v, int layers, NotModelledEstimate* e) {
  if (v.full_recompute) {
    e->basis = "no saving: full recompute keeps only each layer's input";
    return;
  }
  const int n = std::min(layers, v.dense_layers);
  e->about_bytes = static_cast<Bytes>(n) * v.in_flight * v.d.T * (v.d.ffn / v.d.t) * v.d.act_bytes;
  e->basis = fmt::format("{} layers x {} micro-batches in flight x [{} tokens, {}] x {} bytes "
                         "(the MLP activation's output)",
                         n, v.in_flight, v.d.T, v.d.ffn / v.d.t, v.d.act_bytes);
}

// MindSpeed docs/zh/features/norm-recompute.md: the norms' outputs (two [s, b, h] per layer, /t
// with sequence parallelism) are recomputed instead of saved.
void NormRecompute(const RankView& v, int layers, NotModelledEstimate* e) {
  if (v.full_recompute) {
    e->basis = "no saving: full recompute keeps only each layer's input";
    return;
  }
  const int n = std::min(layers, v.layers);
  e->about_bytes = static_cast<Bytes>(n) * v.in_flight * 2 * v.d.T * (v.d.h / v.d.sigma) * v.d.act_bytes;
  e->basis = fmt::format("{} layers x {} micro-batches in flight x 2 norm outputs of [{} tokens, "
                         "{}] x {} bytes",
                         n, v.in_flight, v.d.T, v.d.h / v.d.sigma, v.d.act_bytes);
}

// MindSpeed docs/zh/features/swap_attention.md: the attention block's saved activations go to
// host memory in forward and are prefetched back in backward; upper bound: all of them (the
// norm's input, the QKV input, Q, K, V and the attention output per layer).
void SwapAttention(const RankView& v, NotModelledEstimate* e) {
  if (v.full_recompute) {
    e->basis = "little: full recompute keeps only each layer's input";
    return;
  }
  const std::int64_t width = 2 * v.d.h / v.d.sigma + (2 * v.d.q + 2 * v.d.kv) / v.d.t;
  e->about_bytes = static_cast<Bytes>(v.layers) * v.in_flight * v.d.T * width * v.d.act_bytes;
  e->basis = fmt::format("up to {} layers x {} micro-batches in flight x [{} tokens, {}] x {} "
                         "bytes (the attention block's saved activations, less the layers "
                         "MindSpeed keeps prefetched)",
                         v.layers, v.in_flight, v.d.T, width, v.d.act_bytes);
}

// MindSpeed docs/zh/features/swap-optimizer.md: outside the step the fp32 main parameters and
// Adam moments of the shard live in host memory; the step brings 1/swap_optimizer_times of them
// at a time.
void SwapOptimizer(const RankView& v, NotModelledEstimate* e) {
  e->about_bytes = v.sizes.main_param_bytes + v.sizes.optimizer_state_bytes;
  e->basis = fmt::format("up to the fp32 main parameters and optimizer state of {} elements "
                         "(kept on host outside the step)",
                         Gi(static_cast<double>(v.sizes.main_param_count)));
}

void Estimate(const config::Setup& setup, const RankView& v, NotModelledEstimate* e) {
  const std::string& f = e->flag.flag;
  const bool dist = setup.training.use_distributed_optimizer;
  if (f == "--reuse-fp32-param") {
    ReuseFp32Param(v, dist, e);
  } else if (f == "--recompute-activation-function") {
    ActivationRecompute(v, v.layers, e);
  } else if (f == "--recompute-activation-function-num-layers") {
    ActivationRecompute(v, IntValue(e->flag, v.layers), e);
  } else if (f == "--recompute-norm") {
    NormRecompute(v, v.layers, e);
  } else if (f == "--recompute-norm-num-layers") {
    NormRecompute(v, IntValue(e->flag, v.layers), e);
  } else if (f == "--swap-attention") {
    SwapAttention(v, e);
  } else if (f == "--swap-optimizer") {
    SwapOptimizer(v, e);
  } else if (f == "--o2-gradient" && v.d.grad_bytes == 4) {
    e->about_bytes = v.sizes.gradient_bytes / 2;  // bf16 instead of fp32 gradient buffers
    e->basis = "half the fp32 gradient buffers";
  } else if (f == "--o2-optimizer") {
    e->about_bytes = v.sizes.optimizer_state_bytes / 2;  // bf16 instead of fp32 moments
    e->basis = "half the fp32 optimizer state";
  } else if (f == "--num-distributed-optimizer-instances" && dist) {
    const int n = IntValue(e->flag, 1);
    e->about_bytes = (n - 1) * (v.sizes.main_param_bytes + v.sizes.optimizer_state_bytes);
    e->basis = fmt::format("the optimizer shard is {} times larger", n);
  } else if (f == "--use-ema") {
    e->about_bytes = 4 * v.sizes.main_param_count;
    e->basis = "one fp32 average per optimizer element";
  }
  if (e->about_bytes <= 0) e->about_bytes = 0;
}

}  // namespace

std::vector<NotModelledEstimate> EstimateNotModelled(const config::Setup& setup,
                                                     int pipeline_rank) {
  std::vector<NotModelledEstimate> out;
  if (setup.not_modelled.empty()) return out;
  const RankView v = ViewOf(setup, pipeline_rank);
  for (const config::NotModelled& f : setup.not_modelled) {
    NotModelledEstimate e{f, 0, ""};
    Estimate(setup, v, &e);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace memsim::workload
