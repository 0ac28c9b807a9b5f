// Weight grads that linear layers hand to autograd (docs/training-memory.md, 'Megatron DDP
// buffers'). Megatron megatron/core/tensor_parallel/layers.py
// LinearWithGradAccumulationAndAsyncCommunication.backward (the output layer always, every
// transformer linear under transformer_impl "local") returns a [out, in] tensor in the input dtype:
// the wgrad itself without gradient-accumulation fusion; with it a dummy, once Megatron-core DDP
// has set grad_added_to_main_grad -- `torch.empty`, or, in current releases with Transformer Engine
// importable, TE's `get_dummy_wgrad`. Transformer Engine's own linear modules do the same (TE PR
// #507: `torch.empty`; current releases: `get_dummy_wgrad`). A fresh tensor is kept by
// AccumulateGrad as .grad until the DDP hook sets .grad = None in the same backward step;
// get_dummy_wgrad keeps one tensor per (shape, dtype) in a module-level dict
// (transformer_engine/pytorch/module/base.py) for the whole run.
#include <catch2/catch.hpp>

#include "workload/build.h"
#include "workload/model.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

// (count, size, allocated and freed in the same op) of allocations labelled `label`.
struct Seen {
  int count = 0;
  Bytes size_bytes = 0;
  bool same_op = true;
};
Seen Find(const Program& p, const std::string& label) {
  Seen s;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label != label) continue;
      ++s.count;
      s.size_bytes = a.size_bytes;
      bool freed = false;
      for (TensorId f : op.frees) freed |= f == a.id;
      s.same_op &= freed && a.category == Category::kGradients;
    }
  }
  return s;
}

// The cached dummies: label -> (size, iteration made, phase made, ever freed).
struct Dummy {
  Bytes size_bytes = 0;
  int iteration = 0;
  Phase phase = Phase::kInit;
  bool freed = false;
};
std::map<std::string, Dummy> Dummies(const Program& p) {
  std::map<std::string, Dummy> out;
  std::map<TensorId, std::string> ids;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.rfind("te.dummy_wgrad", 0) != 0) continue;
      CHECK(a.category == Category::kWorkspace);
      CHECK(out.count(a.label) == 0);  // one tensor per shape for the whole run
      out[a.label] = {a.size_bytes, op.iteration, op.phase, false};
      ids[a.id] = a.label;
    }
    for (TensorId f : op.frees) {
      if (ids.count(f) != 0) out[ids[f]].freed = true;
    }
  }
  return out;
}

// LLaMA-2-7B (test_setups.h), t = 1, bf16: output [V, h] = [32000, 4096]; qkv [3h, h]; proj
// [h, h]; fc1 [2·ffn, h] (gated); fc2 [h, ffn] with h = 4096, ffn = 11008.
config::Setup Older(config::Setup s) {  // a mid-2024 stack: TE 1.8, Megatron-core 0.8
  s.training.transformer_engine_version = {1, 8};
  s.training.megatron_core_version = {0, 8};
  return s;
}

TEST_CASE("wgrad: TE 1.x and older Megatron hand a fresh weight-sized tensor per backward",
          "[workload]") {
  const config::Setup s = Older(testing::Llama2_7b());  // one micro-batch, 3 iterations
  const ModelDims d = ComputeDims(s);
  const Program p = Build(s, 0);
  const Seen out = Find(p, "output_layer.wgrad");
  // One per micro-batch backward: 1 micro-batch × 3 iterations; [V, h] bf16 = 2·V·h bytes.
  CHECK(out.count == 3);
  CHECK(out.size_bytes == 2 * d.V * d.h);
  CHECK(out.same_op);
  const Seen fc1 = Find(p, "layer0.mlp.fc1.wgrad");
  CHECK(fc1.count == 3);
  CHECK(fc1.size_bytes == 2 * 2 * d.ffn * d.h);
  CHECK(fc1.same_op);
  CHECK(Dummies(p).empty());
}

TEST_CASE("wgrad: current TE keeps one dummy per weight shape, shared by all layers",
          "[workload]") {
  const config::Setup s = testing::Llama2_7b();  // versions not stated: current releases
  const ModelDims d = ComputeDims(s);
  const Program p = Build(s, 0);
  const auto dummies = Dummies(p);
  // Five shapes: the four of every transformer layer and the output layer's.
  const std::map<std::string, Bytes> expected = {
      {"te.dummy_wgrad[32000x4096]", 2 * d.V * d.h},
      {"te.dummy_wgrad[12288x4096]", 2 * 3 * d.h * d.h},
      {"te.dummy_wgrad[4096x4096]", 2 * d.h * d.h},
      {"te.dummy_wgrad[22016x4096]", 2 * 2 * d.ffn * d.h},
      {"te.dummy_wgrad[4096x11008]", 2 * d.h * d.ffn}};
  std::map<std::string, Bytes> seen;
  for (const auto& [label, dummy] : dummies) {
    seen[label] = dummy.size_bytes;
    CHECK(dummy.iteration == 1);  // made at first use, in iteration 1's backward
    CHECK(dummy.phase == Phase::kBackward);
    CHECK_FALSE(dummy.freed);
  }
  CHECK(seen == expected);
  CHECK(Find(p, "output_layer.wgrad").count == 0);
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").count == 0);
}

TEST_CASE("wgrad: current TE under an older Megatron caches only TE's own dummies", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.training.megatron_core_version = {0, 8};
  const Program p = Build(s, 0);
  CHECK(Dummies(p).size() == 4);                    // the transformer layers' shapes
  CHECK(Find(p, "output_layer.wgrad").count == 3);  // fresh, per backward
  CHECK(Find(p, "output_layer.wgrad").same_op);
}

TEST_CASE("wgrad: without gradient-accumulation fusion the real wgrads pass through autograd",
          "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.training.gradient_accumulation_fusion = false;
  const ModelDims d = ComputeDims(s);
  const Program p = Build(s, 0);
  CHECK(Dummies(p).empty());
  CHECK(Find(p, "output_layer.wgrad").count == 3);
  CHECK(Find(p, "layer31.attn.qkv.wgrad").size_bytes == 2 * 3 * d.h * d.h);
  CHECK(Find(p, "layer31.attn.qkv.wgrad").same_op);
}

TEST_CASE("wgrad: local (non-TE) linears hand their weight grads to autograd", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.training.transformer_impl = "local";  // and no Transformer Engine version: not installed
  const ModelDims d = ComputeDims(s);
  const Program p = Build(s, 0);
  CHECK(Dummies(p).empty());
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").size_bytes == 2 * 2 * d.ffn * d.h);
  CHECK(Find(p, "layer5.mlp.fc2.wgrad").size_bytes == 2 * d.h * d.ffn);
  CHECK(Find(p, "layer31.attn.qkv.wgrad").size_bytes == 2 * 3 * d.h * d.h);
  CHECK(Find(p, "layer31.attn.proj.wgrad").size_bytes == 2 * d.h * d.h);
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").count == 3);
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").same_op);
}

TEST_CASE("wgrad: torch_npu has no Transformer Engine, so no cached dummies", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.device.allocator_backend = alloc::Backend::kNpu;
  const Program p = Build(s, 0);
  CHECK(Dummies(p).empty());
  CHECK(Find(p, "output_layer.wgrad").count == 3);
}

}  // namespace
}  // namespace memsim::workload
