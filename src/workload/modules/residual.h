// The pieces every pre-norm residual module of a transformer layer shares: the norm in front of
// the branch (fused into the first linear under Transformer Engine:
// TELayerNormColumnParallelLinear), the bias-dropout-add that closes the branch
// (megatron/core/fusions/fused_bias_dropout.py), and their backward with the residual sum that
// autograd makes of the two gradient paths. Shapes: [s/σ, b, h] per rank (σ = TP with sequence
// parallelism), norm statistics fp32 [s/σ, b].
#pragma once

#include <array>
#include <string>

#include "workload/modules/module.h"

namespace memsim::workload {

// The names of one residual module's tensors and ops.
struct ResidualNames {
  const char* prefix;          // "attn" / "mlp": ops "<prefix>.bda", "<prefix>.<norm>_bwd"
  const char* norm;            // "ln1" / "ln2": labels "<norm>.rstd", "<prefix>.d_<norm>_in"
  const char* branch_out;      // "proj" / "fc2": the bda-backward grad "<prefix>.d_<branch>_out"
  const char* output;          // label of the module output ("attn.residual", "mlp.residual")
  const char* residual_op;     // op of the residual sum in backward ("residual_bwd")
  const char* residual_label;  // its gradient's label ("d_input")
};

// Saved statistics and output of a norm (mean only for LayerNorm). The output is wide_bytes
// (model.h: fp32 for BERT under autocast); casts: its autocast copies (cast_inputs only).
struct NormSaved {
  TensorId mean = 0, rstd = 0, out = 0;
  std::array<TensorId, 3> casts{};
};

// Allocates the norm's saved tensors in the open op.
NormSaved NormForward(ModuleContext& ctx, int layer, const char* norm);
// Frees them (nograd forward).
void FreeNorm(ModuleContext& ctx, const NormSaved& n);

// Autocast copies of a wide norm output (ModelDims::cast_inputs; a no-op otherwise): each of the
// `consumers` (≤ 3) nn.Linear that read it casts it afresh to act_bytes and saves its copy
// (aten/src/ATen/autocast_mode.h cached_cast caches leaf weights only). !saved: freed at once.
void CastNormOutput(ModuleContext& ctx, int layer, const char* norm, int consumers, bool saved,
                    NormSaved* n);
// cast_inputs: once the module's residual sum exists the wide output has no user left (the
// linears saved their copies; LayerNorm's backward reads its input, not its output): freed.
void ReleaseCastNormOutput(ModuleContext& ctx, NormSaved* n);
// cast_inputs: the copies' input grads return through ToCopyBackward in the wide dtype; returns
// the wide grad of the norm output and frees dcopy and the copies. Else returns dcopy.
TensorId NormOutputGrad(ModuleContext& ctx, int layer, const char* norm, TensorId dcopy,
                        NormSaved* n);

// Selective recompute of "layernorm" (a norm that is its own module, Megatron's local spec;
// transformer_layer.py with CheckpointWithoutOutput, tensor_parallel/random.py): the norm's
// output is discarded once the module's branch ran (its storage resized to 0), and made again
// just before the branch's backward needs it, when the branch output's gradient arrives. The
// statistics are modelled as without recompute.
void DiscardNormOutput(ModuleContext& ctx, NormSaved* norm);
void RecomputeNormOutput(ModuleContext& ctx, int layer, const char* norm, NormSaved* saved);

// Bias-dropout-add: a dropout mask (hidden dropout only) and the new residual; frees the branch
// output, the mask with nograd, and the module input when mode.free_input. Returns the output;
// *mask the saved mask (0 if none or freed).
TensorId BiasDropoutAdd(ModuleContext& ctx, int layer, const ResidualNames& names, TensorId x,
                        TensorId branch_out, const ForwardMode& mode, TensorId* mask);
// Its backward: the dropout grad (a new tensor when there is a mask) of dy. Frees the mask.
TensorId BiasDropoutAddBackward(ModuleContext& ctx, int layer, const ResidualNames& names,
                                TensorId dy, TensorId mask);
// The norm's backward (input grad and weight grads; frees d_norm_out, the statistics, x if
// free_x, and region_out: the output of a recomputed region that ends with the norm), then the
// residual sum of that grad and dy (frees dy if free_dy). Returns dx.
TensorId NormAndResidualBackward(ModuleContext& ctx, int layer, const ResidualNames& names,
                                 const NormSaved& norm, TensorId d_norm_out, TensorId x,
                                 bool free_x, TensorId dy, bool free_dy, TensorId region_out = 0);

}  // namespace memsim::workload
