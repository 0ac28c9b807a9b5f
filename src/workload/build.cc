#include "workload/build.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "workload/model.h"
#include "workload/schedule.h"

namespace memsim::workload {
namespace {

using config::OptimizerImpl;
using config::OptimizerKind;
using config::RecomputeGranularity;
using config::RecomputeMethod;

// Duration model (build.h): estimates of achieved efficiency and link bandwidths.
constexpr double kComputeEfficiency = 0.5;     // estimate: typical large-GEMM MFU
constexpr double kBandwidthEfficiency = 0.8;   // estimate: streaming kernels
constexpr double kTpLinkBytesPerS = 100e9;     // estimate: intra-node NVLink / HCCS class
constexpr double kOtherLinkBytesPerS = 20e9;   // estimate: inter-node RDMA class
constexpr double kCollectiveLatencyUs = 10.0;  // estimate
constexpr double kFallbackFlops = 100e12;      // estimate when the preset has no peak
constexpr double kFallbackBandwidth = 1e12;    // estimate when the preset has no bandwidth
constexpr double kMinOpUs = 1.0;               // kernel-launch granularity (estimate)

// Workspaces that go through the caching allocator (§1.7).
// PyTorch CublasHandlePool.cpp: default ":4096:2:16:8" = 2·4 MiB + 8·16 KiB; 8 x 4 MiB on sm >= 90.
constexpr Bytes kCublasWorkspaceBytes = 2 * 4096 * kKiB + 8 * 16 * kKiB;
constexpr Bytes kCublasWorkspaceHopperBytes = 8 * 4096 * kKiB;
// TE module/base.py get_cublas_workspace_size_bytes: 32 MiB on sm >= 90, else 4 MiB.
constexpr Bytes kTeWorkspaceBytes = 4 * kMiB;
constexpr Bytes kTeWorkspaceHopperBytes = 32 * kMiB;
// A [1]-element optimizer scalar (found_inf, _scale_one, grad-scaler state): 4 bytes.
constexpr Bytes kScalarBytes = 4;

// Saved tensors of core attention (§2.2 A5, A6; unfused: §2.2 "Unfused attention").
struct CoreAttn {
  TensorId out = 0, lse1 = 0, lse2 = 0, probs = 0, dmask = 0, dout = 0, k_rep = 0, v_rep = 0;
};

// Saved tensors of one transformer layer (§2.2, A1 = the input, kept by the caller).
struct LayerActs {
  TensorId ln1_mean = 0, ln1_rstd = 0, ln1_out = 0, qkv = 0;
  TensorId q_norm_out = 0, k_norm_out = 0, q_norm_stats = 0, k_norm_stats = 0;  // qk_layernorm
  CoreAttn core;
  TensorId attn_bda_mask = 0, attn_residual = 0;
  TensorId ln2_mean = 0, ln2_rstd = 0, ln2_out = 0, fc1_out = 0, act_out = 0;
  TensorId mlp_bda_mask = 0, output = 0;
};

// One forward unit (micro-batch, chunk) in flight.
struct UnitState {
  TensorId stage_input = 0;
  bool input_external = false;  // P2P recv buffer, owned by the schedule until backward ends
  std::vector<TensorId> layer_inputs;
  std::vector<LayerActs> acts;
  TensorId tokens = 0, position_ids = 0, labels = 0, loss_mask = 0;
  TensorId emb_indices = 0, emb_dropout_mask = 0;
  TensorId last_output = 0;  // last layer output on the post chunk (saved by the final norm)
  TensorId final_mean = 0, final_rstd = 0, final_out = 0;
  TensorId logits_fp32 = 0, target_mask = 0, masked_target = 0, loss = 0;
};

// A tensor the optimizer updates: a full fp32 main param, an fp32 param, or a shard slice.
struct MainTensor {
  int param = 0;
  std::int64_t numel = 0;
  int group = 0;
};

// A run of layers of one chunk: checkpointed (full recompute) or not.
struct Segment {
  int first = 0, last = 0;
  bool checkpointed = false;
};

class Builder {
 public:
  Builder(const config::Setup& setup, int rank)
      : setup_(setup), tc_(setup.training), d_(ComputeDims(setup)), rank_(rank) {
    params_ = StageParams(setup, rank);
    buffers_ = LayoutGradBuffers(setup, rank, params_);
    groups_ = ParamGroups(params_);
    std::vector<int> group_of(params_.size(), 0);
    for (int gi = 0; gi < static_cast<int>(groups_.size()); ++gi) {
      for (int i : groups_[gi]) group_of[i] = gi;
    }
    if (tc_.use_distributed_optimizer) {
      for (const ShardSlice& s : ShardSlices(d_, params_, buffers_)) {
        main_.push_back({s.param, s.numel, group_of[s.param]});
      }
    } else {
      for (int gi = 0; gi < static_cast<int>(groups_.size()); ++gi) {
        for (int i : groups_[gi]) main_.push_back({i, params_[i].numel, gi});
      }
    }
    const double peak = tc_.precision == config::Precision::kFp32   ? setup.device.peak_flops_fp32
                        : tc_.precision == config::Precision::kFp16 ? setup.device.peak_flops_fp16
                                                                    : setup.device.peak_flops_bf16;
    peak_flops_ = peak > 0                           ? peak
                  : setup.device.peak_flops_bf16 > 0 ? setup.device.peak_flops_bf16
                                                     : kFallbackFlops;
    bandwidth_ = setup.device.memory_bandwidth_bytes_per_s > 0
                     ? setup.device.memory_bandwidth_bytes_per_s
                     : kFallbackBandwidth;
    BuildSegments();
    FsdpSetup();
    steps_ = PipelineSchedule(d_.p, rank_, d_.m, d_.v);
  }

  Program Run() {
    program_.pipeline_rank = rank_;
    program_.num_iterations = tc_.train_iters;
    sizes_.push_back(0);  // ids start at 1; 0 = none
    Init();
    for (int k = 1; k <= tc_.train_iters; ++k) Iteration(k);
    FinishOp();
    return std::move(program_);
  }

 private:
  // ---- op helpers -------------------------------------------------------------------------

  void Begin(std::string_view name, int layer = -1, int stream = kComputeStream) {
    FinishOp();
    Op op;
    op.name = prefix_.empty() ? std::string(name) : prefix_ + std::string(name);
    op.iteration = iteration_;
    op.phase = phase_;
    op.micro_batch = micro_batch_;
    op.layer = layer;
    op.stream = stream;
    program_.ops.push_back(std::move(op));
    open_ = true;
    flops_ = 0;
    extra_bytes_ = 0;
    comm_us_ = 0;
  }
  Op& Cur() { return program_.ops.back(); }

  void FinishOp() {
    if (!open_) return;
    Op& op = Cur();
    double bytes = extra_bytes_;
    for (const TensorAlloc& a : op.allocs) bytes += static_cast<double>(a.size_bytes);
    for (TensorId id : op.frees) bytes += static_cast<double>(sizes_[id]);
    const double compute_us = flops_ / (peak_flops_ * kComputeEfficiency) * 1e6;
    const double memory_us = bytes / (bandwidth_ * kBandwidthEfficiency) * 1e6;
    op.duration_us = std::max(kMinOpUs, std::max(compute_us, memory_us) + comm_us_);
    open_ = false;
  }

  TensorId Alloc(Bytes size_bytes, Category category, std::string label) {
    MEMSIM_CHECK(open_ && size_bytes >= 0);
    const TensorId id = sizes_.size();
    sizes_.push_back(size_bytes);
    Cur().allocs.push_back({id, size_bytes, category, std::move(label)});
    return id;
  }
  void Free(TensorId id) {
    if (id == 0) return;
    MEMSIM_CHECK(open_);
    Cur().frees.push_back(id);
  }
  // Tensors that several Python references keep alive (a stage input held by its micro-batch and
  // by the model chunk; an input grad held by a schedule local and as that input's .grad): each
  // holder takes a reference, and the last one to drop it frees the tensor.
  void Ref(TensorId id) {
    if (id != 0) ++refs_[id];
  }
  void Unref(TensorId id) {
    if (id == 0) return;
    auto it = refs_.find(id);
    MEMSIM_CHECK(it != refs_.end() && it->second > 0);
    if (--it->second == 0) {
      refs_.erase(it);
      Free(id);
    }
  }
  void Flops(double flops) { flops_ += flops; }
  void RecordStream(TensorId id, int stream) { Cur().record_streams.emplace_back(id, stream); }

  // A collective of `message_bytes` on `group` of `size` ranks; bus_factor per NCCL's
  // bus-bandwidth convention (all-reduce 2(n-1)/n, all-gather/reduce-scatter (n-1)/n, p2p 1).
  // Groups of one rank create no communicator and are skipped.
  enum class Coll { kAllReduce, kGather, kP2P };
  void Collective(const char* group, int size, double message_bytes, Coll kind) {
    if (size <= 1) return;
    Op& op = Cur();
    if (op.collective_group.empty()) op.collective_group = group;
    const double n = size;
    const double factor = kind == Coll::kAllReduce ? 2 * (n - 1) / n
                          : kind == Coll::kGather  ? (n - 1) / n
                                                   : 1.0;
    const double link = std::string_view(group) == "tp" ? kTpLinkBytesPerS : kOtherLinkBytesPerS;
    comm_us_ += kCollectiveLatencyUs + message_bytes * factor / link * 1e6;
  }

  std::string L(int layer, std::string_view name) const {
    return fmt::format("layer{}.{}", layer, name);
  }

  // ---- first-use workspaces (§1.7) ---------------------------------------------------------

  // A GEMM through PyTorch (cuBLAS) or Transformer Engine: the first one creates the persistent
  // workspace (CUDA only; torch_npu's workspaces are outside this model). PyTorch keeps one
  // cuBLAS workspace per (handle, stream) and one handle per thread (CublasHandlePool.cpp
  // getCurrentCUDABlasHandle); the autograd engine runs CUDA backward on its own device thread
  // (torch/csrc/autograd/engine.cpp), so backward GEMMs, recompute included, get a second one.
  // TE's workspace is one module-level tensor (module/base.py get_workspace).
  void GemmWorkspace(bool torch_gemm) {
    if (d_.npu) return;
    if (torch_gemm || !d_.te) {
      const bool autograd_thread = on_autograd_thread_;
      bool& done = cublas_done_[autograd_thread ? 1 : 0];
      if (done) return;
      done = true;
      Alloc(d_.hopper ? kCublasWorkspaceHopperBytes : kCublasWorkspaceBytes, Category::kWorkspace,
            autograd_thread ? "workspace.cublas_autograd" : "workspace.cublas");
    } else {
      if (te_done_) return;
      te_done_ = true;
      Alloc(d_.hopper ? kTeWorkspaceHopperBytes : kTeWorkspaceBytes, Category::kWorkspace,
            "workspace.te_cublas");
    }
  }
  // Megatron GlobalMemoryBuffer.get_tensor (megatron/core/utils.py), key ("mpu", dtype):
  // allocates on first use or when too small; the old buffer is dropped after the new one exists.
  void MpuBuffer(Bytes size_bytes) {
    if (size_bytes <= mpu_bytes_) return;
    const TensorId old = mpu_id_;
    mpu_id_ = Alloc(size_bytes, Category::kWorkspace, "workspace.mpu");
    mpu_bytes_ = size_bytes;
    Free(old);
  }

