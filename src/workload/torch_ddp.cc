// PyTorch DistributedDataParallel around a plain PyTorch loop (framework "pytorch" or
// "hf-trainer" over data_parallel_size > 1 processes). Sources: torch/nn/parallel/distributed.py
// (DistributedDataParallel.__init__, _build_params_for_reducer, _ddp_init_helper, _pre_forward,
// no_sync), torch/csrc/distributed/c10d/reducer.cpp (Reducer::initialize_buckets,
// autograd_hook, mark_variable_ready_dense, finalize_backward, copy_bucket_to_grad,
// rebuild_buckets) and comm.cpp (broadcast_coalesced).
// - Construction: _sync_module_states broadcasts every parameter from rank 0 in coalesced
//   buckets of 250 MiB (broadcast_coalesced: a bucket of several tensors is flattened into one
//   new tensor by torch/csrc/utils/tensor_flatten.h flatten_dense_tensors, a bucket of one is a
//   view; at most two buckets in flight). Then the Reducer allocates one flat `gradients` tensor
//   per bucket (initialize_buckets: at::empty of the bucket's numel in the parameters' dtype),
//   over the parameters that require grad (_build_params_for_reducer: named_modules order,
//   shared parameters once). The construction-time assignment (_ddp_init_helper): with
//   find_unused_parameters False a single bucket of everything (limit sys.maxsize); with True,
//   limits [1 MiB, bucket_cap_mb] (or [bucket_cap_mb] when bucket_cap_mb was passed), sorted by
//   first parameter index, then the bucket list reversed so that the last-registered
//   parameters' bucket is reduced first. find_unused_parameters True also allocates
//   local_used_map_dev_ (int32 per parameter, initialize_local_used_map).
// - Backward: AccumulateGrad makes param.grad (adopting the first gradient, adding later ones in
//   place); then the Reducer's hook copies it into its bucket view (mark_variable_ready_dense).
//   With gradient_as_bucket_view False (DDP's default, and the Trainer's: accelerate's
//   DistributedDataParallelKwargs) .grad stays a tensor of its own and finalize_backward copies
//   the reduced bucket back into it (copy_bucket_to_grad): the gradients exist twice. With True
//   .grad becomes the view and the separate tensor is freed. A bucket is all-reduced (in place,
//   group "dp") once all its parameters are ready, in bucket order.
// - Gradient accumulation: under no_sync (the Trainer wraps every micro-batch but the last of a
//   step, transformers/trainer.py _inner_training_loop) the hooks return early: gradients only
//   accumulate in .grad. The last micro-batch's backward reduces.
// - Rebuild: with find_unused_parameters False the Reducer records the order gradients became
//   ready in the first synchronised backward and, at the next forward with grad enabled
//   (_pre_forward: reducer._rebuild_buckets), drops its buckets (buckets_.clear()) and allocates
//   new ones over that order with limits [1 MiB (or bucket_cap_mb when passed), bucket_cap_mb]:
//   why step 2's gradient memory is laid out differently from step 1's.
// Not modelled: buffers in the start-up broadcast and in each forward's _sync_buffers
// (Transformers' rotary inv_freq, a few KiB; a bucket of one tensor is a view), the small
// metadata tensors of _verify_param_shape_across_processes, static_graph, comm hooks.
// Since a rebuild follows find_unused_parameters False only, the layout it replaces is one
// bucket per dtype.
#include "workload/torch_ddp.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>

#include "core/check.h"
#include "workload/data_parallel.h"

namespace memsim::workload {

std::vector<std::vector<int>> DdpBucketAssignment(const std::vector<DdpTensor>& tensors,
                                                  const std::vector<Bytes>& limits,
                                                  bool sort_by_min_index) {
  MEMSIM_CHECK(!limits.empty());
  struct Open {
    std::vector<int> indices;
    Bytes bytes = 0;
    std::size_t limit = 0;  // index into limits
  };
  std::map<int, Open> open;  // by dtype key
  std::vector<std::vector<int>> out;
  for (const DdpTensor& t : tensors) {
    Open& b = open[t.dtype];
    b.indices.push_back(t.index);
    b.bytes += t.bytes;
    if (b.bytes >= limits[b.limit]) {
      out.push_back(std::move(b.indices));
      b.indices.clear();
      b.bytes = 0;
      b.limit = std::min(b.limit + 1, limits.size() - 1);
    }
  }
  for (auto& [key, b] : open) {
    if (!b.indices.empty()) out.push_back(std::move(b.indices));
  }
  if (sort_by_min_index) {
    std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
      return *std::min_element(x.begin(), x.end()) < *std::min_element(y.begin(), y.end());
    });
  }
  return out;
}

