// The "megatron" stack (config/stack.h): Megatron-core under Megatron-LM's train_step
// (megatron/training/training.py), with Megatron-core DDP (optionally the distributed optimizer)
// or Megatron-FSDP. Reads the Megatron-named training block (config/training.h), derives what
// Megatron's argument validation changes, and states the release rules of Megatron-core's code
// that change what is allocated (each constant with the release and the code that changed).
#include <fmt/core.h>

#include "config/origin.h"
#include "config/reader.h"
#include "config/training.h"
#include "stacks/stacks.h"
#include "workload/data_parallel.h"
#include "workload/facts.h"
#include "workload/model.h"
#include "workload/training_loop.h"

namespace memsim::stacks {
namespace {

using config::Precision;
using workload::AtLeast;

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
// moe_layer.py MoELayer.forward: core_v0.12.0's custom_forward calls token_permutation and
// token_unpermutation; core_v0.13.0 splits it into router_and_preprocess, dispatch,
// experts_compute and combine(output, shared_expert_output), where combine runs token_combine,
// combine_postprocess and the shared add; core_v0.16.0's combine(output) runs only token_combine
// and postprocess(output, shared_expert_output) the rest (core_v0.15.0 still has the 0.13 form).
const std::vector<int> kMoeSplitForwardSince = {0, 13};
// moe_layer.py custom_forward: `output += self.shared_experts(hidden_states)` in core_v0.10.0 and
// core_v0.11.0; `output = output + self.shared_experts(hidden_states)` from commit 0d389f5e99,
// first in core_v0.12.0.
const std::vector<int> kMoeSharedAddOutOfPlaceSince = {0, 12};
const std::vector<int> kMoePostprocessSince = {0, 16};
// moe_utils.py permute with probs (core_v0.13.0 to core_v0.16.0): masked_select of the
// transposed probs; core_v0.17.0 indexes the flattened probs by flat_sorted (commit
// e19fbe2e1d, #3373).
const std::vector<int> kPermuteProbsIndexedSince = {0, 17};
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

// The MoE layer's release rules (workload/facts.h); a dense model has none.
void SetMoeFacts(const config::TrainingConfig& tc, const workload::ModelDims& d,
                 workload::FrameworkFacts* f) {
  if (d.experts <= 1) return;
  const std::vector<int>& core = tc.megatron_core_version;
  f->moe_probs_at_unpermute =
      d.alltoall && !d.permute_fusion && !core.empty() && core < kMoeProbsInExpertsSince;
  f->unpermute_masked_select = f->moe_probs_at_unpermute &&
                               (core < kUnpermuteDropAndPadSince || !d.pad_to_capacity);
  f->pre_softmax_cast_all =
      d.router_pre_softmax && !core.empty() && core < kPreSoftmaxTopkInFp32Since;
  f->permute_masked_select = d.alltoall && !d.permute_fusion && !d.pad_to_capacity &&
                             !core.empty() && core >= kMoeSplitForwardSince &&
                             core < kPermuteProbsIndexedSince;
  f->moe_shared_add_in_place = !core.empty() && core < kMoeSharedAddOutOfPlaceSince;
  using Locals = workload::FrameworkFacts::MoeForwardLocals;
  f->moe_forward_locals = core.empty() || core >= kMoePostprocessSince ? Locals::kPostprocess
                          : core >= kMoeSplitForwardSince              ? Locals::kCombineHoldsInput
                                                                       : Locals::kTokenPermutation;
}

// FrameworkFacts::te_fused_attn_bshd_out: TE's cuDNN FusedAttention (TE picks it from sm 90 on)
// under the bshd switch of Megatron-core 0.5-0.13 (kRopeFusionBshdSince). Versions not stated
// are taken as current releases, which no longer switch. Below sm 90 the switch leaves the count
// of saved outputs as te_flash_attn2 has it (flash-attn's own output, the projection's copy).
bool FusedAttnBshdOut(const config::Setup& setup, const workload::ModelDims& d,
                      const workload::FrameworkFacts& f) {
  const std::vector<int>& core = setup.training.megatron_core_version;
  return f.te && f.flash && !f.npu && f.hopper && d.cp == 1 &&
         setup.model.position_embedding_type == config::PositionEmbedding::kRope &&
         !core.empty() && core >= kRopeFusionBshdSince && core < kRopeFusionBshdUntil;
}

class MegatronStack final
    : public MegatronNamedBlockStack<config::internal::BlockReader::kMegatron> {
 public:
  std::string_view Name() const override { return "megatron"; }
  const config::StackTraits& Traits() const override {
    static const config::StackTraits traits{.label = "Megatron-core",
                                            .pads_vocab = true,
                                            .mixture_of_experts = true,
                                            .multi_latent_attention = true,
                                            .megatron_get_batch = true,
                                            .model_parallel = true,
                                            .adam_label = ""};
    return traits;
  }

  void Derive(config::Setup* s, const config::internal::Origin& origin) const override {
    config::TrainingConfig& c = s->training;
    if (c.precision == Precision::kBf16 && !c.accumulate_allreduce_grads_in_fp32 &&
        !c.grad_reduce_in_bf16) {
      // Megatron arguments.py (validate_args): bf16 requires gradient accumulation and
      // all-reduce in fp32, so it switches the flag on, unless --grad-reduce-in-bf16.
      c.accumulate_allreduce_grads_in_fp32 = true;
      s->notes.push_back(fmt::format("{}: set to true for bf16, as Megatron does",
                                     origin.Training("accumulate_allreduce_grads_in_fp32")));
    }
  }

  // Activations and parameters in the training dtype, gradient buffers in fp32 for bf16
  // (arguments.py forces accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16) and
  // for fp16 with that flag, fp32 main parameters for 16-bit training (Megatron-core
  // optimizer/__init__.py chooses Float16OptimizerWithFloat16Params or the distributed optimizer
  // with fp32 main params).
  void SetElementSizes(const config::TrainingConfig& tc, workload::ModelDims* d) const override {
    d->act_bytes = tc.precision == Precision::kFp32 ? 4 : 2;
    d->param_bytes = d->act_bytes;
    d->wide_bytes = d->act_bytes;
    d->mixed = tc.precision != Precision::kFp32;
    const bool grads_16bit =
        (tc.precision == Precision::kFp16 && !tc.accumulate_allreduce_grads_in_fp32) ||
        (tc.precision == Precision::kBf16 && tc.grad_reduce_in_bf16);
    d->grad_bytes = grads_16bit ? 2 : 4;
  }

  void SetFacts(const config::Setup& setup, const workload::ModelDims& d,
                workload::FrameworkFacts* f) const override {
    const config::TrainingConfig& tc = setup.training;
    const std::vector<int>& core = tc.megatron_core_version;
    f->ce_max_out_of_place = !f->npu && !AtLeast(core, kCrossEntropyInPlaceSince);
    f->loss_dp_all_reduce = d.d > 1 && (f->npu || !AtLeast(core, kLossReducedOverDpCpSince));
    using Copies = workload::FrameworkFacts::ParamsNormCopies;
    f->params_norm_copies = !tc.log_params_norm || tc.precision != Precision::kBf16 ? Copies::kNone
                            : AtLeast(core, kParamsNormUsesMainParamSince)          ? Copies::kExperts
                                                                                    : Copies::kAll;
    f->te_fused_attn_bshd_out = FusedAttnBshdOut(setup, d, *f);
    // MindSpeed-LLM replaces get_batch on Ascend (not audited): no mask there.
    f->dataloader_attention_mask = !f->npu && tc.create_attention_mask_in_dataloader;
    SetMoeFacts(tc, d, f);
  }

  config::DataParallelWrapper Wrapper(const config::TrainingConfig& c) const override {
    if (c.use_megatron_fsdp) return config::MegatronFsdp{c.fsdp_sharding};
    return config::MegatronDdp{c.use_distributed_optimizer};
  }
  std::unique_ptr<workload::DataParallel> NewDataParallel(
      const config::Setup& setup, int rank, const workload::ModelDims& d,
      const workload::RankParams& params) const override {
    const config::DataParallelWrapper w = Wrapper(setup.training);
    if (const auto* fsdp = std::get_if<config::MegatronFsdp>(&w)) {
      return workload::NewMegatronFsdp(setup, rank, d, params, *fsdp);
    }
    return workload::NewMegatronDdp(setup, rank, d, params, std::get<config::MegatronDdp>(w));
  }
  std::vector<workload::GradBuffer> LayoutGradBuffers(
      const config::Setup& setup, int rank, const workload::ModelDims& d,
      const std::vector<workload::ParamTensor>& params) const override {
    const config::TrainingConfig& c = setup.training;
    if (c.use_megatron_fsdp) {
      return workload::LayoutFsdpBuffers(setup, rank, d, params,
                                         c.fsdp_sharding != config::FsdpSharding::kNoShard);
    }
    return workload::LayoutDdpBuffers(setup, rank, d, params, c.use_distributed_optimizer);
  }
  // Megatron's _get_param_groups (model.h ParamGroups).
  std::vector<std::vector<int>> ParamGroups(
      const std::vector<workload::ParamTensor>& params) const override {
    return workload::ParamGroups(params);
  }
  std::unique_ptr<workload::TrainingLoop> NewTrainingLoop(
      const workload::LoopParts& parts) const override {
    return workload::NewMegatronLoop(parts);
  }
};

}  // namespace

std::unique_ptr<const config::Stack> NewMegatronStack() {
  return std::make_unique<MegatronStack>();
}

}  // namespace memsim::stacks