  // SP all-gather of an [s/t, b, h]-shaped input before a column-parallel GEMM (§2.3): TE
  // allocates a transient full tensor; Megatron's own linear layers use the "mpu" buffer.
  // Returns the transient (0 if none). `torch_linear`: Megatron ColumnParallelLinear.
  TensorId SpGather(Bytes full_bytes, const std::string& label, bool torch_linear) {
    if (!d_.sp) return 0;
    Collective("tp", d_.t, static_cast<double>(full_bytes), Coll::kGather);
    if (d_.te && !torch_linear) return Alloc(full_bytes, Category::kTemporaries, label);
    MpuBuffer(full_bytes);
    return 0;
  }

  // Row-parallel GEMM output (§2.3): with SP a full [s, b, h] output reduce-scattered into a new
  // [s/t, b, h] (the full one freed); without SP an all-reduce in place.
  TensorId RowParallelOutput(Bytes full_bytes, const std::string& label) {
    if (d_.sp) {
      const TensorId full = Alloc(full_bytes, Category::kTemporaries, label + "_full");
      const TensorId out = Alloc(full_bytes / d_.t, Category::kTemporaries, label);
      Collective("tp", d_.t, static_cast<double>(full_bytes), Coll::kGather);
      Free(full);
      return out;
    }
    const TensorId out = Alloc(full_bytes, Category::kTemporaries, label);
    Collective("tp", d_.t, static_cast<double>(full_bytes), Coll::kAllReduce);
    return out;
  }

  // Transient weight-gradient tensors of 1-D params (norm weights, biases): AccumulateGrad
  // hands them to the DDP hook, which adds them into main_grad and drops them (§1.3).
  void SmallWeightGrad(std::int64_t numel, const std::string& label) {
    const TensorId g = Alloc(numel * d_.param_bytes, Category::kGradients, label);
    Free(g);
  }
  // The [rows, cols] weight grad a linear layer hands to autograd (§1.3). Without
  // gradient-accumulation fusion it is the real wgrad; with it, a dummy (the GEMM accumulated
  // into main_grad). Either way AccumulateGrad stores it as .grad and the DDP hook drops it in the
  // same backward step, unless the dummy is Transformer Engine's cached one (get_dummy_wgrad: one
  // tensor per (shape, dtype), made at first use and kept for the run). Bytes in the activation
  // dtype (Megatron `input.dtype`; TE `weight.dtype`, the same for 16-bit training).
  // te_layer: a Transformer Engine module (else Megatron's own ColumnParallel/RowParallelLinear).
  void WeightGradToAutograd(std::int64_t rows, std::int64_t cols, bool te_layer,
                            const std::string& label) {
    const bool cached = d_.grad_accum_fusion &&
                        (te_layer ? d_.te_dummy_wgrad_cache : d_.megatron_dummy_wgrad_cache);
    if (cached) {
      TensorId& dummy = dummy_wgrads_[{rows, cols}];
      if (dummy == 0) {
        dummy = Alloc(rows * cols * d_.act_bytes, Category::kWorkspace,
                      fmt::format("te.dummy_wgrad[{}x{}]", rows, cols));
      }
      return;
    }
    // TE before its cache (and TE without fusion) hands a fresh tensor too (TE PR #507:
    // `torch.empty(weight.main_grad.shape, dtype=weight.dtype)`).
    const TensorId g = Alloc(rows * cols * d_.act_bytes, Category::kGradients, label);
    Free(g);
  }
  void NormWeightGrads(int layer, const char* norm) {
    SmallWeightGrad(d_.h, L(layer, fmt::format("{}.weight_grad", norm)));
    if (d_.layernorm) SmallWeightGrad(d_.h, L(layer, fmt::format("{}.bias_grad", norm)));
  }

  // ---- init (§1.1, §1.3, §1.4) --------------------------------------------------------------

  void Init() {
    chunk_input_.assign(d_.v, 0);
    chunk_input_grad_.assign(d_.v, 0);
    iteration_ = 0;
    phase_ = Phase::kInit;
    micro_batch_ = -1;
    // Model build: one allocation per parameter tensor, construction order; one op per module.
    param_ids_.assign(params_.size(), 0);
    int prev_layer = -2;
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamTensor& pt = params_[i];
      if (pt.layer != prev_layer || i == 0) {
        const char* name = pt.layer >= 0                        ? "init.model.layer"
                           : pt.name.rfind("embedding", 0) == 0 ? "init.model.embedding"
                                                                : "init.model.output";
        Begin(name, pt.layer);
        prev_layer = pt.layer;
      }
      param_ids_[i] = Alloc(pt.numel * d_.param_bytes, Category::kParameters, pt.name);
    }
    // LanguageModule.setup_embeddings_and_output_layer: with tied embeddings and p > 1 the
    // first and last stages all-reduce the shared weight over "embd" (in place).
    for (const ParamTensor& pt : params_) {
      if (!pt.shared_embedding) continue;
      Begin("init.model.sync_embedding");
      Collective("embd", 2, static_cast<double>(pt.numel * d_.param_bytes), Coll::kAllReduce);
    }
    if (d_.fsdp) {
      FsdpBuffers();
    } else {
      DdpBuffers();
    }
    // Optimizer scalars (§1.4): fp16 grad scaler state (DynamicGradScaler: scale, min_scale,
    // growth/backoff factors), found_inf, _dummy_overflow_buf; bf16 _scale_one; fp32 _scale.
    Begin("init.optimizer.scalars");
    if (tc_.precision == config::Precision::kFp16) {
      for (const char* n :
           {"grad_scaler.scale", "grad_scaler.min_scale", "grad_scaler.growth_factor",
            "grad_scaler.backoff_factor", "optimizer.found_inf", "optimizer.dummy_overflow_buf"}) {
        Alloc(kScalarBytes, Category::kOther, n);
      }
    } else {
      Alloc(kScalarBytes, Category::kOther, d_.mixed ? "optimizer.scale_one" : "optimizer.scale");
    }
    // fp32 master copies: `clone().float()` per param (Float16OptimizerWithFloat16Params) or per
    // shard slice (DistributedOptimizer); the 16-bit clone is transient. Megatron-FSDP keeps its
    // own main-weight buffer (FsdpBuffers).
    if (d_.mixed && !d_.fsdp) {
      for (const MainTensor& mt : main_) {
        const std::string& name = params_[mt.param].name;
        Begin("init.optimizer.main_param");
        const TensorId clone =
            Alloc(mt.numel * d_.param_bytes, Category::kTemporaries, name + ".clone");
        Alloc(mt.numel * 4, Category::kMainParameters, "main." + name);
        Free(clone);
      }
    }
  }

  // DDP: one param/grad buffer pair per model chunk; with the distributed optimizer the params
  // move into param_data one by one, old blocks freed (§1.3).
  void DdpBuffers() {
    const bool dist = tc_.use_distributed_optimizer;
    for (const GradBuffer& buf : buffers_) {
      Begin("init.ddp.buffers");
      if (dist) {
        Alloc(buf.numel_padded * d_.param_bytes, Category::kParameters,
              fmt::format("ddp.chunk{}.param_buffer", buf.chunk));
      }
      Alloc(buf.numel_padded * d_.grad_bytes, Category::kGradients,
            fmt::format("ddp.chunk{}.grad_buffer", buf.chunk));
      if (dist) {
        Begin("init.ddp.move_params");
        for (const GradBuffer::Entry& e : buf.entries) Free(param_ids_[e.param]);
      }
    }
  }

  // Megatron-FSDP (megatron_fsdp/param_and_grad_buffer.py
  // `ParamAndGradBuffer._init_each_parameter_group_buffers`), per parameter group (memsim: one
  // per model chunk): a 16-bit weight buffer, full size for the strategies memsim models, into
  // which the parameters move (their own storage freed), except with no_shard, where they keep
  // their storage; then the fp32 main-weight buffer (preserve_fp32_weights, Megatron-FSDP's
  // default), the rank's 1/(d·cp) shard unless no_shard. After all groups, the grad buffer in the
  // grad dtype (one tensor per dtype, `buffer_all_in_one`), full size, or the shard with
  // optim_grads; then gc.collect() and torch.cuda.empty_cache(). Adam later makes its state per
  // parameter on views of the main-weight shard (main_, as for the distributed optimizer).
  void FsdpBuffers() {
    const bool sharded = tc_.use_distributed_optimizer;
    const bool grads_sharded = tc_.fsdp_sharding == config::FsdpSharding::kOptimGrads;
    for (const GradBuffer& buf : buffers_) {
      const std::int64_t shard = buf.numel_padded / d_.dp_cp;
      if (sharded) {
        Begin("init.fsdp.buffers");
        Alloc(buf.numel_padded * d_.param_bytes, Category::kParameters,
              fmt::format("fsdp.chunk{}.weight_buffer", buf.chunk));
        Begin("init.fsdp.move_params");
        for (const GradBuffer::Entry& e : buf.entries) Free(param_ids_[e.param]);
      }
      if (d_.mixed) {
        Begin("init.fsdp.buffers");
        Alloc((sharded ? shard : buf.numel_padded) * 4, Category::kMainParameters,
              fmt::format("fsdp.chunk{}.main_weight_buffer", buf.chunk));
      }
    }
    Begin("init.fsdp.grad_buffer");
    for (const GradBuffer& buf : buffers_) {
      const std::int64_t shard = buf.numel_padded / d_.dp_cp;
      Alloc((grads_sharded ? shard : buf.numel_padded) * d_.grad_bytes, Category::kGradients,
            fmt::format("fsdp.chunk{}.grad_buffer", buf.chunk));
    }
    Cur().empty_cache = true;
  }

  // ---- one iteration (§8) -------------------------------------------------------------------

