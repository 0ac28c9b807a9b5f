// DeepSpeed ZeRO-3 under the Trainer (deepspeed_zero3.cc): the device bytes of a small Llama at
// DP 4, each derived below from DeepSpeed v0.16.9's stage3.py, partition_parameters.py and
// partitioned_param_coordinator.py.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "config/load.h"
#include "workload/deepspeed_test_setup.h"
#include "engine/stages.h"
#include "workload/build.h"

// A namespace of its own: the unity build puts other workload tests' helpers beside these.
namespace memsim::workload::zero3_test {
namespace {

config::Setup Zero3Setup(const std::string& name, const std::string& zero) {
  return testing::SmallLlamaUnderDeepSpeed("memsim_zero3_test", name, zero);
}

// Sizes of the tensors labelled exactly `label`, in program order; `iteration` -1: all.
std::vector<Bytes> Allocs(const Program& p, const std::string& label, int iteration = -1) {
  std::vector<Bytes> out;
  for (const Op& op : p.ops) {
    if (iteration >= 0 && op.iteration != iteration) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label == label) out.push_back(a.size_bytes);
    }
  }
  return out;
}

// The bytes of gathered parameters ("zero3.param.*") alive at the start of each op (its
// allocations made, its frees not yet) that `pick` selects, in program order.
template <typename Pick>
std::vector<Bytes> GatheredAt(const Program& p, Pick pick) {
  std::map<TensorId, Bytes> live;
  Bytes sum = 0;
  std::vector<Bytes> out;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.rfind("zero3.param.", 0) != 0) continue;
      live[a.id] = a.size_bytes;
      sum += a.size_bytes;
    }
    if (pick(op)) out.push_back(sum);
    for (TensorId id : op.frees) {
      const auto it = live.find(id);
      if (it == live.end()) continue;
      sum -= it->second;
      live.erase(it);
    }
  }
  return out;
}

// Parameters in construction order: embed_tokens 256·64 = 16384; per layer input_layernorm 64,
// q/k/v/o_proj 64·64 = 4096 each, gate/up/down_proj 64·128 = 8192 each,
// post_attention_layernorm 64 (41088); norm 64; lm_head 16384. Total 115008. At DP 4 every
// partition is numel / 4 (each numel a multiple of 4): 28752 elements, one optimizer param group
// and so one sub-group (28752 < sub_group_size 1e9).
constexpr std::int64_t kNumel = 115008;
constexpr std::int64_t kPartition = kNumel / 4;
constexpr std::int64_t kNorms = 5;  // 2 per layer and the final norm, 64 elements each
// No prefetch, nothing kept for reuse, the norms persistent (64 <= 64), a 10000-element bucket.
const char* const kPlain =
    "{\"stage\": 3, \"reduce_bucket_size\": 10000, \"stage3_prefetch_bucket_size\": 0, "
    "\"stage3_param_persistence_threshold\": 64, \"stage3_max_reuse_distance\": 0}";

TEST_CASE("ZeRO-3 at DP 4: partitions from construction, fp32 partition, gradient partitions, "
          "ipg bucket, Adam state",
          "[workload][zero][zero3]") {
  const config::Setup setup = Zero3Setup("z3", kPlain);
  const Program p = Build(setup, 0);
  // zero.Init: each parameter whole for a moment, then only its partition: embed_tokens
  // 2·16384 B whole, 2·4096 B kept.
  CHECK(Allocs(p, "embedding.word_embeddings.weight.whole") == std::vector<Bytes>{2 * 16384});
  CHECK(Allocs(p, "embedding.word_embeddings.weight") == std::vector<Bytes>{2 * 4096});
  // defragment: the trainable partitions into one flat 16-bit buffer.
  CHECK(Allocs(p, "zero3.lp_param_buffer") == std::vector<Bytes>{2 * kPartition});
  // _create_fp32_partitions: .clone() (16-bit, transient) then .float().
  CHECK(Allocs(p, "zero3.partition_clone") == std::vector<Bytes>{2 * kPartition});
  CHECK(Allocs(p, "zero3.fp32_partitioned_groups_flat") == std::vector<Bytes>{4 * kPartition});
  // initialize_optimizer_states: zeros of the largest sub-group in fp32, then dropped.
  CHECK(Allocs(p, "zero3.optimizer_states_gradient_buffer") == std::vector<Bytes>{4 * kPartition});
  // _setup_for_real_optimizer: the ipg bucket (10000 bf16) and grad_partitions_flat_buffer.
  CHECK(Allocs(p, "zero3.ipg_bucket_flat_buffer") == std::vector<Bytes>{2 * 10000});
  CHECK(Allocs(p, "zero3.grad_partitions_flat_buffer") == std::vector<Bytes>{2 * kPartition});
  // Adam's exp_avg and exp_avg_sq over the fp32 partition in the first step only; the step's
  // fp32 gradient of the sub-group, from its bf16 flat copy.
  CHECK(Allocs(p, "optim.exp_avg.embedding.word_embeddings.weight", 1) ==
        std::vector<Bytes>{4 * kPartition});
  CHECK(Allocs(p, "optim.exp_avg.embedding.word_embeddings.weight", 2).empty());
  CHECK(Allocs(p, "zero3.flat_grad_partition", 1) == std::vector<Bytes>{2 * kPartition});
  CHECK(Allocs(p, "zero3.fp32_grad_partition", 1) == std::vector<Bytes>{4 * kPartition});
  // After a step: the partitions (2·28752) and the five persistent norms whole (2·64 each);
  // the fp32 partition; Adam's 8 B an element; grad partitions plus the bucket.
  const StaticSizes s = ComputeStaticSizes(setup, 0);
  CHECK(s.parameter_bytes == 2 * kPartition + kNorms * 2 * 64);
  CHECK(s.main_param_bytes == 4 * kPartition);
  CHECK(s.optimizer_state_bytes == 8 * kPartition);
  CHECK(s.gradient_bytes == 2 * kPartition + 2 * 10000);
  // The whole run simulates (every tensor freed was allocated before).
  const engine::RunResult run = engine::RunAllStages(setup, {});
  REQUIRE(run.stages.size() == 1);
}

