#include "workload/kernels.h"

#include "core/check.h"
#include "workload/hf_peft.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string_view>

namespace memsim::workload {
namespace {

// PyTorch CublasHandlePool.cpp: default ":4096:2:16:8" = 2·4 MiB + 8·16 KiB; 8 x 4 MiB on sm >= 90.
constexpr Bytes kCublasWorkspaceBytes = 2 * 4096 * kKiB + 8 * 16 * kKiB;
constexpr Bytes kCublasWorkspaceHopperBytes = 8 * 4096 * kKiB;
// TE module/base.py get_cublas_workspace_size_bytes: 32 MiB on sm >= 90, else 4 MiB.
constexpr Bytes kTeWorkspaceBytes = 4 * kMiB;
constexpr Bytes kTeWorkspaceHopperBytes = 32 * kMiB;

// Whether PEFT's LoRA forward casts the linear's input x to the adapters' dtype before
// lora_A reads it: `x = self._cast_input_dtype(x, lora_A.weight.dtype)`, `x.to(dtype)` when
// the dtypes differ (peft src/peft/tuners/lora/layer.py Linear.forward, tuners_utils.py
// _cast_input_dtype, at 5d602fdbff). The 4-bit layer casts only outside autocast
// (lora/bnb.py Linear4bit.forward: `requires_conversion = not torch.is_autocast_enabled()`).
// Modelled for 16-bit base weights only, whose linears all read act_bytes inputs; under
// autocast over fp32 weights the inputs' dtypes differ by linear and the cast is not modelled.
bool LoraCastsInput(const PeftKernels& peft, const ModelDims& d, const FrameworkFacts& f,
                    const std::string& param) {
  if (d.weight_cast || d.act_bytes == peft.adapter_bytes) return false;
  return !(f.hf_native_amp && peft.four_bit.count(param) != 0);
}

}  // namespace

// Built by hand rather than through fmt::format: about 90,000 labels a default run, and the
// format string's parsing was a seventh of the run's instructions (docs/performance.md).
std::string LayerLabel(int layer, std::string_view name) {
  constexpr std::string_view kPrefix = "layer";
  char digits[16];
  char* digits_end = std::to_chars(digits, digits + sizeof digits, layer).ptr;
  std::string out;
  out.reserve(kPrefix.size() + static_cast<std::size_t>(digits_end - digits) + 1 + name.size());
  out.append(kPrefix).append(std::string_view(digits, static_cast<std::size_t>(digits_end - digits))).append(1, '.').append(name);
  return out;
}

void Kernels::GemmWorkspace(bool torch_gemm) {
  if (f_->npu) return;
  if (torch_gemm || !f_->te) {
    const bool autograd_thread = on_autograd_thread_;
    bool& done = cublas_done_[autograd_thread ? 1 : 0];
    if (done) return;
    done = true;
    em_.Alloc(f_->hopper ? kCublasWorkspaceHopperBytes : kCublasWorkspaceBytes, Category::kWorkspace,
              autograd_thread ? "workspace.cublas_autograd" : "workspace.cublas");
  } else {
    if (te_done_) return;
    te_done_ = true;
    em_.Alloc(f_->hopper ? kTeWorkspaceHopperBytes : kTeWorkspaceBytes, Category::kWorkspace,
              "workspace.te_cublas");
  }
}

void Kernels::MpuBuffer(Bytes size_bytes) {
  if (size_bytes <= mpu_bytes_) return;
  const TensorId old = mpu_id_;
  mpu_id_ = em_.Alloc(size_bytes, Category::kWorkspace, "workspace.mpu");
  mpu_bytes_ = size_bytes;
  em_.Free(old);
}

TensorId Kernels::SpGather(Bytes full_bytes, const std::string& label, bool torch_linear) {
  if (!d_->sp) return 0;
  em_.Collective(CommGroup::kTp, d_->t, static_cast<double>(full_bytes), Coll::kGather);
  if (f_->te && !torch_linear) return em_.Alloc(full_bytes, Category::kTemporaries, label);
  MpuBuffer(full_bytes);
  return 0;
}

TensorId Kernels::RowParallelOutput(Bytes full_bytes, const std::string& label) {
  if (d_->sp) {
    const TensorId full = em_.Alloc(full_bytes, Category::kTemporaries, label + "_full");
    const TensorId out = em_.Alloc(full_bytes / d_->t, Category::kTemporaries, label);
    em_.Collective(CommGroup::kTp, d_->t, static_cast<double>(full_bytes), Coll::kGather);
    em_.Free(full);
    return out;
  }
  const TensorId out = em_.Alloc(full_bytes, Category::kTemporaries, label);
  em_.Collective(CommGroup::kTp, d_->t, static_cast<double>(full_bytes), Coll::kAllReduce);
  return out;
}

TensorId Kernels::ColumnParallelInputGrad(const std::string& label) {
  return RowParallelOutput(d_->act_bytes * d_->T * d_->h, label);
}

void Kernels::SmallWeightGrad(std::int64_t numel, const std::string& label,
                              const std::string& param) {
  const std::string target = GradTarget(param);
  if (target.empty()) return;
  const Bytes bytes = numel * d_->param_bytes;
  ToAutograd(em_.Alloc(bytes, Category::kGradients, label), bytes, false, param, label);
}

void Kernels::ShareGradAccumulator(const std::string& param) { shared_grads_[param]; }

void Kernels::ToAutograd(TensorId grad, Bytes bytes, bool cached, const std::string& param,
                         const std::string& label) {
  const auto it = shared_grads_.find(param);
  if (it == shared_grads_.end()) {
    if (!cached) sink_.TakeParamGrad(em_, grad, GradTarget(param));
    return;
  }
  SharedGrad& s = it->second;
  if (s.first == 0) {
    s.first = grad;
    s.first_cached = cached;
    return;
  }
  // Two producers of one Parameter per backward (ShareGradAccumulator); TE's dummy is only
  // ever the first (the output layer runs before the embedding in backward).
  MEMSIM_CHECK(s.second == 0 && !cached);
  s.second = grad;
  s.bytes = bytes;
  s.label = label;
}

void Kernels::AccumulateSharedGrads(const std::string& op) {
  for (auto& [param, s] : shared_grads_) {
    if (s.first == 0) continue;
    em_.Begin(op);
    TensorId sum = s.first;
    if (s.second != 0 && s.first_cached) {
      // InputBuffer accumulate: `old_var + var`, a new tensor, the cached dummy untouched.
      sum = em_.Alloc(s.bytes, Category::kGradients, s.label + ".accumulated");
    } else if (s.first_cached) {
      sum = 0;  // no second grad: the dummy alone, nothing for the sink to free
    }
    em_.Free(s.second);  // added into `sum` (in place into the first when it is not cached)
    if (sum != 0) sink_.TakeParamGrad(em_, sum, GradTarget(param));
    s = SharedGrad{};
  }
}

std::string Kernels::GradTarget(const std::string& param) const {
  if (peft_ == nullptr || peft_->frozen.count(param) == 0) return param;
  if (peft_->saved_modules.count(param) != 0) return "modules_to_save." + param;
  return "";
}

bool Kernels::ReturnsInputDtype(const std::string& param) const {
  return peft_ != nullptr && (peft_->four_bit.count(param) != 0 || peft_->eight_bit.count(param) != 0);
}

bool Kernels::KeepsLinearInput(const std::string& param) const {
  if (Trainable(param)) return true;
  // Without dropout lora_A reads the input itself, unless it reads a cast of it.
  return !peft_->dropout && peft_->adapters.count(param) != 0 &&
         !LoraCastsInput(*peft_, *d_, *f_, param);
}

// LoraLayer forward (peft/tuners/lora/layer.py Linear.forward, at 5d602fdbff):
//   result = self.base_layer(x)
//   x = self._cast_input_dtype(x, lora_A.weight.dtype)  a new [T, in] in the adapters' dtype
//                       when it differs (LoraCastsInput); the local lives until forward returns
//   result = result + lora_B(lora_A(dropout(x))) * scaling
// dropout (nn.Dropout, p > 0): native_dropout saves its mask [T, in] bool; its output is what
// lora_A reads. lora_A saves what it reads for its weight's grad; under autocast
// (FrameworkFacts::hf_native_amp) an input in a dtype other than the autocast one is cast
// first (aten/src/ATen/autocast_mode.cpp cached_cast: a new tensor for a non-leaf), and that
// C copy is what is saved, the wider tensor going when the forward returns. lora_B's output and
// its scaled copy [T, out] are transients (the add's backward saves nothing).
void Kernels::AdaptersForward(const std::string& param, bool saved) {
  auto it = peft_->adapters.find(param);
  if (it == peft_->adapters.end()) return;
  std::vector<TensorId>& keep = adapter_saved_[param];
  MEMSIM_CHECK(keep.empty());
  std::vector<TensorId> tmp;
  const bool cast = LoraCastsInput(*peft_, *d_, *f_, param);
  const Bytes xb = cast ? peft_->adapter_bytes : d_->act_bytes;  // x after the cast
  const bool autocast_copy = cast && f_->hf_native_amp;  // lora_A saves a C copy of its input
  TensorId x_cast = 0;
  for (const LoraAdapter& a : it->second) {
    if (cast && x_cast == 0) {  // once: the rebound x is in the adapters' dtype already
      x_cast = em_.Alloc(xb * d_->T * a.in, Category::kActivations, a.a_name + ".input_cast");
    }
    TensorId read = x_cast;  // what lora_A reads (0: the linear's own input)
    if (peft_->dropout) {
      keep.push_back(em_.Alloc(d_->T * a.in, Category::kActivations, a.a_name + ".dropout_mask"));
      read = em_.Alloc(xb * d_->T * a.in, Category::kActivations, a.a_name + ".dropout_out");
      (autocast_copy ? tmp : keep).push_back(read);
    } else if (x_cast != 0 && !autocast_copy) {
      keep.push_back(x_cast);  // lora_A saves the cast input; it outlives the forward
    }
    if (autocast_copy) {
      keep.push_back(em_.Alloc(d_->act_bytes * d_->T * a.in, Category::kActivations,
                               a.a_name + ".input_autocast_copy"));
    }
    // lora_A's output (saved by lora_B) and lora_B's: C under autocast, else x's dtype.
    const Bytes ob = f_->hf_native_amp ? d_->act_bytes : xb;
    keep.push_back(em_.Alloc(ob * d_->T * peft_->r, Category::kActivations, a.a_name + ".out"));
    tmp.push_back(em_.Alloc(ob * d_->T * a.out, Category::kTemporaries, a.b_name + ".out"));
    tmp.push_back(em_.Alloc(ob * d_->T * a.out, Category::kTemporaries, a.b_name + ".scaled"));
    em_.Flops(2.0 * d_->T * peft_->r * (a.in + a.out));
  }
  const bool x_kept = std::find(keep.begin(), keep.end(), x_cast) != keep.end();
  if (x_cast != 0 && !x_kept) tmp.push_back(x_cast);  // forward returns: the local goes
  for (TensorId id : tmp) em_.Free(id);
  if (!saved) {
    for (TensorId id : keep) em_.Free(id);
    keep.clear();
  }
}

void Kernels::AdaptersBackward(const std::string& param) {
  auto it = peft_->adapters.find(param);
  if (it == peft_->adapters.end()) return;
  std::vector<TensorId> tmp;
  for (const LoraAdapter& a : it->second) {
    tmp.push_back(em_.Alloc(d_->act_bytes * d_->T * a.out, Category::kTemporaries, a.b_name + ".d_out"));
    sink_.TakeParamGrad(em_, em_.Alloc(a.out * peft_->r * peft_->adapter_bytes,
                                       Category::kGradients, a.b_name + ".grad"),
                        a.b_name);
    tmp.push_back(em_.Alloc(d_->act_bytes * d_->T * peft_->r, Category::kTemporaries,
                            a.a_name + ".d_out"));
    sink_.TakeParamGrad(em_, em_.Alloc(peft_->r * a.in * peft_->adapter_bytes,
                                       Category::kGradients, a.a_name + ".grad"),
                        a.a_name);
    tmp.push_back(em_.Alloc(d_->act_bytes * d_->T * a.in, Category::kTemporaries, a.a_name + ".d_in"));
    if (LoraCastsInput(*peft_, *d_, *f_, param)) {
      // ToCopyBackward of the input cast (and of autocast's copy): the grad of x passes
      // through the adapters' dtype, [T, in], before it is cast back and summed into x's grad.
      tmp.push_back(em_.Alloc(peft_->adapter_bytes * d_->T * a.in, Category::kTemporaries,
                              a.a_name + ".d_input_cast"));
    }
    em_.Flops(4.0 * d_->T * peft_->r * (a.in + a.out));
  }
  for (TensorId id : tmp) em_.Free(id);
  auto saved = adapter_saved_.find(param);
  if (saved == adapter_saved_.end()) return;
  for (TensorId id : saved->second) em_.Free(id);
  adapter_saved_.erase(saved);
}

void Kernels::NormWeightGrads(int layer, const char* norm) {
  const std::string_view n = norm;
  SmallWeightGrad(d_->h, LayerLabel(layer, std::string(n) + ".weight_grad"),
                  LayerLabel(layer, std::string(n) + ".weight"));
  if (d_->layernorm) {
    SmallWeightGrad(d_->h, LayerLabel(layer, std::string(n) + ".bias_grad"),
                    LayerLabel(layer, std::string(n) + ".bias"));
  }
}

void Kernels::WeightGradToAutograd(std::int64_t rows, std::int64_t cols, bool te_layer,
                                   const std::string& label, const std::string& param) {
  if (peft_ != nullptr) {
    AdaptersBackward(param);
    if (peft_->four_bit.count(param) != 0) {  // MatMul4Bit.backward dequantises for dgrad
      em_.Free(em_.Alloc(rows * cols * peft_->compute_bytes, Category::kTemporaries,
                         param + ".dequantized"));
    }
    if (peft_->eight_bit.count(param) != 0) {
      // MatMul8bitLt.backward (bitsandbytes 0.45 autograd/_functions.py), input grad only:
      // CB = state.CB.to(ctx.dtype_A, copy=True).mul_(state.SCB.unsqueeze(1).mul(1 / 127)), a
      // dequantised [rows, cols] copy in the activation dtype and the fp32 [rows] scale.
      em_.Free(em_.Alloc(rows * cols * d_->act_bytes, Category::kTemporaries,
                         param + ".dequantized"));
      em_.Free(em_.Alloc(rows * 4, Category::kTemporaries, param + ".row_scale"));
    }
    if (GradTarget(param).empty()) return;
  }
  const bool cached =
      f_->grad_accum_fusion && (te_layer ? f_->te_dummy_wgrad_cache : f_->megatron_dummy_wgrad_cache);
  if (cached) {
    TensorId& dummy = dummy_wgrads_[{rows, cols}];
    if (dummy == 0) {
      dummy = em_.Alloc(rows * cols * d_->act_bytes, Category::kWorkspace,
                        fmt::format("te.dummy_wgrad[{}x{}]", rows, cols));
    }
    ToAutograd(dummy, rows * cols * d_->act_bytes, true, param, label);
    return;
  }
  // TE before its cache (and TE without fusion) hands a fresh tensor too (TE PR #507:
  // `torch.empty(weight.main_grad.shape, dtype=weight.dtype)`).
  TensorId g = em_.Alloc(rows * cols * d_->act_bytes, Category::kGradients, label);
  if (d_->weight_cast) {
    // Autocast over weights of another dtype: ToCopyBackward casts the grad to the weight's.
    const TensorId cast =
        em_.Alloc(rows * cols * d_->param_bytes, Category::kGradients, label + ".cast");
    em_.Free(g);
    g = cast;
  }
  ToAutograd(g, rows * cols * (d_->weight_cast ? d_->param_bytes : d_->act_bytes), false, param,
             label);
}

TensorId Kernels::CastWeight(std::int64_t rows, std::int64_t cols, const std::string& param,
                             bool saved) {
  if (peft_ != nullptr) {
    AdaptersForward(param, saved);
    if (peft_->four_bit.count(param) != 0) {  // MatMul4Bit.forward: a transient dequantised copy
      em_.Free(em_.Alloc(rows * cols * peft_->compute_bytes, Category::kTemporaries,
                         param + ".dequantized"));
      return 0;
    }
    if (peft_->eight_bit.count(param) != 0) {
      Int8MatmulForward(rows, cols, param);
      return 0;
    }
    if (f_->hf_native_amp && d_->act_bytes != 4 && peft_->fp32_weights.count(param) != 0) {
      // A frozen fp32 weight (prepare_model_for_kbit_training) under 16-bit autocast: cached_cast
      // caches only leaves that require grad (aten/src/ATen/autocast_mode.h can_try_cache), so
      // each use casts a fresh C copy; mm saves it for its input's grad (derivatives.yaml mm:
      // `self: mm_mat1_backward(grad, mat2, ...)`) until the GEMM's backward.
      const TensorId copy =
          em_.Alloc(rows * cols * d_->act_bytes, Category::kActivations, param + ".autocast_copy");
      if (!saved) {
        em_.Free(copy);
        return 0;
      }
      em_.Ref(copy);
      return copy;
    }
  }
  if (!d_->weight_cast) return 0;
  const bool cache = !on_autograd_thread_;
  TensorId copy = 0;
  if (cache) {
    auto it = autocast_cache_.find(param);
    if (it != autocast_cache_.end()) copy = it->second;
  }
  if (copy == 0) {
    copy = em_.Alloc(rows * cols * d_->act_bytes, Category::kActivations, param + ".autocast_copy");
    if (cache) {
      autocast_cache_[param] = copy;
      em_.Ref(copy);
    }
  }
  if (!saved) {
    if (!cache) em_.Free(copy);  // used and dropped
    return 0;
  }
  em_.Ref(copy);
  return copy;
}

// MatMul8bitLt.forward (bitsandbytes 0.45 autograd/_functions.py) with a frozen weight: the
// input [T, cols] cast to fp16 (A.to(torch.float16); none when it is fp16) and quantised by
// int8_vectorwise_quant to CA int8 [T, cols] with fp32 row scales SCA [T]; int8_linear_matmul's
// int32 product [T, rows]; int8_mm_dequant's fp16 [T, rows], cast to the input's dtype as the
// output (the caller's tensor; the fp16 one is the output itself for an fp16 input). What it
// keeps for backward is the input A, held by the caller anyway (ctx.tensors: CAt is None without
// a weight grad). All within the linear's op: memsim holds the fp16 input copy beside the
// product, where bitsandbytes has dropped it, so it is high by at most 2 · T · cols bytes.
void Kernels::Int8MatmulForward(std::int64_t rows, std::int64_t cols, const std::string& param) {
  const std::int64_t t = d_->T;
  std::vector<TensorId> tmp;
  if (!peft_->input_fp16) {
    tmp.push_back(em_.Alloc(2 * t * cols, Category::kTemporaries, param + ".input_fp16"));
  }
  tmp.push_back(em_.Alloc(t * cols, Category::kTemporaries, param + ".input_int8"));
  tmp.push_back(em_.Alloc(4 * t, Category::kTemporaries, param + ".input_scale"));
  tmp.push_back(em_.Alloc(4 * t * rows, Category::kTemporaries, param + ".out_int32"));
  if (!peft_->input_fp16) {
    tmp.push_back(em_.Alloc(2 * t * rows, Category::kTemporaries, param + ".out_fp16"));
  }
  for (TensorId id : tmp) em_.Free(id);
}

void Kernels::EndAutocastRegion() {
  if (autocast_cache_.empty()) return;
  em_.Begin("autocast.clear_cache");
  for (const auto& [param, copy] : autocast_cache_) em_.Unref(copy);
  autocast_cache_.clear();
}

}  // namespace memsim::workload
