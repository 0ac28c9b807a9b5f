// PyTorch DistributedDataParallel around the plain PyTorch loop (torch_ddp.cc): the bucket
// assignment of reducer.cpp compute_bucket_assignment_by_size, the buckets made at construction,
// .grad next to the buckets (gradient_as_bucket_view False) or as views into them (True), the
// all-reduce per bucket in the last micro-batch's backward only (no_sync before it), and the
// rebuild at step 2's first forward over the gradient-ready order of step 1.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "workload/build.h"
#include "workload/test_setups.h"
#include "workload/torch_ddp.h"

namespace memsim::workload {
namespace {

TEST_CASE("DDP bucket assignment: limits, one tensor over the limit, dtypes apart, order",
          "[workload][ddp]") {
  // Limits [10, 25]: the first bucket closes at >= 10 bytes, the others at >= 25.
  // 0: 4, 1: 8 -> 12 >= 10 closes {0, 1}; 2: 30 >= 25 alone; 3: 5 (dtype 2, its own walk, still
  // at the first limit 10), 4: 20, 5: 6 -> 26 >= 25 closes {4, 5}; open at the end: {3}.
  const std::vector<DdpTensor> t = {{0, 4, 4}, {1, 8, 4}, {2, 30, 4},
                                    {3, 5, 2}, {4, 20, 4}, {5, 6, 4}};
  CHECK(DdpBucketAssignment(t, {10, 25}, false) ==
        std::vector<std::vector<int>>{{0, 1}, {2}, {4, 5}, {3}});
  // Sorted by smallest index (the construction-time assignment): {3} moves before {4, 5}.
  CHECK(DdpBucketAssignment(t, {10, 25}, true) ==
        std::vector<std::vector<int>>{{0, 1}, {2}, {3}, {4, 5}});
  // sys.maxsize (find_unused_parameters False at construction): one bucket per dtype.
  CHECK(DdpBucketAssignment(t, {INT64_MAX}, true) ==
        std::vector<std::vector<int>>{{0, 1, 2, 4, 5}, {3}});
}

// testing::TinyLlama in a plain PyTorch loop over two DDP ranks: fp32 weights (torch_dtype
// float32) under bf16 autocast, micro-batch 1, global batch 4 = two micro-batches per rank
// (gradient accumulation 2), three iterations.
config::Setup TinyDdp(double cap_mb, bool find_unused, bool view) {
  config::Setup s = testing::TinyLlama();
  s.training.framework = "pytorch";
  s.training.stack.emplace<config::PyTorchOptions>();
  s.training.data_parallel_size = 2;
  s.training.global_batch_size = 4;
  s.training.num_micro_batches = 2;
  s.training.train_iters = 3;
  s.training.precision = config::Precision::kBf16;
  s.training.pytorch()->torch_dtype = config::Precision::kFp32;
  s.training.gradient_accumulation_fusion = false;
  s.training.optimizer_impl = config::OptimizerImpl::kForeach;
  s.training.pytorch()->ddp_bucket_cap_mb = cap_mb;
  s.training.pytorch()->ddp_find_unused_parameters = find_unused;
  s.training.pytorch()->ddp_gradient_as_bucket_view = view;
  return s;
}

// Parameter bytes in construction order, fp32 (single_device_test.cc derives the counts):
// embedding 16384·4 = 65536; per layer ln1 256, qkv 49152, proj 16384, ln2 256, fc1 65536,
// fc2 32768 (layer 164352); final norm 256; output layer 65536. Total 4·115008 = 460032.
constexpr Bytes kLayer = 256 + 49152 + 16384 + 256 + 65536 + 32768;
constexpr Bytes kGrads = 65536 + 2 * kLayer + 256 + 65536;
static_assert(kGrads == 4 * 115008);

// The sizes of the tensors allocated by ops named `name` (in op order) with `label` in their
// label.
std::vector<Bytes> AllocsOf(const Program& p, const std::string& name, const std::string& label) {
  std::vector<Bytes> out;
  for (const Op& op : p.ops) {
    if (op.name != name) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.find(label) != std::string::npos) out.push_back(a.size_bytes);
    }
  }
  return out;
}

