// PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) as a DataParallel wrapper, units from
// fsdp2.h. Sources, PyTorch v2.6.0, torch/distributed/fsdp/_fully_shard/:
// - The parameters are born sharded: torchtitan builds the model on the meta device, applies
//   fully_shard, then to_empty + init_weights (torchtitan/train.py), so each parameter's padded
//   fp32 shard is its only storage (_fsdp_param.py _init_sharded_param); the unsharded model
//   never exists on the device. Element sizes: shards in the parameters' dtype (fp32), the
//   gathered parameters and their gradients in MixedPrecisionPolicy.param_dtype (d.param_bytes,
//   d.grad_bytes), the reduce-scatter in reduce_dtype, sharded gradients in fp32.
// - unshard (_fsdp_param_group.py FSDPParamGroup.unshard, _fsdp_collectives.py
//   foreach_all_gather) on the copy-in stream: _get_param_all_gather_inputs casts the shards
//   into one flat param_dtype tensor (torch._foreach_copy_, dropped after the copy-in), then
//   all_gather_copy_in allocates the all-gather output (padded_numel), whose own rank's slice is
//   the input; all_gather_into_tensor in place.
// - wait_for_unshard: foreach_all_gather_copy_out splits the output into each parameter's
//   unsharded tensor (FSDPParam.init_all_gather_outputs / alloc_storage: dim-0-padded numel in
//   param_dtype, on the default stream). In forward the output is kept in
//   comm_ctx.all_gather_state until the next group's wait_for_unshard in forward (or the root's
//   post-forward, _fsdp_state.py FSDPState._post_forward) frees it; elsewhere it is freed at once.
// - post_forward: reshard() frees the unsharded storages iff reshard_after_forward.
// - pre_backward (hooked on the unit's outputs): unshard + wait_for_unshard, then the implicit
//   backward prefetch (_backward_prefetch): unshard() of the group that ran before it in forward
//   (post_forward_order), copied out at that group's own pre_backward. Under activation
//   checkpointing, pre_forward and post_forward return at once in PRE_BACKWARD: the recompute
//   uses what pre_backward gathered.
// - post_backward (hooked on the unit's inputs; a unit whose inputs need no grad, the
//   embedding, runs it from the root's final callback, _fsdp_state.py
//   _root_post_backward_final_callback): reshard(), then foreach_reduce: the previous group's
//   reduce_scatter_state (its input) is dropped, the input (padded_numel, reduce_dtype) made on
//   the default stream, the unsharded grads copied in and dropped, the output (shard_numel,
//   reduce_dtype) made on the reduce-scatter stream, cast to fp32 when reduce_dtype is not, and
//   viewed as each parameter's sharded .grad, or added into the .grad a previous micro-batch
//   left. The final callback drops the last reduce_scatter_state.
// - zero_grad(set_to_none=True) frees the sharded gradients; torch.optim's state is made like
//   each local shard at the first step (fp32, sharded).
// memsim's streams: the collectives run on its communication stream, but the tensors FSDP2
// makes on its copy-in and reduce-scatter streams are allocated by compute-stream ops here (the
// engine allocates a communication op's tensors when it starts, which may be after a later
// compute op frees them); in PyTorch those blocks come from those streams' own pools.
#include "workload/fsdp2.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/check.h"

