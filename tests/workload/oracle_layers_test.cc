// One transformer layer of the real code on CPU against memsim's (what the layer's forward leaves
// alive: saved for backward plus its output, the log's "fwd layer post" less "fwd layer pre"):
// (1) tests/data/oracle/bert.log: transformers
// 4.36.0.dev0 BertLayer, eager, fp32, dropout 0.1, no attention mask, recorded by
// tools/oracle/record.py) against layer 0 of a one-layer BERT under the Hugging Face Trainer;
// (2) tests/data/oracle/megatron.log: tools/oracle/megatron_layer.py, a Megatron-core style
// TransformerLayer (local spec, unfused attention, TP 1) against memsim's Megatron local layer.
// Every difference is a row of the gap table (oracle_log.h GapRow, active at that one boundary).
//
// Shape: h 64, 4 heads, ffn 256, batch 1, sequence 32: T = 32 tokens; fp32: T·h = 8192 B,
// T·ffn = 32768 B, scores [1, 4, 32, 32] = 16384 B (4096 elements).
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>

#include "workload/build.h"
#include "workload/module_harness.h"
#include "workload/modules/moe.h"
#include "workload/oracle_log.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

using testing::GapReason;
using testing::GapRow;

config::Setup OracleBert() {
  config::Setup s = testing::PaperGpt();
  s.model.model_type = "bert";
  s.model.type_vocab_size = 2;
  s.model.sequence_classification = true;
  s.model.tie_word_embeddings = false;
  s.model.vocab_size = 256;
  s.model.max_position_embeddings = 64;
  s.model.hidden_size = 64;
  s.model.intermediate_size = 256;
  s.model.num_attention_heads = 4;
  s.model.num_key_value_heads = 4;
  s.model.num_hidden_layers = 1;
  s.training.framework = "hf-trainer";
  s.training.stack.emplace<config::HfTrainerOptions>();
  s.training.seq_length = 32;
  s.training.micro_batch_size = 1;
  s.training.global_batch_size = 1;
  s.training.precision = config::Precision::kFp32;
  s.training.pytorch()->torch_dtype = config::Precision::kFp32;
  s.training.gradient_accumulation_fusion = false;
  s.training.train_iters = 1;
  return s;
}

Bytes OracleLayerDelta(const std::vector<testing::OracleBoundary>& log, const std::string& pre,
                       const std::string& post) {
  Bytes a = -1, b = -1;
  for (const auto& x : log) {
    if (x.label == pre) a = x.alive;
    if (x.label == post) b = x.alive;
  }
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  return b - a;
}

Bytes OracleSum(const std::vector<GapRow>& rows) {
  Bytes s = 0;
  for (const GapRow& r : rows) s += r.bytes;
  return s;
}

TEST_CASE("oracle: BERT layer, eager fp32 with dropout, what the forward leaves alive",
          "[workload][oracle]") {
  const auto log = testing::ReadOracleLog("bert");
  const Bytes real = OracleLayerDelta(log, "fwd layer pre", "fwd layer post");
  // Real (trace): q, k, v 3 × 8192 (saved by the two matmuls); the 0-dim divisor 8; softmax's
  // output 16384, the dropout noise 16384 and the dropped probabilities 16384; the context's
  // contiguous copy 8192 (BertSelfOutput.dense's input); per residual branch the dropout noise
  // 8192, the residual sum 8192 (LayerNorm's input), the LayerNorm output 8192 and its mean and
  // rstd 2 × 128; BertIntermediate's dense output and GeLU's output 2 × 32768.
  CHECK(real == 3 * 8192 + 8 + 3 * 16384 + 8192 + 2 * (3 * 8192 + 256) + 2 * 32768);
  const Bytes memsim =
      testing::LayerSavedBytes(Build(OracleBert(), 0), 1, 0, 0, Category::kActivations);
  const std::vector<GapRow> table = {
      // attention_scores / math.sqrt(self.attention_head_size): DivBackward0 saves the wrapped
      // 0-dim double (BertSelfAttention.forward, 4.36).
      {"0-dim divisor saved by DivBackward0", GapReason::kVersion, 8, "fwd layer post",
       "fwd layer post"},
      // PyTorch 1.13's CPU dropout (_dropout_impl) saves an fp32 noise tensor (4 B an element)
      // when its input needs grad; CUDA's native_dropout a bool mask (1 B), which memsim models.
      {"attention-probs dropout: CPU fp32 noise vs CUDA bool mask", GapReason::kVersion, 3 * 4096,
       "fwd layer post", "fwd layer post"},
      {"two hidden dropouts: CPU fp32 noise vs CUDA bool mask", GapReason::kVersion, 2 * 3 * 2048,
       "fwd layer post", "fwd layer post"},
  };
  INFO("real " << real << " memsim " << memsim);
  CHECK(real - memsim == OracleSum(table));
}

