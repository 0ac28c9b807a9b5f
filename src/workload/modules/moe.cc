// The MoE MLP module (moe.h). Every tensor names the Megatron-core function that makes it; paths
// are under megatron/core/transformer/moe/ unless stated.
#include "workload/modules/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "workload/modules/residual.h"

namespace memsim::workload {
namespace {

constexpr ResidualNames kNames = {
    "moe", "ln2", "moe_out", "mlp.residual", "attn.residual_bwd", "attn.d_residual"};

// What the branch saves for backward.
struct MoeSaved final : ModuleSaved {
  // The layer's dispatcher attributes (MoeModule::dispatcher_attrs_; never null in a forward
  // or backward).
  DispatcherAttrs* attrs = nullptr;
  NormSaved ln2;
  TensorId bda_mask = 0;
  // Router (router.py TopKRouter.routing -> moe_utils.py topk_routing_with_score_function):
  // the top-k indices (scatter's backward), the fp32 softmax SoftmaxBackward saves (over the
  // top-k scores, or over all E logits with --moe-router-pre-softmax), the fp32 softmax over all
  // logits for the auxiliary loss (compute_routing_scores_for_aux_loss), and the routing map the
  // dispatcher keeps (self.routing_map / self.local_map).
  TensorId top_indices = 0, topk_probs = 0, aux_scores = 0, routing_map = 0;
  // Core 0.10-0.12 unpermute's masked_select operands (FrameworkFacts::unpermute_masked_select):
  // probs.T.contiguous() [E, n] and routing_map.T.contiguous() [E, n] bool.
  TensorId unpermute_probs_t = 0, unpermute_map_t = 0;
  // Core 0.10-0.12: the permuted probs ([S] alltoall, [N] allgather) that the prob weighting's
  // MulBackward saves, and with drop_and_pad (0.11-0.12 alltoall) the int64 [S] index of
  // unpermute's index_select (IndexSelectBackward keeps it).
  TensorId unpermute_probs = 0, unpermute_index = 0;
  // Core 0.13-0.16 permute's masked_select operands (FrameworkFacts::permute_masked_select):
  // probs.T.contiguous() [E, n] and permute's routing_map.bool().T.contiguous() [E, n] bool.
  TensorId permute_probs_t = 0, permute_map_t = 0;
  // permute()'s sorted indices (or the fused kernel's row_id_map): the unpermute's map.
  TensorId permutation_map = 0;
  // Experts: fc1's input (the dispatched tokens), fc1's output, the activation's output (fc2's
  // input) and the permuted probabilities the weighted activation saves, per expert with
  // SequentialMLP (one entry with grouped GEMM).
  std::vector<TensorId> expert_in, fc1_out, act_out;
  TensorId expert_probs = 0;
  // Megatron-core < 0.13 (FrameworkFacts::moe_probs_at_unpermute): the combined tokens [S, h] that
  // unpermute's `permuted_tokens * permuted_probs` saves.
  TensorId combined_tokens = 0;
  // Shared experts (shared_experts.py SharedExpertMLP, a dense MLP): fc1 and activation outputs.
  TensorId shared_fc1_out = 0, shared_act_out = 0, shared_gate = 0;
};

// The per-rank byte sizes of the branch's tensors.
struct Sizes {
  explicit Sizes(const ModelDims& dims) : d(dims), tok(ComputeMoeTokens(dims)) {}
  const ModelDims& d;
  const MoeTokens tok;
  Bytes Hidden(std::int64_t tokens) const { return d.act_bytes * tokens * d.h; }
  std::int64_t Fe() const { return d.ffn_e / d.etp; }
  std::int64_t Fs() const { return d.ffn_shared / d.t; }
  int Experts() const { return d.grouped_gemm ? 1 : tok.local_experts; }
  // SequentialMLP: tokens of expert i (the N tokens split evenly; the last takes the rest).
  std::int64_t ExpertTokens(int i) const {
    if (d.grouped_gemm) return tok.expert;
    const std::int64_t each = tok.expert / tok.local_experts;
    return i + 1 < tok.local_experts ? each : tok.expert - each * (tok.local_experts - 1);
  }
};

TensorId Act(Emitter& em, Bytes bytes, int l, std::string_view name) {
  return em.Alloc(bytes, Category::kActivations, LayerLabel(l, name));
}
TensorId Tmp(Emitter& em, Bytes bytes, int l, std::string_view name) {
  return em.Alloc(bytes, Category::kTemporaries, LayerLabel(l, name));
}

// Python references to one tensor: a function that returns its input (tensor_parallel/mappings.py
// _AllToAll.forward on a group of one rank: `if world_size == 1: return input`) makes a second
// holder of the same tensor. Such a tensor is reference-counted (Emitter::Ref) while the forward
// runs: each holder releases its own reference, and the last release frees it. Every release in
// this file goes through Release, which frees a tensor nobody else references.
TensorId Alias(Emitter& em, TensorId id) {
  if (em.Refs(id) == 0) em.Ref(id);  // the holder it had
  em.Ref(id);                         // the new one
  return id;
}
void Release(Emitter& em, TensorId id) {
  if (id != 0 && em.Refs(id) > 0) {
    em.Unref(id);
  } else {
    em.Free(id);
  }
}

// The token dispatcher's attributes (MoEAlltoAllTokenDispatcher / MoEAllGatherTokenDispatcher
// in token_dispatcher.py) that the layer's forward binds and nothing clears: one dispatcher per
// MoE layer, so they hold the last forward's tensors until the layer's next forward (the next
// micro-batch, the recompute, or the next iteration) rebinds them, past the backward and the
// optimizer step. Binding `next` drops the previous forward's, freeing those autograd no longer
// holds (`saved` false); the others go when autograd releases them (ReleaseSaved).
void RebindAttrs(Emitter& em, DispatcherAttrs* attrs, DispatcherAttrs next) {
  for (const DispatcherAttr& at : *attrs) {
    if (!at.saved) Release(em, at.id);
  }
  *attrs = std::move(next);
}

// Autograd's (or a no-grad forward's) release of a tensor that may be bound to a dispatcher
// attribute of the layer: while the attribute holds it, it stays.
void ReleaseSaved(Emitter& em, MoeSaved* a, TensorId id) {
  if (id == 0) return;
  for (DispatcherAttr& at : *a->attrs) {
    if (at.id == id) {
      at.saved = false;
      return;
    }
  }
  Release(em, id);
}

// router.py TopKRouter.forward on the norm output [n, h]: gating (router_gating_linear: logits
// [n, E] in the input dtype), routing (topk over the logits, fp32 softmax of the top-k scores
// cast back to the logits' dtype, scattered into dense probs [n, E] and a routing map [n, E]
// bool via an int32 map), the aux-loss scores. Returns the dense probs (the dispatcher's input).
TensorId RouterForward(ModuleContext& ctx, const Sizes& z, int l, bool nograd, MoeSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t n = z.tok.n, E = d.experts, k = d.topk;
  em.Begin("moe.router", l);
  const TensorId logits = Tmp(em, d.act_bytes * n * E, l, "moe.router.logits");
  std::vector<TensorId> temps = {logits};
  if (d.router_pre_softmax) {
    // softmax(logits, dtype=float32) saved by SoftmaxBackward, then the top-k: on a copy cast
    // back to the logits' dtype (core <= 0.17), or on the fp32 scores with the top-k probs
    // cast afterwards (core 0.18 on).
    a->topk_probs = Act(em, 4 * n * E, l, "moe.router.softmax_fp32");
    if (ctx.f.pre_softmax_cast_all) {
      temps.push_back(Tmp(em, d.act_bytes * n * E, l, "moe.router.softmax"));
      temps.push_back(Tmp(em, d.act_bytes * n * k, l, "moe.router.topk_probs"));
      a->top_indices = Act(em, 8 * n * k, l, "moe.router.topk_indices");
    } else {
      temps.push_back(Tmp(em, 4 * n * k, l, "moe.router.topk_probs_fp32"));
      a->top_indices = Act(em, 8 * n * k, l, "moe.router.topk_indices");
      temps.push_back(Tmp(em, d.act_bytes * n * k, l, "moe.router.topk_probs"));
    }
  } else {
    temps.push_back(Tmp(em, d.act_bytes * n * k, l, "moe.router.topk_scores"));
    a->top_indices = Act(em, 8 * n * k, l, "moe.router.topk_indices");
    a->topk_probs = Act(em, 4 * n * k, l, "moe.router.topk_probs_fp32");
    temps.push_back(Tmp(em, d.act_bytes * n * k, l, "moe.router.topk_probs"));
  }
  const TensorId probs = Tmp(em, d.act_bytes * n * E, l, "moe.router.probs");
  temps.push_back(Tmp(em, 4 * n * E, l, "moe.router.routing_map_int"));
  a->routing_map = Act(em, n * E, l, "moe.router.routing_map");
  em.Flops(2.0 * n * d.h * E);
  if (d.aux_loss) a->aux_scores = Act(em, 4 * n * E, l, "moe.router.aux_scores");
  for (TensorId id : temps) Release(em, id);
  if (nograd) {
    for (TensorId* id : {&a->top_indices, &a->topk_probs, &a->aux_scores}) {
      Release(em, *id);
      *id = 0;
    }
  }
  return probs;
}

// Expert TP (etp > 1): gather_from_sequence_parallel_region over the expert-TP group makes a new
// [etp·rows, h] tensor; the input is freed unless `keep_in` (a caller's local still holds it).
// Returns the (new) tensor.
TensorId EtpGather(ModuleContext& ctx, const Sizes& z, int l, TensorId in, std::int64_t rows,
                   const char* name, bool keep_in = false) {
  if (ctx.d.etp <= 1) return in;
  const TensorId out = Tmp(ctx.em, z.Hidden(rows * ctx.d.etp), l, name);
  ctx.em.Collective(CommGroup::kEtp, ctx.d.etp, static_cast<double>(z.Hidden(rows * ctx.d.etp)),
                    Coll::kGather);
  if (!keep_in) Release(ctx.em, in);
  return out;
}

// The tensors a Python local of the MoE layer's forward holds past their last use
// (FrameworkFacts::moe_forward_locals): freed when moe_layer.py custom_forward returns.
using Held = std::vector<TensorId>;
bool IsHeld(const Held& held, TensorId id) {
  return std::find(held.begin(), held.end(), id) != held.end();
}
// Core 0.13 on: custom_forward's locals (hidden_states, dispatched_input, probs) keep the
// dispatch's outputs until it returns.
bool SplitForward(const FrameworkFacts& f) {
  return f.moe_forward_locals != FrameworkFacts::MoeForwardLocals::kTokenPermutation;
}
// Core 0.10-0.12 moe_layer.py custom_forward without --moe-shared-expert-overlap:
// `output += self.shared_experts(hidden_states)` (0.12: `output = output + ...`) after
// token_unpermutation returns; from 0.13 experts_compute calls them before the routed experts.
bool SharedAfterRouted(const FrameworkFacts& f) { return !SplitForward(f); }

// MoEAllGatherTokenDispatcher: from the norm output and dense probs to the tokens of the local
// experts [N, h] and their probs [N]. Frees the dense probs.
TensorId DispatchAllGather(ModuleContext& ctx, const Sizes& z, int l, TensorId probs, MoeSaved* a,
                           TensorId* expert_probs, Held* held) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MoeTokens& t = z.tok;
  // token_dispatch: routing map and probs gathered over TP×EP (new tensors), the hidden states
  // into the global "mpu" buffer (use_global_buffer). With TP×EP 1 it gathers nothing (`if
  // self.tp_size > 1 or self.ep_size > 1`): the same map and probs under a second name.
  em.Begin("moe.dispatch_allgather", l);
  const std::int64_t g = std::int64_t{d.ep} * d.etp;
  const TensorId map_all = g == 1 ? Alias(em, a->routing_map)
                                  : Tmp(em, t.n * g * d.experts, l, "moe.routing_map_gathered");
  const TensorId probs_all =
      g == 1 ? Alias(em, probs)
             : Tmp(em, d.act_bytes * t.n * g * d.experts, l, "moe.probs_gathered");
  if (g > 1) {
    ctx.k.MpuBuffer(z.Hidden(t.n * g));
    em.Collective(CommGroup::kEp, static_cast<int>(g), static_cast<double>(z.Hidden(t.n * g)),
                  Coll::kGather);
  }
  Release(em, probs);
  // dispatch_postprocess: local_map [n·g, El] (kept for unpermute), local probs masked to
  // [N], permute() of the gathered tokens into [N, h] with its sorted indices.
  em.Begin("moe.permute", l);
  const bool split = SplitForward(ctx.f);
  const TensorId local_map = Act(em, t.n * g * t.local_experts, l, "moe.local_map");
  // self.local_probs: from core 0.13 the masked [N] probs the experts take (saved by their
  // weighted activation); before, token_permutation's `probs[:, local experts].contiguous()`,
  // the unmasked [n·g, El] slice, which token_unpermutation masks (CombineAllGather) and
  // autograd does not save (CloneBackward keeps nothing).
  const TensorId local_probs =
      Tmp(em, d.act_bytes * (split ? t.expert : t.n * g * t.local_experts), l, "moe.local_probs");
  *expert_probs = split ? local_probs : 0;
  a->permutation_map = Act(em, 8 * t.expert, l, "moe.permutation_map");
  const TensorId out = Tmp(em, z.Hidden(t.expert), l, "moe.dispatched_tokens");
  Release(em, map_all);
  // dispatch_postprocess (token_permutation before 0.13) binds self.local_map, self.local_probs
  // and self.reversed_local_input_permutation_mapping. Before 0.13 nothing saves the local map
  // itself (permute and unpermute's masked_select keep transposed copies).
  RebindAttrs(em, a->attrs,
              {{local_map, split}, {local_probs, split}, {a->permutation_map, true}});
  // The gathered probs: token_permutation's local before core 0.13; from 0.13 custom_forward's
  // `probs` (rebound by dispatch) until it returns.
  if (split) {
    held->push_back(probs_all);
  } else {
    Release(em, probs_all);
  }
  Release(em, a->routing_map);
  a->routing_map = split ? local_map : 0;
  return out;
}

// Core 0.13-0.16 permute's `probs.T.contiguous().masked_select(routing_map)`:
// MaskedSelectBackward saves the [E, n] copy and permute's [E, n] bool map
// (FrameworkFacts::permute_masked_select); under no_grad both go at once.
void PermuteMaskedSelect(ModuleContext& ctx, const Sizes& z, int l, bool nograd, MoeSaved* a) {
  const std::int64_t cols = z.tok.n * ctx.d.experts;
  a->permute_probs_t = Act(ctx.em, ctx.d.act_bytes * cols, l, "moe.permute_probs_t");
  a->permute_map_t = Act(ctx.em, cols, l, "moe.permute_map_t");
  if (!nograd) return;
  for (TensorId* id : {&a->permute_probs_t, &a->permute_map_t}) {
    Release(ctx.em, *id);
    *id = 0;
  }
}

// Dispatch (token_dispatcher.py): from the norm output and dense probs to the tokens of the
// local experts [N, h] and their probs [N]. Frees the dense probs; what a caller's local keeps
// goes to *held (the experts' input too under nograd, when custom_forward holds it).
TensorId Dispatch(ModuleContext& ctx, const Sizes& z, int l, TensorId probs, bool nograd,
                  MoeSaved* a, TensorId* expert_probs, Held* held) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MoeTokens& t = z.tok;
  if (!d.alltoall) return DispatchAllGather(ctx, z, l, probs, a, expert_probs, held);
  const bool split = SplitForward(ctx.f);
  // MoEAlltoAllTokenDispatcher.dispatch_preprocess -> moe_utils.py permute: the permuted copies
  // [S, h] and probs [S]; sorted indices int64 [S] (fused: TE's row_id_map, int32 [n, E]).
  // Before core 0.13 token_permutation's permute() takes no probs (core_v0.10.0-v0.12.0
  // moe_utils.py permute(tokens, routing_map, ...)): the probs stay dense in self.probs until
  // token_unpermutation's unpermute weights the tokens (Unpermute), so no probs travel.
  em.Begin("moe.permute", l);
  const TensorId sent = Tmp(em, z.Hidden(t.send), l, "moe.permuted_tokens");
  const TensorId sent_probs = split ? Tmp(em, d.act_bytes * t.send, l, "moe.permuted_probs") : 0;
  a->permutation_map = Act(em, d.permute_fusion ? 4 * t.n * d.experts : 8 * t.send, l,
                           "moe.permutation_map");
  if (ctx.f.permute_masked_select) PermuteMaskedSelect(ctx, z, l, nograd, a);
  // dispatch_preprocess (token_permutation before core 0.13) binds self.probs, the dense probs
  // [n, E], and self.routing_map [n, E] bool, and permute's map to
  // self.reversed_local_input_permutation_mapping. The probs' last other holder, the local,
  // dies with the permute (their only one from then on).
  RebindAttrs(em, a->attrs, {{probs, false}, {a->routing_map, true}, {a->permutation_map, true}});
  // token_dispatch: all_to_all over the EP group into new [R, h] and [R] tensors
  // (tensor_parallel/mappings.py _AllToAll, torch.empty of the output split sizes). The permuted
  // probs die when it returns; the permuted copies [S, h] stay referenced by custom_forward's
  // hidden_states from core 0.13 (held), by token_permutation's local before (freed below).
  // With EP 1, _AllToAll.forward returns its input: the same tensors under a second name.
  em.Begin("moe.dispatch_alltoall", l);
  const bool one_rank = d.ep == 1;
  const TensorId a2a =
      one_rank ? Alias(em, sent) : Tmp(em, z.Hidden(t.receive), l, "moe.received_tokens");
  const TensorId a2a_probs = !split    ? 0
                             : one_rank ? Alias(em, sent_probs)
                                        : Tmp(em, d.act_bytes * t.receive, l, "moe.received_probs");
  em.Collective(CommGroup::kEp, d.ep, static_cast<double>(z.Hidden(t.send)), Coll::kP2P);
  if (split) {
    Release(em, sent_probs);
    held->push_back(sent);
  }
  // dispatch_postprocess: the expert-TP gather, then sort_chunks_by_idxs by local expert
  // (new tensors) when the rank holds more than one expert. Each rebinds its local; from core
  // 0.13 custom_forward's dispatched_input and probs still hold the all-to-all's outputs.
  TensorId recv = EtpGather(ctx, z, l, a2a, t.receive, "moe.received_tokens_etp", split);
  TensorId recv_probs = a2a_probs;
  auto rebind_probs = [&](const char* name) {  // from core 0.13 only (the probs travel)
    if (!split) return;
    const TensorId next = Tmp(em, d.act_bytes * t.expert, l, name);
    if (recv_probs != a2a_probs) Release(em, recv_probs);
    recv_probs = next;
  };
  if (d.etp > 1) rebind_probs("moe.received_probs_etp");
  if (t.local_experts > 1) {
    em.Begin("moe.sort_chunks", l);
    const TensorId sorted = Tmp(em, z.Hidden(t.expert), l, "moe.dispatched_tokens");
    rebind_probs("moe.dispatched_probs");
    if (!(split && recv == a2a)) Release(em, recv);
    recv = sorted;
  }
  if (split) {
    if (recv_probs != a2a_probs || nograd) held->push_back(a2a_probs);
    // The all-to-all output when it is not itself the experts' input (saved by fc1 with grad).
    if (recv != a2a || nograd) held->push_back(a2a);
  } else {
    Release(em, sent);  // token_permutation returns
    // custom_forward's dispatched_input: the experts' input, saved by fc1 with grad.
    if (nograd) held->push_back(recv);
  }
  *expert_probs = recv_probs;
  return recv;
}

