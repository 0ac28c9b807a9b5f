// PyTorch FSDP2 (fsdp2.h, fsdp2.cc): the dim-0 padding of each parameter, the units torchtitan
// makes, and the device bytes of two transformer blocks at DP 4 at each point of forward and
// backward, with and without reshard_after_forward. Every expected size is derived below from
// PyTorch v2.6.0 torch/distributed/fsdp/_fully_shard/ (_fsdp_param.py, _fsdp_collectives.py,
// _fsdp_param_group.py), as cited in fsdp2.cc.
#include "workload/fsdp2.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "workload/emitter.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

TEST_CASE("FSDP2 pads each parameter's dim 0 to a multiple of the world size",
          "[workload][fsdp2]") {
  // _get_dim0_padded_size: ceil(dim0 / w) · w rows of shape[1:] elements; the local shard of
  // rank 0 is min(ceil(dim0 / w), dim0) rows.
  const auto [rows, row_numel, world, padded, local] =
      GENERATE(table<std::int64_t, std::int64_t, int, std::int64_t, std::int64_t>({
          {8, 3, 4, 24, 6},    // dim0 a multiple of w: no padding, 2 rows each
          {9, 3, 4, 36, 9},    // 9 rows -> 12 (3 per rank)
          {3, 5, 4, 20, 5},    // fewer rows than ranks: 1 row each, ranks 3 holds padding only
          {1, 1, 4, 4, 1},     // a scalar-like 1-D parameter
          {10, 8, 1, 80, 80},  // one rank: whole
      }));
  const ParamTensor pt = MakeParam("p", rows * row_numel, row_numel, 0, 0, false, false);
  CHECK(Fsdp2PaddedNumel(pt, world) == padded);
  CHECK(Fsdp2LocalShardNumel(pt, world) == local);
}

// Two blocks of two parameters each: a 1-D norm of 6 elements and a [10, 8] weight.
// At world 4: norm 6 -> 8 padded (2 per rank), weight 10 rows -> 12 rows · 8 = 96 (24 per
// rank): a unit's padded numel 104, its shard 26.
RankParams TwoBlocks() {
  RankParams p;
  for (int l = 0; l < 2; ++l) {
    p.params.push_back(MakeParam(fmt::format("layer{}.norm.weight", l), 6, 1, 0, l, true, false));
    p.params.push_back(MakeParam(fmt::format("layer{}.w.weight", l), 80, 8, 0, l, false, false));
  }
  p.groups = {{0, 1, 2, 3}};
  return p;
}

TEST_CASE("FSDP2 units: one per block, padded sums, local shards for the optimizer",
          "[workload][fsdp2]") {
  ModelDims d;
  d.dp_cp = 4;
  const RankParams params = TwoBlocks();
  const std::vector<Fsdp2Unit> units = LayoutFsdp2Units(d, params, 4, true);
  REQUIRE(units.size() == 2);  // no embedding or head parameters: those units are left out
  CHECK(units[0] == Fsdp2Unit{GradSite::kLayer, 0, true, {0, 1}, 104, 26});
  CHECK(units[1] == Fsdp2Unit{GradSite::kLayer, 1, true, {2, 3}, 104, 26});
  const std::unique_ptr<DataParallel> dp = NewTorchFsdp2(d, params, {});
  // The optimizer's state is like each local shard: norm 2, weight 3 rows · 8 = 24.
  const std::vector<ShardSlice> slices = dp->OptimizerSlices();
  REQUIRE(slices.size() == 4);
  CHECK(slices[0].numel == 2);
  CHECK(slices[1].numel == 24);
  // Born sharded: the padded fp32 shard (norm 2 · 4 B, weight 24 · 4 B), whatever the whole was.
  CHECK(dp->Constructed(0, 12).kept == 8);
  CHECK(dp->Constructed(1, 160).kept == 96);
}

