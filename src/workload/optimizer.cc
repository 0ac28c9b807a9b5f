#include "workload/optimizer.h"

#include <fmt/format.h>

namespace memsim::workload {
namespace {

// A [1]-element optimizer scalar (found_inf, _scale_one, grad-scaler state): 4 bytes.
constexpr Bytes kScalarBytes = 4;

}  // namespace

std::vector<MainTensor> MainTensors(const RankParams& params,
                                    const std::vector<ShardSlice>& slices) {
  std::vector<int> group_of(params.params.size(), 0);
  for (int gi = 0; gi < static_cast<int>(params.groups.size()); ++gi) {
    for (int i : params.groups[gi]) group_of[i] = gi;
  }
  std::vector<MainTensor> out;
  for (const ShardSlice& s : slices) out.push_back({s.param, s.numel, group_of[s.param]});
  return out;
}

TorchOptimizer::TorchOptimizer(const config::TrainingConfig& tc, const RankParams& params,
                               std::vector<MainTensor> main, Bytes state_bytes)
    : tc_(tc), params_(params), main_(std::move(main)), state_bytes_(state_bytes) {}

Bytes TorchOptimizer::StateBytes(const MainTensor& mt) const {
  const ParamTensor& pt = params_.params[mt.param];
  if (pt.storage_bytes > 0 && pt.numel > 0 && mt.numel == pt.numel) return pt.storage_bytes;
  return mt.numel * state_bytes_;
}

void TorchOptimizer::Step(Emitter& em) {
  for (int gi = 0; gi < static_cast<int>(params_.groups.size()); ++gi) {
    std::int64_t group_numel = 0;
    for (const MainTensor& mt : main_) group_numel += mt.group == gi ? mt.numel : 0;
    if (group_numel == 0) continue;
    if (tc_.optimizer == config::OptimizerKind::kAdam) {
      AdamGroup(em, gi, group_numel);
    } else {
      SgdGroup(em, gi, group_numel);
    }
  }
  has_state_ = true;
}

void TorchOptimizer::AdamGroup(Emitter& em, int gi, std::int64_t group_numel) {
  em.Begin(fmt::format("optim.adam.group{}", gi));
  if (!has_state_) {
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      const std::string& name = params_.params[mt.param].name;
      em.Alloc(StateBytes(mt), Category::kOptimizerStates, "optim.exp_avg." + name);
      em.Alloc(StateBytes(mt), Category::kOptimizerStates, "optim.exp_avg_sq." + name);
    }
  }
  const bool foreach = tc_.optimizer_impl == config::OptimizerImpl::kForeach;
  if (foreach && tc_.adam_coupled_weight_decay && tc_.weight_decay != 0.0) {
    // torch.optim.Adam (not AdamW): grads = torch._foreach_add(grads, params, alpha=wd), a new
    // list the size of the group, dropped before the square roots (_multi_tensor_adam).
    em.Begin(fmt::format("optim.adam.group{}.weight_decay", gi));
    std::vector<TensorId> tmp;
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      tmp.push_back(em.Alloc(StateBytes(mt), Category::kTemporaries,
                             "optim.decayed_grad." + params_.params[mt.param].name));
    }
    for (TensorId id : tmp) em.Free(id);
  }
  if (foreach) {
    // torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = _foreach_sqrt(...) is a new
    // list the size of the group; AdamW decays the params in place.
    em.Begin(fmt::format("optim.adam.group{}.update", gi));
    std::vector<TensorId> tmp;
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      tmp.push_back(em.Alloc(StateBytes(mt), Category::kTemporaries,
                             "optim.exp_avg_sq_sqrt." + params_.params[mt.param].name));
    }
    for (TensorId id : tmp) em.Free(id);
  }
  // Reads/writes param, grad, two moments: 16 B/elem read + 12 written (fp32).
  em.MovedBytes(28.0 * static_cast<double>(group_numel));
}

void TorchOptimizer::SgdGroup(Emitter& em, int gi, std::int64_t group_numel) {
  // torch/optim/sgd.py _multi_tensor_sgd: weight decay makes a new grad list (_foreach_add);
  // the first step clones the grads into momentum buffers.
  em.Begin(fmt::format("optim.sgd.group{}", gi));
  std::vector<TensorId> tmp;
  // Megatron's no-weight-decay group (biases, norms) has weight_decay 0.
  const bool decays = !params_.params[params_.groups[gi].front()].no_weight_decay;
  const bool foreach = tc_.optimizer_impl == config::OptimizerImpl::kForeach;
  if (foreach && decays && tc_.weight_decay != 0.0) {
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      tmp.push_back(em.Alloc(StateBytes(mt), Category::kTemporaries,
                             "optim.decayed_grad." + params_.params[mt.param].name));
    }
  }
  if (!has_state_ && tc_.sgd_momentum > 0.0) {
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      em.Alloc(StateBytes(mt), Category::kOptimizerStates,
               "optim.momentum_buffer." + params_.params[mt.param].name);
    }
  }
  for (TensorId id : tmp) em.Free(id);
  em.MovedBytes(16.0 * static_cast<double>(group_numel));
}

