// FrameworkFacts: what the code that trains the model does on this rank, beyond the shapes of
// ModelDims (model.h): which implementation runs (Transformer Engine, flash or unfused attention,
// Megatron-core's or Transformers' modelling code), the device backend and class, and the rules
// that depend on the framework's release (each with the release that changed it). Computed once
// per Setup by ComputeFacts: the common part here (facts.cc), the stack's own part by its
// config::Stack::SetFacts (src/stacks/). Read by the modules, kernels and loops; pure data.
// Not modelled: a fact without a stated source (each member says where it comes from).
#pragma once

#include "config/setup.h"
#include "workload/model.h"

namespace memsim::workload {

struct FrameworkFacts {
  // The Transformers modelling code (config::StackTraits::transformers_modelling) runs the model ([b, s, h]
  // activations without Megatron's transpose, eager attention without Megatron's global buffer).
  bool hf = false;
  // Transformers eager attention under PyTorch before 1.11 (HfTrainerOptions::softmax_saves_input):
  // SoftmaxBackward keeps softmax's input, the masked scores, until the layer's backward.
  bool softmax_saves_input = false;
  // The loop frees the gradients right after the optimizer step rather than at the next
  // iteration's start: the Hugging Face Trainer calls model.zero_grad() after
  // self.optimizer.step() and lr_scheduler.step() (transformers v4.48.1,
  // src/transformers/trainer.py Trainer._inner_training_loop; the same order since the
  // Trainer's first releases), before _maybe_log_save_evaluate. Module.zero_grad(set_to_none)
  // frees them only where set_to_none is its default (PyTorch 2.0 on; the wrapper's
  // zero_grad_set_to_none), so a reading after the step sees weights and optimizer state only.
  // Set by src/stacks/hf_trainer.cc; plain PyTorch's loop zeroes at the iteration's start.
  bool zero_grad_after_step = false;
  // The Trainer's mixed precision (TrainingArguments bf16 / fp16: precision not fp32): accelerate
  // runs the model's forward under autocast and wraps it in convert_outputs_to_fp32
  // (accelerate accelerator.py Accelerator.prepare_model, `if self.native_amp`, at 16cb6eb80d).
  // Read by the causal-LM loss (modules/output_loss.cc) and PEFT's LoRA forward (kernels.cc).
  bool hf_native_amp = false;
  // Transformers before 4.49 (config::HfTrainerOptions::loss_shift_copy, transformers_version):
  // the causal-LM loss makes `logits[..., :-1, :].contiguous()`, an fp32 [b, s - 1, V] copy
  // (modules/output_loss.cc). Set by src/stacks/hf_trainer.cc.
  bool hf_loss_shift_copy = false;
  // The Transformers decoder's DynamicCache in a training forward: LlamaModel.forward makes one
  // when use_cache (config.use_cache, true by default in LlamaConfig and the configs derived from
  // it) and no cache is passed, and turns use_cache off only `if self.gradient_checkpointing and
  // self.training` (transformers v4.47.1 models/llama/modeling_llama.py LlamaModel.forward; 4.36
  // at 0864dd3b the same with a legacy tuple per layer). LlamaAttention.forward's
  // `past_key_value.update` appends key_states after RoPE and value_states before repeat_kv (no
  // copy: cache_utils.py DynamicCache.update), and the output object returns the cache, so both
  // live until the caller drops the output (Trainer.compute_loss's return). Set by
  // src/stacks/hf_trainer.cc: gradient checkpointing off. The model's config.use_cache is
  // assumed true (model.json does not carry it).
  bool hf_kv_cache = false;
  bool flash = true;       // flash/fused attention; false = Megatron unfused DotProductAttention
  bool te = true;          // transformer_impl == "transformer_engine"
  bool npu = false;        // Ascend (torch_npu) backend
  bool hopper = false;     // sm >= 90 class GPU (workspace sizes; estimate, see facts.cc)
  // Transformer Engine runs core attention through flash-attn 2 (TE DotProductAttention picks
  // FlashAttention below sm 90 and FusedAttention from sm 90 on: TE 1.7 attention.py
  // DotProductAttention.forward, TE 2.9 dot_product_attention/utils.py get_attention_backend).
  // TE's FlashAttention.forward hands flash-attn [b, s, a/t, d] copies of q, k, v and copies the
  // [b, s, ...] output back to [s, b, ...]; flash-attn saves its own output (flash_attn_interface.py
  // FlashAttnVarlenFunc / FlashAttnFunc save_for_backward), so two output tensors stay saved.
  // Without context parallelism only (the CP path saves other tensors); facts.cc.
  bool te_flash_attn2 = false;
  // Megatron-core 0.5-0.13 with RoPE fusion (Megatron-LM's default) and TE's cuDNN FusedAttention
  // (sm 90 on): TEDotProductAttention switches to qkv_format 'bshd' (transformer_engine.py,
  // facts.cc kRopeFusionBshdSince), so FusedAttnFunc.forward saves its [b, s, a/t, d] output
  // (TE attention.py / dot_product_attention/backends.py save_for_backward(q, k, v, out, ...))
  // and Megatron returns `out.transpose(0, 1)`, which TE Linear's prepare_forward (module/base.py)
  // makes contiguous for the output projection, which saves that [s, b] copy: two output tensors
  // stay saved, as with te_flash_attn2. Without context parallelism; facts.cc.
  bool te_fused_attn_bshd_out = false;
  // Weight grads handed to autograd (docs/training-memory.md, 'Megatron DDP buffers'; facts.cc for
  // the versions):
  bool grad_accum_fusion = true;     // gradient_accumulation_fusion (wgrad GEMM into main_grad)
  bool te_dummy_wgrad_cache = true;  // TE layers return a cached dummy wgrad (get_dummy_wgrad)
  bool megatron_dummy_wgrad_cache = true;  // Megatron's own linears return TE's cached dummy
  // --moe-router-pre-softmax (ModelDims::router_pre_softmax) before core 0.18: the fp32 scores are
  // cast back to the logits' dtype before the top-k, a [n, E] copy (src/stacks/megatron.cc).
  bool pre_softmax_cast_all = false;
  // Megatron-core < 0.13 with the alltoall dispatcher and no permute fusion: the router probs
  // weight the expert outputs in unpermute (token_dispatcher.py token_unpermutation passes
  // probs=self.probs to moe_utils.py unpermute), which saves the combined tokens [S, h]; from
  // 0.13 the experts' activation applies them (experts.py permuted_probs). src/stacks/megatron.cc.
  bool moe_probs_at_unpermute = false;
  // With moe_probs_at_unpermute, unpermute gathers the probs by
  // `probs.T.contiguous().masked_select(routing_map.T.contiguous())` (moe_utils.py, core 0.10-0.12;
  // 0.11 and 0.12 take index_select instead when padding to capacity, drop_and_pad), and
  // MaskedSelectBackward saves both operands: [E, n] probs in the activation dtype and an
  // [E, n] bool mask per MoE layer until its backward. src/stacks/megatron.cc.
  bool unpermute_masked_select = false;
  // Core 0.13-0.16 with the alltoall dispatcher, no permute fusion and no padding to capacity:
  // moe_utils.py permute gathers the probs by `probs.T.contiguous().masked_select(routing_map)`
  // (routing_map there is permute's `routing_map.bool().T.contiguous()`), and
  // MaskedSelectBackward saves both: [E, n] probs in the activation dtype and an [E, n] bool
  // mask per MoE layer until the permute's backward. Core 0.17 indexes the flattened probs
  // instead (`probs.T.contiguous().reshape(-1)[flat_sorted]`, whose backward keeps the index).
  // src/stacks/megatron.cc.
  bool permute_masked_select = false;
  // How long the Python locals of MoELayer.forward (moe_layer.py custom_forward) and the
  // dispatcher's functions hold the token tensors of the forward, beyond what autograd saves
  // (src/stacks/megatron.cc has the releases; modules/moe.cc the tensors):
  //   kTokenPermutation (core < 0.13): token_permutation's locals die when it returns (after
  //     the sort by local expert); custom_forward's expert_output [N, h] when custom_forward
  //     returns (after token_unpermutation and the shared experts' add); token_unpermutation's
  //     tokens before the all-to-all when it returns.
  //   kCombineHoldsInput (core 0.13-0.15): custom_forward keeps the permuted copies [S, h]
  //     (hidden_states) and the all-to-all output [R, h] (dispatched_input) until it returns, and
  //     its `output`, combine_preprocess's result, until combine returns (after the unpermute and
  //     the shared experts' add).
  //   kPostprocess (core 0.16 on; a version not stated): as 0.13 for [S, h] and [R, h]; combine
  //     runs only the all-to-all, so combine_preprocess's result dies when it returns, and the
  //     all-to-all output [S, h] lives until postprocess returns (after the shared add).
  enum class MoeForwardLocals { kTokenPermutation, kCombineHoldsInput, kPostprocess };
  MoeForwardLocals moe_forward_locals = MoeForwardLocals::kPostprocess;
  // Megatron-core before 0.12 adds the shared experts' output in place, `output +=
  // self.shared_experts(hidden_states)` in moe_layer.py custom_forward (core_v0.10.0,
  // core_v0.11.0): no [n, h] sum is allocated. core_v0.12.0 writes `output = output + ...`
  // (commit 0d389f5e99), later releases add in combine / postprocess, out of place.
  // src/stacks/megatron.cc.
  bool moe_shared_add_in_place = false;
  // Megatron-core before 0.8 subtracts the max out of place in the vocab-parallel cross-entropy
  // (tensor_parallel/cross_entropy.py, in place since commit 9634c0e4a3, first in core_v0.8.0;
  // NVIDIA/Megatron-LM#525): a second fp32 [T, V/t] tensor while the first is alive.
  bool ce_max_out_of_place = false;
  // The loss function all-reduces each micro-batch's reporting loss over
  // get_data_parallel_group(), Megatron's "dp" (without context parallelism), a process group of
  // its own beside the DDP's "dp_cp" (parallel_state.py: two new_group calls, one communicator
  // each): pretrain_gpt.py loss_func in core_v0.6.0 (average_losses_across_data_parallel_group)
  // to core_v0.12.0, and MindSpeed-LLM's pretrain_gpt.py loss_func (main, 2026-08). From
  // core_v0.13.0 training.py reduces it over "dp_cp" after the schedule. Last stage, d > 1.
  bool loss_dp_all_reduce = false;
  // --log-params-norm (TrainingConfig::log_params_norm) under bf16: which parameters
  // calc_params_l2_norm copies to fp32 after each step (megatron/training/utils.py): every local
  // one before core_v0.11.0; from it the dense ones use the optimizer's `main_param` and only
  // expert parameters are copied.
  enum class ParamsNormCopies { kNone, kExperts, kAll };
  ParamsNormCopies params_norm_copies = ParamsNormCopies::kNone;
  // Megatron's GPT dataset causal mask on the device (Megatron's get_batch off Ascend, unless
  // --no-create-attention-mask-in-dataloader): [b, 1, s·cp, s·cp] bool from get_batch on the first
  // and last pipeline stages (pretrain_gpt.py get_batch returns None on the others), sliced to
  // [b, 1, s, s·cp] by get_batch_on_this_cp_rank. Alive while forward_step runs; with full
  // recompute or selective recompute of core_attn, tensor_parallel.checkpoint saves it
  // (CheckpointFunction.forward save_for_backward(*args)) until the micro-batch's layers are
  // backwarded. modules/embedding.h GetBatch.
  bool dataloader_attention_mask = false;
  bool attention_mask_to_backward = false;
};

// The facts of `setup` for a rank of shapes `d`: the common ones, then the stack's
// (config::StackOf(setup.training).SetFacts). REQUIRES: a validated Setup; d = ComputeDims(setup).
FrameworkFacts ComputeFacts(const config::Setup& setup, const ModelDims& d);

// Whether a release `version` ({major, minor}; {} = not stated, taken as current) is at least
// `since`.
bool AtLeast(const std::vector<int>& version, const std::vector<int>& since);

}  // namespace memsim::workload
