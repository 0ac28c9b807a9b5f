// The factory of data-parallel wrappers (data_parallel.h): the one place that picks a wrapper.
#include "workload/data_parallel.h"

#include <variant>

namespace memsim::workload {

bool RankParams::OnSite(int param, GradSite site, int layer, const ModelDims& d) const {
  const ParamTensor& pt = params[param];
  auto starts_with = [&](const char* prefix) { return pt.name.rfind(prefix, 0) == 0; };
  switch (site) {
    case GradSite::kLayer:
      return pt.layer == layer && pt.layer >= 0;
    case GradSite::kEmbedding:
      return starts_with("embedding.");
    case GradSite::kHead:
      return starts_with("final_norm.") || starts_with("output_layer.") ||
             (d.tied && d.p == 1 && pt.name == "embedding.word_embeddings.weight");
  }
  return false;
}

std::vector<ShardSlice> RankParams::Whole() const {
  std::vector<ShardSlice> out;
  for (const std::vector<int>& group : groups) {
    for (int i : group) out.push_back({i, params[i].numel});
  }
  return out;
}

void ParamAllGather(Emitter& em, const ModelDims& d, const std::vector<GradBuffer>& buffers) {
  for (const GradBuffer& buf : buffers) {
    const int ranks = buf.ShardRanks(d);
    if (ranks <= 1) continue;
    for (const auto& [start, end] : buf.buckets) {
      em.Begin("optim.param_all_gather", -1, kCommStream);
      em.Collective(buf.expert ? CommGroup::kEdp : CommGroup::kDpCp, ranks,
                    static_cast<double>((end - start) * d.param_bytes), Coll::kGather);
    }
  }
}

std::unique_ptr<DataParallel> NewDataParallel(const config::Setup& setup, int rank,
                                              const ModelDims& d, const RankParams& params) {
  const config::DataParallelWrapper w = config::DataParallelOf(setup.training);
  if (const auto* ddp = std::get_if<config::MegatronDdp>(&w)) {
    return NewMegatronDdp(setup, rank, d, params, *ddp);
  }
  if (const auto* fsdp = std::get_if<config::MegatronFsdp>(&w)) {
    return NewMegatronFsdp(setup, rank, d, params, *fsdp);
  }
  if (const auto* ddp = std::get_if<config::TorchDdp>(&w)) return NewTorchDdp(d, params, *ddp);
  return NewSingleDevice(d, params, std::get<config::SingleDevice>(w));
}

std::vector<GradBuffer> LayoutGradBuffers(const config::Setup& setup, int pipeline_rank,
                                          const std::vector<ParamTensor>& params) {
  const ModelDims d = ComputeDims(setup);
  const config::DataParallelWrapper w = config::DataParallelOf(setup.training);
  if (const auto* ddp = std::get_if<config::MegatronDdp>(&w)) {
    return LayoutDdpBuffers(setup, pipeline_rank, d, params, ddp->distributed_optimizer);
  }
  if (const auto* fsdp = std::get_if<config::MegatronFsdp>(&w)) {
    return LayoutFsdpBuffers(setup, pipeline_rank, d, params,
                             fsdp->sharding != config::FsdpSharding::kNoShard);
  }
  return {};
}

}  // namespace memsim::workload
