// The shapes one pipeline rank works with: resolved dimensions (docs/training-memory.md,
// 'Notation'), the parameter tensors it holds in construction order ('Parameters'), and the
// contiguous buffer layout of the Megatron wrappers with the distributed-optimizer shard
// ('Megatron DDP buffers', 'Main parameters'). Pure functions of a Setup;
// used by Build (build.h) and by the closed forms of ComputeStaticSizes. Element counts are
// int64 numbers of elements, sizes in bytes. ModelDims holds shapes, parallel sizes and element
// sizes only; what the framework's code does at its release on this device is FrameworkFacts
// (facts.h). An uneven pipeline split (--decoder-first/last-pipeline-num-layers) gives each rank
// its own layer count (ModelDims::StageLayers). Not modelled: ZeRO-2/3 outside Megatron-FSDP,
// Megatron-FSDP's optim_grads_params, an uneven split with the interleaved schedule or a custom
// --pipeline-model-parallel-layout (config/ rejects those). Megatron-FSDP's buffers:
// LayoutGradBuffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::workload {

// docs/training-memory.md 'Notation', for one rank. Sizes per TP rank where the framework splits.
struct ModelDims {
  std::int64_t s = 0;              // sequence length per rank (seq_length / cp)
  std::int64_t b = 0;              // micro-batch size
  std::int64_t T = 0;              // s·b tokens per micro-batch
  std::int64_t h = 0;              // hidden size
  std::int64_t a = 0;              // attention heads
  std::int64_t g = 0;              // query groups (KV heads)
  std::int64_t dh = 0;             // head dim (kv_channels)
  std::int64_t q = 0;              // a·dh (query projection width)
  std::int64_t kv = 0;             // g·dh
  std::int64_t ffn = 0;            // FFN hidden size
  std::int64_t gamma = 1;          // 2 for a gated MLP (SwiGLU), else 1
  std::int64_t V = 0;              // padded vocab: ceil(V_raw / (div·t))·div·t (Megatron
                                   // training/tokenizer `_vocab_size_with_padding`)
  std::int64_t max_positions = 0;  // learned position table rows
  int L = 0;                       // total transformer layers
  int t = 1, p = 1, d = 1, cp = 1;
  int dp_cp = 1;           // d·cp: the DDP / distributed-optimizer group
                           // (parallel_state data-parallel group with_context_parallel)
  int v = 1;               // model chunks per rank (VPP), 1 without interleaving
  int Lc = 0;              // layers per model chunk (L/p without VPP; see StageLayers)
  // Uneven pipeline split (config::StageLayerCounts; no VPP): the layers of each pipeline rank;
  // empty for an even split, where every rank has Lc per chunk.
  std::vector<int> stage_layers;
  int m = 1;               // micro-batches per iteration per DP rank = global / (b·d)
  int sigma = 1;           // t with sequence parallelism, else 1
  bool sp = false;         // sequence parallel and t > 1
  Bytes act_bytes = 2;     // B_a: bytes of one activation element
  Bytes param_bytes = 2;   // bytes of one model parameter element
  Bytes grad_bytes = 4;    // bytes of one DDP grad-buffer element
  bool mixed = true;       // 16-bit params with fp32 master copies (fp16/bf16)
  // Plain PyTorch under autocast to a dtype other than the weights': linears cast their weights
  // (kernels.h CastWeight) and weight grads are cast back (never under Megatron).
  bool weight_cast = false;
  // Transformers BERT / RoBERTa under autocast over wider weights (fp16 or bf16 autocast, fp32
  // weights): the tensors autocast leaves in the weights' dtype are wide_bytes, not act_bytes:
  // LayerNorm inputs and outputs (aten/src/ATen/autocast_mode.cpp: layer_norm in the fp32 list),
  // the residual sums (an fp16 branch + an fp32 residual promotes to fp32: modeling_bert.py
  // BertSelfOutput / BertOutput.forward), the masked attention scores, softmax probabilities and
  // their dropout (the additive mask is in the model's dtype: modeling_utils.py
  // get_extended_attention_mask). cast_inputs: each nn.Linear / matmul fed such a tensor saves a
  // fresh autocast copy of it (autocast caches casts of leaf weights only: cached_cast in
  // autocast_mode.h). Elsewhere wide_bytes = act_bytes and cast_inputs is false.
  Bytes wide_bytes = 2;
  bool cast_inputs = false;
  bool layernorm = false;  // LayerNorm (mean + rstd, weight + bias) vs RMSNorm
  bool hidden_dropout = false;
  bool attention_dropout = false;
  bool tied = false;
  // Mixture of experts (modules/moe.h; Megatron-core megatron/core/transformer/moe/). 0 experts:
  // a dense model.
  int experts = 0;                // E: routed experts of a MoE layer
  int topk = 1;                   // k: experts per token
  std::int64_t ffn_e = 0;         // a routed expert's FFN width (moe_ffn_hidden_size)
  std::int64_t ffn_shared = 0;    // shared experts' total width; 0 = none
  bool shared_gate = false;       // a [1, h] shared-expert gate (Qwen2-MoE)
  std::vector<bool> moe_layers;   // by global layer: an MoE layer (empty: every layer)
  int ep = 1;                     // expert parallel size
  int etp = 1;                    // expert tensor parallel size
  int edp = 1;                    // expert data-parallel size: t·d·cp / (ep·etp)
  bool alltoall = false;          // the alltoall token dispatcher (else allgather)
  double capacity_factor = 0;     // 0 = dropless
  bool pad_to_capacity = false;   // moe_pad_expert_input_to_capacity
  bool grouped_gemm = false;      // TEGroupedMLP (else SequentialMLP)
  bool permute_fusion = false;    // TE fused permute / unpermute kernels
  bool aux_loss = false;          // moe_aux_loss_coeff > 0
  // --moe-router-pre-softmax: the fp32 softmax over all E logits comes before the top-k
  // (moe_utils.py topk_softmax_with_capacity, core 0.9-0.12; topk_routing_with_score_function
  // since), so SoftmaxBackward saves [n, E] fp32 rather than [n, k]. Until core 0.17 the scores
  // are cast back to the logits' dtype before the top-k (a [n, E] copy); from #3673 (2026-04,
  // first in core 0.18) the top-k runs on the fp32 scores.
  bool router_pre_softmax = false;
  double imbalance = 1.0;         // the rank receives imbalance × the mean routed tokens
  // The layers of one model chunk on pipeline rank r: Lc, or stage_layers[r].
  int StageLayers(int r) const { return stage_layers.empty() ? Lc : stage_layers[r]; }
  // The global index of chunk `chunk`'s first layer on rank r (Megatron-core
  // get_transformer_layer_offset): chunk·p·Lc + r·Lc, or the layers of the ranks before r.
  int FirstLayer(int chunk, int r) const;
  // A global layer's index within its model chunk (the position RecomputeRuns counts in).
  int IndexInChunk(int layer) const;
  // The layers of the model chunk holding a global layer (Lc, or its stage's count).
  int ChunkLayersAt(int layer) const;
  bool IsMoeLayer(int layer) const {
    return experts > 1 && (moe_layers.empty() || moe_layers[layer]);
  }
};

