// Megatron's dataloader attention mask on the device (FrameworkFacts::dataloader_attention_mask):
// size from gpt_dataset.py _get_ltor_masks_and_position_ids (one bool [1, S, S] per sample),
// lifetime from pretrain_gpt.py forward_step and tensor_parallel.checkpoint.
#include <catch2/catch.hpp>

#include <string>

#include "workload/build.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

constexpr const char* kMask = "data.attention_mask";

// Sizes of the iteration-1 allocations labelled `label`, in order.
std::vector<Bytes> Allocs(const Program& p, const std::string& label) {
  std::vector<Bytes> out;
  for (const Op& op : p.ops) {
    if (op.iteration != 1) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label == label) out.push_back(a.size_bytes);
    }
  }
  return out;
}

// Name of the iteration-1 op that frees the last tensor labelled `label`; "" if none.
std::string FreedBy(const Program& p, const std::string& label) {
  TensorId id = 0;
  for (const Op& op : p.ops) {
    if (op.iteration != 1) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.label == label) id = a.id;
    }
    for (TensorId f : op.frees) {
      if (f == id && id != 0) return op.name + (op.phase == Phase::kBackward ? " (backward)" : "");
    }
  }
  return "";
}

config::Setup Tiny() {
  config::Setup s = testing::TinyLlama();  // seq 32
  s.training.micro_batch_size = 2;
  s.training.global_batch_size = 2;
  return s;
}

}  // namespace

TEST_CASE("attention mask: b x S x S bools from get_batch, freed when forward_step returns",
          "[workload][peak]") {
  // b = 2, S = 32: torch.tril(ones(32, 32)) < 0.5 per sample, collated [2, 1, 32, 32] bool
  // = 2 * 32 * 32 = 2048 B. No recompute: nothing saves it (TE's causal flash attention takes
  // no mask), so it goes with forward_step's locals, before any backward op.
  const Program p = Build(Tiny(), 0);
  REQUIRE(Allocs(p, kMask) == std::vector<Bytes>{2048});
  const std::string freed = FreedBy(p, kMask);
  CHECK_FALSE(freed.empty());
  CHECK(freed.find("(backward)") == std::string::npos);
}

TEST_CASE("attention mask: kept to the backward under full or core_attn recompute",
          "[workload][peak]") {
  // tensor_parallel.checkpoint(..., hidden_states, attention_mask, ...) saves every tensor
  // argument (CheckpointFunction.forward save_for_backward(*args)).
  for (auto g : {config::RecomputeGranularity::kFull, config::RecomputeGranularity::kSelective}) {
    config::Setup s = Tiny();
    s.training.recompute_granularity = g;
    const Program p = Build(s, 0);
    REQUIRE(Allocs(p, kMask) == std::vector<Bytes>{2048});
    CHECK(FreedBy(p, kMask).find("(backward)") != std::string::npos);
  }
}

TEST_CASE("attention mask: context parallelism keeps this rank's S/cp rows", "[workload][peak]") {
  // get_batch_on_this_cp_rank index_selects 2 of 2·cp chunks of the query dimension: the full
  // [2, 1, 32, 32] (2048 B) is moved first, then a new [2, 1, 16, 32] (1024 B) replaces it.
  config::Setup s = Tiny();
  s.training.context_parallel_size = 2;
  s.training.data_parallel_size = 1;
  const Program p = Build(s, 0);
  CHECK(Allocs(p, kMask) == std::vector<Bytes>{2048, 1024});
}

TEST_CASE("attention mask: none with --no-create-attention-mask-in-dataloader or off Megatron",
          "[workload][peak]") {
  config::Setup off = Tiny();
  off.training.create_attention_mask_in_dataloader = false;
  CHECK(Allocs(Build(off, 0), kMask).empty());
  config::Setup torch = Tiny();
  torch.training.framework = "pytorch";
  torch.training.stack.emplace<config::PyTorchOptions>();
  torch.training.transformer_impl = "local";
  torch.training.use_flash_attn = false;
  CHECK(Allocs(Build(torch, 0), kMask).empty());
}

}  // namespace memsim::workload