// Bytes alive after a marker op, by kind of tensor.
struct Alive {
  Bytes shards = 0;         // the fp32 sharded parameters
  Bytes unsharded = 0;      // gathered parameters (param_dtype, padded)
  Bytes all_gather = 0;     // all-gather outputs
  Bytes grads = 0;          // unsharded gradients from autograd
  Bytes rs_input = 0;       // reduce-scatter inputs
  Bytes sharded_grads = 0;  // the sharded fp32 gradients
  bool operator==(const Alive&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Alive& a) {
  return os << "{shards " << a.shards << ", unsharded " << a.unsharded << ", all_gather "
            << a.all_gather << ", grads " << a.grads << ", rs_input " << a.rs_input
            << ", sharded_grads " << a.sharded_grads << "}";
}

std::map<std::string, Alive> AliveAtMarks(const Program& p) {
  std::map<TensorId, std::string> labels;
  std::map<TensorId, Bytes> sizes;
  std::map<std::string, Alive> out;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      labels[a.id] = a.label;
      sizes[a.id] = a.size_bytes;
    }
    for (TensorId id : op.frees) sizes.erase(id);
    if (op.name.rfind("mark.", 0) != 0) continue;
    Alive a;
    for (const auto& [id, bytes] : sizes) {
      const std::string& l = labels[id];
      auto has = [&](const char* prefix) { return l.rfind(prefix, 0) == 0; };
      Bytes* slot = has("fsdp2.unsharded.")               ? &a.unsharded
                    : has("fsdp2.all_gather_output.")     ? &a.all_gather
                    : has("fsdp2.reduce_scatter_input.")  ? &a.rs_input
                    : has("fsdp2.reduce_scatter_output.") ? &a.sharded_grads
                    : has("fsdp2.sharded_grad.")          ? &a.sharded_grads
                    : has("grad.")                        ? &a.grads
                    : has("layer")                        ? &a.shards
                                                          : nullptr;
      REQUIRE(slot != nullptr);
      *slot += bytes;
    }
    out[op.name.substr(5)] = a;
  }
  return out;
}

// One forward and one backward of the two blocks, as the stage runner calls the hooks (the
// root's post-forward at the head's AfterForward), with bf16 gathered parameters and grads.
Program RunTwoBlocks(const config::TorchFsdp2& o, int backwards) {
  const config::Setup setup = testing::TinyLlama();
  ModelDims d;
  d.dp_cp = 4;
  d.param_bytes = 2;
  d.grad_bytes = 2;
  const RankParams params = TwoBlocks();
  const std::unique_ptr<DataParallel> dp = NewTorchFsdp2(d, params, o);
  Emitter em(setup, 0, 1);
  em.SetContext(0, Phase::kInit, -1);
  em.Begin("init");
  for (int i = 0; i < 4; ++i) {
    em.Alloc(dp->Constructed(i, 0).kept, Category::kParameters, params.params[i].name);
  }
  auto mark = [&](const std::string& name) { em.Begin("mark." + name); };
  em.SetPhase(Phase::kForward);
  for (int l = 0; l < 2; ++l) {
    dp->BeforeForward(em, GradSite::kLayer, l);
    mark(fmt::format("fwd{}", l));
    dp->AfterForward(em, GradSite::kLayer, l);
    mark(fmt::format("post_fwd{}", l));
  }
  dp->AfterForward(em, GradSite::kHead, -1);
  mark("root_post_fwd");
  em.SetPhase(Phase::kBackward);
  for (int b = 0; b < backwards; ++b) {
    for (int l = 1; l >= 0; --l) {
      dp->BeforeBackward(em, GradSite::kLayer, l);
      mark(fmt::format("pre_bwd{}.{}", l, b));
      em.Begin("autograd");
      for (int i = 2 * l; i < 2 * l + 2; ++i) {  // AccumulateGrad: unpadded, bf16
        const ParamTensor& pt = params.params[i];
        dp->TakeParamGrad(em, em.Alloc(pt.numel * 2, Category::kGradients, "grad." + pt.name),
                          pt.name);
      }
      mark(fmt::format("grads{}.{}", l, b));
      dp->AfterBackward(em, GradSite::kLayer, l);
      mark(fmt::format("post_bwd{}.{}", l, b));
    }
    dp->EndOfBackward(em);
    mark(fmt::format("end{}", b));
  }
  em.SetPhase(Phase::kOptimizerStep);
  em.Begin("zero_grad");  // the loop's op, in which the wrapper frees
  dp->ZeroGrad(em);
  mark("zero_grad");
  return em.Finish();
}

// Sizes (units of 104 padded / 26 shard elements; gradients unpadded 6 + 80 = 86 elements):
constexpr Bytes kShards = 2 * 26 * 4;   // both blocks' fp32 shards: 208
constexpr Bytes kGathered = 104 * 2;    // one block's unsharded bf16 parameters: 208
constexpr Bytes kAllGather = 104 * 2;   // one block's all-gather output: 208
constexpr Bytes kGrads = 86 * 2;        // one block's bf16 gradients: 172
constexpr Bytes kRsInput = 104 * 4;     // reduce_dtype fp32: 416
constexpr Bytes kShardedGrad = 26 * 4;  // one block's fp32 sharded gradient: 104