  void Iteration(int k) {
    iteration_ = k;
    phase_ = Phase::kForward;
    micro_batch_ = -1;
    // train_step: zero_grad_buffer (memset) and optimizer.zero_grad(set_to_none) which drops the
    // fp32 grad copies of the previous step (§1.6 step 2).
    Begin("zero_grad");
    for (TensorId id : grad_copies_) Free(id);
    grad_copies_.clear();

    const std::vector<ScheduleStep>& steps = steps_;
    std::vector<int> last_backward(d_.v, -1);
    for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
      if (!steps[i].forward) last_backward[steps[i].chunk] = i;
    }
    for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
      step_ = i;
      const ScheduleStep& st = steps[i];
      micro_batch_ = st.micro_batch;
      if (st.forward) {
        phase_ = Phase::kForward;
        ForwardUnit(st.micro_batch, st.chunk);
      } else {
        phase_ = Phase::kBackward;
        BackwardUnit(st.micro_batch, st.chunk);
        // With overlap_grad_reduce the buckets are reduced during the last micro-batch's
        // backward (register_grad_ready -> start_grad_sync).
        if (tc_.overlap_grad_reduce && i == last_backward[st.chunk]) GradSync(st.chunk);
      }
    }
    micro_batch_ = -1;
    phase_ = Phase::kBackward;
    MEMSIM_CHECK(pending_recv_forward_ == 0 && pending_recv_backward_ == 0 && units_.empty());
    // Only the chunk inputs and their grads (at most two per chunk) outlive the schedule loop,
    // besides the locals dropped below.
    MEMSIM_CHECK(refs_.size() <= 2 * chunk_input_.size() + 1);
    // forward_backward_pipelining_* calls finalize_model_grads_func before it returns, so its
    // locals (the last output_tensor_grad and input_tensor_grad) are alive during it.
    FinalizeGrads();
    const bool frees_held = held_recv_backward_ != 0 ||
                            (held_input_grad_ != 0 && refs_.at(held_input_grad_) == 1);
    if (frees_held) Begin("p2p.schedule_return");  // the schedule function's locals go out of scope
    Free(held_recv_backward_);
    Unref(held_input_grad_);
    held_recv_backward_ = held_input_grad_ = 0;
    if (tc_.empty_unused_memory_level >= 1) Cur().empty_cache = true;
    OptimizerStep();
    if (tc_.empty_unused_memory_level >= 2) Cur().empty_cache = true;
  }

  // finish_grad_sync per bucket (§1.3, §3.3): in place on the comm stream, group "dp".
  void GradSync(int chunk) {
    const GradBuffer& buf = buffers_[chunk];
    const int dp = d_.dp_cp;
    if (dp <= 1 || d_.fsdp_shard_grads) return;  // optim_grads: reduced in each backward
    // Megatron-FSDP with a full grad buffer all-reduces it in place
    // (`_bucket_group_gradient_reduce`); the memory is the same as a reduce-scatter's.
    const bool scatter = tc_.use_distributed_optimizer && !d_.fsdp;
    for (const auto& [start, end] : buf.buckets) {
      Begin(d_.fsdp   ? "fsdp.grad_all_reduce"
            : scatter ? "ddp.grad_reduce_scatter"
                      : "ddp.grad_all_reduce",
            -1, kCommStream);
      Collective("dp", dp, static_cast<double>((end - start) * d_.grad_bytes),
                 scatter ? Coll::kGather : Coll::kAllReduce);
    }
  }

  // ---- Megatron-FSDP optim_grads: gradient buckets during backward -------------------------
  // megatron_fsdp/megatron_fsdp.py `_grad_acc` and param_and_grad_buffer.py `GradReducePipeline`:
  // a parameter's first gradient of a backward makes its bucket's temporary full-size main_grad
  // (TemporaryBucketAllocator, grad dtype); once every parameter of the bucket has its gradient
  // the bucket is reduce-scattered on a side stream into a fresh shard-sized tensor, which is
  // added into the persistent grad shard; the full-size bucket is kept until the queued buckets
  // exceed suggested_RS_queue_capacity (max(1e9, bucket size) elements; checked before each new
  // bucket joins, oldest freed first) or the backward ends (`_root_post_backward`). Params are
  // grouped by where their grad is made: the head (final norm, output layer; a tied embedding with
  // p = 1), each layer, the embedding.

  enum class GradSite { kHead, kLayer, kEmbedding };
  bool AtSite(const ParamTensor& pt, GradSite site, int layer) const {
    switch (site) {
      case GradSite::kLayer:
        return pt.layer == layer && pt.layer >= 0;
      case GradSite::kEmbedding:
        return pt.name.rfind("embedding.", 0) == 0;
      case GradSite::kHead:
        return pt.name.rfind("final_norm.", 0) == 0 || pt.name.rfind("output_layer.", 0) == 0 ||
               (d_.tied && d_.p == 1 && pt.name == "embedding.word_embeddings.weight");
    }
    return false;
  }
  void FsdpSetup() {
    if (!d_.fsdp_shard_grads) return;
    MEMSIM_CHECK(buffers_.size() == 1);  // config/: no pipeline or virtual stages with FSDP
    fsdp_bucket_of_.assign(params_.size(), -1);
    for (const GradBuffer::Entry& e : buffers_[0].entries) fsdp_bucket_of_[e.param] = e.bucket;
    fsdp_expected_.assign(params_.size(), 0);
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamTensor& pt = params_[i];
      fsdp_expected_[i] = (AtSite(pt, GradSite::kHead, -1) ? 1 : 0) +
                          (AtSite(pt, GradSite::kLayer, pt.layer) ? 1 : 0) +
                          (AtSite(pt, GradSite::kEmbedding, -1) ? 1 : 0);
    }
    const auto& buckets = buffers_[0].buckets;
    fsdp_temp_.assign(buckets.size(), 0);
    fsdp_capacity_ = 1'000'000'000;
    for (const auto& [start, end] : buckets) fsdp_capacity_ = std::max(fsdp_capacity_, end - start);
    FsdpResetCounts();
  }
  void FsdpResetCounts() {
    fsdp_missing_.assign(buffers_[0].buckets.size(), 0);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (fsdp_bucket_of_[i] >= 0) fsdp_missing_[fsdp_bucket_of_[i]] += fsdp_expected_[i];
    }
  }
  // Before the backward of `site`: the temporary buckets its gradients go into.
  void FsdpGradsStart(GradSite site, int layer = -1) {
    if (!d_.fsdp_shard_grads) return;
    const auto& buckets = buffers_[0].buckets;
    for (size_t i = 0; i < params_.size(); ++i) {
      const int b = fsdp_bucket_of_[i];
      if (b < 0 || fsdp_temp_[b] != 0 || !AtSite(params_[i], site, layer)) continue;
      Begin("fsdp.grad_bucket");
      fsdp_temp_[b] = Alloc((buckets[b].second - buckets[b].first) * d_.grad_bytes,
                            Category::kGradients, fmt::format("fsdp.grad_bucket{}", b));
    }
  }
  // After the backward of `site`: reduce-scatter the buckets it completed.
  void FsdpGradsDone(GradSite site, int layer = -1) {
    if (!d_.fsdp_shard_grads) return;
    for (size_t i = 0; i < params_.size(); ++i) {
      const int b = fsdp_bucket_of_[i];
      if (b < 0 || !AtSite(params_[i], site, layer)) continue;
      if (--fsdp_missing_[b] == 0) FsdpReduceScatter(b);
    }
  }
  void FsdpReduceScatter(int b) {
    const auto& [start, end] = buffers_[0].buckets[b];
    Begin("fsdp.grad_reduce_scatter", -1, kCommStream);
    const TensorId shard = Alloc((end - start) / d_.dp_cp * d_.grad_bytes, Category::kTemporaries,
                                 fmt::format("fsdp.grad_shard{}", b));
    Collective("dp", d_.dp_cp, static_cast<double>((end - start) * d_.grad_bytes), Coll::kGather);
    Free(shard);  // added into the persistent grad shard
    // `wait_for_previous_grad_reduce` trims the queue before the new bucket joins it.
    while (fsdp_queued_ > fsdp_capacity_ && !fsdp_queue_.empty()) FsdpFreeOldest();
    fsdp_queue_.push_back(b);
    fsdp_queued_ += end - start;
  }
  void FsdpFreeOldest() {
    const int b = fsdp_queue_.front();
    fsdp_queue_.pop_front();
    const auto& [start, end] = buffers_[0].buckets[b];
    fsdp_queued_ -= end - start;
    Begin("fsdp.free_grad_bucket");
    Free(fsdp_temp_[b]);
    fsdp_temp_[b] = 0;
  }
  // `_root_post_backward`: wait for every reduce-scatter and free the temporary buckets.
  void FsdpPostBackward() {
    if (!d_.fsdp_shard_grads) return;
    for (int b = 0; b < static_cast<int>(fsdp_temp_.size()); ++b) {
      if (fsdp_temp_[b] != 0 && fsdp_missing_[b] > 0) FsdpReduceScatter(b);
    }
    while (!fsdp_queue_.empty()) FsdpFreeOldest();
    FsdpResetCounts();
  }

  // Megatron finalize_model_grads: DP grad sync, SP layer-norm grads, tied embedding grads.
  void FinalizeGrads() {
    if (!tc_.overlap_grad_reduce) {
      for (int c = 0; c < d_.v; ++c) GradSync(c);
    }
    Begin("ddp.finish_grad_sync");
    Cur().synchronize = true;
    if (d_.sp) {
      // `_allreduce_layernorm_grads`: flatten the SP-replicated grads (fp32 main_grad views) into
      // one transient, all-reduce over TP, copy back.
      std::int64_t numel = 0;
      for (const ParamTensor& pt : params_) {
        if (pt.sequence_parallel) numel += pt.numel;
      }
      Begin("ddp.allreduce_layernorm_grads");
      const TensorId flat =
          Alloc(numel * d_.grad_bytes, Category::kTemporaries, "ddp.layernorm_grads_flat");
      Collective("tp", d_.t, static_cast<double>(numel * d_.grad_bytes), Coll::kAllReduce);
      Free(flat);
    }
    for (const ParamTensor& pt : params_) {
      if (!pt.shared_embedding) continue;
      // `_allreduce_word_embedding_grads`: first and last stage, group "embd", in place.
      Begin("ddp.allreduce_embedding_grads");
      Collective("embd", 2, static_cast<double>(pt.numel * d_.grad_bytes), Coll::kAllReduce);
    }
  }

  // ---- optimizer step (§1.5, §1.6) ----------------------------------------------------------

  void OptimizerStep() {
    phase_ = Phase::kOptimizerStep;
    micro_batch_ = -1;
    const bool dist = tc_.use_distributed_optimizer;
    // §1.6 step 2: main_grad.float() allocates only when the grad buffer is 16-bit.
    if (d_.mixed && d_.grad_bytes == 2) {
      Begin("optim.copy_main_grads");
      for (const MainTensor& mt : main_) {
        grad_copies_.push_back(
            Alloc(mt.numel * 4, Category::kGradients, "optim.main_grad." + params_[mt.param].name));
      }
    }
    // Grad-stats group: model-parallel (tp·pp) without, tp·dp·cp with the distributed optimizer.
    const char* stats_group = dist ? "tp_dp_cp" : "mp";
    const int stats_size = dist ? d_.t * d_.dp_cp : d_.t * d_.p;
    if (tc_.precision == config::Precision::kFp16) {
      Begin("optim.unscale_and_check");  // _amp_foreach_non_finite_check_and_unscale_, in place
      Collective(stats_group, stats_size, 4, Coll::kAllReduce);
    }
    // clip_grads.py get_grad_norm_fp32: multi_tensor_l2norm output and total_norm, tiny.
    Begin("optim.grad_norm");
    const TensorId norm_out = Alloc(kScalarBytes, Category::kTemporaries, "optim.l2norm_out");
    const TensorId total = Alloc(kScalarBytes, Category::kTemporaries, "optim.total_norm");
    Collective(stats_group, stats_size, 4, Coll::kAllReduce);
    Free(norm_out);
    Free(total);

    const bool first = iteration_ == 1;
    const bool foreach = tc_.optimizer_impl == OptimizerImpl::kForeach;
    for (int gi = 0; gi < static_cast<int>(groups_.size()); ++gi) {
      std::int64_t group_numel = 0;
      for (const MainTensor& mt : main_) group_numel += mt.group == gi ? mt.numel : 0;
      if (group_numel == 0) continue;
      if (tc_.optimizer == OptimizerKind::kAdam) {
        // Lazy state: torch Adam._init_group / TE FusedAdam.initialize_state per param, per group,
        // just before the group's update (§1.5).
        Begin(fmt::format("optim.adam.group{}", gi));
        if (first) {
          for (const MainTensor& mt : main_) {
            if (mt.group != gi) continue;
            const std::string& name = params_[mt.param].name;
            Alloc(mt.numel * 4, Category::kOptimizerStates, "optim.exp_avg." + name);
            Alloc(mt.numel * 4, Category::kOptimizerStates, "optim.exp_avg_sq." + name);
          }
        }
        if (foreach) {
          // torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = _foreach_sqrt(...) is a
          // new list the size of the group; AdamW (Megatron's torch fallback) decays in place.
          Begin(fmt::format("optim.adam.group{}.update", gi));
          std::vector<TensorId> tmp;
          for (const MainTensor& mt : main_) {
            if (mt.group != gi) continue;
            tmp.push_back(Alloc(mt.numel * 4, Category::kTemporaries,
                                "optim.exp_avg_sq_sqrt." + params_[mt.param].name));
          }
          for (TensorId id : tmp) Free(id);
        }
        // Reads/writes param, grad, two moments (fp32): 16 B/elem read + 12 written.
        extra_bytes_ += 28.0 * static_cast<double>(group_numel);
      } else {
        // torch/optim/sgd.py _multi_tensor_sgd: weight decay makes a new grad list
        // (_foreach_add); the first step clones the grads into momentum buffers.
        Begin(fmt::format("optim.sgd.group{}", gi));
        std::vector<TensorId> tmp;
        // Megatron's no-weight-decay group (biases, norms) has weight_decay 0.
        const bool decays = !params_[groups_[gi].front()].no_weight_decay;
        if (foreach && decays && tc_.weight_decay != 0.0) {
          for (const MainTensor& mt : main_) {
            if (mt.group != gi) continue;
            tmp.push_back(Alloc(mt.numel * 4, Category::kTemporaries,
                                "optim.decayed_grad." + params_[mt.param].name));
          }
        }
        if (first && tc_.sgd_momentum > 0.0) {
          for (const MainTensor& mt : main_) {
            if (mt.group != gi) continue;
            Alloc(mt.numel * 4, Category::kOptimizerStates,
                  "optim.momentum_buffer." + params_[mt.param].name);
          }
        }
        for (TensorId id : tmp) Free(id);
        extra_bytes_ += 16.0 * static_cast<double>(group_numel);
      }
    }
    if (d_.mixed) {
      Begin("optim.copy_main_to_model_params");  // in place (§1.6 step 7)
      std::int64_t n = 0;
      for (const MainTensor& mt : main_) n += mt.numel;
      extra_bytes_ += static_cast<double>(n) * (4 + d_.param_bytes);
    }
    if (dist && d_.dp_cp > 1) {
      // Param all-gather into param_data, in place (§1.6 step 8).
      for (const GradBuffer& buf : buffers_) {
        for (const auto& [start, end] : buf.buckets) {
          Begin("optim.param_all_gather", -1, kCommStream);
          Collective("dp", d_.dp_cp, static_cast<double>((end - start) * d_.param_bytes),
                     Coll::kGather);
        }
      }
    }
    Begin("optim.done");  // logging; reporting losses of the iteration dropped
    Cur().synchronize = true;
    for (TensorId id : report_losses_) Free(id);
    report_losses_.clear();
  }

  // ---- schedule units ------------------------------------------------------------------------

  void BuildSegments() {
    segments_.clear();
    const int n = std::max(1, tc_.recompute_num_layers);
    if (tc_.recompute_granularity != RecomputeGranularity::kFull) {
      segments_.push_back({0, d_.Lc - 1, false});
      return;
    }
    if (tc_.recompute_method == RecomputeMethod::kUniform) {
      for (int i = 0; i < d_.Lc; i += n) segments_.push_back({i, std::min(i + n, d_.Lc) - 1, true});
    } else {
      const int k = std::min(n, d_.Lc);
      for (int i = 0; i < k; ++i) segments_.push_back({i, i, true});
      if (k < d_.Lc) segments_.push_back({k, d_.Lc - 1, false});
    }
  }

  int GlobalLayer(int chunk, int i) const { return chunk * d_.p * d_.Lc + rank_ * d_.Lc + i; }
  bool Pre(int chunk) const { return rank_ == 0 && chunk == 0; }
  bool Post(int chunk) const { return rank_ == d_.p - 1 && chunk == d_.v - 1; }

  // The P2P exchanges follow Megatron's 1F1B loop (schedules.py
  // `forward_backward_pipelining_without_interleaving`): after a forward that is followed by a
  // backward, `send_forward_recv_backward` allocates the grad buffer of that backward before the
  // output is deallocated; after a backward followed by a forward, `send_backward_recv_forward`
  // allocates the next input before the backwarded input is dropped. Python locals keep the
  // previous output_tensor_grad until the next receive of a grad, and the previous
  // input_tensor_grad until the next backward_step returns (`held_*`).
  TensorId AllocRecv(const char* label) {
    Begin(fmt::format("p2p.alloc_{}", label));
    return Alloc(d_.act_bytes * d_.T * d_.h / d_.sigma, Category::kCommunication,
                 fmt::format("p2p.{}", label));
  }
  // A P2P op on the NCCL stream sending `send` and/or receiving into `recv` (0 = none):
  // ProcessGroupNCCL records both on its stream, so their frees wait for it (§4.4). A receive is
  // waited for (req.wait()) before compute goes on.
  void P2P(std::string_view name, TensorId send, TensorId recv) {
    Begin(name, -1, kCommStream);
    double bytes = 0;
    for (TensorId id : {send, recv}) {
      if (id == 0) continue;
      RecordStream(id, kCommStream);
      bytes += static_cast<double>(sizes_[id]);
    }
    Collective("pp", d_.p, bytes, Coll::kP2P);
    if (recv != 0) {
      Begin("p2p.wait");
      Cur().synchronize = true;
    }
  }
  const ScheduleStep* NextStep() const {
    return step_ + 1 < static_cast<int>(steps_.size()) ? &steps_[step_ + 1] : nullptr;
  }

  // schedules.py forward_step calls set_input_tensor, and TransformerBlock.set_input_tensor keeps
  // the tensor as self.input_tensor until the next forward of the same chunk replaces it
  // (megatron/core/transformer/transformer_block.py). So the last micro-batch's received input,
  // and the .grad that backward_step's retain_grad left on it, outlive the iteration: they are
  // resident during finalize_model_grads, the optimizer step and the next iteration's first
  // receive, and dropped when that forward sets its own input.
  void SetChunkInput(int chunk, TensorId x) {
    const TensorId old = chunk_input_[chunk], old_grad = chunk_input_grad_[chunk];
    chunk_input_[chunk] = x;
    chunk_input_grad_[chunk] = 0;
    Ref(x);
    // The old input is freed here only once its own backward has run (the chunk is its last
    // holder): the first forward of each chunk in an iteration.
    if (old != 0 && refs_.at(old) == 1) Begin("p2p.set_input_tensor");
    Unref(old);
    Unref(old_grad);
  }

  void ForwardUnit(int mb, int chunk) {
    UnitState& u = units_[{mb, chunk}];
    u = UnitState{};
    u.layer_inputs.assign(d_.Lc, 0);
    u.acts.assign(d_.Lc, LayerActs{});
    const bool pre = Pre(chunk), post = Post(chunk);
    const bool selective = tc_.recompute_granularity == RecomputeGranularity::kSelective;
    TensorId x;
    if (pre) {
      Data(u, pre, post);
      x = EmbeddingForward(u);
    } else {
      // p2p_communication.py _communicate: torch.empty((s/σ, b, h), requires_grad=True), kept
      // in input_tensors until this unit's backward.
      if (pending_recv_forward_ != 0) {
        x = pending_recv_forward_;  // received by the previous backward's exchange
        pending_recv_forward_ = 0;
      } else {
        x = AllocRecv("recv_forward");
        P2P("p2p.recv_forward", 0, x);
      }
      u.input_external = true;
      SetChunkInput(chunk, x);
      Ref(x);  // this micro-batch's reference (input_tensors), dropped at its backward
      // forward_step: set_input_tensor, then the forward step function's get_batch.
      if (post) Data(u, pre, post);
    }
    u.stage_input = x;
    for (const Segment& seg : segments_) {
      for (int i = seg.first; i <= seg.last; ++i) {
        const int l = GlobalLayer(chunk, i);
        u.layer_inputs[i] = x;
        if (seg.checkpointed) {
          // CheckpointFunction.forward runs under no_grad: only the group input stays.
          x = LayerForward(l, x, /*nograd=*/true, /*free_input=*/i > seg.first, false).output;
        } else {
          u.acts[i] = LayerForward(l, x, false, false, selective);
          x = u.acts[i].output;
        }
      }
    }
    if (post) {
      u.last_output = x;
      LossForward(u);
    }
    // forward_step returns: batch tensors not saved by autograd are dropped.
    if (u.tokens != u.emb_indices) Free(u.tokens);
    if (!learned_positions()) Free(u.position_ids);
    Free(u.labels);
    u.tokens = u.labels = 0;
    if (!learned_positions()) u.position_ids = 0;
    if (!post) {
      const ScheduleStep* next = NextStep();
      if (next != nullptr && !next->forward && !Post(next->chunk)) {
        pending_recv_backward_ = AllocRecv("recv_backward");
        P2P("p2p.send_forward_recv_backward", x, pending_recv_backward_);
        Free(held_recv_backward_);  // the previous output_tensor_grad binding
        held_recv_backward_ = 0;
      } else {
        P2P("p2p.send_forward", x, 0);
      }
      // deallocate_output_tensor (schedules.py; deallocate_pipeline_outputs is forced on).
      Begin("p2p.deallocate_output");
      Free(x);
    }
  }

  void BackwardUnit(int mb, int chunk) {
    auto it = units_.find({mb, chunk});
    MEMSIM_CHECK(it != units_.end());
    UnitState& u = it->second;
    const bool pre = Pre(chunk), post = Post(chunk);
    on_autograd_thread_ = true;  // backward_step's autograd run, recompute included
    TensorId dy;
    bool dy_external = false;
    if (post) {
      FsdpGradsStart(GradSite::kHead);
      dy = LossBackward(u);
      FsdpGradsDone(GradSite::kHead);
    } else {
      if (pending_recv_backward_ != 0) {
        dy = pending_recv_backward_;
        pending_recv_backward_ = 0;
      } else {
        dy = AllocRecv("recv_backward");
        P2P("p2p.recv_backward", 0, dy);
        Free(held_recv_backward_);
        held_recv_backward_ = 0;
      }
      dy_external = true;
    }
    const TensorId recv_grad = dy_external ? dy : 0;
    for (auto seg = segments_.rbegin(); seg != segments_.rend(); ++seg) {
      TensorId recomputed_out = 0;
      if (seg->checkpointed) {
        // CheckpointFunction.backward: re-run the group's forward with grad, then backward.
        prefix_ = "recompute.";
        TensorId x = u.layer_inputs[seg->first];
        for (int i = seg->first; i <= seg->last; ++i) {
          u.layer_inputs[i] = x;
          u.acts[i] = LayerForward(GlobalLayer(chunk, i), x, false, false, false);
          x = u.acts[i].output;
        }
        prefix_.clear();
        recomputed_out = x;  // held by the checkpoint until its backward ends
      }
      for (int i = seg->last; i >= seg->first; --i) {
        const bool free_x = !(i == 0 && u.input_external);
        const bool free_dy = !(i == d_.Lc - 1 && dy_external);
        const int layer = GlobalLayer(chunk, i);
        FsdpGradsStart(GradSite::kLayer, layer);
        dy = LayerBackward(layer, u.acts[i], u.layer_inputs[i], free_x, dy, free_dy);
        FsdpGradsDone(GradSite::kLayer, layer);
      }
      Free(recomputed_out);
    }
    if (pre) {
      FsdpGradsStart(GradSite::kEmbedding);
      EmbeddingBackward(u, dy);
      FsdpGradsDone(GradSite::kEmbedding);
    }
    FsdpPostBackward();
    on_autograd_thread_ = false;
    // backward_step returned: the previous input_tensor_grad binding is dropped.
    Unref(held_input_grad_);
    held_input_grad_ = 0;
    if (recv_grad != 0) {
      MEMSIM_CHECK(held_recv_backward_ == 0);  // dropped at this backward's receive
      held_recv_backward_ = recv_grad;  // output_tensor_grad stays bound until the next receive
    }
    if (!pre) {
      // The input grad (input_tensor.grad) goes to the previous stage; with a forward next,
      // its input is received in the same exchange, then the backwarded input is dropped.
      const ScheduleStep* next = NextStep();
      if (next != nullptr && next->forward && !Pre(next->chunk)) {
        pending_recv_forward_ = AllocRecv("recv_forward");
        P2P("p2p.send_backward_recv_forward", dy, pending_recv_forward_);
      } else {
        P2P("p2p.send_backward", dy, 0);
        Begin("p2p.release_input");
      }
      // backward_step's retain_grad leaves the grad on the input as .grad: it lives as long as
      // the input, which the model chunk still holds if this was its latest forward.
      if (chunk_input_[chunk] == u.stage_input) {
        MEMSIM_CHECK(chunk_input_grad_[chunk] == 0);
        chunk_input_grad_[chunk] = dy;
        Ref(dy);
      }
      Unref(u.stage_input);
      held_input_grad_ = dy;
      Ref(dy);
    }
    units_.erase(it);
  }

  bool learned_positions() const {
    return setup_.model.position_embedding_type == config::PositionEmbedding::kLearnedAbsolute;
  }

  // Megatron get_batch (§2.4): first stage tokens + position ids, last stage labels + loss mask;
  // broadcast over TP. Attention masks are not modelled (build.h).
  void Data(UnitState& u, bool pre, bool post) {
    Begin("data.get_batch");
    double bytes = 0;
    if (pre) {
      u.tokens = Alloc(8 * d_.T, Category::kActivations, "data.tokens");
      u.position_ids = Alloc(8 * d_.T, Category::kActivations, "data.position_ids");
      bytes += 16.0 * d_.T;
    }
    if (post) {
      u.labels = Alloc(8 * d_.T, Category::kActivations, "data.labels");
      u.loss_mask = Alloc(4 * d_.T, Category::kActivations, "data.loss_mask");
      bytes += 12.0 * d_.T;
    }
    Collective("tp", d_.t, bytes, Coll::kGather);
  }

  // VocabParallelEmbedding + LanguageModelEmbedding forward (§2.4). Returns layer 0's input.
  TensorId EmbeddingForward(UnitState& u) {
    const Bytes full = d_.act_bytes * d_.T * d_.h;
    Begin("embedding.lookup");
    if (d_.t > 1) {
      const TensorId mask = Alloc(d_.T, Category::kTemporaries, "embedding.input_mask");
      u.emb_indices = Alloc(8 * d_.T, Category::kActivations, "embedding.masked_input");
      Free(mask);
    } else {
      u.emb_indices = u.tokens;  // F.embedding saves the indices themselves
    }
    TensorId x = Alloc(full, Category::kTemporaries, "embedding.word_out");
    if (!d_.sp) Collective("tp", d_.t, static_cast<double>(full), Coll::kAllReduce);
    if (learned_positions()) {
      Begin("embedding.position");
      const TensorId pos = Alloc(full, Category::kTemporaries, "embedding.position_out");
      const TensorId sum = Alloc(full, Category::kTemporaries, "embedding.sum");
      Free(x);
      Free(pos);
      x = sum;
    }
    const bool last_is_transpose = !d_.sp && !d_.hidden_dropout;
    Begin("embedding.transpose");  // [b, s, h] -> [s, b, h] .contiguous()
    TensorId y = Alloc(full, last_is_transpose ? Category::kActivations : Category::kTemporaries,
                       last_is_transpose ? "embedding.out" : "embedding.transposed");
    Free(x);
    x = y;
    if (d_.sp) {
      Begin("embedding.scatter");
      y = Alloc(full / d_.t, d_.hidden_dropout ? Category::kTemporaries : Category::kActivations,
                d_.hidden_dropout ? "embedding.scattered" : "embedding.out");
      Collective("tp", d_.t, static_cast<double>(full), Coll::kGather);
      Free(x);
      x = y;
    }
    if (d_.hidden_dropout) {
      Begin("embedding.dropout");
      u.emb_dropout_mask =
          Alloc(d_.T * d_.h / d_.sigma, Category::kActivations, "embedding.dropout_mask");
      y = Alloc(full / d_.sigma, Category::kActivations, "embedding.out");
      Free(x);
      x = y;
    }
    return x;
  }

  void EmbeddingBackward(UnitState& u, TensorId dx) {
    const Bytes full = d_.act_bytes * d_.T * d_.h;
    if (d_.hidden_dropout) {
      Begin("embedding.dropout_bwd");
      const TensorId g = Alloc(full / d_.sigma, Category::kTemporaries, "embedding.d_dropout");
      Free(u.emb_dropout_mask);
      Free(dx);
      dx = g;
    }
    if (d_.sp) {
      Begin("embedding.scatter_bwd");
      const TensorId g = Alloc(full, Category::kTemporaries, "embedding.d_gathered");
      Collective("tp", d_.t, static_cast<double>(full), Coll::kGather);
      Free(dx);
      dx = g;
    }
    if (learned_positions()) {
      Begin("embedding.position_bwd");
      SmallWeightGrad(d_.max_positions * d_.h, "embedding.position_embeddings.grad");
      Free(u.position_ids);
    }
    // embedding_dense_backward: dense [V/t, h] grad in the weight dtype plus int64 sort buffers,
    // then AccumulateGrad -> DDP hook adds into main_grad -> freed (§2.4).
    Begin("embedding.wgrad");
    const TensorId sort = Alloc(24 * d_.T, Category::kTemporaries, "embedding.sort_buffers");
    SmallWeightGrad(d_.V / d_.t * d_.h, "embedding.word_embeddings.grad");
    Free(sort);
    Free(dx);
    Free(u.emb_indices);
  }

  // Final norm, output layer, vocab-parallel cross-entropy, loss_func (§2.5).
  void LossForward(UnitState& u) {
    const Bytes shard = d_.act_bytes * d_.T * d_.h / d_.sigma;
    Begin("final_norm");
    if (d_.layernorm)
      u.final_mean = Alloc(4 * d_.T / d_.sigma, Category::kActivations, "final_norm.mean");
    u.final_rstd = Alloc(4 * d_.T / d_.sigma, Category::kActivations, "final_norm.rstd");
    u.final_out = Alloc(shard, Category::kActivations, "final_norm.out");
    Begin("output_layer");  // Megatron ColumnParallelLinear: torch GEMM, "mpu" buffer with SP
    GemmWorkspace(/*torch_gemm=*/true);
    SpGather(d_.act_bytes * d_.T * d_.h, "output_layer.input_gather", /*torch_linear=*/true);
    const Bytes logits_bytes = d_.act_bytes * d_.T * (d_.V / d_.t);
    const TensorId logits = Alloc(logits_bytes, Category::kTemporaries, "output_layer.logits");
    Flops(2.0 * d_.T * d_.h * (d_.V / d_.t));
    Begin("cross_entropy");
    // `.float()` makes the fp32 copy that becomes the saved softmax (a no-op in fp32).
    if (d_.act_bytes != 4) {
      u.logits_fp32 = Alloc(4 * d_.T * (d_.V / d_.t), Category::kActivations, "loss.logits_fp32");
    } else {
      u.logits_fp32 = logits;  // fp32 logits are themselves the saved buffer
    }
    const TensorId mx = Alloc(4 * d_.T, Category::kTemporaries, "loss.logits_max");
    u.target_mask = Alloc(d_.T, Category::kActivations, "loss.target_mask");
    u.masked_target = Alloc(8 * d_.T, Category::kActivations, "loss.masked_target");
    const TensorId arange = Alloc(8 * d_.T, Category::kTemporaries, "loss.arange");
    const TensorId pred = Alloc(4 * d_.T, Category::kTemporaries, "loss.predicted_logits");
    const TensorId sum = Alloc(4 * d_.T, Category::kTemporaries, "loss.sum_exp_logits");
    const TensorId per_token = Alloc(4 * d_.T, Category::kTemporaries, "loss.per_token");
    Collective("tp", d_.t, 12.0 * d_.T, Coll::kAllReduce);
    for (TensorId id : {mx, arange, pred, sum}) Free(id);
    if (d_.act_bytes != 4) Free(logits);  // bf16 logits dropped when GPTModel.forward returns
    // loss_func: sum(losses * loss_mask) (MulBackward keeps loss_mask), [2] reporting copy.
    Begin("loss_func");
    const TensorId prod = Alloc(4 * d_.T, Category::kTemporaries, "loss.masked");
    u.loss = Alloc(8, Category::kActivations, "loss.output");
    report_losses_.push_back(Alloc(8, Category::kOther, "loss.report"));
    Free(prod);
    Free(per_token);
  }

  TensorId LossBackward(UnitState& u) {
    Begin("loss_bwd");
    const TensorId g = Alloc(4 * d_.T, Category::kTemporaries, "loss.d_per_token");
    Free(u.loss);
    Free(u.loss_mask);
    // _VocabParallelCrossEntropy.backward: gradient in place in the saved softmax.
    Begin("cross_entropy_bwd");
    const TensorId arange = Alloc(8 * d_.T, Category::kTemporaries, "loss.arange");
    const TensorId upd = Alloc(4 * d_.T, Category::kTemporaries, "loss.softmax_update");
    for (TensorId id : {arange, upd, g, u.target_mask, u.masked_target}) Free(id);
    TensorId dlogits = u.logits_fp32;
    if (d_.act_bytes != 4) {
      Begin("logits_float_bwd");  // ToCopyBackward: bf16 grad, fp32 buffer released
      dlogits = Alloc(d_.act_bytes * d_.T * (d_.V / d_.t), Category::kTemporaries,
                      "output_layer.d_logits");
      Free(u.logits_fp32);
    }
    Begin("output_layer_bwd");
    GemmWorkspace(/*torch_gemm=*/true);
    SpGather(d_.act_bytes * d_.T * d_.h, "output_layer.input_gather", true);
    // The output layer is Megatron's own ColumnParallelLinear (also under the TE spec). Its
    // backward hands autograd a [V/t, h] weight grad (megatron/core/tensor_parallel/layers.py
    // LinearWithGradAccumulationAndAsyncCommunication.backward): see WeightGradToAutograd.
    WeightGradToAutograd(d_.V / d_.t, d_.h, /*te_layer=*/false, "output_layer.wgrad");
    const TensorId din = RowParallelOutputGrad("output_layer.d_input");
    Free(dlogits);
    Free(u.final_out);
    Flops(4.0 * d_.T * d_.h * (d_.V / d_.t));
    Begin("final_norm_bwd");
    const TensorId dx =
        Alloc(d_.act_bytes * d_.T * d_.h / d_.sigma, Category::kTemporaries, "final_norm.d_input");
    SmallWeightGrad(d_.h, "final_norm.weight_grad");
    if (d_.layernorm) SmallWeightGrad(d_.h, "final_norm.bias_grad");
    for (TensorId id : {din, u.final_mean, u.final_rstd, u.last_output}) Free(id);
    return dx;
  }

  // dgrad of a column-parallel GEMM: full [s, b, h], reduce-scattered with SP into a new
  // [s/t, b, h] (`sub_grad_input`), all-reduced in place without.
  // Same allocation pattern as a row-parallel forward output.
  TensorId RowParallelOutputGrad(const std::string& label) {
    return RowParallelOutput(d_.act_bytes * d_.T * d_.h, label);
  }

  // ---- transformer layer forward (§2.2, §2.3) -----------------------------------------------

  // Emits core attention. keep = its internals stay saved for backward (no recompute).
  CoreAttn CoreAttnForward(int l, bool keep) {
    CoreAttn c;
    const std::int64_t at = d_.a / d_.t;
    const Bytes qbytes = d_.act_bytes * d_.T * d_.q / d_.t;
    if (d_.flash) {
      Begin("attn.core", l);
      c.out = Alloc(qbytes, Category::kActivations, L(l, "attn.core_out"));
      if (d_.npu) {
        // npu_fusion_attention: softmax_max and softmax_sum [b, a/t, s, 8] fp32 each.
        c.lse1 = Alloc(32 * d_.T * at, Category::kActivations, L(l, "attn.softmax_max"));
        c.lse2 = Alloc(32 * d_.T * at, Category::kActivations, L(l, "attn.softmax_sum"));
      } else {
        c.lse1 = Alloc(4 * d_.T * at, Category::kActivations, L(l, "attn.softmax_lse"));
      }
      if (!keep) {
        Free(c.lse1);
        Free(c.lse2);
        c.lse1 = c.lse2 = 0;
      }
      Flops(2.0 * d_.b * d_.s * d_.s * d_.q / d_.t);  // 4·b·s²·q/t, halved by the causal mask
      return c;
    }
    const Bytes s2 = d_.b * at * d_.s * d_.s;
    if (d_.g < d_.a) {
      // GQA: repeat_interleave materializes K and V to a heads (saved by the matmuls).
      Begin("attn.repeat_kv", l);
      c.k_rep = Alloc(qbytes, Category::kActivations, L(l, "attn.key_repeated"));
      c.v_rep = Alloc(qbytes, Category::kActivations, L(l, "attn.value_repeated"));
    }
    Begin("attn.scores", l);  // baddbmm over the "mpu" buffer -> new scores
    GemmWorkspace(/*torch_gemm=*/true);
    MpuBuffer(d_.act_bytes * s2);
    const TensorId scores = Alloc(d_.act_bytes * s2, Category::kTemporaries, L(l, "attn.scores"));
    Flops(2.0 * d_.b * d_.s * d_.s * d_.q / d_.t);
    Begin("attn.softmax", l);  // fused scale-mask-softmax saves its output
    c.probs = Alloc(d_.act_bytes * s2, Category::kActivations, L(l, "attn.probs"));
    Free(scores);
    if (d_.attention_dropout) {
      Begin("attn.dropout", l);
      c.dmask = Alloc(s2, Category::kActivations, L(l, "attn.dropout_mask"));
      c.dout = Alloc(d_.act_bytes * s2, Category::kActivations, L(l, "attn.dropout_out"));
      if (!keep) {
        Free(c.probs);
        Free(c.dmask);
        c.probs = c.dmask = 0;
      }
    }
    Begin("attn.context", l);  // bmm with V, then permute(...).contiguous()
    const TensorId ctx = Alloc(qbytes, Category::kTemporaries, L(l, "attn.context"));
    c.out = Alloc(qbytes, Category::kActivations, L(l, "attn.core_out"));
    Free(ctx);
    Flops(2.0 * d_.b * d_.s * d_.s * d_.q / d_.t);
    if (!keep) {
      for (TensorId id : {c.probs, c.dout, c.k_rep, c.v_rep}) Free(id);
      c.probs = c.dout = c.k_rep = c.v_rep = 0;
    }
    return c;
  }

  // One layer's forward. nograd: inside a full-recompute checkpoint (every tensor dropped after
  // its last forward use; `free_input` drops the layer input too). selective: core attention
  // checkpointed (§2.6). Returns the saved tensors; .output is the layer output.
  LayerActs LayerForward(int l, TensorId x, bool nograd, bool free_input, bool selective) {
    LayerActs a;
    const Bytes shard = d_.act_bytes * d_.T * d_.h / d_.sigma;
    const Bytes full = d_.act_bytes * d_.T * d_.h;
    const std::int64_t Ts = d_.T / d_.sigma;
    // LN1 + QKV (TELayerNormColumnParallelLinear).
    Begin("attn.ln_qkv", l);
    GemmWorkspace(false);
    if (d_.layernorm) a.ln1_mean = Alloc(4 * Ts, Category::kActivations, L(l, "ln1.mean"));
    a.ln1_rstd = Alloc(4 * Ts, Category::kActivations, L(l, "ln1.rstd"));
    a.ln1_out = Alloc(shard, Category::kActivations, L(l, "ln1.out"));
    TensorId g = SpGather(full, L(l, "attn.qkv_input_gather"), false);
    a.qkv = Alloc(d_.act_bytes * d_.T * (d_.q + 2 * d_.kv) / d_.t, Category::kActivations,
                  L(l, "attn.qkv"));
    Free(g);
    Flops(2.0 * d_.T * d_.h * (d_.q + 2 * d_.kv) / d_.t);
    if (nograd) {
      for (TensorId id : {a.ln1_mean, a.ln1_rstd, a.ln1_out}) Free(id);
    }
    if (setup_.model.qk_layernorm) {
      // q_layernorm / k_layernorm (attention.py get_query_key_value_tensors): new normalized q
      // and k, saved by attention, with their per-head statistics; v stays a view of qkv.
      Begin("attn.qk_norm", l);
      const Bytes stat = d_.layernorm ? 8 : 4;
      a.q_norm_out =
          Alloc(d_.act_bytes * d_.T * d_.q / d_.t, Category::kActivations, L(l, "attn.q_norm_out"));
      a.q_norm_stats =
          Alloc(stat * d_.T * d_.a / d_.t, Category::kActivations, L(l, "attn.q_norm_stats"));
      a.k_norm_out = Alloc(d_.act_bytes * d_.T * d_.kv / d_.t, Category::kActivations,
                           L(l, "attn.k_norm_out"));
      a.k_norm_stats =
          Alloc(stat * d_.T * d_.g / d_.t, Category::kActivations, L(l, "attn.k_norm_stats"));
      if (nograd) {
        Free(a.q_norm_stats);
        Free(a.k_norm_stats);
      }
    }
    // Core attention.
    a.core = CoreAttnForward(l, !(nograd || selective));
    if (nograd) {
      for (TensorId id : {a.qkv, a.q_norm_out, a.k_norm_out}) Free(id);
    }
    // Output projection (TERowParallelLinear).
    Begin("attn.proj", l);
    const TensorId proj = RowParallelOutput(full, L(l, "attn.proj_out"));
    Flops(2.0 * d_.T * d_.q / d_.t * d_.h);
    if (nograd) Free(a.core.out);
    // Bias-dropout-add: mask (if dropout), new residual.
    Begin("attn.bda", l);
    if (d_.hidden_dropout) {
      a.attn_bda_mask =
          Alloc(d_.T * d_.h / d_.sigma, Category::kActivations, L(l, "attn.bda_mask"));
    }
    a.attn_residual = Alloc(shard, Category::kActivations, L(l, "attn.residual"));
    Free(proj);
    if (nograd) Free(a.attn_bda_mask);
    if (free_input) Free(x);
    // LN2 + FC1.
    Begin("mlp.ln_fc1", l);
    if (d_.layernorm) a.ln2_mean = Alloc(4 * Ts, Category::kActivations, L(l, "ln2.mean"));
    a.ln2_rstd = Alloc(4 * Ts, Category::kActivations, L(l, "ln2.rstd"));
    a.ln2_out = Alloc(shard, Category::kActivations, L(l, "ln2.out"));
    g = SpGather(full, L(l, "mlp.fc1_input_gather"), false);
    a.fc1_out = Alloc(d_.act_bytes * d_.T * d_.gamma * d_.ffn / d_.t, Category::kActivations,
                      L(l, "mlp.fc1_out"));
    Free(g);
    Flops(2.0 * d_.T * d_.h * d_.gamma * d_.ffn / d_.t);
    if (nograd) {
      for (TensorId id : {a.ln2_mean, a.ln2_rstd, a.ln2_out}) Free(id);
    }
    // Activation (GeLU / SwiGLU): new output, input kept.
    Begin("mlp.act", l);
    a.act_out =
        Alloc(d_.act_bytes * d_.T * d_.ffn / d_.t, Category::kActivations, L(l, "mlp.act_out"));
    if (nograd) Free(a.fc1_out);
    // FC2 (TERowParallelLinear).
    Begin("mlp.fc2", l);
    const TensorId fc2 = RowParallelOutput(full, L(l, "mlp.fc2_out"));
    Flops(2.0 * d_.T * d_.ffn / d_.t * d_.h);
    if (nograd) Free(a.act_out);
    Begin("mlp.bda", l);
    if (d_.hidden_dropout) {
      a.mlp_bda_mask = Alloc(d_.T * d_.h / d_.sigma, Category::kActivations, L(l, "mlp.bda_mask"));
    }
    a.output = Alloc(shard, Category::kActivations, L(l, "mlp.residual"));
    Free(fc2);
    if (nograd) {
      Free(a.mlp_bda_mask);
      Free(a.attn_residual);
    }
    return a;
  }

  // ---- transformer layer backward (§3.1, §3.2) -----------------------------------------------

  TensorId CoreAttnBackward(int l, const CoreAttn& c, TensorId d_core, TensorId extra_free) {
    const std::int64_t at = d_.a / d_.t;
    const Bytes qbytes = d_.act_bytes * d_.T * d_.q / d_.t;
    const Bytes kvbytes = d_.act_bytes * d_.T * d_.kv / d_.t;
    TensorId dq, dk, dv;
    if (d_.flash) {
      Begin("attn.core_bwd", l);
      TensorId acc = 0, sd = 0;
      if (!d_.npu) {
        // FlashAttention-2 backward: fp32 dq accumulator and softmax_d [b, a/t, s].
        acc = Alloc(4 * d_.T * d_.q / d_.t, Category::kTemporaries, L(l, "attn.dq_accum"));
        sd = Alloc(4 * d_.T * at, Category::kTemporaries, L(l, "attn.softmax_d"));
      }
      dq = Alloc(qbytes, Category::kTemporaries, L(l, "attn.d_query"));
      dk = Alloc(kvbytes, Category::kTemporaries, L(l, "attn.d_key"));
      dv = Alloc(kvbytes, Category::kTemporaries, L(l, "attn.d_value"));
      for (TensorId id : {acc, sd, d_core, c.out, c.lse1, c.lse2, extra_free}) Free(id);
      Flops(5.0 * d_.b * d_.s * d_.s * d_.q / d_.t);
    } else {
      const Bytes s2 = d_.act_bytes * d_.b * at * d_.s * d_.s;
      Begin("attn.context_bwd", l);
      GemmWorkspace(/*torch_gemm=*/true);
      TensorId dp = Alloc(s2, Category::kTemporaries, L(l, "attn.d_probs"));
      const TensorId dvr = Alloc(qbytes, Category::kTemporaries, L(l, "attn.d_value_repeated"));
      for (TensorId id : {d_core, c.dout, c.v_rep}) Free(id);
      Flops(4.0 * d_.b * d_.s * d_.s * d_.q / d_.t);
      if (d_.attention_dropout) {
        Begin("attn.dropout_bwd", l);
        const TensorId g = Alloc(s2, Category::kTemporaries, L(l, "attn.d_softmax"));
        Free(dp);
        Free(c.dmask);
        dp = g;
      }
      Begin("attn.scores_bwd", l);  // softmax backward in place, then baddbmm backward
      dq = Alloc(qbytes, Category::kTemporaries, L(l, "attn.d_query"));
      const TensorId dkr = Alloc(qbytes, Category::kTemporaries, L(l, "attn.d_key_repeated"));
      for (TensorId id : {dp, c.probs, c.k_rep}) Free(id);
      Flops(4.0 * d_.b * d_.s * d_.s * d_.q / d_.t);
      if (d_.g < d_.a) {
        Begin("attn.repeat_kv_bwd", l);
        dk = Alloc(kvbytes, Category::kTemporaries, L(l, "attn.d_key"));
        dv = Alloc(kvbytes, Category::kTemporaries, L(l, "attn.d_value"));
        Free(dkr);
        Free(dvr);
      } else {
        dk = dkr;
        dv = dvr;
      }
      Free(c.out);
      Free(extra_free);
    }
    // SplitBackward of mixed_qkv: the three grads concatenated into a new tensor.
    Begin("attn.qkv_grad", l);
    const TensorId dqkv = Alloc(d_.act_bytes * d_.T * (d_.q + 2 * d_.kv) / d_.t,
                                Category::kTemporaries, L(l, "attn.d_qkv"));
    Free(dq);
    Free(dk);
    Free(dv);
    return dqkv;
  }

  // One layer's backward, freeing its saved tensors in reverse order. free_x / free_dy: whether
  // the layer input and the incoming grad are this layer's to drop (not the schedule's).
  TensorId LayerBackward(int l, const LayerActs& a, TensorId x, bool free_x, TensorId dy,
                         bool free_dy) {
    const Bytes shard = d_.act_bytes * d_.T * d_.h / d_.sigma;
    const Bytes full = d_.act_bytes * d_.T * d_.h;
    const bool bias = setup_.model.add_bias_linear;
    const bool selective = tc_.recompute_granularity == RecomputeGranularity::kSelective;
    // MLP bias-dropout-add.
    Begin("mlp.bda_bwd", l);
    TensorId dfc2 = dy;
    if (a.mlp_bda_mask) {
      dfc2 = Alloc(shard, Category::kTemporaries, L(l, "mlp.d_fc2_out"));
      Free(a.mlp_bda_mask);
    }
    // FC2: gather dY (SP), dgrad, wgrad into main_grad (gradient_accumulation_fusion).
    Begin("mlp.fc2_bwd", l);
    GemmWorkspace(false);
    TensorId g = SpGather(full, L(l, "mlp.d_fc2_gather"), false);
    const TensorId dact =
        Alloc(d_.act_bytes * d_.T * d_.ffn / d_.t, Category::kTemporaries, L(l, "mlp.d_act_out"));
    if (bias) SmallWeightGrad(d_.h, L(l, "mlp.fc2.bias_grad"));
    WeightGradToAutograd(d_.h, d_.ffn / d_.t, d_.te, L(l, "mlp.fc2.wgrad"));
    Free(g);
    Free(a.act_out);
    if (dfc2 != dy) Free(dfc2);
    Flops(4.0 * d_.T * d_.ffn / d_.t * d_.h);
    Begin("mlp.act_bwd", l);
    const TensorId dfc1 = Alloc(d_.act_bytes * d_.T * d_.gamma * d_.ffn / d_.t,
                                Category::kTemporaries, L(l, "mlp.d_fc1_out"));
    Free(a.fc1_out);
    Free(dact);
    // FC1 (re-gather LN2 output with SP), then LN2 backward.
    Begin("mlp.ln_fc1_bwd", l);
    g = SpGather(full, L(l, "mlp.fc1_input_gather"), false);
    const TensorId dln2out = RowParallelOutputGrad(L(l, "mlp.d_ln2_out"));
    if (bias) SmallWeightGrad(d_.gamma * d_.ffn / d_.t, L(l, "mlp.fc1.bias_grad"));
    WeightGradToAutograd(d_.gamma * d_.ffn / d_.t, d_.h, d_.te, L(l, "mlp.fc1.wgrad"));
    Free(g);
    Free(dfc1);
    Free(a.ln2_out);
    Flops(4.0 * d_.T * d_.h * d_.gamma * d_.ffn / d_.t);
    Begin("mlp.ln2_bwd", l);
    const TensorId dln2in = Alloc(shard, Category::kTemporaries, L(l, "mlp.d_ln2_in"));
    NormWeightGrads(l, "ln2");
    for (TensorId id : {dln2out, a.ln2_mean, a.ln2_rstd, a.attn_residual}) Free(id);
    // Residual: autograd sums the two branch grads into a new tensor.
    Begin("attn.residual_bwd", l);
    const TensorId dres = Alloc(shard, Category::kTemporaries, L(l, "attn.d_residual"));
    Free(dln2in);
    if (free_dy) Free(dy);
    // Attention bias-dropout-add and projection.
    Begin("attn.bda_bwd", l);
    TensorId dproj = dres;
    if (a.attn_bda_mask) {
      dproj = Alloc(shard, Category::kTemporaries, L(l, "attn.d_proj_out"));
      Free(a.attn_bda_mask);
    }
    Begin("attn.proj_bwd", l);
    g = SpGather(full, L(l, "attn.d_proj_gather"), false);
    const TensorId dcore =
        Alloc(d_.act_bytes * d_.T * d_.q / d_.t, Category::kTemporaries, L(l, "attn.d_core_out"));
    if (bias) SmallWeightGrad(d_.h, L(l, "attn.proj.bias_grad"));
    WeightGradToAutograd(d_.h, d_.q / d_.t, d_.te, L(l, "attn.proj.wgrad"));
    Free(g);
    if (dproj != dres) Free(dproj);
    Flops(4.0 * d_.T * d_.q / d_.t * d_.h);
    // Core attention; with selective recompute its forward is re-run first (§2.6).
    TensorId dqkv;
    if (selective) {
      prefix_ = "recompute.";
      const CoreAttn rec = CoreAttnForward(l, true);
      prefix_.clear();
      dqkv = CoreAttnBackward(l, rec, dcore, a.core.out);
    } else {
      dqkv = CoreAttnBackward(l, a.core, dcore, 0);
    }
    for (TensorId id : {a.qkv, a.q_norm_out, a.k_norm_out, a.q_norm_stats, a.k_norm_stats}) {
      Free(id);
    }
    // QKV (re-gather LN1 output with SP), LN1 backward, residual sum -> grad of the layer input.
    Begin("attn.ln_qkv_bwd", l);
    g = SpGather(full, L(l, "attn.qkv_input_gather"), false);
    const TensorId dln1out = RowParallelOutputGrad(L(l, "attn.d_ln1_out"));
    if (setup_.model.add_bias_linear || setup_.model.add_qkv_bias) {
      SmallWeightGrad((d_.q + 2 * d_.kv) / d_.t, L(l, "attn.qkv.bias_grad"));
    }
    WeightGradToAutograd((d_.q + 2 * d_.kv) / d_.t, d_.h, d_.te, L(l, "attn.qkv.wgrad"));
    Free(g);
    Free(dqkv);
    Free(a.ln1_out);
    Flops(4.0 * d_.T * d_.h * (d_.q + 2 * d_.kv) / d_.t);
    Begin("attn.ln1_bwd", l);
    const TensorId dln1in = Alloc(shard, Category::kTemporaries, L(l, "attn.d_ln1_in"));
    NormWeightGrads(l, "ln1");
    for (TensorId id : {dln1out, a.ln1_mean, a.ln1_rstd}) Free(id);
    if (free_x) Free(x);
    Begin("residual_bwd", l);
    const TensorId dx = Alloc(shard, Category::kTemporaries, L(l, "d_input"));
    Free(dln1in);
    Free(dres);
    return dx;
  }

  const config::Setup& setup_;
  const config::TrainingConfig& tc_;
  const ModelDims d_;
  const int rank_;
  std::vector<ParamTensor> params_;
  std::vector<GradBuffer> buffers_;
  std::vector<std::vector<int>> groups_;
  std::vector<MainTensor> main_;
  std::vector<Segment> segments_;
  double peak_flops_ = 0, bandwidth_ = 0;

  Program program_;
  std::vector<Bytes> sizes_;  // by tensor id
  std::vector<TensorId> param_ids_;
  std::map<std::pair<int, int>, UnitState> units_;
  std::vector<ScheduleStep> steps_;  // this rank's schedule, the same every iteration
  int step_ = 0;                     // index into steps_ of the unit being emitted
  TensorId pending_recv_forward_ = 0, pending_recv_backward_ = 0;  // received ahead
  TensorId held_recv_backward_ = 0, held_input_grad_ = 0;          // kept by Python locals
  // Per model chunk: the input its TransformerBlock keeps from the latest forward
  // (set_input_tensor) and that input's retained .grad once its backward ran (0 = none).
  std::vector<TensorId> chunk_input_, chunk_input_grad_;
  std::map<TensorId, int> refs_;  // holders of the tensors managed by Ref/Unref
  std::map<std::pair<std::int64_t, std::int64_t>, TensorId> dummy_wgrads_;  // TE get_dummy_wgrad
  std::vector<TensorId> grad_copies_;
  std::vector<TensorId> report_losses_;
  bool cublas_done_[2] = {false, false};  // main thread, autograd thread
  bool on_autograd_thread_ = false;        // inside a backward_step's autograd run
  bool te_done_ = false;
  TensorId mpu_id_ = 0;
  Bytes mpu_bytes_ = 0;
  // Megatron-FSDP optim_grads (FsdpSetup): bucket of each param (-1 none), gradient sites per
  // param, gradient sites still missing per bucket in this backward, temporary bucket tensors,
  // buckets reduce-scattered and still held (oldest first), their elements, the queue capacity.
  std::vector<int> fsdp_bucket_of_, fsdp_expected_, fsdp_missing_;
  std::vector<TensorId> fsdp_temp_;
  std::deque<int> fsdp_queue_;
  std::int64_t fsdp_queued_ = 0, fsdp_capacity_ = 0;

  int iteration_ = 0;
  Phase phase_ = Phase::kInit;
  int micro_batch_ = -1;
  std::string prefix_;
  bool open_ = false;
  double flops_ = 0, extra_bytes_ = 0, comm_us_ = 0;
};

}  // namespace