namespace memsim::workload {

std::int64_t Fsdp2PaddedNumel(const ParamTensor& pt, int world) {
  MEMSIM_CHECK(world >= 1);
  const std::int64_t row = std::max<std::int64_t>(1, pt.row_numel);
  const std::int64_t rows = pt.numel / row;
  return (rows + world - 1) / world * world * row;
}

std::int64_t Fsdp2LocalShardNumel(const ParamTensor& pt, int world) {
  MEMSIM_CHECK(world >= 1);
  const std::int64_t row = std::max<std::int64_t>(1, pt.row_numel);
  const std::int64_t rows = pt.numel / row;
  return std::min(rows, (rows + world - 1) / world) * row;
}

std::vector<Fsdp2Unit> LayoutFsdp2Units(const ModelDims& d, const RankParams& params, int world,
                                        bool reshard_after_forward) {
  std::vector<Fsdp2Unit> units;
  units.push_back({GradSite::kEmbedding, -1, reshard_after_forward, {}, 0, 0});
  std::vector<int> layers;
  for (const ParamTensor& pt : params.params) {
    if (pt.layer >= 0 && std::find(layers.begin(), layers.end(), pt.layer) == layers.end()) {
      layers.push_back(pt.layer);
    }
  }
  std::sort(layers.begin(), layers.end());
  for (int l : layers) units.push_back({GradSite::kLayer, l, reshard_after_forward, {}, 0, 0});
  units.push_back({GradSite::kHead, -1, false, {}, 0, 0});
  for (int i = 0; i < static_cast<int>(params.params.size()); ++i) {
    for (Fsdp2Unit& u : units) {
      if (!params.OnSite(i, u.site, u.layer, d)) continue;
      u.params.push_back(i);
      u.padded_numel += Fsdp2PaddedNumel(params.params[i], world);
      break;
    }
  }
  std::erase_if(units, [](const Fsdp2Unit& u) { return u.params.empty(); });
  for (Fsdp2Unit& u : units) u.shard_numel = u.padded_numel / world;
  return units;
}

namespace {

constexpr Bytes kShardBytes = 4;  // the parameters' own dtype: fp32 (torchtitan training.dtype)

class TorchFsdp2Wrapper final : public DataParallel {
 public:
  TorchFsdp2Wrapper(const ModelDims& d, const RankParams& params, const config::TorchFsdp2& o)
      : d_(d),
        params_(params),
        o_(o),
        world_(d.dp_cp),
        reduce_bytes_(o.reduce_dtype == config::Precision::kFp32 ? 4 : 2),
        units_(LayoutFsdp2Units(d, params, d.dp_cp, o.reshard_after_forward)),
        state_(units_.size()) {
    unit_of_param_.assign(params.params.size(), -1);
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      for (int p : units_[u].params) {
        unit_of_param_[p] = u;
        by_name_[params.params[p].name] = p;
      }
    }
  }

  ConstructedParam Constructed(int param, Bytes /*whole*/) const override {
    return {Fsdp2PaddedNumel(params_.params[param], world_) / world_ * kShardBytes, false};
  }
  void Setup(Emitter& /*em*/, const std::vector<TensorId>& /*param_ids*/) override {}
  bool HoldsMainParams() const override { return true; }
  std::vector<ShardSlice> OptimizerSlices() const override;
  bool ShardsOptimizer() const override { return true; }

  // AccumulateGrad on the unsharded parameter: the gradient is its .grad until post_backward
  // (a second one in the same backward is added into it).
  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override {
    const auto it = by_name_.find(param);
    MEMSIM_CHECK(it != by_name_.end());
    UnitState& s = state_[unit_of_param_[it->second]];
    if (s.unsharded_grads.contains(it->second)) {
      em.Free(grad);
    } else {
      s.unsharded_grads[it->second] = grad;
    }
  }
  void BeforeForward(Emitter& em, GradSite site, int layer) override;
  void AfterForward(Emitter& em, GradSite site, int layer) override;
  void BeforeBackward(Emitter& em, GradSite site, int layer) override {
    PreBackward(em, site, layer);
  }
  void AfterBackward(Emitter& em, GradSite site, int layer) override;
  void EndOfBackward(Emitter& em) override;
  void ZeroGrad(Emitter& em) override;
  WrapperSizes StaticSizes() const override;

 private:
  struct UnitState {
    TensorId all_gather_output = 0;           // issued, not yet copied out
    std::vector<TensorId> unsharded;          // the unsharded parameters (empty: resharded)
    std::map<int, TensorId> unsharded_grads;  // param -> its .grad, until post_backward
    TensorId sharded_grad = 0;                // the reduce-scatter output the .grads view
    bool pre_backward_done = false;
    bool post_backward_done = false;
  };

  int UnitAt(GradSite site, int layer) const {
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      if (units_[u].site == site && (site != GradSite::kLayer || units_[u].layer == layer))
        return u;
    }
    return -1;
  }
  std::string Label(int u) const {
    const Fsdp2Unit& unit = units_[u];
    return unit.site == GradSite::kLayer  ? fmt::format("layers.{}", unit.layer)
           : unit.site == GradSite::kHead ? std::string("norm_output")
                                          : std::string("tok_embeddings");
  }
  void AllGather(Emitter& em, int u);
  void CopyOut(Emitter& em, int u, bool forward);
  void Reshard(Emitter& em, int u);
  void PreBackward(Emitter& em, GradSite site, int layer);
  void PostBackward(Emitter& em, int u);