config::Setup OracleMegatron() {
  config::Setup s = testing::PaperGpt();  // LayerNorm, GeLU, biases, dropout 0.1, learned positions
  s.model.hidden_size = 64;
  s.model.intermediate_size = 256;
  s.model.num_attention_heads = 4;
  s.model.num_key_value_heads = 4;
  s.model.num_hidden_layers = 1;
  s.model.vocab_size = 256;
  s.model.max_position_embeddings = 64;
  s.training.seq_length = 32;
  s.training.micro_batch_size = 1;
  s.training.global_batch_size = 1;
  s.training.precision = config::Precision::kFp32;
  s.training.transformer_impl = "local";
  s.training.use_flash_attn = false;
  s.training.train_iters = 1;
  return s;
}

TEST_CASE(
    "oracle: Megatron-core style layer, unfused attention, fp32 with dropout, what the "
    "forward leaves alive",
    "[workload][oracle]") {
  const auto log = testing::ReadOracleLog("megatron");
  const Bytes real = OracleLayerDelta(log, "fwd layer pre", "fwd layer post");
  // Real (trace): the causal mask 1024 (bool [32, 32], saved by masked_fill_); input_layernorm's
  // output and mean / rstd 8192 + 256; linear_qkv's output 24576 (q and k are views of it, saved
  // by baddbmm; v by bmm); the "mpu" buffer 16384; softmax's output, the dropout noise and the
  // dropped probabilities 3 × 16384; the context's contiguous copy 8192 (linear_proj's input);
  // per bias-dropout-add the dropout noise 8192 and the sum 8192; pre_mlp_layernorm's 8192 + 256;
  // linear_fc1's output + bias 32768 (GeLU's input) and GeLU's output 32768. The baddbmm scores
  // (16384) are freed when DotProductAttention.forward returns, before the boundary.
  CHECK(real == 1024 + 2 * (8192 + 256) + 24576 + 4 * 16384 + 8192 + 2 * 16384 + 2 * 32768);
  const Bytes memsim =
      testing::LayerSavedBytes(Build(OracleMegatron(), 0), 1, 0, 0, Category::kActivations);
  const std::vector<GapRow> table = {
      // megatron_layer.py builds its own causal mask (torch.triu); Megatron takes it from the
      // data pipeline or the fused kernel's causal mode, outside the layer.
      {"the recorder's causal mask, made in the layer", GapReason::kSetup, 1024, "fwd layer post",
       "fwd layer post"},
      // GlobalMemoryBuffer.get_tensor: memsim allocates it in the kWorkspace category
      // (kernels.h), which the comparison leaves out.
      {"the \"mpu\" global memory buffer (memsim: kWorkspace)", GapReason::kSetup, 16384,
       "fwd layer post", "fwd layer post"},
      {"attention dropout: CPU fp32 noise vs CUDA bool mask", GapReason::kVersion, 3 * 4096,
       "fwd layer post", "fwd layer post"},
      {"two bias-dropout-adds: CPU fp32 noise vs CUDA bool mask", GapReason::kVersion, 2 * 3 * 2048,
       "fwd layer post", "fwd layer post"},
  };
  INFO("real " << real << " memsim " << memsim);
  CHECK(real - memsim == OracleSum(table));
}

// The highest alive bytes (every category but kWorkspace, kCommunication, kOther) during layer
// 0's forward ops of iteration 1 named in `names`, above the bytes alive before the first: an
// op's allocations count before its frees.
Bytes OracleOpsPeak(const Program& p, const std::vector<std::string>& names) {
  std::map<TensorId, Bytes> size;
  Bytes alive = 0, base = -1, peak = 0;
  for (const Op& op : p.ops) {
    const bool in = op.iteration == 1 && op.phase == Phase::kForward && op.layer == 0 &&
                    std::find(names.begin(), names.end(), op.name) != names.end();
    if (in && base < 0) base = alive;
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kWorkspace || a.category == Category::kCommunication ||
          a.category == Category::kOther) {
        continue;
      }
      size[a.id] = a.size_bytes;
      alive += a.size_bytes;
    }
    if (in) peak = std::max(peak, alive - base);
    for (TensorId id : op.frees) {
      auto it = size.find(id);
      if (it == size.end()) continue;
      alive -= it->second;
      size.erase(it);
    }
  }
  REQUIRE(base >= 0);
  return peak;
}

