// Kernels (kernels.h): the workspaces, buffers and gradient hand-overs the modules share, run
// on the module harness's emitter and recording wrapper.
#include "workload/kernels.h"

#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::kernels_test {

using testing::ModuleHarness;
using testing::SeenTensors;

TEST_CASE(
    "the first GEMM on each thread makes its cuBLAS workspace once, Transformer Engine keeps "
    "one module-level workspace",
    "[workload][kernels]") {
  // PyTorch CublasHandlePool.cpp getChosenWorkspaceSize: ":4096:2:16:8" = 2·4 MiB + 8·16 KiB,
  // ":4096:8" = 8·4 MiB on sm >= 90; TE get_cublas_workspace_size_bytes: 4 MiB, 32 MiB on
  // sm >= 90. The device name decides sm >= 90 (model.cc, an estimate).
  const auto [device, cublas, te] = GENERATE(table<std::string, Bytes, Bytes>({
      {"nvidia-a100-80g", 2 * 4 * kMiB + 8 * 16 * kKiB, 4 * kMiB},
      {"nvidia-h100-80g", 8 * 4 * kMiB, 32 * kMiB},
  }));
  config::Setup s = testing::TinyLlama();
  s.device.name = device;
  s.device.peak_flops_bf16 = 312e12;  // below the 400 TFLOP/s bar: the name alone decides
  ModuleHarness h(s);
  h.Run(Phase::kForward, [](ModuleContext& ctx) {
    ctx.em.Begin("gemms");
    ctx.k.GemmWorkspace(/*torch_gemm=*/true);
    ctx.k.GemmWorkspace(true);
    ctx.k.GemmWorkspace(false);
    ctx.k.GemmWorkspace(false);
  });
  // The autograd engine's device thread has its own cuBLAS handle, hence its own workspace.
  h.Run(Phase::kBackward, [](ModuleContext& ctx) {
    ctx.em.Begin("gemms_bwd");
    ctx.k.GemmWorkspace(true);
    ctx.k.GemmWorkspace(true);
  });
  CHECK(h.Alive() == SeenTensors{{"workspace.cublas", cublas},
                                 {"workspace.te_cublas", te},
                                 {"workspace.cublas_autograd", cublas}});
}

TEST_CASE(
    "Megatron's global memory buffer is replaced only by a larger request, the old one "
    "freed after the new exists",
    "[workload][kernels]") {
  ModuleHarness h(testing::TinyLlama());
  h.Run(Phase::kForward, [](ModuleContext& ctx) {
    ctx.em.Begin("a");
    ctx.k.MpuBuffer(1000);
    ctx.em.Begin("b");
    ctx.k.MpuBuffer(500);  // fits: reused
    ctx.em.Begin("c");
    ctx.k.MpuBuffer(3000);
  });
  CHECK(h.Allocated(Phase::kForward) ==
        SeenTensors{{"workspace.mpu", 1000}, {"workspace.mpu", 3000}});
  CHECK(h.Alive() == SeenTensors{{"workspace.mpu", 3000}});
  // Op "c" allocates the new buffer at its start and frees the old one at its end.
  const Op& c = h.ops().back();
  CHECK(c.name == "c");
  CHECK(c.frees.size() == 1);
}

TEST_CASE(
    "a row-parallel output under sequence parallelism is reduce-scattered from the full "
    "[s, b, h] into a 1/t shard",
    "[workload][kernels]") {
  config::Setup s = testing::TinyLlama();
  s.training.tensor_model_parallel_size = 2;
  s.training.sequence_parallel = true;
  ModuleHarness h(s);
  TensorId out = 0;
  h.Run(Phase::kForward, [&](ModuleContext& ctx) {
    ctx.em.Begin("proj");
    out = ctx.k.RowParallelOutput(4096, "proj_out");
  });
  CHECK(h.Allocated(Phase::kForward) == SeenTensors{{"proj_out_full", 4096}, {"proj_out", 2048}});
  CHECK(h.Alive() == SeenTensors{{"proj_out", 2048}});
  CHECK(h.ops().back().collective_group == "tp");
  CHECK(out != 0);
}

TEST_CASE(
    "with wgrad fusion a TE layer hands autograd one cached dummy per weight shape, which "
    "the wrapper never sees",
    "[workload][kernels]") {
  ModuleHarness h(testing::TinyLlama());
  h.Run(Phase::kBackward, [](ModuleContext& ctx) {
    ctx.em.Begin("wgrads");
    ctx.k.WeightGradToAutograd(64, 32, /*te_layer=*/true, "w1.wgrad", "w1");
    ctx.k.WeightGradToAutograd(64, 32, true, "w2.wgrad", "w2");
    ctx.k.WeightGradToAutograd(32, 64, true, "w3.wgrad", "w3");
  });
  // get_dummy_wgrad keys its cache by shape: [64, 32] once, [32, 64] once, 2·64·32 bytes each.
  CHECK(h.Alive(Category::kWorkspace) == SeenTensors{{"te.dummy_wgrad[64x32]", 2 * 64 * 32},
                                                     {"te.dummy_wgrad[32x64]", 2 * 64 * 32}});
  CHECK(h.wrapper().grads().empty());
}

TEST_CASE("a parameter with two grad producers gets their sum once both arrived",
          "[workload][kernels]") {
  config::Setup s = testing::TinyLlama();
  s.training.gradient_accumulation_fusion = false;
  ModuleHarness h(s);
  h.Run(Phase::kBackward, [](ModuleContext& ctx) {
    ctx.k.ShareGradAccumulator("tied");
    ctx.em.Begin("output_layer_bwd");
    ctx.k.WeightGradToAutograd(256, 64, true, "output.wgrad", "tied");
    ctx.em.Begin("embedding_bwd");
    ctx.k.SmallWeightGrad(256 * 64, "embedding.grad", "tied");
    ctx.k.AccumulateSharedGrads("accumulate");
  });
  // AccumulateGrad runs once, when both grads are in its InputBuffer: the second is added in
  // place into the first, and the wrapper gets one [256, 64] bf16 grad (2·256·64 bytes).
  CHECK(h.wrapper().grads() == SeenTensors{{"tied", 2 * 256 * 64}});
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::kernels_test
