#include "workload/optimizer.h"

#include <fmt/format.h>

#include "config/stack.h"

namespace memsim::workload {
namespace {

// A [1]-element optimizer scalar (found_inf, _scale_one, grad-scaler state): 4 bytes.
constexpr Bytes kScalarBytes = 4;

Bytes MomentBytes(config::StateDtype t) {
  switch (t) {
    case config::StateDtype::kFp32:
      return 4;
    case config::StateDtype::kFp16:
    case config::StateDtype::kBf16:
      return 2;
    case config::StateDtype::kFp8:
      return 1;
  }
  return 4;
}

// FusedAdam's layout under Megatron's precision-aware optimizer (StateLayout).
StateLayout PrecisionAwareLayout(const config::TrainingConfig& tc, Bytes param_bytes) {
  StateLayout s;
  s.exp_avg = MomentBytes(tc.exp_avg_dtype);
  s.exp_avg_sq = MomentBytes(tc.exp_avg_sq_dtype);
  // OptimizerConfig.__post_init__ turns store_param_remainders off before TE 2.1; FusedAdam
  // applies it to bf16 parameters with an fp32 master only.
  const std::vector<int>& te = tc.transformer_engine_version;
  const bool te_2_1 = te.empty() || te[0] > 2 || (te[0] == 2 && te.size() > 1 && te[1] >= 1);
  const bool remainders = te_2_1 && tc.precision == config::Precision::kBf16 &&
                          tc.main_params_dtype == config::Precision::kFp32;
  s.master_param = remainders || tc.main_params_dtype == config::Precision::kFp16 ? 2 : 4;
  s.master_clone = remainders ? 0 : param_bytes;
  const bool fuse_unscale = tc.exp_avg_dtype == config::StateDtype::kBf16 &&
                            tc.exp_avg_sq_dtype == config::StateDtype::kBf16;
  for (config::StateDtype m : {tc.exp_avg_dtype, tc.exp_avg_sq_dtype}) {
    const bool copied = m == config::StateDtype::kFp16 || m == config::StateDtype::kFp8 ||
                        (m == config::StateDtype::kBf16 && !fuse_unscale);
    s.unscaled_copies += copied ? 4 : 0;
  }
  s.unscaled_copies += tc.main_params_dtype == config::Precision::kFp16 ? 4 : 0;
  return s;
}

}  // namespace

StateLayout OptimizerStateLayout(const config::Setup& setup, const ModelDims& d) {
  const config::TrainingConfig& tc = setup.training;
  // A wrapper with fp32 main weights under a plain loop (DeepSpeed ZeRO, d.mixed) steps them:
  // fp32 state.
  if (config::StackOf(tc).Traits().plain_pytorch_step && !d.mixed) {
    return {d.param_bytes, d.param_bytes, 0, 0, 0, d.param_bytes};
  }
  if (tc.use_precision_aware_optimizer) return PrecisionAwareLayout(tc, d.param_bytes);
  return {};
}

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
                               std::vector<MainTensor> main, const StateLayout& layout)
    : tc_(tc), params_(params), main_(std::move(main)), layout_(layout) {}

Bytes TorchOptimizer::StateBytes(const MainTensor& mt, Bytes per_element) const {
  const ParamTensor& pt = params_.params[mt.param];
  if (pt.storage_bytes > 0 && pt.numel > 0 && mt.numel == pt.numel) return pt.storage_bytes;
  return mt.numel * per_element;
}

BnbState BnbStateBytes(std::int64_t numel, const config::BnbOptimizer& bnb) {
  const bool eight = bnb.optim_bits == 8 && numel >= kBnbMin8BitSize;
  const Bytes state = numel * (eight ? 1 : 4);
  BnbState out;
  (bnb.is_paged && numel >= kBnbMinPagedSize ? out.managed_bytes : out.device_bytes) +=
      bnb.states * state;
  if (eight) out.device_bytes += bnb.states * 4 * ((numel + kBnbBlockSize - 1) / kBnbBlockSize);
  return out;
}

void TorchOptimizer::Step(Emitter& em) {
  const config::HfTrainerOptions* hf = tc_.hf_trainer();
  for (int gi = 0; gi < static_cast<int>(params_.groups.size()); ++gi) {
    std::int64_t group_numel = 0;
    for (const MainTensor& mt : main_) group_numel += mt.group == gi ? mt.numel : 0;
    if (group_numel == 0) continue;
    if (hf != nullptr && hf->bnb_optimizer.optim_bits > 0) {
      BnbGroup(em, gi, hf->bnb_optimizer);
    } else if (tc_.optimizer == config::OptimizerKind::kAdam) {
      AdamGroup(em, gi, group_numel);
    } else if (tc_.optimizer == config::OptimizerKind::kAdafactor) {
      AdafactorGroup(em, gi);
    } else {
      SgdGroup(em, gi, group_numel);
    }
  }
  has_state_ = true;
}