  const ModelDims& d_;
  const RankParams& params_;
  const config::TorchFsdp2 o_;
  const int world_;
  const Bytes reduce_bytes_;
  const std::vector<Fsdp2Unit> units_;
  std::vector<UnitState> state_;
  std::vector<int> unit_of_param_;
  std::map<std::string, int> by_name_;
  TensorId deferred_all_gather_ = 0;   // comm_ctx.all_gather_state's output
  TensorId reduce_scatter_input_ = 0;  // comm_ctx.reduce_scatter_state's input
};

void TorchFsdp2Wrapper::AllGather(Emitter& em, int u) {
  UnitState& s = state_[u];
  if (!s.unsharded.empty() || s.all_gather_output != 0) return;  // unsharded, or issued
  const Fsdp2Unit& unit = units_[u];
  em.Begin("fsdp2.all_gather_copy_in." + Label(u), unit.layer);
  const TensorId cast = em.Alloc(unit.shard_numel * d_.param_bytes, Category::kTemporaries,
                                 "fsdp2.all_gather_input." + Label(u));
  s.all_gather_output = em.Alloc(unit.padded_numel * d_.param_bytes, Category::kParameters,
                                 "fsdp2.all_gather_output." + Label(u));
  em.Free(cast);
  em.Begin("fsdp2.all_gather." + Label(u), unit.layer, kCommStream);
  em.Collective(CommGroup::kDpCp, world_, static_cast<double>(unit.padded_numel * d_.param_bytes),
                Coll::kGather);
}

void TorchFsdp2Wrapper::CopyOut(Emitter& em, int u, bool forward) {
  UnitState& s = state_[u];
  if (s.all_gather_output == 0) return;        // no preceding unshard
  if (forward && deferred_all_gather_ != 0) {  // the previous group's, freed before the copy-out
    em.Begin("fsdp2.free_all_gather_state", units_[u].layer);
    em.Free(deferred_all_gather_);
    deferred_all_gather_ = 0;
  }
  em.Begin("fsdp2.copy_out." + Label(u), units_[u].layer);
  for (int p : units_[u].params) {
    s.unsharded.push_back(em.Alloc(Fsdp2PaddedNumel(params_.params[p], world_) * d_.param_bytes,
                                   Category::kParameters,
                                   "fsdp2.unsharded." + params_.params[p].name));
  }
  if (forward) {
    deferred_all_gather_ = s.all_gather_output;
  } else {
    em.Free(s.all_gather_output);
  }
  s.all_gather_output = 0;
}

void TorchFsdp2Wrapper::Reshard(Emitter& em, int u) {
  UnitState& s = state_[u];
  if (s.unsharded.empty()) return;
  em.Begin("fsdp2.reshard." + Label(u), units_[u].layer);
  for (TensorId id : s.unsharded) em.Free(id);
  s.unsharded.clear();
}

void TorchFsdp2Wrapper::BeforeForward(Emitter& em, GradSite site, int layer) {
  if (em.phase() == Phase::kBackward) {  // a checkpoint's recompute: pre_backward's work
    PreBackward(em, site, layer);
    return;
  }
  const int u = UnitAt(site, layer);
  if (u < 0) return;
  AllGather(em, u);
  CopyOut(em, u, /*forward=*/true);
  for (int k = 1; k <= o_.forward_prefetch && u + k < static_cast<int>(units_.size()); ++k) {
    AllGather(em, u + k);
  }
}

void TorchFsdp2Wrapper::AfterForward(Emitter& em, GradSite site, int layer) {
  if (em.phase() == Phase::kBackward) return;
  const int u = UnitAt(site, layer);
  if (u >= 0 && units_[u].reshard_after_forward) Reshard(em, u);
  if (site == GradSite::kHead && deferred_all_gather_ != 0) {
    // The root's post-forward drops the last deferred all-gather output.
    em.Begin("fsdp2.root_post_forward");
    em.Free(deferred_all_gather_);
    deferred_all_gather_ = 0;
  }
}