// Gradient bytes alive after the last op of (iteration, phase, micro-batch).
Bytes GradsAfter(const Program& p, int iteration, Phase phase, int mb) {
  std::map<TensorId, Bytes> alive;
  Bytes at = -1;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kGradients) alive[a.id] = a.size_bytes;
    }
    for (TensorId id : op.frees) alive.erase(id);
    if (op.iteration == iteration && op.phase == phase && op.micro_batch == mb) {
      at = 0;
      for (const auto& [id, bytes] : alive) at += bytes;
    }
  }
  return at;
}

// All-reduces of (iteration, micro-batch): op count.
int AllReduces(const Program& p, int iteration, int mb) {
  int n = 0;
  for (const Op& op : p.ops) {
    n += op.name == "ddp.bucket_all_reduce" && op.iteration == iteration && op.micro_batch == mb;
  }
  return n;
}

TEST_CASE("DDP with find_unused_parameters: buckets by registration order, reversed, no rebuild",
          "[workload][ddp]") {
  // bucket_cap_mb passed as 1/16 (65536 bytes): limits [65536] (no 1 MiB first bucket). Walk in
  // registration order: {embedding} 65536; {ln1, qkv, proj} 65792; {ln2, fc1} 65792;
  // {fc2, ln1', qkv'} 82176; {proj', ln2', fc1'} 82176; {fc2', final norm, output} 98560.
  // Reversed: the output layer's bucket first.
  const Program p = Build(TinyDdp(1.0 / 16, true, false), 0);
  CHECK(AllocsOf(p, "init.ddp.reducer", "ddp.bucket") ==
        std::vector<Bytes>{98560, 82176, 82176, 65792, 65792, 65536});
  // local_used_map_dev_: int32 per parameter, 15 parameters.
  CHECK(AllocsOf(p, "init.ddp.reducer", "local_used_map") == std::vector<Bytes>{60});
  CHECK(AllocsOf(p, "ddp.rebuild_buckets.initialize", "").empty());
  // Six all-reduces in each iteration, all in the last micro-batch's backward.
  for (int k = 1; k <= 3; ++k) {
    CHECK(AllReduces(p, k, 0) == 0);
    CHECK(AllReduces(p, k, 1) == 6);
  }
}

TEST_CASE("DDP start-up: the module states broadcast through one flattened 250 MiB bucket",
          "[workload][ddp]") {
  // 15 parameters, 460032 bytes < 250 MiB: one bucket of several tensors, flattened into one
  // new tensor (flatten_dense_tensors), freed once the broadcast finished.
  const Program p = Build(TinyDdp(0, false, false), 0);
  CHECK(AllocsOf(p, "init.ddp.sync_module_states", "flat") == std::vector<Bytes>{kGrads});
}

TEST_CASE("DDP without find_unused_parameters: one bucket in step 1, rebuilt for step 2",
          "[workload][ddp]") {
  // Construction: limit sys.maxsize, one bucket of every gradient.
  // Rebuild over step 1's gradient-ready order (head: output layer and final norm 65792, then
  // layer 1 164352, layer 0 164352, embedding 65536) with bucket_cap_mb passed as 899/4096 MiB
  // = 230144 bytes (first bucket too): head + layer 1 = 230144 closes exactly at layer 1's last
  // gradient whatever the order inside the layer; layer 0 + embedding = 229888 stays open
  // until the end.
  const Program p = Build(TinyDdp(899.0 / 4096, false, false), 0);
  CHECK(AllocsOf(p, "init.ddp.reducer", "ddp.bucket") == std::vector<Bytes>{kGrads});
  CHECK(AllocsOf(p, "ddp.rebuild_buckets.initialize", "ddp.bucket") ==
        std::vector<Bytes>{230144, 229888});
  CHECK(AllReduces(p, 1, 1) == 1);
  CHECK(AllReduces(p, 2, 1) == 2);
  CHECK(AllReduces(p, 3, 1) == 2);
  // gradient_as_bucket_view False: after each micro-batch's backward every .grad exists next to
  // the buckets: 2 × 460032. zero_grad (set_to_none) leaves the buckets only.
  for (int k = 1; k <= 3; ++k) {
    CHECK(GradsAfter(p, k, Phase::kBackward, 0) == 2 * kGrads);
    CHECK(GradsAfter(p, k, Phase::kBackward, 1) == 2 * kGrads);
  }
  CHECK(GradsAfter(p, 2, Phase::kForward, 0) == kGrads);
}