// REQUIRES: a Setup that config/ validated (positive sizes, divisibility of heads, layers and
// batch). Violations are bugs (MEMSIM_CHECK), never input errors.
ModelDims ComputeDims(const config::Setup& setup);

// One parameter tensor of this rank, in module construction order (Megatron-core's modules register
// them as they are built: docs/training-memory.md, 'Start-up order').
struct ParamTensor {
  std::string name;  // e.g. "layer3.attn.qkv.weight", "embedding.word_embeddings.weight"
  std::int64_t numel = 0;
  std::int64_t row_numel = 1;    // elements of shape[1:] (columns of a 2-D weight; 1 for 1-D)
  int chunk = 0;                 // model chunk (VPP) that owns it
  int layer = -1;                // global transformer layer, -1 for embedding / final norm / output
  bool no_weight_decay = false;  // 1-D: biases and norm weights (Megatron `_get_param_groups`)
  bool shared_embedding = false;   // tied word embedding / output weight with p > 1
  bool sequence_parallel = false;  // replicated over TP and all-reduced with SP (norms, row biases)
  // An expert parameter (routed experts of a MoE layer): in the expert-parallel buffers, its
  // gradient reduced and its optimizer state sharded over the expert data-parallel group
  // (megatron/core/distributed/distributed_data_parallel.py, `allreduce` false).
  bool expert = false;
  // PEFT (hf_peft.h): a frozen parameter gets no .grad and no optimizer state; storage_bytes,
  // when > 0, replaces numel × param_bytes (a 4-bit weight with its quantisation state).
  bool frozen = false;
  Bytes storage_bytes = 0;
};