// The local experts (experts.py): fc1 (grouped linear, or one linear per expert), the weighted
// activation (weighted_bias_swiglu_impl / activation × probs), fc2. Returns fc2's output [N, h]
// (SequentialMLP: the per-expert outputs concatenated, torch.cat). Frees its input and probs with
// nograd unless a caller's local holds them (`held`).
TensorId ExpertsForward(ModuleContext& ctx, const Sizes& z, int l, TensorId in, TensorId probs,
                        bool nograd, const Held& held, MoeSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const int experts = z.Experts();
  a->expert_in.assign(experts, 0);
  a->fc1_out.assign(experts, 0);
  a->act_out.assign(experts, 0);
  a->expert_in[0] = in;
  std::vector<TensorId> outs(experts, 0);
  for (int i = 0; i < experts; ++i) {
    const std::int64_t n = z.ExpertTokens(i);
    if (!d.grouped_gemm && i > 0) a->expert_in[i] = in;  // torch.split views of one tensor
    em.Begin("moe.experts.fc1", l);
    ctx.k.GemmWorkspace(false);
    a->fc1_out[i] = Act(em, d.act_bytes * n * d.gamma * z.Fe(), l, "moe.experts.fc1_out");
    em.Flops(2.0 * n * d.h * d.gamma * z.Fe());
    em.Begin("moe.experts.act", l);
    a->act_out[i] = Act(em, d.act_bytes * n * z.Fe(), l, "moe.experts.act_out");
    if (nograd) Release(em, a->fc1_out[i]);
    em.Begin("moe.experts.fc2", l);
    outs[i] = Tmp(em, z.Hidden(n), l, "moe.experts.fc2_out");
    em.Flops(2.0 * n * z.Fe() * d.h);
    // moe_act recompute (CheckpointWithoutOutput.discard_output_and_register_recompute): the
    // activation's output is released once fc2 ran.
    if (nograd || ctx.selective.moe_act) {
      Release(em, a->act_out[i]);
      a->act_out[i] = 0;
    }
  }
  if (nograd && !IsHeld(held, in)) Release(em, in);
  a->expert_probs = probs;
  if (nograd) {
    if (!IsHeld(held, probs)) ReleaseSaved(em, a, probs);
    a->expert_probs = 0;
  }
  if (experts == 1) return outs[0];
  em.Begin("moe.experts.cat", l);
  const TensorId out = Tmp(em, z.Hidden(z.tok.expert), l, "moe.experts.output");
  for (TensorId id : outs) Release(em, id);
  return out;
}

