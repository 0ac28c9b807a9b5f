// Megatron-FSDP (--use-megatron-fsdp; Megatron-LM megatron/core/distributed/fsdp/src/
// megatron_fsdp/: param_and_grad_buffer.py, megatron_fsdp.py) with the sharding strategies
// no_shard, optim and optim_grads (--data-parallel-sharding-strategy):
// - per parameter group (memsim: one per model chunk; config/ allows no pipeline parallelism)
//   a 16-bit weight buffer, full size for these strategies, into which the parameters move
//   (their own storage freed), except with no_shard, where they keep it; then the fp32
//   main-weight buffer (preserve_fp32_weights, the default), the rank's 1/(d·cp) shard unless
//   no_shard (ParamAndGradBuffer._init_each_parameter_group_buffers). After all groups, one
//   grad buffer in the grad dtype (buffer_all_in_one), full size or the shard with optim_grads;
//   then gc.collect() and torch.cuda.empty_cache(). Adam makes its state per parameter on
//   views of the main-weight shard.
// - parameters in named_parameters() order; buckets close at the same bucket size as DDP's with
//   overlap_grad_reduce, else one bucket; with a sharding strategy each bucket is padded to a
//   multiple of d·cp × lcm(shape[1:] elements of its params) (_get_parameter_groups,
//   build_data_parallel_buffer_index). Not modelled: the re-sort inside a bucket by shape[1:]
//   and the per-parameter rounding, which move slice ownership, not buffer sizes.
// - optim_grads with d·cp > 1 (megatron_fsdp.py _grad_acc, param_and_grad_buffer.py
//   GradReducePipeline): a parameter's first gradient of a backward makes its bucket's
//   temporary full-size main_grad (TemporaryBucketAllocator, grad dtype); once every parameter
//   of the bucket has its gradient the bucket is reduce-scattered on a side stream into a fresh
//   shard-sized tensor, added into the persistent grad shard; the full-size bucket is kept
//   until the queued buckets exceed suggested_RS_queue_capacity (max(1e9, bucket size)
//   elements; checked before a new bucket joins, oldest freed first) or the backward ends
//   (_root_post_backward). Without optim_grads the full grad buffer is all-reduced in place
//   (_bucket_group_gradient_reduce).
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <numeric>

#include "core/check.h"
#include "workload/data_parallel.h"

namespace memsim::workload {

std::vector<GradBuffer> LayoutFsdpBuffers(const config::Setup& setup, int rank, const ModelDims& d,
                                          const std::vector<ParamTensor>& params, bool sharded) {
  BucketRules rules;
  rules.registration_order = true;
  rules.end_align = sharded ? d.dp_cp : 1;
  rules.pad_to_row_widths = sharded;
  rules.shared_embedding_own_bucket = sharded;
  if (setup.training.overlap_grad_reduce && rank == 0) {
    rules.first_chunk_bucket_size =
        std::max<std::int64_t>(40'000'000, std::int64_t{1'000'000} * d.dp_cp);
  }
  return LayoutBuckets(d, params, rules);
}

namespace {

// The optim_grads temporary gradient buckets of one backward.
class GradBucketPipeline {
 public:
  GradBucketPipeline(const ModelDims& d, const RankParams& params, const GradBuffer& buffer)
      : d_(d), params_(params), buffer_(buffer) {
    bucket_of_.assign(params.params.size(), -1);
    for (const GradBuffer::Entry& e : buffer.entries) bucket_of_[e.param] = e.bucket;
    expected_.assign(params.params.size(), 0);
    for (size_t i = 0; i < params.params.size(); ++i) {
      const int p = static_cast<int>(i);
      const int layer = params.params[i].layer;
      expected_[i] = (params.OnSite(p, GradSite::kHead, -1, d) ? 1 : 0) +
                     (params.OnSite(p, GradSite::kLayer, layer, d) ? 1 : 0) +
                     (params.OnSite(p, GradSite::kEmbedding, -1, d) ? 1 : 0);
    }
    temp_.assign(buffer.buckets.size(), 0);
    capacity_ = 1'000'000'000;
    for (const auto& [start, end] : buffer.buckets) capacity_ = std::max(capacity_, end - start);
    ResetCounts();
  }

