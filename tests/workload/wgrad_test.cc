// Weight grads handed to autograd by Megatron's own (non-TE) linear layers: the output layer
// always, every transformer linear under transformer_impl "local". Megatron
// megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward
// returns a [out, in] tensor in the input dtype (the wgrad, or a torch.empty placeholder with
// gradient-accumulation fusion once DDP set grad_added_to_main_grad); AccumulateGrad keeps it
// as .grad until the DDP hook sets .grad = None in the same backward step.
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

TEST_CASE("workload: the output layer's weight grad passes through autograd", "[workload]") {
  config::Setup s = testing::Llama2_7b();  // TE, bf16, one micro-batch, 3 iterations
  const ModelDims d = ComputeDims(s);
  const Program p = Build(s, 0);
  const Seen out = Find(p, "output_layer.wgrad");
  // One per micro-batch backward: 1 micro-batch × 3 iterations; [V, h] bf16 = 2·V·h bytes.
  CHECK(out.count == 3);
  CHECK(out.size_bytes == 2 * d.V * d.h);
  CHECK(out.same_op);
  // TE layers accumulate into main_grad without handing a tensor to autograd.
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").count == 0);
}

TEST_CASE("workload: local (non-TE) linears hand their weight grads to autograd", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.training.transformer_impl = "local";
  const ModelDims d = ComputeDims(s);
  const Program p = Build(s, 0);
  // LLaMA-2-7B, t = 1: fc1 [2·ffn, h] (gated), fc2 [h, ffn], qkv [3h, h], proj [h, h], bf16.
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").size_bytes == 2 * 2 * d.ffn * d.h);
  CHECK(Find(p, "layer5.mlp.fc2.wgrad").size_bytes == 2 * d.h * d.ffn);
  CHECK(Find(p, "layer31.attn.qkv.wgrad").size_bytes == 2 * 3 * d.h * d.h);
  CHECK(Find(p, "layer31.attn.proj.wgrad").size_bytes == 2 * d.h * d.h);
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").count == 3);
  CHECK(Find(p, "layer0.mlp.fc1.wgrad").same_op);
}

}  // namespace
}  // namespace memsim::workload