void FreeMaps(Emitter& em, MoeSaved* a) {
  ReleaseSaved(em, a, a->routing_map);
  ReleaseSaved(em, a, a->permutation_map);
  a->routing_map = a->permutation_map = 0;
}

// Core 0.10-0.12 MoEAllGatherTokenDispatcher.token_unpermutation weights the experts' output
// `out` [N, h] by the probs before the unpermute: `self.local_probs.T.contiguous()
// .masked_select(self.local_map.T.contiguous())` (MaskedSelectBackward saves both [El, n·g]
// copies) gives the permuted probs [N], and `hidden_states * permuted_probs.unsqueeze(-1)` a new
// [N, h] (returned; token_unpermutation's local holds it until it returns) whose MulBackward
// saves `out` and the probs [N]. Under no_grad the saved tensors go at once and `out` stays with
// custom_forward's expert_output (held).
TensorId WeightByLocalProbs(ModuleContext& ctx, const Sizes& z, int l, TensorId out, bool nograd,
                            MoeSaved* a, Held* held) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t cols = z.tok.n * d.ep * d.etp * z.tok.local_experts;  // [El, n·g]
  a->unpermute_probs_t = Act(em, d.act_bytes * cols, l, "moe.unpermute_probs_t");
  a->unpermute_map_t = Act(em, cols, l, "moe.unpermute_map_t");
  a->unpermute_probs = Act(em, d.act_bytes * z.tok.expert, l, "moe.unpermute_probs");
  const TensorId weighted = Tmp(em, z.Hidden(z.tok.expert), l, "moe.weighted_tokens");
  if (nograd) {
    for (TensorId* id : {&a->unpermute_probs_t, &a->unpermute_map_t, &a->unpermute_probs}) {
      Release(em, *id);
      *id = 0;
    }
    held->push_back(out);
  } else {
    a->combined_tokens = out;
  }
  return weighted;
}

