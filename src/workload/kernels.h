// Kernels: what the model modules share below the module level on one rank -- the persistent
// workspaces that GEMMs create on first use, Megatron's global memory buffer, the tensor- and
// sequence-parallel communication patterns around a linear layer, and the hand-over of weight
// gradients to autograd (whose fate the data-parallel wrapper decides, data_parallel.h).
// Allocations go through the Emitter; sizes in bytes. Not modelled: torch_npu's workspaces
// (outside the caching allocator on Ascend), cuDNN workspaces.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "workload/emitter.h"
#include "workload/facts.h"
#include "workload/model.h"

namespace memsim::workload {

struct PeftKernels;  // hf_peft.h

// Receives every weight gradient a backward hands to autograd (AccumulateGrad). The tensor is
// allocated in the current op; the sink frees it or keeps it as the parameter's .grad.
class GradSink {
 public:
  virtual ~GradSink() = default;
  // `grad` is the gradient of the parameter named `param` (a ParamTensor name), in the
  // parameter's dtype.
  virtual void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) = 0;
};

class Kernels {
 public:
  // The sink must outlive the Kernels.
  Kernels(Emitter& em, const ModelDims& dims, const FrameworkFacts& facts, GradSink& sink)
      : em_(em), d_(&dims), f_(&facts), sink_(sink) {}

  // The dimensions the following ops run with: the evaluation pass (evaluation.h) runs the same
  // model, workspaces and caches on batches of another size. `dims` must outlive its use.
  void SetDims(const ModelDims& dims) { d_ = &dims; }

  // Whether GEMMs now run on the autograd engine's device thread (inside backward_step,
  // recompute included): they get their own cuBLAS workspace.
  void SetAutogradThread(bool on) { on_autograd_thread_ = on; }

  // A GEMM through PyTorch (cuBLAS; torch_gemm) or Transformer Engine: the first one on a
  // thread creates the persistent workspace, on CUDA only. PyTorch aten/src/ATen/cuda/
  // CublasHandlePool.cpp (getCurrentCUDABlasHandle, one handle per thread;
  // getChosenWorkspaceSize, default ":4096:2:16:8" = 2 x 4 MiB + 8 x 16 KiB, 8 x 4 MiB on
  // sm >= 90); the autograd engine runs CUDA backward on its own thread
  // (torch/csrc/autograd/engine.cpp). Transformer Engine keeps one module-level workspace
  // (transformer_engine/pytorch/module/base.py get_workspace; get_cublas_workspace_size_bytes:
  // 32 MiB on sm >= 90, else 4 MiB).
  void GemmWorkspace(bool torch_gemm);
  // Megatron GlobalMemoryBuffer.get_tensor (megatron/core/utils.py), key ("mpu", dtype):
  // allocated on first use or when too small; the old buffer is dropped after the new exists.
  void MpuBuffer(Bytes size_bytes);

  // Sequence-parallel all-gather of an [s/t, b, h] input before a column-parallel GEMM
  // (megatron/core/tensor_parallel/layers.py, TE's linear modules): TE allocates a transient full
  // tensor (returned; the caller frees it); Megatron's own linears use the "mpu" buffer (0).
  // torch_linear: a Megatron ColumnParallelLinear. 0 without sequence parallelism.
  TensorId SpGather(Bytes full_bytes, const std::string& label, bool torch_linear);
  // Row-parallel GEMM output: with SP a full [s, b, h] output reduce-scattered into a new
  // [s/t, b, h] (the full one freed); without SP an all-reduce in place. The same allocation
  // pattern is the dgrad of a column-parallel GEMM (ColumnParallelInputGrad).
  TensorId RowParallelOutput(Bytes full_bytes, const std::string& label);
  TensorId ColumnParallelInputGrad(const std::string& label);

