// DeepSpeed ZeRO-3 under the Hugging Face Trainer (config::DeepSpeedZero with stage 3):
// DeepSpeedZeroOptimizer_Stage3 (deepspeed/runtime/zero/stage3.py), zero.Init
// (runtime/zero/partition_parameters.py) and the parameter coordinator
// (runtime/zero/partitioned_param_coordinator.py PartitionedParameterCoordinator), v0.16.9.
// DP rank 0 is simulated; elements are 16-bit (the model dtype) unless said otherwise.
// - Construction (Init._post_init_method, _partition_param): each parameter keeps its ds_tensor,
//   ceil(numel / d) elements (the padding is the last rank's), and frees its storage; with
//   offload_param cpu the ds_tensor is on the host, except for persistent parameters (numel <=
//   stage3_param_persistence_threshold, parameter_offload.py mark_persistent_parameters), whose
//   ds_tensor stays on the device.
// - Optimizer __init__: _create_fp16_partitions_with_defragmentation moves the trainable
//   partitions into one flat buffer (defragment, through the host: no device copy); the
//   trainable partitions are cut into sub-groups of sub_group_size elements
//   (_create_fp16_sub_groups); _setup_for_real_optimizer makes an fp32 partition per sub-group
//   (.clone().float(), the clone transient), initialize_optimizer_states' zeros gradient buffer
//   of the largest sub-group (fp32, dropped again unless offload_optimizer), the ipg bucket
//   (reduce_bucket_size elements, with contiguous_gradients) and grad_partitions_flat_buffer (the
//   sum of partitions, in the gradient-accumulation dtype, the model's under ZeRO: engine.py
//   get_data_types), both kept for the run. With offload_optimizer cpu the fp32 partitions,
//   their gradient buffers and grad_partitions_flat_buffer are on the host.
// - Gathers (the coordinator): before each submodule's forward and backward (parameter_offload.py
//   pre_sub_module_forward_function / pre_sub_module_backward_function) fetch_sub_module
//   all-gathers the submodule's own parameters; one parameter into a buffer of ceil(n/d)·d
//   elements that becomes its data, several into one flat buffer (_all_gather_dtype) from which
//   AllGatherCoalescedHandle.wait torch.cat's each parameter's own tensor (n elements), the flat
//   buffer dropped once every parameter of the handle has left the in-flight registry. After the
//   module release_sub_module frees them. The first micro-batch of the run records the module
//   trace (reset_step at the root module's forward pre-hook: INVALID -> RECORD -> COMPLETE);
//   without a complete trace every parameter of the module is released, persistent ones too.
//   With it, fetch prefetches the next parameters of the trace, up to
//   stage3_prefetch_bucket_size elements and stage3_max_live_parameters available, and release
//   keeps a parameter that is persistent, was prefetched for a later use, or is used again
//   within stage3_max_reuse_distance elements of the trace (__params_to_release). The embedding's
//   post-backward hook never runs (its input, the token ids, needs no gradient), so its weight
//   stays gathered after the backward.
// - Gradients: each one goes to the ipg bucket (reduce_independent_p_g_buckets_and_remove_grads:
//   copied into it and freed when it fits, kept as its own tensor otherwise); a full bucket, and
//   the last one at independent_gradient_partition_epilogue, is reduce-scattered
//   (__avg_scatter_grads -> comm/coalesced_collectives.py reduce_scatter_coalesced: a padded
//   copy of the bucket, ceil(n/d)·d per parameter, unless it is one parameter that d divides) and
//   partition_grads copies (first micro-batch) or adds the rank's partition into
//   grad_partitions_flat_buffer. With offload_optimizer each partition passes through a device
//   copy of itself (grad_buffer.to(device)), and at the accumulation boundary an fp32 copy.
// - step: _partition_all_parameters (every gathered parameter freed); get_grad_norm_direct, a
//   float64 copy of each partition gradient one at a time; per sub-group the partition's
//   gradients flattened and cast to fp32 (_prepare_fp32_grad_for_sub_group), Adam over the fp32
//   partition (lazy state), the fp32 gradient dropped (_release_sub_group); _post_step gathers the
//   persistent parameters again. With offload_optimizer the step runs on the host.
// Modules are the parameters' own submodules (a name without its last component), in the
// order memsim lists a site's parameters; the hooks memsim has are per site (the embedding, a
// decoder layer, the head), so a site's gathers are emitted before its forward or backward and
// its releases after it: memsim errs high, by the parameters DeepSpeed frees inside the site
// before its last submodule runs (at most one layer's). Not modelled: the sub-groups stepped one
// at a time (all fp32 gradients live together: high by all but one sub-group's), the step of
// evaluation batches (Trainer.evaluate's forward passes gather nothing here), NVMe offload.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "core/check.h"
#include "workload/data_parallel.h"