// MoEAllGatherTokenDispatcher's combine: combine_preprocess unpermutes into zeros [n·g, h];
// token_combine reduce-scatters over TP×EP into a new [n, h]. Frees `out` (core 0.13 on; before,
// WeightByLocalProbs keeps it).
TensorId CombineAllGather(ModuleContext& ctx, const Sizes& z, int l, TensorId out, bool nograd,
                          MoeSaved* a, Held* held) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MoeTokens& t = z.tok;
  const std::int64_t g = std::int64_t{d.ep} * d.etp;
  em.Begin("moe.unpermute", l);
  const TensorId weighted =
      SplitForward(ctx.f) ? 0 : WeightByLocalProbs(ctx, z, l, out, nograd, a, held);
  const TensorId full = Tmp(em, z.Hidden(t.n * g), l, "moe.unpermuted_tokens");
  if (weighted == 0) Release(em, out);
  // token_combine reduce-scatters only with TP×EP > 1. token_unpermutation's locals (the
  // weighted tokens, the unpermuted [n·g, h]) die when it returns (before core 0.13).
  TensorId res = full;
  if (g > 1) {
    em.Begin("moe.combine_reduce_scatter", l);
    res = Tmp(em, z.Hidden(t.n), l, "moe.output");
    em.Collective(CommGroup::kEp, static_cast<int>(g), static_cast<double>(z.Hidden(t.n * g)),
                  Coll::kGather);
    Release(em, full);
  }
  if (weighted != 0) Release(em, weighted);
  if (nograd) FreeMaps(em, a);
  return res;
}

// moe_utils.py unpermute of the all-to-all's output `back` [S, h] into zeros [n, h]
// (scatter_add). Frees `back` unless saved (core < 0.13's prob weighting) or `keep_back`.
TensorId Unpermute(ModuleContext& ctx, const Sizes& z, int l, TensorId back, bool nograd,
                   bool keep_back, MoeSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MoeTokens& t = z.tok;
  em.Begin("moe.unpermute", l);
  if (ctx.f.moe_probs_at_unpermute) {
    // moe_utils.py unpermute (core 0.10-0.12): `permuted_tokens * permuted_probs.unsqueeze(-1)`
    // is a new [S, h] tensor, and MulBackward saves both factors (both need grad), so the
    // combined tokens stay saved; the product dies after scatter_add_ (whose backward needs the
    // index only). The permuted probs [S]: masked_select keeps both transposed copies (core
    // 0.10; 0.11-0.12 without drop_and_pad); with drop_and_pad (0.11-0.12) `probs.T.contiguous()
    // .view(-1)` [E·n] is a local dropped when unpermute returns and index_select keeps its
    // int64 index [S] (indices_1D). MulBackward saves the permuted probs [S] too.
    TensorId probs_1d = 0;
    if (ctx.f.unpermute_masked_select) {
      a->unpermute_probs_t = Act(em, d.act_bytes * t.n * d.experts, l, "moe.unpermute_probs_t");
      a->unpermute_map_t = Act(em, t.n * d.experts, l, "moe.unpermute_map_t");
    } else {
      probs_1d = Tmp(em, d.act_bytes * t.n * d.experts, l, "moe.unpermute_probs_t");
      a->unpermute_index = Act(em, 8 * t.send, l, "moe.unpermute_index");
    }
    a->unpermute_probs = Act(em, d.act_bytes * t.send, l, "moe.unpermute_probs");
    const TensorId weighted = Tmp(em, z.Hidden(t.send), l, "moe.weighted_tokens");
    const TensorId res = Tmp(em, z.Hidden(t.n), l, "moe.output");
    Release(em, weighted);
    if (probs_1d != 0) Release(em, probs_1d);
    if (nograd) {
      if (!keep_back) Release(em, back);
      for (TensorId* id : {&a->unpermute_probs_t, &a->unpermute_map_t, &a->unpermute_probs,
                           &a->unpermute_index}) {
        Release(em, *id);
        *id = 0;
      }
    } else {
      a->combined_tokens = back;
    }
    return res;
  }
  const TensorId res = Tmp(em, z.Hidden(t.n), l, "moe.output");
  if (!keep_back) Release(em, back);
  return res;
}

// Combine (token_dispatcher.py): expert outputs back to [n, h] in token order. Frees `out` or
// hands it to *held, as the Python locals that hold it go (FrameworkFacts::moe_forward_locals).
TensorId Combine(ModuleContext& ctx, const Sizes& z, int l, TensorId out, bool nograd,
                 MoeSaved* a, Held* held) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MoeTokens& t = z.tok;
  if (!d.alltoall) return CombineAllGather(ctx, z, l, out, nograd, a, held);
  using Locals = FrameworkFacts::MoeForwardLocals;
  const Locals locals = ctx.f.moe_forward_locals;
  // combine_preprocess (token_unpermutation's first half before core 0.13): the sort back by
  // source rank, the expert-TP reduce-scatter; each rebinds the local and frees the previous
  // tensor, except the experts' output, which the caller's local holds.
  const TensorId expert_out = out;
  auto rebind = [&](TensorId next) {
    if (out != expert_out) Release(em, out);
    out = next;
  };
  if (t.local_experts > 1) {
    em.Begin("moe.unsort_chunks", l);
    rebind(Tmp(em, z.Hidden(t.expert), l, "moe.unsorted_tokens"));
  }
  if (d.etp > 1) {
    const TensorId rs = Tmp(em, z.Hidden(t.receive), l, "moe.expert_output_etp");
    em.Collective(CommGroup::kEtp, d.etp, static_cast<double>(z.Hidden(t.expert)), Coll::kGather);
    rebind(rs);
  }
  // The experts' output: experts_compute's local (routed_experts_compute's from 0.15) dies when
  // it returns, after combine_preprocess (core 0.13 on); before, custom_forward's expert_output
  // holds it until custom_forward returns.
  if (locals == Locals::kTokenPermutation) {
    held->push_back(expert_out);
  } else if (out != expert_out) {
    Release(em, expert_out);
  }
  // token_combine: all_to_all back into [S, h]. Its input dies when combine returns (core 0.16
  // on); custom_forward's `output` holds it through combine, the unpermute and the shared add
  // included (0.13-0.15); token_unpermutation's local until it returns (before).
  // (EP 1: _AllToAll.forward returns its input, a second reference to `out`.)
  em.Begin("moe.combine_alltoall", l);
  const TensorId back =
      d.ep == 1 ? Alias(em, out) : Tmp(em, z.Hidden(t.send), l, "moe.combined_tokens");
  em.Collective(CommGroup::kEp, d.ep, static_cast<double>(z.Hidden(t.send)), Coll::kP2P);
  if (locals == Locals::kPostprocess) {
    Release(em, out);
  } else if (locals == Locals::kCombineHoldsInput) {
    held->push_back(out);
  }
  // combine_postprocess: unpermute. From core 0.16 custom_forward's `output` holds the
  // all-to-all's output until postprocess returns, after the shared add.
  const bool keep_back = locals == Locals::kPostprocess;
  const TensorId res = Unpermute(ctx, z, l, back, nograd, keep_back, a);
  if (keep_back) held->push_back(back);
  if (locals == Locals::kTokenPermutation && out != expert_out) Release(em, out);
  if (nograd) FreeMaps(em, a);
  return res;
}

