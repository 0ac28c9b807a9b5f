#include "workload/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <numeric>

#include "core/check.h"
#include "workload/modules/decoder_layer.h"
#include "workload/modules/embedding.h"
#include "workload/modules/hf_encoder.h"
#include "workload/modules/output_loss.h"

namespace memsim::workload {

// First releases with the cached dummy wgrad (see ComputeDims).
// Transformer Engine: estimate 2.3. `get_dummy_wgrad` came with TE PR #1651 ("Enable reuse of
// dummy wgrad tensor", opened 2025-04-07); 2.3 is the first release after it (2025-05-14), and
// TE PR #2097 (2025-08-21) already builds on it; not checked against the 2.3 tag.
const std::vector<int> kTeDummyWgradCacheSince = {2, 3};
// Megatron-core: 0.14. tensor_parallel/layers.py imports get_dummy_wgrad under HAVE_TE from
// core_v0.14.0 (and in current main); core_v0.13.0 and before make a fresh tensor (read for
// docs/validation.md, 'Fifth pass').
const std::vector<int> kMegatronDummyWgradCacheSince = {0, 14};
// megatron/core/tensor_parallel/cross_entropy.py: `vocab_parallel_logits -= logits_max` (in place)
// from commit 9634c0e4a3 (2024-06-13), whose first release tag is core_v0.8.0; before it
// `vocab_parallel_logits = vocab_parallel_logits - logits_max.unsqueeze(-1)`.
const std::vector<int> kCrossEntropyInPlaceSince = {0, 8};
// pretrain_gpt.py loss_func all-reduces the reporting loss over get_data_parallel_group() up to
// core_v0.12.0; core_v0.13.0's returns it and training.py reduces it over the DDP's group.
const std::vector<int> kLossReducedOverDpCpSince = {0, 13};
// utils.py calc_params_l2_norm takes a dense parameter's `main_param` (set by optimizer.py and
// distrib_optimizer.py) from core_v0.11.0; core_v0.10.0 copies every bf16 parameter.
const std::vector<int> kParamsNormUsesMainParamSince = {0, 11};
// megatron/core/transformer/moe: core_v0.12.0's MoEAlltoAllTokenDispatcher.token_unpermutation
// still passes probs=self.probs to moe_utils.py unpermute; core_v0.13.0's experts.py takes
// permuted_probs and applies them in the activation.
const std::vector<int> kMoeProbsInExpertsSince = {0, 13};
// moe_utils.py unpermute: core_v0.11.0 adds the drop_and_pad branch (index_select of the probs);
// core_v0.10.0 always takes masked_select.
const std::vector<int> kUnpermuteDropAndPadSince = {0, 11};
// moe_utils.py topk_routing_with_score_function: `torch.softmax(logits, dtype=float32)
// .type_as(logits)` before the top-k in core_v0.17.0; the top-k on the fp32 scores in
// core_v0.18.2 (PR #3673, 2026-04-14).
const std::vector<int> kPreSoftmaxTopkInFp32Since = {0, 18};
// megatron/core/{transformer/custom_layers,extensions}/transformer_engine.py
// TEDotProductAttention.forward: with apply_rope_fusion (Megatron-LM's default; arguments.py
// --no-rope-fusion, forced off without RoPE) and TE > 0.13 it switches qkv_format to 'bshd'
// and hands TE `x.transpose(0, 1).contiguous()` of q, k, v, then returns
// `core_attn_out.transpose(0, 1)`. Present in core_v0.5.0 to core_v0.13.1 (absent in
// core_v0.4.0); removed by commit 733b682b6b ("Clean RoPE fusion", 2025-07-31), first in
// core_v0.14.0.
const std::vector<int> kRopeFusionBshdSince = {0, 5};
const std::vector<int> kRopeFusionBshdUntil = {0, 14};
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

namespace {

// Element sizes per precision. Megatron: activations and parameters in the training dtype,
// gradient buffers in fp32 for bf16 (arguments.py forces accumulate_allreduce_grads_in_fp32
// unless --grad-reduce-in-bf16) and for fp16 with that flag, fp32 main parameters for 16-bit
// training (Megatron-core optimizer/__init__.py chooses Float16OptimizerWithFloat16Params or the
// distributed optimizer with fp32 main params). Plain PyTorch: parameters and their .grad in
// torch_dtype, activations in the autocast dtype (precision), no main parameters.
void SetElementSizes(const config::TrainingConfig& tc, ModelDims* d) {
  auto bytes = [](Precision p) -> Bytes { return p == Precision::kFp32 ? 4 : 2; };
  d->act_bytes = bytes(tc.precision);
  if (config::PyTorchLoop(tc)) {
    // precision fp32 = no autocast: everything runs in the weights' dtype.
    const bool autocast = tc.precision != Precision::kFp32;
    d->param_bytes = bytes(tc.torch_dtype);
    d->act_bytes = autocast ? bytes(tc.precision) : d->param_bytes;
    d->weight_cast = autocast && tc.precision != tc.torch_dtype;
    d->grad_bytes = d->param_bytes;
    d->mixed = false;
    return;
  }
  d->param_bytes = d->act_bytes;
  d->mixed = tc.precision != Precision::kFp32;
  const bool grads_16bit =
      (tc.precision == Precision::kFp16 && !tc.accumulate_allreduce_grads_in_fp32) ||
      (tc.precision == Precision::kBf16 && tc.grad_reduce_in_bf16);
  d->grad_bytes = grads_16bit ? 2 : 4;
}

// With gradient-accumulation fusion, the wgrad GEMM accumulates into main_grad and the layer
// hands autograd a dummy weight-sized tensor (Megatron-core DDP sets grad_added_to_main_grad).
// Transformer Engine's get_dummy_wgrad (transformer_engine/pytorch/module/base.py) keeps one
// such tensor per (shape, dtype) for the whole run; its linear modules use it from release
// kTeDummyWgradCacheSince on (before: a fresh torch.empty per backward), and Megatron's
// tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication uses it when
// Transformer Engine is importable from Megatron-core kMegatronDummyWgradCacheSince on. Versions
// not stated are taken as current releases; torch_npu has no Transformer Engine.
void SetWeightGradRules(const config::TrainingConfig& tc, ModelDims* d) {
  d->grad_accum_fusion = tc.gradient_accumulation_fusion;
  const bool have_te = !d->npu && (d->te || !tc.transformer_engine_version.empty());
  auto at_least = [](const std::vector<int>& version, const std::vector<int>& since) {
    return version.empty() || version >= since;
  };
  d->te_dummy_wgrad_cache = have_te && d->grad_accum_fusion &&
                            at_least(tc.transformer_engine_version, kTeDummyWgradCacheSince);
  d->megatron_dummy_wgrad_cache =
      have_te && d->grad_accum_fusion &&
      at_least(tc.transformer_engine_version, kTeDummyWgradCacheSince) &&
      at_least(tc.megatron_core_version, kMegatronDummyWgradCacheSince);
  d->ce_max_out_of_place = !d->npu && tc.framework == "megatron" &&
                           !at_least(tc.megatron_core_version, kCrossEntropyInPlaceSince);
  d->loss_dp_all_reduce =
      tc.framework == "megatron" && d->d > 1 &&
      (d->npu || !at_least(tc.megatron_core_version, kLossReducedOverDpCpSince));
  using Copies = ModelDims::ParamsNormCopies;
  d->params_norm_copies =
      !tc.log_params_norm || tc.precision != config::Precision::kBf16 ? Copies::kNone
      : at_least(tc.megatron_core_version, kParamsNormUsesMainParamSince) ? Copies::kExperts
                                                                          : Copies::kAll;
}

// Layers per chunk, chunks (VPP) and micro-batches per iteration.
void SetScheduleDims(const config::TrainingConfig& tc, ModelDims* d) {
  MEMSIM_CHECK(d->L >= d->p && d->L % d->p == 0);
  if (tc.num_layers_per_virtual_pipeline_stage > 0) {
    d->Lc = tc.num_layers_per_virtual_pipeline_stage;
    MEMSIM_CHECK(d->L % (d->p * d->Lc) == 0);
    d->v = d->L / (d->p * d->Lc);
  } else {
    d->v = 1;
    d->Lc = d->L / d->p;
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
  d->moe_probs_at_unpermute = d->alltoall && !d->permute_fusion &&
                              !tc.megatron_core_version.empty() &&
                              tc.megatron_core_version < kMoeProbsInExpertsSince;
  d->unpermute_masked_select =
      d->moe_probs_at_unpermute &&
      (tc.megatron_core_version < kUnpermuteDropAndPadSince || !d->pad_to_capacity);
  d->router_pre_softmax = tc.moe_router_pre_softmax;
  d->pre_softmax_cast_all = d->router_pre_softmax && !tc.megatron_core_version.empty() &&
                            tc.megatron_core_version < kPreSoftmaxTopkInFp32Since;
  d->imbalance = tc.moe_imbalance_factor;
  MEMSIM_CHECK(d->experts % d->ep == 0 && d->ffn_e % d->etp == 0);
}

// ModelDims::te_fused_attn_bshd_out: TE's cuDNN FusedAttention (TE picks it from sm 90 on) under
// the bshd switch of Megatron-core 0.5-0.13 (kRopeFusionBshdSince). Versions not stated are
// taken as current releases, which no longer switch. Below sm 90 the switch leaves the count of
// saved outputs as te_flash_attn2 has it (flash-attn's own output, the projection's copy).
void SetFusedAttnBshdRule(const config::Setup& setup, ModelDims* d) {
  const config::TrainingConfig& tc = setup.training;
  const std::vector<int>& core = tc.megatron_core_version;
  d->te_fused_attn_bshd_out =
      d->te && d->flash && !d->npu && d->hopper && !d->hf && d->cp == 1 &&
      tc.framework == "megatron" &&
      setup.model.position_embedding_type == config::PositionEmbedding::kRope && !core.empty() &&
      core >= kRopeFusionBshdSince && core < kRopeFusionBshdUntil;
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
  SetScheduleDims(tc, &d);
  d.sp = tc.sequence_parallel && d.t > 1;
  d.sigma = d.sp ? d.t : 1;
  SetElementSizes(tc, &d);
  d.layernorm = mc.normalization == config::Normalization::kLayerNorm;
  d.hf = tc.framework == "hf-trainer";
  d.wide_bytes = d.act_bytes;
  if (d.hf && d.weight_cast) {  // Transformers under autocast over wider weights
    d.wide_bytes = d.param_bytes;
    d.cast_inputs = true;
  }
  d.softmax_saves_input = d.hf && tc.softmax_saves_input;
  d.flash = tc.use_flash_attn;
  d.te = tc.transformer_impl == "transformer_engine";
  d.npu = setup.device.allocator_backend == alloc::Backend::kNpu;
  // sm >= 90 decides the TE and cuBLAS workspace sizes (kernels.h). The preset carries no
  // compute capability, so this is an estimate: the device name, or bf16 peak above 400 TFLOP/s
  // (A100: 312, H100: 989).
  d.hopper = !d.npu && (NameSuggestsHopperOrLater(setup.device.name) ||
                        setup.device.peak_flops_bf16 > 400e12);
  d.te_flash_attn2 = d.te && d.flash && !d.npu && !d.hopper && !d.hf && d.cp == 1;
  SetFusedAttnBshdRule(setup, &d);
  d.hidden_dropout = mc.hidden_dropout > 0.0;
  d.attention_dropout = mc.attention_dropout > 0.0;
  d.tied = mc.tie_word_embeddings;
  // MindSpeed-LLM replaces get_batch on Ascend (not audited): no mask there.
  d.dataloader_attention_mask =
      tc.framework == "megatron" && !d.npu && tc.create_attention_mask_in_dataloader;
  const auto& mods = tc.recompute_modules;
  d.attention_mask_to_backward =
      tc.recompute_granularity == config::RecomputeGranularity::kFull ||
      (tc.recompute_granularity == config::RecomputeGranularity::kSelective &&
       std::find(mods.begin(), mods.end(), "core_attn") != mods.end());
  SetWeightGradRules(tc, &d);
  SetMoeDims(setup, &d);
  return d;
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
    for (int i = 0; i < d.Lc; ++i) {
      layer.AppendParams(setup.model, d, c, c * d.p * d.Lc + pipeline_rank * d.Lc + i, &out);
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