void TorchFsdp2Wrapper::PreBackward(Emitter& em, GradSite site, int layer) {
  const int u = UnitAt(site, layer);
  if (u < 0 || state_[u].pre_backward_done) return;
  state_[u].pre_backward_done = true;
  AllGather(em, u);
  CopyOut(em, u, /*forward=*/false);
  if (u > 0 && !state_[u - 1].pre_backward_done) AllGather(em, u - 1);  // backward prefetch
}

void TorchFsdp2Wrapper::AfterBackward(Emitter& em, GradSite site, int layer) {
  const int u = UnitAt(site, layer);
  // The embedding's inputs (token ids) need no grad: its post_backward waits for the root.
  if (u < 0 || site == GradSite::kEmbedding) return;
  PostBackward(em, u);
}

void TorchFsdp2Wrapper::PostBackward(Emitter& em, int u) {
  UnitState& s = state_[u];
  if (s.post_backward_done) return;
  s.post_backward_done = true;
  Reshard(em, u);
  if (s.unsharded_grads.empty()) return;
  const Fsdp2Unit& unit = units_[u];
  if (reduce_scatter_input_ != 0) {  // the previous group's reduce_scatter_state
    em.Begin("fsdp2.free_reduce_scatter_state", unit.layer);
    em.Free(reduce_scatter_input_);
  }
  em.Begin("fsdp2.reduce_scatter_copy_in." + Label(u), unit.layer);
  reduce_scatter_input_ = em.Alloc(unit.padded_numel * reduce_bytes_, Category::kGradients,
                                   "fsdp2.reduce_scatter_input." + Label(u));
  for (const auto& [param, grad] : s.unsharded_grads) em.Free(grad);
  s.unsharded_grads.clear();
  em.Begin("fsdp2.reduce_scatter." + Label(u), unit.layer, kCommStream);
  em.Collective(CommGroup::kDpCp, world_, static_cast<double>(unit.padded_numel * reduce_bytes_),
                Coll::kGather);
  em.Begin("fsdp2.reduce_scatter_output." + Label(u), unit.layer);
  TensorId out = em.Alloc(unit.shard_numel * reduce_bytes_, Category::kGradients,
                          "fsdp2.reduce_scatter_output." + Label(u));
  if (reduce_bytes_ != kShardBytes) {  // _to_dtype_if_needed(reduce_output, orig_dtype)
    const TensorId wide = em.Alloc(unit.shard_numel * kShardBytes, Category::kGradients,
                                   "fsdp2.sharded_grad." + Label(u));
    em.Free(out);
    out = wide;
  }
  if (s.sharded_grad == 0) {
    s.sharded_grad = out;  // viewed as each parameter's sharded .grad
  } else {
    em.Free(out);  // sharded_param.grad += new_sharded_grad
  }
}

void TorchFsdp2Wrapper::EndOfBackward(Emitter& em) {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) PostBackward(em, u);
  em.Begin("fsdp2.root_post_backward");
  em.Free(reduce_scatter_input_);
  reduce_scatter_input_ = 0;
  for (UnitState& s : state_) s.pre_backward_done = s.post_backward_done = false;
}

void TorchFsdp2Wrapper::ZeroGrad(Emitter& em) {
  if (!o_.zero_grad_set_to_none) return;
  for (UnitState& s : state_) {
    em.Free(s.sharded_grad);
    s.sharded_grad = 0;
  }
}

std::vector<ShardSlice> TorchFsdp2Wrapper::OptimizerSlices() const {
  std::vector<ShardSlice> out;
  for (const std::vector<int>& group : params_.groups) {
    for (int i : group) out.push_back({i, Fsdp2LocalShardNumel(params_.params[i], world_)});
  }
  return out;
}

WrapperSizes TorchFsdp2Wrapper::StaticSizes() const {
  WrapperSizes s;
  s.fp32_optimizer_grads = true;
  for (const Fsdp2Unit& u : units_) {
    s.main_param_bytes += u.shard_numel * kShardBytes;  // the fp32 shards the optimizer steps
    s.gradient_bytes += u.shard_numel * kShardBytes;
  }
  return s;
}

}  // namespace

std::unique_ptr<DataParallel> NewTorchFsdp2(const ModelDims& d, const RankParams& params,
                                            const config::TorchFsdp2& fsdp) {
  return std::make_unique<TorchFsdp2Wrapper>(d, params, fsdp);
}

}  // namespace memsim::workload
