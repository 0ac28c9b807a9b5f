// Megatron-core's self-attention module (modules/attention.h) run alone on the module harness:
// what its forward saves for backward and what its backward frees and hands to autograd, counted
// by hand from the framework's code.
//
// Shape (testing::TinyLlama, an H100, Megatron-core with the Transformer Engine spec): h 64,
// a 4 heads of dh 16 (q = a·dh = 64), g query groups, s 32, b 1: T = s·b = 32 tokens; TP 1, no
// sequence parallelism; bf16 (2 bytes an element); RMSNorm, no biases, no dropout.
#include "workload/modules/attention.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::attention_module_test {

using testing::ModuleHarness;
using testing::SeenTensors;

constexpr Bytes kT = 32, kH = 64, kQ = 64, kHeads = 4;

TEST_CASE(
    "attention forward saves the norm output, the QKV output and the flash output with its "
    "softmax statistics",
    "[workload][modules][attention]") {
  ModuleHarness h(testing::TinyLlama());
  AttentionModule attention;
  h.Forward(attention);
  // g = a = 4: kv = g·dh = 64.
  const Bytes kv = 64;
  const SeenTensors expected = {
      // TELayerNormColumnParallelLinear saves the RMSNorm's rsigma, fp32 [T] (4·T), and its
      // output ln_out [s, b, h] for the wgrad (2·T·h).
      {"layer0.ln1.rstd", 4 * kT},
      {"layer0.ln1.out", 2 * kT * kH},
      // The QKV output [s, b, (a + 2g)·dh/t], whose q, k, v views the kernel saves:
      // 2·T·(q + 2·kv).
      {"layer0.attn.qkv", 2 * kT * (kQ + 2 * kv)},
      // Core attention's output [s, b, a·dh/t], saved by the kernel and by the output
      // projection (2·T·q), and FlashAttention's softmax_lse, fp32 [b, a/t, s] (4·T·a). On an
      // H100 with current Megatron-core, TE runs cuDNN FusedAttention in sbhd: no second copy
      // of the output (FrameworkFacts::te_flash_attn2, te_fused_attn_bshd_out).
      {"layer0.attn.core_out", 2 * kT * kQ},
      {"layer0.attn.softmax_lse", 4 * kT * kHeads},
  };
  CHECK(h.Saved() == expected);
  // The first TE GEMM makes TE's module-level cuBLAS workspace: 32 MiB on sm >= 90
  // (transformer_engine/pytorch/module/base.py get_cublas_workspace_size_bytes).
  CHECK(h.Alive(Category::kWorkspace) == SeenTensors{{"workspace.te_cublas", 32 * kMiB}});
  CHECK(h.problems().empty());
}

TEST_CASE(
    "attention backward frees all it saved, with wgrad fusion only the norm's grad reaches "
    "the wrapper",
    "[workload][modules][attention]") {
  ModuleHarness h(testing::TinyLlama());
  AttentionModule attention;
  h.Forward(attention);
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
  // gradient_accumulation_fusion: the wgrad GEMMs accumulate into main_grad and each TE linear
  // hands autograd TE's cached dummy of the weight's shape (get_dummy_wgrad), 2·rows·cols bytes,
  // kept for the run: proj [h, q] and qkv [q + 2kv, h].
  CHECK(h.Alive(Category::kWorkspace) ==
        SeenTensors{{"workspace.te_cublas", 32 * kMiB},
                    {"te.dummy_wgrad[64x64]", 2 * kH * kQ},
                    {"te.dummy_wgrad[192x64]", 2 * (kQ + 2 * 64) * kH}});
  // The RMSNorm weight's grad [h] in the parameter dtype: 2·h.
  CHECK(h.wrapper().grads() == SeenTensors{{"layer0.ln1.weight", 2 * kH}});
}

TEST_CASE(
    "attention backward without wgrad fusion hands each weight's grad to the wrapper, "
    "output projection first",
    "[workload][modules][attention]") {
  config::Setup s = testing::TinyLlama();
  s.training.gradient_accumulation_fusion = false;
  ModuleHarness h(s);
  AttentionModule attention;
  h.Forward(attention);
  h.Backward();
  CHECK(h.Leaked().empty());
  // Backward order: proj [h, q] (2·h·q), then qkv [q + 2kv, h] (2·(q + 2kv)·h), then the norm.
  CHECK(h.wrapper().grads() == SeenTensors{{"layer0.attn.proj.weight", 2 * kH * kQ},
                                           {"layer0.attn.qkv.weight", 2 * (kQ + 2 * 64) * kH},
                                           {"layer0.ln1.weight", 2 * kH}});
}