// SharedExpertMLP: a dense MLP of width moe_shared_expert_intermediate_size (TP-split) on the
// norm output; with Qwen2-MoE's gate, sigmoid(x·gate) scales it. Returns its output [n, h].
TensorId SharedForward(ModuleContext& ctx, const Sizes& z, int l, bool nograd, MoeSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  em.Begin("moe.shared_experts.fc1", l);
  const TensorId g = ctx.k.SpGather(z.Hidden(d.T), LayerLabel(l, "moe.shared_fc1_gather"), false);
  a->shared_fc1_out = Act(em, d.act_bytes * d.T * d.gamma * z.Fs(), l, "moe.shared_fc1_out");
  Release(em, g);
  em.Flops(2.0 * d.T * d.h * d.gamma * z.Fs());
  em.Begin("moe.shared_experts.act", l);
  a->shared_act_out = Act(em, d.act_bytes * d.T * z.Fs(), l, "moe.shared_act_out");
  if (nograd) Release(em, a->shared_fc1_out);
  em.Begin("moe.shared_experts.fc2", l);
  TensorId out = ctx.k.RowParallelOutput(z.Hidden(d.T), LayerLabel(l, "moe.shared_fc2_out"));
  em.Flops(2.0 * d.T * z.Fs() * d.h);
  if (nograd) Release(em, a->shared_act_out);
  if (d.shared_gate) {
    em.Begin("moe.shared_experts.gate", l);
    a->shared_gate = Act(em, d.act_bytes * z.tok.n, l, "moe.shared_gate");
    const TensorId gated = Tmp(em, z.Hidden(z.tok.n), l, "moe.shared_gated_out");
    Release(em, out);
    out = gated;
    if (nograd) Release(em, a->shared_gate);
  }
  return out;
}

// The branch after the norm: shared experts, router, dispatch, experts, combine, the shared
// experts' sum (moe_layer.py MoELayer.forward). Returns the branch output [n, h]. Before core
// 0.13 the shared experts run after the combine (SharedAfterRouted), while custom_forward's
// locals still hold the experts' output; from 0.13 experts_compute runs them after the dispatch,
// modelled before the router (their output alive through the routed path, erring high).
TensorId RoutedBranch(ModuleContext& ctx, const Sizes& z, int l, bool nograd, MoeSaved* a) {
  Emitter& em = ctx.em;
  const bool has_shared = z.d.ffn_shared > 0;
  const bool after = SharedAfterRouted(ctx.f);
  TensorId shared = has_shared && !after ? SharedForward(ctx, z, l, nograd, a) : 0;
  const TensorId probs = RouterForward(ctx, z, l, nograd, a);
  TensorId expert_probs = 0;
  Held held;
  const TensorId in = Dispatch(ctx, z, l, probs, nograd, a, &expert_probs, &held);
  const TensorId out = ExpertsForward(ctx, z, l, in, expert_probs, nograd, held, a);
  TensorId res = Combine(ctx, z, l, out, nograd, a, &held);
  if (has_shared && after) shared = SharedForward(ctx, z, l, nograd, a);
  if (shared != 0 && ctx.f.moe_shared_add_in_place) {
    // custom_forward's `output += ...` (core < 0.12): the sum is written into the output.
    em.Begin("moe.add_shared", l);
    Release(em, shared);
  } else if (shared != 0) {
    // MoELayer.postprocess: output + shared_expert_output, a new tensor.
    em.Begin("moe.add_shared", l);
    const TensorId sum = Tmp(em, z.Hidden(z.tok.n), l, "moe.output_with_shared");
    Release(em, res);
    Release(em, shared);
    res = sum;
  }
  // custom_forward returns: the tensors its locals (and the dispatcher's) still held go.
  for (TensorId id : held) Release(em, id);
  return res;
}

// Autograd's sum of two gradients of the norm output into a new [n, h] tensor (frees both).
TensorId SumGrads(ModuleContext& ctx, const Sizes& z, int l, TensorId a, TensorId b) {
  ctx.em.Begin("moe.d_ln2_out_sum", l);
  const TensorId sum = Tmp(ctx.em, z.Hidden(z.tok.n), l, "moe.d_ln2_out");
  Release(ctx.em, a);
  Release(ctx.em, b);
  return sum;
}

// The backward of core 0.10-0.12's prob weighting (Unpermute, WeightByLocalProbs) from
// `gathered` [rows, h], ScatterAddBackward's `grad.gather(0, index)` of the unpermute's input:
// MulBackward0 (derivatives.yaml mul: self `grad * other`, other `grad * self`) makes the tokens'
// grad [rows, h] (returned) and the probs' [rows, h], which the engine sums to [rows, 1]
// (validate_outputs) while call_function still holds the node's input; then the input and the
// node's saved factors go. The probs' grad runs on through masked_select_backward (zeros like
// the saved [cols] copy, masked_scatter_; index_select_backward with drop_and_pad: zeros,
// index_add_): *d_probs, the grad of the router's (or local) probs as a transposed view, which
// waits for the dispatch's or router's backward; the saved copies go.
TensorId WeightedBackward(ModuleContext& ctx, const Sizes& z, int l, std::int64_t rows,
                          std::int64_t cols, TensorId gathered, MoeSaved* a, TensorId* d_probs,
                          const char* probs_label) {
  Emitter& em = ctx.em;
  const Bytes b = ctx.d.act_bytes;
  const TensorId d_tokens = Tmp(em, z.Hidden(rows), l, "moe.d_combined_tokens");
  const TensorId d_full = Tmp(em, z.Hidden(rows), l, "moe.d_weighted_probs");
  const TensorId d_permuted = Tmp(em, b * rows, l, "moe.d_unpermute_probs");
  for (TensorId id : {d_full, gathered, a->combined_tokens, a->unpermute_probs}) Release(em, id);
  em.Begin("moe.unpermute_probs_bwd", l);
  *d_probs = Tmp(em, b * cols, l, probs_label);
  for (TensorId id :
       {d_permuted, a->unpermute_probs_t, a->unpermute_map_t, a->unpermute_index}) {
    Release(em, id);
  }
  a->combined_tokens = a->unpermute_probs = 0;
  a->unpermute_probs_t = a->unpermute_map_t = a->unpermute_index = 0;
  return d_tokens;
}

