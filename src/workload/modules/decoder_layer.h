// DecoderLayer: a transformer layer as a sequence of residual modules (module.h), each taking
// the previous one's output: Megatron-core's TransformerLayer (attention, then MLP; an expert
// MLP takes the MLP's place in a MoE layer). The layer keeps each module's input and saved
// tensors for backward; module k's input is module k-1's output, so only the layer input
// belongs to the caller.
#pragma once

#include <memory>
#include <vector>

#include "workload/modules/module.h"

namespace memsim::workload {

class DecoderLayer {
 public:
  // REQUIRES: at least one module.
  explicit DecoderLayer(std::vector<std::unique_ptr<LayerModule>> modules);
  // Megatron-core's dense GPT layer: AttentionModule then MlpModule.
  static DecoderLayer Dense();
  // The layer of `model`: Dense(), or attention (multi-latent attention, modules/mla.h, when
  // the model has it) then the MoE MLP (modules/moe.h; its dense layers run the dense MLP) when
  // the model has experts, else the dense MLP.
  static DecoderLayer ForModel(const config::ModelConfig& model);
  // The layer `setup` runs: Transformers' decoder modules (hf_decoder.h) under framework
  // "hf-trainer" for a Llama-style decoder, else ForModel(setup.model).
  static DecoderLayer ForSetup(const config::Setup& setup);

  // What one layer's forward saved: each module's input and saved tensors.
  struct Saved {
    std::vector<TensorId> inputs;
    std::vector<std::unique_ptr<ModuleSaved>> modules;
  };

  void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk, int layer,
                    std::vector<ParamTensor>* out) const;
  // Forward of layer `layer` on x; returns its output. nograd: inside a full-recompute
  // checkpoint (nothing saved; free_input drops x when the layer returns, as its caller rebinds).
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, bool nograd, bool free_input,
                   Saved* saved);
  // Backward with dy the grad of the output; frees the saved tensors, the layer input x if
  // free_x, dy if free_dy; returns the grad of x.
  TensorId Backward(ModuleContext& ctx, int layer, Saved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy);

 private:
  std::vector<std::unique_ptr<LayerModule>> modules_;
};

}  // namespace memsim::workload
