// The shapes one pipeline rank works with: resolved dimensions (reference/workload.md §0), the
// parameter tensors it holds in construction order (§1.2), and the Megatron-core DDP contiguous
// buffer layout with its distributed-optimizer shard (§1.3, §1.4). Pure functions of a Setup;
// used by Build (build.h) and by the closed forms of ComputeStaticSizes. Element counts are
// int64 numbers of elements, sizes in bytes. Not modelled: MoE, ZeRO-2/3 outside Megatron-FSDP,
// uneven pipeline splits (config/ rejects those). Megatron-FSDP's buffers: LayoutGradBuffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::workload {

// reference/workload.md §0, for one rank. All sizes are per TP rank where the text says so.
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
  int Lc = 0;              // layers per model chunk (L/p without VPP)
  int m = 1;               // micro-batches per iteration per DP rank = global / (b·d)
  int sigma = 1;           // t with sequence parallelism, else 1
  bool sp = false;         // sequence parallel and t > 1
  Bytes act_bytes = 2;     // B_a: bytes of one activation element
  Bytes param_bytes = 2;   // bytes of one model parameter element
  Bytes grad_bytes = 4;    // bytes of one DDP grad-buffer element
  bool mixed = true;       // 16-bit params with fp32 master copies (fp16/bf16)
  bool layernorm = false;  // LayerNorm (mean + rstd, weight + bias) vs RMSNorm
  bool flash = true;       // flash/fused attention; false = Megatron unfused DotProductAttention
  bool te = true;          // transformer_impl == "transformer_engine"
  bool npu = false;        // Ascend (torch_npu) backend
  bool hopper = false;     // sm >= 90 class GPU (workspace sizes; estimate, see model.cc)
  bool hidden_dropout = false;
  bool attention_dropout = false;
  bool tied = false;
  // Weight grads handed to autograd (reference/workload.md §1.3; model.cc for the versions):
  bool grad_accum_fusion = true;    // gradient_accumulation_fusion (wgrad GEMM into main_grad)
  bool te_dummy_wgrad_cache = true;  // TE layers return a cached dummy wgrad (get_dummy_wgrad)
  bool megatron_dummy_wgrad_cache = true;  // Megatron's own linears return TE's cached dummy
  // Megatron-FSDP (use_megatron_fsdp): its own weight / main-weight / grad buffers replace the
  // DDP buffers and the optimizer's master copies; fsdp_shard_grads for strategy optim_grads.
  bool fsdp = false;
  bool fsdp_shard_grads = false;
};

// REQUIRES: a Setup that config/ validated (positive sizes, divisibility of heads, layers and
// batch). Violations are bugs (MEMSIM_CHECK), never input errors.
ModelDims ComputeDims(const config::Setup& setup);

// One parameter tensor of this rank, in module construction order (§1.1 step 3).
struct ParamTensor {
  std::string name;  // e.g. "layer3.attn.qkv.weight", "embedding.word_embeddings.weight"
  std::int64_t numel = 0;
  std::int64_t row_numel = 1;    // elements of shape[1:] (columns of a 2-D weight; 1 for 1-D)
  int chunk = 0;                 // model chunk (VPP) that owns it
  int layer = -1;                // global transformer layer, -1 for embedding / final norm / output
  bool no_weight_decay = false;  // 1-D: biases and norm weights (Megatron `_get_param_groups`)
  bool shared_embedding = false;   // tied word embedding / output weight with p > 1
  bool sequence_parallel = false;  // replicated over TP and all-reduced with SP (norms, row biases)
};

// The rank's parameter tensors, chunk by chunk, in construction order: embedding (first
// stage), each layer (ln1, qkv, [q/k norm], proj, ln2, fc1, fc2, with biases), final norm and
// output layer (last stage). Sources: Megatron-core `gpt_model.py` GPTModel.__init__,
// `transformer_layer.py`, TE spec `gpt_layer_specs.py`.
std::vector<ParamTensor> StageParams(const config::Setup& setup, int pipeline_rank);

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
};

// Layout per Megatron `param_and_grad_buffer.py` `_ParamAndGradBuffer.__init__`: params in
// reverse order; with the distributed optimizer each param start is padded to 64 elements and
// each bucket end to lcm(d·cp, 128); buckets close at bucket_size = max(4e7, 1e6·d·cp) elements
// only with overlap_grad_reduce on pp rank 0, chunk 0 (training.py `get_model` disable_bucketing);
// the shared embedding gets its own bucket (distributed optimizer only).
// Megatron-FSDP (megatron_fsdp/param_and_grad_buffer.py `_get_parameter_groups`,
// `build_data_parallel_buffer_index`): parameters in named_parameters() order; buckets close at
// the same bucket_size when overlap_grad_reduce is on, else one bucket; with a sharding strategy
// other than no_shard each bucket is padded to a multiple of d·cp × lcm(shape[1:] elements of
// its params). Not modelled: the re-sort inside a bucket by shape[1:] (largest first) and the
// per-parameter rounding to that factor, whose gaps Megatron-FSDP partly fills with other
// parameters (a few of the factor's elements per parameter at most); they move which rank owns
// which slice, not the buffer sizes.
std::vector<GradBuffer> LayoutGradBuffers(const config::Setup& setup, int pipeline_rank,
                                          const std::vector<ParamTensor>& params);

// A slice of one parameter owned by this DP rank's optimizer shard (distributed optimizer,
// `distrib_optimizer.py` `_build_model_gbuf_range`): the rank's 1/(d·cp) range of every bucket.
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