// Backward of the combine: the gradient of the output [n, h] back to the experts' output order
// [N, h]. Frees dy unless keep_dy (the shared experts still need it), and what the unpermute
// saved. Before core 0.13 the probs' grad starts here (*d_probs: alltoall the dense [n, E],
// allgather the local [El, n·g]); from 0.13 it comes from the experts (0 here).
TensorId CombineBackward(ModuleContext& ctx, const Sizes& z, int l, TensorId dy, bool keep_dy,
                         MoeSaved* a, TensorId* d_probs) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MoeTokens& t = z.tok;
  auto drop_dy = [&] {
    if (!keep_dy) Release(em, dy);
  };
  if (!d.alltoall) {
    // reduce-scatter's backward: all-gather [n·g, h]; unpermute's backward: index_select [N, h].
    // With TP×EP 1 there was no reduce-scatter: the unpermute's backward reads dy itself.
    const std::int64_t g = std::int64_t{d.ep} * d.etp;
    TensorId full = dy;
    if (g > 1) {
      em.Begin("moe.combine_reduce_scatter_bwd", l);
      full = Tmp(em, z.Hidden(t.n * g), l, "moe.d_unpermuted_tokens");
      em.Collective(CommGroup::kEp, static_cast<int>(g), static_cast<double>(z.Hidden(t.n * g)),
                    Coll::kGather);
      drop_dy();
    }
    em.Begin("moe.unpermute_bwd", l);
    const bool weighted = !SplitForward(ctx.f);  // core < 0.13: WeightByLocalProbs
    TensorId out = Tmp(em, z.Hidden(t.expert),
                       l, weighted ? "moe.d_weighted_tokens" : "moe.d_expert_output");
    if (g > 1) {
      Release(em, full);
    } else {
      drop_dy();
    }
    if (weighted) {
      out = WeightedBackward(ctx, z, l, t.expert, t.n * g * t.local_experts, out, a, d_probs,
                             "moe.d_local_probs");
    }
    return out;
  }
  em.Begin("moe.unpermute_bwd", l);
  TensorId g = 0;
  if (ctx.f.moe_probs_at_unpermute) {
    g = Tmp(em, z.Hidden(t.send), l, "moe.d_weighted_tokens");
    drop_dy();
    g = WeightedBackward(ctx, z, l, t.send, t.n * d.experts, g, a, d_probs, "moe.d_probs");
  } else {
    g = Tmp(em, z.Hidden(t.send), l, "moe.d_combined_tokens");
    drop_dy();
    // Core 0.11-0.12 with TE's fused unpermute (moe_permute_fusion): its backward returns the
    // dense probs' grad [n, E] (the probs did not travel with the tokens).
    if (!SplitForward(ctx.f)) *d_probs = Tmp(em, d.act_bytes * t.n * d.experts, l, "moe.d_probs");
  }
  // The all-to-all's backward (_AllToAll.backward applies _AllToAll: the gradient itself with
  // EP 1).
  em.Begin("moe.combine_alltoall_bwd", l);
  TensorId r = g;
  if (d.ep > 1) {
    r = Tmp(em, z.Hidden(t.receive), l, "moe.d_expert_output_ep");
    em.Collective(CommGroup::kEp, d.ep, static_cast<double>(z.Hidden(t.send)), Coll::kP2P);
    Release(em, g);
  }
  r = EtpGather(ctx, z, l, r, t.receive, "moe.d_expert_output_etp");
  if (t.local_experts > 1) {
    em.Begin("moe.unsort_chunks_bwd", l);
    g = Tmp(em, z.Hidden(t.expert), l, "moe.d_expert_output");
    Release(em, r);
    r = g;
  }
  return r;
}

// The experts' backward (fc2, activation, fc1 per expert; grouped: one pass): weight grads to
// autograd, the gradient of the dispatched tokens [N, h] and of their probs [N] (*d_probs).
// Frees what the experts saved and dy. moe_act recompute: the activation re-run first.
TensorId ExpertsBackward(ModuleContext& ctx, const Sizes& z, int l, TensorId dy, MoeSaved* a,
                         TensorId* d_probs) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const int experts = z.Experts();
  const int el = z.tok.local_experts;
  std::vector<TensorId> d_in(experts, 0);
  for (int i = experts; i-- > 0;) {
    const std::int64_t n = z.ExpertTokens(i);
    if (ctx.selective.moe_act) {
      em.SetPrefix("recompute.");
      em.Begin("moe.experts.act", l);
      a->act_out[i] = Act(em, d.act_bytes * n * z.Fe(), l, "moe.experts.act_out");
      em.SetPrefix("");
    }
    em.Begin("moe.experts.fc2_bwd", l);
    ctx.k.GemmWorkspace(false);
    const TensorId d_act = Tmp(em, d.act_bytes * n * z.Fe(), l, "moe.experts.d_act_out");
    for (int e = d.grouped_gemm ? 0 : i; e < (d.grouped_gemm ? el : i + 1); ++e) {
      ctx.k.WeightGradToAutograd(d.h, z.Fe(), ctx.f.te, LayerLabel(l, fmt::format("moe.fc2.wgrad{}", e)),
                                 LayerLabel(l, fmt::format("mlp.experts.{}.fc2.weight", e)));
    }
    Release(em, a->act_out[i]);
    em.Flops(4.0 * n * z.Fe() * d.h);
    em.Begin("moe.experts.act_bwd", l);
    const TensorId d_fc1 = Tmp(em, d.act_bytes * n * d.gamma * z.Fe(), l, "moe.experts.d_fc1_out");
    Release(em, a->fc1_out[i]);
    Release(em, d_act);
    em.Begin("moe.experts.fc1_bwd", l);
    d_in[i] = Tmp(em, z.Hidden(n), l, "moe.experts.d_input");
    for (int e = d.grouped_gemm ? 0 : i; e < (d.grouped_gemm ? el : i + 1); ++e) {
      ctx.k.WeightGradToAutograd(d.gamma * z.Fe(), d.h, ctx.f.te,
                                 LayerLabel(l, fmt::format("moe.fc1.wgrad{}", e)),
                                 LayerLabel(l, fmt::format("mlp.experts.{}.fc1.weight", e)));
    }
    Release(em, d_fc1);
    em.Flops(4.0 * n * d.h * d.gamma * z.Fe());
  }
  // The probs' gradient from the weighted activation (core 0.13 on; before, the experts take
  // no probs: experts.py forward(permuted_local_hidden_states, tokens_per_expert));
  // SequentialMLP: torch.split's backward concatenates the per-expert input grads into one
  // [N, h].
  em.Begin("moe.experts.d_probs", l);
  *d_probs = a->expert_probs != 0 ? Tmp(em, d.act_bytes * z.tok.expert, l, "moe.experts.d_probs")
                                  : 0;
  Release(em, a->expert_in[0]);
  ReleaseSaved(em, a, a->expert_probs);
  Release(em, dy);
  if (experts == 1) return d_in[0];
  em.Begin("moe.experts.cat_bwd", l);
  const TensorId out = Tmp(em, z.Hidden(z.tok.expert), l, "moe.experts.d_inputs");
  for (TensorId id : d_in) Release(em, id);
  return out;
}