namespace {

class TorchDdpWrapper final : public DataParallel {
 public:
  TorchDdpWrapper(const ModelDims& d, const RankParams& params, const config::TorchDdp& cfg)
      : d_(d), params_(params), cfg_(cfg), grad_(params.params.size(), 0),
        is_view_(params.params.size(), false), locator_(params.params.size(), -1) {
    for (int i = 0; i < static_cast<int>(params.params.size()); ++i) {
      index_[params.params[i].name] = i;
      if (!params.params[i].frozen) reducer_params_.push_back(i);
    }
    const double cap_mb = cfg.bucket_cap_mb > 0 ? cfg.bucket_cap_mb : kDdpDefaultBucketCapMb;
    cap_bytes_ = static_cast<Bytes>(cap_mb * 1024 * 1024);
    // _ddp_init_helper: the first bucket's cap is 1 MiB unless bucket_cap_mb was passed.
    first_cap_bytes_ = cfg.bucket_cap_mb > 0 ? cap_bytes_ : kDdpFirstBucketBytes;
    MakeBuckets(InitialAssignment());
  }

  void Setup(Emitter& em, const std::vector<TensorId>& /*param_ids*/) override {
    SyncModuleStates(em);
    em.Begin("init.ddp.reducer");
    AllocBuckets(em);
    if (cfg_.find_unused_parameters) {
      em.Alloc(static_cast<Bytes>(reducer_params_.size()) * 4, Category::kOther,
               "ddp.local_used_map");
    }
  }
  std::vector<ShardSlice> OptimizerSlices() const override { return params_.Whole(); }
  bool ShardsOptimizer() const override { return false; }

  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override {
    const auto it = index_.find(param);
    MEMSIM_CHECK(it != index_.end());
    const int i = it->second;
    if (grad_[i] == 0 && !is_view_[i]) {
      grad_[i] = grad;  // AccumulateGrad adopts it as .grad
    } else {
      em.Free(grad);  // added in place into .grad (a tensor or a bucket view)
    }
    if (!Syncing()) return;  // no_sync: the Reducer's hook returns early
    // mark_variable_ready_dense: the grad copied into its bucket view; with
    // gradient_as_bucket_view .grad becomes that view and its own tensor is dropped.
    if (cfg_.gradient_as_bucket_view && !is_view_[i]) {
      em.Free(grad_[i]);
      grad_[i] = 0;
      is_view_[i] = true;
    }
    if (!rebuilt_ && !cfg_.find_unused_parameters) ready_order_.push_back(i);
    MEMSIM_CHECK(locator_[i] >= 0 && buckets_[locator_[i]].pending > 0);
    --buckets_[locator_[i]].pending;
  }

  // Buckets made ready by the previous site are launched when the next one starts (or at the
  // end of the backward): the hook itself runs inside the op that made the gradient.
  void BeforeBackward(Emitter& em, GradSite /*site*/, int /*layer*/) override {
    if (Syncing()) LaunchReadyBuckets(em);
  }
  void EndOfBackward(Emitter& em) override {
    if (Syncing()) {
      LaunchReadyBuckets(em);
      MEMSIM_CHECK(next_bucket_ == buckets_.size());
      // finalize_backward (queued on the autograd engine): wait for each bucket's all-reduce,
      // copy the reduced bucket back into .grad (copy_bucket_to_grad; in place, .grad exists).
      em.Begin("ddp.finalize_backward");
      for (Bucket& b : buckets_) b.pending = static_cast<int>(b.params.size());
      next_bucket_ = 0;
      // should_rebuild_buckets: never with find_unused_parameters.
      rebuild_due_ = !rebuilt_ && !cfg_.find_unused_parameters;
    }
    ++backward_steps_;
  }
  // _pre_forward: reducer._rebuild_buckets() before the module's forward, once.
  void BeforeForward(Emitter& em, GradSite site, int /*layer*/) override {
    if (site == GradSite::kEmbedding && rebuild_due_) RebuildBuckets(em);
  }
  // Trainer's model.zero_grad() / optimizer.zero_grad(): set_to_none drops .grad (views
  // included; the buckets stay).
  void ZeroGrad(Emitter& em) override {
    if (!cfg_.zero_grad_set_to_none) return;
    for (std::size_t i = 0; i < grad_.size(); ++i) {
      em.Free(grad_[i]);
      grad_[i] = 0;
      is_view_[i] = false;
    }
  }

