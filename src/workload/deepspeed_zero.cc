// DeepSpeed's ZeRO stage 1 and 2 optimizer under the Hugging Face Trainer (framework
// "hf-trainer" with a ds_config, config::DeepSpeedZero): DeepSpeedZeroOptimizer of
// deepspeed/runtime/zero/stage_1_and_2.py at v0.16.9, chosen by runtime/engine.py
// _configure_optimizer (_do_optimizer_sanity_check returns ZERO_OPTIMIZATION for stage >= 1 with
// the default grad_accum_dtype, the model's own) and built by _configure_zero_optimizer. DP rank 0
// is simulated (deepspeed_zero.h for the layout).
// - __init__, per param group: each trainable parameter's device storage moved to the host and
//   replaced by torch.empty(1) (4 bytes), empty_cache, the padded flat 16-bit buffer allocated on
//   the device and the parameters made views of it (_update_model_bit16_weights, which drops the
//   placeholders); then the fp32 partition, `partition.clone().float()` (the clone a transient
//   16-bit copy), on the host with offload_optimizer cpu. initialize_optimizer_states gives every
//   fp32 partition a zeros .grad and drops them again unless offloaded (where they stay, on the
//   host). With offload, temp_grad_buffer_for_gpu_offload, the largest parameter's numel in 16
//   bits, stays on the device.
// - Backward: backward_prologue allocates the ipg buffer (reduce_bucket_size elements, 16-bit),
//   two with overlap_comm, when contiguous_gradients. Stage 2 (partition_gradients) reduces in
//   every micro-batch: each gradient's hook (process_gradients) copies it into the ipg buffer
//   and frees it (reduce_independent_p_g_buckets_and_remove_grads; a parameter larger than the
//   bucket keeps its own gradient), a full bucket is reduced (reduce_ipg_grads): gradients of
//   the rank's partition are copied into grads_in_partition (allocated at the first such copy,
//   copy_grads_in_partition), the others dropped. Stage 1 keeps full .grad tensors (autograd
//   accumulates) until the gradient-accumulation boundary, where reduce_gradients runs the same
//   bucketing over every parameter (with overlap_comm the hooks do it during the boundary
//   micro-batch's backward). Without contiguous_gradients the gradients stay tensors of their
//   own and each bucket is flattened for its reduction (buffered_reduce_fallback).
// - independent_gradient_partition_epilogue: averaged_gradients are views of the partition's
//   gradients (the first micro-batch's grads_in_partition stays alive through them; later ones
//   are added in and dropped), the ipg buffers released, every .grad set to None.
// - step: scaled_global_norm takes a float64 copy of each gradient slice, one at a time
//   (get_grad_norm_direct); the partition's gradients are flattened and cast to an fp32 gradient
//   of the partition (then averaged_gradients dropped), the wrapped optimizer steps over the fp32
//   partition (its state lazy, torch.optim's), the fp32 gradient is dropped and the 16-bit
//   partitions all-gathered in place (all_gather_into_tensor_dp_groups). With offload the step
//   runs on the host and `fp32_partition.to(device)` is a transient fp32 copy on the device.
// Not modelled: the several-group interleaving of step (each group's fp32 gradient is freed
// before the next group's is made; here all groups' live together: high by one group's at most),
// the one-element norm and overflow tensors. With offload the host memory (StaticSizes: the
// fp32 partition, its gradient, the host gradient buffers; build.cc adds the optimizer state)
// is reported on its own line, and at the boundary each gradient of the partition passes
// through device transients on its way to the host (OffloadBoundaryCopy).
#include "workload/deepspeed_zero.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/check.h"
#include "workload/data_parallel.h"