  // Before the backward of `site`: the temporary buckets its gradients go into.
  void Start(Emitter& em, GradSite site, int layer) {
    for (size_t i = 0; i < params_.params.size(); ++i) {
      const int b = bucket_of_[i];
      if (b < 0 || temp_[b] != 0 || !params_.OnSite(static_cast<int>(i), site, layer, d_)) {
        continue;
      }
      const auto& [start, end] = buffer_.buckets[b];
      em.Begin("fsdp.grad_bucket");
      temp_[b] = em.Alloc((end - start) * d_.grad_bytes, Category::kGradients,
                          fmt::format("fsdp.grad_bucket{}", b));
    }
  }
  // After the backward of `site`: reduce-scatter the buckets it completed.
  void Done(Emitter& em, GradSite site, int layer) {
    for (size_t i = 0; i < params_.params.size(); ++i) {
      const int b = bucket_of_[i];
      if (b < 0 || !params_.OnSite(static_cast<int>(i), site, layer, d_)) continue;
      if (--missing_[b] == 0) ReduceScatter(em, b);
    }
  }
  // _root_post_backward: wait for every reduce-scatter and free the temporary buckets.
  void PostBackward(Emitter& em) {
    for (int b = 0; b < static_cast<int>(temp_.size()); ++b) {
      if (temp_[b] != 0 && missing_[b] > 0) ReduceScatter(em, b);
    }
    while (!queue_.empty()) FreeOldest(em);
    ResetCounts();
  }

 private:
  void ResetCounts() {
    missing_.assign(buffer_.buckets.size(), 0);
    for (size_t i = 0; i < params_.params.size(); ++i) {
      if (bucket_of_[i] >= 0) missing_[bucket_of_[i]] += expected_[i];
    }
  }
  void ReduceScatter(Emitter& em, int b) {
    const auto& [start, end] = buffer_.buckets[b];
    em.Begin("fsdp.grad_reduce_scatter", -1, kCommStream);
    const TensorId shard = em.Alloc((end - start) / d_.dp_cp * d_.grad_bytes,
                                    Category::kTemporaries, fmt::format("fsdp.grad_shard{}", b));
    em.Collective(CommGroup::kDpCp, d_.dp_cp, static_cast<double>((end - start) * d_.grad_bytes),
                  Coll::kGather);
    em.Free(shard);  // added into the persistent grad shard
    // wait_for_previous_grad_reduce trims the queue before the new bucket joins it.
    while (queued_ > capacity_ && !queue_.empty()) FreeOldest(em);
    queue_.push_back(b);
    queued_ += end - start;
  }
  void FreeOldest(Emitter& em) {
    const int b = queue_.front();
    queue_.pop_front();
    const auto& [start, end] = buffer_.buckets[b];
    queued_ -= end - start;
    em.Begin("fsdp.free_grad_bucket");
    em.Free(temp_[b]);
    temp_[b] = 0;
  }

  const ModelDims& d_;
  const RankParams& params_;
  const GradBuffer& buffer_;
  // Bucket of each param (-1 none); gradient sites per param; sites still missing per bucket
  // in this backward; the temporary bucket tensors; buckets reduce-scattered and still held
  // (oldest first), their elements, the queue capacity.
  std::vector<int> bucket_of_, expected_, missing_;
  std::vector<TensorId> temp_;
  std::deque<int> queue_;
  std::int64_t queued_ = 0, capacity_ = 0;
};

class MegatronFsdpWrapper final : public DataParallel {
 public:
  MegatronFsdpWrapper(const config::Setup& setup, int rank, const ModelDims& d,
                      const RankParams& params, config::FsdpSharding sharding)
      : d_(d),
        params_(params),
        sharded_(sharding != config::FsdpSharding::kNoShard),
        // With one data-parallel rank nothing is sharded: the buckets are views of the buffer.
        shard_grads_(sharding == config::FsdpSharding::kOptimGrads && d.dp_cp > 1),
        overlap_(setup.training.overlap_grad_reduce),
        buffers_(LayoutFsdpBuffers(setup, rank, d, params.params, sharded_)) {
    if (shard_grads_) {
      MEMSIM_CHECK(buffers_.size() == 1);  // config/: no pipeline or virtual stages with FSDP
      pipeline_ = std::make_unique<GradBucketPipeline>(d, params, buffers_[0]);
    }
  }

  void Setup(Emitter& em, const std::vector<TensorId>& param_ids) override;
  bool HoldsMainParams() const override { return true; }
  std::vector<ShardSlice> OptimizerSlices() const override;
  bool ShardsOptimizer() const override { return sharded_; }