// The first step's state, per tensor of the group in order (Adam._init_group; FusedAdam.step's
// `if len(state) == 0: self.initialize_state(p, ...)`).
void TorchOptimizer::AdamState(Emitter& em, int gi) {
  for (const MainTensor& mt : main_) {
    if (mt.group != gi) continue;
    const std::string& name = params_.params[mt.param].name;
    em.Alloc(StateBytes(mt, layout_.exp_avg), Category::kOptimizerStates,
             "optim.exp_avg." + name);
    em.Alloc(StateBytes(mt, layout_.exp_avg_sq), Category::kOptimizerStates,
             "optim.exp_avg_sq." + name);
    if (layout_.master_param == 0) continue;
    em.Alloc(mt.numel * layout_.master_param, Category::kMainParameters,
             "optim.master_param." + name);
    if (layout_.master_clone > 0) {  // param.clone().detach().float(), copied into the state
      const TensorId clone = em.Alloc(mt.numel * layout_.master_clone, Category::kTemporaries,
                                      "optim.master_clone." + name);
      const TensorId f32 =
          em.Alloc(mt.numel * 4, Category::kTemporaries, "optim.master_float." + name);
      em.Free(clone);
      em.Free(f32);
    }
  }
}

void TorchOptimizer::AdamGroup(Emitter& em, int gi, std::int64_t group_numel) {
  em.Begin(fmt::format("optim.adam.group{}", gi));
  if (!has_state_) AdamState(em, gi);
  if (layout_.unscaled_copies > 0) {
    // FusedAdam.step: get_unscaled_state's fp32 copies, kept in unscaled_lists until the update
    // has run and the states are scaled back.
    em.Begin(fmt::format("optim.adam.group{}.unscaled_states", gi));
    std::vector<TensorId> tmp;
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      tmp.push_back(em.Alloc(mt.numel * layout_.unscaled_copies, Category::kTemporaries,
                             "optim.unscaled." + params_.params[mt.param].name));
    }
    for (TensorId id : tmp) em.Free(id);
  }
  const bool foreach = tc_.optimizer_impl == config::OptimizerImpl::kForeach;
  const config::PyTorchOptions* torch = tc_.pytorch();
  if (foreach && torch != nullptr && torch->adam_coupled_weight_decay && tc_.weight_decay != 0.0) {
    // torch.optim.Adam (not AdamW): grads = torch._foreach_add(grads, params, alpha=wd), a new
    // list the size of the group, dropped before the square roots (_multi_tensor_adam).
    em.Begin(fmt::format("optim.adam.group{}.weight_decay", gi));
    std::vector<TensorId> tmp;
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      tmp.push_back(em.Alloc(StateBytes(mt, layout_.temporary), Category::kTemporaries,
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
      tmp.push_back(em.Alloc(StateBytes(mt, layout_.temporary), Category::kTemporaries,
                             "optim.exp_avg_sq_sqrt." + params_.params[mt.param].name));
    }
    for (TensorId id : tmp) em.Free(id);
  }
  // Reads/writes param, grad, two moments: 16 B/elem read + 12 written (fp32).
  em.MovedBytes(28.0 * static_cast<double>(group_numel));
}

Bytes AdafactorStateBytes(const ParamTensor& pt) {
  const bool factored = pt.row_numel > 1;
  const std::int64_t elems = factored ? pt.numel / pt.row_numel + pt.row_numel : pt.numel;
  return 4 * elems + 4;
}