TEST_CASE("DDP with gradient_as_bucket_view: .grad is a bucket view after the synced backward",
          "[workload][ddp]") {
  const Program p = Build(TinyDdp(0, false, true), 0);
  // Micro-batch 0 runs under no_sync: .grad is a tensor of its own (460032) next to the bucket.
  // Micro-batch 1 synchronises: each .grad is copied into its view and its tensor dropped.
  for (int k = 1; k <= 3; ++k) {
    CHECK(GradsAfter(p, k, Phase::kBackward, 0) == 2 * kGrads);
    CHECK(GradsAfter(p, k, Phase::kBackward, 1) == kGrads);
  }
  // Default caps (bucket_cap_mb not passed): the rebuild's first limit is 1 MiB, and 460032
  // bytes stay under it: one bucket again.
  CHECK(AllocsOf(p, "ddp.rebuild_buckets.initialize", "ddp.bucket") == std::vector<Bytes>{kGrads});
}

TEST_CASE("DDP rebuild with gradient_as_bucket_view and .grad kept: the old bucket outlives it",
          "[workload][ddp]") {
  // zero_grad(set_to_none=False) keeps each .grad, a view into the one construction-time
  // bucket. initialize_buckets drops the Bucket structs, but the views hold the old storage
  // until initialize_bucket_views copies each .grad into its new view and re-points it: the old
  // bucket is freed only after the new ones exist, so both are alive in the rebuild,
  // 2 × 460032 bytes of buckets.
  config::Setup s = TinyDdp(0, false, true);
  s.training.pytorch()->zero_grad_set_to_none = false;
  const Program p = Build(s, 0);
  CHECK(AllocsOf(p, "ddp.rebuild_buckets", "ddp.bucket") == std::vector<Bytes>{kGrads});
  CHECK(AllocsOf(p, "ddp.rebuild_buckets.initialize", "").empty());
  Bytes at_rebuild = 0;
  std::map<TensorId, Bytes> alive;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kGradients) alive[a.id] = a.size_bytes;
    }
    if (op.name == "ddp.rebuild_buckets") {
      for (const auto& [id, bytes] : alive) at_rebuild += bytes;
    }
    for (TensorId id : op.frees) alive.erase(id);
  }
  CHECK(at_rebuild == 2 * kGrads);
  // From then on the views are the only gradients: the bucket, 460032 bytes.
  CHECK(GradsAfter(p, 3, Phase::kBackward, 1) == kGrads);
}


TEST_CASE("DDP with a tied output weight: one gradient hand-over, after the embedding's backward",
          "[workload][ddp]") {
  // The output layer reads the embedding's Parameter: autograd runs its AccumulateGrad (and the
  // Reducer's hook on it) once a backward, when both grads are in (torch/csrc/autograd/
  // engine.cpp; input_buffer.cpp accumulate adds the embedding's grad into the output layer's in
  // place). memsim used to hand both to the Reducer, which counted the parameter ready twice
  // (an internal error). Grads: TinyDdp's parameters without the output layer's own weight,
  // 4 × 115008 − 65536 = 394,496 B of .grad beside as many bytes of buckets.
  config::Setup s = TinyDdp(899.0 / 4096, false, false);
  s.model.tie_word_embeddings = true;
  const Program p = Build(s, 0);
  constexpr Bytes kTiedGrads = kGrads - 65536;
  for (int k = 1; k <= 3; ++k) {
    CHECK(GradsAfter(p, k, Phase::kBackward, 0) == 2 * kTiedGrads);
    CHECK(GradsAfter(p, k, Phase::kBackward, 1) == 2 * kTiedGrads);
  }
  int sums = 0;
  for (const Op& op : p.ops) sums += op.name == "embedding.grad_accumulate" && op.iteration == 1;
  CHECK(sums == 2);  // one per micro-batch
}

}  // namespace
}  // namespace memsim::workload
