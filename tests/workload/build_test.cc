#include "workload/build.h"

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "test_setups.h"
#include "workload/model.h"

namespace memsim::workload {
namespace {

using testing::LayerSavedBytes;
using testing::NetByCategory;

bool Within(double actual, double expected, double rel) {
  return std::abs(actual - expected) <= rel * std::abs(expected);
}

// Checks the Program's own consistency: unique ids, every free / record_stream names a live
// tensor, and after the last op only static, optimizer-state, workspace and scalar tensors live,
// plus, on a stage that receives its input, what each model chunk's TransformerBlock keeps from
// its last forward (set_input_tensor): the received input and the grad retained on it, one pair
// per chunk of the same [s/σ, b, h] size.
void CheckWellFormed(const Program& p) {
  std::map<TensorId, const TensorAlloc*> live;
  std::set<TensorId> seen;
  for (const Op& op : p.ops) {
    for (const auto& [id, stream] : op.record_streams) REQUIRE(live.count(id) == 1);
    for (const TensorAlloc& a : op.allocs) {
      REQUIRE(seen.insert(a.id).second);
      REQUIRE(a.size_bytes >= 0);
      live[a.id] = &a;
    }
    for (TensorId id : op.frees) {
      INFO(op.name << " iteration " << op.iteration << " frees " << id);
      REQUIRE(live.erase(id) == 1);
    }
    REQUIRE(op.duration_us > 0);
  }
  std::multiset<Bytes> held_inputs, held_grads;
  for (const auto& [id, a] : live) {
    const Category cat = a->category;
    INFO("left alive: " << id << " " << a->label << " " << CategoryName(cat));
    if (cat == Category::kCommunication) {
      CHECK(a->label == "p2p.recv_forward");
      held_inputs.insert(a->size_bytes);
    } else if (cat == Category::kTemporaries) {
      CHECK(a->label.size() > 8);
      CHECK(a->label.substr(a->label.size() - 8) == ".d_input");  // a layer's input grad
      held_grads.insert(a->size_bytes);
    } else {
      CHECK((cat == Category::kParameters || cat == Category::kGradients ||
             cat == Category::kMainParameters || cat == Category::kOptimizerStates ||
             cat == Category::kWorkspace || cat == Category::kOther));
    }
  }
  CHECK(held_inputs == held_grads);
}

// One iteration's ops with tensor ids replaced by (iterations back, index of the alloc within
// that iteration), so two iterations can be compared. A tensor from an earlier iteration (a model
// chunk's input kept across the step) is named by how far back it was made, its label and its
// rank among that iteration's allocations of the same label: its plain index would differ
// because iteration 1 also makes the optimizer state and the workspaces.
using NormOp =
    std::tuple<std::string, Phase, int, int, int, double, std::vector<std::string>,
               std::vector<std::string>, std::vector<std::string>, std::string, bool, bool>;
std::vector<NormOp> NormalisedIteration(const Program& p, int iteration) {
  std::map<TensorId, std::string> name;
  std::map<int, int> count;
  std::map<std::pair<int, std::string>, int> same_label;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      const int idx = count[op.iteration]++;
      const int rank = same_label[{op.iteration, a.label}]++;
      name[a.id] = op.iteration == iteration
                       ? fmt::format("0:{}", idx)
                       : fmt::format("{}:{}#{}", iteration - op.iteration, a.label, rank);
    }
  }
  auto norm = [&](TensorId id) { return name.at(id); };
  std::vector<NormOp> out;
  for (const Op& op : p.ops) {
    if (op.iteration != iteration) continue;
    std::vector<std::string> allocs;
    for (const TensorAlloc& a : op.allocs) {
      allocs.push_back(fmt::format("{}:{}:{}", a.label, a.size_bytes, CategoryName(a.category)));
    }
    std::vector<std::string> frees, rs;
    for (TensorId id : op.frees) frees.push_back(norm(id));
    for (const auto& [id, s] : op.record_streams) rs.push_back(norm(id));
    out.emplace_back(op.name, op.phase, op.micro_batch, op.layer, op.stream, op.duration_us, allocs,
                     frees, rs, op.collective_group, op.synchronize, op.empty_cache);
  }
  return out;
}

// Largest number of distinct micro-batches that hold live activations of transformer layers.
int MaxMicroBatchesInFlight(const Program& p, int iteration) {
  std::map<TensorId, int> owner;  // live layer activation -> micro-batch
  std::map<int, int> per_mb;
  int peak = 0;
  for (const Op& op : p.ops) {
    if (op.iteration != iteration) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kActivations && a.label.rfind("layer", 0) == 0) {
        owner[a.id] = op.micro_batch;
        ++per_mb[op.micro_batch];
      }
    }
    for (TensorId id : op.frees) {
      auto it = owner.find(id);
      if (it == owner.end()) continue;
      if (--per_mb[it->second] == 0) per_mb.erase(it->second);
      owner.erase(it);
    }
    peak = std::max(peak, static_cast<int>(per_mb.size()));
  }
  return peak;
}