// transformers.optimization.Adafactor.step, one parameter at a time (no foreach): grad.float()
// and p.float() for a 16-bit parameter; the state at its first step; RMS = _rms(p) replaces the
// previous step's; update = grad**2 + eps (two tensors of the parameter's size, the square
// freed once the sum exists); factored: the row and column means, then _approx_sq_grad's
// r_factor [rows], c_factor [cols] and their product, a new update (the old one freed);
// non-factored exp_avg_sq.rsqrt(); `p.add_(-update)` negates into one more tensor; all fp32.
void TorchOptimizer::AdafactorGroup(Emitter& em, int gi) {
  for (const MainTensor& mt : main_) {
    if (mt.group != gi) continue;
    const ParamTensor& pt = params_.params[mt.param];
    em.Begin("optim.adafactor." + pt.name);
    auto tmp = [&](std::int64_t elems, const char* what) {
      return em.Alloc(4 * elems, Category::kTemporaries, fmt::format("optim.{}.{}", what, pt.name));
    };
    // The parameter's element size: its own storage (PEFT's fp32 adapters), else the loop's
    // parameter dtype (OptimizerStateLayout gives it as the temporaries' size).
    const bool sixteen = StateBytes(mt, layout_.temporary) < 4 * mt.numel;
    const TensorId grad32 = sixteen ? tmp(mt.numel, "grad_fp32") : 0;
    const TensorId param32 = sixteen ? tmp(mt.numel, "param_fp32") : 0;
    const bool factored = pt.row_numel > 1;
    const std::int64_t rows = factored ? mt.numel / pt.row_numel : 0;
    if (!has_state_) {
      if (factored) {
        em.Alloc(4 * rows, Category::kOptimizerStates, "optim.exp_avg_sq_row." + pt.name);
        em.Alloc(4 * pt.row_numel, Category::kOptimizerStates, "optim.exp_avg_sq_col." + pt.name);
      } else {
        em.Alloc(4 * mt.numel, Category::kOptimizerStates, "optim.exp_avg_sq." + pt.name);
      }
      // RMS: each later step stores a new 0-dim tensor in its place; modelled as this one kept
      // (one 512-byte block either way; a fresh one each step would shift the small pool's
      // blocks by one parameter a step and never repeat).
      em.Alloc(4, Category::kOptimizerStates, "optim.rms." + pt.name);
    }
    em.Begin("optim.adafactor.update." + pt.name);
    const TensorId square = tmp(mt.numel, "grad_squared");
    TensorId update = tmp(mt.numel, "update");
    em.Free(square);
    if (factored) {
      em.Begin("optim.adafactor.means." + pt.name);
      em.Free(tmp(rows, "row_mean"));
      em.Free(tmp(pt.row_numel, "col_mean"));
      em.Begin("optim.adafactor.approx_sq_grad." + pt.name);
      const TensorId r = tmp(rows, "r_factor");
      const TensorId c = tmp(pt.row_numel, "c_factor");
      const TensorId approx = tmp(mt.numel, "approx_sq_grad");
      for (TensorId id : {r, c, update}) em.Free(id);
      update = approx;
    } else {
      em.Begin("optim.adafactor.rsqrt." + pt.name);
      const TensorId rsqrt = tmp(mt.numel, "exp_avg_sq_rsqrt");
      em.Free(update);
      update = rsqrt;
    }
    em.Begin("optim.adafactor.apply." + pt.name);
    const TensorId negated = tmp(mt.numel, "neg_update");
    for (TensorId id : {negated, update, grad32, param32}) em.Free(id);
    em.MovedBytes(24.0 * static_cast<double>(mt.numel));
  }
}

// Optimizer8bit.step: for each parameter with a .grad, init_state on its first step (the 8-bit
// maps moved to the device once, state1, state2, the absmax blocks: Optimizer2State.init_state's
// order; Optimizer1State moves only the signed "dynamic" map and keeps one state), then
// prefetch_state and update_step, whose kernels update the state in place (functional.py
// optimizer_update_32bit / optimizer_update_8bit_blockwise), and torch.cuda.synchronize().
void TorchOptimizer::BnbGroup(Emitter& em, int gi, const config::BnbOptimizer& bnb) {
  for (const MainTensor& mt : main_) {
    if (mt.group != gi) continue;
    const std::string& name = params_.params[mt.param].name;
    em.Begin("optim.bnb." + name);
    if (!has_state_) {
      const bool eight = bnb.optim_bits == 8 && mt.numel >= kBnbMin8BitSize;
      const bool paged = bnb.is_paged && mt.numel >= kBnbMinPagedSize;
      const Bytes state = mt.numel * (eight ? 1 : 4);
      if (eight && !has_qmaps_) {
        for (const char* map : {"dynamic", "udynamic"}) {
          if (map[0] == 'u' && bnb.states < 2) break;  // Optimizer1State moves "dynamic" only
          em.Alloc(kBnbQmapBytes, Category::kOptimizerStates, fmt::format("optim.qmap.{}", map));
        }
        has_qmaps_ = true;
      }
      for (int k = 1; k <= bnb.states; ++k) {
        if (paged) {
          em.Managed(state);
        } else {
          em.Alloc(state, Category::kOptimizerStates, fmt::format("optim.state{}.{}", k, name));
        }
      }
      const std::int64_t blocks = (mt.numel + kBnbBlockSize - 1) / kBnbBlockSize;
      for (int k = 1; eight && k <= bnb.states; ++k) {
        em.Alloc(4 * blocks, Category::kOptimizerStates, fmt::format("optim.absmax{}.{}", k, name));
      }
    }
    em.Synchronize();
    // Reads param, grad and the states, writes param and states.
    em.MovedBytes(static_cast<double>(mt.numel) * (8.0 + 2.0 * bnb.states * bnb.optim_bits / 8));
  }
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
      tmp.push_back(em.Alloc(StateBytes(mt, layout_.temporary), Category::kTemporaries,
                             "optim.decayed_grad." + params_.params[mt.param].name));
    }
  }
  if (!has_state_ && tc_.sgd_momentum > 0.0) {
    for (const MainTensor& mt : main_) {
      if (mt.group != gi) continue;
      em.Alloc(StateBytes(mt, layout_.exp_avg), Category::kOptimizerStates,
               "optim.momentum_buffer." + params_.params[mt.param].name);
    }
  }
  for (TensorId id : tmp) em.Free(id);
  em.MovedBytes(16.0 * static_cast<double>(group_numel));
}