TEST_CASE("ZeRO-3 gathers each module around its forward and backward, the first micro-batch "
          "records the trace and releases everything",
          "[workload][zero][zero3]") {
  const Program p = Build(Zero3Setup("z3g", kPlain), 0);
  // One parameter a module: all_gather_coalesced's single-parameter buffer, ceil(n/4)·4 = n.
  // q_proj: gathered for the forward and the backward of both micro-batches.
  CHECK(Allocs(p, "zero3.param.layer0.self_attn.q_proj.weight", 1) ==
        std::vector<Bytes>(4, 2 * 4096));
  // embed_tokens: micro-batch 0's forward; its backward (never released: the embedding's
  // post-backward hook does not run); micro-batch 1's forward finds it gathered and releases it
  // after; its backward gathers it again, kept until the step's _partition_all_parameters.
  CHECK(Allocs(p, "zero3.param.embedding.word_embeddings.weight", 1) ==
        std::vector<Bytes>(3, 2 * 16384));
  // A persistent norm: released after each module while the trace is recorded (micro-batch 0:
  // forward and backward), then gathered in micro-batch 1's forward and kept; released at the
  // step and gathered again by _post_step. Iteration 2 only that last gather.
  CHECK(Allocs(p, "zero3.param.layer0.input_layernorm.weight", 1) ==
        std::vector<Bytes>(4, 2 * 64));
  CHECK(Allocs(p, "zero3.param.layer0.input_layernorm.weight", 2) ==
        std::vector<Bytes>{2 * 64});
  CHECK(Allocs(p, "zero3.allgather_flat").empty());  // no prefetch: no coalesced gather
  // Alive at the end of layer 1's forward in micro-batch 1 (trace complete): its 8 non-norm
  // weights, 4·4096 + 3·8192 = 40960 elements, and the four layer norms gathered so far
  // (persistent): 2·40960 + 4·128 = 82432 B; after the release only the norms, 512 B. In its
  // backward the final norm is gathered too: 81920 + 5·128 = 82560 B.
  const auto release_of = [](Phase phase, int layer) {
    return [=](const Op& op) {
      return op.iteration == 1 && op.micro_batch == 1 && op.phase == phase &&
             op.layer == layer && op.name == "zero3.release";
    };
  };
  CHECK(GatheredAt(p, release_of(Phase::kForward, 1)) == std::vector<Bytes>{82432});
  CHECK(GatheredAt(p, release_of(Phase::kBackward, 1)) == std::vector<Bytes>{82560});
}

TEST_CASE("ZeRO-3 with the default reuse distance keeps a small model gathered from its forward "
          "to its backward",
          "[workload][zero][zero3]") {
  // stage3_max_reuse_distance 1e9 > the whole trace's 2·115008 elements: a released module's
  // parameters always reappear within the distance, so with the trace complete nothing is
  // released in the forward, and each module after its last backward. At the end of the forward
  // every parameter is gathered whole: 2·115008 B.
  const Program p = Build(
      Zero3Setup("z3r", "{\"stage\": 3, \"stage3_prefetch_bucket_size\": 0, "
                        "\"stage3_param_persistence_threshold\": 64}"),
      0);
  const std::vector<Bytes> it2 = GatheredAt(p, [](const Op& op) { return op.iteration == 2; });
  CHECK(*std::max_element(it2.begin(), it2.end()) == 2 * kNumel);
  // At the step's release: embed_tokens (its backward kept it) and the persistent norms,
  // 2·16384 + 5·128 = 33408 B.
  CHECK(GatheredAt(p, [](const Op& op) {
          return op.iteration == 2 && op.phase == Phase::kOptimizerStep &&
                 op.name == "zero3.release";
        }) == std::vector<Bytes>{33408});
}