TEST_CASE("oracle: Megatron-core style core attention, the highest point inside its forward",
          "[workload][oracle]") {
  const auto log = testing::ReadOracleLog("megatron");
  Bytes real = -1, pre = -1;
  for (const auto& b : log) {
    if (b.label == "fwd core_attention pre") pre = b.alive;
    if (b.label == "fwd core_attention post") real = b.peak - pre;  // the peak inside it
  }
  // Real (trace): the "mpu" buffer 16384 (kept), the baddbmm scores 16384 (masked in place, then
  // held by DotProductAttention.forward's matmul_result / attention_scores until it returns),
  // softmax's output 16384, the dropout noise 16384 and output 16384, bmm's context 8192 and its
  // permuted contiguous copy 8192: all alive at the copy.
  CHECK(real == 16384 + 4 * 16384 + 2 * 8192);
  const Bytes memsim = OracleOpsPeak(
      Build(OracleMegatron(), 0), {"attn.scores", "attn.softmax", "attn.dropout", "attn.context"});
  const std::vector<GapRow> table = {
      {"the \"mpu\" global memory buffer (memsim: kWorkspace)", GapReason::kSetup, 16384,
       "fwd core_attention post", "fwd core_attention post"},
      // Megatron-LM #965: the scores stay allocated until DotProductAttention.forward returns (its
      // locals matmul_result and attention_scores); memsim holds them as long (attention.cc), so
      // they need no row.
      {"attention dropout: CPU fp32 noise vs CUDA bool mask", GapReason::kVersion, 3 * 4096,
       "fwd core_attention post", "fwd core_attention post"},
  };
  INFO("real " << real << " memsim " << memsim);
  CHECK(real - memsim == OracleSum(table));
}

// (3) tests/data/oracle/megatron_moe.log: tools/oracle/megatron_moe.py, Megatron-core 0.10's MoE
// layer (core_v0.10.0 moe_utils.py unmodified; MoELayer, TopKRouter without aux loss, the alltoall
// dispatcher at EP 1 and SequentialMLP re-enacted) against memsim's MoE module at core 0.10.
// Shape: n = 32 tokens, h 64, E 4 experts, top-2, expert ffn 32 (gated SiLU), fp32: S = N =
// n·k = 64 routed tokens, [S, h] = 16384 B, [n, h] = 8192 B, [n, E] = [E, n] = 512 B (bool 128).
config::Setup OracleMoe() {
  config::Setup s = testing::TinyLlama();
  s.model.num_experts = 4;
  s.model.moe_router_topk = 2;
  s.model.moe_ffn_hidden_size = 32;
  s.training.micro_batch_size = 1;
  s.training.global_batch_size = 1;
  s.training.moe_token_dispatcher_type = "alltoall";
  s.training.moe_grouped_gemm = false;
  s.training.precision = config::Precision::kFp32;
  s.training.megatron_core_version = {0, 10};
  return s;
}

// memsim's MoE tensors (layer0.moe.*) among `seen`, bytes summed by label.
std::map<std::string, Bytes> MoeTensors(const testing::SeenTensors& seen) {
  std::map<std::string, Bytes> out;
  for (const testing::SeenTensor& t : seen) {
    if (t.label.rfind("layer0.moe.", 0) == 0) out[t.label] += t.size_bytes;
  }
  return out;
}