MegatronOptimizer::MegatronOptimizer(const config::Setup& setup, const ModelDims& d,
                                     const RankParams& params, DataParallel& dp)
    : tc_(setup.training),
      d_(d),
      params_(params),
      dp_(dp),
      inner_(setup.training, params, MainTensors(params, dp.OptimizerSlices()),
             OptimizerStateLayout(setup, d)) {}

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
  // shard slice (DistributedOptimizer); the 16-bit clone is transient. The precision-aware
  // optimizer makes none (distrib_optimizer.py _build_model_and_main_param_groups: FusedAdam
  // holds the master weights, created by its first step).
  if (!d_.mixed || dp_.HoldsMainParams() || tc_.use_precision_aware_optimizer) return;
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

// _unscale_main_grads_and_check_for_nan: _amp_foreach_non_finite_check_and_unscale_ in place,
// found_inf all-reduced (MAX) over the grad-stats group: the model-parallel group "mp" (tp·pp),
// or the whole world with a sharded optimizer: distrib_optimizer.py returns None, the default
// group (get_model_parallel_group in core_v0.6.0, get_grad_stats_parallel_group in core_v0.10.0
// to 0.12.0; core_v0.15.0 only sets a group for several distributed-optimizer instances).
void MegatronOptimizer::GradStatsAllReduce(Emitter& em) const {
  if (dp_.ShardsOptimizer()) {
    em.Collective(CommGroup::kWorld, d_.t * d_.p * d_.dp_cp, 4, Coll::kAllReduce);
  } else {
    em.Collective(CommGroup::kMp, d_.t * d_.p, 4, Coll::kAllReduce);
  }
}

void MegatronOptimizer::UnscaleAndCheck(Emitter& em) {
  em.Begin("optim.unscale_and_check");
  GradStatsAllReduce(em);
}

// clip_grads.py get_grad_norm_fp32: multi_tensor_l2norm output and total_norm, tiny; over the
// grad-stats group, as UnscaleAndCheck.
void MegatronOptimizer::GradNorm(Emitter& em) {
  em.Begin("optim.grad_norm");
  const TensorId norm_out = em.Alloc(kScalarBytes, Category::kTemporaries, "optim.l2norm_out");
  const TensorId total = em.Alloc(kScalarBytes, Category::kTemporaries, "optim.total_norm");
  GradStatsAllReduce(em);
  em.Free(norm_out);
  em.Free(total);
}

void MegatronOptimizer::Step(Emitter& em, bool skipped) {
  // prepare_grads. main_grad.float() allocates only when the grad buffer is 16-bit (optimizer.py
  // _collect_main_grad_data_for_unscaling / _copy_model_grads_to_main_grads); the
  // precision-aware optimizer reads the buffer itself (distrib_optimizer.py: decoupled_grad).
  if (d_.mixed && d_.grad_bytes == 2 && !tc_.use_precision_aware_optimizer) {
    em.Begin("optim.copy_main_grads");
    for (const MainTensor& mt : inner_.main()) {
      grad_copies_.push_back(em.Alloc(mt.numel * 4, Category::kGradients,
                                      "optim.main_grad." + params_.params[mt.param].name));
    }
  }
  if (tc_.precision == config::Precision::kFp16) UnscaleAndCheck(em);
  if (skipped) return;
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
