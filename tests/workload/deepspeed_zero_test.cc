// DeepSpeed ZeRO-1 / ZeRO-2 under the Trainer (deepspeed_zero.cc): the partition layout of
// DeepSpeedZeroOptimizer.__init__ (deepspeed/runtime/zero/stage_1_and_2.py v0.16.9) and the
// device bytes of a small Llama at DP 4, each derived below from that code.
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "config/load.h"
#include "workload/deepspeed_test_setup.h"
#include "engine/stages.h"
#include "report/run_report.h"
#include "workload/build.h"
#include "workload/deepspeed_zero.h"

namespace memsim::workload {
namespace {

TEST_CASE("ZeRO layout: padding to 2·dp, equal partitions, parameters overlapping each",
          "[workload][zero]") {
  // numel 10, 7, 5 (and a frozen one, not in the optimizer's group): 22 elements; alignment
  // nccl_start_alignment_factor 2 × dp 4 = 8, so the flat buffer is 24 (2 of padding at the
  // end), partitions of 6: [0,6) [6,12) [12,18) [18,24); parameters at [0,10) [10,17) [17,22).
  std::vector<ParamTensor> params(4);
  params[0].numel = 10;
  params[1].numel = 7;
  params[2].numel = 99;
  params[2].frozen = true;
  params[3].numel = 5;
  const std::vector<int> group = {0, 1, 2, 3};
  const ZeroGroupLayout r0 = LayoutZeroGroup(params, group, 4, 0);
  CHECK(r0.params == std::vector<int>{0, 1, 3});
  CHECK(r0.numel == 22);
  CHECK(r0.padded == 24);
  CHECK(r0.partition == 6);
  // get_partition_info: rank 0 holds only the first parameter (starting inside [0,6)).
  CHECK(r0.in_partition == std::vector<bool>{true, false, false});
  CHECK(r0.grads_in_partition == 10);
  // Rank 1 [6,12): the first parameter runs into it (first_offset 6), the second starts in it.
  const ZeroGroupLayout r1 = LayoutZeroGroup(params, group, 4, 1);
  CHECK(r1.in_partition == std::vector<bool>{true, true, false});
  CHECK(r1.grads_in_partition == 17);
  // Rank 2 [12,18): the second runs into it, the third starts at 17.
  CHECK(LayoutZeroGroup(params, group, 4, 2).grads_in_partition == 12);
  // Rank 3 [18,24): the third runs into it; the padding 22..24 is its.
  CHECK(LayoutZeroGroup(params, group, 4, 3).grads_in_partition == 5);
  // dp 1: alignment 2, 22 is a multiple; one partition of everything.
  const ZeroGroupLayout one = LayoutZeroGroup(params, group, 1, 0);
  CHECK(one.padded == 22);
  CHECK(one.grads_in_partition == 22);
}

config::Setup ZeroSetup(const std::string& name, const std::string& zero) {
  return testing::SmallLlamaUnderDeepSpeed("memsim_zero_test", name, zero);
}

// Sizes of the tensors whose label contains `label`, in program order; `iteration` -1: all.
std::vector<Bytes> ZeroAllocs(const Program& p, const std::string& label, int iteration = -1) {
  std::vector<Bytes> out;
  for (const Op& op : p.ops) {
    if (iteration >= 0 && op.iteration != iteration) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.find(label) != std::string::npos) out.push_back(a.size_bytes);
    }
  }
  return out;
}

// Parameters in construction order (Transformers' Llama): embed_tokens 256·64 = 16384; per layer
// input_layernorm 64, q/k/v/o_proj 64·64 = 4096 each, gate/up/down_proj 64·128 = 8192 each,
// post_attention_layernorm 64 (41088); norm 64; lm_head 16384. Total 115008, a multiple of
// 2·4 = 8: no padding, partitions of 28752. Rank 0's [0, 28752) holds embed_tokens [0, 16384),
// layer 0's input_layernorm, q, k, v up to 28736 and o_proj, which starts at 28736 < 28752:
// grads_in_partition = 16384 + 64 + 4·4096 = 32832 elements.
constexpr std::int64_t kNumel = 115008;
constexpr std::int64_t kPartition = kNumel / 4;
constexpr std::int64_t kGradsInPartition = 16384 + 64 + 4 * 4096;

