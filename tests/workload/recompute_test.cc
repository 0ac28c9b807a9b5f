// Selective recompute of the modules Megatron's --recompute-modules lists
// (megatron/core/transformer/transformer_layer.py, attention.py; tensor_parallel/random.py
// CheckpointFunction and CheckpointWithoutOutput): "core_attn" and "mlp" keep only their input
// and re-run in backward; "layernorm" discards a norm's output after its consumer ran and makes
// it again before the consumer's backward -- only where the norm is its own module (the local
// spec); under Transformer Engine the norms are fused into the next linear and it does nothing.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "workload/build.h"
#include "workload/recompute.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

// testing::TinyLlama (h 64, ffn 128, seq 32, TP 1, bf16, flash, no dropout) with selective
// recompute of `modules`.
config::Setup Small(std::vector<std::string> modules) {
  config::Setup s = testing::TinyLlama();
  s.training.recompute_granularity = config::RecomputeGranularity::kSelective;
  s.training.recompute_modules = std::move(modules);
  return s;
}

int CountOps(const Program& p, const std::string& name) {
  int n = 0;
  for (const Op& op : p.ops) n += op.name == name ? 1 : 0;
  return n;
}

TEST_CASE("selective recompute of \"mlp\" saves only the MLP's input", "[workload][recompute]") {
  const Program attn = Build(Small({"core_attn"}), 0);
  const Program mlp = Build(Small({"core_attn", "mlp"}), 0);
  // What the MLP saves without recompute, T = 32 tokens, bf16: ln2 rstd 4·T = 128, ln2 output
  // 2·T·h = 4096, fc1 output 2·T·2·ffn = 16384, activation output 2·T·ffn = 8192: 28800 bytes.
  for (int layer : {0, 1}) {
    CHECK(testing::LayerSavedBytes(attn, 1, 0, layer) -
              testing::LayerSavedBytes(mlp, 1, 0, layer) ==
          28800);
  }
  // In backward the branch runs again, once per layer.
  CHECK(CountOps(attn, "recompute.mlp.ln_fc1") == 0);
  CHECK(CountOps(mlp, "recompute.mlp.ln_fc1") == 2);
  CHECK(CountOps(mlp, "recompute.mlp.fc2") == 2);
  // Core attention is recomputed in both.
  CHECK(CountOps(mlp, "recompute.attn.core") == 2);
}

TEST_CASE("selective recompute of \"layernorm\": nothing under TE, the norm outputs with local",
          "[workload][recompute]") {
  // Transformer Engine fuses both norms into the next linear: the same Program.
  CHECK(Build(Small({"core_attn", "layernorm"}), 0) == Build(Small({"core_attn"}), 0));
  config::Setup local = Small({"core_attn"});
  local.training.transformer_impl = "local";
  config::Setup local_ln = Small({"core_attn", "layernorm"});
  local_ln.training.transformer_impl = "local";
  const Program base = Build(local, 0), ln = Build(local_ln, 0);
  // Each layer no longer keeps its two norm outputs, 2·T·h = 4096 bytes each.
  CHECK(testing::LayerSavedBytes(base, 1, 0, 0) - testing::LayerSavedBytes(ln, 1, 0, 0) == 8192);
  CHECK(CountOps(ln, "recompute.ln1") == 2);
  CHECK(CountOps(ln, "recompute.ln2") == 2);
}

TEST_CASE("recompute_modules only act with recompute_granularity selective",
          "[workload][recompute]") {
  config::Setup none = Small({"core_attn", "mlp"});
  none.training.recompute_granularity = config::RecomputeGranularity::kNone;
  config::Setup plain = Small({"core_attn"});
  plain.training.recompute_granularity = config::RecomputeGranularity::kNone;
  CHECK(Build(none, 0) == Build(plain, 0));
}

TEST_CASE("MindSpeed activation recompute picks layers as should_recompute does",
          "[workload][mindspeed]") {
  // mindspeed/core/memory/recompute/recompute_common.py should_recompute: a layer's priority is
  // its index within the chunk; full recompute's first recompute_num_layers are skipped, then
  // --recompute-activation-function-num-layers N layers (all for None).
  config::Setup s = testing::TinyLlama();
  s.training.recompute_activation_function = true;
  SelectiveRecompute all = SelectiveModules(s.training, true);
  CHECK(all.ActFnRecompute(0));
  CHECK(all.ActFnRecompute(1000));
  s.training.recompute_activation_function_num_layers = 1;
  SelectiveRecompute one = SelectiveModules(s.training, true);
  CHECK(one.ActFnRecompute(0));
  CHECK_FALSE(one.ActFnRecompute(1));
  // Full recompute of the first 2 layers (block), then N = 3: layers 2, 3 and 4.
  s.training.recompute_granularity = config::RecomputeGranularity::kFull;
  s.training.recompute_method = config::RecomputeMethod::kBlock;
  s.training.recompute_num_layers = 2;
  s.training.recompute_activation_function_num_layers = 3;
  SelectiveRecompute after = SelectiveModules(s.training, true);
  CHECK_FALSE(after.ActFnRecompute(1));
  CHECK(after.ActFnRecompute(2));
  CHECK(after.ActFnRecompute(4));
  CHECK_FALSE(after.ActFnRecompute(5));
  // In a 2-layer model with N = 1 only layer 0's MLP re-runs its activation in backward.
  config::Setup two = testing::TinyLlama();
  two.training.recompute_activation_function = true;
  two.training.recompute_activation_function_num_layers = 1;
  const Program p = Build(two, 0);
  REQUIRE(CountOps(p, "mlp.act_recompute") == 1);
  for (const Op& op : p.ops) {
    if (op.name == "mlp.act_recompute") CHECK(op.layer == 0);
  }
}

}  // namespace
}  // namespace memsim::workload
