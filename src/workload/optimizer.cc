#include "workload/optimizer.h"

#include <algorithm>

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
  std::vector<TensorId> mains;
  for (const MainTensor& mt : inner_.main()) {
    const std::string& name = params_.params[mt.param].name;
    em.Begin("init.optimizer.main_param");
    const TensorId clone =
        em.Alloc(mt.numel * d_.param_bytes, Category::kTemporaries, name + ".clone");
    mains.push_back(em.Alloc(mt.numel * 4, Category::kMainParameters, "main." + name));
    em.Free(clone);
    // SwapDistributedOptimizer._build_model_and_main_param_groups: each fp32 shard is copied to
    // its pinned host buffer and resized to 0 as soon as it is made (swap_tensors_to_host).
    if (tc_.swap_optimizer) em.Free(mains.back());
  }
  if (tc_.reuse_fp32_param) ReuseFp32Storage(em, mains);
  if (tc_.swap_optimizer) SwapInitStates(em);
}

// SwapDistributedOptimizer.opt_states_initialization (__init__): per shard, exp_avg and
// exp_avg_sq made (zeros_like, 4 B each), copied to their pinned host buffers, resized to 0.
void MegatronOptimizer::SwapInitStates(Emitter& em) {
  for (const MainTensor& mt : inner_.main()) {
    em.Begin("init.optimizer.swap_states");  // one op per tensor: its frees end the op
    const std::string& name = params_.params[mt.param].name;
    const TensorId m = em.Alloc(mt.numel * 4, Category::kOptimizerStates, "optim.exp_avg." + name);
    const TensorId v =
        em.Alloc(mt.numel * 4, Category::kOptimizerStates, "optim.exp_avg_sq." + name);
    em.Free(m);
    em.Free(v);
  }
}

// swap_adamw_step: the shard's parameters in param-group order (by size, largest first, with
// swap_optimizer_times 0); when nothing is on the device, the next window is brought over:
// parameters while the window stays within swap_numel = total // swap_optimizer_times elements
// (all of them with 0), at least one; each is resized back to its fp32 main parameter, exp_avg
// and exp_avg_sq (4 + 4 + 4 B per element: swap_tensors_to_device), updated by
// npu_apply_fused_adamw_v2 in place, copied into the bf16 model parameter, and sent back and
// resized to 0 (swap_tensors_to_host). So a window's 12 B per element is the step's own peak.
// The transfers run on side streams; memsim puts them on the compute stream.
void MegatronOptimizer::SwapStep(Emitter& em) {
  std::vector<MainTensor> order = inner_.main();
  std::stable_sort(order.begin(), order.end(), [&](const MainTensor& a, const MainTensor& b) {
    if (tc_.swap_optimizer_times == 0) return a.numel > b.numel;
    return a.group < b.group;
  });
  std::int64_t total = 0;
  for (const MainTensor& mt : order) total += mt.numel;
  const std::int64_t window =
      tc_.swap_optimizer_times == 0 ? total : total / tc_.swap_optimizer_times;
  std::size_t i = 0;
  while (i < order.size()) {
    em.Begin("optim.swap_optimizer.to_device");
    std::vector<TensorId> on_device;
    std::int64_t count = 0;
    for (; i < order.size() && (count + order[i].numel <= window || count <= 0); ++i) {
      const std::string& name = params_.params[order[i].param].name;
      const std::int64_t n = order[i].numel;
      on_device.push_back(em.Alloc(4 * n, Category::kMainParameters, "main." + name));
      on_device.push_back(em.Alloc(4 * n, Category::kOptimizerStates, "optim.exp_avg." + name));
      on_device.push_back(em.Alloc(4 * n, Category::kOptimizerStates, "optim.exp_avg_sq." + name));
      count += n;
    }
    em.Begin("optim.swap_optimizer.adamw");
    em.Begin("optim.swap_optimizer.to_host");
    for (TensorId id : on_device) em.Free(id);
  }
}