namespace memsim::workload {
namespace {

enum class Status { kNotAvailable, kInflight, kAvailable };  // ZeroParamStatus
enum class TraceMode { kInvalid, kRecord, kComplete };         // ZeRoTraceMode

struct GatherHandle {
  TensorId flat = 0;        // _all_gather_dtype's flat_tensor (0: one parameter)
  std::vector<int> params;  // the parameters gathered by the call
  int pending = 0;          // of them, still in the in-flight registry
  bool complete = false;    // wait() has split the flat buffer into the parameters
};

class DeepSpeedZero3Wrapper final : public DataParallel {
 public:
  DeepSpeedZero3Wrapper(const ModelDims& d, const RankParams& params,
                        const config::DeepSpeedZero& z);

  ConstructedParam Constructed(int i, Bytes /*whole*/) const override {
    return {DeviceShard(i), true};
  }
  void Setup(Emitter& em, const std::vector<TensorId>& param_ids) override;
  bool HoldsMainParams() const override { return true; }
  std::vector<ShardSlice> OptimizerSlices() const override {
    return z_.offload_optimizer_cpu ? std::vector<ShardSlice>{} : SubGroupSlices();
  }
  std::vector<ShardSlice> HostOptimizerSlices() const override {
    return z_.offload_optimizer_cpu ? SubGroupSlices() : std::vector<ShardSlice>{};
  }
  bool ShardsOptimizer() const override { return true; }

  void BeforeForward(Emitter& em, GradSite site, int layer) override;
  void AfterForward(Emitter& em, GradSite /*site*/, int /*layer*/) override { Flush(em); }
  void BeforeBackward(Emitter& em, GradSite site, int layer) override;
  void AfterBackward(Emitter& em, GradSite /*site*/, int /*layer*/) override { Flush(em); }
  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override;
  void EndOfBackward(Emitter& em) override;
  void BeforeOptimizerStep(Emitter& em, bool skipped) override;
  void AfterOptimizerStep(Emitter& em) override;
  WrapperSizes StaticSizes() const override;

 private:
  struct SubGroup {
    std::vector<int> params;
    std::int64_t numel = 0;  // sum of the partitions
  };
  Bytes Elem() const { return d_.param_bytes; }
  std::int64_t Numel(int i) const { return params_.params[i].numel; }
  std::int64_t PartNumel(int i) const { return (Numel(i) + d_.d - 1) / d_.d; }
  Bytes Whole(int i) const {
    const ParamTensor& pt = params_.params[i];
    return pt.storage_bytes > 0 ? pt.storage_bytes : pt.numel * Elem();
  }
  Bytes Shard(int i) const {  // the ds_tensor's bytes
    const ParamTensor& pt = params_.params[i];
    return pt.storage_bytes > 0 ? (pt.storage_bytes + d_.d - 1) / d_.d : PartNumel(i) * Elem();
  }
  Bytes Padded(int i) const { return Shard(i) * d_.d; }  // an all-gather's output
  Bytes DeviceShard(int i) const {
    return z_.offload_param_cpu && !persist_[i] ? 0 : Shard(i);
  }
  bool Boundary() const { return backward_steps_ % d_.m == d_.m - 1; }
  std::vector<ShardSlice> SubGroupSlices() const;
  void BuildModules();
  void BuildSubGroups();
  const std::vector<int>& SiteModules(GradSite site, int layer) const;