  // The gradient goes into main_grad (the bucket) and .grad is dropped.
  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& /*param*/) override {
    em.Free(grad);
  }
  void BeforeBackward(Emitter& em, GradSite site, int layer) override {
    if (pipeline_) pipeline_->Start(em, site, layer);
  }
  void AfterBackward(Emitter& em, GradSite site, int layer) override {
    if (pipeline_) pipeline_->Done(em, site, layer);
  }
  void EndOfBackward(Emitter& em) override {
    if (pipeline_) pipeline_->PostBackward(em);
  }
  void AfterLastBackward(Emitter& em, int chunk) override {
    if (overlap_) AllReduceGrads(em, chunk);
  }
  void FinishGradSync(Emitter& em) override {
    if (overlap_) return;
    for (int c = 0; c < d_.v; ++c) AllReduceGrads(em, c);
  }
  // The updated main-weight shards all-gathered into the weight buffer.
  void AfterOptimizerStep(Emitter& em) override {
    if (sharded_) ParamAllGather(em, d_, buffers_);
  }
  WrapperSizes StaticSizes() const override;

 private:
  // A full grad buffer is all-reduced in place, bucket by bucket; optim_grads reduced its
  // buckets during the backward.
  void AllReduceGrads(Emitter& em, int chunk) {
    if (d_.dp_cp <= 1 || shard_grads_) return;
    for (const auto& [start, end] : buffers_[chunk].buckets) {
      em.Begin("fsdp.grad_all_reduce", -1, kCommStream);
      em.Collective(CommGroup::kDpCp, d_.dp_cp, static_cast<double>((end - start) * d_.grad_bytes),
                    Coll::kAllReduce);
    }
  }

  const ModelDims& d_;
  const RankParams& params_;
  const bool sharded_;
  const bool shard_grads_;
  const bool overlap_;
  const std::vector<GradBuffer> buffers_;
  std::unique_ptr<GradBucketPipeline> pipeline_;  // optim_grads with d·cp > 1
};

void MegatronFsdpWrapper::Setup(Emitter& em, const std::vector<TensorId>& param_ids) {
  for (const GradBuffer& buf : buffers_) {
    const std::int64_t shard = buf.numel_padded / d_.dp_cp;
    if (sharded_) {
      em.Begin("init.fsdp.buffers");
      em.Alloc(buf.numel_padded * d_.param_bytes, Category::kParameters,
               fmt::format("fsdp.chunk{}.weight_buffer", buf.chunk));
      em.Begin("init.fsdp.move_params");
      for (const GradBuffer::Entry& e : buf.entries) em.Free(param_ids[e.param]);
    }
    if (d_.mixed) {
      em.Begin("init.fsdp.buffers");
      em.Alloc((sharded_ ? shard : buf.numel_padded) * 4, Category::kMainParameters,
               fmt::format("fsdp.chunk{}.main_weight_buffer", buf.chunk));
    }
  }
  em.Begin("init.fsdp.grad_buffer");
  for (const GradBuffer& buf : buffers_) {
    const std::int64_t shard = buf.numel_padded / d_.dp_cp;
    em.Alloc((shard_grads_ ? shard : buf.numel_padded) * d_.grad_bytes, Category::kGradients,
             fmt::format("fsdp.chunk{}.grad_buffer", buf.chunk));
  }
  em.EmptyCache();
}

std::vector<ShardSlice> MegatronFsdpWrapper::OptimizerSlices() const {
  return sharded_ ? ShardSlices(d_, params_.params, buffers_) : params_.Whole();
}

WrapperSizes MegatronFsdpWrapper::StaticSizes() const {
  std::int64_t padded = 0;
  for (const GradBuffer& buf : buffers_) padded += buf.numel_padded;
  WrapperSizes s;
  s.parameter_bytes = padded * d_.param_bytes;
  s.gradient_bytes = (shard_grads_ ? padded / d_.dp_cp : padded) * d_.grad_bytes;
  if (d_.mixed) s.main_param_bytes = 4 * (sharded_ ? padded / d_.dp_cp : padded);
  return s;
}

}  // namespace

std::unique_ptr<DataParallel> NewMegatronFsdp(const config::Setup& setup, int rank,
                                              const ModelDims& d, const RankParams& params,
                                              const config::MegatronFsdp& fsdp) {
  return std::make_unique<MegatronFsdpWrapper>(setup, rank, d, params, fsdp.sharding);
}

}  // namespace memsim::workload