namespace memsim::workload {

ZeroGroupLayout LayoutZeroGroup(const std::vector<ParamTensor>& params,
                                const std::vector<int>& group, int dp, int rank) {
  MEMSIM_CHECK(dp >= 1 && rank >= 0 && rank < dp);
  ZeroGroupLayout out;
  for (int i : group) {
    if (params[i].frozen) continue;
    out.params.push_back(i);
    out.numel += params[i].numel;
  }
  const std::int64_t align = kZeroAlignmentFactor * dp;
  out.padded = (out.numel + align - 1) / align * align;
  out.partition = out.padded / dp;
  const std::int64_t start = out.partition * rank;
  const std::int64_t end = start + out.partition;
  std::int64_t at = 0;
  for (int i : out.params) {
    const std::int64_t n = params[i].numel;
    // get_partition_info: starts inside the partition, or starts before and runs into it.
    const bool in = (start <= at && at < end) || (at < start && start < at + n);
    out.in_partition.push_back(in);
    if (in) out.grads_in_partition += n;
    at += n;
  }
  return out;
}

namespace {

class DeepSpeedZeroWrapper final : public DataParallel {
 public:
  DeepSpeedZeroWrapper(const ModelDims& d, const RankParams& params, const config::DeepSpeedZero& z)
      : d_(d), params_(params), z_(z), own_(params.params.size(), 0),
        in_part_(params.params.size(), false), slice_(params.params.size(), 0) {
    for (int i = 0; i < static_cast<int>(params.params.size()); ++i) {
      index_[params.params[i].name] = i;
    }
    for (const std::vector<int>& g : params.groups) {
      groups_.push_back(LayoutZeroGroup(params.params, g, d.d, 0));
      const ZeroGroupLayout& l = groups_.back();
      std::int64_t at = 0;  // rank 0's partition is [0, l.partition)
      for (std::size_t k = 0; k < l.params.size(); ++k) {
        in_part_[l.params[k]] = l.in_partition[k];
        slice_[l.params[k]] = std::clamp<std::int64_t>(l.partition - at, 0,
                                                       params.params[l.params[k]].numel);
        at += params.params[l.params[k]].numel;
        gip_numel_ += l.in_partition[k] ? params.params[l.params[k]].numel : 0;
        largest_ = std::max(largest_, params.params[l.params[k]].numel);
      }
    }
  }

  void Setup(Emitter& em, const std::vector<TensorId>& param_ids) override;
  bool HoldsMainParams() const override { return true; }
  std::vector<ShardSlice> OptimizerSlices() const override {
    std::vector<ShardSlice> out;  // one flat fp32 partition per group (offloaded: none here)
    for (const ZeroGroupLayout& l : groups_) {
      if (!z_.offload_optimizer_cpu && !l.params.empty()) out.push_back({l.params[0], l.partition});
    }
    return out;
  }
  bool ShardsOptimizer() const override { return true; }
  std::vector<ShardSlice> HostOptimizerSlices() const override {
    std::vector<ShardSlice> out;  // offload: the optimizer steps over the host partition
    for (const ZeroGroupLayout& l : groups_) {
      if (z_.offload_optimizer_cpu && !l.params.empty()) out.push_back({l.params[0], l.partition});
    }
    return out;
  }

  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override {
    const auto it = index_.find(param);
    MEMSIM_CHECK(it != index_.end());
    const int i = it->second;
    if (own_[i] == 0) {
      own_[i] = grad;  // AccumulateGrad adopts it as .grad
    } else {
      em.Free(grad);  // added in place (stage 1 between boundaries)
    }
    // process_gradients: stage 2 always; stage 1 only with overlap_comm at the boundary.
    if (z_.stage == 2 || (z_.overlap_comm && Boundary())) Bucket(em, i);
  }
  void BeforeBackward(Emitter& em, GradSite /*site*/, int /*layer*/) override {
    FlushReductions(em);
    Prologue(em);
  }
  void EndOfBackward(Emitter& em) override;
  void ZeroGrad(Emitter& em) override { DropGrads(em); }
  void BeforeOptimizerStep(Emitter& em, bool skipped) override;
  void AfterOptimizerStep(Emitter& em) override;
  WrapperSizes StaticSizes() const override;