Program Build(const config::Setup& setup, int pipeline_rank) {
  return Builder(setup, pipeline_rank).Run();
}

StaticSizes ComputeStaticSizes(const config::Setup& setup, int pipeline_rank) {
  const ModelDims d = ComputeDims(setup);
  const std::vector<ParamTensor> params = StageParams(setup, pipeline_rank);
  const std::vector<GradBuffer> buffers = LayoutGradBuffers(setup, pipeline_rank, params);
  const bool dist = setup.training.use_distributed_optimizer;
  StaticSizes out;
  std::int64_t padded = 0;
  for (const ParamTensor& pt : params) out.parameter_count += pt.numel;
  for (const GradBuffer& buf : buffers) padded += buf.numel_padded;
  if (dist) {
    for (const ShardSlice& s : ShardSlices(d, params, buffers)) out.main_param_count += s.numel;
  } else {
    out.main_param_count = out.parameter_count;
  }
  out.parameter_bytes = (dist || d.fsdp ? padded : out.parameter_count) * d.param_bytes;
  out.gradient_bytes = (d.fsdp_shard_grads ? padded / d.dp_cp : padded) * d.grad_bytes;
  out.main_param_bytes = d.mixed ? 4 * out.main_param_count : 0;
  if (d.fsdp && d.mixed) out.main_param_bytes = 4 * (dist ? padded / d.dp_cp : padded);
  if (setup.training.optimizer == OptimizerKind::kAdam) {
    out.optimizer_state_bytes = 8 * out.main_param_count;
  } else if (setup.training.sgd_momentum > 0.0) {
    out.optimizer_state_bytes = 4 * out.main_param_count;
  }
  out.main_grad_copy_bytes = d.mixed && d.grad_bytes == 2 ? 4 * out.main_param_count : 0;
  return out;
}