TEST_CASE("oracle: Megatron-core 0.10 MoE layer, tensor by tensor, what the forward leaves alive",
          "[workload][oracle][moe]") {
  const auto log = testing::ReadOracleLog("megatron_moe");
  const Bytes real = OracleLayerDelta(log, "fwd moe pre", "fwd moe post");
  // Real (trace), what MoELayer.forward leaves alive:
  //   router: scatter's index, the top-k indices int64 [n, k] 512; SoftmaxBackward's output
  //     fp32 [n, k] 256; the dense probs [n, E] 512 (self.probs) and routing map bool 128
  //     (self.routing_map)                                                          = 1408
  //   preprocess: the tokens-per-expert count int64 [E] 32 (self.num_global_tokens_per_local_
  //     expert_cpu, a view of it)                                                   = 32
  //   permute's sorted indices int64 [S] 512 (self.reversed_local_input_permutation_mapping,
  //     saved by index_select and scatter_add_)                                     = 512
  //   the sorted tokens [N, h] 16384 (the experts' input; fc1 saves its split views) = 16384
  //   per expert (16 tokens each under balanced routing; 64 in all): fc1's output [·, 2·Fe]
  //     (SiLU and the product save views of it), SiLU's output [·, Fe] (saved by the product),
  //     the product [·, Fe] (fc2's input): 64·(256 + 128 + 128)                    = 32768
  //   unpermute (probs given): the sorted-back tokens [S, h] 16384 saved by the product's
  //     MulBackward with the permuted probs [S] 256; masked_select's [E, n] copies 512 + 128
  //                                                                                 = 17280
  //   the output [n, h]                                                             = 8192
  CHECK(real == 1408 + 32 + 512 + 16384 + 32768 + 17280 + 8192);
  testing::ModuleHarness h(OracleMoe());
  MoeModule m;
  h.Forward(m);
  // memsim, per tensor: the same, less the two rows below.
  const std::map<std::string, Bytes> expected = {
      {"layer0.moe.router.topk_indices", 512}, {"layer0.moe.router.topk_probs_fp32", 256},
      {"layer0.moe.router.probs", 512},        {"layer0.moe.router.routing_map", 128},
      {"layer0.moe.permutation_map", 512},     {"layer0.moe.dispatched_tokens", 16384},
      {"layer0.moe.experts.fc1_out", 16384},   {"layer0.moe.experts.act_out", 8192},
      {"layer0.moe.unsorted_tokens", 16384},   {"layer0.moe.unpermute_probs", 256},
      {"layer0.moe.unpermute_probs_t", 512},   {"layer0.moe.unpermute_map_t", 128}};
  CHECK(MoeTensors(h.Saved()) == expected);
  Bytes memsim = 8192;  // the output, which the harness releases
  for (const auto& [label, bytes] : expected) memsim += bytes;
  const std::vector<GapRow> table = {
      // The recorder's experts run the local MLP's unfused glu (silu(x[0]) * x[1]), whose product
      // saves SiLU's output; memsim models the fused bias_swiglu_impl, which saves its input only.
      {"unfused gated SiLU: SiLU's output [N, Fe] saved", GapReason::kSetup, 64 * 32 * 4,
       "fwd moe post", "fwd moe post"},
      // preprocess's `.to(torch.device("cpu"))`: on CUDA the count is a host tensor.
      {"the tokens-per-expert count, on the host under CUDA", GapReason::kSetup, 32,
       "fwd moe post", "fwd moe post"},
  };
  INFO("real " << real << " memsim " << memsim);
  CHECK(real - memsim == OracleSum(table));
}

TEST_CASE(
    "oracle: Megatron-core 0.10 MoE unpermute, the highest points of its forward and backward",
    "[workload][oracle][moe]") {
  const auto log = testing::ReadOracleLog("megatron_moe");
  Bytes after_experts = -1, fwd_peak = -1, bwd_pre = -1, bwd_peak = -1;
  for (const auto& b : log) {
    if (b.label == "fwd experts post") after_experts = b.alive;
    if (b.label == "fwd moe post") fwd_peak = b.peak - after_experts;
    if (b.label == "bwd moe pre") bwd_pre = b.alive;
    if (b.label == "bwd experts pre") bwd_peak = b.peak - bwd_pre;
  }
  // Forward (trace): token_unpermutation's sort back [S, h] 16384, unpermute's [E, n] copies
  // 512 + 128, the permuted probs [S] 256, the weighted tokens [S, h] 16384 and the zeros output
  // [n, h] 8192: nothing freed before the scatter_add_.
  CHECK(fwd_peak == 16384 + 512 + 128 + 256 + 16384 + 8192);
  // Backward, from the output's grad to the experts': ScatterAddBackward's gather [S, h], then
  // MulBackward0's two grads [S, h] each and the engine's sum of the probs' one to [S, 1] (256),
  // all while the node's input is alive.
  CHECK(bwd_peak == 3 * 16384 + 256);
  testing::ModuleHarness h(OracleMoe());
  MoeModule m;
  h.Forward(m);
  h.Backward();
  // memsim: what the ops allocate (an op's allocations count before its frees).
  auto allocated = [&](Phase phase, std::initializer_list<const char*> names) {
    Bytes sum = 0;
    for (const Op& op : h.ops()) {
      if (op.phase != phase || std::find(names.begin(), names.end(), op.name) == names.end()) {
        continue;
      }
      for (const TensorAlloc& a : op.allocs) sum += a.size_bytes;
    }
    return sum;
  };
  CHECK(allocated(Phase::kForward, {"moe.unsort_chunks", "moe.unpermute"}) == fwd_peak);
  CHECK(allocated(Phase::kBackward, {"moe.unpermute_bwd"}) == bwd_peak);
}

}  // namespace
}  // namespace memsim::workload