  WrapperSizes StaticSizes() const override {
    WrapperSizes s;
    for (const ParamTensor& pt : params_.params) {
      s.parameter_bytes += StorageBytes(pt);
      if (pt.frozen) continue;
      const Bytes grad = GradBytes(pt);
      s.gradient_bytes += cfg_.gradient_as_bucket_view ? grad : 2 * grad;  // bucket (+ .grad)
    }
    return s;
  }

 private:
  struct Bucket {
    std::vector<int> params;  // param indices, in the bucket's order
    Bytes bytes = 0;
    TensorId id = 0;
    int pending = 0;  // parameters not yet ready in this backward
  };

  Bytes StorageBytes(const ParamTensor& pt) const {
    return pt.storage_bytes > 0 ? pt.storage_bytes : pt.numel * d_.param_bytes;
  }
  // A trainable parameter's gradient: its own dtype (a PEFT adapter's storage), else grad_bytes.
  Bytes GradBytes(const ParamTensor& pt) const {
    return pt.storage_bytes > 0 ? pt.storage_bytes : pt.numel * d_.grad_bytes;
  }
  // The dtype key: bytes per element (a packed 4-bit weight's storage is uint8: key 1).
  int DtypeKey(const ParamTensor& pt) const {
    const Bytes bytes = StorageBytes(pt);
    return bytes % pt.numel == 0 ? static_cast<int>(bytes / pt.numel) : 1;
  }
  DdpTensor TensorOf(int param) const {
    const ParamTensor& pt = params_.params[param];
    return DdpTensor{param, GradBytes(pt), DtypeKey(pt)};
  }
  bool Syncing() const { return backward_steps_ % d_.m == d_.m - 1; }

  // _ddp_init_helper's assignment over the reducer's parameters, reversed.
  std::vector<std::vector<int>> InitialAssignment() const {
    std::vector<DdpTensor> tensors;
    for (int i : reducer_params_) tensors.push_back(TensorOf(i));
    std::vector<Bytes> limits = {std::numeric_limits<Bytes>::max()};
    if (cfg_.find_unused_parameters) {
      limits = cfg_.bucket_cap_mb > 0 ? std::vector<Bytes>{cap_bytes_}
                                      : std::vector<Bytes>{kDdpFirstBucketBytes, cap_bytes_};
    }
    std::vector<std::vector<int>> buckets = DdpBucketAssignment(tensors, limits, true);
    std::reverse(buckets.begin(), buckets.end());
    return buckets;
  }
  void MakeBuckets(const std::vector<std::vector<int>>& assignment) {
    buckets_.clear();
    for (const std::vector<int>& params : assignment) {
      Bucket b;
      b.params = params;
      for (int p : params) {
        b.bytes += GradBytes(params_.params[p]);
        locator_[p] = static_cast<int>(buckets_.size());
      }
      b.pending = static_cast<int>(params.size());
      buckets_.push_back(std::move(b));
    }
    next_bucket_ = 0;
  }
  void AllocBuckets(Emitter& em) {
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      buckets_[k].id = em.Alloc(buckets_[k].bytes, Category::kGradients,
                                fmt::format("ddp.bucket{}.gradients", k));
    }
  }