TEST_CASE("one layer's forward allocates the saved tensors of docs/training-memory.md in order",
          "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.model.num_hidden_layers = 4;
  s.training.tensor_model_parallel_size = 2;
  s.training.sequence_parallel = true;
  const Program p = Build(s, 0);
  std::vector<std::string> labels;
  for (const Op& op : p.ops) {
    if (op.iteration == 2 && op.phase == Phase::kForward && op.layer == 2) {
      for (const TensorAlloc& a : op.allocs) labels.push_back(a.label);
    }
  }
  // docs/training-memory.md 'Saved tensors of a layer' with RMSNorm (rstd only), flash attention
  // (CUDA LSE), no dropout (no masks), SP with TE (transient all-gathers before QKV and FC1;
  // row-parallel outputs full then reduce-scattered).
  const std::vector<std::string> expected = {
      "layer2.ln1.rstd",  // A2
      "layer2.ln1.out",   // A3
      "layer2.attn.qkv_input_gather",
      "layer2.attn.qkv",          // A4
      "layer2.attn.core_out",     // A5
      "layer2.attn.softmax_lse",  // A6
      "layer2.attn.proj_out_full",
      "layer2.attn.proj_out",
      "layer2.attn.residual",  // A9
      "layer2.ln2.rstd",       // A10
      "layer2.ln2.out",        // A11
      "layer2.mlp.fc1_input_gather",
      "layer2.mlp.fc1_out",  // A12
      "layer2.mlp.act_out",  // A13
      "layer2.mlp.fc2_out_full",
      "layer2.mlp.fc2_out",
      "layer2.mlp.residual",  // layer output = next layer's A1
  };
  CHECK(labels == expected);
}

TEST_CASE("paper setting, unfused attention, t = 1: s·b·h·(34 + 5·a·s/h) per layer", "[workload]") {
  const config::Setup s = testing::PaperGpt();
  const Program p = Build(s, 0);
  // s = 1024, b = 2, h = 1024, a = 16: sbh = 2,097,152; 5·a·s/h = 80.
  // 2,097,152 · (34 + 80) = 239,075,328 bytes (Korthikanti et al. 2022, eq. 1).
  CHECK(Within(static_cast<double>(LayerSavedBytes(p, 2, 0, 1)), 239'075'328.0, 0.01));
}

TEST_CASE("paper setting with TP, no SP: s·b·h·(10 + 24/t + 5·a·s/(h·t))", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.tensor_model_parallel_size = 2;
  const Program p = Build(s, 0);
  // t = 2: 10 + 12 + 40 = 62; 2,097,152 · 62 = 130,023,424 bytes (Korthikanti §4.2.1).
  CHECK(Within(static_cast<double>(LayerSavedBytes(p, 2, 0, 1)), 130'023'424.0, 0.01));
}

TEST_CASE("TP + SP + flash attention: 34·s·b·h/t per layer", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.tensor_model_parallel_size = 2;
  s.training.sequence_parallel = true;
  s.training.use_flash_attn = true;
  const Program p = Build(s, 0);
  // 34 · 2,097,152 / 2 = 35,651,584 bytes (Korthikanti Table 2, SP + selective), plus on this
  // A100 flash-attn 2's own saved output under Transformer Engine (FrameworkFacts::te_flash_attn2:
  // TE FlashAttention.forward returns a [s, b] copy, flash-attn saves its [b, s] output):
  // 2 B · s·b·h/t = 2,097,152 bytes. 37,748,736 bytes in all.
  CHECK(Within(static_cast<double>(LayerSavedBytes(p, 2, 0, 1)), 37'748'736.0, 0.01));

  SECTION("selective recompute of unfused core attention saves the same") {
    s.training.use_flash_attn = false;
    s.training.recompute_granularity = config::RecomputeGranularity::kSelective;
    const Program q = Build(s, 0);
    CHECK(Within(static_cast<double>(LayerSavedBytes(q, 2, 0, 1)), 35'651'584.0, 0.01));
    CheckWellFormed(q);
  }
}

TEST_CASE("gated MLP with SP + flash: s·b·h·(18 + 6·ffn/h)/t less the masks", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.model.num_hidden_layers = 2;
  s.training.seq_length = 1024;
  s.training.tensor_model_parallel_size = 4;
  s.training.sequence_parallel = true;
  const Program p = Build(s, 0);
  // No dropout: 18 - 2 = 16; 6·ffn/h = 6·11008/4096 = 16.125 -> 32.125 · sbh / t with
  // sbh = 1024·1·4096 = 4,194,304: 32.125 · 4,194,304 / 4 = 33,685,504 bytes.
  CHECK(Within(static_cast<double>(LayerSavedBytes(p, 2, 0, 1)), 33'685'504.0, 0.01));
}

