// Estimates of what not-modelled flags change (not_modelled.h).
#include "workload/not_modelled.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/core.h>

#include "workload/build.h"
#include "workload/facts.h"
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
  bool npu = false;      // torch_npu's fused attention (FrameworkFacts::npu)
};

RankView ViewOf(const config::Setup& setup, int r) {
  RankView v{ComputeDims(setup), ComputeStaticSizes(setup, r)};
  v.layers = v.d.v * v.d.StageLayers(r);
  v.in_flight = std::max(1, std::min(v.d.p - r, v.d.m));
  v.full_recompute = setup.training.recompute_granularity == RecomputeGranularity::kFull;
  v.npu = ComputeFacts(setup, v.d).npu;
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

// MindSpeed --swap-attention at 028de58 (mindspeed/core/memory/swap_attention/): with the default
// --swap-modules only the `self_attention` module matches a Megatron-core layer's names, so what
// the ops inside it save goes through SwapPrefetch.pack_hook (prefetch.py): the input norm's
// output saved by linear_qkv [T, h/σ], q, k and v saved by the fused attention, its output
// (saved again by linear_proj: one storage, one copy) and its two softmax statistics; a tensor
// under 512 KiB (no_swap_tensor: numel·itemsize·2 < 1 MiB), a view or a leaf stays. Each is
// copied to pinned host memory, freed on the device in the layer's forward hook (sync_d2h) and
// brought back in its backward hook (h2d), so one layer's set at a time is on the device. The
// layers: all of a stage (solve_prefetch_policy), or --recompute-num-layers with
// --recompute-method block. memsim keeps all of them: it errs high by every layer's set of
// every micro-batch in flight but one.
void SwapAttention(const config::Setup& setup, const RankView& v, NotModelledEstimate* e) {
  if (v.full_recompute) {
    e->basis = "little: full recompute keeps only each layer's input";
    return;
  }
  const ModelDims& d = v.d;
  const Bytes stat = (v.npu ? 32 : 4) * d.T * (d.a / d.t);
  Bytes per_layer = 0;
  for (const Bytes b : {d.T * (d.h / d.sigma) * d.act_bytes, d.T * (d.q / d.t) * d.act_bytes,
                        d.T * (d.kv / d.t) * d.act_bytes, d.T * (d.kv / d.t) * d.act_bytes,
                        d.T * (d.q / d.t) * d.act_bytes, stat, v.npu ? stat : 0}) {
    if (b >= 512 * 1024) per_layer += b;
  }
  int layers = v.layers;
  if (setup.training.recompute_method == config::RecomputeMethod::kBlock &&
      setup.training.recompute_num_layers > 0) {
    layers = std::min(layers, setup.training.recompute_num_layers);
  }
  const std::int64_t sets = static_cast<std::int64_t>(layers) * v.in_flight;
  e->about_bytes = (sets - 1) * per_layer;
  e->basis = fmt::format("{} layers x {} micro-batches in flight, less the one layer prefetched, "
                         "x {} bytes a layer (the norm output, q, k, v, the attention output and "
                         "its softmax statistics of 512 KiB or more) go to pinned host memory",
                         layers, v.in_flight, per_layer);
}

// The MoE layers on pipeline rank r: chunk c's layer j is global layer FirstLayer(c, r) + j
// (Megatron-core get_transformer_layer_offset).
int MoeLayersOnRank(const ModelDims& d, int r) {
  int n = 0;
  for (int c = 0; c < d.v; ++c) {
    for (int j = 0; j < d.StageLayers(r); ++j) n += d.IsMoeLayer(d.FirstLayer(c, r) + j) ? 1 : 0;
  }
  return n;
}

// MindSpeed docs/zh/features/megatron_moe/megatron-moe-zero-memory.md: level0 saves 70%+ and
// level1 90%+ of what recomputing the MoE MLP (shared experts included) saves; level1 on the
// first --moe-zero-memory-num-layers layers of a stage, level0's activation recompute on the
// rest (moe_common.py only_recompute_activation). What recomputing the MoE MLP saves, with
// balanced dropless routing (R = k·(T/σ)·etp routed tokens a rank's experts take): the experts'
// fc1 input [R, h], fc1 output [R, γ·f/etp], activation output [R, f/etp] and fc2 output
// [R, h]; the shared experts' input [T, h], fc1 output [T, γ·fs/t] and activation output
// [T, fs/t].
void MoeZeroMemory(const config::Setup& setup, const RankView& v, int r,
                   NotModelledEstimate* e) {
  const ModelDims& d = v.d;
  const int layers = MoeLayersOnRank(d, r);
  const bool disabled = !e->flag.values.empty() && e->flag.values[0] == "disable";
  if (v.full_recompute || layers == 0 || disabled) {
    e->basis = "no saving: disabled, no MoE layer here, or full recompute keeps only each "
               "layer's input";
    return;
  }
  const std::int64_t routed = static_cast<std::int64_t>(d.topk) * (d.T / d.sigma) * d.etp;
  const std::int64_t experts = routed * (2 * d.h + (d.gamma + 1) * d.ffn_e / d.etp);
  const std::int64_t shared =
      d.ffn_shared > 0 ? d.T * (d.h + (d.gamma + 1) * d.ffn_shared / d.t) : 0;
  const Bytes per_layer = (experts + shared) * d.act_bytes * v.in_flight;
  const bool level1 = !e->flag.values.empty() && e->flag.values[0] == "level1";
  int l1 = 0;
  for (const config::NotModelled& f : setup.not_modelled) {
    if (f.flag == "--moe-zero-memory-num-layers") l1 = IntValue(f, layers);
  }
  if (level1 && l1 == 0) l1 = layers;
  l1 = std::min(l1, layers);
  if (!level1) l1 = 0;
  e->about_bytes = (9 * l1 + 7 * (layers - l1)) * per_layer / 10;
  e->basis = fmt::format("0.9 x {} level1 + 0.7 x {} level0 MoE layers x {} micro-batches in "
                         "flight x the MoE MLP's saved activations, {} bytes a layer "
                         "(MindSpeed's megatron-moe-zero-memory.md: 90%+ / 70%+ of recomputing "
                         "the MLP)",
                         l1, layers - l1, v.in_flight, per_layer / v.in_flight);
}

// MindSpeed docs/zh/features/recompute_independent_pipelining.md: --recompute-in-bubble leaves
// p·v forward chunks holding activations; Megatron's interleaved 1F1B holds min(m·v, warmup + 1)
// on rank r, warmup = 2·(p - r - 1) + (v - 1)·p (megatron/core/pipeline_parallel/schedules.py,
// forward_backward_pipelining_with_interleaving). A chunk: Lc layers of the closed-form
// per-layer activations (closed_form.cc).
void RecomputeInBubble(const config::Setup& setup, const RankView& v, int r,
                       NotModelledEstimate* e) {
  const ModelDims& d = v.d;
  const int held = std::min(d.m * d.v, 2 * (d.p - r - 1) + (d.v - 1) * d.p + 1);
  const int fewer = held - d.p * d.v;
  if (d.v <= 1 || v.full_recompute || fewer <= 0) {
    e->basis = "no saving on this rank (MindSpeed runs it only with interleaving, no recompute)";
    return;
  }
  const Bytes layer = ComputeClosedFormEstimate(setup, r).activation_bytes_per_layer;
  e->about_bytes = static_cast<Bytes>(fewer) * d.Lc * layer;
  e->basis = fmt::format("{} of {} model chunks in flight recomputed in the bubble x {} layers x "
                         "{} bytes a layer (Korthikanti et al. per-layer activations)",
                         fewer, held, d.Lc, layer);
}

// MindSpeed docs/zh/features/recompute_independent_pipelining.md: --recompute-in-advance runs a
// chunk's recompute before its gradient arrives (its activations alive that much longer) and
// drops the recompute of the model's last layer (it saves its activations): either way by about
// one chunk's activations without recompute.
void RecomputeInAdvance(const config::Setup& setup, const RankView& v, int r,
                        NotModelledEstimate* e) {
  config::Setup plain = setup;
  plain.training.recompute_granularity = RecomputeGranularity::kNone;
  const Bytes layer = ComputeClosedFormEstimate(plain, r).activation_bytes_per_layer;
  e->about_bytes = static_cast<Bytes>(v.d.StageLayers(r)) * layer;
  e->basis = fmt::format("one model chunk recomputed early: {} layers x {} bytes a layer without "
                         "recompute (Korthikanti et al.)",
                         v.d.StageLayers(r), layer);
}

void Estimate(const config::Setup& setup, const RankView& v, int r, NotModelledEstimate* e) {
  const std::string& f = e->flag.flag;
  const bool dist = setup.training.use_distributed_optimizer;
  if (f == "--recompute-norm") {
    NormRecompute(v, v.layers, e);
  } else if (f == "--recompute-norm-num-layers") {
    NormRecompute(v, IntValue(e->flag, v.layers), e);
  } else if (f == "--swap-attention") {
    SwapAttention(setup, v, e);
  } else if (f == "--moe-zero-memory") {
    MoeZeroMemory(setup, v, r, e);
  } else if (f == "--recompute-in-bubble") {
    RecomputeInBubble(setup, v, r, e);
  } else if (f == "--recompute-in-advance") {
    RecomputeInAdvance(setup, v, r, e);
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
    Estimate(setup, v, pipeline_rank, &e);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace memsim::workload