TEST_CASE("ZeRO-2 at DP 4: flat bf16 buffer, fp32 partition, buckets, partition gradients, "
          "lazy Adam state",
          "[workload][zero]") {
  const Program p = Build(
      ZeroSetup("z2", "{\"stage\": 2, \"reduce_bucket_size\": 1000, \"overlap_comm\": true}"), 0);
  // __init__: the flat 16-bit group (2 bytes an element); the fp32 partition, made from a bf16
  // clone of the partition (.clone().float()); initialize_optimizer_states' zeros .grad.
  CHECK(ZeroAllocs(p, "zero.bit16_groups_flat") == std::vector<Bytes>{2 * kNumel});
  CHECK(ZeroAllocs(p, "zero.partition_clone") == std::vector<Bytes>{2 * kPartition});
  CHECK(ZeroAllocs(p, "zero.single_partition_of_fp32_groups") == std::vector<Bytes>{4 * kPartition});
  // backward_prologue, every micro-batch: two ipg buffers (overlap_comm) of 1000 bf16 elements.
  CHECK(ZeroAllocs(p, "zero.ipg_buffer", 1) == std::vector<Bytes>(4, 2000));
  // Stage 2 reduces in every micro-batch: grads_in_partition made in each (2 per step).
  CHECK(ZeroAllocs(p, "zero.grads_in_partition", 1) ==
        std::vector<Bytes>(2, 2 * kGradsInPartition));
  // step: the partition's gradients flattened (bf16) and cast to fp32; Adam's exp_avg and
  // exp_avg_sq over the fp32 partition in the first step only (torch.optim's lazy state).
  CHECK(ZeroAllocs(p, "zero.flat_grad_partition", 1) == std::vector<Bytes>{2 * kPartition});
  CHECK(ZeroAllocs(p, "zero.single_grad_partition", 1) == std::vector<Bytes>{4 * kPartition});
  CHECK(ZeroAllocs(p, "optim.exp_avg.", 1) == std::vector<Bytes>{4 * kPartition});
  CHECK(ZeroAllocs(p, "optim.exp_avg_sq.", 1) == std::vector<Bytes>{4 * kPartition});
  CHECK(ZeroAllocs(p, "optim.exp_avg.", 2).empty());
  // get_grad_norm_direct: a float64 copy of each slice in the partition: embed_tokens,
  // input_layernorm, q, k, v, and o_proj's first 28752 − 28736 = 16 elements.
  CHECK(ZeroAllocs(p, "zero.grad_norm_fp64", 1) ==
        std::vector<Bytes>{8 * 16384, 8 * 64, 8 * 4096, 8 * 4096, 8 * 4096, 8 * 16});
  const StaticSizes s = ComputeStaticSizes(ZeroSetup("z2s", "{\"stage\": 2}"), 0);
  CHECK(s.parameter_bytes == 2 * kNumel);
  CHECK(s.main_param_bytes == 4 * kPartition);
  CHECK(s.optimizer_state_bytes == 8 * kPartition);
  CHECK(s.gradient_bytes == 2 * kGradsInPartition);
}