TEST_CASE("full recompute keeps 2·s·b·h per checkpointed layer input", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.model.hidden_dropout = 0;
  s.model.attention_dropout = 0;
  s.model.position_embedding_type = config::PositionEmbedding::kRope;
  s.model.num_hidden_layers = 8;
  s.training.recompute_granularity = config::RecomputeGranularity::kFull;
  s.training.recompute_method = config::RecomputeMethod::kUniform;
  s.training.recompute_num_layers = 1;
  // sbh = 2,097,152: each layer output (the next checkpoint's input) is 2·sbh = 4,194,304 bytes.
  const Program p = Build(s, 0);
  CHECK(LayerSavedBytes(p, 2, 0, 3) == 4'194'304);
  CheckWellFormed(p);

  SECTION("per in-flight micro-batch on stage 0 of p = 4, m = 8") {
    s.training.pipeline_model_parallel_size = 4;
    s.training.global_batch_size = 16;  // m = 16 / (b = 2 · d = 1) = 8
    const Program q = Build(s, 0);
    CheckWellFormed(q);
    // At the first backward of iteration 2, stage 0 holds min(p - r, m) = 4 micro-batches, each
    // with 2 checkpoints (the inputs of its 2 layers: embedding output and layer 0 output) of
    // 2·sbh, plus the dataloader's attention mask, which the checkpoints save (b·s² bools =
    // 2 · 1024 · 1024 = 2,097,152; model.h dataloader_attention_mask), plus the int64 tokens
    // (8·s·b = 16 KiB, 0.04% of the total): 4 · (2 · 4,194,304 + 2,097,152) = 41,943,040 bytes.
    std::map<TensorId, Bytes> live;
    Bytes at_first_backward = -1;
    for (const Op& op : q.ops) {
      if (op.iteration == 2 && op.phase == Phase::kBackward && at_first_backward < 0) {
        at_first_backward = 0;
        for (const auto& [id, b] : live) at_first_backward += b;
      }
      for (const TensorAlloc& a : op.allocs) {
        if (a.category == Category::kActivations) live[a.id] = a.size_bytes;
      }
      for (TensorId id : op.frees) live.erase(id);
    }
    CHECK(Within(static_cast<double>(at_first_backward), 41'943'040.0, 0.01));
  }
  SECTION("block method: only the first N layers are checkpointed") {
    s.training.recompute_method = config::RecomputeMethod::kBlock;
    s.training.recompute_num_layers = 2;
    const Program q = Build(s, 0);
    CheckWellFormed(q);
    CHECK(LayerSavedBytes(q, 2, 0, 1) == 4'194'304);
    // Layer 5 keeps its full activations: s·b·h·(34 - 2 masks + 2·a·s/h) with no dropout
    // = 2,097,152 · (32 + 32) = 134,217,728 bytes.
    CHECK(Within(static_cast<double>(LayerSavedBytes(q, 2, 0, 5)), 134'217'728.0, 0.01));
  }
}

TEST_CASE("1F1B: stage r holds min(p - r, m) micro-batches in the Program", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.model.num_hidden_layers = 8;
  s.training.pipeline_model_parallel_size = 4;
  s.training.global_batch_size = 16;  // m = 8
  for (int r = 0; r < 4; ++r) {
    const Program p = Build(s, r);
    CheckWellFormed(p);
    CHECK(MaxMicroBatchesInFlight(p, 2) == 4 - r);
  }
  s.training.global_batch_size = 4;  // m = 2 < p
  CHECK(MaxMicroBatchesInFlight(Build(s, 0), 2) == 2);
}

TEST_CASE("a model chunk keeps its last received input and that input's grad across the step",
          "[workload]") {
  // schedules.py forward_step -> set_input_tensor keeps the received input in the chunk's
  // TransformerBlock until the chunk's next forward; backward_step's retain_grad leaves its grad
  // on it as .grad. PaperGpt, bf16, no SP: the input is
  // [s, b, h] = 1024 · 2 · 1024 · 2 B = 4 MiB.
  config::Setup s = testing::PaperGpt();
  s.model.num_hidden_layers = 8;
  s.training.pipeline_model_parallel_size = 4;
  s.training.global_batch_size = 16;  // m = 8
  const Bytes input = 1024 * 2 * 1024 * 2;
  for (int r = 0; r < 4; ++r) {
    INFO("stage " << r);
    const Program p = Build(s, r);
    CheckWellFormed(p);
    const auto net1 = NetByCategory(p, 1);
    if (r == 0) {  // the first stage's input is the embedding output, not held (input_tensor None)
      CHECK(net1.count(Category::kCommunication) == 0);
      CHECK(net1.count(Category::kTemporaries) == 0);
    } else {  // iteration 1 leaves one received input and its grad behind
      CHECK(net1.at(Category::kCommunication) == input);
      CHECK(net1.at(Category::kTemporaries) == input);
    }
    CHECK(NetByCategory(p, 2).empty());  // each later iteration swaps in its own pair
    // The pair is resident during the optimizer step and dropped by the next iteration's first
    // forward (its set_input_tensor), after that forward's receive.
    std::map<TensorId, std::string> recv;
    for (const Op& op : p.ops) {
      for (const TensorAlloc& a : op.allocs)
        if (a.label == "p2p.recv_forward" && op.iteration == 1) recv[a.id] = op.name;
      for (TensorId id : op.frees) {
        if (recv.count(id) == 0 || op.iteration != 2) continue;
        CHECK(op.name == "p2p.set_input_tensor");
        CHECK(op.phase == Phase::kForward);
        CHECK(op.micro_batch == 0);
      }
    }
  }
  // Interleaved, 8 layers, p = 4, one layer per virtual stage: v = 2 chunks per stage. Every
  // chunk keeps its own pair, except stage 0's chunk 0, whose input is the embedding output:
  // v - [r = 0] pairs.
  s.training.num_layers_per_virtual_pipeline_stage = 1;
  for (int r = 0; r < 4; ++r) {
    INFO("interleaved stage " << r);
    const Program p = Build(s, r);
    CheckWellFormed(p);
    const auto net1 = NetByCategory(p, 1);
    const Bytes pairs = r == 0 ? 1 : 2;
    CHECK(net1.at(Category::kCommunication) == pairs * input);
    CHECK(net1.at(Category::kTemporaries) == pairs * input);
    CHECK(NetByCategory(p, 2).empty());
  }
}

