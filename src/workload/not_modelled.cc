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
  int layers = 0;        // transformer layers on the rank, all chunks
  int in_flight = 1;     // micro-batches whose activations a 1F1B stage holds: min(p - r, m)
  bool full_recompute = false;
};

RankView ViewOf(const config::Setup& setup, int r) {
  RankView v{ComputeDims(setup), ComputeStaticSizes(setup, r)};
  v.layers = v.d.v * v.d.Lc;
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

void Estimate(const config::Setup& setup, const RankView& v, NotModelledEstimate* e) {
  const std::string& f = e->flag.flag;
  const bool dist = setup.training.use_distributed_optimizer;
  if (f == "--recompute-norm") {
    NormRecompute(v, v.layers, e);
  } else if (f == "--recompute-norm-num-layers") {
    NormRecompute(v, IntValue(e->flag, v.layers), e);
  } else if (f == "--swap-attention") {
    SwapAttention(v, e);
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
