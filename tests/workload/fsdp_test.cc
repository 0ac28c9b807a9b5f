// Megatron-FSDP (use_megatron_fsdp) with data_parallel_sharding_strategy no_shard, optim and
// optim_grads. Sources: Megatron-LM megatron/core/distributed/fsdp/src/megatron_fsdp/
// param_and_grad_buffer.py (`ParamAndGradBuffer._init_each_parameter_group_buffers`,
// `build_data_parallel_buffer_index`, `GradReducePipeline`, `TemporaryBucketAllocator`) and
// megatron_fsdp.py (`_grad_acc`, `_root_post_backward`), Megatron-core 0.14/0.15:
// - weight buffer: 16-bit, full size; main weights: fp32, 1/d shard unless no_shard; grad
//   buffer in the grad dtype, full size, or 1/d with optim_grads. Per parameter (Adam, fp32
//   grads): no_shard 2 + 4 + 4 + 8 = 18 B, optim 6 + 12/d B, optim_grads 2 + 16/d B.
// - with a sharding strategy each bucket is padded to a multiple of d × lcm(shape[1:] elements).
// - optim_grads: a temporary full-size bucket per backward, reduce-scattered into a shard-sized
//   tensor once complete, held until the queue exceeds max(1e9, bucket) elements or the
//   backward ends.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "workload/build.h"
#include "workload/model.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

config::Setup Fsdp(config::Setup s, config::FsdpSharding sharding, int dp) {
  s.training.use_megatron_fsdp = true;
  s.training.fsdp_sharding = sharding;
  // config/ sets the flag from the strategy (Megatron-FSDP builds its optimizer that way).
  s.training.use_distributed_optimizer = sharding != config::FsdpSharding::kNoShard;
  s.training.data_parallel_size = dp;
  s.training.global_batch_size = s.training.micro_batch_size * dp;
  s.training.num_micro_batches = 1;
  s.training.accumulate_allreduce_grads_in_fp32 = true;  // bf16: fp32 grads (4 B)
  return s;
}

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

TEST_CASE("Megatron-FSDP buckets: padded to d·lcm(shape[1:]) when sharding, contiguous params",
          "[fsdp]") {
  // Paper GPT (test_setups.h): h 1024, ffn 4096, biases, LayerNorm, learned positions, tied.
  // shape[1:] elements: embeddings, qkv and fc1 have h = 1024 columns, proj q/t = 1024, fc2
  // ffn/t = 4096, 1-D tensors 1; lcm = 4096. With d = 3 a bucket is a multiple of 3·4096.
  config::Setup s = Fsdp(testing::PaperGpt(), config::FsdpSharding::kOptim, 3);
  const std::vector<ParamTensor> params = StageParams(s, 0);
  std::map<std::string, std::int64_t> cols;
  for (const ParamTensor& pt : params) cols[pt.name] = pt.row_numel;
  CHECK(cols["layer0.attn.qkv.weight"] == 1024);
  CHECK(cols["layer0.attn.proj.weight"] == 1024);
  CHECK(cols["layer0.mlp.fc2.weight"] == 4096);
  CHECK(cols["layer0.ln1.weight"] == 1);
  std::int64_t numel = 0;
  for (const ParamTensor& pt : params) numel += pt.numel;

  std::vector<GradBuffer> bufs = LayoutGradBuffers(s, 0, params);
  REQUIRE(bufs.size() == 1);
  REQUIRE(bufs[0].buckets.size() == 1);  // no overlap_grad_reduce: one bucket
  CHECK(bufs[0].numel_padded % (3 * 4096) == 0);
  CHECK(bufs[0].numel_padded >= numel);
  CHECK(bufs[0].numel_padded - numel < 3 * 4096);
  std::int64_t prev_end = 0;
  for (const GradBuffer::Entry& e : bufs[0].entries) {  // no per-parameter 64-element padding
    CHECK(e.start == prev_end);
    prev_end = e.end;
  }
  // no_shard pads nothing.
  s = Fsdp(testing::PaperGpt(), config::FsdpSharding::kNoShard, 3);
  bufs = LayoutGradBuffers(s, 0, StageParams(s, 0));
  CHECK(bufs[0].numel_padded == numel);
}

