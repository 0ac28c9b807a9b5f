// Setup: the validated, resolved input of one simulation -- model architecture (Hugging Face
// config.json semantics, Megatron overrides applied), training settings (Megatron-LM argument
// names), device preset and allocator options. Produced once by config::LoadSetup (config/load.h);
// every other module reads these plain structs and never sees JSON. Sizes in bytes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "alloc/allocator.h"
#include "core/units.h"

namespace memsim::config {

enum class Precision { kFp32, kFp16, kBf16 };
// The dtype of one of Adam's moments under Megatron's precision-aware optimizer; kFp8 is
// Transformer Engine's Float8Tensor (one byte per element, E4M3).
enum class StateDtype { kFp32, kFp16, kBf16, kFp8 };
enum class Normalization { kLayerNorm, kRMSNorm };
enum class PositionEmbedding { kRope, kLearnedAbsolute, kNone };
// kAdafactor: transformers.optimization.Adafactor as the Trainer builds it (hf-trainer only).
enum class OptimizerKind { kAdam, kSgd, kAdafactor };
enum class OptimizerImpl { kFused, kForeach };
enum class RecomputeGranularity { kNone, kSelective, kFull };
enum class RecomputeMethod { kUniform, kBlock };

// Transformer shape. Hugging Face keys; a key absent from the file takes the HF default of its
// model_type; the training config may override with Megatron's argument names.
struct ModelConfig {
  std::string model_type = "llama";
  int hidden_size = 0;
  int intermediate_size = 0;          // ffn hidden size
  int num_attention_heads = 0;
  int num_key_value_heads = 0;        // = num_attention_heads for MHA
  int head_dim = 0;                   // kv_channels; default hidden_size / heads
  int num_hidden_layers = 0;
  int vocab_size = 0;                 // unpadded
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // Gated MLP (gate_proj; SwiGLU with silu): as the model_type's modeling code -- always for
  // llama/mistral/qwen2/qwen3 (whose hidden_act is silu), never for gpt2 -- or Megatron `swiglu`.
  bool gated_mlp = true;
  std::string hidden_act = "silu";
  Normalization normalization = Normalization::kRMSNorm;
  bool add_bias_linear = false;       // biases on all linear layers (GPT-style)
  // Bias on the QKV projection only (Qwen2, hard-coded; Megatron add_qkv_bias). HF llama/qwen3
  // `attention_bias` also maps here; its o_proj bias (hidden_size values a layer) is not kept.
  bool add_qkv_bias = false;
  bool qk_layernorm = false;
  // Gemma2DecoderLayer: post_attention_layernorm on the attention output before its residual
  // sum, and pre_feedforward_layernorm / post_feedforward_layernorm around the MLP.
  bool sandwich_norms = false;
  // Phi3Attention qkv_proj and Phi3MLP gate_up_proj: one nn.Linear each where Llama has
  // q/k/v_proj and gate_proj/up_proj (modeling_phi3.py).
  bool fused_projections = false;
  PositionEmbedding position_embedding_type = PositionEmbedding::kRope;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  // Mixture of experts (docs/config.md "Mixture of experts"; Megatron-core
  // megatron/core/transformer/moe/). HF: MixtralConfig num_local_experts / num_experts_per_tok,
  // Qwen2MoeConfig / Qwen3MoeConfig num_experts, moe_intermediate_size,
  // shared_expert_intermediate_size, decoder_sparse_step, mlp_only_layers; Megatron: the
  // training block's num_experts, moe_router_topk, moe_ffn_hidden_size,
  // moe_shared_expert_intermediate_size, moe_layer_freq.
  int num_experts = 0;                // 0 or 1 = dense
  int moe_router_topk = 2;            // experts per token (Megatron default 2)
  int moe_ffn_hidden_size = 0;        // each routed expert's FFN width (0 = intermediate_size)
  int moe_shared_expert_intermediate_size = 0;  // shared experts' total width; 0 = none
  bool moe_shared_expert_gate = false;  // Qwen2-MoE's shared_expert_gate ([1, h] linear)
  // Which layers are MoE layers, by global index; empty = every layer (with num_experts > 1).
  std::vector<bool> moe_layer_pattern;
  // What sits on top of the last layer: a language-model head (the *ForCausalLM classes), or
  // BertForSequenceClassification's pooler (dense [h, h] + tanh on the first token), dropout and
  // classifier [num_labels, h] (transformers/models/bert/modeling_bert.py BertPooler,
  // BertForSequenceClassification). Encoder models (model_type "bert") only.
  bool sequence_classification = false;
  int num_labels = 2;                 // BertConfig / PretrainedConfig default 2
  // BertEmbeddings: token_type_embeddings [type_vocab_size, h] and a LayerNorm after the sum;
  // 0 for decoder models (no token types, no embedding norm).
  int type_vocab_size = 0;
  // Multi-latent attention (Megatron-core MLASelfAttention, megatron/core/transformer/
  // multi_latent_attention.py at core_v0.13.0; Hugging Face deepseek_v2 / deepseek_v3): the query
  // through a q_lora_rank-wide down-projection (0: one linear_q_proj, DeepSeek-V2-Lite), keys and
  // values through one kv_lora_rank-wide latent, each head's query and key qk_head_dim +
  // qk_pos_emb_head_dim wide (the decoupled RoPE part), its value v_head_dim wide. HF names:
  // q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; Megatron:
  // --multi-latent-attention, --q-lora-rank, --kv-lora-rank, --qk-head-dim,
  // --qk-pos-emb-head-dim, --v-head-dim. head_dim is v_head_dim then (the output projection's
  // input is heads × v_head_dim).
  bool multi_latent_attention = false;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_head_dim = 0;
  int qk_pos_emb_head_dim = 0;
  int v_head_dim = 0;
  int make_vocab_size_divisible_by = 128;
  // The rows of the embedding and output layer: PaddedVocabSize (below), stored by LoadSetup.
  std::int64_t padded_vocab_size = 0;
  bool operator==(const ModelConfig&) const = default;
};

// Megatron-FSDP --data-parallel-sharding-strategy (distributed_data_parallel_config.py), what is
// sharded over the data-parallel group: nothing (no_shard); the fp32 main weights and optimizer
// state (optim); those and the gradients (optim_grads). optim_grads_params, which shards the
// weights too, is recognised and unsupported.
enum class FsdpSharding { kNoShard, kOptim, kOptimGrads };

// The launch environment's settings of memory outside the allocator (docs/config.md,
// "training.env"), environment-variable names as the libraries read them.
struct JobEnvironment {
  // NCCL_BUFFSIZE: the Simple protocol's buffer per channel and connection, bytes (NVIDIA/nccl
  // src/init.cc DEFAULT_BUFFSIZE, 4 MiB).
  Bytes nccl_buffsize = Bytes{4} << 20;
  // NCCL_NVLS_ENABLE=0 switches NVSwitch multicast buffers off (transport/nvls.cc).
  bool nccl_nvls_enable = true;
  // HCCL_BUFFSIZE, bytes (given in MiB): each HCCL communicator holds two (CANN envref_07_0080,
  // 200 MiB default); MindSpeed --hccl-group-buffer "dp:200;tp:300" sets it per group.
  Bytes hccl_buffsize = Bytes{200} << 20;
  std::map<std::string, Bytes> hccl_group_buffer;
  // CUDA_MODULE_LOADING=EAGER loads every kernel of every library at context creation; LAZY
  // (PyTorch's default since 1.13) loads a kernel at its first launch.
  bool cuda_module_loading_eager = false;
  bool operator==(const JobEnvironment&) const = default;
};

// ---- The per-stack blocks of a TrainingConfig ----
// TrainingConfig is a common part (parallel layout, batch, sequence, precision, optimizer,
// recompute, kernels, ...) that any stack may read, plus one block of the members only one stack
// reads, TrainingConfig::stack: a std::variant with one alternative per kind of stack, as
// DataParallelWrapper below. The stack's reader (config/stack.h ReadBeforeModel/ReadAfterModel)
// sets its own alternative; a default-initialised TrainingConfig holds MegatronCoreOptions, as its
// framework is "megatron". Readers ask TrainingConfig::pytorch() / hf_trainer() (nullptr when
// the config holds another alternative: the member then does not apply), or PyTorchOf /
// HfTrainerOf where the stack requires its block. A test that builds a Setup by hand for
// "pytorch" or "hf-trainer" sets framework and emplaces the block (`stack.emplace<...>()`).

// Megatron-core's own members. Still empty: Megatron's arguments stay in the common part for now
// (several are read by the workload's shared modules); the alternative marks a Megatron config.
struct MegatronCoreOptions {
  bool operator==(const MegatronCoreOptions&) const = default;
};

// A plain PyTorch training step (framework "pytorch"; "hf-trainer" holds these too, through
// HfTrainerOptions): the loaded weights' dtype, zero_grad and DistributedDataParallel's arguments.
struct PyTorchOptions {
  // The dtype the weights were loaded in (Hugging Face from_pretrained's torch_dtype,
  // "float32" | "bfloat16" | "float16"); TrainingConfig::precision is torch.autocast's dtype.
  Precision torch_dtype = Precision::kFp32;
  // optimizer.zero_grad(set_to_none=...) at the start of each iteration; true is
  // torch.optim.Optimizer.zero_grad's default since PyTorch 2.0 (torch/optim/optimizer.py): the
  // gradients are freed and autograd allocates them again in the next backward.
  bool zero_grad_set_to_none = true;
  // optimizer "adam": torch.optim.Adam's weight decay is added to the gradient
  // (torch/optim/adam.py _multi_tensor_adam: torch._foreach_add(grads, params)), a new
  // gradient-sized list; AdamW and Megatron's Adam decay the parameters in place.
  bool adam_coupled_weight_decay = false;
  // data_parallel_size > 1: PyTorch DistributedDataParallel (torch/nn/parallel/distributed.py),
  // TorchDdp below. ddp_bucket_cap_mb: DDP's bucket_cap_mb (MB = 2^20 bytes); 0 = not passed,
  // when DDP takes 25 and a first bucket of dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB).
  double ddp_bucket_cap_mb = 0;
  bool ddp_find_unused_parameters = false;
  bool ddp_gradient_as_bucket_view = false;
  bool operator==(const PyTorchOptions&) const = default;
};

// A bitsandbytes optimizer as the Trainer builds it from TrainingArguments.optim
// (transformers v4.48.1 trainer.py Trainer.get_optimizer_cls_and_kwargs: "paged" in the name sets
// is_paged, "8bit" sets optim_bits 8, else 32; "adam" picks bitsandbytes.optim.AdamW, "lion"
// Lion, "rmsprop" RMSprop). Its state (bitsandbytes/optim/optimizer.py Optimizer2State /
// Optimizer1State.init_state) is workload/optimizer.h BnbStateBytes.
struct BnbOptimizer {
  int optim_bits = 0;  // 0: not a bitsandbytes optimizer; 8 or 32
  bool is_paged = false;
  int states = 2;  // AdamW: state1 and state2 (Optimizer2State); Lion, RMSprop: state1 only
  bool operator==(const BnbOptimizer&) const = default;
};

// DeepSpeed's ZeRO stage 1, 2 or 3 under the Hugging Face Trainer (TrainingArguments `deepspeed`:
// a ds_config JSON, config/hf_trainer_deepspeed.cc; workload/deepspeed_zero.cc). The values are
// the ds_config's, with DeepSpeed's defaults (deepspeed/runtime/zero/config.py
// DeepSpeedZeroConfig, v0.16.9) for keys it leaves out and the Trainer's "auto" values resolved
// (transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig). Bucket sizes in elements.
struct DeepSpeedZero {
  int stage = 1;                                   // zero_optimization.stage: 1, 2 or 3
  std::int64_t reduce_bucket_size = 500'000'000;   // elements of one ipg buffer
  std::int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;  // stage 1 / 2 default (config.py overlap_comm_valid)
  bool contiguous_gradients = true;
  // zero_optimization.offload_optimizer.device "cpu": the fp32 partition, its gradient and the
  // optimizer state on the host (stage_1_and_2.py cpu_offload).
  bool offload_optimizer_cpu = false;
  // offload_optimizer.pin_memory (offload_config.py, default false): the fp32 partition's
  // gradient and the host gradient buffers are page-locked too (the fp32 partition always is).
  bool offload_pin_memory = false;
  // Stage 3 only (DeepSpeedZeroOptimizer_Stage3, runtime/zero/stage3.py, and its parameter
  // coordinator, partitioned_param_coordinator.py; workload/deepspeed_zero3.cc). Elements.
  // stage3_prefetch_bucket_size (default 5e7; "auto": 0.9·hidden², held as -1 until the model is
  // read), stage3_param_persistence_threshold (1e5; "auto": 10·hidden, -1 until then),
  // stage3_max_live_parameters (1e9), stage3_max_reuse_distance (1e9), sub_group_size (1e9).
  std::int64_t prefetch_bucket_size = 50'000'000;
  std::int64_t param_persistence_threshold = 100'000;
  std::int64_t max_live_parameters = 1'000'000'000;
  std::int64_t max_reuse_distance = 1'000'000'000;
  std::int64_t sub_group_size = 1'000'000'000;
  // zero_optimization.reduce_scatter (default true): stage 3 reduce-scatters each bucket through
  // a padded copy (comm/coalesced_collectives.py reduce_scatter_coalesced); false all-reduces the
  // bucket in place.
  bool reduce_scatter = true;
  // offload_param.device "cpu" (stage 3): the 16-bit partitions on the host, page-locked with
  // offload_param.pin_memory (offload_config.py, default false).
  bool offload_param_cpu = false;
  bool offload_param_pin_memory = false;
  bool operator==(const DeepSpeedZero&) const = default;
};

// The Hugging Face Trainer (framework "hf-trainer", config/hf_trainer.cc): a plain PyTorch step
// (the base) plus the Trainer's evaluation pass, PEFT's LoRA and bitsandbytes' 4-bit weights.
struct HfTrainerOptions : PyTorchOptions {
  // PyTorch before 1.11 (torch_version), whose autograd formula for _softmax passes the input
  // tensor to _softmax_backward_data (tools/autograd/derivatives.yaml), so SoftmaxBackward saves
  // the input as well as the output; from 1.11 only its dtype (pytorch/pytorch#65242, relanded
  // as #66018). Used by the eager attention paths.
  bool softmax_saves_input = false;
  // Transformers before 4.49 (transformers_version): the causal-LM loss shifts the logits by
  // `shift_logits = logits[..., :-1, :].contiguous()`, an fp32 [b, s - 1, V] copy alive until the
  // loss returns (loss/loss_utils.py ForCausalLMLoss from 4.46, modeling_llama.py
  // LlamaForCausalLM.forward before); 4.49 pads the labels instead and takes the logits as they
  // are (huggingface/transformers#35646, opened 2025-01-13, after v4.48.0). Absent: current.
  bool loss_shift_copy = false;
  // The evaluation pass inside training (workload/evaluation.h). After optimizer step k
  // (global_step k) with k % eval_steps == 0 and k >= eval_delay, Trainer.evaluate runs
  // eval_batches forward passes of eval_batch_size samples (TrainingArguments eval_strategy
  // "steps", eval_steps, eval_delay, per_device_eval_batch_size; eval_batches is memsim's own).
  // eval_keep_predictions: compute_metrics was given (memsim's own key) and
  // prediction_loss_only is false, so logits and labels are gathered and kept on the device;
  // eval_accumulation_steps moves them to the CPU every that many batches (0 = None: at the end);
  // eval_do_concat_batches false keeps a list instead of concatenating. eval_steps 0: none.
  int eval_steps = 0;
  int eval_delay = 0;
  int eval_batch_size = 8;
  int eval_batches = 0;
  bool eval_keep_predictions = false;
  int eval_accumulation_steps = 0;
  bool eval_do_concat_batches = true;
  // A PEFT LoRA adapter (adapter_config.json; peft/tuners/lora/config.py LoraConfig and
  // tuners/lora/layer.py LoraLayer.update_layer). r = 0: no adapter, every parameter trained.
  // With an adapter the base model is frozen (no .grad, no optimizer state) except
  // modules_to_save, and each targeted linear gains lora_A [r, in] and lora_B [out, r].
  int lora_r = 0;
  double lora_alpha = 8;
  double lora_dropout = 0.0;
  // Transformers module names of the decoder's linears: q_proj, k_proj, v_proj, o_proj,
  // gate_proj, up_proj, down_proj ("all-linear" expands to these).
  std::vector<std::string> lora_target_modules;
  std::vector<std::string> lora_modules_to_save;
  // bitsandbytes 4-bit base weights (BitsAndBytesConfig load_in_4bit, bnb_4bit_quant_type nf4):
  // the decoder layers' linear weights stored packed, two values a byte, with their
  // quantisation state (bitsandbytes/functional.py quantize_4bit: an fp32 absmax per 64-value
  // block; with double quantisation a uint8 absmax per block plus fp32 absmax per 256 blocks).
  bool load_in_4bit = false;
  bool bnb_4bit_use_double_quant = false;
  // bnb_4bit_quant_storage: the dtype the packed 4-bit values are stored in (Params4bit's
  // quant_storage; uint8 by default, bfloat16 for FSDP-QLoRA recipes), by its element size: the
  // same bytes either way (workload/hf_peft.h FourBitBytes).
  Bytes bnb_4bit_quant_storage_bytes = 1;
  // bitsandbytes LLM.int8 base weights (BitsAndBytesConfig load_in_8bit: Linear8bitLt with
  // Int8Params, has_fp16_weights false): the decoder layers' linear weights in int8 with fp32
  // row scales (workload/hf_peft.h Int8WeightBytes); llm_int8_threshold > 0 adds the outlier
  // columns of each input (data-dependent, not modelled).
  bool load_in_8bit = false;
  // llm_int8_skip_modules (4-bit and 8-bit alike): transformers module names whose linears stay
  // in 16 bits ("q_proj", "self_attn", "mlp", ...); empty: the default (only lm_head kept).
  std::vector<std::string> bnb_skip_modules;
  // peft prepare_model_for_kbit_training run on the quantised model by the code that builds it
  // (peft src/peft/utils/other.py, v0.4 to v0.13 alike: every fp16 / bf16 parameter that is not
  // a 4-bit one (Params4bit; int8 weights are not 16-bit) is cast to fp32: the norms,
  // embed_tokens, lm_head and linears kept in 16 bits; then enable_input_require_grads and
  // gradient_checkpointing_enable). Key prepare_model_for_kbit_training, by default on with
  // 4-bit or 8-bit weights. Callers: TRL SFTTrainer.__init__ (trl/trainer/sft_trainer.py,
  // v0.8 to v0.14; _prepare_model_for_kbit_training from v0.15), axolotl ModelLoader
  // _prepare_model_for_quantization; LLaMA-Factory does not call it (model/model_utils/
  // checkpointing.py prepare_model_for_training casts norms only with upcast_layernorm).
  bool kbit_prepared = false;
  // The module kinds cast back to torch_dtype after it (key kbit_modules_recast): "embed_tokens"
  // and "lm_head" (TRL trainer/utils.py peft_module_casting_to_bf16 under bf16 with 4-bit
  // weights: modules named lm_head / embed_tokens whose weight is fp32), "norm" too (axolotl
  // loaders/model.py _convert_embedding_modules_dtype after kbit preparation with an adapter).
  bool kbit_recast_norms = false;
  bool kbit_recast_embed_tokens = false;
  bool kbit_recast_lm_head = false;
  // optim names a bitsandbytes optimizer (optim_bits > 0).
  BnbOptimizer bnb_optimizer;
  // TrainingArguments deepspeed naming a ZeRO stage 1 / 2 ds_config: DeepSpeed's engine and
  // ZeRO optimizer replace the plain step (no autocast: the engine casts the model to the
  // ds_config's bf16 / fp16). std::nullopt: no DeepSpeed.
  std::optional<DeepSpeedZero> deepspeed;
  bool operator==(const HfTrainerOptions&) const = default;
};

// framework "torchtitan" (stacks/torchtitan.cc): plain PyTorch's members (torch_dtype is the
// parameters' own dtype, fp32; precision is MixedPrecisionPolicy.param_dtype) and FSDP2's.
struct TorchtitanOptions : PyTorchOptions {
  // [training] mixed_precision_reduce: MixedPrecisionPolicy.reduce_dtype (fp32 or bf16).
  Precision reduce_dtype = Precision::kFp32;
  // [parallelism] fsdp_reshard_after_forward "default" / "always" (true) or "never" (false).
  bool reshard_after_forward = true;
  bool operator==(const TorchtitanOptions&) const = default;
};

using StackOptions =
    std::variant<MegatronCoreOptions, PyTorchOptions, HfTrainerOptions, TorchtitanOptions>;

// The lengths of the training samples and how the data loader makes micro-batches of them
// (docs/config.md, 'Sample lengths'; read by config/hf_trainer.cc from the block's "data" and
// TrainingArguments group_by_length / data_seed / seed). Empty `lengths`: every micro-batch is
// seq_length long, the shapes of every iteration the same (the default).
struct SampleData {
  enum class Padding {
    kMaxLength,  // every row padded (and truncated) to seq_length: padding="max_length"
    kLongest,    // to the longest sample of the micro-batch: DataCollatorWithPadding's default
  };
  // The dataset as a multiset: (length in tokens, number of samples), ascending by length, each
  // length in [1, 2^26], counts > 0. Samples longer than seq_length are truncated to it.
  std::vector<std::pair<int, std::int64_t>> lengths;
  Padding padding = Padding::kLongest;
  int pad_to_multiple_of = 0;  // 0 = none; else the padded length rounds up to a multiple
  // TRL SFTConfig packing: samples concatenated and cut into rows of exactly seq_length
  // (trl/data_utils.py pack_dataset, "wrapped"): fixed shapes.
  bool packing = false;
  // TrainingArguments group_by_length: transformers/trainer_pt_utils.py LengthGroupedSampler.
  bool group_by_length = false;
  std::uint64_t seed = 42;  // TrainingArguments data_seed, else seed (default 42)
  // True when micro-batches may differ in length (lengths given, padding to the longest, not
  // packed).
  bool Varies() const {
    return !lengths.empty() && padding == Padding::kLongest && !packing;
  }
  bool operator==(const SampleData&) const = default;
};

struct TrainingConfig {
  // The training stack, by the name it is registered under (config/stack.h; the training block's
  // "framework" key): "megatron" (Megatron-core with its DDP or Megatron-FSDP), "pytorch" (plain
  // PyTorch on one device or under DistributedDataParallel) or "hf-trainer" (the Hugging Face
  // Trainer, read from TrainingArguments names by config/hf_trainer.cc into the same common
  // fields, its own in HfTrainerOptions).
  // Code asks config::StackOf(c) for what depends on it, never compares the name.
  std::string framework = "megatron";
  int seq_length = 0;
  int micro_batch_size = 1;
  int global_batch_size = 0;
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int data_parallel_size = 1;
  int context_parallel_size = 1;
  int expert_model_parallel_size = 1;
  // Expert tensor parallelism; 0 = not given (Megatron: equal to tensor_model_parallel_size).
  int expert_tensor_parallel_size = 0;
  // Megatron MoE runtime arguments (megatron/training/arguments.py, TransformerConfig): the
  // token dispatcher ("alltoall" | "allgather"), auxiliary-loss coefficient, fused permutation,
  // capacity factor (0 = dropless) with padding to capacity, grouped GEMM experts.
  std::string moe_token_dispatcher_type = "allgather";
  double moe_aux_loss_coeff = 0.0;
  bool moe_permute_fusion = false;
  double moe_expert_capacity_factor = 0.0;
  bool moe_pad_expert_input_to_capacity = false;
  bool moe_grouped_gemm = false;
  // Megatron --moe-router-pre-softmax (TransformerConfig.moe_router_pre_softmax): the router's
  // softmax runs over all experts' logits before the top-k (required by Megatron for top-1).
  bool moe_router_pre_softmax = false;
  // memsim's imbalance knob (not a Megatron argument): the simulated rank receives this many
  // times the mean number of routed tokens (>= 1; 1 = balanced routing).
  double moe_imbalance_factor = 1.0;
  // Megatron num_layers_per_virtual_pipeline_stage; 0 = no interleaving.
  int num_layers_per_virtual_pipeline_stage = 0;
  // Megatron --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers
  // (TransformerConfig num_layers_in_first/last_pipeline_stage): the layers of the first / last
  // pipeline stage, the rest split evenly over the middle stages (transformer_block.py
  // get_num_layers_to_build at core_v0.13.0); 0 = not given (an even split).
  int decoder_first_pipeline_num_layers = 0;
  int decoder_last_pipeline_num_layers = 0;
  bool sequence_parallel = false;
  // megatron: the parameters' training dtype (Megatron --fp16 / --bf16). pytorch: the dtype of
  // torch.autocast over the weights' own dtype (torch_dtype); kFp32 = no autocast.
  Precision precision = Precision::kBf16;
  bool accumulate_allreduce_grads_in_fp32 = false;  // forced true for bf16 (Megatron arguments.py)
  // Megatron --grad-reduce-in-bf16: with bf16, gradients are accumulated and reduced in bf16
  // (validate_args then leaves accumulate_allreduce_grads_in_fp32 false).
  bool grad_reduce_in_bf16 = false;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  OptimizerImpl optimizer_impl = OptimizerImpl::kFused;
  double weight_decay = 0.01;
  double sgd_momentum = 0.9;
  bool use_distributed_optimizer = false;
  // Megatron-FSDP (--use-megatron-fsdp) and its --data-parallel-sharding-strategy. memsim models
  // no_shard, optim and optim_grads; with optim / optim_grads the optimizer state is sharded and
  // use_distributed_optimizer is set (as Megatron-FSDP builds its optimizer that way).
  bool use_megatron_fsdp = false;
  FsdpSharding fsdp_sharding = FsdpSharding::kNoShard;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::kNone;
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;
  int recompute_num_layers = 1;
  // Megatron --recompute-modules (selective recompute); Megatron's default is {"core_attn"}.
  std::vector<std::string> recompute_modules = {"core_attn"};
  bool use_flash_attn = false;
  std::string transformer_impl = "transformer_engine";
  // Megatron --no-gradient-accumulation-fusion sets this false: weight grads are then computed as
  // tensors and added to main_grad by the DDP hook instead of accumulated in the GEMM.
  bool gradient_accumulation_fusion = true;
  // Megatron's GPT dataset builds a causal mask [1, s, s] bool per sample, which get_batch moves
  // to the device (megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids;
  // megatron/training/utils.py get_batch_on_this_tp_rank); --no-create-attention-mask-in-dataloader
  // sets this false. Read for framework "megatron" only.
  bool create_attention_mask_in_dataloader = true;
  // Software versions that change what is allocated ("MAJOR.MINOR", {major, minor}); {} = not
  // stated, taken as the current releases. transformer_engine_version also says that Transformer
  // Engine is installed (it always is with transformer_impl "transformer_engine").
  std::vector<int> transformer_engine_version;
  std::vector<int> megatron_core_version;
  int train_iters = 4;
  // fp16 only: the first iterations whose step the loss scaler skips (an inf/nan in the
  // gradients). Megatron's MixedPrecisionOptimizer.step returns after prepare_grads when it finds
  // one (megatron/core/optimizer/optimizer.py), torch.amp.GradScaler.step does not call
  // optimizer.step() (torch/amp/grad_scaler.py GradScaler._maybe_opt_step): no update, so the lazy
  // optimizer state is created by the first step that is not skipped.
  int skipped_iterations = 0;
  int empty_unused_memory_level = 0;
  // Megatron --log-params-norm: training.py train calls utils.py calc_params_l2_norm after every
  // step, which under bf16 lists an fp32 copy (`param.data.float()`) of each local parameter
  // that is neither a TP duplicate nor the last stage's tied output weight (`shared`), then frees
  // them. From core_v0.11.0 a dense parameter's `main_param` (the optimizer's fp32 copy) is used
  // instead, and only expert parameters are copied. Framework "megatron".
  bool log_params_norm = false;
  // Megatron --use-precision-aware-optimizer (distributed optimizer with Transformer Engine's
  // FusedAdam): the main parameters and Adam's moments live in FusedAdam's state, created by its
  // first step, in these dtypes (--main-params-dtype fp32|fp16, --exp-avg-dtype and
  // --exp-avg-sq-dtype fp32|fp16|bf16|fp8). megatron/core/optimizer/__init__.py
  // (_get_megatron_optimizer_based_on_param_groups), transformer_engine/pytorch/optimizers/
  // fused_adam.py (FusedAdam.initialize_state).
  bool use_precision_aware_optimizer = false;
  Precision main_params_dtype = Precision::kFp32;
  StateDtype exp_avg_dtype = StateDtype::kFp32;
  StateDtype exp_avg_sq_dtype = StateDtype::kFp32;
  // MindSpeed --reuse-fp32-param (bf16 only): the fp32 main parameters are not kept beside the
  // bf16 parameters; between steps each main element is its bf16 parameter plus a 16-bit
  // residual (the low half of the fp32 bits), and the step rebuilds the fp32 values in place.
  // mindspeed/core/memory/reuse_param/adaptor.py (reuse_fp32_param_distrib_optimizer_init_wrapper,
  // reuse_buffer_dis / reuse_buffer_single, reuse_fp32_param_init_wrapper), MindSpeed 028de58.
  bool reuse_fp32_param = false;
  // MindSpeed --recompute-activation-function [--recompute-activation-function-num-layers N]:
  // the dense MLP's activation output (fc2's input) is freed after fc2's forward and recomputed
  // from the saved fc1 output when fc2's output grad arrives (mindspeed/core/memory/recompute/
  // activation/activation_recompute_forward.py core_activation_recompute_forward_impl,
  // recompute_common.py CheckpointWithoutOutput), in the layers recompute_common.py
  // should_recompute picks; recompute_activation_function_num_layers -1 = all (None).
  bool recompute_activation_function = false;
  int recompute_activation_function_num_layers = -1;
  // MindSpeed --swap-optimizer [--swap-optimizer-times K] (distributed optimizer, Adam): the
  // shard's fp32 main parameters and Adam moments live in pinned host memory between steps; the
  // step brings them to the device in windows of about 1/K of the shard's elements (K 0: all at
  // once), updates them and sends them back. mindspeed/core/optimizer/swap_optimizer/
  // swap_optimizer.py (SwapDistributedOptimizer, swap_adamw_step), MindSpeed 028de58.
  bool swap_optimizer = false;
  int swap_optimizer_times = 16;
  // Megatron --tp-comm-overlap: Transformer Engine userbuffers (device/communicators.h).
  bool tp_comm_overlap = false;
  JobEnvironment env;
  // Derived by LoadSetup: global_batch_size / (micro_batch_size × data_parallel_size), the
  // micro-batches of one iteration (Megatron get_num_microbatches(),
  // megatron/core/num_microbatches_calculator.py); with framework "pytorch" the gradient
  // accumulation steps.
  int num_micro_batches = 1;
  // The data's sample lengths and batching (hf-trainer's "data"); default: fixed seq_length.
  SampleData data;
  // The members only one stack reads (above); the alternative its reader set.
  StackOptions stack;
  // The plain PyTorch step's block: the PyTorchOptions or HfTrainerOptions alternative (an
  // HfTrainerOptions is one), else nullptr.
  const PyTorchOptions* pytorch() const;
  PyTorchOptions* pytorch();
  // The Trainer's block: the HfTrainerOptions alternative, else nullptr.
  const HfTrainerOptions* hf_trainer() const;
  HfTrainerOptions* hf_trainer();
  bool operator==(const TrainingConfig&) const = default;
};

// The data-parallel wrapper of a training config, one alternative per wrapper, so that the
// workload picks its implementation by type rather than by flags.
struct MegatronDdp {  // Megatron-core DistributedDataParallel
  bool distributed_optimizer = false;  // ZeRO-1: main weights and optimizer state sharded over DP
  bool operator==(const MegatronDdp&) const = default;
};
struct MegatronFsdp {  // Megatron-FSDP (--use-megatron-fsdp)
  FsdpSharding sharding = FsdpSharding::kNoShard;
  bool operator==(const MegatronFsdp&) const = default;
};
struct SingleDevice {  // framework "pytorch" or "hf-trainer": no wrapper, one device
  bool zero_grad_set_to_none = true;
  bool operator==(const SingleDevice&) const = default;
};
// framework "pytorch" or "hf-trainer" over data_parallel_size > 1 processes: PyTorch
// torch.nn.parallel.DistributedDataParallel (workload/torch_ddp.cc).
struct TorchDdp {
  bool zero_grad_set_to_none = true;
  double bucket_cap_mb = 0;  // 0 = the constructor's default (25, first bucket 1 MiB)
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool operator==(const TorchDdp&) const = default;
};
// PyTorch FSDP2 (torch.distributed.fsdp.fully_shard, workload/fsdp2.cc) over the
// data_parallel_size ranks of one shard mesh, with MixedPrecisionPolicy(param_dtype = the
// activations' dtype, reduce_dtype below); the sharded parameters keep their fp32 dtype.
struct TorchFsdp2 {
  Precision reduce_dtype = Precision::kFp32;  // MixedPrecisionPolicy.reduce_dtype
  // fully_shard(reshard_after_forward=...) of the embedding and each transformer block; the
  // [norm, output] unit is never resharded after forward (torchtitan apply_fsdp, below).
  bool reshard_after_forward = true;
  // Units all-gathered ahead in forward (FSDPModule.set_modules_to_forward_prefetch); 0: none,
  // torchtitan's default.
  int forward_prefetch = 0;
  bool zero_grad_set_to_none = true;
  bool operator==(const TorchFsdp2&) const = default;
};
// framework "hf-trainer" with a ZeRO-1 / ZeRO-2 ds_config: DeepSpeedZeroOptimizer
// (workload/deepspeed_zero.cc), the DeepSpeedZero above.
using DataParallelWrapper =
    std::variant<MegatronDdp, MegatronFsdp, SingleDevice, TorchDdp, DeepSpeedZero, TorchFsdp2>;

// The block a stack requires of `c`: c.pytorch() / c.hf_trainer(). REQUIRES: `c` holds it (every
// stack's reader sets its own; a Setup built without it is a bug, MEMSIM_CHECK).
const PyTorchOptions& PyTorchOf(const TrainingConfig& c);
const HfTrainerOptions& HfTrainerOf(const TrainingConfig& c);

// The wrapper `c` describes, as its stack says (config/stack.h Stack::Wrapper): SingleDevice for
// a PyTorch loop on one device, TorchDdp for one over data_parallel_size > 1, MegatronFsdp when
// use_megatron_fsdp, else MegatronDdp. A pure function of the loaded TrainingConfig.
DataParallelWrapper DataParallelOf(const TrainingConfig& c);

// The vocabulary rows of the embedding and output layer, the one definition every module uses.
// A stack that pads (StackTraits::pads_vocab, Megatron-core): vocab_size rounded up to a
// multiple of make_vocab_size_divisible_by × TP (Megatron _vocab_size_with_padding,
// megatron/training/tokenizer/tokenizer.py). Others ("pytorch", "hf-trainer"): vocab_size (a
// Hugging Face model keeps config.vocab_size rows). int64: the product can pass 2^31
// (config/rules.h bounds it at 2^27).
std::int64_t PaddedVocabSize(const ModelConfig& m, const TrainingConfig& c);

// Whether the training block asks for an uneven pipeline split
// (decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers).
bool UnevenPipeline(const TrainingConfig& c);
// The transformer layers each pipeline stage builds, in stage order (megatron/core/transformer/
// transformer_block.py get_num_layers_to_build at core_v0.13.0): num_layers / PP each, or the
// given first / last counts with the rest split evenly over the middle stages. REQUIRES: a
// validated Setup's model and training block (rules.cc CheckShape).
std::vector<int> StageLayerCounts(const ModelConfig& m, const TrainingConfig& c);

// How NCCL connects the GPUs of one node (device preset "nccl" block), the inputs of
// device::NcclCommunicatorBytes. coll_channels 0 = not given: every communicator then takes the
// preset's flat communicator_buffer_bytes.
struct NcclTopology {
  int coll_channels = 0;   // collective channels NCCL's graph search settles on
  bool p2p_read = false;   // P2P read (NVLink between sm_80 GPUs, graph/paths.cc)
  bool all_nvlink = true;  // every GPU pair on NVLink: P2P chunk 512 KiB, else 128 KiB
  int nvls_channels = 0;   // NVSwitch multicast channels (NCCL_NVLS_NCHANNELS); 0 = no NVLS
  bool operator==(const NcclTopology&) const = default;
};

// configs/devices/NAME.json (docs/config.md "Device preset"). Every figure has a source or is
// marked "estimate" in `sources`.
struct DevicePreset {
  std::string name;
  alloc::Backend allocator_backend = alloc::Backend::kCuda;
  Bytes total_memory_bytes = 0;
  Bytes usable_memory_bytes = 0;
  Bytes idle_baseline_bytes = 0;
  Bytes context_bytes = 0;
  Bytes context_eager_bytes = 0;  // CUDA_MODULE_LOADING=EAGER; 0 = not known (context_bytes used)
  Bytes communicator_buffer_bytes = 0;
  NcclTopology nccl;
  double peak_flops_bf16 = 0;
  double peak_flops_fp16 = 0;
  double peak_flops_fp32 = 0;
  double memory_bandwidth_bytes_per_s = 0;
  std::map<std::string, std::string> sources;
  bool operator==(const DevicePreset&) const = default;
};

// A flag of a launch (or an exported variable), or a key of a config file (training config,
// TrainingArguments JSON, model file, adapter_config, ds_config), that was read but is not
// modelled: kept beside its warning so that a verdict can say which way memsim errs because of
// it (issue 32, "What a result must say"; workload/not_modelled.h estimates by how much).
struct NotModelled {
  enum class Direction { kHigh, kLow, kEither };  // memsim predicts more / less / it depends
  // where and what: "train.sh:19: --reuse-fp32-param", "cfg.json: /training/eval_on_start"
  std::string what;
  // "--reuse-fp32-param", "export NAME", or a config key's JSON pointer ("/training/eval_on_start",
  // config_key true); what the estimate is chosen by
  std::string flag;
  std::vector<std::string> values;  // as written ("8" for --x-num-layers 8; a key's JSON value)
  Direction direction = Direction::kEither;
  bool config_key = false;  // a config file's key rather than a launch's flag
  bool operator==(const NotModelled&) const = default;
};

struct Setup {
  std::string config_path;  // "" or "<embedded>/default.json" for the embedded default
  std::string model_path;   // "" when the model is inline
  ModelConfig model;
  TrainingConfig training;
  DevicePreset device;
  alloc::AllocatorOptions allocator;  // backend and capacity filled from the device
  std::string device_path;  // where the preset came from: "<embedded>/configs/devices/X.json" or a file
  // What LoadSetup ignored or defaulted, one line each, for --verbose (unused model-file keys,
  // defaults taken, settings Megatron would change with a warning).
  std::vector<std::string> notes;
  // What the user should see even without --verbose: from a launch script (megatron_args.h),
  // what was not evaluated and the flags not modelled, one line each ("train.sh:12: ...").
  std::vector<std::string> warnings;
  // Of those warnings, the flags (and exported variables) not modelled, in the order warned.
  std::vector<NotModelled> not_modelled;
  // How one-line summaries name the model when neither model_path nor model_type says it: "" or
  // "<script> (Megatron arguments)" for a model built from a launch's arguments
  // (megatron_args.h; config::ModelName).
  std::string model_label;
  // Read from a fine-tuning recipe (config/recipe.h): first which tool's recipe at which release
  // ("an axolotl v0.18.0 recipe"), then one line per thing assumed (a tool default taken, the
  // model found in the HF cache, ...); empty for a memsim training config. The run report
  // prints them.
  std::vector<std::string> recipe;
  // A training config (JSON text) that reproduces this Setup when read from any directory
  // (load.h LoadSetup; docs/interfaces.md 'JSON report', input_config).
  std::string reproducing_config;
  bool operator==(const Setup&) const = default;
};

}  // namespace memsim::config
