// The composition root of workload/: picks the parts one rank's Program is made of and runs
// the framework's training loop over them (build.h).
#include "workload/build.h"

#include "workload/data_parallel.h"
#include "workload/emitter.h"
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

bool PlainPyTorch(const config::Setup& setup) { return setup.training.framework == "pytorch"; }

// The optimizer's param groups: Megatron's (weight decay or not, model.h ParamGroups), or the
// single group of torch.optim.AdamW(model.parameters()) in a plain PyTorch loop.
RankParams MakeRankParams(const config::Setup& setup, int rank, const DecoderLayer& layer) {
  RankParams rp;
  rp.params = StageParams(setup, rank, layer);
  if (PlainPyTorch(setup)) {
    rp.groups.emplace_back();
    for (int i = 0; i < static_cast<int>(rp.params.size()); ++i) rp.groups[0].push_back(i);
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
  DecoderLayer layer = parts.layer ? parts.layer() : DecoderLayer::ForModel(setup.model);
  const RankParams params = MakeRankParams(setup, pipeline_rank, layer);
  const int iterations = setup.training.train_iters;
  Emitter em(setup, pipeline_rank, iterations);
  std::unique_ptr<DataParallel> dp = parts.data_parallel
                                         ? parts.data_parallel(d, params)
                                         : NewDataParallel(setup, pipeline_rank, d, params);
  Kernels kernels(em, d, *dp);
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
  const RankParams params =
      MakeRankParams(setup, pipeline_rank, DecoderLayer::ForModel(setup.model));
  const std::unique_ptr<DataParallel> dp = NewDataParallel(setup, pipeline_rank, d, params);
  StaticSizes out;
  for (const ParamTensor& pt : params.params) out.parameter_count += pt.numel;
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
                                                 : 4 * out.main_param_count;
  // Adam exp_avg + exp_avg_sq, SGD momentum, in the optimizer's state dtypes.
  if (setup.training.optimizer == config::OptimizerKind::kAdam) {
    out.optimizer_state_bytes = (layout.exp_avg + layout.exp_avg_sq) * out.main_param_count;
  } else if (setup.training.sgd_momentum > 0.0) {
    out.optimizer_state_bytes = layout.exp_avg * out.main_param_count;
  }
  out.main_grad_copy_bytes = d.mixed && d.grad_bytes == 2 && !aware ? 4 * out.main_param_count : 0;
  return out;
}

std::int64_t TotalParameterCount(const config::Setup& setup) {
  config::Setup one = setup;
  config::TrainingConfig& t = one.training;
  t.tensor_model_parallel_size = 1;
  t.pipeline_model_parallel_size = 1;
  t.context_parallel_size = 1;
  t.num_layers_per_virtual_pipeline_stage = 0;
  t.sequence_parallel = false;
  std::int64_t n = 0;
  for (const ParamTensor& pt : StageParams(one, 0, DecoderLayer::Dense())) n += pt.numel;
  return n;
}

}  // namespace memsim::workload
