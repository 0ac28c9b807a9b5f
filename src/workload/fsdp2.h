// PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) units: which parameters one fully_shard
// call groups into one FSDPParamGroup, and the sizes its collectives use. The wrapper itself is
// workload/fsdp2.cc (NewTorchFsdp2 in data_parallel.h); this header is the pure layout a test or
// another sharding wrapper (FSDP1's FlatParameter units) can reuse.
//
// Sources, PyTorch v2.6.0, torch/distributed/fsdp/_fully_shard/ (v2.4-v2.5:
// torch/distributed/_composable/fsdp/, same rules):
// - _fsdp_param.py FSDPParam._init_sharded_param: each parameter is chunked on dim 0 over the
//   mesh's ranks, dim 0 padded up to a multiple of the world size (`padded_sharded_param_size`:
//   ceil(dim0 / w) rows per rank); the padded shard is the parameter's own tensor.
// - _fsdp_collectives.py foreach_all_gather: one all-gather per group, its output
//   Σ(padded shard) × w elements in param_dtype; foreach_reduce: the reduce-scatter input is
//   Σ padded unsharded sizes (_get_dim0_padded_size) in reduce_dtype, its output that / w.
// - The units torchtitan makes (torchtitan/models/llama3/infra/parallelize.py apply_fsdp, at
//   commit 31a17bfdb70bab6f62a13d21816a5339b911d6e3): fully_shard(tok_embeddings), one per
//   transformer block, fully_shard([norm, output], reshard_after_forward=policy == "always"),
//   then fully_shard(model) over nothing left.
// Not modelled: uneven shards past rank 0 (memsim simulates rank 0, whose chunks are full),
// shard placements other than Shard(0), HSDP's replicate dimension.
// Sizes in elements unless named _bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "workload/data_parallel.h"
#include "workload/model.h"

namespace memsim::workload {

// One fully_shard unit (an FSDPParamGroup): the parameters of a site of the stage runner.
struct Fsdp2Unit {
  GradSite site = GradSite::kLayer;
  int layer = -1;  // kLayer: the global layer; -1 otherwise
  // fully_shard(reshard_after_forward=...): the unsharded parameters are freed at post-forward
  // (and gathered again in pre-backward) iff true.
  bool reshard_after_forward = true;
  std::vector<int> params;        // indices into RankParams::params, construction order
  std::int64_t padded_numel = 0;  // Σ dim-0-padded unsharded numel (all-gather output, RS input)
  std::int64_t shard_numel = 0;   // padded_numel / world: this rank's padded shard
  bool operator==(const Fsdp2Unit&) const = default;
};

// Elements of `pt` with dim 0 padded to a multiple of `world` (_get_dim0_padded_size).
// REQUIRES: world >= 1.
std::int64_t Fsdp2PaddedNumel(const ParamTensor& pt, int world);
// Elements of rank 0's unpadded local shard of `pt` (the DTensor's local tensor, what
// torch.optim makes its state like): min(ceil(dim0 / world), dim0) rows.
std::int64_t Fsdp2LocalShardNumel(const ParamTensor& pt, int world);

// torchtitan's units over `params` (order of forward: the embedding, the layers, [norm,
// output]); a parameter belongs to the first unit whose site has it (RankParams::OnSite). Units
// without parameters are left out. `reshard_after_forward` applies to the embedding and the
// blocks; the head unit is never resharded after forward. `world`: the shard mesh's size.
std::vector<Fsdp2Unit> LayoutFsdp2Units(const ModelDims& d, const RankParams& params, int world,
                                        bool reshard_after_forward);

}  // namespace memsim::workload
