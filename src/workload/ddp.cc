// Megatron-core DistributedDataParallel (megatron/core/distributed/distributed_data_parallel.py,
// param_and_grad_buffer.py), with or without the distributed optimizer
// (megatron/core/optimizer/distrib_optimizer.py):
// - one contiguous grad buffer per model chunk (fp32 for bf16, see ModelDims::grad_bytes), and
//   with the distributed optimizer a param buffer the parameters move into (their own storage
//   freed, one by one);
// - a post-backward hook per parameter adds .grad into main_grad and drops it;
// - buckets are all-reduced, or reduce-scattered with the distributed optimizer, during the last
//   micro-batch's backward (overlap_grad_reduce) or in finish_grad_sync;
// - with the distributed optimizer, each rank updates its 1/(d·cp) shard of every bucket and
//   the updated params are all-gathered into the param buffer after the step.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "workload/data_parallel.h"

namespace memsim::workload {

std::vector<GradBuffer> LayoutDdpBuffers(const config::Setup& setup, int rank, const ModelDims& d,
                                         const std::vector<ParamTensor>& params,
                                         bool distributed_optimizer) {
  // _ParamAndGradBuffer.__init__: params in reverse order; with the distributed optimizer each
  // param start padded to 64 elements and each bucket end to lcm(d·cp, 128); buckets close at
  // bucket_size = max(4e7, 1e6·d·cp) elements only with overlap_grad_reduce on pp rank 0,
  // chunk 0 (training.py get_model, disable_bucketing); the shared embedding gets its own
  // bucket (_does_param_require_new_bucket, distributed optimizer only). Expert parameters get
  // buffers of their own right after each chunk's (DistributedDataParallel.__init__:
  // expert_parallel_buffers, over the expert data-parallel group, padded for its size).
  BucketRules rules;
  rules.registration_order = false;
  rules.start_align = distributed_optimizer ? 64 : 1;
  rules.end_align = distributed_optimizer ? std::lcm(std::int64_t{d.dp_cp}, std::int64_t{128}) : 1;
  rules.shared_embedding_own_bucket = distributed_optimizer;
  if (setup.training.overlap_grad_reduce && rank == 0) {
    rules.first_chunk_bucket_size =
        std::max<std::int64_t>(40'000'000, std::int64_t{1'000'000} * d.dp_cp);
  }
  std::vector<GradBuffer> dense = LayoutBuckets(d, params, rules);
  if (d.experts <= 1) return dense;
  rules.expert = true;
  rules.end_align = distributed_optimizer ? std::lcm(std::int64_t{d.edp}, std::int64_t{128}) : 1;
  std::vector<GradBuffer> expert = LayoutBuckets(d, params, rules);
  std::vector<GradBuffer> out;
  for (std::size_t c = 0; c < dense.size(); ++c) {
    out.push_back(std::move(dense[c]));
    if (expert[c].numel_padded > 0) out.push_back(std::move(expert[c]));
  }
  return out;
}

namespace {

class MegatronDdpWrapper final : public DataParallel {
 public:
  MegatronDdpWrapper(const config::Setup& setup, int rank, const ModelDims& d,
                     const RankParams& params, bool dist)
      : d_(d),
        params_(params),
        dist_(dist),
        overlap_(setup.training.overlap_grad_reduce),
        buffers_(LayoutDdpBuffers(setup, rank, d, params.params, dist)) {}

  // One param/grad buffer pair per model chunk; with the distributed optimizer the params move
  // into param_data one by one, their old blocks freed.
  void Setup(Emitter& em, const std::vector<TensorId>& param_ids) override {
    for (const GradBuffer& buf : buffers_) {
      em.Begin("init.ddp.buffers");
      const char* kind = buf.expert ? ".expert" : "";
      if (dist_) {
        em.Alloc(buf.numel_padded * d_.param_bytes, Category::kParameters,
                 fmt::format("ddp.chunk{}{}.param_buffer", buf.chunk, kind));
      }
      em.Alloc(buf.numel_padded * d_.grad_bytes, Category::kGradients,
               fmt::format("ddp.chunk{}{}.grad_buffer", buf.chunk, kind));
      if (dist_) {
        em.Begin("init.ddp.move_params");
        for (const GradBuffer::Entry& e : buf.entries) em.Free(param_ids[e.param]);
      }
    }
  }

  std::vector<ShardSlice> OptimizerSlices() const override {
    return dist_ ? ShardSlices(d_, params_.params, buffers_) : params_.Whole();
  }
  bool ShardsOptimizer() const override { return dist_; }

  // _make_backward_post_hook: main_grad.add_(grad); grad = None.
  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& /*param*/) override {
    em.Free(grad);
  }
  void AfterLastBackward(Emitter& em, int chunk) override {
    if (overlap_) GradSync(em, chunk);
  }
  void FinishGradSync(Emitter& em) override {
    if (overlap_) return;
    for (int c = 0; c < d_.v; ++c) GradSync(em, c);
  }
  // The distributed optimizer's param all-gather into param_data.
  void AfterOptimizerStep(Emitter& em) override {
    if (dist_) ParamAllGather(em, d_, buffers_);
  }

  WrapperSizes StaticSizes() const override {
    std::int64_t count = 0, padded = 0;
    for (const ParamTensor& pt : params_.params) count += pt.numel;
    for (const GradBuffer& buf : buffers_) padded += buf.numel_padded;
    WrapperSizes s;
    s.parameter_bytes = (dist_ ? padded : count) * d_.param_bytes;
    s.gradient_bytes = padded * d_.grad_bytes;
    return s;
  }

 private:
  // finish_grad_sync per bucket: in place on the communication stream, on the group the wrapper
  // gets, get_data_parallel_group(with_context_parallel=True), Megatron's "dp_cp"
  // (parallel_state.py get_nccl_options pg_name; expert buffers: "edp", the expert
  // data-parallel group).
  void GradSync(Emitter& em, int chunk) {
    for (const GradBuffer& buf : buffers_) {
      const int ranks = buf.ShardRanks(d_);
      if (buf.chunk != chunk || ranks <= 1) continue;
      for (const auto& [start, end] : buf.buckets) {
        em.Begin(dist_ ? "ddp.grad_reduce_scatter" : "ddp.grad_all_reduce", -1, kCommStream);
        em.Collective(buf.expert ? CommGroup::kEdp : CommGroup::kDpCp, ranks,
                      static_cast<double>((end - start) * d_.grad_bytes),
                      dist_ ? Coll::kGather : Coll::kAllReduce);
      }
    }
  }

  const ModelDims& d_;
  const RankParams& params_;
  const bool dist_;
  const bool overlap_;
  const std::vector<GradBuffer> buffers_;
};

}  // namespace

std::unique_ptr<DataParallel> NewMegatronDdp(const config::Setup& setup, int rank,
                                             const ModelDims& d, const RankParams& params,
                                             const config::MegatronDdp& ddp) {
  return std::make_unique<MegatronDdpWrapper>(setup, rank, d, params, ddp.distributed_optimizer);
}

}  // namespace memsim::workload