TEST_CASE("ZeRO-2 with reduce_bucket_size 0: no ipg buffer, each gradient reduced on its own",
          "[workload][zero]") {
  // zero/config.py accepts reduce_bucket_size >= 0. backward_prologue's torch.empty(0) holds no
  // device memory; every parameter is larger than the bucket (extra_large_param_to_reduce), so
  // its gradient stays its own tensor until its one-parameter bucket is reduced; the partition's
  // gradients still go to grads_in_partition, once a micro-batch as with any bucket size.
  const config::Setup setup = ZeroSetup("z2b0", "{\"stage\": 2, \"reduce_bucket_size\": 0}");
  const Program p = Build(setup, 0);
  CHECK(ZeroAllocs(p, "zero.ipg_buffer").empty());
  CHECK(ZeroAllocs(p, "zero.grads_in_partition", 1) ==
        std::vector<Bytes>(2, 2 * kGradsInPartition));
  // The whole run simulates (every tensor freed was allocated before).
  const engine::RunResult run = engine::RunAllStages(setup, {});
  REQUIRE(run.stages.size() == 1);
  // At least the flat bf16 weights and the fp32 partition stay allocated.
  CHECK(run.stages[0].peak_allocated_bytes >= 2 * kNumel + 4 * kPartition);
}

TEST_CASE("ZeRO-1 keeps full gradients until the accumulation boundary", "[workload][zero]") {
  const Program p = Build(ZeroSetup("z1", "{\"stage\": 1, \"reduce_bucket_size\": 1000}"), 0);
  // One ipg buffer (no overlap_comm), made in the first micro-batch's backward_prologue and
  // kept until the boundary's epilogue; grads_in_partition once per step, at the boundary.
  CHECK(ZeroAllocs(p, "zero.ipg_buffer", 1) == std::vector<Bytes>{2000});
  CHECK(ZeroAllocs(p, "zero.grads_in_partition", 1) == std::vector<Bytes>{2 * kGradsInPartition});
  // The fp32 partition and Adam state as at stage 2.
  CHECK(ZeroAllocs(p, "optim.exp_avg.", 1) == std::vector<Bytes>{4 * kPartition});
  CHECK(ZeroAllocs(p, "optim.exp_avg_sq.", 1) == std::vector<Bytes>{4 * kPartition});
}