// MindSpeed --reuse-fp32-param, after Megatron's optimizer __init__ made the fp32 copies
// (mindspeed/core/memory/reuse_param/adaptor.py reuse_fp32_param_distrib_optimizer_init_wrapper):
// with DP > 1, reuse_buffer_dis allocates one bf16 residual buffer per DDP buffer
// (`torch.zeros(buffer.numel // dp, dtype=bf16)`) and points each fp32 shard into the bf16
// parameter buffer, so the fp32 copies' own storage is freed (then empty_cache). With DP 1
// (reuse_buffer_single) and with the non-distributed optimizer (reuse_fp32_param_init_wrapper,
// reuse_optimizer.py init_and_reuse_storage_of_tensors) one 4-byte storage per element holds the
// bf16 parameter and its residual; the bytes are the same: 2 per main element beyond the
// parameter. Modelled as one residual per buffer (dense, expert): 2 bytes x its main elements.
void MegatronOptimizer::ReuseFp32Storage(Emitter& em, const std::vector<TensorId>& mains) {
  em.Begin("init.optimizer.reuse_fp32_param");
  std::int64_t dense = 0;
  std::int64_t expert = 0;
  for (const MainTensor& mt : inner_.main()) {
    (params_.params[mt.param].expert ? expert : dense) += mt.numel;
  }
  if (dense > 0) em.Alloc(2 * dense, Category::kMainParameters, "main.residual");
  if (expert > 0) em.Alloc(2 * expert, Category::kMainParameters, "main.residual.expert");
  for (TensorId id : mains) em.Free(id);
}

// The conversions of --reuse-fp32-param around the update (adaptor.py prepare_grads: bf16 +
// residual -> fp32 after the grad copies; step_with_ready_grads: fp32 -> bf16 + residual after
// the update), and their temporaries. With the distributed optimizer and DP > 1
// (reuse_distrib_optimizer.py fp16_tensor_convert_to_fp32_tensor_dis and
// fp32_tensor_convert_to_fp16_tensor_dis), per bucket: a `workspace` of TRANSPOSE_BF16_BLOCK_SIZE
// x 2 bf16 (4096 x 4096 x 2 x 2 B = 64 MiB) and the `.contiguous()` of its transposed view (4 B x
// min(block, the bucket's shard)); to bf16 keeps both names until the next bucket's workspace is
// made, so with several buckets (overlap_grad_reduce) three are alive at once. Otherwise
// (reuse_optimizer.py bf16_tensors_to_fp32_tensors / fp32_tensors_to_bf16_tensors, and the DP 1
// path), per tensor the transposed copy of its 2 x numel bf16 view: 4 B x numel, the largest
// tensor's at the peak.
void MegatronOptimizer::ReuseFp32Convert(Emitter& em, bool to_fp32) {
  em.Begin(to_fp32 ? "optim.reuse_fp32.to_fp32" : "optim.reuse_fp32.to_bf16");
  std::int64_t total = 0;
  std::int64_t largest = 0;
  for (const MainTensor& mt : inner_.main()) {
    total += mt.numel;
    largest = std::max(largest, mt.numel);
  }
  if (!(dp_.ShardsOptimizer() && d_.dp_cp > 1)) {
    em.Free(em.Alloc(4 * largest, Category::kTemporaries, "optim.reuse_fp32.transpose"));
    return;
  }
  constexpr std::int64_t kBlock = 4096LL * 4096;  // TRANSPOSE_BF16_BLOCK_SIZE
  const TensorId ws = em.Alloc(2 * 2 * kBlock, Category::kTemporaries, "optim.reuse_fp32.workspace");
  const TensorId tmp = em.Alloc(4 * std::min(kBlock, total), Category::kTemporaries,
                                "optim.reuse_fp32.transpose");
  if (to_fp32) em.Free(tmp);  // an rvalue in fp16_tensor_convert_to_fp32_tensor_dis
  if (tc_.overlap_grad_reduce) {  // the next bucket's workspace before this one's is dropped
    em.Free(em.Alloc(2 * 2 * kBlock, Category::kTemporaries, "optim.reuse_fp32.workspace"));
  }
  if (!to_fp32) em.Free(tmp);  // `temp`, held until the next bucket reassigns it
  em.Free(ws);
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
  if (tc_.reuse_fp32_param) ReuseFp32Convert(em, true);
  if (tc_.precision == config::Precision::kFp16) UnscaleAndCheck(em);
  if (skipped) return;
  GradNorm(em);
  if (tc_.swap_optimizer) {
    SwapStep(em);
  } else {
    inner_.Step(em);
  }
  if (tc_.reuse_fp32_param) ReuseFp32Convert(em, false);
  if (d_.mixed) {
    em.Begin("optim.copy_main_to_model_params");  // in place
    std::int64_t n = 0;
    for (const MainTensor& mt : inner_.main()) n += mt.numel;
    em.MovedBytes(static_cast<double>(n) * (4 + d_.param_bytes));
  }
  dp_.AfterOptimizerStep(em);
}

}  // namespace memsim::workload
