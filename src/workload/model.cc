#include "workload/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <numeric>

#include "core/check.h"

namespace memsim::workload {

// First releases with the cached dummy wgrad (see ComputeDims).
// Transformer Engine: estimate 2.3. `get_dummy_wgrad` came with TE PR #1651 ("Enable reuse of
// dummy wgrad tensor", opened 2025-04-07); 2.3 is the first release after it (2025-05-14), and
// TE PR #2097 (2025-08-21) already builds on it; not checked against the 2.3 tag.
const std::vector<int> kTeDummyWgradCacheSince = {2, 3};
// Megatron-core: estimate 0.14. tensor_parallel/layers.py imports get_dummy_wgrad under HAVE_TE
// in 0.14.0rc6 and in current main, not in 0.12.x; 0.13 not checked.
const std::vector<int> kMegatronDummyWgradCacheSince = {0, 14};
namespace {

using config::Precision;

bool NameSuggestsHopperOrLater(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* tag : {"h100", "h200", "h800", "h20", "gh200", "b100", "b200", "gb200"}) {
    if (name.find(tag) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

ModelDims ComputeDims(const config::Setup& setup) {
  const config::ModelConfig& mc = setup.model;
  const config::TrainingConfig& tc = setup.training;
  ModelDims d;
  d.t = tc.tensor_model_parallel_size;
  d.p = tc.pipeline_model_parallel_size;
  d.d = tc.data_parallel_size;
  d.cp = tc.context_parallel_size;
  MEMSIM_CHECK(d.t >= 1 && d.p >= 1 && d.d >= 1 && d.cp >= 1);
  d.dp_cp = d.d * d.cp;
  d.s = tc.seq_length / d.cp;
  d.b = tc.micro_batch_size;
  d.T = d.s * d.b;
  d.h = mc.hidden_size;
  d.a = mc.num_attention_heads;
  d.g = mc.num_key_value_heads > 0 ? mc.num_key_value_heads : mc.num_attention_heads;
  d.dh = mc.head_dim > 0 ? mc.head_dim : (d.a > 0 ? d.h / d.a : 0);
  d.q = d.a * d.dh;
  d.kv = d.g * d.dh;
  d.ffn = mc.intermediate_size;
  d.gamma = mc.gated_mlp ? 2 : 1;
  MEMSIM_CHECK(d.s > 0 && d.b > 0 && d.h > 0 && d.a > 0 && d.ffn > 0);
  MEMSIM_CHECK(d.a % d.t == 0 && d.g % d.t == 0 && d.ffn % d.t == 0);
  const std::int64_t div = std::max(1, mc.make_vocab_size_divisible_by) * std::int64_t{d.t};
  d.V = CeilDiv(mc.vocab_size, div) * div;
  d.max_positions = mc.max_position_embeddings > 0 ? mc.max_position_embeddings : tc.seq_length;
  d.L = mc.num_hidden_layers;
  MEMSIM_CHECK(d.L >= d.p && d.L % d.p == 0);
  if (tc.num_layers_per_virtual_pipeline_stage > 0) {
    d.Lc = tc.num_layers_per_virtual_pipeline_stage;
    MEMSIM_CHECK(d.L % (d.p * d.Lc) == 0);
    d.v = d.L / (d.p * d.Lc);
  } else {
    d.v = 1;
    d.Lc = d.L / d.p;
  }
  // m = global_batch / (b·d) (Megatron `get_num_microbatches`); 0 means one micro-batch.
  const std::int64_t per_step = std::int64_t{d.b} * d.d;
  d.m = tc.global_batch_size > 0
            ? static_cast<int>(std::max<std::int64_t>(1, tc.global_batch_size / per_step))
            : 1;
  d.sp = tc.sequence_parallel && d.t > 1;
  d.sigma = d.sp ? d.t : 1;
  // §1.2 table: dtype per precision mode.
  switch (tc.precision) {
    case Precision::kFp32:
      d.act_bytes = 4;
      d.param_bytes = 4;
      d.grad_bytes = 4;
      d.mixed = false;
      break;
    case Precision::kFp16:
      d.act_bytes = 2;
      d.param_bytes = 2;
      d.mixed = true;
      d.grad_bytes = tc.accumulate_allreduce_grads_in_fp32 ? 4 : 2;
      break;
    case Precision::kBf16:
      // Megatron arguments.py forces accumulate_allreduce_grads_in_fp32 for bf16.
      d.act_bytes = 2;
      d.param_bytes = 2;
      d.grad_bytes = 4;
      d.mixed = true;
      break;
  }
  d.layernorm = mc.normalization == config::Normalization::kLayerNorm;
  d.flash = tc.use_flash_attn;
  d.te = tc.transformer_impl == "transformer_engine";
  d.npu = setup.device.allocator_backend == alloc::Backend::kNpu;
  // sm >= 90 decides the TE and cuBLAS workspace sizes (§1.7). The preset carries no compute
  // capability, so this is an estimate: the device name, or bf16 peak above 400 TFLOP/s (A100:
  // 312, H100: 989).
  d.hopper = !d.npu && (NameSuggestsHopperOrLater(setup.device.name) ||
                        setup.device.peak_flops_bf16 > 400e12);
  d.hidden_dropout = mc.hidden_dropout > 0.0;
  d.attention_dropout = mc.attention_dropout > 0.0;
  d.tied = mc.tie_word_embeddings;
  // With gradient-accumulation fusion, the wgrad GEMM accumulates into main_grad and the layer
  // hands autograd a dummy weight-sized tensor (Megatron-core DDP sets grad_added_to_main_grad).
  // Transformer Engine's get_dummy_wgrad (transformer_engine/pytorch/module/base.py) keeps one
  // such tensor per (shape, dtype) for the whole run; its linear modules use it from release
  // kTeDummyWgradCacheSince on (before: a fresh torch.empty per backward), and Megatron's
  // tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication uses it when
  // Transformer Engine is importable from Megatron-core kMegatronDummyWgradCacheSince on. Versions
  // not stated are taken as current releases; torch_npu has no Transformer Engine.
  d.grad_accum_fusion = tc.gradient_accumulation_fusion;
  const bool have_te = !d.npu && (d.te || !tc.transformer_engine_version.empty());
  auto at_least = [](const std::vector<int>& version, const std::vector<int>& since) {
    return version.empty() || version >= since;
  };
  d.te_dummy_wgrad_cache = have_te && d.grad_accum_fusion &&
                           at_least(tc.transformer_engine_version, kTeDummyWgradCacheSince);
  d.megatron_dummy_wgrad_cache = have_te && d.grad_accum_fusion &&
                                 at_least(tc.transformer_engine_version, kTeDummyWgradCacheSince) &&
                                 at_least(tc.megatron_core_version, kMegatronDummyWgradCacheSince);
  d.fsdp = tc.use_megatron_fsdp;
  // With one data-parallel rank Megatron-FSDP shards nothing: the grad buckets are views of the
  // persistent buffer (no temporaries).
  d.fsdp_shard_grads =
      d.fsdp && tc.fsdp_sharding == config::FsdpSharding::kOptimGrads && d.dp_cp > 1;
  return d;
}

std::vector<ParamTensor> StageParams(const config::Setup& setup, int pipeline_rank) {
  const ModelDims d = ComputeDims(setup);
  const config::ModelConfig& mc = setup.model;
  MEMSIM_CHECK(pipeline_rank >= 0 && pipeline_rank < d.p);
  std::vector<ParamTensor> out;
  // row_numel: shape[1:] elements (the input width of a [out, in] weight, 1 for 1-D tensors).
  auto add = [&](int chunk, int layer, std::string name, std::int64_t numel, bool one_dim,
                 bool sp_replicated, std::int64_t row_numel = 1) {
    ParamTensor pt;
    pt.name = std::move(name);
    pt.numel = numel;
    pt.row_numel = row_numel;
    pt.chunk = chunk;
    pt.layer = layer;
    pt.no_weight_decay = one_dim;
    pt.sequence_parallel = sp_replicated;
    out.push_back(std::move(pt));
  };
  const bool bias = mc.add_bias_linear;
  const bool qkv_bias = mc.add_bias_linear || mc.add_qkv_bias;
  for (int c = 0; c < d.v; ++c) {
    const bool pre = pipeline_rank == 0 && c == 0;
    const bool post = pipeline_rank == d.p - 1 && c == d.v - 1;
    if (pre) {
      add(c, -1, "embedding.word_embeddings.weight", d.V / d.t * d.h, false, false, d.h);
      out.back().shared_embedding = d.tied && d.p > 1;
      if (mc.position_embedding_type == config::PositionEmbedding::kLearnedAbsolute) {
        add(c, -1, "embedding.position_embeddings.weight", d.max_positions * d.h, false, false,
            d.h);
      }
    }
    for (int i = 0; i < d.Lc; ++i) {
      const int l = c * d.p * d.Lc + pipeline_rank * d.Lc + i;
      auto name = [l](const char* n) { return fmt::format("layer{}.{}", l, n); };
      // TE LayerNormColumnParallelLinear registers the norm weights before the GEMM weight.
      add(c, l, name("ln1.weight"), d.h, true, true);
      if (d.layernorm) add(c, l, name("ln1.bias"), d.h, true, true);
      add(c, l, name("attn.qkv.weight"), (d.q + 2 * d.kv) / d.t * d.h, false, false, d.h);
      if (qkv_bias) add(c, l, name("attn.qkv.bias"), (d.q + 2 * d.kv) / d.t, true, false);
      if (mc.qk_layernorm) {
        add(c, l, name("attn.q_norm.weight"), d.dh, true, true);
        if (d.layernorm) add(c, l, name("attn.q_norm.bias"), d.dh, true, true);
        add(c, l, name("attn.k_norm.weight"), d.dh, true, true);
        if (d.layernorm) add(c, l, name("attn.k_norm.bias"), d.dh, true, true);
      }
      add(c, l, name("attn.proj.weight"), d.h * (d.q / d.t), false, false, d.q / d.t);
      if (bias) add(c, l, name("attn.proj.bias"), d.h, true, true);
      add(c, l, name("ln2.weight"), d.h, true, true);
      if (d.layernorm) add(c, l, name("ln2.bias"), d.h, true, true);
      add(c, l, name("mlp.fc1.weight"), d.gamma * d.ffn / d.t * d.h, false, false, d.h);
      if (bias) add(c, l, name("mlp.fc1.bias"), d.gamma * d.ffn / d.t, true, false);
      add(c, l, name("mlp.fc2.weight"), d.h * (d.ffn / d.t), false, false, d.ffn / d.t);
      if (bias) add(c, l, name("mlp.fc2.bias"), d.h, true, true);
    }
    if (post) {
      add(c, -1, "final_norm.weight", d.h, true, true);
      if (d.layernorm) add(c, -1, "final_norm.bias", d.h, true, true);
      // Tied with p = 1: the output layer reuses the embedding (no tensor). Tied with p > 1:
      // the last stage owns its own copy (gpt_model.py, skip_weight_param_allocation).
      if (!d.tied || !pre) {
        add(c, -1, "output_layer.weight", d.V / d.t * d.h, false, false, d.h);
        out.back().shared_embedding = d.tied && d.p > 1;
      }
    }
  }
  return out;
}

std::vector<GradBuffer> LayoutGradBuffers(const config::Setup& setup, int pipeline_rank,
                                          const std::vector<ParamTensor>& params) {
  const ModelDims d = ComputeDims(setup);
  const bool dist = setup.training.use_distributed_optimizer;
  // Megatron-FSDP pads buckets only when it shards something (dist is then true as well).
  const bool fsdp_pad = d.fsdp && dist;
  const std::int64_t end_pad = std::lcm(std::int64_t{d.dp_cp}, std::int64_t{128});
  std::vector<GradBuffer> out;
  for (int c = 0; c < d.v; ++c) {
    GradBuffer buf;
    buf.chunk = c;
    std::int64_t bucket_size = 0;  // 0 = one bucket
    if (setup.training.overlap_grad_reduce && pipeline_rank == 0 && c == 0) {
      bucket_size = std::max<std::int64_t>(40'000'000, std::int64_t{1'000'000} * d.dp_cp);
    }
    std::int64_t param_start = 0, bucket_start = 0, last_end = 0, bucket_lcm = 1;
    auto pad_start = [&](std::int64_t i) { return dist && !d.fsdp ? RoundUp(i, 64) : i; };
    auto pad_end = [&](std::int64_t i) {
      if (fsdp_pad) return bucket_start + RoundUp(i - bucket_start, d.dp_cp * bucket_lcm);
      return dist ? RoundUp(i, end_pad) : i;
    };
    int bucket = 0;
    bool bucket_open = false;
    auto close_bucket = [&](std::int64_t end) {
      const std::int64_t padded = pad_end(end);
      buf.buckets.emplace_back(bucket_start, padded);
      bucket_start = padded;
      bucket_lcm = 1;
      ++bucket;
      bucket_open = false;
      return padded;
    };
    // DDP walks the parameters in reverse (≈ backward order); Megatron-FSDP's
    // `_get_parameter_groups` in named_parameters() order.
    const int n = static_cast<int>(params.size());
    for (int k = 0; k < n; ++k) {
      const int i = d.fsdp ? k : n - 1 - k;
      if (params[i].chunk != c) continue;
      param_start = pad_start(param_start);
      // `_does_param_require_new_bucket`: the shared embedding gets its own bucket, only with
      // the distributed optimizer.
      const bool own_bucket = params[i].shared_embedding && dist;
      if (own_bucket && bucket_open) param_start = close_bucket(param_start);
      const std::int64_t param_end = param_start + params[i].numel;
      buf.entries.push_back({i, param_start, param_end, bucket});
      bucket_lcm = std::lcm(bucket_lcm, params[i].row_numel);
      bucket_open = true;
      last_end = param_end;
      if ((bucket_size > 0 && param_end - bucket_start >= bucket_size) || own_bucket) {
        param_start = close_bucket(param_end);
      } else {
        param_start = param_end;
      }
    }
    if (bucket_open) close_bucket(last_end);
    buf.numel_padded = buf.buckets.empty() ? 0 : buf.buckets.back().second;
    out.push_back(std::move(buf));
  }
  return out;
}

std::vector<std::vector<int>> ParamGroups(const std::vector<ParamTensor>& params) {
  std::vector<std::vector<int>> groups;
  int wd_group = -1, no_wd_group = -1;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    int& slot = params[i].no_weight_decay ? no_wd_group : wd_group;
    if (slot < 0) {
      slot = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[slot].push_back(i);
  }
  return groups;
}

std::vector<ShardSlice> ShardSlices(const ModelDims& dims, const std::vector<ParamTensor>& params,
                                    const std::vector<GradBuffer>& buffers) {
  // DP rank 0 owns [bucket_start, bucket_start + size/d) of every bucket.
  std::vector<std::int64_t> owned(params.size(), 0);
  for (const GradBuffer& buf : buffers) {
    for (const GradBuffer::Entry& e : buf.entries) {
      const auto [bs, be] = buf.buckets[e.bucket];
      const std::int64_t shard_end = bs + (be - bs) / dims.dp_cp;
      const std::int64_t lo = std::max(e.start, bs), hi = std::min(e.end, shard_end);
      if (hi > lo) owned[e.param] = hi - lo;
    }
  }
  std::vector<ShardSlice> out;
  for (const std::vector<int>& group : ParamGroups(params)) {
    for (int i : group) {
      if (owned[i] > 0) out.push_back({i, owned[i]});
    }
  }
  return out;
}

}  // namespace memsim::workload