ClosedFormEstimate ComputeClosedFormEstimate(const config::Setup& setup, int pipeline_rank) {
  const ModelDims d = ComputeDims(setup);
  const config::TrainingConfig& tc = setup.training;
  const int r = pipeline_rank;
  ClosedFormEstimate e;
  const double h = static_cast<double>(d.h);
  // compute_weight_and_optimizer_memory: per layer 2h²·((1 + g/a)·q/h + ffn/h·(3/2 if gated) +
  // 2/h) (attention, MLP, the two norms).
  const double per_layer = 2 * h * h *
                           ((1.0 + static_cast<double>(d.g) / d.a) * static_cast<double>(d.q) / h +
                            static_cast<double>(d.ffn) / h * (d.gamma == 2 ? 1.5 : 1.0) + 2 / h);
  const double layers_here = static_cast<double>(d.L) / d.p;
  const double embedding = static_cast<double>(d.V) * h;
  double params = per_layer * layers_here;
  if (r == 0) params += embedding;
  if (r == d.p - 1) {
    params += h;  // final norm
    if (!d.tied || d.p > 1) params += embedding;
  }
  e.parameters_on_rank = params / d.t;
  const bool dist = tc.use_distributed_optimizer;
  if (!d.mixed) {
    e.bytes_per_parameter = dist ? 8 + 8.0 / d.dp_cp : 16;
  } else if (d.grad_bytes == 2) {
    e.bytes_per_parameter = dist ? 4 + 16.0 / d.dp_cp : 20;
  } else {
    e.bytes_per_parameter = dist ? 6 + 12.0 / d.dp_cp : 18;
  }
  if (tc.optimizer == OptimizerKind::kSgd) {
    e.bytes_per_parameter -= (tc.sgd_momentum > 0 ? 4.0 : 8.0) / (dist ? d.dp_cp : 1);
  }
  e.weight_and_optimizer_bytes =
      static_cast<Bytes>(std::llround(e.parameters_on_rank * e.bytes_per_parameter));
  // Activations per layer (Korthikanti et al. 2022 Table 2; theoretical_memory_usage.py), in
  // units of s·b·h with 16-bit activations, scaled to B_a.
  const double sbh = static_cast<double>(d.T) * h;
  const double t = d.t;
  const double masks = d.hidden_dropout ? 2.0 : 0.0;
  const double mlp =
      (d.gamma == 2 ? 6.0 : 4.0) * static_cast<double>(d.ffn) / h;  // 4ffn/h, 6 gated
  const double attn_s2 = static_cast<double>(d.a) * d.s / h * (d.attention_dropout ? 5.0 : 2.0);
  const bool core_saved = !d.flash && tc.recompute_granularity == RecomputeGranularity::kNone;
  double layer;
  if (tc.recompute_granularity == RecomputeGranularity::kFull) {
    layer = 2.0 * sbh / d.sigma;
  } else if (d.sp) {
    layer = sbh * (16.0 + masks + mlp + (core_saved ? attn_s2 : 0.0)) / t;
  } else {
    // sbh·(10 + 24/t) for ffn = 4h: replicated 4 (LN inputs) + 2 (QKV input) + 2 (MLP input)
    // + masks; split 6 (QKV) + 2 (proj input) + mlp.
    layer = sbh * (8.0 + masks + (8.0 + mlp) / t + (core_saved ? attn_s2 / t : 0.0));
  }
  layer *= static_cast<double>(d.act_bytes) / 2.0;
  e.activation_bytes_per_layer = static_cast<Bytes>(std::llround(layer));
  double in_flight = std::min(d.p - r, d.m);
  if (d.v > 1) in_flight = d.p * (1.0 + (d.p - 1.0) / (d.p * d.v)) - r;  // interleaved penalty
  if (d.p == 1) in_flight = 1;
  e.in_flight_micro_batches = static_cast<int>(std::ceil(in_flight));
  double act = layer * layers_here * in_flight;
  if (r == 0) {
    // Input ids (8sb) and embedding dropout mask (sbh) per in-flight micro-batch, over t.
    act += (8.0 * d.T + (d.hidden_dropout ? sbh : 0.0)) * in_flight / t;
  }
  if (r == d.p - 1) act += 4.0 * sbh * (1.0 + static_cast<double>(d.V) / h) / t;
  e.activation_bytes = static_cast<Bytes>(std::llround(act));
  e.total_bytes = e.weight_and_optimizer_bytes + e.activation_bytes;
  return e;
}

}  // namespace memsim::workload
