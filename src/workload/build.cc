// The composition root of workload/: picks the parts one rank's Program is made of and runs
// the framework's training loop over them (build.h).
#include "workload/build.h"

#include <optional>

#include "config/stack.h"

#include "workload/data_parallel.h"
#include "workload/emitter.h"
#include "workload/evaluation.h"
#include "workload/hf_peft.h"
#include "workload/kernels.h"
#include "workload/modules/decoder_layer.h"
#include "workload/modules/hf_decoder.h"
#include "workload/optimizer.h"
#include "workload/pipeline.h"
#include "workload/recompute.h"
#include "workload/schedule.h"
#include "workload/stage_runner.h"
#include "workload/training_loop.h"

namespace memsim::workload {
namespace {

// The optimizer's param groups: Megatron's (weight decay or not, model.h ParamGroups), or the
// single group of torch.optim.AdamW(model.parameters()) in a plain PyTorch loop.
// With PEFT (hf_peft.h) the list is get_peft_model's and the optimizer gets the trainable
// parameters only (Trainer.create_optimizer: those with requires_grad).
RankParams MakeRankParams(const config::Setup& setup, int rank, const DecoderLayer& layer,
                          PeftKernels* peft) {
  RankParams rp;
  rp.params = StageParams(setup, rank, layer);
  if (UsesPeft(setup.training)) {
    rp.params = ApplyPeft(setup, ComputeDims(setup), std::move(rp.params), peft);
  }
  rp.groups = config::StackOf(setup.training).ParamGroups(rp.params);
  return rp;
}

// Build's work; the ops go to `sink` when given, else into the returned Program.
Program Generate(const config::Setup& setup, int pipeline_rank, const BuildParts& parts,
                 OpSink* sink) {
  // Not const: with varying data lengths `shapes` sets its s and T before each step.
  ModelDims d = ComputeDims(setup);
  const FrameworkFacts f = ComputeFacts(setup, d);
  DecoderLayer layer = parts.layer ? parts.layer() : DecoderLayer::ForSetup(setup);
  PeftKernels peft;
  const RankParams params = MakeRankParams(setup, pipeline_rank, layer, &peft);
  const int iterations = setup.training.train_iters;
  Emitter em(setup, pipeline_rank, iterations, sink);
  std::unique_ptr<DataParallel> dp = parts.data_parallel
                                         ? parts.data_parallel(d, params)
                                         : NewDataParallel(setup, pipeline_rank, d, params);
  Kernels kernels(em, d, f, *dp);
  if (peft.Active()) kernels.SetPeft(&peft);
  std::vector<TensorId> output_held;
  ModuleContext ctx{setup.model, d,      f, em, kernels, SelectiveModules(setup.training, f.te),
                    &output_held};
  PipelineExchange exchange(em, d);
  StageRunner runner(ctx, setup.training, pipeline_rank, layer, *dp, exchange);
  const std::vector<ScheduleStep> steps = PipelineSchedule(d.p, pipeline_rank, d.m, d.v);
  LoopParts loop_parts{setup, d, f, params, em, *dp, runner, exchange, steps};
  std::optional<BatchShapes> shapes;
  if (setup.training.data.Varies()) loop_parts.shapes = &shapes.emplace(setup.training, d);
  // The Trainer's evaluation pass (evaluation.h): the same model and kernels on eval batches.
  const ModelDims eval_dims = EvalDims(d, setup.training);
  ModuleContext eval_ctx{setup.model, eval_dims, f, em, kernels, ctx.selective, nullptr};
  // Only a stack that reads the evaluation keys sets them (hf-trainer).
  const config::HfTrainerOptions* trainer = setup.training.hf_trainer();
  if (trainer != nullptr && trainer->eval_steps > 0 && trainer->eval_batches > 0) {
    loop_parts.eval_ctx = &eval_ctx;
    loop_parts.layer = &layer;
  }
  std::unique_ptr<TrainingLoop> loop = config::StackOf(setup.training).NewTrainingLoop(loop_parts);
  loop->Init();
  for (int k = 1; k <= iterations; ++k) loop->Iteration(k);
  return em.Finish();
}

}  // namespace

Program Build(const config::Setup& setup, int pipeline_rank) {
  return BuildWith(setup, pipeline_rank, BuildParts{});
}

Program BuildWith(const config::Setup& setup, int pipeline_rank, const BuildParts& parts) {
  return Generate(setup, pipeline_rank, parts, nullptr);
}

void BuildInto(const config::Setup& setup, int pipeline_rank, OpSink& sink) {
  Generate(setup, pipeline_rank, BuildParts{}, &sink);
}

namespace {

// The state of an optimizer stepping on the host over the flat `host` slices (DeepSpeed's
// offload_optimizer): pageable host memory, torch.optim's and DeepSpeedCPUAdam's zeros_like of a
// host tensor. Adam: exp_avg and exp_avg_sq; SGD: the momentum; Adafactor: a 1-D slice's
// exp_avg_sq (AdafactorStateBytes).
Bytes HostOptimizerStateBytes(const config::Setup& setup, const std::vector<ShardSlice>& host,
                              const StateLayout& layout) {
  Bytes sum = 0;
  for (const ShardSlice& s : host) {
    if (setup.training.optimizer == config::OptimizerKind::kAdam) {
      sum += s.numel * (layout.exp_avg + layout.exp_avg_sq);
    } else if (setup.training.optimizer == config::OptimizerKind::kAdafactor) {
      ParamTensor flat;
      flat.numel = s.numel;
      sum += AdafactorStateBytes(flat);
    } else if (setup.training.sgd_momentum > 0.0) {
      sum += s.numel * layout.exp_avg;
    }
  }
  return sum;
}

}  // namespace

StaticSizes ComputeStaticSizes(const config::Setup& setup, int pipeline_rank) {
  const ModelDims d = ComputeDims(setup);
  PeftKernels peft;
  const RankParams params =
      MakeRankParams(setup, pipeline_rank, DecoderLayer::ForSetup(setup), &peft);
  const std::unique_ptr<DataParallel> dp = NewDataParallel(setup, pipeline_rank, d, params);
  StaticSizes out;
  for (const ParamTensor& pt : params.params) {
    out.parameter_count += pt.numel;
    if (!pt.frozen) out.trainable_parameter_count += pt.numel;
  }
  for (const ShardSlice& s : dp->OptimizerSlices()) out.main_param_count += s.numel;
  const WrapperSizes w = dp->StaticSizes();
  out.parameter_bytes = w.parameter_bytes;
  out.gradient_bytes = w.gradient_bytes;
  // fp32 main copies: the optimizer's clones of its slices, or the wrapper's own buffer, or
  // FusedAdam's master weights (precision-aware optimizer).
  const StateLayout layout = OptimizerStateLayout(setup, d);
  const bool aware = setup.training.use_precision_aware_optimizer;
  out.main_param_bytes = !d.mixed                ? 0
                         : aware                 ? layout.master_param * out.main_param_count
                         : dp->HoldsMainParams() ? w.main_param_bytes
                         : setup.training.reuse_fp32_param
                             ? 2 * out.main_param_count  // MindSpeed's residual (optimizer.cc)
                             : 4 * out.main_param_count;
  // Adam exp_avg + exp_avg_sq, SGD momentum, in the optimizer's state dtypes; a parameter with
  // its own storage (PEFT's fp32 adapter on a 16-bit model) keeps its state that size
  // (torch.optim makes the state zeros_like(param)).
  const auto state_of = [&](Bytes per_element) {
    Bytes sum = 0;
    for (const ShardSlice& s : dp->OptimizerSlices()) {
      const ParamTensor& pt = params.params[s.param];
      sum += pt.storage_bytes > 0 && s.numel == pt.numel ? pt.storage_bytes : s.numel * per_element;
    }
    return sum;
  };
  const config::HfTrainerOptions* hf = setup.training.hf_trainer();
  if (hf != nullptr && hf->bnb_optimizer.optim_bits > 0) {
    // bitsandbytes: the state through the allocator; paged state is unified memory
    // (managed_optimizer_state_bytes, outside total_bytes). The two 1 KiB maps of 8-bit state.
    bool qmaps = false;
    for (const ShardSlice& s : dp->OptimizerSlices()) {
      const BnbState b = BnbStateBytes(s.numel, hf->bnb_optimizer);
      out.optimizer_state_bytes += b.device_bytes;
      out.managed_optimizer_state_bytes += b.managed_bytes;
      qmaps = qmaps || (hf->bnb_optimizer.optim_bits == 8 && s.numel >= kBnbMin8BitSize);
    }
    out.optimizer_state_bytes += qmaps ? hf->bnb_optimizer.states * kBnbQmapBytes : 0;
  } else if (setup.training.optimizer == config::OptimizerKind::kAdam) {
    out.optimizer_state_bytes = state_of(layout.exp_avg) + state_of(layout.exp_avg_sq);
  } else if (setup.training.optimizer == config::OptimizerKind::kAdafactor) {
    for (const ShardSlice& s : dp->OptimizerSlices()) {
      out.optimizer_state_bytes += AdafactorStateBytes(params.params[s.param]);
    }
  } else if (setup.training.sgd_momentum > 0.0) {
    out.optimizer_state_bytes = state_of(layout.exp_avg);
  }
  out.main_grad_copy_bytes =
      d.mixed && d.grad_bytes == 2 && !aware && !w.fp32_optimizer_grads ? 4 * out.main_param_count : 0;
  if (setup.training.swap_optimizer) {  // host between steps (build.h host_pinned_bytes)
    out.host_pinned_bytes = out.main_param_bytes + out.optimizer_state_bytes;
    out.main_param_bytes = 0;
    out.optimizer_state_bytes = 0;
    out.host = HostMemory::kSwapOptimizer;
  }
  const std::vector<ShardSlice> host = dp->HostOptimizerSlices();
  // DeepSpeed offload_optimizer cpu (build.h host_pageable_bytes), or ZeRO-3's offload_param.
  if (!host.empty() || w.host_pinned_bytes + w.host_pageable_bytes > 0) {
    out.host_pinned_bytes += w.host_pinned_bytes;
    out.host_pageable_bytes += w.host_pageable_bytes + HostOptimizerStateBytes(setup, host, layout);
    for (const ShardSlice& s : host) out.host_optimizer_count += s.numel;
    out.host = HostMemory::kZeroOffload;
    out.host_buffers_pinned = w.host_buffers_pinned;
    out.host_pinned_what = w.host_pinned_what;
    out.host_pageable_what = w.host_pageable_what;
  }
  return out;
}

ParameterCounts TotalParameterCounts(const config::Setup& setup) {
  config::Setup one = setup;
  config::TrainingConfig& t = one.training;
  t.tensor_model_parallel_size = 1;
  t.pipeline_model_parallel_size = 1;
  t.context_parallel_size = 1;
  t.num_layers_per_virtual_pipeline_stage = 0;
  t.sequence_parallel = false;
  // Every expert on the one rank (EP 1, expert TP 1), so a MoE layer lists all E experts
  // (modules/moe.h AppendParams: E / EP experts of ffn_e / ETP each).
  t.expert_model_parallel_size = 1;
  t.expert_tensor_parallel_size = 1;
  // The layer the run builds: Transformers' layers (Gemma2's four norms, Phi3's fused
  // projections) or Megatron's, dense or MoE, each counting its own parameters.
  const DecoderLayer layer = DecoderLayer::ForSetup(one);
  PeftKernels peft;
  ParameterCounts n;
  for (const ParamTensor& pt : MakeRankParams(one, 0, layer, &peft).params) {
    n.total += pt.numel;
    if (!pt.frozen) n.trainable += pt.numel;
  }
  return n;
}

}  // namespace memsim::workload