TEST_CASE("forward and backward GEMMs each get a cuBLAS workspace (one per thread's handle)",
          "[workload]") {
  // CublasHandlePool.cpp: one workspace per (handle, stream), one handle per thread; the autograd
  // engine runs CUDA backward on its own thread. A100 (sm 80) default ":4096:2:16:8":
  // 2 · 4096 KiB + 8 · 16 KiB = 8,519,680 B each; created once, never freed.
  config::Setup s = testing::PaperGpt();
  const Program p = Build(s, 0);
  CheckWellFormed(p);
  std::map<std::string, std::vector<Phase>> made;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label.rfind("workspace.cublas", 0) != 0) continue;
      CHECK(a.size_bytes == 8'519'680);
      made[a.label].push_back(op.phase);
    }
  }
  CHECK(made == std::map<std::string, std::vector<Phase>>{
                    {"workspace.cublas", {Phase::kForward}},
                    {"workspace.cublas_autograd", {Phase::kBackward}}});
}

TEST_CASE("the autograd thread's cuBLAS workspace appears at its first PyTorch GEMM",
          "[workload]") {
  // Under Transformer Engine the layers' GEMMs use TE's own workspace; PyTorch (cuBLAS) GEMMs in
  // backward are: every linear of the local implementation (the first backward op of a layer is
  // mlp.fc2_bwd), unfused attention's bmm (attn.context_bwd) and the output layer on the last
  // stage (output_layer_bwd). Flash attention has none. PaperGpt, p = 2, stage 0 (no output layer)
  // and stage 1 (output layer first in backward).
  struct Row {
    const char* impl;
    bool flash;
    int rank;
    const char* op;  // where workspace.cublas_autograd is made; "" = never
  };
  auto row = GENERATE(Row{"local", true, 0, "mlp.fc2_bwd"}, Row{"local", false, 0, "mlp.fc2_bwd"},
                      Row{"transformer_engine", false, 0, "attn.context_bwd"},
                      Row{"transformer_engine", true, 0, ""},
                      Row{"transformer_engine", true, 1, "output_layer_bwd"});
  config::Setup s = testing::PaperGpt();
  s.training.pipeline_model_parallel_size = 2;
  s.training.transformer_impl = row.impl;
  s.training.use_flash_attn = row.flash;
  INFO(row.impl << " flash " << row.flash << " stage " << row.rank);
  const Program p = Build(s, row.rank);
  std::string made;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.label == "workspace.cublas_autograd") made += op.name;
    }
  }
  CHECK(made == row.op);
}

