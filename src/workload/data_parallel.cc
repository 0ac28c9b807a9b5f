// What the data-parallel wrappers share (data_parallel.h); each stack picks its own wrapper
// (config/stack.h NewDataParallel).
#include "workload/data_parallel.h"

#include "config/stack.h"

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
  return config::StackOf(setup.training).NewDataParallel(setup, rank, d, params);
}

std::vector<GradBuffer> LayoutGradBuffers(const config::Setup& setup, int pipeline_rank,
                                          const std::vector<ParamTensor>& params) {
  return config::StackOf(setup.training)
      .LayoutGradBuffers(setup, pipeline_rank, ComputeDims(setup), params);
}

}  // namespace memsim::workload
