// workload::Build: Setup + pipeline rank -> Program, the allocation stream of one rank of a dense
// GPT/LLaMA/Qwen-style decoder trained Megatron-style (Megatron-core + Transformer Engine
// semantics), over init (iteration 0) and setup.training.train_iters iterations. All policy
// lives here; the rules and their sources are in shared/reference/workload.md (cited "§N"), and
// in comments next to the code that applies them. Pure and deterministic: no I/O, no clocks;
// equal Setups give equal Programs. Not modelled: MoE, ZeRO-2/3, FSDP, CP communication,
// checkpoint resume, attention-mask tensors (assumes --no-create-attention-mask-in-dataloader),
// RoPE output copies (§2.2 A4', unverified), and memory outside the caching allocator (device/).
//
// Conventions of the Program (see program.h for op semantics):
// - Every tensor is one TensorAlloc; labels follow §2.2 ("layer3.attn.qkv", "layer3.ln1.rstd",
//   "layer3.mlp.residual" = the layer's output, i.e. the next layer's A1).
// - Categories: saved activations and input data kActivations; per-op transients and activation
//   gradients kTemporaries; weight-gradient transients (embedding dense grad, norm/bias grads)
//   and DDP grad buffers kGradients; P2P recv buffers kCommunication; cuBLAS/TE workspaces and the
//   GlobalMemoryBuffer "mpu" kWorkspace; optimizer scalars kOther.
// - Streams: TP collectives run inside the compute op that needs them (stream 0); P2P transfers,
//   DP grad reduce-scatter / all-reduce and the distributed optimizer's param all-gather are ops
//   on stream 1. P2P tensors are record_stream'ed on stream 1 (ProcessGroupNCCL), so their frees
//   wait for the transfer; a receive is followed by a synchronizing wait.
// - 1F1B exchanges follow Megatron's loop: send_forward_recv_backward allocates the next grad
//   buffer before the output is deallocated; the previous output_tensor_grad and
//   input_tensor_grad stay bound to Python locals until the next receive / backward (the last
//   ones until the schedule returns, after finalize_model_grads). Each model chunk that receives
//   its input keeps the last one, and the grad retained on it, until its next forward
//   (TransformerBlock.set_input_tensor, backward_step's retain_grad): they outlive the iteration.
// - cuBLAS workspaces: one for the main thread's GEMMs, one for the autograd thread's (backward,
//   recompute included); Transformer Engine's is shared.
// - Weight grads handed to autograd (gradient_accumulation_fusion, the two version keys):
//   fresh tensors freed in the same backward step, or Transformer Engine's cached dummies
//   (get_dummy_wgrad, one per weight shape, kWorkspace, made at first use); model.cc.
// - Assumed Megatron flags: deallocate_pipeline_outputs, no overlap_p2p_comm, no
//   --overlap-param-gather (the param all-gather is emitted at the end of the step); unfused
//   attention = Megatron-core `DotProductAttention` (use_flash_attn false, any
//   transformer_impl); distributed optimizer shards over d·cp; memsim simulates data-parallel
//   rank 0.
// - Durations: roofline max(flops / (peak · 0.5), bytes / (bandwidth · 0.8)) with the device
//   preset's peak and bandwidth; 0.5 and 0.8 are estimates of achieved efficiency (typical
//   large-GEMM MFU and streaming-kernel bandwidth). Collectives: bus bytes over an estimated link
//   bandwidth (TP 100 GB/s, others 20 GB/s) plus 10 us latency. Times shape the x-axis only.
#pragma once

#include <cstdint>

#include "config/setup.h"
#include "core/units.h"
#include "workload/program.h"

namespace memsim::workload {

// REQUIRES: a validated Setup (config/), 0 <= pipeline_rank < pipeline_model_parallel_size.
Program Build(const config::Setup& setup, int pipeline_rank);

// The steady-state static sizes of one rank (after the first optimizer step), from the same
// parameter list and buffer layout Build uses. Closed forms per parameter (§1.2 table,
// Megatron docs/source/distrib_optimizer.md): bf16 18 B non-distributed, 6 + 12/d distributed
// (plus §1.3 padding), fp32 16 B (8 + 8/d distributed).
struct StaticSizes {
  std::int64_t parameter_count = 0;   // Ψ: parameters held by this rank (unpadded)
  std::int64_t main_param_count = 0;  // elements the optimizer updates (Ψ or its 1/d shard)
  Bytes parameter_bytes = 0;          // model params (the padded param buffer with dist-opt)
  Bytes gradient_bytes = 0;           // DDP grad buffers (padded)
  Bytes main_param_bytes = 0;         // fp32 master copies (full, or shards); 0 for fp32
  Bytes optimizer_state_bytes = 0;    // Adam exp_avg + exp_avg_sq (8 B/elem), SGD momentum (4)
  // fp32 grad copies made at each step for 16-bit grads (fp16 without
  // accumulate_allreduce_grads_in_fp32), alive from step to the next zero_grad (§1.6 step 2).
  Bytes main_grad_copy_bytes = 0;
  Bytes total_bytes() const {
    return parameter_bytes + gradient_bytes + main_param_bytes + optimizer_state_bytes +
           main_grad_copy_bytes;
  }
};
StaticSizes ComputeStaticSizes(const config::Setup& setup, int pipeline_rank);

// Megatron's closed-form estimate for this rank, shown next to the simulation. Sources:
// Megatron-LM `megatron/training/theoretical_memory_usage.py`
// (`compute_weight_and_optimizer_memory`, `compute_activation_memory`), Korthikanti et al. 2022
// (arXiv 2205.05198) Table 2 and §4. Deviations from Megatron's code, for this rank rather than the
// most loaded one: the parameter count uses this rank's layers and embeddings; the per-layer
// activation term follows the configuration (SP or not, flash/selective or the 5·a·s/h term,
// 6·ffn/h for a gated MLP, no dropout masks when dropout is 0, full recompute 2·s·b·h/σ per layer);
// the output layer and loss term 4·s·b·h·(1 + V/h)/t is counted on the last stage for any p.
struct ClosedFormEstimate {
  double parameters_on_rank = 0;   // Ψ by the formula
  double bytes_per_parameter = 0;  // 18, 6 + 12/d, 16, 8 + 8/d, 20, 4 + 16/d
  Bytes weight_and_optimizer_bytes = 0;
  Bytes activation_bytes_per_layer = 0;  // one layer, one micro-batch
  int in_flight_micro_batches = 1;       // min(p - r, m); interleaved: ·(1 + (p-1)/(p·v))
  Bytes activation_bytes = 0;            // all in-flight layers + embedding / output extras
  Bytes total_bytes = 0;
};
ClosedFormEstimate ComputeClosedFormEstimate(const config::Setup& setup, int pipeline_rank);

}  // namespace memsim::workload
