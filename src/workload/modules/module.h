// LayerModule: one module of a transformer layer (attention, the dense MLP or the MoE MLP), as
// the framework runs it on one rank. A module says which parameters it registers (shapes and shard
// rules), what its forward allocates and what it saves for backward, and what its backward
// allocates and frees. A decoder layer (decoder_layer.h) is a sequence of such modules, each
// taking the previous one's output as its input (a pre-norm residual block: norm, branch,
// bias-dropout-add with the input).
//
// Ownership: a module's forward returns the layer input's successor (its output, owned by the
// next module or the caller) and fills a ModuleSaved it owns the meaning of; its backward takes
// that back, frees every saved tensor, and returns the gradient of its input. All allocations
// go through ModuleContext::em. Sizes in bytes; shapes per rank (TP-split where the framework
// splits them).
#pragma once

#include <memory>
#include <vector>

#include "config/setup.h"
#include "workload/emitter.h"
#include "workload/facts.h"
#include "workload/kernels.h"
#include "workload/model.h"

namespace memsim::workload {

// What Megatron's selective recompute (--recompute-modules) re-runs in backward instead of
// saving (megatron/core/transformer/transformer_layer.py, TransformerLayer.__init__ and
// _forward_attention / _forward_mlp).
struct SelectiveRecompute {
  bool core_attn = false;  // core attention (also: recompute_granularity "selective" alone)
  bool mlp = false;        // the whole MLP, its norm included when fused into fc1
  bool layernorm = false;  // a norm that is its own module (not fused into the next linear)
  bool moe = false;        // the whole MoE branch (modules/moe.h)
  bool moe_act = false;    // the routed experts' activation (modules/moe.h)
  // MindSpeed --recompute-activation-function (modules/mlp.h): the dense MLP's activation
  // output is recomputed in the layers whose index within their model chunk is in
  // [act_fn_from, act_fn_to) (recompute.h SelectiveModules).
  int act_fn_from = 0, act_fn_to = 0;
  bool ActFnRecompute(int index_in_chunk) const {
    return index_in_chunk >= act_fn_from && index_in_chunk < act_fn_to;
  }
};

// What a module's forward and backward run under.
struct ModuleContext {
  const config::ModelConfig& model;
  const ModelDims& d;
  const FrameworkFacts& f;
  Emitter& em;
  Kernels& k;
  SelectiveRecompute selective;
  // What the model's output object holds until the caller drops it (Trainer.compute_loss returns,
  // modules/output_loss.cc): each tensor with one Emitter reference for this list, released by
  // the loss. nullptr: nothing is kept there (the evaluation pass; the module harness unless a
  // test asks). Filled by HfAttentionModule with the DynamicCache's k and v
  // (FrameworkFacts::hf_kv_cache).
  std::vector<TensorId>* output_held = nullptr;
};

struct ForwardMode {
  bool nograd = false;      // inside a full-recompute checkpoint (torch.no_grad): nothing saved
  bool free_input = false;  // drop the input after its last use (only with nograd)
};

// A module's saved tensors; each module defines its own subclass.
struct ModuleSaved {
  virtual ~ModuleSaved() = default;
};

class LayerModule {
 public:
  virtual ~LayerModule() = default;
  // Appends this module's parameters of layer `layer` (global index) in model chunk `chunk`, in
  // construction order.
  virtual void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                            int layer, std::vector<ParamTensor>* out) const = 0;
  // Forward of layer `layer` on input x; returns the output. With mode.nograd, *saved is left
  // empty and every internal tensor is freed after its last use.
  virtual TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                           std::unique_ptr<ModuleSaved>* saved) = 0;
  // Backward given the gradient dy of the output; frees what Forward saved, x if free_x and dy
  // if free_dy; returns the gradient of x.
  virtual TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x,
                            bool free_x, TensorId dy, bool free_dy) = 0;
};

}  // namespace memsim::workload
