#include "workload/modules/decoder_layer.h"

#include "core/check.h"
#include "workload/modules/attention.h"
#include "workload/modules/hf_decoder.h"
#include "workload/modules/mla.h"
#include "workload/modules/mlp.h"
#include "workload/modules/moe.h"

namespace memsim::workload {

DecoderLayer::DecoderLayer(std::vector<std::unique_ptr<LayerModule>> modules)
    : modules_(std::move(modules)) {
  MEMSIM_CHECK(!modules_.empty());
}

DecoderLayer DecoderLayer::Dense() {
  std::vector<std::unique_ptr<LayerModule>> modules;
  modules.push_back(std::make_unique<AttentionModule>());
  modules.push_back(std::make_unique<MlpModule>());
  return DecoderLayer(std::move(modules));
}

DecoderLayer DecoderLayer::ForModel(const config::ModelConfig& model) {
  if (model.num_experts <= 1 && !model.multi_latent_attention) return Dense();
  std::vector<std::unique_ptr<LayerModule>> modules;
  if (model.multi_latent_attention) {
    modules.push_back(std::make_unique<MlaAttentionModule>());
  } else {
    modules.push_back(std::make_unique<AttentionModule>());
  }
  if (model.num_experts > 1) {
    modules.push_back(std::make_unique<MoeModule>());
  } else {
    modules.push_back(std::make_unique<MlpModule>());
  }
  return DecoderLayer(std::move(modules));
}

DecoderLayer DecoderLayer::ForSetup(const config::Setup& setup) {
  if (!UsesHfDecoder(setup)) return ForModel(setup.model);
  std::vector<std::unique_ptr<LayerModule>> modules;
  modules.push_back(std::make_unique<HfAttentionModule>());
  modules.push_back(std::make_unique<HfMlpModule>());
  return DecoderLayer(std::move(modules));
}

void DecoderLayer::AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk,
                                int layer, std::vector<ParamTensor>* out) const {
  for (const auto& m : modules_) m->AppendParams(model, d, chunk, layer, out);
}

TensorId DecoderLayer::Forward(ModuleContext& ctx, int layer, TensorId x, bool nograd,
                               bool free_input, Saved* saved) {
  const std::size_t n = modules_.size();
  saved->inputs.assign(n, 0);
  saved->modules.clear();
  saved->modules.resize(n);
  // Without grad (inside a checkpoint, or evaluation) nothing saves a module's input, but the
  // layer's Python frames hold each until the layer returns: the caller's `hidden_states`
  // (Megatron-core TransformerBlock's layer loop, transformers LlamaModel.forward's loop) holds
  // the layer input; TransformerLayer.forward's `hidden_states` holds the attention output
  // while _forward_mlp runs (megatron/core/transformer/transformer_layer.py at d98e8a64dd), as
  // LlamaDecoderLayer.forward's `residual` does through the MLP's residual add (transformers
  // modeling_llama.py). So every module input goes when the layer returns, the checkpoint's
  // first layer input excepted (the checkpoint keeps it).
  for (std::size_t k = 0; k < n; ++k) {
    const ForwardMode mode{nograd, /*free_input=*/false};
    saved->inputs[k] = x;
    x = modules_[k]->Forward(ctx, layer, x, mode, &saved->modules[k]);
  }
  if (nograd) {
    for (std::size_t k = free_input ? 0 : 1; k < n; ++k) ctx.em.Free(saved->inputs[k]);
  }
  return x;
}

TensorId DecoderLayer::Backward(ModuleContext& ctx, int layer, Saved& saved, TensorId x,
                                bool free_x, TensorId dy, bool free_dy) {
  const std::size_t n = modules_.size();
  MEMSIM_CHECK(saved.modules.size() == n && saved.inputs.size() == n && saved.inputs[0] == x);
  for (std::size_t k = n; k-- > 0;) {
    MEMSIM_CHECK(saved.modules[k] != nullptr);
    // Inputs of later modules are the layer's own; the gradient coming in from above belongs
    // to the caller only for the last module.
    dy = modules_[k]->Backward(ctx, layer, *saved.modules[k], saved.inputs[k], k > 0 || free_x, dy,
                               k + 1 < n || free_dy);
  }
  saved.modules.clear();
  return dy;
}

}  // namespace memsim::workload