TEST_CASE("static bytes match the closed forms", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.training.tensor_model_parallel_size = 2;
  const double psi = 3'369'340'928.0;  // derived in model_test.cc
  SECTION("bf16, non-distributed: 18 B/param") {
    const StaticSizes st = ComputeStaticSizes(s, 0);
    CHECK(st.parameter_count == 3'369'340'928);
    CHECK(static_cast<double>(st.total_bytes()) == 18 * psi);
    CHECK(st.gradient_bytes == 4 * st.parameter_count);
  }
  SECTION("bf16, distributed over d = 4: 6 + 12/d B/param plus padding") {
    s.training.use_distributed_optimizer = true;
    s.training.data_parallel_size = 4;
    const StaticSizes st = ComputeStaticSizes(s, 0);
    // The distributed optimizer's padding (param_and_grad_buffer.py), derived for this layout:
    // every param's numel is a multiple of 64 (the per-param start alignment) -- embedding and
    // output 16000·4096, qkv 6144·4096, proj 4096·2048, fc1 11008·4096, fc2 4096·5504, norms 4096
    // -- so no param start moves; one bucket (no overlap_grad_reduce) of Ψ = 3,369,340,928 = 128 ×
    // 26,322,976 elements is already a multiple of lcm(d = 4, 128) = 128. Padded numel = Ψ, so the
    // static bytes are exactly (6 + 12/4) · Ψ = 9 · 3,369,340,928 = 30,324,068,352, and each rank's
    // main-param shard is Ψ / 4 = 842,335,232 elements.
    CHECK(st.total_bytes() == 30'324'068'352);
    CHECK(static_cast<double>(st.total_bytes()) == 9 * psi);
    CHECK(st.main_param_count == 842'335'232);
    CHECK(st.parameter_bytes == 2 * 3'369'340'928);
    CHECK(st.gradient_bytes == 4 * 3'369'340'928);
  }
  SECTION("fp32: 16 B/param") {
    s.training.precision = config::Precision::kFp32;
    const StaticSizes st = ComputeStaticSizes(s, 0);
    CHECK(static_cast<double>(st.total_bytes()) == 16 * psi);
    CHECK(st.main_param_bytes == 0);
  }
  SECTION("fp16 with fp16 grads: 20 B/param including the fp32 grad copy") {
    s.training.precision = config::Precision::kFp16;
    s.training.accumulate_allreduce_grads_in_fp32 = false;
    const StaticSizes st = ComputeStaticSizes(s, 0);
    CHECK(static_cast<double>(st.total_bytes()) == 20 * psi);
  }
}

TEST_CASE("init phase leaves exactly the static buffers", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.model.num_hidden_layers = 4;
  s.training.tensor_model_parallel_size = 2;
  for (const bool dist : {false, true}) {
    s.training.use_distributed_optimizer = dist;
    s.training.data_parallel_size = dist ? 4 : 1;
    const Program p = Build(s, 0);
    const StaticSizes st = ComputeStaticSizes(s, 0);
    const auto net = NetByCategory(p, 0);
    INFO("distributed optimizer " << dist);
    CHECK(net.at(Category::kParameters) == st.parameter_bytes);
    CHECK(net.at(Category::kGradients) == st.gradient_bytes);
    CHECK(net.at(Category::kMainParameters) == st.main_param_bytes);
    CHECK(net.at(Category::kOther) == 4);  // _scale_one [1] fp32
    CHECK(net.count(Category::kTemporaries) == 0);
    CHECK(net.count(Category::kOptimizerStates) == 0);
    // One allocation per parameter tensor: 4 layers · 6 (ln1, qkv, proj, ln2, fc1, fc2) + word
    // embedding, final norm, output layer.
    int param_allocs = 0;
    for (const Op& op : p.ops) {
      if (op.iteration != 0) break;
      for (const TensorAlloc& a : op.allocs) {
        param_allocs += a.category == Category::kParameters && a.label.rfind("ddp.", 0) != 0;
      }
    }
    CHECK(param_allocs == 4 * 6 + 3);
    CheckWellFormed(p);
  }
}

TEST_CASE("Adam state appears lazily in iteration 1's step only", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.model.num_hidden_layers = 4;
  s.training.tensor_model_parallel_size = 2;
  s.training.sequence_parallel = true;
  s.training.use_distributed_optimizer = true;
  s.training.data_parallel_size = 4;
  const Program p = Build(s, 0);
  CheckWellFormed(p);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  std::map<int, Bytes> state_by_iteration;
  std::map<TensorId, Bytes> live_activations;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kOptimizerStates) {
        CHECK(op.phase == Phase::kOptimizerStep);
        CHECK(live_activations.empty());  // after the iteration's activations were freed
        state_by_iteration[op.iteration] += a.size_bytes;
      }
      if (a.category == Category::kActivations) live_activations[a.id] = a.size_bytes;
    }
    for (TensorId id : op.frees) live_activations.erase(id);
  }
  REQUIRE(state_by_iteration.size() == 1);
  // exp_avg + exp_avg_sq, fp32: 8 bytes per main-param (shard) element.
  CHECK(state_by_iteration.at(1) == 8 * st.main_param_count);
  CHECK(st.optimizer_state_bytes == 8 * st.main_param_count);

  // End minus start of iteration 1 = state + first-use workspaces (H100: sm >= 90):
  // TE cuBLASLt 32 MiB + cuBLAS 8·4 MiB = 32 MiB twice (the output layer's forward GEMM on the
  // main thread, its backward GEMM on the autograd thread: one workspace per handle) + "mpu" for
  // the output layer's SP all-gather [s, b, h] bf16 = 2·4096·4096 = 32 MiB; 4 × 32 = 128 MiB.
  // Plus Transformer Engine's cached dummy wgrads (current releases), one per weight shape, bf16,
  // t = 2: qkv [(4096 + 2·4096)/2, 4096] = 48 MiB, proj [4096, 2048] = 16 MiB, fc1 [2·11008/2,
  // 4096] = 86 MiB, fc2 [4096, 11008/2] = 43 MiB, output layer [32000/2, 4096] = 125 MiB: 318 MiB.
  const auto net1 = NetByCategory(p, 1);
  CHECK(net1 == std::map<Category, Bytes>{{Category::kOptimizerStates, 8 * st.main_param_count},
                                          {Category::kWorkspace, (128 + 318) * kMiB}});
  CHECK(NetByCategory(p, 2).empty());
  CHECK(NetByCategory(p, 3).empty());
}

TEST_CASE("foreach Adam allocates a sqrt list per param group, freed in the same op",
          "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.optimizer_impl = config::OptimizerImpl::kForeach;
  const Program p = Build(s, 0);
  CheckWellFormed(p);
  int update_ops = 0;
  for (const Op& op : p.ops) {
    if (op.name.find(".update") == std::string::npos || op.iteration != 2) continue;
    ++update_ops;
    CHECK(!op.allocs.empty());
    CHECK(op.frees.size() == op.allocs.size());
  }
  CHECK(update_ops == 2);  // weight-decay and no-weight-decay groups
}

TEST_CASE("fp16 grads: fp32 grad copy made at step, dropped at the next zero_grad", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.precision = config::Precision::kFp16;
  s.training.accumulate_allreduce_grads_in_fp32 = false;
  const Program p = Build(s, 0);
  CheckWellFormed(p);
  const StaticSizes st = ComputeStaticSizes(s, 0);
  CHECK(NetByCategory(p, 1).at(Category::kGradients) == 4 * st.parameter_count);
  CHECK(NetByCategory(p, 2).count(Category::kGradients) == 0);
}

TEST_CASE("every iteration from 2 on issues the same request stream", "[workload]") {
  struct Row {
    const char* what;
    int p;
    int r;
    int vpp;
    bool dist;
    bool overlap;
  };
  auto row = GENERATE(Row{"p=1", 1, 0, 0, false, false}, Row{"1F1B first", 4, 0, 0, true, true},
                      Row{"1F1B middle", 4, 1, 0, true, false},
                      Row{"1F1B last", 4, 3, 0, false, false}, Row{"VPP", 2, 1, 2, true, false});
  config::Setup s = testing::PaperGpt();
  s.model.num_hidden_layers = 8;
  s.training.pipeline_model_parallel_size = row.p;
  s.training.num_layers_per_virtual_pipeline_stage = row.vpp;
  s.training.use_distributed_optimizer = row.dist;
  s.training.overlap_grad_reduce = row.overlap;
  s.training.data_parallel_size = 2;
  s.training.global_batch_size = 16;
  s.training.train_iters = 4;
  INFO(row.what);
  const Program p = Build(s, row.r);
  CheckWellFormed(p);
  CHECK(NormalisedIteration(p, 2) == NormalisedIteration(p, 3));
  CHECK(NormalisedIteration(p, 3) == NormalisedIteration(p, 4));
  CHECK(NormalisedIteration(p, 1) != NormalisedIteration(p, 2));
}

TEST_CASE("configurations build well-formed Programs", "[workload]") {
  struct Row {
    const char* what;
    int t, p, r, vpp;
    bool sp, flash, dist, npu;
    config::Precision precision;
    config::RecomputeGranularity recompute;
    config::OptimizerKind optimizer;
    config::OptimizerImpl impl;
    const char* impl_name;
  };
  using P = config::Precision;
  using R = config::RecomputeGranularity;
  using O = config::OptimizerKind;
  using I = config::OptimizerImpl;
  auto row = GENERATE(Row{"tp sp flash", 2, 1, 0, 0, true, true, false, false, P::kBf16, R::kNone,
                          O::kAdam, I::kFused, "transformer_engine"},
                      Row{"local sp unfused", 2, 1, 0, 0, true, false, false, false, P::kBf16,
                          R::kNone, O::kAdam, I::kFused, "local"},
                      Row{"npu", 2, 2, 1, 0, true, true, true, true, P::kBf16, R::kNone, O::kAdam,
                          I::kFused, "local"},
                      Row{"fp32 sgd", 1, 2, 0, 0, false, true, false, false, P::kFp32, R::kNone,
                          O::kSgd, I::kForeach, "transformer_engine"},
                      Row{"fp16 dist", 2, 2, 1, 0, false, false, true, false, P::kFp16,
                          R::kSelective, O::kAdam, I::kForeach, "transformer_engine"},
                      Row{"vpp full recompute", 2, 2, 0, 2, true, true, true, false, P::kBf16,
                          R::kFull, O::kAdam, I::kFused, "transformer_engine"},
                      Row{"vpp last", 1, 2, 1, 1, false, false, false, false, P::kBf16,
                          R::kSelective, O::kAdam, I::kFused, "transformer_engine"});
  config::Setup s = testing::PaperGpt();
  s.model.num_hidden_layers = 8;
  s.training.tensor_model_parallel_size = row.t;
  s.training.pipeline_model_parallel_size = row.p;
  s.training.num_layers_per_virtual_pipeline_stage = row.vpp;
  s.training.sequence_parallel = row.sp;
  s.training.use_flash_attn = row.flash;
  s.training.use_distributed_optimizer = row.dist;
  s.training.data_parallel_size = 2;
  s.training.global_batch_size = 8;
  s.training.precision = row.precision;
  s.training.recompute_granularity = row.recompute;
  s.training.optimizer = row.optimizer;
  s.training.optimizer_impl = row.impl;
  s.training.transformer_impl = row.impl_name;
  if (row.npu) s.device.allocator_backend = alloc::Backend::kNpu;
  s.model.qk_layernorm = row.t == 2;                 // Qwen3-style q/k norms on the TP rows
  s.model.num_key_value_heads = row.flash ? 4 : 16;  // GQA on the flash rows
  INFO(row.what);
  const Program p = Build(s, row.r);
  CheckWellFormed(p);
  CHECK(p == Build(s, row.r));  // deterministic
  // Every layer of this rank runs forward once per micro-batch in each iteration.
  const ModelDims d = ComputeDims(s);
  std::map<int, int> layer_forwards;
  for (const Op& op : p.ops) {
    if (op.iteration == 2 && op.phase == Phase::kForward && op.name == "mlp.bda") {
      ++layer_forwards[op.layer];
    }
  }
  CHECK(layer_forwards.size() == static_cast<size_t>(d.v * d.Lc));
  for (const auto& [layer, n] : layer_forwards) CHECK(n == d.m);
  // Static sizes per category after init still match.
  const StaticSizes st = ComputeStaticSizes(s, row.r);
  CHECK(NetByCategory(p, 0).at(Category::kParameters) == st.parameter_bytes);
}

TEST_CASE("collectives and record_stream tags", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.model.tie_word_embeddings = true;
  s.training.tensor_model_parallel_size = 2;
  s.training.pipeline_model_parallel_size = 2;
  s.training.data_parallel_size = 2;
  s.training.global_batch_size = 8;
  std::set<std::string> groups0, groups1;
  for (int r = 0; r < 2; ++r) {
    const Program p = Build(s, r);
    for (const Op& op : p.ops) {
      if (!op.collective_group.empty()) (r == 0 ? groups0 : groups1).insert(op.collective_group);
      if (op.name.rfind("p2p.recv_", 0) == 0 || op.name.rfind("p2p.send_", 0) == 0) {
        CHECK(op.collective_group == "pp");
        CHECK(op.stream == kCommStream);
        // send_forward_recv_backward / send_backward_recv_forward record both tensors.
        const bool both = op.name.find("send_") != std::string::npos &&
                          op.name.find("_recv_") != std::string::npos;
        CHECK(op.record_streams.size() == (both ? 2u : 1u));
      }
      if (op.name == "ddp.grad_all_reduce") CHECK(op.stream == kCommStream);
    }
  }
  // Megatron's process-group names (parallel_state.py get_nccl_options): the DDP's "dp_cp", the
  // tied embedding's "embd", the grad-stats "mp" (no distributed optimizer), "pp", "tp", and the
  // default group "world" (pretrain's start-time all-reduce). PaperGpt states no core release
  // (current), so the loss is reduced over "dp_cp" after the schedule, not over "dp".
  const std::set<std::string> megatron = {"dp_cp", "embd", "mp", "pp", "tp", "world"};
  CHECK(groups0 == megatron);
  CHECK(groups1 == megatron);
  // Core 0.12: the last stage's loss_func all-reduces the reporting loss over "dp" as well.
  s.training.megatron_core_version = {0, 12};
  std::set<std::string> last;
  for (const Op& op : Build(s, 1).ops) {
    if (!op.collective_group.empty()) last.insert(op.collective_group);
  }
  CHECK(last.count("dp") == 1);
  std::set<std::string> first;
  for (const Op& op : Build(s, 0).ops) {
    if (!op.collective_group.empty()) first.insert(op.collective_group);
  }
  CHECK(first.count("dp") == 0);
  // The distributed optimizer reduces grad stats over the whole world (distrib_optimizer.py
  // returns None, the default group): t·p·d = 2·2·2 = 8 ranks, and "mp" is not used.
  s.training.use_distributed_optimizer = true;
  int norm_ops = 0;
  for (const Op& op : Build(s, 0).ops) {
    CHECK(op.collective_group != "mp");
    if (op.name != "optim.grad_norm") continue;
    ++norm_ops;
    CHECK(op.collective_group == "world");
    CHECK(op.collective_ranks == 8);
  }
  CHECK(norm_ops >= 1);
  // Context parallelism 2: the core attention's K/V exchange runs on Megatron's "cp" group of
  // cp = 2 ranks (Transformer Engine's AttnFuncWithCPAndKVP2P on get_context_parallel_group()).
  s.training.context_parallel_size = 2;
  s.training.data_parallel_size = 1;
  s.training.global_batch_size = 4;
  bool cp_seen = false;
  for (const Op& op : Build(s, 0).ops) {
    if (op.collective_group != "cp") continue;
    cp_seen = true;
    CHECK(op.collective_ranks == 2);
    CHECK(op.name == "attn.cp_exchange");
  }
  CHECK(cp_seen);
}

// --log-params-norm: calc_params_l2_norm (megatron/training/utils.py) lists an fp32 copy of each
// local bf16 parameter before core_v0.11.0, all alive together after the step; the last stage's
// tied output weight is `shared` and skipped. Expected: 4 B per element of every parameter the
// rank's init allocated (2 B each in bf16), less the last stage's output weight.
TEST_CASE("log_params_norm: fp32 copies of the parameters after each step, by release",
          "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.model.tie_word_embeddings = true;
  s.training.precision = config::Precision::kBf16;
  s.training.pipeline_model_parallel_size = 2;
  s.training.log_params_norm = true;
  s.training.megatron_core_version = {0, 10};
  s.training.train_iters = 1;
  const auto copied = [](const Program& p) {
    Bytes params = 0, copies = 0;
    for (const Op& op : p.ops) {
      for (const TensorAlloc& a : op.allocs) {
        if (op.name.rfind("init.model.", 0) == 0 && a.category == Category::kParameters &&
            a.label != "output_layer.weight") {
          params += a.size_bytes;
        }
        if (a.label == "log.params_fp32") copies += a.size_bytes;
      }
    }
    return std::pair{params, copies};
  };
  for (int r = 0; r < 2; ++r) {
    const auto [params, copies] = copied(Build(s, r));
    CHECK(params > 0);
    CHECK(copies == 2 * params);
  }
  // From core 0.11 a dense parameter's main_param is used: no copy. fp16: param.data as is.
  s.training.megatron_core_version = {0, 11};
  CHECK(copied(Build(s, 0)).second == 0);
  s.training.megatron_core_version = {0, 10};
  s.training.precision = config::Precision::kFp16;
  CHECK(copied(Build(s, 0)).second == 0);
}

TEST_CASE("closed-form estimate follows Megatron's formulas", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.tensor_model_parallel_size = 2;
  s.training.sequence_parallel = true;
  s.training.use_flash_attn = true;
  const ClosedFormEstimate e = ComputeClosedFormEstimate(s, 0);
  // Per layer 34·sbh/t = 35,651,584 (Korthikanti Table 2).
  CHECK(e.activation_bytes_per_layer == 35'651'584);
  CHECK(e.bytes_per_parameter == 18);
  // Params (theoretical_memory_usage.py): layer 2h²·(2 + 4 + 2/h) = 12h² + 4h with h = 1024 is
  // 12,587,008; ×4 layers = 50,348,032; + embedding V·h with V = ceil(50257/256)·256 = 50432:
  // 51,642,368; + final norm 1024 -> 101,991,424; / t = 50,995,712.
  CHECK(e.parameters_on_rank == Approx(50'995'712.0));
}

}  // namespace
}  // namespace memsim::workload

