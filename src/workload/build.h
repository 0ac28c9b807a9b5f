// workload::Build: Setup + pipeline rank -> Program, the allocation stream of one rank over init
// (iteration 0) and setup.training.train_iters iterations, as the Setup's stack runs it
// (config/stack.h: its wrapper and training loop): Megatron-core (Transformer Engine or local
// layers, dense or mixture-of-experts) with its DDP, distributed optimizer or Megatron-FSDP; a
// plain PyTorch loop on one device or under DistributedDataParallel; the Hugging Face Trainer
// with PEFT over Transformers' decoder and encoder layers. All policy lives in workload/
// (docs/architecture.md, "workload/: the generator as composable parts"), each rule next to the
// code that applies it with its upstream source; docs/training-memory.md collects the facts.
// Pure and deterministic: no I/O, no clocks; equal Setups give equal Programs. Not modelled:
// ZeRO-2/3 outside Megatron-FSDP and Megatron-FSDP's optim_grads_params, checkpoint resume, the
// context-parallel ring's receive buffers and per-step saved tensors (only its "cp" communicator
// is), RoPE output copies (docs/training-memory.md, 'Saved tensors of a layer', A4':
// unverified), and memory outside the caching allocator (device/).
//
// Conventions of the Program (see program.h for op semantics):
// - Every tensor is one TensorAlloc; labels name the module ("layer3.attn.qkv",
//   "layer3.ln1.rstd", "layer3.mlp.residual" = the layer's output, the next layer's input).
// - Categories: saved activations and input data kActivations; per-op transients and activation
//   gradients kTemporaries; weight-gradient transients (embedding dense grad, norm/bias grads),
//   wrapper grad buffers and plain PyTorch's .grad tensors kGradients; P2P recv buffers
//   kCommunication; cuBLAS/TE workspaces and the GlobalMemoryBuffer "mpu" kWorkspace; optimizer
//   scalars kOther.
// - Streams: TP collectives run inside the compute op that needs them (stream 0); P2P transfers,
//   DP grad reduce-scatter / all-reduce and the distributed optimizer's param all-gather are ops
//   on stream 1 (pipeline.h, ddp.cc, megatron_fsdp.cc).
// - Assumed Megatron flags: deallocate_pipeline_outputs, no overlap_p2p_comm, no
//   --overlap-param-gather (the param all-gather is emitted at the end of the step); unfused
//   attention = Megatron-core `DotProductAttention` (use_flash_attn false, any
//   transformer_impl); distributed optimizer shards over d·cp; memsim simulates data-parallel
//   rank 0.
// - Durations: emitter.h (a roofline estimate; times shape the x-axis only).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "config/setup.h"
#include "core/units.h"
#include "workload/data_parallel.h"
#include "workload/modules/decoder_layer.h"
#include "workload/program.h"