  // The gradient of a 1-D parameter (norm weight, bias) of `numel` elements in the parameter
  // dtype, handed to autograd.
  void SmallWeightGrad(std::int64_t numel, const std::string& label, const std::string& param);
  // The norm's weight (and LayerNorm bias) grads of layer `layer`'s norm `norm` ("ln1").
  void NormWeightGrads(int layer, const char* norm);
  // The [rows, cols] weight grad a linear layer hands to autograd. With gradient-accumulation
  // fusion the GEMM accumulated into main_grad and this is a dummy: Transformer Engine's cached
  // one (get_dummy_wgrad: one per shape, made at first use, kept for the run) when the layer's
  // release caches it, else a fresh tensor. Without fusion it is the real wgrad. Bytes in the
  // activation dtype (Megatron `input.dtype`; TE `weight.dtype`, equal in 16-bit training); a
  // parameter of another dtype (fp32 weights under autocast) gets the cast copy autograd's
  // ToCopyBackward makes. te_layer: a TE module (else Megatron's own linear).
  void WeightGradToAutograd(std::int64_t rows, std::int64_t cols, bool te_layer,
                            const std::string& label, const std::string& param);

  // A Parameter whose gradient two ops of one backward produce: the output layer's weight tied
  // to the word embedding on the same stage (Megatron GPTModel with
  // share_embeddings_and_output_weights at PP 1, a tied Hugging Face lm_head). Autograd runs the
  // Parameter's AccumulateGrad node once, when both grads have arrived (torch/csrc/autograd/
  // engine.cpp: a node is ready when its dependency count reaches zero), so the first grad (the
  // output layer's: it runs first in backward) waits in the node's InputBuffer through the
  // layers' backward, and the second is summed into it (torch/csrc/autograd/input_buffer.cpp
  // accumulate): in place when the buffer holds the only reference to the first grad and to
  // its storage (can_accumulate_inplace), else into a new tensor of the grad's size. Transformer
  // Engine's cached dummy wgrad is the second case: get_dummy_wgrad (module/base.py) returns
  // `.detach()` of the tensor its cache keeps, so the storage has two users. The sink gets the
  // sum (AccumulateSharedGrads). docs/validation.md, fix 20.
  void ShareGradAccumulator(const std::string& param);
  // Sums the grads waiting for shared parameters (ShareGradAccumulator) and hands each sum to
  // the sink, in a new op named `op`; emits nothing when none waits. Called after the second
  // producer's own temporaries are freed: the engine accumulates when the Function has returned.
  void AccumulateSharedGrads(const std::string& op);

  // Autocast over weights of another dtype (plain PyTorch with fp32 weights under bf16/fp16
  // autocast; never under Megatron, whose weights are in the training dtype): a linear's forward
  // casts its [rows, cols] weight `param` to the autocast dtype (aten/src/ATen/autocast_mode.cpp
  // cached_cast). The copy of a leaf parameter is kept in autocast's cache until the outermost
  // autocast region exits (EndAutocastRegion: the end of the micro-batch's forward), and saved
  // by the GEMM for its backward unless grad is off. In backward (recompute) the cache is a
  // fresh, short one and only the saved reference is modelled. Returns the copy when the GEMM
  // saves it (the caller releases it with ReleaseWeightCopy at the GEMM's backward), else 0; 0
  // too when the dtypes agree (no copy).
  TensorId CastWeight(std::int64_t rows, std::int64_t cols, const std::string& param, bool saved);
  void ReleaseWeightCopy(TensorId copy) { em_.Unref(copy); }
  void EndAutocastRegion();

