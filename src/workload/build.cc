// The composition root of workload/: picks the parts one rank's Program is made of and runs
// the framework's training loop over them (build.h).
#include "workload/build.h"

#include "workload/data_parallel.h"
#include "workload/emitter.h"
#include "workload/hf_peft.h"
#include "workload/kernels.h"
#include "workload/modules/decoder_layer.h"
#include "workload/optimizer.h"
#include "workload/pipeline.h"
#include "workload/recompute.h"
#include "workload/schedule.h"
#include "workload/stage_runner.h"
#include "workload/training_loop.h"

namespace memsim::workload {
namespace {

bool PlainPyTorch(const config::Setup& setup) { return config::PyTorchLoop(setup.training); }

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
  if (PlainPyTorch(setup)) {
    rp.groups.emplace_back();
    for (int i = 0; i < static_cast<int>(rp.params.size()); ++i) {
      if (!rp.params[i].frozen) rp.groups[0].push_back(i);
    }
  } else {
    rp.groups = ParamGroups(rp.params);
  }
  return rp;
}

}  // namespace

Program Build(const config::Setup& setup, int pipeline_rank) {
  return BuildWith(setup, pipeline_rank, BuildParts{});
}

Program BuildWith(const config::Setup& setup, int pipeline_rank, const BuildParts& parts) {
  const ModelDims d = ComputeDims(setup);
  DecoderLayer layer = parts.layer ? parts.layer() : DecoderLayer::Dense();
  PeftKernels peft;
  const RankParams params = MakeRankParams(setup, pipeline_rank, layer, &peft);
  const int iterations = setup.training.train_iters;
  Emitter em(setup, pipeline_rank, iterations);
  std::unique_ptr<DataParallel> dp = parts.data_parallel
                                         ? parts.data_parallel(d, params)
                                         : NewDataParallel(setup, pipeline_rank, d, params);
  Kernels kernels(em, d, *dp);
  if (peft.Active()) kernels.SetPeft(&peft);
  ModuleContext ctx{setup.model, d, em, kernels, SelectiveModules(setup.training, d.te)};
  PipelineExchange exchange(em, d);
  StageRunner runner(ctx, setup.training, pipeline_rank, layer, *dp, exchange);
  const std::vector<ScheduleStep> steps = PipelineSchedule(d.p, pipeline_rank, d.m, d.v);
  const LoopParts loop_parts{setup, d, params, em, *dp, runner, exchange, steps};
  std::unique_ptr<TrainingLoop> loop =
      PlainPyTorch(setup) ? NewPyTorchLoop(loop_parts) : NewMegatronLoop(loop_parts);
  loop->Init();
  for (int k = 1; k <= iterations; ++k) loop->Iteration(k);
  return em.Finish();
}

StaticSizes ComputeStaticSizes(const config::Setup& setup, int pipeline_rank) {
  const ModelDims d = ComputeDims(setup);
  PeftKernels peft;
  const RankParams params = MakeRankParams(setup, pipeline_rank, DecoderLayer::Dense(), &peft);
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
  // fp32 main copies: the optimizer's clones of its slices, or the wrapper's own buffer.
  out.main_param_bytes = !d.mixed                ? 0
                         : dp->HoldsMainParams() ? w.main_param_bytes
                                                 : 4 * out.main_param_count;
  // Adam exp_avg + exp_avg_sq, SGD momentum, in the optimizer's state dtype.
  const Bytes state_bytes = PlainPyTorch(setup) ? d.param_bytes : 4;
  // One state tensor's bytes per updated slice (an adapter with its own fp32 storage keeps it).
  Bytes one_state = 0;
  for (const ShardSlice& s : dp->OptimizerSlices()) {
    const ParamTensor& pt = params.params[s.param];
    one_state += pt.storage_bytes > 0 && s.numel == pt.numel ? pt.storage_bytes
                                                             : s.numel * state_bytes;
  }
  if (setup.training.optimizer == config::OptimizerKind::kAdam) {
    out.optimizer_state_bytes = 2 * one_state;
  } else if (setup.training.sgd_momentum > 0.0) {
    out.optimizer_state_bytes = one_state;
  }
  out.main_grad_copy_bytes = d.mixed && d.grad_bytes == 2 ? 4 * out.main_param_count : 0;
  return out;
}

}  // namespace memsim::workload