  // DistributedDataParallel.__init__ → _sync_module_states → dist._broadcast_coalesced over
  // every named parameter (frozen ones too), 250 MiB buckets, two in flight.
  void SyncModuleStates(Emitter& em) {
    std::vector<DdpTensor> tensors;
    for (int i = 0; i < static_cast<int>(params_.params.size()); ++i) {
      const ParamTensor& pt = params_.params[i];
      tensors.push_back(DdpTensor{i, StorageBytes(pt), DtypeKey(pt)});
    }
    std::deque<TensorId> in_flight;
    for (const std::vector<int>& bucket :
         DdpBucketAssignment(tensors, {kDdpBroadcastBucketBytes}, true)) {
      em.Begin("init.ddp.sync_module_states");
      if (in_flight.size() >= 2) {  // BroadcastWork::finish of the oldest
        em.Free(in_flight.front());
        in_flight.pop_front();
      }
      Bytes bytes = 0;
      for (int i : bucket) bytes += StorageBytes(params_.params[i]);
      // flatten_dense_tensors: one tensor is viewed, several are concatenated.
      in_flight.push_back(bucket.size() > 1 ? em.Alloc(bytes, Category::kTemporaries,
                                                       "ddp.broadcast_coalesced.flat")
                                            : 0);
      em.Collective(CommGroup::kDp, d_.d, static_cast<double>(bytes), Coll::kP2P);
    }
    em.Begin("init.ddp.sync_module_states");
    for (TensorId id : in_flight) em.Free(id);
  }

  // mark_bucket_ready: buckets are all-reduced in order, each once all its grads are in.
  void LaunchReadyBuckets(Emitter& em) {
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
      em.Begin("ddp.bucket_all_reduce", -1, kCommStream);
      em.Collective(CommGroup::kDp, d_.d, static_cast<double>(buckets_[next_bucket_].bytes),
                    Coll::kAllReduce);
      ++next_bucket_;
    }
  }

  // Reducer::rebuild_buckets: the gradient-ready order of the first synchronised backward,
  // limits [first cap, cap], synced from rank 0 (sync_bucket_indices: two small int32 device
  // tensors), then initialize_buckets: the old buckets dropped first (buckets_.clear()), the
  // new ones allocated. With gradient_as_bucket_view and .grad still set (zero_grad without
  // set_to_none) each .grad is copied into its new view, so the old buckets live until then.
  void RebuildBuckets(Emitter& em) {
    std::vector<DdpTensor> order;
    for (int i : ready_order_) order.push_back(TensorOf(i));
    const std::vector<std::vector<int>> assignment =
        DdpBucketAssignment(order, {first_cap_bytes_, cap_bytes_}, false);
    std::vector<TensorId> old;
    for (const Bucket& b : buckets_) old.push_back(b.id);
    bool views_alive = false;
    for (std::size_t i = 0; i < is_view_.size(); ++i) views_alive = views_alive || is_view_[i];
    em.Begin("ddp.rebuild_buckets");
    const TensorId indices = em.Alloc((static_cast<Bytes>(ready_order_.size()) + 1) * 4,
                                      Category::kTemporaries, "ddp.rebuild.indices");
    const TensorId sizes = em.Alloc(static_cast<Bytes>(assignment.size()) * 4,
                                    Category::kTemporaries, "ddp.rebuild.bucket_sizes");
    em.Free(indices);
    em.Free(sizes);
    if (!views_alive) {
      for (TensorId id : old) em.Free(id);
      em.Begin("ddp.rebuild_buckets.initialize");
    }
    MakeBuckets(assignment);
    AllocBuckets(em);
    if (views_alive) {
      for (TensorId id : old) em.Free(id);
    }
    ready_order_.clear();
    rebuild_due_ = false;
    rebuilt_ = true;
  }

  const ModelDims& d_;
  const RankParams& params_;
  const config::TorchDdp cfg_;
  std::map<std::string, int> index_;  // parameter name -> param index
  std::vector<int> reducer_params_;   // the parameters that require grad, in order
  Bytes cap_bytes_ = 0, first_cap_bytes_ = 0;
  std::vector<Bucket> buckets_;
  std::size_t next_bucket_ = 0;      // the next bucket to all-reduce in this backward
  std::vector<TensorId> grad_;       // .grad of each parameter as its own tensor (0: none)
  std::vector<bool> is_view_;        // .grad is a view into its bucket
  std::vector<int> locator_;         // bucket of each trainable parameter (-1: frozen)
  std::vector<int> ready_order_;     // gradient-ready order of the first synchronised backward
  int backward_steps_ = 0;           // backward_steps run so far
  bool rebuild_due_ = false;         // the next grad-enabled forward rebuilds the buckets
  bool rebuilt_ = false;             // has_rebuilt_bucket_
};

}  // namespace

std::unique_ptr<DataParallel> NewTorchDdp(const ModelDims& d, const RankParams& params,
                                          const config::TorchDdp& ddp) {
  return std::make_unique<TorchDdpWrapper>(d, params, ddp);
}

}  // namespace memsim::workload