namespace memsim::workload {

// REQUIRES: a validated Setup (config/), 0 <= pipeline_rank < pipeline_model_parallel_size.
Program Build(const config::Setup& setup, int pipeline_rank);

// Parts that replace the ones the Setup implies (tests use small fakes); empty = the Setup's.
struct BuildParts {
  // The data-parallel wrapper, given the rank's dims and parameters (both outlive it).
  std::function<std::unique_ptr<DataParallel>(const ModelDims&, const RankParams&)> data_parallel;
  // The transformer layer.
  std::function<DecoderLayer()> layer;
};
Program BuildWith(const config::Setup& setup, int pipeline_rank, const BuildParts& parts);

// The ops of Build(setup, pipeline_rank), handed to `sink` one at a time in issue order as they
// are generated, none kept: memory does not grow with micro-batches or iterations (what the
// engine's Simulation consumes). Same REQUIRES as Build.
void BuildInto(const config::Setup& setup, int pipeline_rank, OpSink& sink);

// The steady-state static sizes of one rank (after the first optimizer step), from the same
// parameter list and buffer layout Build uses. Closed forms per parameter
// (docs/training-memory.md, 'Precision and bytes per parameter';
// Megatron docs/source/distrib_optimizer.md): bf16 18 B non-distributed, 6 + 12/d distributed
// (plus the buffer padding), fp32 16 B (8 + 8/d distributed).
// Which mechanism keeps memory on the host (StaticSizes::host).
enum class HostMemory { kNone, kSwapOptimizer, kZeroOffload };

struct StaticSizes {
  std::int64_t parameter_count = 0;   // Ψ: parameters held by this rank (unpadded)
  std::int64_t main_param_count = 0;  // elements the optimizer updates (Ψ or its 1/d shard)
  // Elements with requires_grad (PEFT's print_trainable_parameters "trainable params"); = Ψ
  // without PEFT.
  std::int64_t trainable_parameter_count = 0;
  Bytes parameter_bytes = 0;          // model params (the padded param buffer with dist-opt)
  Bytes gradient_bytes = 0;           // DDP grad buffers (padded)
  Bytes main_param_bytes = 0;         // fp32 master copies (full, or shards); 0 for fp32
  Bytes optimizer_state_bytes = 0;    // Adam exp_avg + exp_avg_sq (8 B/elem), SGD momentum (4)
  // A paged bitsandbytes optimizer's state in CUDA unified memory (optimizer.h BnbStateBytes):
  // outside the caching allocator, so not in total_bytes.
  Bytes managed_optimizer_state_bytes = 0;
  // fp32 grad copies made at each step for 16-bit grads (fp16 without
  // accumulate_allreduce_grads_in_fp32), alive from step to the next zero_grad
  // (docs/training-memory.md, 'What the optimizer step allocates', item 2).
  Bytes main_grad_copy_bytes = 0;
  // Pinned host memory the rank keeps (not device memory, not in total_bytes): MindSpeed
  // --swap-optimizer's fp32 main parameters and Adam moments, 12 B per shard element
  // (swap_optimizer.py create_tensor_maps, init_param_opt_state: `torch.empty_like(main_param,
  // pin_memory=True, device='cpu')` for the parameter, exp_avg and exp_avg_sq). Their device
  // copies exist only during the step, so main_param_bytes and optimizer_state_bytes are 0.
  Bytes host_pinned_bytes = 0;
  // DeepSpeed ZeRO's offload_optimizer cpu (deepspeed_zero.cc StaticSizes): the fp32 partition
  // (pinned), its fp32 gradient and the host gradient buffers (pinned with pin_memory, else
  // pageable), and the optimizer's state over the partition (pageable: zeros_like of a host
  // tensor), host_optimizer_count elements.
  Bytes host_pageable_bytes = 0;
  std::int64_t host_optimizer_count = 0;
  bool host_buffers_pinned = false;  // offload_optimizer.pin_memory: gradient and buffers pinned
  // The wrapper's own words for the two kinds (WrapperSizes; DeepSpeed ZeRO-3), else empty.
  std::string host_pinned_what;
  std::string host_pageable_what;
  HostMemory host = HostMemory::kNone;  // what the host bytes are, for the report
  Bytes total_bytes() const {
    return parameter_bytes + gradient_bytes + main_param_bytes + optimizer_state_bytes +
           main_grad_copy_bytes;
  }
};
StaticSizes ComputeStaticSizes(const config::Setup& setup, int pipeline_rank);

// The model's parameters, all of them once (the model built with every parallel size 1, EP and
// expert TP included, so the vocabulary is padded as at TP 1 and a MoE layer holds all its
// experts; tied embeddings counted once), with PEFT's adapters
// (get_peft_model's model) and, of them, those with requires_grad (PEFT's
// print_trainable_parameters "trainable params / all params"). For the run header; the
// parameters of one rank are ComputeStaticSizes(...).parameter_count.
struct ParameterCounts {
  std::int64_t total = 0;
  std::int64_t trainable = 0;
};
ParameterCounts TotalParameterCounts(const config::Setup& setup);

// Megatron's closed-form estimate for this rank, shown next to the simulation. Sources:
// Megatron-LM `megatron/training/theoretical_memory_usage.py`
// (`compute_weight_and_optimizer_memory`, `compute_activation_memory`), Korthikanti et al. 2022
// (arXiv 2205.05198) Table 2 and their §4. Deviations from Megatron's code, for this rank rather
// than the most loaded one: the parameter count uses this rank's layers and embeddings; the
// per-layer activation term follows the configuration (SP or not, flash/selective or the 5·a·s/h
// term, 6·ffn/h for a gated MLP, no dropout masks when dropout is 0, full recompute 2·s·b·h/σ per
// layer); the output layer and loss term 4·s·b·h·(1 + V/h)/t is counted on the last stage for any
// p.
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