TEST_CASE("ZeRO-3 prefetch: coalesced flat buffers of the next parameters of the trace",
          "[workload][zero][zero3]") {
  const Program p = Build(
      Zero3Setup("z3p", "{\"stage\": 3, \"reduce_bucket_size\": 10000, "
                        "\"stage3_prefetch_bucket_size\": 8192, "
                        "\"stage3_param_persistence_threshold\": 64, "
                        "\"stage3_max_reuse_distance\": 0}"),
      0);
  // Micro-batch 1, trace complete (module order: embed, per layer input_layernorm, q, k, v, o,
  // gate, up, down, post_attention_layernorm, ...). Each fetch pops queue entries until 8192
  // elements are to be prefetched (the last one may pass it); parameters already gathered are
  // skipped. After embed (gathered already): input_layernorm 64 + q 4096 + k 4096 = 8256 (one
  // flat buffer, 2·8256 B). After input_layernorm: v + o = 8192. After q, k, v: gate, up, down
  // one each (8192 alone: one-parameter buffers, not flat). After o: layer 0's
  // post_attention_layernorm 64, layer 1's input_layernorm 64, q, k: 8320. After gate: layer
  // 1's v + o = 8192.
  std::vector<Bytes> flats;
  for (const Op& op : p.ops) {
    if (op.iteration != 1 || op.micro_batch != 1 || op.phase != Phase::kForward) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label == "zero3.allgather_flat") flats.push_back(a.size_bytes);
    }
  }
  REQUIRE(flats.size() >= 4);
  CHECK(std::vector<Bytes>(flats.begin(), flats.begin() + 4) ==
        std::vector<Bytes>{2 * 8256, 2 * 8192, 2 * 8320, 2 * 8192});
  // Prefetched parameters get their own tensor when the first of their handle is waited for.
  CHECK(Allocs(p, "zero3.param.layer0.mlp.gate_proj.weight", 1).size() == 4);
}

TEST_CASE("ZeRO-3 with offload_optimizer and offload_param cpu: partitions, fp32 state and "
          "gradient partitions on the host",
          "[workload][zero][zero3]") {
  const config::Setup setup = Zero3Setup(
      "z3o", "{\"stage\": 3, \"reduce_bucket_size\": 10000, \"stage3_prefetch_bucket_size\": 0, "
             "\"stage3_param_persistence_threshold\": 64, \"stage3_max_reuse_distance\": 0, "
             "\"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": "
             "\"cpu\", \"pin_memory\": true}}");
  const Program p = Build(setup, 0);
  // offload_param: a non-persistent partition is made on the host (nothing kept on the device);
  // a persistent one stays on the device (Init._partition_param: ds_persist -> local_device).
  CHECK(Allocs(p, "embedding.word_embeddings.weight").empty());
  CHECK(Allocs(p, "layer0.input_layernorm.weight") == std::vector<Bytes>{2 * 16});
  CHECK(Allocs(p, "zero3.lp_param_buffer").empty());
  CHECK(Allocs(p, "zero3.fp32_partitioned_groups_flat").empty());
  CHECK(Allocs(p, "zero3.grad_partitions_flat_buffer").empty());
  CHECK(Allocs(p, "optim.exp_avg.embedding.word_embeddings.weight").empty());
  // Each gather first copies the host partition to the device: q_proj's 1024 elements.
  CHECK(Allocs(p, "zero3.partition_to_device", 1).size() >= 4);
  // The device keeps the five persistent partitions (2·16 B each), the norms whole once
  // gathered (2·64 B each) and the ipg bucket.
  const StaticSizes s = ComputeStaticSizes(setup, 0);
  CHECK(s.parameter_bytes == kNorms * (2 * 16 + 2 * 64));
  CHECK(s.gradient_bytes == 2 * 10000);
  CHECK(s.main_param_bytes == 0);
  CHECK(s.optimizer_state_bytes == 0);
  // Host: the 16-bit partitions of the other parameters, page-locked (offload_param
  // pin_memory): 28752 − 5·16 = 28672 elements, 2 B each; pageable (offload_optimizer
  // pin_memory false): the fp32 partition 4·28752, its fp32 gradient buffer 4·28752,
  // grad_partitions_flat_buffer 2·28752 and Adam's two moments 8·28752.
  CHECK(s.host_pinned_bytes == 2 * (kPartition - kNorms * 16));
  CHECK(s.host_pageable_bytes == (4 + 4 + 2 + 8) * kPartition);
}

}  // namespace
}  // namespace memsim::workload::zero3_test