TEST_CASE("ZeRO-2 with offload_optimizer cpu: no fp32 partition or state on the device",
          "[workload][zero]") {
  const Program p = Build(
      ZeroSetup("z2o", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}"), 0);
  CHECK(ZeroAllocs(p, "zero.single_partition_of_fp32_groups").empty());
  CHECK(ZeroAllocs(p, "optim.exp_avg.").empty());
  CHECK(ZeroAllocs(p, "zero.grads_in_partition").empty());
  // temp_grad_buffer_for_gpu_offload: the largest parameter (embed_tokens or lm_head, 16384) in
  // bf16; each step's fp32_partition.to(device) before the copy into the bf16 partition.
  CHECK(ZeroAllocs(p, "zero.temp_grad_buffer_for_gpu_offload") == std::vector<Bytes>{2 * 16384});
  CHECK(ZeroAllocs(p, "zero.fp32_partition_on_device", 1) == std::vector<Bytes>{4 * kPartition});
}

TEST_CASE("ZeRO-2 offload: host memory by kind, pinned or pageable as pin_memory says",
          "[workload][zero]") {
  // Host bytes of rank 0 (stage_1_and_2.py v0.16.9 with cpu_offload), the small Llama above:
  // the fp32 partition, always pinned (__init__: pin_memory(weights_partition)): 4 · 28752;
  // its fp32 .grad (initialize_optimizer_states, kept with offload): 4 · 28752;
  // temp_grad_buffer_for_cpu_offload, the largest parameter in bf16: 2 · 16384;
  // accumulated_grads_in_cpu (gradient accumulation 2 > 1), each parameter of the partition
  // whole in bf16: 2 · 32832; Adam's exp_avg and exp_avg_sq over the host partition, pageable
  // (torch.optim / DeepSpeedCPUAdam zeros_like of a host tensor): 8 · 28752.
  constexpr Bytes kFp32 = 4 * kPartition;                          // 115008
  constexpr Bytes kBuffers = kFp32 + 2 * 16384 + 2 * kGradsInPartition;  // 213440
  constexpr Bytes kAdam = 8 * kPartition;                          // 230016
  const StaticSizes unpinned = ComputeStaticSizes(
      ZeroSetup("z2h", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}"), 0);
  CHECK(unpinned.host == HostMemory::kZeroOffload);
  CHECK(unpinned.host_pinned_bytes == kFp32);
  CHECK(unpinned.host_pageable_bytes == kBuffers + kAdam);
  CHECK(unpinned.host_optimizer_count == kPartition);
  // None of it on the device: no fp32 partition, no state, no gradients after the step.
  CHECK(unpinned.main_param_bytes == 0);
  CHECK(unpinned.optimizer_state_bytes == 0);
  CHECK(unpinned.gradient_bytes == 0);
  CHECK(unpinned.parameter_bytes == 2 * kNumel);
  const StaticSizes pinned = ComputeStaticSizes(
      ZeroSetup("z2hp", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", "
                        "\"pin_memory\": true}}"),
      0);
  CHECK(pinned.host_pinned_bytes == kFp32 + kBuffers);
  CHECK(pinned.host_pageable_bytes == kAdam);
  // Without offload nothing is on the host.
  const StaticSizes none = ComputeStaticSizes(ZeroSetup("z2n", "{\"stage\": 2}"), 0);
  CHECK(none.host == HostMemory::kNone);
  CHECK(none.host_pinned_bytes + none.host_pageable_bytes == 0);
}

TEST_CASE("ZeRO-2 offload: the host memory lines of run and its JSON", "[workload][zero]") {
  const config::Setup s =
      ZeroSetup("z2r", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}");
  engine::RunOptions options;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(s, options);
  // The byte counts of the test above: 115008 pinned, 443456 pageable.
  const std::string header = report::FormatRunHeader(run, s);
  CHECK(header.find("\n  host memory (pinned, per rank): 0.00 GiB: DeepSpeed offload_optimizer "
                    "cpu: the fp32 partition of 28752") != std::string::npos);
  CHECK(header.find("\n  host memory (pageable, per rank): 0.00 GiB: the optimizer's state over "
                    "the partition, its fp32 gradient and the host gradient buffers\n") !=
        std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(report::RunReportJson(run, s));
  CHECK(j["host"]["pinned_bytes"] == 115008);
  CHECK(j["host"]["pageable_bytes"] == 443456);
}

TEST_CASE("ZeRO-2 offload: each partition gradient's device transients at the boundary",
          "[workload][zero]") {
  const Program p = Build(
      ZeroSetup("z2t", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}"), 0);
  // copy_grads_in_partition at the boundary micro-batch only (the second of two), per
  // parameter of the partition: embed_tokens 16384, input_layernorm 64, q, k, v 4096 and
  // o_proj 4096 of which 16 in the partition (slices as the norm test above).
  const auto sorted = [](std::vector<Bytes> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  // set_norm_for_param_grad_in_gpu: `.double()` of the slice.
  CHECK(sorted(ZeroAllocs(p, "zero.offload.grad_norm_fp64", 1)) ==
        std::vector<Bytes>{8 * 16, 8 * 64, 8 * 4096, 8 * 4096, 8 * 4096, 8 * 16384});
  // _has_inf_or_nan over the whole gradient: x.float() (4 B), isnan, isinf, logical_or (1 B
  // each), .float() (4 B), alive together.
  CHECK(sorted(ZeroAllocs(p, "zero.offload.inf_nan_float", 1)) ==
        std::vector<Bytes>{4 * 64, 4 * 4096, 4 * 4096, 4 * 4096, 4 * 4096, 4 * 16384});
  CHECK(ZeroAllocs(p, "zero.offload.isnan", 1).size() == 6);
  // async_inplace_copy_grad_to_fp32_buffer_from_gpu: `.float()` of the slice.
  CHECK(sorted(ZeroAllocs(p, "zero.offload.grad_fp32_slice", 1)) ==
        std::vector<Bytes>{4 * 16, 4 * 64, 4 * 4096, 4 * 4096, 4 * 4096, 4 * 16384});
}

}  // namespace
}  // namespace memsim::workload