// The dispatch's backward: the tokens' gradient back to [n, h] in token order (returned) and the
// dense probs' gradient [n, E] (*d_dense). Frees its inputs and the permutation maps.
TensorId DispatchBackward(ModuleContext& ctx, const Sizes& z, int l, TensorId dx, TensorId dp,
                          MoeSaved* a, TensorId* d_dense) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const MoeTokens& t = z.tok;
  if (!d.alltoall) {
    // permute's backward (unpermute into zeros [n·g, h]); masked_select's backward (zeros
    // [n·g, El] -> the gathered probs' grad [n·g, E]); the gathers' backward: reduce-scatters.
    const std::int64_t g = std::int64_t{d.ep} * d.etp;
    em.Begin("moe.permute_bwd", l);
    const TensorId full = Tmp(em, z.Hidden(t.n * g), l, "moe.d_gathered_tokens");
    const TensorId probs = Tmp(em, d.act_bytes * t.n * g * d.experts, l, "moe.d_gathered_probs");
    for (TensorId id : {dx, dp}) Release(em, id);
    FreeMaps(em, a);
    if (g == 1) {  // no gathers to reverse (TP×EP 1)
      *d_dense = probs;
      return full;
    }
    em.Begin("moe.dispatch_allgather_bwd", l);
    const TensorId out = Tmp(em, z.Hidden(t.n), l, "moe.d_routed_input");
    *d_dense = Tmp(em, d.act_bytes * t.n * d.experts, l, "moe.d_probs");
    em.Collective(CommGroup::kEp, static_cast<int>(g), static_cast<double>(z.Hidden(t.n * g)), Coll::kGather);
    Release(em, full);
    Release(em, probs);
    return out;
  }
  // Before core 0.13 no probs travelled with the tokens (dp 0): their grad came from the
  // unpermute's backward.
  auto probs_grad = [&](Bytes bytes, const char* name) {
    return dp != 0 ? Tmp(em, bytes, l, name) : 0;
  };
  std::int64_t rows = t.expert;
  if (t.local_experts > 1) {
    em.Begin("moe.sort_chunks_bwd", l);
    const TensorId x2 = Tmp(em, z.Hidden(rows), l, "moe.d_received_tokens");
    const TensorId p2 = probs_grad(d.act_bytes * rows, "moe.d_received_probs");
    Release(em, dx);
    Release(em, dp);
    dx = x2;
    dp = p2;
  }
  if (d.etp > 1) {
    em.Begin("moe.etp_gather_bwd", l);
    const TensorId x2 = Tmp(em, z.Hidden(t.receive), l, "moe.d_received_tokens_ep");
    const TensorId p2 = probs_grad(d.act_bytes * t.receive, "moe.d_received_probs_ep");
    em.Collective(CommGroup::kEtp, d.etp, static_cast<double>(z.Hidden(rows)), Coll::kGather);
    Release(em, dx);
    Release(em, dp);
    dx = x2;
    dp = p2;
  }
  em.Begin("moe.dispatch_alltoall_bwd", l);
  TensorId sx = dx, sp = dp;  // EP 1: the gradients themselves (_AllToAll.backward)
  if (d.ep > 1) {
    sx = Tmp(em, z.Hidden(t.send), l, "moe.d_permuted_tokens");
    sp = probs_grad(d.act_bytes * t.send, "moe.d_permuted_probs");
    em.Collective(CommGroup::kEp, d.ep, static_cast<double>(z.Hidden(t.send)), Coll::kP2P);
    Release(em, dx);
    Release(em, dp);
  }
  // permute's backward: unpermute into zeros [n, h]; the probs' index_select backward into
  // zeros [n, E].
  em.Begin("moe.permute_bwd", l);
  const TensorId out = Tmp(em, z.Hidden(t.n), l, "moe.d_routed_input");
  if (sp != 0) *d_dense = Tmp(em, d.act_bytes * t.n * d.experts, l, "moe.d_probs");
  Release(em, sx);
  Release(em, sp);
  FreeMaps(em, a);
  // MaskedSelectBackward (core 0.13-0.16) releases what it saved.
  for (TensorId* id : {&a->permute_probs_t, &a->permute_map_t}) {
    Release(em, *id);
    *id = 0;
  }
  return out;
}

// The router's backward: scatter's and softmax's backward, topk's backward into zeros [n, E],
// the aux-loss scores' backward, RouterGatingLinearFunction.backward (input grad [n, h] and the
// weight grad [E, h]). Frees what the router saved and d_dense. Returns the input grad.
TensorId RouterBackward(ModuleContext& ctx, const Sizes& z, int l, TensorId d_dense, MoeSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  const std::int64_t n = z.tok.n, E = d.experts, k = d.topk;
  em.Begin("moe.router_bwd", l);
  const TensorId d_topk = Tmp(em, d.act_bytes * n * k, l, "moe.router.d_topk_probs");
  // The softmax's input grad: over the top-k scores, or over all E logits (pre-softmax).
  const TensorId d_soft =
      Tmp(em, 4 * n * (d.router_pre_softmax ? E : k), l, "moe.router.d_softmax_fp32");
  const TensorId d_logits = Tmp(em, d.act_bytes * n * E, l, "moe.router.d_logits");
  const TensorId d_aux = d.aux_loss ? Tmp(em, 4 * n * E, l, "moe.router.d_aux_scores") : 0;
  const TensorId d_in = Tmp(em, z.Hidden(n), l, "moe.router.d_input");
  ctx.k.SmallWeightGrad(E * d.h, LayerLabel(l, "moe.router.wgrad"),
                        LayerLabel(l, "mlp.router.weight"));
  em.Flops(4.0 * n * d.h * E);
  for (TensorId id : {d_topk, d_soft, d_logits, d_aux, d_dense, a->top_indices, a->topk_probs,
                      a->aux_scores}) {
    Release(em, id);
  }
  return d_in;
}

// The shared experts' backward on dy (the branch's gradient): the gate (Qwen2-MoE), fc2, the
// activation, fc1 (dense MLP pattern, kernels.h). Frees what they saved; returns the input grad.
TensorId SharedBackward(ModuleContext& ctx, const Sizes& z, int l, TensorId dy, MoeSaved* a) {
  const ModelDims& d = ctx.d;
  Emitter& em = ctx.em;
  TensorId d_out = dy, d_gate_in = 0;
  if (d.shared_gate) {
    em.Begin("moe.shared_experts.gate_bwd", l);
    d_out = Tmp(em, z.Hidden(z.tok.n), l, "moe.shared.d_fc2_out");
    d_gate_in = Tmp(em, z.Hidden(z.tok.n), l, "moe.shared.d_gate_input");
    ctx.k.SmallWeightGrad(d.h, LayerLabel(l, "moe.shared.gate_wgrad"),
                          LayerLabel(l, "mlp.shared_experts.gate_weight"));
    Release(em, a->shared_gate);
  }
  em.Begin("moe.shared_experts.fc2_bwd", l);
  ctx.k.GemmWorkspace(false);
  TensorId g = ctx.k.SpGather(z.Hidden(d.T), LayerLabel(l, "moe.shared.d_fc2_gather"), false);
  const TensorId d_act = Tmp(em, d.act_bytes * d.T * z.Fs(), l, "moe.shared.d_act_out");
  ctx.k.WeightGradToAutograd(d.h, z.Fs(), ctx.f.te, LayerLabel(l, "moe.shared.fc2.wgrad"),
                             LayerLabel(l, "mlp.shared_experts.fc2.weight"));
  Release(em, g);
  Release(em, a->shared_act_out);
  if (d_out != dy) Release(em, d_out);
  em.Begin("moe.shared_experts.act_bwd", l);
  const TensorId d_fc1 = Tmp(em, d.act_bytes * d.T * d.gamma * z.Fs(), l, "moe.shared.d_fc1_out");
  Release(em, a->shared_fc1_out);
  Release(em, d_act);
  em.Begin("moe.shared_experts.fc1_bwd", l);
  g = ctx.k.SpGather(z.Hidden(d.T), LayerLabel(l, "moe.shared.fc1_input_gather"), false);
  TensorId d_in = ctx.k.ColumnParallelInputGrad(LayerLabel(l, "moe.shared.d_input"));
  ctx.k.WeightGradToAutograd(d.gamma * z.Fs(), d.h, ctx.f.te, LayerLabel(l, "moe.shared.fc1.wgrad"),
                             LayerLabel(l, "mlp.shared_experts.fc1.weight"));
  Release(em, g);
  Release(em, d_fc1);
  em.Flops(8.0 * d.T * d.h * d.gamma * z.Fs());
  if (d_gate_in != 0) d_in = SumGrads(ctx, z, l, d_in, d_gate_in);
  return d_in;
}
}  // namespace