TEST_CASE("FSDP2 device bytes of two blocks at DP 4 with reshard_after_forward",
          "[workload][fsdp2]") {
  const std::map<std::string, Alive> at = AliveAtMarks(RunTwoBlocks({}, 1));
  // Block 0's pre_forward: gathered, its all-gather output deferred (all_gather_state).
  CHECK(at.at("fwd0") == Alive{kShards, kGathered, kAllGather, 0, 0, 0});
  // post_forward reshards; the output stays deferred until block 1's copy-out.
  CHECK(at.at("post_fwd0") == Alive{kShards, 0, kAllGather, 0, 0, 0});
  // Block 1's wait_for_unshard frees block 0's output before its own copy-out.
  CHECK(at.at("fwd1") == Alive{kShards, kGathered, kAllGather, 0, 0, 0});
  CHECK(at.at("post_fwd1") == Alive{kShards, 0, kAllGather, 0, 0, 0});
  // The root's post-forward drops the last deferred output.
  CHECK(at.at("root_post_fwd") == Alive{kShards, 0, 0, 0, 0, 0});
  // Block 1's pre_backward gathers it again (output freed after copy-out) and prefetches
  // block 0: its all-gather output waits for block 0's own pre_backward.
  CHECK(at.at("pre_bwd1.0") == Alive{kShards, kGathered, kAllGather, 0, 0, 0});
  CHECK(at.at("grads1.0") == Alive{kShards, kGathered, kAllGather, kGrads, 0, 0});
  // post_backward: reshard, the reduce-scatter input kept (reduce_scatter_state), the bf16
  // grads dropped, the fp32 output viewed as the sharded grads.
  CHECK(at.at("post_bwd1.0") == Alive{kShards, 0, kAllGather, 0, kRsInput, kShardedGrad});
  CHECK(at.at("pre_bwd0.0") == Alive{kShards, kGathered, 0, 0, kRsInput, kShardedGrad});
  CHECK(at.at("grads0.0") == Alive{kShards, kGathered, 0, kGrads, kRsInput, kShardedGrad});
  // Block 1's input is dropped before block 0's is made.
  CHECK(at.at("post_bwd0.0") == Alive{kShards, 0, 0, 0, kRsInput, 2 * kShardedGrad});
  // The root's final callback drops the last reduce-scatter input.
  CHECK(at.at("end0") == Alive{kShards, 0, 0, 0, 0, 2 * kShardedGrad});
  CHECK(at.at("zero_grad") == Alive{kShards, 0, 0, 0, 0, 0});
}

TEST_CASE("FSDP2 device bytes of two blocks at DP 4 without reshard_after_forward",
          "[workload][fsdp2]") {
  config::TorchFsdp2 o;
  o.reshard_after_forward = false;
  const std::map<std::string, Alive> at = AliveAtMarks(RunTwoBlocks(o, 1));
  CHECK(at.at("fwd0") == Alive{kShards, kGathered, kAllGather, 0, 0, 0});
  CHECK(at.at("post_fwd0") == Alive{kShards, kGathered, kAllGather, 0, 0, 0});
  CHECK(at.at("fwd1") == Alive{kShards, 2 * kGathered, kAllGather, 0, 0, 0});
  CHECK(at.at("root_post_fwd") == Alive{kShards, 2 * kGathered, 0, 0, 0, 0});
  // Both blocks stay gathered: no all-gather in backward, nothing to prefetch.
  CHECK(at.at("pre_bwd1.0") == Alive{kShards, 2 * kGathered, 0, 0, 0, 0});
  CHECK(at.at("grads1.0") == Alive{kShards, 2 * kGathered, 0, kGrads, 0, 0});
  CHECK(at.at("post_bwd1.0") == Alive{kShards, kGathered, 0, 0, kRsInput, kShardedGrad});
  CHECK(at.at("grads0.0") == Alive{kShards, kGathered, 0, kGrads, kRsInput, kShardedGrad});
  CHECK(at.at("post_bwd0.0") == Alive{kShards, 0, 0, 0, kRsInput, 2 * kShardedGrad});
  CHECK(at.at("end0") == Alive{kShards, 0, 0, 0, 0, 2 * kShardedGrad});
}

TEST_CASE("FSDP2 accumulates a second backward into the sharded grads, bf16 reduce casts",
          "[workload][fsdp2]") {
  SECTION("a second backward adds into the existing sharded grads") {
    const std::map<std::string, Alive> at = AliveAtMarks(RunTwoBlocks({}, 2));
    CHECK(at.at("post_bwd1.1") == Alive{kShards, 0, kAllGather, 0, kRsInput, 2 * kShardedGrad});
    CHECK(at.at("end1") == Alive{kShards, 0, 0, 0, 0, 2 * kShardedGrad});
  }
  SECTION("reduce_dtype bf16: half the reduce-scatter input, grads still fp32") {
    config::TorchFsdp2 o;
    o.reduce_dtype = config::Precision::kBf16;
    const std::map<std::string, Alive> at = AliveAtMarks(RunTwoBlocks(o, 1));
    CHECK(at.at("post_bwd0.0") == Alive{kShards, 0, 0, 0, 104 * 2, 2 * kShardedGrad});
  }
}

}  // namespace
}  // namespace memsim::workload