namespace memsim::workload {
namespace {

// Peak over the iteration of live activation bytes of transformer layers ("layerN.*").
Bytes PeakLayerActivationBytes(const Program& p, int iteration) {
  std::map<TensorId, Bytes> live;
  Bytes sum = 0, peak = 0;
  for (const Op& op : p.ops) {
    if (op.iteration != iteration) continue;
    for (const TensorAlloc& a : op.allocs) {
      if (a.category == Category::kActivations && a.label.rfind("layer", 0) == 0) {
        live[a.id] = a.size_bytes;
        sum += a.size_bytes;
      }
    }
    peak = std::max(peak, sum);
    for (TensorId id : op.frees) {
      auto it = live.find(id);
      if (it == live.end()) continue;
      sum -= it->second;
      live.erase(it);
    }
  }
  return peak;
}

TEST_CASE("interleaved stage 0 holds L·(1 + (p-1)/(p·v)) layers' activations", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.model.num_hidden_layers = 16;
  s.training.pipeline_model_parallel_size = 4;
  s.training.num_layers_per_virtual_pipeline_stage = 2;  // v = 16 / (4·2) = 2
  s.training.global_batch_size = 16;                     // m = 8
  const Program p = Build(s, 0);
  const Bytes per_layer = LayerSavedBytes(p, 2, 0, 1);
  // Korthikanti §4.2.3: 16 · (1 + 3/8) = 22 layers. Each unit's last layer output is sent and
  // freed (2·sbh of the 114·sbh a layer saves), hence the 2% tolerance.
  CHECK(Within(static_cast<double>(PeakLayerActivationBytes(p, 2)), 22.0 * per_layer, 0.02));
  // Non-interleaved, the same stage holds p = 4 micro-batches of L/p = 4 layers = 16 layers.
  s.training.num_layers_per_virtual_pipeline_stage = 0;
  const Program q = Build(s, 0);
  CHECK(Within(static_cast<double>(PeakLayerActivationBytes(q, 2)), 16.0 * per_layer, 0.02));
}

TEST_CASE("llama2-70b stage at TP8 PP8: 18 B/param", "[workload]") {
  config::Setup s = testing::Llama2_70b();
  s.training.tensor_model_parallel_size = 8;
  s.training.pipeline_model_parallel_size = 8;
  // Ψ = 1,069,711,360 for a middle stage (model_test.cc); 18 · Ψ = 19,254,804,480 bytes.
  const StaticSizes st = ComputeStaticSizes(s, 3);
  CHECK(st.parameter_count == 1'069'711'360);
  CHECK(st.total_bytes() == 19'254'804'480);
}

}  // namespace
}  // namespace memsim::workload

namespace memsim::workload {
namespace {

TEST_CASE("SGD: momentum buffers lazily in iteration 1, none without momentum", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.optimizer = config::OptimizerKind::kSgd;
  s.training.optimizer_impl = config::OptimizerImpl::kForeach;
  const StaticSizes st = ComputeStaticSizes(s, 0);
  // One fp32 momentum buffer per main param: 4 bytes per element.
  CHECK(st.optimizer_state_bytes == 4 * st.main_param_count);
  Program p = Build(s, 0);
  CheckWellFormed(p);
  CHECK(NetByCategory(p, 1).at(Category::kOptimizerStates) == 4 * st.main_param_count);
  CHECK(NetByCategory(p, 2).count(Category::kOptimizerStates) == 0);
  s.training.sgd_momentum = 0;
  CHECK(ComputeStaticSizes(s, 0).optimizer_state_bytes == 0);
  p = Build(s, 0);
  CHECK(NetByCategory(p, 1).count(Category::kOptimizerStates) == 0);
}

}  // namespace
}  // namespace memsim::workload