MoeTokens ComputeMoeTokens(const ModelDims& d) {
  MoeTokens t;
  t.n = d.T / d.sigma;
  t.local_experts = d.experts / d.ep;
  const std::int64_t routed = t.n * d.topk;
  if (d.capacity_factor > 0) {
    // moe_utils.py get_capacity: ceil(tokens·k / E · factor).
    t.capacity = static_cast<std::int64_t>(
        std::ceil(static_cast<double>(routed) / d.experts * d.capacity_factor));
  }
  // All-gather: each rank sees every token of its TP×EP group, ~1/ep of them routed here.
  t.send = d.pad_to_capacity ? t.capacity * d.experts
           : t.capacity > 0  ? std::min(routed, t.capacity * d.experts)
                             : routed;
  if (d.pad_to_capacity) {
    // Padded: every source rank sends `capacity` tokens to each local expert.
    t.receive = t.capacity * t.local_experts * d.ep;
  } else {
    // The most loaded rank gets F × the mean (S), at most what the EP group can route to its
    // experts: every token of every rank, min(k, El) times; at most El·capacity per source.
    std::int64_t most = t.n * d.ep * std::min<std::int64_t>(d.topk, t.local_experts);
    if (t.capacity > 0) most = std::min(most, t.capacity * t.local_experts * d.ep);
    t.receive = std::min<std::int64_t>(
        most, static_cast<std::int64_t>(std::llround(d.imbalance * static_cast<double>(t.send))));
  }
  t.expert = t.receive * d.etp;
  return t;
}

void MoeModule::AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                             int layer, std::vector<ParamTensor>* out) const {
  if (!d.IsMoeLayer(layer)) {
    dense_.AppendParams(model, d, chunk, layer, out);
    return;
  }
  auto add = [&](const std::string& name, std::int64_t numel, bool one_dim, bool sp,
                 std::int64_t row, bool expert) {
    out->push_back(MakeParam(LayerLabel(layer, name), numel, row, chunk, layer, one_dim, sp));
    out->back().expert = expert;
  };
  // MoE layer spec: pre_mlp_layernorm (TENorm), then MoELayer.__init__: router (TopKRouter
  // weight [E, h], sequence_parallel set), experts, shared experts.
  add("ln2.weight", d.h, true, true, 1, false);
  if (d.layernorm) add("ln2.bias", d.h, true, true, 1, false);
  add("mlp.router.weight", std::int64_t{d.experts} * d.h, false, true, d.h, false);
  const int el = d.experts / d.ep;
  const std::int64_t fe = d.ffn_e / d.etp;
  // TEGroupedMLP: linear_fc1 (TEColumnParallelGroupedLinear, weight0..El-1 [γ·Fe, h]) then
  // linear_fc2 (weight0..El-1 [h, Fe]); SequentialMLP: expert by expert, fc1 and fc2.
  for (int pass = 0; pass < (d.grouped_gemm ? 2 : 1); ++pass) {
    for (int i = 0; i < el; ++i) {
      if (!d.grouped_gemm || pass == 0) {
        add(fmt::format("mlp.experts.{}.fc1.weight", i), d.gamma * fe * d.h, false, false, d.h,
            true);
      }
      if (!d.grouped_gemm || pass == 1) {
        add(fmt::format("mlp.experts.{}.fc2.weight", i), d.h * fe, false, false, fe, true);
      }
    }
  }
  if (d.ffn_shared > 0) {
    const std::int64_t fs = d.ffn_shared / d.t;
    add("mlp.shared_experts.fc1.weight", d.gamma * fs * d.h, false, false, d.h, false);
    add("mlp.shared_experts.fc2.weight", d.h * fs, false, false, fs, false);
    if (d.shared_gate) add("mlp.shared_experts.gate_weight", d.h, false, true, d.h, false);
  }
}

TensorId MoeModule::Forward(ModuleContext& ctx, int l, TensorId x, const ForwardMode& mode,
                            std::unique_ptr<ModuleSaved>* saved) {
  if (!ctx.d.IsMoeLayer(l)) return dense_.Forward(ctx, l, x, mode, saved);
  const Sizes z(ctx.d);
  MoeSaved a;
  a.attrs = &dispatcher_attrs_[l];
  // pre_mlp_layernorm, outside the MoE layer: with selective recompute of "moe" its output is
  // the input tensor_parallel.checkpoint keeps; the layer itself runs under no_grad.
  ctx.em.Begin("moe.ln", l);
  a.ln2 = NormForward(ctx, l, "ln2");
  const TensorId branch = RoutedBranch(ctx, z, l, mode.nograd || ctx.selective.moe, &a);
  if (mode.nograd) FreeNorm(ctx, a.ln2);
  const TensorId out = BiasDropoutAdd(ctx, l, kNames, x, branch, mode, &a.bda_mask);
  if (!mode.nograd) *saved = std::make_unique<MoeSaved>(a);
  return out;
}

TensorId MoeModule::Backward(ModuleContext& ctx, int l, ModuleSaved& saved, TensorId x, bool free_x,
                             TensorId dy, bool free_dy) {
  if (!ctx.d.IsMoeLayer(l)) return dense_.Backward(ctx, l, saved, x, free_x, dy, free_dy);
  const Sizes z(ctx.d);
  Emitter& em = ctx.em;
  MoeSaved a = static_cast<const MoeSaved&>(saved);
  const TensorId dbranch = BiasDropoutAddBackward(ctx, l, kNames, dy, a.bda_mask);
  // CheckpointFunction.backward (tensor_parallel/random.py): the layer re-run with grad; its
  // output stays referenced until the region's backward returns.
  TensorId recomputed = 0;
  if (ctx.selective.moe) {
    em.SetPrefix("recompute.");
    recomputed = RoutedBranch(ctx, z, l, false, &a);
    em.SetPrefix("");
  }
  // The branch grad feeds the routed path and the shared experts' (the shared add). Autograd's
  // engine runs the ready node of the highest sequence number first: before core 0.13 the shared
  // experts ran last in the forward (SharedAfterRouted), so their whole backward runs first and
  // their input grad [n, h] waits for the routed path's; memsim runs them last otherwise.
  const bool shared = ctx.d.ffn_shared > 0;
  const bool shared_first = shared && SharedAfterRouted(ctx.f);
  const TensorId d_shared_in = shared_first ? SharedBackward(ctx, z, l, dbranch, &a) : 0;
  TensorId d_unpermute_probs = 0;  // before core 0.13 (CombineBackward)
  const TensorId d_routed = CombineBackward(
      ctx, z, l, dbranch, (shared && !shared_first) || dbranch == dy, &a, &d_unpermute_probs);
  TensorId d_probs = 0;
  const TensorId d_tokens = ExpertsBackward(ctx, z, l, d_routed, &a, &d_probs);
  // Alltoall before 0.13: the dense probs' grad came from the unpermute; allgather: the local
  // probs' grad goes through the slice's and the gathers' backward (DispatchBackward).
  TensorId d_dense_probs = ctx.d.alltoall ? d_unpermute_probs : 0;
  if (!ctx.d.alltoall && d_probs == 0) d_probs = d_unpermute_probs;
  TensorId d_ln = DispatchBackward(ctx, z, l, d_tokens, d_probs, &a, &d_dense_probs);
  d_ln = SumGrads(ctx, z, l, d_ln, RouterBackward(ctx, z, l, d_dense_probs, &a));
  if (shared_first) {
    d_ln = SumGrads(ctx, z, l, d_ln, d_shared_in);
  } else if (shared) {
    d_ln = SumGrads(ctx, z, l, d_ln, SharedBackward(ctx, z, l, dbranch, &a));
    if (dbranch != dy) Release(em, dbranch);
  }
  Release(em, a.ln2.out);
  return NormAndResidualBackward(ctx, l, kNames, a.ln2, d_ln, x, free_x, dy, free_dy, recomputed);
}

}  // namespace memsim::workload
