// The dense MLP as a residual module of a transformer layer, Megatron-core's MLP
// (megatron/core/transformer/mlp.py): pre-MLP norm fused with fc1
// (TELayerNormColumnParallelLinear), the activation (GeLU, or SwiGLU over a [.., 2·ffn/t] fc1
// output for a gated MLP), fc2 (row-parallel), bias-dropout-add. Forward saves the norm
// statistics and output, fc1's output and the activation's output; with MindSpeed's
// --recompute-activation-function (module.h SelectiveRecompute::ActFnRecompute) not the
// activation's output, which is re-run in backward (mindspeed/core/memory/recompute/activation/
// activation_recompute_forward.py at 028de58). The MoE MLP's experts are modules/moe.h's.
#pragma once

#include "workload/modules/module.h"

namespace memsim::workload {

class MlpModule final : public LayerModule {
 public:
  void AppendParams(const config::ModelConfig& model, const ModelDims& d, int chunk, int layer,
                    std::vector<ParamTensor>* out) const override;
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                   std::unique_ptr<ModuleSaved>* saved) override;
  TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy) override;
};

}  // namespace memsim::workload