MegatronOptimizer::MegatronOptimizer(const config::TrainingConfig& tc, const ModelDims& d,
                                     const RankParams& params, DataParallel& dp)
    : tc_(tc),
      d_(d),
      params_(params),
      dp_(dp),
      inner_(tc, params, MainTensors(params, dp.OptimizerSlices()), 4) {}

void MegatronOptimizer::Init(Emitter& em) {
  // Scalars: fp16 grad scaler state (DynamicGradScaler: scale, min_scale, growth/backoff
  // factors), found_inf, _dummy_overflow_buf; bf16 _scale_one; fp32 _scale
  // (megatron/core/optimizer/optimizer.py, grad_scaler.py).
  em.Begin("init.optimizer.scalars");
  if (tc_.precision == config::Precision::kFp16) {
    for (const char* n :
         {"grad_scaler.scale", "grad_scaler.min_scale", "grad_scaler.growth_factor",
          "grad_scaler.backoff_factor", "optimizer.found_inf", "optimizer.dummy_overflow_buf"}) {
      em.Alloc(kScalarBytes, Category::kOther, n);
    }
  } else {
    em.Alloc(kScalarBytes, Category::kOther, d_.mixed ? "optimizer.scale_one" : "optimizer.scale");
  }
  // fp32 main copies: `clone().float()` per param (Float16OptimizerWithFloat16Params) or per
  // shard slice (DistributedOptimizer); the 16-bit clone is transient.
  if (!d_.mixed || dp_.HoldsMainParams()) return;
  for (const MainTensor& mt : inner_.main()) {
    const std::string& name = params_.params[mt.param].name;
    em.Begin("init.optimizer.main_param");
    const TensorId clone =
        em.Alloc(mt.numel * d_.param_bytes, Category::kTemporaries, name + ".clone");
    em.Alloc(mt.numel * 4, Category::kMainParameters, "main." + name);
    em.Free(clone);
  }
}

void MegatronOptimizer::ZeroGrad(Emitter& em) {
  for (TensorId id : grad_copies_) em.Free(id);
  grad_copies_.clear();
}

// clip_grads.py get_grad_norm_fp32: multi_tensor_l2norm output and total_norm, tiny. The
// grad-stats group is the model-parallel group (tp·pp), or tp·dp·cp with a sharded optimizer.
void MegatronOptimizer::GradNorm(Emitter& em) {
  const bool sharded = dp_.ShardsOptimizer();
  const char* stats_group = sharded ? "tp_dp_cp" : "mp";
  const int stats_size = sharded ? d_.t * d_.dp_cp : d_.t * d_.p;
  if (tc_.precision == config::Precision::kFp16) {
    em.Begin("optim.unscale_and_check");  // _amp_foreach_non_finite_check_and_unscale_, in place
    em.Collective(stats_group, stats_size, 4, Coll::kAllReduce);
  }
  em.Begin("optim.grad_norm");
  const TensorId norm_out = em.Alloc(kScalarBytes, Category::kTemporaries, "optim.l2norm_out");
  const TensorId total = em.Alloc(kScalarBytes, Category::kTemporaries, "optim.total_norm");
  em.Collective(stats_group, stats_size, 4, Coll::kAllReduce);
  em.Free(norm_out);
  em.Free(total);
}

void MegatronOptimizer::Step(Emitter& em) {
  // main_grad.float() allocates only when the grad buffer is 16-bit (optimizer.py
  // _collect_main_grad_data_for_unscaling / _copy_model_grads_to_main_grads).
  if (d_.mixed && d_.grad_bytes == 2) {
    em.Begin("optim.copy_main_grads");
    for (const MainTensor& mt : inner_.main()) {
      grad_copies_.push_back(em.Alloc(mt.numel * 4, Category::kGradients,
                                      "optim.main_grad." + params_.params[mt.param].name));
    }
  }
  GradNorm(em);
  inner_.Step(em);
  if (d_.mixed) {
    em.Begin("optim.copy_main_to_model_params");  // in place
    std::int64_t n = 0;
    for (const MainTensor& mt : inner_.main()) n += mt.numel;
    em.MovedBytes(static_cast<double>(n) * (4 + d_.param_bytes));
  }
  dp_.AfterOptimizerStep(em);
}

}  // namespace memsim::workload