ParamTensor MakeParam(std::string name, std::int64_t numel, std::int64_t row_numel, int chunk,
                      int layer, bool no_weight_decay, bool sequence_parallel);

// The rank's parameter tensors, chunk by chunk, in construction order: embedding (first
// stage), each layer (ln1, qkv, [q/k norm], proj, ln2, fc1, fc2, with biases), final norm and
// output layer (last stage). Sources: Megatron-core `gpt_model.py` GPTModel.__init__,
// `transformer_layer.py`, TE spec `gpt_layer_specs.py`.
std::vector<ParamTensor> StageParams(const config::Setup& setup, int pipeline_rank);
// The same with the layer made of `layer`'s modules.
class DecoderLayer;
std::vector<ParamTensor> StageParams(const config::Setup& setup, int pipeline_rank,
                                     const DecoderLayer& layer);

// One DDP `_ParamAndGradBuffer` (one per model chunk; all params share one dtype pair).
struct GradBuffer {
  int chunk = 0;
  std::int64_t numel_padded = 0;  // elements of param_data / grad_data
  struct Entry {
    int param = 0;  // index into StageParams
    std::int64_t start = 0, end = 0;
    int bucket = 0;
  };
  std::vector<Entry> entries;  // DDP: reverse registration order (≈ backward order);
                               // Megatron-FSDP: registration order
  std::vector<std::pair<std::int64_t, std::int64_t>> buckets;  // [start, end) in elements
  bool expert = false;  // holds the expert parameters (sharded over the expert-DP group)
  // Ranks the buffer's buckets are reduced and sharded over: d·cp, or the expert-DP size.
  int ShardRanks(const ModelDims& d) const { return expert ? d.edp : d.dp_cp; }
};

// How a Megatron wrapper lays its parameters out in contiguous buffers and buckets; each
// wrapper states its own rules (ddp.cc, megatron_fsdp.cc).
struct BucketRules {
  bool registration_order = false;  // walk params in construction order (else reversed)
  std::int64_t start_align = 1;     // each param start rounded up to this many elements
  // Bucket ends: rounded up to a multiple of end_align; with pad_to_row_widths, the bucket's
  // length rounded up to end_align × lcm(row_numel of its params).
  std::int64_t end_align = 1;
  bool pad_to_row_widths = false;
  bool shared_embedding_own_bucket = false;  // the shared embedding gets a bucket of its own
  std::int64_t first_chunk_bucket_size = 0;  // bucket size of chunk 0 (0 = one bucket)
  bool expert = false;  // lay out the expert parameters only (else the others)
};
// One GradBuffer per model chunk, params of each chunk in the rules' order (those whose `expert`
// flag equals the rules'; the buffers marked alike); a bucket closes once
// it holds first_chunk_bucket_size elements (chunk 0 only) or for a shared embedding.
std::vector<GradBuffer> LayoutBuckets(const ModelDims& d, const std::vector<ParamTensor>& params,
                                      const BucketRules& rules);
// The layout of the wrapper setup.training describes (data_parallel.h LayoutDdpBuffers /
// LayoutFsdpBuffers); none for a rank without a wrapper.
std::vector<GradBuffer> LayoutGradBuffers(const config::Setup& setup, int pipeline_rank,
                                          const std::vector<ParamTensor>& params);

// A slice of one parameter owned by this DP rank's optimizer shard (distributed optimizer,
// `distrib_optimizer.py` `_build_model_gbuf_range`): the rank's 1/(d·cp) range of every bucket,
// 1/edp of an expert buffer's.
struct ShardSlice {
  int param = 0;  // index into StageParams
  std::int64_t numel = 0;
};
// Slices of data-parallel rank 0 (memsim simulates DP rank 0), in optimizer param-group order.
std::vector<ShardSlice> ShardSlices(const ModelDims& dims, const std::vector<ParamTensor>& params,
                                    const std::vector<GradBuffer>& buffers);

// The optimizer's param groups in Megatron order (`_get_param_groups`: groups keyed by weight
// decay, in order of first appearance over named_parameters). Each group lists param indices.
std::vector<std::vector<int>> ParamGroups(const std::vector<ParamTensor>& params);

}  // namespace memsim::workload