 private:
  bool Boundary() const { return backward_steps_ % d_.m == d_.m - 1; }
  Bytes Elem() const { return d_.param_bytes; }
  void Prologue(Emitter& em);
  void Bucket(Emitter& em, int i);
  void ReduceIpg(Emitter& em);
  void FlushReductions(Emitter& em);
  void CopyToPartition(Emitter& em, int i);
  void OffloadBoundaryCopy(Emitter& em, int i);
  void Epilogue(Emitter& em);
  void DropGrads(Emitter& em) {
    for (TensorId& id : own_) {
      if (id != 0) em.Free(id);
      id = 0;
    }
  }
  void FreeAll(Emitter& em, std::vector<TensorId>* ids) {
    for (TensorId id : *ids) em.Free(id);
    ids->clear();
  }

  const ModelDims& d_;
  const RankParams& params_;
  const config::DeepSpeedZero z_;
  std::vector<ZeroGroupLayout> groups_;
  std::map<std::string, int> index_;
  std::vector<TensorId> own_;     // .grad as a tensor of its own (0: None or a view)
  std::vector<bool> in_part_;     // is_param_in_current_partition
  std::vector<std::int64_t> slice_;  // elements of each parameter inside rank 0's partition
  std::int64_t gip_numel_ = 0;    // grads_in_partition's elements (all groups)
  std::int64_t largest_ = 0;      // largest_param_numel
  TensorId ipg_[2] = {0, 0};
  int ipg_index_ = 0;
  bool ready_ = false;            // ready_for_gradients
  std::int64_t elems_ = 0;        // elements_in_ipg_bucket
  std::vector<int> bucket_;       // params_in_ipg_bucket
  std::vector<double> pending_;   // bytes of the buckets reduced, not yet launched
  TensorId gip_ = 0;              // grads_in_partition of this micro-batch
  std::vector<TensorId> averaged_;  // what averaged_gradients' views keep alive
  bool have_averaged_ = false;
  std::vector<TensorId> deferred_;  // previous_reduced_grads (overlap without contiguous)
  std::vector<TensorId> fp32_grads_;
  int backward_steps_ = 0;
};

void DeepSpeedZeroWrapper::Setup(Emitter& em, const std::vector<TensorId>& param_ids) {
  for (const ZeroGroupLayout& l : groups_) {
    em.Begin("init.zero.move_params_to_cpu");
    std::vector<TensorId> placeholders;
    for (int i : l.params) {
      em.Free(param_ids[i]);
      placeholders.push_back(em.Alloc(4, Category::kOther, "zero.param_placeholder"));
    }
    em.EmptyCache();
    em.Begin("init.zero.flatten");
    em.Alloc(l.padded * Elem(), Category::kParameters, "zero.bit16_groups_flat");
    FreeAll(em, &placeholders);  // _update_model_bit16_weights
    if (z_.offload_optimizer_cpu) continue;
    em.Begin("init.zero.fp32_partition");
    const TensorId clone = Elem() != 4 ? em.Alloc(l.partition * Elem(), Category::kTemporaries,
                                                  "zero.partition_clone")
                                       : 0;
    em.Alloc(l.partition * 4, Category::kMainParameters, "zero.single_partition_of_fp32_groups");
    if (clone != 0) em.Free(clone);
  }
  if (z_.offload_optimizer_cpu) {
    em.Begin("init.zero.offload_buffers");
    em.Alloc(largest_ * Elem(), Category::kGradients, "zero.temp_grad_buffer_for_gpu_offload");
    return;
  }
  // initialize_optimizer_states: a zeros .grad per fp32 partition, then set to None.
  em.Begin("init.zero.initialize_optimizer_states");
  std::vector<TensorId> zeros;
  for (const ZeroGroupLayout& l : groups_) {
    zeros.push_back(em.Alloc(l.partition * 4, Category::kTemporaries, "zero.single_grad_partition"));
  }
  FreeAll(em, &zeros);
}

void DeepSpeedZeroWrapper::Prologue(Emitter& em) {
  if (ready_) return;
  ready_ = true;
  if (!z_.contiguous_gradients) return;
  // reduce_bucket_size 0 (zero/config.py allows ge=0): torch.empty(0) takes no device memory,
  // and every parameter is then larger than the bucket and keeps its own gradient (Bucket).
  if (z_.reduce_bucket_size == 0) return;
  em.Begin("zero.backward_prologue");
  for (int k = 0; k < (z_.overlap_comm ? 2 : 1); ++k) {
    ipg_[k] = em.Alloc(z_.reduce_bucket_size * Elem(), Category::kGradients,
                       fmt::format("zero.ipg_buffer{}", k));
  }
  ipg_index_ = 0;
}

void DeepSpeedZeroWrapper::Bucket(Emitter& em, int i) {
  const std::int64_t n = params_.params[i].numel;
  if (elems_ + n > z_.reduce_bucket_size) {
    ReduceIpg(em);
    if (z_.contiguous_gradients && z_.overlap_comm) ipg_index_ = 1 - ipg_index_;
  }
  // Contiguous: copied into the ipg buffer and .grad made a view of it, unless larger than the
  // bucket (extra_large_param_to_reduce keeps its own).
  if (z_.contiguous_gradients && n <= z_.reduce_bucket_size && own_[i] != 0) {
    em.Free(own_[i]);
    own_[i] = 0;
  }
  elems_ += n;
  bucket_.push_back(i);
}

void DeepSpeedZeroWrapper::CopyToPartition(Emitter& em, int i) {
  if (z_.offload_optimizer_cpu) {  // accumulated on the host; at the boundary copied there
    if (Boundary()) OffloadBoundaryCopy(em, i);
    return;
  }
  if (gip_ == 0) {
    gip_ = em.Alloc(gip_numel_ * Elem(), Category::kGradients, "zero.grads_in_partition");
  }
  if (own_[i] != 0) {  // grad_reduc.data = the new view
    em.Free(own_[i]);
    own_[i] = 0;
  }
}

// copy_grads_in_partition with cpu_offload at the accumulation boundary, one parameter of the
// partition: set_norm_for_param_grad_in_gpu (`.double()` of its slice, then a norm), then
// update_overflow_tracker_for_param_grad on the whole gradient (_has_inf_or_nan: x.float(),
// isnan, isinf, logical_or, .float(), all locals until it returns), then
// async_inplace_copy_grad_to_fp32_buffer_from_gpu (`.float()` of the slice, copied to the host's
// fp32 gradient; param.grad = None). Each a device transient, one op each (the hook runs inside
// the backward op or the epilogue; what that op frees later lands in the last of these ops, in
// the same order); the 0-dim norms are not modelled.
void DeepSpeedZeroWrapper::OffloadBoundaryCopy(Emitter& em, int i) {
  const std::int64_t n = params_.params[i].numel;
  const std::int64_t k = slice_[i];
  em.Begin("zero.offload.grad_norm");
  em.Free(em.Alloc(k * 8, Category::kTemporaries, "zero.offload.grad_norm_fp64"));
  em.Begin("zero.offload.has_inf_or_nan");
  std::vector<TensorId> check = {
      em.Alloc(n * 4, Category::kTemporaries, "zero.offload.inf_nan_float"),
      em.Alloc(n, Category::kTemporaries, "zero.offload.isnan"),
      em.Alloc(n, Category::kTemporaries, "zero.offload.isinf"),
      em.Alloc(n, Category::kTemporaries, "zero.offload.inf_or_nan"),
      em.Alloc(n * 4, Category::kTemporaries, "zero.offload.inf_or_nan_float")};
  FreeAll(em, &check);
  em.Begin("zero.offload.copy_grad_to_host");
  em.Free(em.Alloc(k * 4, Category::kTemporaries, "zero.offload.grad_fp32_slice"));
  if (own_[i] != 0) {  // a parameter larger than the bucket kept its own gradient
    em.Free(own_[i]);
    own_[i] = 0;
  }
}

void DeepSpeedZeroWrapper::ReduceIpg(Emitter& em) {
  if (bucket_.empty()) return;
  // Runs inside the op whose gradient filled the bucket (a hook: no op of its own); the
  // reduction is launched on the communication stream at the next site (FlushReductions).
  if (!z_.contiguous_gradients) {  // buffered_reduce_fallback: the bucket flattened
    em.Free(em.Alloc(elems_ * Elem(), Category::kTemporaries, "zero.ipg_flat"));
  }
  pending_.push_back(static_cast<double>(elems_ * Elem()));
  for (int i : bucket_) {
    if (z_.stage == 2 && !in_part_[i]) {
      if (z_.overlap_comm && !z_.contiguous_gradients && own_[i] != 0) {
        deferred_.push_back(own_[i]);  // cleared at the epilogue
      } else if (own_[i] != 0) {
        em.Free(own_[i]);
      }
      own_[i] = 0;
    } else if (in_part_[i] && z_.contiguous_gradients) {
      CopyToPartition(em, i);
    }
  }
  bucket_.clear();
  elems_ = 0;
}

void DeepSpeedZeroWrapper::FlushReductions(Emitter& em) {
  for (double bytes : pending_) {
    em.Begin("zero.reduce_ipg_grads", -1, kCommStream);
    em.Collective(CommGroup::kDp, d_.d, bytes, Coll::kGather);
  }
  pending_.clear();
}

void DeepSpeedZeroWrapper::EndOfBackward(Emitter& em) {
  // engine.allreduce_gradients: stage 2 every micro-batch, stage 1 at the boundary.
  if (z_.stage == 2) {
    Epilogue(em);
  } else if (Boundary()) {
    if (!z_.overlap_comm) {  // reduce_gradients: every parameter with a gradient, in order
      em.Begin("zero.reduce_gradients");
      for (const ZeroGroupLayout& l : groups_) {
        for (int i : l.params) {
          if (own_[i] != 0) Bucket(em, i);
        }
      }
    }
    Epilogue(em);
  }
  ++backward_steps_;
}

void DeepSpeedZeroWrapper::Epilogue(Emitter& em) {
  em.Begin("zero.ipg_epilogue");
  ReduceIpg(em);
  FlushReductions(em);
  em.Begin("zero.ipg_epilogue.average");
  FreeAll(em, &deferred_);  // _clear_previous_reduced_grads
  if (!z_.offload_optimizer_cpu) {
    // The partition's gradients: grads_in_partition, or (not contiguous) the .grad tensors.
    std::vector<TensorId> held;
    if (gip_ != 0) held.push_back(gip_);
    for (std::size_t i = 0; i < own_.size(); ++i) {
      if (in_part_[i] && own_[i] != 0) {
        held.push_back(own_[i]);
        own_[i] = 0;
      }
    }
    if (!have_averaged_) {
      averaged_ = std::move(held);  // kept by averaged_gradients' views
      have_averaged_ = true;
    } else {
      FreeAll(em, &held);  // added into averaged_gradients, then dropped
    }
  }
  gip_ = 0;
  for (TensorId& id : ipg_) {  // _release_ipg_buffers
    if (id != 0) em.Free(id);
    id = 0;
  }
  ready_ = false;
  DropGrads(em);  // zero_grad(set_to_none=True)
}

void DeepSpeedZeroWrapper::BeforeOptimizerStep(Emitter& em, bool skipped) {
  if (skipped || z_.offload_optimizer_cpu) {  // overflow: averaged_gradients = {}
    em.Begin("zero.step.drop_gradients");
    FreeAll(em, &averaged_);
    have_averaged_ = false;
    return;
  }
  // get_grad_norm_direct: g.data.double() of each slice, one at a time.
  for (const ZeroGroupLayout& l : groups_) {
    std::int64_t left = l.partition;
    for (std::size_t k = 0; k < l.params.size() && left > 0; ++k) {
      if (!l.in_partition[k]) continue;
      const std::int64_t n = std::min(left, params_.params[l.params[k]].numel);
      em.Begin("zero.step.grad_norm");
      em.Free(em.Alloc(n * 8, Category::kTemporaries, "zero.grad_norm_fp64"));
      left -= n;
    }
  }
  for (const ZeroGroupLayout& l : groups_) {
    em.Begin("zero.step.fp32_grad_partition");
    const TensorId flat = em.Alloc(l.partition * Elem(), Category::kTemporaries,
                                   "zero.flat_grad_partition");
    if (Elem() == 4) {
      fp32_grads_.push_back(flat);
      continue;
    }
    fp32_grads_.push_back(em.Alloc(l.partition * 4, Category::kGradients,
                                   "zero.single_grad_partition"));
    em.Free(flat);
  }
  em.Begin("zero.step.drop_averaged_gradients");
  FreeAll(em, &averaged_);
  have_averaged_ = false;
}

void DeepSpeedZeroWrapper::AfterOptimizerStep(Emitter& em) {
  em.Begin("zero.step.copy_to_bit16");
  FreeAll(em, &fp32_grads_);
  for (const ZeroGroupLayout& l : groups_) {
    if (z_.offload_optimizer_cpu) {  // fp32_partition.to(device)
      em.Free(em.Alloc(l.partition * 4, Category::kTemporaries, "zero.fp32_partition_on_device"));
    }
  }
  for (const ZeroGroupLayout& l : groups_) {
    if (d_.d <= 1) break;
    em.Begin("zero.all_gather_dp_groups", -1, kCommStream);
    em.Collective(CommGroup::kDp, d_.d, static_cast<double>(l.padded * Elem()), Coll::kGather);
  }
}

WrapperSizes DeepSpeedZeroWrapper::StaticSizes() const {
  WrapperSizes s;
  for (const ParamTensor& pt : params_.params) {
    if (pt.frozen) s.parameter_bytes += pt.storage_bytes > 0 ? pt.storage_bytes : pt.numel * Elem();
  }
  std::int64_t partition = 0;
  for (const ZeroGroupLayout& l : groups_) {
    s.parameter_bytes += l.padded * Elem();
    partition += l.partition;
  }
  if (!z_.offload_optimizer_cpu) {
    s.main_param_bytes = partition * 4;
    s.gradient_bytes = gip_numel_ * Elem();  // after a step's backward: the partition's grads
    return s;
  }
  // Offload, on the host: the fp32 partition, always pinned (__init__: pin_memory of
  // weights_partition); its fp32 .grad (initialize_optimizer_states, kept with offload),
  // temp_grad_buffer_for_cpu_offload (the largest parameter, 16-bit) and, with gradient
  // accumulation, accumulated_grads_in_cpu (each parameter of the partition whole, 16-bit,
  // made in the first micro-batch and kept: async_accumulate_grad_in_cpu_via_gpu), pinned only
  // with pin_memory. The optimizer's state over the partition: build.cc (HostOptimizerSlices).
  s.host_pinned_bytes = partition * 4;
  const Bytes rest = partition * 4 + largest_ * Elem() + (d_.m > 1 ? gip_numel_ * Elem() : 0);
  (z_.offload_pin_memory ? s.host_pinned_bytes : s.host_pageable_bytes) += rest;
  s.host_buffers_pinned = z_.offload_pin_memory;
  return s;
}

}  // namespace

std::unique_ptr<DataParallel> NewDeepSpeedZero(const ModelDims& d, const RankParams& params,
                                               const config::DeepSpeedZero& zero) {
  if (zero.stage == 3) return NewDeepSpeedZero3(d, params, zero);
  return std::make_unique<DeepSpeedZeroWrapper>(d, params, zero);
}

}  // namespace memsim::workload