  // The coordinator.
  void ResetStep(Emitter& em);
  void RunModule(Emitter& em, int m, bool release);
  void Fetch(Emitter& em, int m);
  void Prefetch(Emitter& em);
  void Gather(Emitter& em, const std::vector<int>& ps);
  void Wait(Emitter& em, int p);
  void Release(int m);
  void ReleaseParam(int p);
  void ReleaseAll(Emitter& em);
  void Flush(Emitter& em);

  // Gradients.
  void ReduceBucket(Emitter& em);
  void FlushReductions(Emitter& em);
  void OffloadPartition(Emitter& em, int p);

  const ModelDims& d_;
  const RankParams& params_;
  const config::DeepSpeedZero z_;
  std::vector<bool> persist_;
  std::vector<std::vector<int>> modules_;             // each submodule's parameters
  std::map<std::pair<int, int>, std::vector<int>> site_modules_;  // (site, layer) -> modules
  std::vector<SubGroup> sub_groups_;
  std::map<std::string, int> index_;

  // Coordinator state (PartitionedParameterCoordinator).
  std::vector<Status> status_;
  std::vector<TensorId> data_;          // the gathered whole tensor
  std::vector<int> handle_of_;          // index into handles_, -1: not in flight
  std::vector<std::set<int>> active_;   // ds_active_sub_modules: the modules using it
  std::vector<GatherHandle> handles_;
  TraceMode mode_ = TraceMode::kInvalid;
  std::vector<int> trace_;              // __submodule_order
  std::deque<std::pair<int, int>> queue_;  // __param_queue: (param, step_id_last_used_at)
  std::vector<std::int64_t> most_recent_;  // __most_recent_step_id_param_fetched_for
  int step_ = 0;
  std::int64_t available_ = 0;          // __n_available_params
  std::vector<TensorId> releases_;      // freed at the site's end
  int layer_ = -1;                      // the site's layer, for the ops' labels