TEST_CASE("selective core_attn recompute keeps no softmax statistics, backward re-runs the kernel",
          "[workload][modules][attention]") {
  config::Setup s = testing::TinyLlama();
  s.training.recompute_granularity = config::RecomputeGranularity::kSelective;  // {"core_attn"}
  ModuleHarness h(s);
  AttentionModule attention;
  h.Forward(attention);
  // The checkpointed core attention keeps its input (the QKV output) and returns its output,
  // which the output projection saves; the kernel's own statistics are dropped.
  CHECK(h.Saved() == SeenTensors{{"layer0.ln1.rstd", 4 * kT},
                                 {"layer0.ln1.out", 2 * kT * kH},
                                 {"layer0.attn.qkv", 2 * kT * (kQ + 2 * 64)},
                                 {"layer0.attn.core_out", 2 * kT * kQ}});
  h.Backward();
  // The re-run makes the output and softmax_lse again, in ops prefixed "recompute.".
  const SeenTensors backward = h.Allocated(Phase::kBackward);
  CHECK(std::count(backward.begin(), backward.end(),
                   testing::SeenTensor{"layer0.attn.softmax_lse", 4 * kT * kHeads}) == 1);
  CHECK(std::any_of(h.ops().begin(), h.ops().end(),
                    [](const Op& op) { return op.name == "recompute.attn.core"; }));
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE(
    "unfused attention with grouped KV heads saves the repeated K and V and the "
    "[b, a/t, s, s] probabilities",
    "[workload][modules][attention]") {
  config::Setup s = testing::TinyLlama();
  s.training.use_flash_attn = false;  // Megatron-core's DotProductAttention
  s.model.num_key_value_heads = 2;    // g 2: kv = 32
  ModuleHarness h(s);
  AttentionModule attention;
  h.Forward(attention);
  const Bytes kv = 32, s2 = 1 * kHeads * 32 * 32;  // b·(a/t)·s² elements
  CHECK(h.Saved() == SeenTensors{
                         {"layer0.ln1.rstd", 4 * kT},
                         {"layer0.ln1.out", 2 * kT * kH},
                         {"layer0.attn.qkv", 2 * kT * (kQ + 2 * kv)},
                         // repeat_interleave of K and V to a heads: [s, b, a/t, dh] each, 2·T·q.
                         {"layer0.attn.key_repeated", 2 * kT * kQ},
                         {"layer0.attn.value_repeated", 2 * kT * kQ},
                         // The fused scale-mask-softmax saves its output: 2·b·(a/t)·s².
                         {"layer0.attn.probs", 2 * s2},
                         {"layer0.attn.core_out", 2 * kT * kQ},
                     });
  // baddbmm writes the scores into Megatron's global "mpu" buffer [b·a/t, s, s] (2·s2 bytes),
  // and its first torch GEMM makes the cuBLAS workspace (8 × 4 MiB on sm >= 90).
  CHECK(h.Alive(Category::kWorkspace) == SeenTensors{{"workspace.te_cublas", 32 * kMiB},
                                                     {"workspace.cublas", 32 * kMiB},
                                                     {"workspace.mpu", 2 * s2}});
  h.Backward();
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE(
    "unfused attention keeps its scores until the forward returns, with and without grad",
    "[workload][modules][attention][lifetimes]") {
  // Megatron-core DotProductAttention.forward (dot_product_attention.py): the baddbmm output is
  // held by the locals `matmul_result` and `attention_scores` until `return context`, so it is
  // alive while the context bmm runs (NVIDIA/Megatron-LM#965 reads allocated memory unchanged
  // from the dropout to the end of the function).
  config::Setup s = testing::TinyLlama();
  s.training.use_flash_attn = false;
  const Bytes s2 = 1 * kHeads * 32 * 32;  // b·(a/t)·s² elements
  SECTION("with grad") {
    ModuleHarness h(s);
    AttentionModule attention;
    h.Forward(attention);
    CHECK(h.FreedIn("layer0.attn.scores") == "attn.context");
    // While the bmm with V runs: the norm's rstd (4·T) and output (2·T·h), qkv (2·T·3q: g = a),
    // the scores and the probabilities (2·s2 each), the bmm output and its contiguous copy
    // (2·T·q each).
    CHECK(h.AliveDuring("attn.context") == SeenTensors{
                                               {"layer0.ln1.rstd", 4 * kT},
                                               {"layer0.ln1.out", 2 * kT * kH},
                                               {"layer0.attn.qkv", 2 * kT * 3 * kQ},
                                               {"layer0.attn.scores", 2 * s2},
                                               {"layer0.attn.probs", 2 * s2},
                                               {"layer0.attn.context", 2 * kT * kQ},
                                               {"layer0.attn.core_out", 2 * kT * kQ},
                                           });
    h.Backward();
    CHECK(h.Leaked().empty());
    CHECK(h.problems().empty());
  }
  SECTION("without grad (inside a full-recompute checkpoint)") {
    ModuleHarness h(s);
    AttentionModule attention;
    h.Forward(attention, 0, ForwardMode{/*nograd=*/true, /*free_input=*/false});
    CHECK(h.FreedIn("layer0.attn.scores") == "attn.context");
    CHECK(h.FreedIn("layer0.attn.probs") == "attn.context");  // `attention_probs` too
    CHECK(h.problems().empty());
  }
}

}  // namespace memsim::workload::attention_module_test