TEST_CASE("Megatron-FSDP static bytes: 18, 6 + 12/d and 2 + 16/d per parameter", "[fsdp]") {
  using config::FsdpSharding;
  for (FsdpSharding sharding :
       {FsdpSharding::kNoShard, FsdpSharding::kOptim, FsdpSharding::kOptimGrads}) {
    const int d = 4;
    const config::Setup s = Fsdp(testing::PaperGpt(), sharding, d);
    const std::vector<ParamTensor> params = StageParams(s, 0);
    const std::vector<GradBuffer> bufs = LayoutGradBuffers(s, 0, params);
    const std::int64_t padded = bufs[0].numel_padded;  // P
    const bool sharded = sharding != FsdpSharding::kNoShard;
    const bool shard_grads = sharding == FsdpSharding::kOptimGrads;
    // Elements the optimizer owns: every parameter (no_shard) or rank 0's quarter of the bucket.
    std::int64_t owned = 0;
    if (sharded) {
      for (const ShardSlice& sl : ShardSlices(ComputeDims(s), params, bufs)) owned += sl.numel;
      CHECK(owned <= padded / d);
    } else {
      for (const ParamTensor& pt : params) owned += pt.numel;
    }
    const StaticSizes st = ComputeStaticSizes(s, 0);
    CHECK(st.parameter_bytes == 2 * padded);                              // bf16 weight buffer
    CHECK(st.gradient_bytes == 4 * (shard_grads ? padded / d : padded));  // fp32 grads
    CHECK(st.main_param_bytes == 4 * (sharded ? padded / d : padded));    // fp32 main weights
    CHECK(st.optimizer_state_bytes == 8 * owned);                         // Adam m, v

    // The Program: the three buffers at init, parameters moved into the weight buffer, no DDP
    // buffers and no per-parameter master copies; Adam state in iteration 1's step.
    const Program p = Build(s, 0);
    std::map<TensorId, Bytes> live;
    Bytes adam = 0;
    for (const Op& op : p.ops) {
      for (const TensorAlloc& a : op.allocs) {
        CHECK_FALSE(StartsWith(a.label, "ddp."));
        CHECK_FALSE(StartsWith(a.label, "main."));
        if (op.phase == Phase::kInit) live[a.id] = a.size_bytes;
        if (StartsWith(a.label, "optim.exp_avg")) adam += a.size_bytes;
      }
      for (TensorId f : op.frees) live.erase(f);
    }
    std::map<std::string, Bytes> at_init;
    for (const Op& op : p.ops) {
      if (op.phase != Phase::kInit) break;
      for (const TensorAlloc& a : op.allocs) {
        if (live.count(a.id) != 0) at_init[a.label] = a.size_bytes;
      }
    }
    CHECK(at_init["fsdp.chunk0.main_weight_buffer"] == st.main_param_bytes);
    CHECK(at_init["fsdp.chunk0.grad_buffer"] == st.gradient_bytes);
    if (sharded) {
      CHECK(at_init["fsdp.chunk0.weight_buffer"] == st.parameter_bytes);
      // Besides the three buffers only the optimizer's 4-byte scalar stays from init.
      CHECK(at_init.size() == 4);
    } else {
      // no_shard: no weight buffer; the parameters keep their own tensors (2 B each, unpadded).
      CHECK(at_init.count("fsdp.chunk0.weight_buffer") == 0);
      CHECK(at_init.size() == params.size() + 3);
      CHECK(padded == owned);
    }
    CHECK(adam == st.optimizer_state_bytes);
    // Buffer setup ends with gc.collect() and torch.cuda.empty_cache().
    bool emptied = false;
    for (const Op& op : p.ops) emptied |= op.phase == Phase::kInit && op.empty_cache;
    CHECK(emptied);
  }
}

// Op indices of allocations with `label`, and of the ops that free them.
struct Lifetimes {
  std::vector<int> alloc_op, free_op;
  std::vector<Bytes> size;
  std::vector<int> stream, micro_batch;
};
Lifetimes Find(const Program& p, const std::string& label) {
  Lifetimes out;
  std::map<TensorId, int> slot;
  for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) {
    const Op& op = p.ops[i];
    for (const TensorAlloc& a : op.allocs) {
      if (a.label != label) continue;
      slot[a.id] = static_cast<int>(out.alloc_op.size());
      out.alloc_op.push_back(i);
      out.free_op.push_back(-1);
      out.size.push_back(a.size_bytes);
      out.stream.push_back(op.stream);
      out.micro_batch.push_back(op.micro_batch);
    }
    for (TensorId f : op.frees) {
      if (auto it = slot.find(f); it != slot.end()) out.free_op[it->second] = i;
    }
  }
  return out;
}
int FirstOp(const Program& p, const std::string& name, int iteration, int micro_batch) {
  for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) {
    const Op& op = p.ops[i];
    if (op.name == name && op.iteration == iteration && op.micro_batch == micro_batch) return i;
  }
  return -1;
}