  // Gradient state.
  std::vector<TensorId> own_grad_;      // a gradient kept as its own tensor in the bucket
  std::vector<int> bucket_;
  std::int64_t bucket_elems_ = 0;
  int backward_steps_ = 0;
  std::vector<TensorId> fp32_grads_;
  std::vector<double> pending_;         // bytes of the buckets reduced, not yet launched
};

DeepSpeedZero3Wrapper::DeepSpeedZero3Wrapper(const ModelDims& d, const RankParams& params,
                                             const config::DeepSpeedZero& z)
    : d_(d), params_(params), z_(z) {
  const std::size_t n = params.params.size();
  persist_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    persist_[i] = params.params[i].numel <= z.param_persistence_threshold;
    index_[params.params[i].name] = static_cast<int>(i);
  }
  status_.assign(n, Status::kNotAvailable);
  data_.assign(n, 0);
  handle_of_.assign(n, -1);
  active_.assign(n, {});
  most_recent_.assign(n, -10'000'000'000);
  own_grad_.assign(n, 0);
  BuildModules();
  BuildSubGroups();
}

// A site's parameters grouped by submodule (their name without the last component), in the
// site's order; a tied output weight is a module of the head of its own.
void DeepSpeedZero3Wrapper::BuildModules() {
  std::vector<std::pair<GradSite, int>> sites = {{GradSite::kEmbedding, -1}};
  std::set<int> layers;
  for (const ParamTensor& pt : params_.params) {
    if (pt.layer >= 0) layers.insert(pt.layer);
  }
  for (int l : layers) sites.push_back({GradSite::kLayer, l});
  sites.push_back({GradSite::kHead, -1});
  for (const auto& [site, layer] : sites) {
    std::vector<int>& list = site_modules_[{static_cast<int>(site), layer}];
    std::map<std::string, int> by_prefix;
    for (int i = 0; i < static_cast<int>(params_.params.size()); ++i) {
      if (!params_.OnSite(i, site, layer, d_)) continue;
      const std::string& name = params_.params[i].name;
      const std::string prefix = name.substr(0, name.rfind('.'));
      auto [it, added] = by_prefix.emplace(prefix, static_cast<int>(modules_.size()));
      if (added) {
        modules_.emplace_back();
        list.push_back(it->second);
      }
      modules_[it->second].push_back(i);
    }
  }
}

// _create_fp16_sub_groups per optimizer param group: trainable parameters in the group's order,
// a sub-group closed once its partitions reach sub_group_size elements.
void DeepSpeedZero3Wrapper::BuildSubGroups() {
  for (const std::vector<int>& group : params_.groups) {
    std::vector<int> trainable;
    for (int i : group) {
      if (!params_.params[i].frozen) trainable.push_back(i);
    }
    SubGroup cur;
    for (std::size_t k = 0; k < trainable.size(); ++k) {
      cur.params.push_back(trainable[k]);
      cur.numel += PartNumel(trainable[k]);
      if (cur.numel >= z_.sub_group_size || k + 1 == trainable.size()) {
        sub_groups_.push_back(cur);
        cur = SubGroup{};
      }
    }
  }
}

std::vector<ShardSlice> DeepSpeedZero3Wrapper::SubGroupSlices() const {
  std::vector<ShardSlice> out;  // one flat fp32 partition per sub-group
  for (const SubGroup& g : sub_groups_) out.push_back({g.params[0], g.numel});
  return out;
}

const std::vector<int>& DeepSpeedZero3Wrapper::SiteModules(GradSite site, int layer) const {
  static const std::vector<int> kNone;
  const auto it = site_modules_.find({static_cast<int>(site), site == GradSite::kLayer ? layer : -1});
  return it == site_modules_.end() ? kNone : it->second;
}

void DeepSpeedZero3Wrapper::Setup(Emitter& em, const std::vector<TensorId>& param_ids) {
  std::int64_t total = 0, largest = 0;
  for (const SubGroup& g : sub_groups_) {
    total += g.numel;
    largest = std::max(largest, g.numel);
  }
  if (!z_.offload_param_cpu) {  // defragment: the trainable partitions into one buffer
    em.Begin("init.zero3.defragment");
    for (const SubGroup& g : sub_groups_) {
      for (int i : g.params) em.Free(param_ids[i]);
    }
    em.Alloc(total * Elem(), Category::kParameters, "zero3.lp_param_buffer");
  }
  if (!z_.offload_optimizer_cpu) {
    for (const SubGroup& g : sub_groups_) {
      em.Begin("init.zero3.fp32_partition");
      // .to(device) (from the host with offload_param), .clone(), .float()
      const TensorId moved = z_.offload_param_cpu ? em.Alloc(g.numel * Elem(),
                                                             Category::kTemporaries,
                                                             "zero3.partition_to_device")
                                                  : 0;
      const TensorId clone = Elem() != 4 ? em.Alloc(g.numel * Elem(), Category::kTemporaries,
                                                    "zero3.partition_clone")
                                         : 0;
      em.Alloc(g.numel * 4, Category::kMainParameters, "zero3.fp32_partitioned_groups_flat");
      em.Free(clone);
      em.Free(moved);
    }
    em.Begin("init.zero3.initialize_optimizer_states");
    em.Free(em.Alloc(largest * 4, Category::kTemporaries, "zero3.optimizer_states_gradient_buffer"));
  }
  em.Begin("init.zero3.setup_for_real_optimizer");
  if (z_.contiguous_gradients && z_.reduce_bucket_size > 0) {
    em.Alloc(z_.reduce_bucket_size * Elem(), Category::kGradients, "zero3.ipg_bucket_flat_buffer");
  }
  if (!z_.offload_optimizer_cpu) {
    em.Alloc(total * Elem(), Category::kGradients, "zero3.grad_partitions_flat_buffer");
  }
}

// ---- The coordinator --------------------------------------------------------------------

void DeepSpeedZero3Wrapper::BeforeForward(Emitter& em, GradSite site, int layer) {
  FlushReductions(em);
  layer_ = site == GradSite::kLayer ? layer : -1;
  // _start_of_forward_hook, the root module's forward pre-hook: the embedding runs first.
  if (site == GradSite::kEmbedding) ResetStep(em);
  for (int m : SiteModules(site, layer)) RunModule(em, m, true);
}

void DeepSpeedZero3Wrapper::BeforeBackward(Emitter& em, GradSite site, int layer) {
  FlushReductions(em);
  layer_ = site == GradSite::kLayer ? layer : -1;
  const std::vector<int>& ms = SiteModules(site, layer);
  // The embedding's post-backward hook never fires (its input needs no gradient).
  for (auto it = ms.rbegin(); it != ms.rend(); ++it) {
    RunModule(em, *it, site != GradSite::kEmbedding);
  }
}

// reset_step: the in-flight parameters waited for and released, the trace advanced
// (INVALID -> RECORD -> COMPLETE), the fetch queue rebuilt from the trace.
void DeepSpeedZero3Wrapper::ResetStep(Emitter& em) {
  for (int p = 0; p < static_cast<int>(handle_of_.size()); ++p) {
    if (handle_of_[p] < 0) continue;
    Wait(em, p);
    ReleaseParam(p);
  }
  Flush(em);
  if (mode_ == TraceMode::kRecord) {
    mode_ = TraceMode::kComplete;
  } else if (mode_ == TraceMode::kInvalid) {
    mode_ = TraceMode::kRecord;
    trace_.clear();
  }
  queue_.clear();
  if (mode_ == TraceMode::kComplete) {
    for (int k = 0; k < static_cast<int>(trace_.size()); ++k) {
      std::vector<int> ps = modules_[trace_[k]];
      std::sort(ps.begin(), ps.end());  // sorted by ds_id
      for (int p : ps) queue_.push_back({p, k});
    }
  }
  std::fill(most_recent_.begin(), most_recent_.end(), -10'000'000'000);
  step_ = 0;
  available_ = 0;
}

void DeepSpeedZero3Wrapper::RunModule(Emitter& em, int m, bool release) {
  // trace_prologue: a module other than the trace's invalidates it.
  if (mode_ == TraceMode::kComplete &&
      (step_ >= static_cast<int>(trace_.size()) || trace_[step_] != m)) {
    mode_ = TraceMode::kInvalid;
    trace_.clear();
    queue_.clear();
    for (int p = 0; p < static_cast<int>(handle_of_.size()); ++p) {
      if (handle_of_[p] < 0) continue;
      Wait(em, p);
      ReleaseParam(p);
    }
  }
  if (mode_ == TraceMode::kRecord) trace_.push_back(m);
  Fetch(em, m);
  if (release) Release(m);
}

void DeepSpeedZero3Wrapper::Fetch(Emitter& em, int m) {
  const std::vector<int>& ps = modules_[m];
  std::vector<int> gather;
  for (int p : ps) {
    if (status_[p] == Status::kNotAvailable) gather.push_back(p);
  }
  if (!gather.empty()) Gather(em, gather);
  for (int p : ps) {
    active_[p].insert(m);
    if (handle_of_[p] >= 0) Wait(em, p);
  }
  if (mode_ == TraceMode::kComplete) {
    // The module's own parameters leave the queue (those not prefetched for a later use).
    std::size_t need = 0;
    for (int p : ps) need += most_recent_[p] < step_ ? 1 : 0;
    for (std::size_t k = 0; k < need && !queue_.empty(); ++k) {
      most_recent_[queue_.front().first] = queue_.front().second;
      queue_.pop_front();
    }
    if (z_.prefetch_bucket_size > 0) Prefetch(em);
  }
  ++step_;
}

void DeepSpeedZero3Wrapper::Prefetch(Emitter& em) {
  const std::int64_t limit =
      std::min(z_.max_live_parameters - available_, z_.prefetch_bucket_size);
  std::vector<int> fetch;
  std::set<int> chosen;
  std::int64_t numel = 0;
  while (!queue_.empty() && numel < limit) {
    const auto [p, step] = queue_.front();
    queue_.pop_front();
    most_recent_[p] = std::max<std::int64_t>(most_recent_[p], step);
    if (status_[p] == Status::kNotAvailable && chosen.insert(p).second) {
      fetch.push_back(p);
      numel += Numel(p);
    }
  }
  if (!fetch.empty()) Gather(em, fetch);
}

// all_gather_coalesced: one parameter into its own padded buffer, several into one flat buffer.
void DeepSpeedZero3Wrapper::Gather(Emitter& em, const std::vector<int>& ps) {
  Bytes out = 0;
  for (int p : ps) {
    available_ += Numel(p);
    out += Padded(p);
  }
  if (d_.d <= 1) {  // _no_gather_coalesced: the partition is the parameter
    for (int p : ps) status_[p] = Status::kAvailable;
    return;
  }
  em.Begin("zero3.all_gather", layer_);
  std::vector<TensorId> moved;  // ds_tensor.to(device) of host partitions (offload_param)
  for (int p : ps) {
    if (DeviceShard(p) == 0) {
      moved.push_back(em.Alloc(Shard(p), Category::kTemporaries, "zero3.partition_to_device"));
    }
  }
  GatherHandle h;
  h.params = ps;
  h.pending = static_cast<int>(ps.size());
  if (ps.size() == 1) {
    data_[ps[0]] = em.Alloc(Padded(ps[0]), Category::kParameters,
                            "zero3.param." + params_.params[ps[0]].name);
    h.complete = true;
  } else {
    h.flat = em.Alloc(out, Category::kParameters, "zero3.allgather_flat");
  }
  for (TensorId id : moved) em.Free(id);
  for (int p : ps) {
    status_[p] = Status::kInflight;
    handle_of_[p] = static_cast<int>(handles_.size());
  }
  handles_.push_back(h);
  em.Begin("zero3.all_gather", layer_, kCommStream);
  em.Collective(CommGroup::kDp, d_.d, static_cast<double>(out), Coll::kGather);
}

// The handle's wait: the flat buffer split into one tensor per parameter (torch.cat); the
// parameter leaves the registry, and the flat buffer goes with the handle's last one.
void DeepSpeedZero3Wrapper::Wait(Emitter& em, int p) {
  GatherHandle& h = handles_[handle_of_[p]];
  if (!h.complete || (h.pending == 1 && h.flat != 0)) em.Begin("zero3.wait", layer_);
  if (!h.complete) {
    for (int q : h.params) {
      data_[q] = em.Alloc(Whole(q), Category::kParameters, "zero3.param." + params_.params[q].name);
    }
    h.complete = true;
  }
  for (int q : h.params) {
    if (status_[q] == Status::kInflight) status_[q] = Status::kAvailable;
  }
  handle_of_[p] = -1;
  if (--h.pending == 0 && h.flat != 0) {
    em.Free(h.flat);
    h.flat = 0;
  }
}

// release_sub_module with __params_to_release.
void DeepSpeedZero3Wrapper::Release(int m) {
  const std::vector<int>& ps = modules_[m];
  std::set<int> release;
  if (mode_ != TraceMode::kComplete) {
    release.insert(ps.begin(), ps.end());
  } else {
    for (int p : ps) {
      if (!persist_[p] && most_recent_[p] <= step_) release.insert(p);
    }
    std::int64_t traversed = 0;
    for (int k = step_; k < static_cast<int>(trace_.size()); ++k) {
      if (traversed >= z_.max_reuse_distance) break;
      for (int q : modules_[trace_[k]]) {
        release.erase(q);
        traversed += Numel(q);
      }
    }
  }
  for (int p : ps) {
    active_[p].erase(m);
    if (release.count(p) != 0) ReleaseParam(p);
  }
}

void DeepSpeedZero3Wrapper::ReleaseParam(int p) {
  if (status_[p] != Status::kAvailable || !active_[p].empty()) return;
  if (data_[p] != 0) releases_.push_back(data_[p]);
  data_[p] = 0;
  status_[p] = Status::kNotAvailable;
  available_ -= Numel(p);
}

// release_and_reset_all (the step's _partition_all_parameters).
void DeepSpeedZero3Wrapper::ReleaseAll(Emitter& em) {
  for (int p = 0; p < static_cast<int>(status_.size()); ++p) {
    if (handle_of_[p] >= 0) Wait(em, p);
    active_[p].clear();
    ReleaseParam(p);
  }
  Flush(em);
}

void DeepSpeedZero3Wrapper::Flush(Emitter& em) {
  if (releases_.empty()) return;
  em.Begin("zero3.release", layer_);
  for (TensorId id : releases_) em.Free(id);
  releases_.clear();
}

// ---- Gradients ---------------------------------------------------------------------------

void DeepSpeedZero3Wrapper::TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) {
  const auto it = index_.find(param);
  MEMSIM_CHECK(it != index_.end());
  const int p = it->second;
  if (std::find(bucket_.begin(), bucket_.end(), p) != bucket_.end()) {
    em.Free(grad);  // a second gradient of a parameter in the bucket: summed by autograd
    return;
  }
  if (bucket_elems_ + Numel(p) > z_.reduce_bucket_size && bucket_elems_ > 0) ReduceBucket(em);
  if (z_.contiguous_gradients && bucket_elems_ + Numel(p) <= z_.reduce_bucket_size) {
    em.Free(grad);  // copied into the ipg bucket; .grad a view of it
  } else {
    own_grad_[p] = grad;
  }
  bucket_elems_ += Numel(p);
  bucket_.push_back(p);
}

// __reduce_and_partition_ipg_grads, inside the op whose gradient filled the bucket (a hook: no
// op of its own); the reduce-scatter is launched on the communication stream at the next site
// (FlushReductions).
void DeepSpeedZero3Wrapper::ReduceBucket(Emitter& em) {
  if (bucket_.empty()) return;
  Bytes padded = 0;
  for (int p : bucket_) padded += PartNumel(p) * d_.d * Elem();
  const bool scatter = z_.reduce_scatter || !z_.contiguous_gradients;
  const bool in_place = bucket_.size() == 1 && Numel(bucket_[0]) % d_.d == 0;
  if (scatter && !in_place && d_.d > 1) {  // reduce_scatter_coalesced's interleaved copy
    em.Free(em.Alloc(padded, Category::kTemporaries, "zero3.reduce_scatter_flat"));
  }
  if (z_.offload_optimizer_cpu) {
    for (int p : bucket_) OffloadPartition(em, p);
  }
  for (int p : bucket_) {
    em.Free(own_grad_[p]);  // param.grad = None
    own_grad_[p] = 0;
  }
  if (d_.d > 1) pending_.push_back(static_cast<double>(padded));
  bucket_.clear();
  bucket_elems_ = 0;
}

void DeepSpeedZero3Wrapper::FlushReductions(Emitter& em) {
  for (double bytes : pending_) {
    em.Begin("zero3.reduce_scatter", -1, kCommStream);
    em.Collective(CommGroup::kDp, d_.d, bytes, Coll::kGather);
  }
  pending_.clear();
}

// partition_grads with offload_optimizer: the host partition brought to the device
// (grad_buffer.to(device) / cuda_grad_buffer), and at the boundary its .float() copy.
void DeepSpeedZero3Wrapper::OffloadPartition(Emitter& em, int p) {
  em.Begin("zero3.offload.partition_grad");
  em.Free(em.Alloc(PartNumel(p) * Elem(), Category::kTemporaries, "zero3.offload.grad_on_device"));
  if (Boundary()) {
    em.Free(em.Alloc(PartNumel(p) * 4, Category::kTemporaries, "zero3.offload.grad_fp32"));
  }
}

void DeepSpeedZero3Wrapper::EndOfBackward(Emitter& em) {
  em.Begin("zero3.ipg_epilogue");  // independent_gradient_partition_epilogue
  ReduceBucket(em);
  FlushReductions(em);
  ++backward_steps_;
}

void DeepSpeedZero3Wrapper::BeforeOptimizerStep(Emitter& em, bool skipped) {
  layer_ = -1;
  em.Begin("zero3.step.partition_all_parameters");
  ReleaseAll(em);
  if (skipped || z_.offload_optimizer_cpu) return;
  for (const SubGroup& g : sub_groups_) {  // get_grad_norm_direct: g.double() one at a time
    for (int p : g.params) {
      em.Begin("zero3.step.grad_norm");
      em.Free(em.Alloc(PartNumel(p) * 8, Category::kTemporaries, "zero3.grad_norm_fp64"));
    }
  }
  for (const SubGroup& g : sub_groups_) {  // _prepare_fp32_grad_for_sub_group
    em.Begin("zero3.step.fp32_grad_partition");
    const TensorId flat = em.Alloc(g.numel * Elem(), Category::kTemporaries,
                                   "zero3.flat_grad_partition");
    if (Elem() == 4) {
      fp32_grads_.push_back(flat);
      continue;
    }
    fp32_grads_.push_back(em.Alloc(g.numel * 4, Category::kGradients, "zero3.fp32_grad_partition"));
    em.Free(flat);
  }
}

void DeepSpeedZero3Wrapper::AfterOptimizerStep(Emitter& em) {
  em.Begin("zero3.step.release_sub_group");
  for (TensorId id : fp32_grads_) em.Free(id);
  fp32_grads_.clear();
  // _post_step: the persistent parameters all-gathered again, each into a buffer of its own.
  std::vector<int> persistent;
  for (int p = 0; p < static_cast<int>(persist_.size()); ++p) {
    if (persist_[p] && status_[p] == Status::kNotAvailable) persistent.push_back(p);
  }
  if (persistent.empty()) return;
  em.Begin("zero3.step.gather_persistent");
  Bytes bytes = 0;
  for (int p : persistent) {
    if (d_.d > 1) {
      data_[p] = em.Alloc(Padded(p), Category::kParameters, "zero3.param." + params_.params[p].name);
    }
    status_[p] = Status::kAvailable;
    bytes += Padded(p);
  }
  if (d_.d <= 1) return;
  em.Begin("zero3.step.gather_persistent", -1, kCommStream);
  em.Collective(CommGroup::kDp, d_.d, static_cast<double>(bytes), Coll::kGather);
}

// After a step: the device partitions (the trainable ones in the flat buffer), the persistent
// parameters whole, the fp32 partitions, grad_partitions_flat_buffer and the ipg bucket; with
// offload_optimizer on the host the fp32 partitions (pageable: .to("cpu").clone().float()), their
// gradient buffers and grad_partitions_flat_buffer (page-locked with pin_memory); with
// offload_param the 16-bit partitions (page-locked with its pin_memory).
WrapperSizes DeepSpeedZero3Wrapper::StaticSizes() const {
  WrapperSizes s;
  Bytes host_params = 0;
  for (int p = 0; p < static_cast<int>(persist_.size()); ++p) {
    s.parameter_bytes += DeviceShard(p) + (persist_[p] && d_.d > 1 ? Padded(p) : 0);
    host_params += Shard(p) - DeviceShard(p);
  }
  std::int64_t total = 0;
  for (const SubGroup& g : sub_groups_) total += g.numel;
  if (z_.contiguous_gradients) s.gradient_bytes += z_.reduce_bucket_size * Elem();
  std::vector<std::string> pinned, pageable;  // what each kind holds, for the report
  if (host_params > 0) {
    (z_.offload_param_pin_memory ? s.host_pinned_bytes : s.host_pageable_bytes) += host_params;
    (z_.offload_param_pin_memory ? pinned : pageable)
        .push_back("the 16-bit partitions (DeepSpeed ZeRO-3 offload_param cpu)");
  }
  if (!z_.offload_optimizer_cpu) {
    s.main_param_bytes = total * 4;
    s.gradient_bytes += total * Elem();
  } else {
    s.host_pageable_bytes += total * 4;
    pageable.push_back(fmt::format("the fp32 partition of {} elements and the optimizer's state "
                                   "(offload_optimizer cpu)",
                                   total));
    (z_.offload_pin_memory ? s.host_pinned_bytes : s.host_pageable_bytes) +=
        total * 4 + total * Elem();
    (z_.offload_pin_memory ? pinned : pageable)
        .push_back("its fp32 gradient and grad_partitions_flat_buffer");
    s.host_buffers_pinned = z_.offload_pin_memory;
  }
  s.host_pinned_what = fmt::format("{}", fmt::join(pinned, "; "));
  s.host_pageable_what = fmt::format("{}", fmt::join(pageable, "; "));
  return s;
}

}  // namespace

std::unique_ptr<DataParallel> NewDeepSpeedZero3(const ModelDims& d, const RankParams& params,
                                                const config::DeepSpeedZero& zero) {
  return std::make_unique<DeepSpeedZero3Wrapper>(d, params, zero);
}

}  // namespace memsim::workload