  // PEFT (hf_peft.h), set once before the first op; null = none. Then a frozen parameter gets
  // no gradient (SmallWeightGrad, WeightGradToAutograd emit nothing for it), a 4-bit weight is
  // dequantised into a transient copy at each use in forward (CastWeight) and backward
  // (WeightGradToAutograd) instead of an autocast copy, and a weight with LoRA adapters runs
  // them next to its GEMM: forward (CastWeight) saves lora_A's output [T, r] (and the dropout
  // mask and output [T, in] with lora_dropout) and makes lora_B's output and its scaled copy
  // [T, out] as transients; backward (WeightGradToAutograd) hands the adapters' grads to the
  // sink and frees what forward saved. `peft` must outlive the Kernels.
  void SetPeft(const PeftKernels* peft) { peft_ = peft; }
  // Whether `param` gets a gradient: false for a frozen PEFT base weight (true without PEFT).
  bool Trainable(const std::string& param) const { return !GradTarget(param).empty(); }
  // Whether autograd keeps the input of the linear whose weight is `param` for the backward.
  // MmBackward0 / AddmmBackward0 read the input only in the weight's formula
  // (tools/autograd/derivatives.yaml mm: `mat2: mm_mat2_backward(grad, self, ...)`, the input's
  // own formula reads its sizes and strides only), and the generated code saves a tensor used by
  // one formula under `should_compute_output` of that input (tools/autograd/gen_variable_type.py
  // guard_for), so a frozen weight keeps nothing. A LoRA adapter on it without dropout feeds the
  // same input to lora_A, whose weight is trained, so it stays kept.
  bool KeepsLinearInput(const std::string& param) const;
  // Whether the linear whose weight is `param` returns its output in its input's dtype rather
  // than the autocast dtype: a bitsandbytes 4-bit or 8-bit linear (nn/modules.py
  // Linear4bit.forward: `x = x.to(self.compute_dtype)` ... `out.to(inp_dtype)`, bitsandbytes
  // 0.43.3; autograd/_functions.py MatMul8bitLt.forward `.to(A.dtype)`, 0.45).
  bool ReturnsInputDtype(const std::string& param) const;

 private:
  // An LLM.int8 linear's forward temporaries (hf_peft.h PeftKernels::eight_bit), in the open op.
  void Int8MatmulForward(std::int64_t rows, std::int64_t cols, const std::string& param);
  Emitter& em_;
  const ModelDims* d_;
  const FrameworkFacts* f_;
  GradSink& sink_;
  bool cublas_done_[2] = {false, false};  // main thread, autograd thread
  bool on_autograd_thread_ = false;
  bool te_done_ = false;
  TensorId mpu_id_ = 0;
  Bytes mpu_bytes_ = 0;
  std::map<std::pair<std::int64_t, std::int64_t>, TensorId> dummy_wgrads_;  // by (rows, cols)
  // A shared parameter's grads so far in this backward (ShareGradAccumulator). first_cached:
  // the first is TE's cached dummy, whose storage the cache keeps (never freed here).
  struct SharedGrad {
    TensorId first = 0, second = 0;
    bool first_cached = false;
    Bytes bytes = 0;  // of the second grad (the parameter's dtype): the sum's size
    std::string label;
  };
  std::map<std::string, SharedGrad> shared_grads_;  // by parameter name
  // Hands `grad` (`bytes`, of the trainable parameter `param`) to autograd: the sink takes it,
  // or it waits for a shared parameter's second producer. cached: TE's cached dummy (the sink
  // never sees it unless the parameter is shared).
  void ToAutograd(TensorId grad, Bytes bytes, bool cached, const std::string& param,
                  const std::string& label);
  std::map<std::string, TensorId> autocast_cache_;  // param -> its cast copy, this region
  const PeftKernels* peft_ = nullptr;
  std::map<std::string, std::vector<TensorId>> adapter_saved_;  // base weight -> saved tensors

  // PEFT helpers (kernels.cc): the sink's name for `param`'s grad, "" when it gets none.
  std::string GradTarget(const std::string& param) const;
  void AdaptersForward(const std::string& param, bool saved);
  void AdaptersBackward(const std::string& param);
};

// "layer{l}.{name}", the label of a tensor of transformer layer l.
std::string LayerLabel(int layer, std::string_view name);

}  // namespace memsim::workload