TEST_CASE(
    "Megatron-FSDP optim_grads: each backward fills a full-size bucket and reduce-scatters it",
    "[fsdp]") {
  // Paper GPT, d = 2, micro-batch 2, global batch 8: m = 8 / (2·2) = 2 micro-batches; one
  // bucket (no overlap_grad_reduce) of P elements, fp32 grads.
  config::Setup s = Fsdp(testing::PaperGpt(), config::FsdpSharding::kOptimGrads, 2);
  s.training.global_batch_size = 8;
  s.training.num_micro_batches = 2;
  s.training.train_iters = 2;
  const std::int64_t padded = LayoutGradBuffers(s, 0, StageParams(s, 0))[0].numel_padded;
  const Program p = Build(s, 0);
  const Lifetimes bucket = Find(p, "fsdp.grad_bucket0");
  const Lifetimes shard = Find(p, "fsdp.grad_shard0");
  // One per micro-batch backward: 2 iterations × 2 micro-batches.
  REQUIRE(bucket.alloc_op.size() == 4);
  REQUIRE(shard.alloc_op.size() == 4);
  for (size_t k = 0; k < 4; ++k) {
    const Op& made = p.ops[bucket.alloc_op[k]];
    CHECK(made.phase == Phase::kBackward);
    CHECK(bucket.size[k] == 4 * padded);
    CHECK(shard.size[k] == 4 * padded / 2);
    // The bucket exists before the first weight grad (the output layer's, whose weight is the
    // tied embedding in this one bucket) and is freed after its reduce-scatter, in the same
    // micro-batch's backward.
    const int out_bwd = FirstOp(p, "output_layer_bwd", made.iteration, made.micro_batch);
    REQUIRE(out_bwd >= 0);
    CHECK(bucket.alloc_op[k] < out_bwd);
    CHECK(shard.alloc_op[k] > out_bwd);
    CHECK(shard.free_op[k] == shard.alloc_op[k]);  // added into the grad shard at once
    CHECK(shard.stream[k] == kCommStream);
    // On the wrapper's group, Megatron's "dp_cp" (get_data_parallel_group(with_context_parallel)).
    CHECK(p.ops[shard.alloc_op[k]].collective_group == "dp_cp");
    CHECK(bucket.free_op[k] > shard.alloc_op[k]);
    CHECK(p.ops[bucket.free_op[k]].micro_batch == made.micro_batch);
  }
  // The grads are already reduced: no all-reduce after the last backward.
  for (const Op& op : p.ops) CHECK_FALSE(StartsWith(op.name, "fsdp.grad_all_reduce"));

  // With one data-parallel rank nothing is sharded: the buckets are views of the grad buffer
  // (`fetch_bucket`), so no temporaries.
  config::Setup one = Fsdp(testing::PaperGpt(), config::FsdpSharding::kOptimGrads, 1);
  one.training.train_iters = 1;
  CHECK(Find(Build(one, 0), "fsdp.grad_bucket0").alloc_op.empty());

  // optim keeps a full grad buffer and all-reduces it once per iteration instead.
  s.training.fsdp_sharding = config::FsdpSharding::kOptim;
  const Program q = Build(s, 0);
  CHECK(Find(q, "fsdp.grad_bucket0").alloc_op.empty());
  int all_reduces = 0;
  for (const Op& op : q.ops) all_reduces += op.name == "fsdp.grad_all_reduce" ? 1 : 0;
  CHECK(all_reduces == 2);  // one bucket, two iterations
}

