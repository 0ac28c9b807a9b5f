// The MoE MLP of a transformer layer as Megatron-core runs it on one rank
// (megatron/core/transformer/moe/): a residual module whose branch is the pre-MLP norm (its own
// TENorm in the MoE layer spec, gpt_layer_specs.py), the router (router.py TopKRouter), the token
// dispatcher (token_dispatcher.py MoEAlltoAllTokenDispatcher or MoEAllGatherTokenDispatcher), the
// local experts (experts.py TEGroupedMLP with moe_grouped_gemm, else SequentialMLP), the
// combine, and the shared experts (shared_experts.py SharedExpertMLP). Dense layers of a MoE
// model (moe_layer_freq, HF mlp_only_layers / decoder_sparse_step) run the dense MlpModule.
//
// Shapes per rank, B_a bytes per activation element:
//   n = T/σ local tokens ([s/σ, b, h] flattened);
//   S = tokens this rank sends to experts (permuted copies): n·k dropless, E·capacity with
//       padding to capacity (capacity = ceil(n·k/E · factor), moe_utils.py get_capacity);
//   N = tokens the rank's local experts process: S·etp under balanced routing, F·S·etp with the
//       imbalance factor F (the most loaded rank), at most what all EP ranks can send; fixed at
//       El·capacity·ep·etp with padding to capacity, where F has no effect.
// Selective recompute: "moe" re-runs the whole branch in backward (moe_layer.py,
// tensor_parallel.checkpoint); "moe_act" discards the expert activation's output after fc2 and
// recomputes it before fc2's backward (experts.py, CheckpointWithoutOutput).
// Not modelled: z-loss (moe_z_loss_coeff), input jitter, the flex / DeepEP dispatchers,
// shared-expert overlap, fp8 padding, router fp32/fp64 dtype (moe_router_dtype), token-drop
// policy differences (capacity without padding keeps min(n·k, E·capacity) tokens), the
// dispatchers' tiny per-rank split counts (input_splits, output_splits,
// num_global_tokens_per_local_expert: [ep]- and [E]-sized, moved to the host). The forward's token
// tensors live as long as the Python locals of MoELayer.forward hold them
// (FrameworkFacts::moe_forward_locals, moe.cc); the dispatcher's attributes (self.probs,
// self.routing_map, the permutation map; allgather's local map and probs) until the layer's next
// forward rebinds them (MoeModule::dispatcher_attrs_). Before core 0.13 the probs weight the
// experts' output in token_unpermutation (no probs travel with the tokens; the weighting saves
// its factors) and the shared experts run after the unpermute and backward first (moe.cc
// SharedAfterRouted); from 0.13 memsim runs them before the router and backward last.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "workload/modules/mlp.h"
#include "workload/modules/module.h"

namespace memsim::workload {

// Token counts of one MoE layer's forward on this rank (above).
struct MoeTokens {
  std::int64_t n = 0;         // local tokens
  std::int64_t send = 0;      // S: permuted tokens sent (alltoall) / local tokens gathered
  std::int64_t receive = 0;   // tokens received by the EP exchange, before the ETP gather
  std::int64_t expert = 0;    // N: tokens through the local experts
  std::int64_t capacity = 0;  // per expert; 0 when dropless
  int local_experts = 0;      // E / ep
};
MoeTokens ComputeMoeTokens(const ModelDims& d);

// A tensor bound to a token dispatcher's attribute; `saved`: autograd (or a no-grad forward's
// local) holds it too.
struct DispatcherAttr {
  TensorId id = 0;
  bool saved = false;
};
using DispatcherAttrs = std::vector<DispatcherAttr>;

class MoeModule final : public LayerModule {
 public:
  void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk, int layer,
                    std::vector<ParamTensor>* out) const override;
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                   std::unique_ptr<ModuleSaved>* saved) override;
  TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy) override;

 private:
  MlpModule dense_;  // the layers that are not MoE layers
  // Per MoE layer (global index): the tensors its token dispatcher's attributes hold after its
  // last forward (token_dispatcher.py MoEAlltoAllTokenDispatcher: self.probs [n, E],
  // self.routing_map [n, E] bool, self.reversed_local_input_permutation_mapping [S] int64;
  // MoEAllGatherTokenDispatcher: self.local_map, self.local_probs and the mapping), freed when
  // the layer's next forward rebinds them (moe.cc RebindAttrs).
  std::map<int, DispatcherAttrs> dispatcher_attrs_;
};

}  // namespace memsim::workload
