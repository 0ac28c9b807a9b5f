#include "workload/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <numeric>

#include "config/stack.h"
#include "core/check.h"
#include "workload/modules/decoder_layer.h"
#include "workload/modules/embedding.h"
#include "workload/modules/hf_encoder.h"
#include "workload/modules/output_loss.h"

namespace memsim::workload {

namespace {

// Layers per chunk, chunks (VPP) and micro-batches per iteration.
void SetScheduleDims(const config::ModelConfig& mc, const config::TrainingConfig& tc,
                     ModelDims* d) {
  MEMSIM_CHECK(d->L >= d->p && (d->L % d->p == 0 || config::UnevenPipeline(tc)));
  if (tc.num_layers_per_virtual_pipeline_stage > 0) {
    d->Lc = tc.num_layers_per_virtual_pipeline_stage;
    MEMSIM_CHECK(d->L % (d->p * d->Lc) == 0);
    d->v = d->L / (d->p * d->Lc);
  } else {
    d->v = 1;
    d->Lc = d->L / d->p;
  }
  if (config::UnevenPipeline(tc)) {
    MEMSIM_CHECK(d->v == 1);
    d->stage_layers = config::StageLayerCounts(mc, tc);
  }
  // m = global_batch / (b·d) (Megatron `get_num_microbatches`); 0 means one micro-batch.
  const std::int64_t per_step = std::int64_t{d->b} * d->d;
  d->m = tc.global_batch_size > 0
             ? static_cast<int>(std::max<std::int64_t>(1, tc.global_batch_size / per_step))
             : 1;
}

// The MoE shape and runtime (ModelDims, "Mixture of experts"). Expert data-parallel size:
// megatron/core/parallel_state.py initialize_model_parallel builds the expert grid
// etp × ep × edp over the t × d × cp ranks of a pipeline stage.
void SetMoeDims(const config::Setup& setup, ModelDims* d) {
  const config::ModelConfig& mc = setup.model;
  const config::TrainingConfig& tc = setup.training;
  if (mc.num_experts <= 1) return;
  d->experts = mc.num_experts;
  d->topk = mc.moe_router_topk;
  d->ffn_e = mc.moe_ffn_hidden_size > 0 ? mc.moe_ffn_hidden_size : mc.intermediate_size;
  d->ffn_shared = mc.moe_shared_expert_intermediate_size;
  d->shared_gate = mc.moe_shared_expert_gate;
  d->moe_layers = mc.moe_layer_pattern;
  d->ep = tc.expert_model_parallel_size;
  d->etp = tc.expert_tensor_parallel_size > 0 ? tc.expert_tensor_parallel_size : d->t;
  d->edp = std::max(1, d->t * d->dp_cp / (d->ep * d->etp));
  d->alltoall = tc.moe_token_dispatcher_type == "alltoall";
  d->capacity_factor = tc.moe_expert_capacity_factor;
  d->pad_to_capacity = tc.moe_pad_expert_input_to_capacity;
  d->grouped_gemm = tc.moe_grouped_gemm;
  d->permute_fusion = tc.moe_permute_fusion;
  d->aux_loss = tc.moe_aux_loss_coeff > 0.0;
  d->router_pre_softmax = tc.moe_router_pre_softmax;
  d->imbalance = tc.moe_imbalance_factor;
  MEMSIM_CHECK(d->experts % d->ep == 0 && d->ffn_e % d->etp == 0);
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
  d.V = config::PaddedVocabSize(mc, tc);
  d.max_positions = mc.max_position_embeddings > 0 ? mc.max_position_embeddings : tc.seq_length;
  d.L = mc.num_hidden_layers;
  SetScheduleDims(setup.model, tc, &d);
  d.sp = tc.sequence_parallel && d.t > 1;
  d.sigma = d.sp ? d.t : 1;
  // Element sizes are the stack's (its precision rules): config/stack.h SetElementSizes.
  config::StackOf(tc).SetElementSizes(tc, &d);
  d.layernorm = mc.normalization == config::Normalization::kLayerNorm;
  d.hidden_dropout = mc.hidden_dropout > 0.0;
  d.attention_dropout = mc.attention_dropout > 0.0;
  d.tied = mc.tie_word_embeddings;
  SetMoeDims(setup, &d);
  return d;
}

int ModelDims::FirstLayer(int chunk, int r) const {
  if (stage_layers.empty()) return chunk * p * Lc + r * Lc;
  int first = 0;
  for (int k = 0; k < r; ++k) first += stage_layers[static_cast<std::size_t>(k)];
  return first;
}

int ModelDims::IndexInChunk(int layer) const {
  if (stage_layers.empty()) return Lc > 0 ? layer % Lc : 0;
  for (int n : stage_layers) {
    if (layer < n) return layer;
    layer -= n;
  }
  return layer;
}

int ModelDims::ChunkLayersAt(int layer) const {
  if (stage_layers.empty()) return Lc;
  for (int n : stage_layers) {
    if (layer < n) return n;
    layer -= n;
  }
  return stage_layers.back();
}

ParamTensor MakeParam(std::string name, std::int64_t numel, std::int64_t row_numel, int chunk,
                      int layer, bool no_weight_decay, bool sequence_parallel) {
  ParamTensor pt;
  pt.name = std::move(name);
  pt.numel = numel;
  pt.row_numel = row_numel;
  pt.chunk = chunk;
  pt.layer = layer;
  pt.no_weight_decay = no_weight_decay;
  pt.sequence_parallel = sequence_parallel;
  return pt;
}

std::vector<ParamTensor> StageParams(const config::Setup& setup, int pipeline_rank) {
  return StageParams(setup, pipeline_rank, DecoderLayer::ForSetup(setup));
}

std::vector<ParamTensor> StageParams(const config::Setup& setup, int pipeline_rank,
                                     const DecoderLayer& layer) {
  const ModelDims d = ComputeDims(setup);
  MEMSIM_CHECK(pipeline_rank >= 0 && pipeline_rank < d.p);
  std::vector<ParamTensor> out;
  for (int c = 0; c < d.v; ++c) {
    const bool pre = pipeline_rank == 0 && c == 0;
    const bool post = pipeline_rank == d.p - 1 && c == d.v - 1;
    if (pre) Embedding::AppendParams(setup.model, d, c, &out);
    for (int i = 0; i < d.StageLayers(pipeline_rank); ++i) {
      layer.AppendParams(setup.model, d, c, d.FirstLayer(c, pipeline_rank) + i, &out);
    }
    if (post && setup.model.sequence_classification) {
      ClassificationHead::AppendParams(setup.model, d, c, &out);
    } else if (post) {
      OutputAndLoss::AppendParams(d, c, pre, &out);
    }
  }
  return out;
}

std::vector<GradBuffer> LayoutBuckets(const ModelDims& d, const std::vector<ParamTensor>& params,
                                      const BucketRules& rules) {
  std::vector<GradBuffer> out;
  for (int c = 0; c < d.v; ++c) {
    GradBuffer buf;
    buf.chunk = c;
    buf.expert = rules.expert;
    const std::int64_t bucket_size = c == 0 ? rules.first_chunk_bucket_size : 0;
    std::int64_t param_start = 0, bucket_start = 0, last_end = 0, bucket_lcm = 1;
    int bucket = 0;
    bool bucket_open = false;
    auto close_bucket = [&](std::int64_t end) {
      const std::int64_t padded =
          rules.pad_to_row_widths
              ? bucket_start + RoundUp(end - bucket_start, rules.end_align * bucket_lcm)
              : RoundUp(end, rules.end_align);
      buf.buckets.emplace_back(bucket_start, padded);
      bucket_start = padded;
      bucket_lcm = 1;
      ++bucket;
      bucket_open = false;
      return padded;
    };
    const int n = static_cast<int>(params.size());
    for (int k = 0; k < n; ++k) {
      const int i = rules.registration_order ? k : n - 1 - k;
      if (params[i].chunk != c || params[i].expert != rules.expert) continue;
      param_start = RoundUp(param_start, rules.start_align);
      const bool own_bucket = params[i].shared_embedding && rules.shared_embedding_own_bucket;
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
      const std::int64_t shard_end = bs + (be - bs) / buf.ShardRanks(dims);
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
