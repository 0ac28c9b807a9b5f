// The input side of a GPT model (modules/embedding.h: Megatron's get_batch and
// LanguageModelEmbedding) run alone on the module harness, counted by hand from
// megatron/core/models/common/embeddings/language_model_embedding.py and PyTorch's
// embedding_dense_backward_cuda.
//
// Shape (testing::TinyLlama): h 64, vocab 256 (padded to a multiple of 128·t: V = 256), RoPE
// (no position table), s 32, b 1: T = 32 tokens; TP 1; bf16; no dropout; framework "megatron"
// on a GPU, whose dataset makes the causal mask (--create-attention-mask-in-dataloader).
#include "workload/modules/embedding.h"

#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::embedding_module_test {

using testing::ModuleHarness;
using testing::SeenTensors;

constexpr Bytes kH = 64, kV = 256;

TEST_CASE(
    "get_batch and the embedding keep the token and position ids, the causal mask and the "
    "[s, b, h] output after forward",
    "[workload][modules][embedding]") {
  ModuleHarness h(testing::TinyLlama());
  const Bytes T = 32;
  Batch batch;
  EmbeddingSaved saved;
  TensorId out = 0;
  h.Run(Phase::kForward, [&](ModuleContext& ctx) {
    batch = GetBatch(ctx, /*first_stage=*/true, /*last_stage=*/false);
    out = Embedding::Forward(ctx, batch, &saved);
  });
  // With TP 1, F.embedding saves the token ids themselves (no masked copy).
  CHECK(saved.indices == batch.tokens);
  CHECK(h.Alive() == SeenTensors{
                         // tokens and position_ids, int64 [b, s]: 8·T each.
                         {"data.tokens", 8 * T},
                         {"data.position_ids", 8 * T},
                         // gpt_dataset.py's causal mask, bool [b, 1, s, s]: b·s².
                         {"data.attention_mask", 1 * 32 * 32},
                         // The word embedding's [b, s, h] output transposed to [s, b, h]
                         // (.contiguous()), the last op with neither SP nor dropout: 2·T·h.
                         {"embedding.out", 2 * T * kH},
                     });
  CHECK(h.em().SizeOf(out) == 2 * T * kH);
  CHECK(h.problems().empty());
}

TEST_CASE(
    "embedding backward hands the dense [V/t, h] word-embedding grad to autograd and frees "
    "the token ids it saved",
    "[workload][modules][embedding]") {
  ModuleHarness h(testing::TinyLlama());
  Batch batch;
  EmbeddingSaved saved;
  TensorId out = 0;
  h.Run(Phase::kForward, [&](ModuleContext& ctx) {
    batch = GetBatch(ctx, true, false);
    out = Embedding::Forward(ctx, batch, &saved);
  });
  // Layer 0 owns the output; its backward returns the output's grad.
  h.Release({out});
  const TensorId dx = h.MakeTensor(2 * 32 * kH, "harness.output_grad");
  h.Run(Phase::kBackward, [&](ModuleContext& ctx) { Embedding::Backward(ctx, batch, saved, dx); });
  // embedding_dense_backward: [V/t, h] in the parameter dtype, 2·V·h.
  CHECK(h.wrapper().grads() == SeenTensors{{"embedding.word_embeddings.weight", 2 * kV * kH}});
  // The tokens went with the saved indices; StageRunner's DropBatch and the end of the unit's
  // backward drop the position ids (RoPE: unused) and the mask, not the embedding.
  CHECK(h.Alive() == SeenTensors{{"data.position_ids", 8 * 32}, {"data.attention_mask", 32 * 32}});
  h.Release({batch.position_ids, batch.attention_mask});
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

TEST_CASE(
    "embedding backward above 3072 tokens sorts the indices: PyTorch's segment buffers "
    "and fp32 partial sums beside the dense grad",
    "[workload][modules][embedding]") {
  config::Setup s = testing::TinyLlama();
  s.training.seq_length = 4096;  // T = 4096 > 3072: the radix-sort path
  s.model.max_position_embeddings = 4096;
  ModuleHarness h(s);
  Batch batch;
  EmbeddingSaved saved;
  TensorId out = 0;
  h.Run(Phase::kForward, [&](ModuleContext& ctx) {
    batch = GetBatch(ctx, true, false);
    out = Embedding::Forward(ctx, batch, &saved);
  });
  h.Release({out});
  const Bytes T = 4096;
  const TensorId dx = h.MakeTensor(2 * T * kH, "harness.output_grad");
  h.Run(Phase::kBackward, [&](ModuleContext& ctx) { Embedding::Backward(ctx, batch, saved, dx); });
  // aten/src/ATen/native/cuda/Embedding.cu and EmbeddingBackwardKernel.cu: sorted_indices,
  // orig_indices and their arange, int64 [T] each (24·T); the dense grad (2·V·h); segment
  // offsets [T], partials_per_segment and its offsets [min(T, V)] each and
  // partial_segment_offset [T/10 + min(T, V)], int64 (8·(T + 2·256 + 665) with
  // T/10 + min(T, V) = 409 + 256 = 665 partial segments); grad_weight_per_segment
  // fp32 [665, h] (4·665·h).
  const Bytes partials = T / 10 + kV;
  CHECK(h.Allocated(Phase::kBackward) ==
        SeenTensors{{"embedding.sort_buffers", 24 * T},
                    {"embedding.word_embeddings.grad", 2 * kV * kH},
                    {"embedding.segment_offsets", 8 * (T + 2 * kV + partials)},
                    {"embedding.grad_weight_per_segment", 4 * partials * kH}});
  h.Release({batch.position_ids, batch.attention_mask});
  CHECK(h.Leaked().empty());
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::embedding_module_test