TEST_CASE("Megatron-FSDP optim_grads: reduce-scattered buckets are held up to 1e9 elements",
          "[fsdp]") {
  // LLaMA-2-7B at TP1, d = 8, overlap_grad_reduce: buckets close at max(4e7, 1e6·8) = 4e7
  // elements, so the rank's 6.7e9 elements make well over 25 buckets, and the queue capacity is
  // max(1e9, largest bucket) = 1e9 elements (a bucket holds < 4e7 + the largest parameter,
  // fc1's 2·11008·4096 = 90,177,536, so < 1.31e8). Buckets are freed only once the queue exceeds
  // the capacity, checked before each new bucket joins, so the live temporaries pass 1e9
  // elements; they stay below 1e9 + one bucket (the queue) plus the buckets one layer is still
  // filling: a layer's 4h² + 3·h·ffn = 202,375,168 elements plus a partly filled bucket at each
  // end (2 × 1.31e8), 1.6e9 in all. All are freed when backward ends.
  config::Setup s = Fsdp(testing::Llama2_7b(), config::FsdpSharding::kOptimGrads, 8);
  s.training.overlap_grad_reduce = true;
  s.training.train_iters = 1;
  const Program p = Build(s, 0);
  std::map<TensorId, std::int64_t> live;
  std::int64_t elems = 0, max_elems = 0;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (!StartsWith(a.label, "fsdp.grad_bucket")) continue;
      live[a.id] = a.size_bytes / 4;
      elems += a.size_bytes / 4;
    }
    max_elems = std::max(max_elems, elems);
    for (TensorId f : op.frees) {
      if (auto it = live.find(f); it != live.end()) {
        elems -= it->second;
        live.erase(it);
      }
    }
  }
  CHECK(max_elems > 1'000'000'000);
  CHECK(max_elems < 1'600'000'000);
  CHECK(live.empty());
}

TEST_CASE("Megatron-FSDP configurations build well-formed Programs", "[fsdp]") {
  struct Row {
    const char* what;
    config::FsdpSharding sharding;
    int t, cp;
    bool sp, overlap, tied, te;
    config::Precision precision;
    config::RecomputeGranularity recompute;
  };
  using F = config::FsdpSharding;
  using P = config::Precision;
  using R = config::RecomputeGranularity;
  auto row = GENERATE(
      Row{"no_shard tp sp", F::kNoShard, 2, 1, true, false, true, true, P::kBf16, R::kNone},
      Row{"optim fp16 selective", F::kOptim, 1, 1, false, true, false, true, P::kFp16,
          R::kSelective},
      Row{"optim_grads tp sp overlap", F::kOptimGrads, 2, 1, true, true, true, true, P::kBf16,
          R::kNone},
      Row{"optim_grads local full recompute", F::kOptimGrads, 1, 1, false, false, false, false,
          P::kBf16, R::kFull},
      Row{"optim_grads cp2 fp16", F::kOptimGrads, 1, 2, false, true, true, true, P::kFp16,
          R::kSelective});
  INFO(row.what);
  config::Setup s = Fsdp(testing::PaperGpt(), row.sharding, 2);
  s.training.tensor_model_parallel_size = row.t;
  s.training.context_parallel_size = row.cp;
  s.training.sequence_parallel = row.sp;
  s.training.overlap_grad_reduce = row.overlap;
  s.model.tie_word_embeddings = row.tied;
  s.training.transformer_impl = row.te ? "transformer_engine" : "local";
  s.training.precision = row.precision;
  s.training.accumulate_allreduce_grads_in_fp32 = row.precision == P::kBf16;
  s.training.recompute_granularity = row.recompute;
  s.training.global_batch_size = 8;
  s.training.num_micro_batches = 2;
  const Program p = Build(s, 0);
  CHECK(p == Build(s, 0));  // deterministic
  // Unique ids; frees name live tensors; after the run only persistent state is left.
  std::map<TensorId, const TensorAlloc*> live;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) REQUIRE(live.emplace(a.id, &a).second);
    for (TensorId f : op.frees) REQUIRE(live.erase(f) == 1);
  }
  const StaticSizes st = ComputeStaticSizes(s, 0);
  Bytes grads = 0;
  for (const auto& [id, a] : live) {
    INFO("left alive: " << a->label);
    CHECK_FALSE(StartsWith(a->label, "fsdp.grad_bucket"));
    CHECK_FALSE(StartsWith(a->label, "fsdp.grad_shard"));
    if (a->category == Category::kGradients) grads += a->size_bytes;
  }
  // Only the persistent grad buffer (or shard), and with 16-bit grads the step's fp32 copies,
  // which live until the next zero_grad (docs/training-memory.md, 'What the optimizer step
  // allocates', item 2).
  CHECK(grads == st.gradient_bytes + st.main_grad_copy_bytes);
}

}  // namespace
}  // namespace memsim::workload
