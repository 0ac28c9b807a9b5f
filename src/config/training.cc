// The training config block -> TrainingConfig (training.h). Megatron-LM argument names
// (megatron/training/arguments.py); the checks here are those of one key or between keys of the
// block, in the order the keys are read.
#include "config/training.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string_view>

#include "config/hf_trainer.h"
#include "config/megatron_flags.h"
#include "config/mla.h"
#include "config/moe.h"
#include "config/parts.h"
#include "config/stack.h"
#include "core/comm_group.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// Keys of the training block, in groups (docs/config.md).
const std::vector<std::string> kTrainingKeys = {
    "framework", "seq_length", "micro_batch_size", "global_batch_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "sequence_parallel", "precision", "fp16", "bf16", "accumulate_allreduce_grads_in_fp32",
    "grad_reduce_in_bf16", "optimizer", "optimizer_impl", "weight_decay", "sgd_momentum",
    "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
    "use_flash_attn", "transformer_impl", "gradient_accumulation_fusion",
    "create_attention_mask_in_dataloader",
    "transformer_engine_version", "megatron_core_version", "train_iters", "skipped_iterations",
    "empty_unused_memory_level", "log_params_norm", "gradient_accumulation_steps", "use_precision_aware_optimizer",
    "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "reuse_fp32_param",
    "recompute_activation_function", "recompute_activation_function_num_layers",
    "swap_optimizer", "swap_optimizer_times",
    // memory outside the allocator (device/communicators.h)
    "tp_comm_overlap", "hccl_group_buffer", "env",
    // framework "pytorch" only (zero_grad; DistributedDataParallel's arguments)
    "torch_dtype", "zero_grad_set_to_none", "bucket_cap_mb", "find_unused_parameters",
    "gradient_as_bucket_view",
    // recognised; unsupported when set to what memsim does not model
    "zero_stage", "use_megatron_fsdp", "data_parallel_sharding_strategy", "load", "no_load_optim",
    "finetune", "enable_cuda_graph", "cuda_graph_impl", "fp8", "fp8_format",
    // accepted; no effect on memory
    "ckpt_format", "save", "save_interval", "lr", "min_lr", "lr_decay_style", "lr_warmup_iters",
    "clip_grad", "adam_beta1", "adam_beta2", "adam_eps", "init_method_std", "seed", "log_interval",
    "eval_interval", "eval_iters", "tokenizer_type", "norm_epsilon", "rotary_base",
    "attention_softmax_in_fp32"};

const std::vector<std::string> kNoMemoryEffect = {
    "ckpt_format",    "save",           "save_interval",   "lr",
    "min_lr",         "lr_decay_style", "lr_warmup_iters", "clip_grad",
    "adam_beta1",     "adam_beta2",     "adam_eps",        "init_method_std",
    "seed",           "log_interval",   "eval_interval",   "eval_iters",
    "tokenizer_type", "norm_epsilon",   "rotary_base",     "attention_softmax_in_fp32"};

// Megatron's --recompute-modules names, in the order of TransformerConfig.recompute_modules
// (megatron/core/transformer/transformer_config.py; "mhc", "gdn" and "gdn_norm_out" are in
// Megatron-LM main only). `unsupported` says why memsim cannot recompute a module of a feature it
// does not model; "" for the modelled ones.
struct RecomputeModule {
  std::string_view name;
  std::string_view unsupported;
};
constexpr RecomputeModule kRecomputeModules[] = {
    {"core_attn", ""},
    {"moe_act", ""},
    {"layernorm", ""},
    {"mla_up_proj", "multi-latent attention's up projection, not modelled"},
    {"mlp", ""},
    {"moe", ""},
    {"shared_experts", "the MoE layer's shared experts: not modelled yet (use \"moe\")"},
    {"mhc", "hyper-connections, not modelled"},
    {"gdn", "the gated delta net attention variant, not modelled"},
    {"gdn_norm_out", "the gated delta net attention variant, not modelled"},
};

// The Megatron-only switches framework "pytorch" refuses when true, and what each asks for.
struct MegatronOnly {
  std::string_view key;
  std::string_view feature;
};
constexpr MegatronOnly kMegatronOnlySwitches[] = {
    {"use_distributed_optimizer", "Megatron's distributed optimizer"},
    {"use_megatron_fsdp", "Megatron-FSDP"},
    {"sequence_parallel", "sequence parallelism"},
    {"overlap_grad_reduce", "the wrapper's overlapped gradient reduction"},
    {"overlap_param_gather", "the distributed optimizer's overlapped parameter all-gather"},
    {"accumulate_allreduce_grads_in_fp32", "Megatron DDP's fp32 gradient buffers"},
};
constexpr std::string_view kSingleDevice =
    "framework \"pytorch\" is plain PyTorch: one device, or DistributedDataParallel over "
    "data_parallel_size devices";

// A software version "MAJOR[.MINOR[.PATCH]]" (a leading "v" or "core_v"/"core_r" as in release
// tags is accepted) as {major, minor}; {} when absent. `example` is quoted in the error.
std::vector<int> Version(ObjectReader& t, std::string_view key, std::string_view example) {
  const Json* json = t.Get(key);
  if (json == nullptr || json->is_null()) {
    t.Skip(std::string(key));
    return {};
  }
  const std::string expected = fmt::format("expected a version string such as \"{}\"", example);
  if (json->is_number()) {
    // A JSON number drops trailing zeros (2.10 reads as 2.1), so it is never taken as a version.
    Fail(t.At(key), fmt::format("{}, got the number {} (quote it; with --set: "
                                "'training.{}=\"{}\"')",
                                expected, Describe(*json), key, example));
  }
  std::optional<std::string> v = t.String(key);
  std::string_view text = *v;
  for (std::string_view prefix : {"core_v", "core_r", "v"}) {
    if (text.substr(0, prefix.size()) == prefix) {
      text.remove_prefix(prefix.size());
      break;
    }
  }
  // One to three dot-separated groups of one to six digits.
  std::vector<int> parts;
  bool ok = true;
  size_t start = 0;
  while (ok) {
    const size_t dot = std::min(text.find('.', start), text.size());
    const std::string_view group = text.substr(start, dot - start);
    ok = !group.empty() && group.size() <= 6 && parts.size() < 3 &&
         std::all_of(group.begin(), group.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (ok) parts.push_back(std::stoi(std::string(group)));
    if (dot == text.size()) break;
    start = dot + 1;
  }
  if (!ok) Fail(t.At(key), fmt::format("{}, got {}", expected, Describe(*json)));
  parts.resize(2, 0);
  return parts;
}

// framework "pytorch": data parallel only (one device, or DistributedDataParallel), and none of
// Megatron's parallel or wrapper features. Read before anything else of the block, so the message
// names the first key that asks for more.
void CheckSingleDevice(ObjectReader& t) {
  for (const char* key : {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "context_parallel_size", "expert_model_parallel_size",
                          "expert_tensor_parallel_size"}) {
    if (std::optional<int> v = t.PositiveInt(key); v && *v != 1) {
      Fail(t.At(key), fmt::format("framework \"pytorch\" runs data parallel only (one device, or "
                                  "DistributedDataParallel); expected 1, got {}",
                                  *v));
    }
  }
  for (const char* key :
       {"num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank"}) {
    if (t.Has(key)) {
      Fail(t.At(key),
           fmt::format("needs framework \"megatron\" (interleaved pipeline schedule); {}",
                       kSingleDevice));
    }
  }
  for (const MegatronOnly& m : kMegatronOnlySwitches) {
    if (t.Bool(m.key).value_or(false)) {
      Fail(t.At(m.key),
           fmt::format("true needs framework \"megatron\" ({}); {}", m.feature, kSingleDevice));
    }
  }
  if (std::optional<int> z = t.IntInRange("zero_stage", 0, 3); z && *z > 0) {
    Fail(t.At("zero_stage"),
         fmt::format(
             "{} needs framework \"megatron\" (ZeRO-1 is Megatron's distributed optimizer); {}", *z,
             kSingleDevice));
  }
  if (std::optional<std::string> s =
          t.Choice("data_parallel_sharding_strategy",
                   {"no_shard", "optim", "optim_grads", "optim_grads_params"});
      s && *s != "no_shard") {
    Fail(t.At("data_parallel_sharding_strategy"),
         fmt::format("\"{}\" needs framework \"megatron\" (Megatron-FSDP); {}", *s, kSingleDevice));
  }
}

// Sequence, batch and parallel sizes.
void ReadBatch(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* notes) {
  if (std::optional<int> v = t.PositiveInt("seq_length")) {
    c.seq_length = *v;
  } else if (!t.Has("seq_length")) {  // present: its error is recorded (reader.h field_errors)
    Fail(t.At("seq_length"), "missing key, expected a positive integer (tokens per sample)");
  }
  c.micro_batch_size = t.PositiveInt("micro_batch_size").value_or(1);
  c.tensor_model_parallel_size = t.PositiveInt("tensor_model_parallel_size").value_or(1);
  c.pipeline_model_parallel_size = t.PositiveInt("pipeline_model_parallel_size").value_or(1);
  c.data_parallel_size = t.PositiveInt("data_parallel_size").value_or(1);
  c.context_parallel_size = t.PositiveInt("context_parallel_size").value_or(1);
  if (std::optional<int> g = t.PositiveInt("global_batch_size")) {
    c.global_batch_size = *g;
  } else {
    // Megatron arguments.py: global_batch_size defaults to micro_batch_size × DP.
    c.global_batch_size = c.micro_batch_size * c.data_parallel_size;
    notes->push_back(
        fmt::format("{}: absent, micro_batch_size × data_parallel_size = {} taken "
                    "(Megatron's default)",
                    t.At("global_batch_size"), c.global_batch_size));
  }
  std::optional<int> vpp = t.PositiveInt("num_layers_per_virtual_pipeline_stage");
  std::optional<int> vstages = t.PositiveInt("num_virtual_stages_per_pipeline_rank");
  if (vpp && vstages) {
    Fail(t.At("num_virtual_stages_per_pipeline_rank"),
         "give num_layers_per_virtual_pipeline_stage or num_virtual_stages_per_pipeline_rank, not "
         "both");
  }
  c.num_layers_per_virtual_pipeline_stage = vpp.value_or(0);
  c.decoder_first_pipeline_num_layers = t.PositiveInt("decoder_first_pipeline_num_layers").value_or(0);
  c.decoder_last_pipeline_num_layers = t.PositiveInt("decoder_last_pipeline_num_layers").value_or(0);
  c.sequence_parallel = t.Bool("sequence_parallel").value_or(false);
}

// precision, and Megatron's --fp16 / --bf16 flags, which must agree with it.
void ReadPrecision(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* notes) {
  std::optional<std::string> precision = t.Choice("precision", {"fp32", "fp16", "bf16"});
  std::optional<bool> fp16 = t.Bool("fp16");
  std::optional<bool> bf16 = t.Bool("bf16");
  if (fp16.value_or(false) && bf16.value_or(false))
    Fail(t.At("bf16"), "fp16 and bf16 are both true");
  std::string from_flags = fp16.value_or(false) ? "fp16" : bf16.value_or(false) ? "bf16" : "";
  if (precision && !from_flags.empty() && *precision != from_flags) {
    Fail(t.At(from_flags), fmt::format("true disagrees with precision \"{}\"", *precision));
  }
  if (precision && *precision != "fp16" && fp16.has_value() && *fp16) {
    Fail(t.At("fp16"), fmt::format("true disagrees with precision \"{}\"", *precision));
  }
  for (const char* flag : {"fp16", "bf16"}) {
    const std::optional<bool>& f = std::string_view(flag) == "fp16" ? fp16 : bf16;
    if (precision && *precision == flag && f.has_value() && !*f) {
      Fail(t.At(flag), fmt::format("false disagrees with precision \"{}\"", *precision));
    }
  }
  // Megatron trains in fp32 unless --fp16 or --bf16 is given: an explicit "bf16": false without a
  // precision means fp32 (memsim's own default, bf16, applies only when nothing is said).
  const bool fp32_by_flags = !precision && from_flags.empty() && bf16.has_value() && !*bf16;
  if (fp32_by_flags) {
    notes->push_back(
        fmt::format("{}: false and no fp16 or precision: fp32, as Megatron", t.At("bf16")));
  }
  const std::string p = precision             ? *precision
                        : !from_flags.empty() ? from_flags
                        : fp32_by_flags       ? "fp32"
                                              : "bf16";
  c.precision = p == "fp32" ? Precision::kFp32 : p == "fp16" ? Precision::kFp16 : Precision::kBf16;
  // Forced true for bf16 with framework "megatron" by the derive step (derive.h).
  c.accumulate_allreduce_grads_in_fp32 =
      t.Bool("accumulate_allreduce_grads_in_fp32").value_or(false);
  c.grad_reduce_in_bf16 = t.Bool("grad_reduce_in_bf16").value_or(false);
  if (c.grad_reduce_in_bf16 && c.precision != Precision::kBf16) {
    notes->push_back(fmt::format("{}: no effect without bf16 (Megatron reads it only with bf16)",
                                 t.At("grad_reduce_in_bf16")));
    c.grad_reduce_in_bf16 = false;
  } else if (c.grad_reduce_in_bf16 && c.accumulate_allreduce_grads_in_fp32) {
    // Megatron arguments.py (validate_args): --grad-reduce-in-bf16 switches the fp32
    // accumulation off.
    c.accumulate_allreduce_grads_in_fp32 = false;
    notes->push_back(fmt::format("{}: false with grad_reduce_in_bf16, as Megatron does",
                                 t.At("accumulate_allreduce_grads_in_fp32")));
  }
}

// Megatron-FSDP (use_megatron_fsdp true): the sharding strategy, from
// data_parallel_sharding_strategy (Megatron-LM's default "no_shard") or from the equivalent
// zero_stage (0, 1, 2); the two must agree when both are given. Megatron-FSDP builds its optimizer
// through the distributed-optimizer path (megatron/core/optimizer/distrib_optimizer.py returns
// early for it) and shards optimizer state exactly when the strategy says so, so
// use_distributed_optimizer follows the strategy. Pipeline parallelism and fp32 parameters with
// Megatron-FSDP are not modelled (reported unsupported).
void ReadMegatronFsdp(ObjectReader& t, const std::optional<std::string>& sharding,
                      std::optional<int> zero, TrainingConfig& c, std::vector<std::string>* notes) {
  if (c.pipeline_model_parallel_size > 1) {
    throw UnsupportedError(
        fmt::format("{}: Megatron-FSDP with pipeline parallelism (memsim models "
                    "Megatron-FSDP with pipeline_model_parallel_size 1)",
                    t.At("pipeline_model_parallel_size")));
  }
  if (c.precision == Precision::kFp32) {
    throw UnsupportedError(
        fmt::format("{}: Megatron-FSDP with fp32 parameters (memsim models "
                    "Megatron-FSDP for bf16 and fp16)",
                    t.At("use_megatron_fsdp")));
  }
  static const char* const kNames[] = {"no_shard", "optim", "optim_grads"};
  int stage = 0;
  if (sharding) {
    stage = *sharding == "optim_grads" ? 2 : *sharding == "optim" ? 1 : 0;
    if (zero && *zero != stage) {
      Fail(t.At("zero_stage"),
           fmt::format("{} disagrees with data_parallel_sharding_strategy \"{}\" (ZeRO stage {} "
                       "under Megatron-FSDP)",
                       *zero, *sharding, stage));
    }
  } else if (zero) {
    if (*zero == 3) {
      throw UnsupportedError(
          fmt::format("{}: ZeRO stage 3 (Megatron-FSDP optim_grads_params, not "
                      "modelled)",
                      t.At("zero_stage")));
    }
    stage = *zero;
    notes->push_back(fmt::format("{}: Megatron-FSDP sharding taken as \"{}\"", t.At("zero_stage"),
                                 kNames[stage]));
  } else {
    notes->push_back(fmt::format("{}: absent, Megatron-LM's default \"no_shard\" taken",
                                 t.At("data_parallel_sharding_strategy")));
  }
  c.fsdp_sharding = stage == 2   ? FsdpSharding::kOptimGrads
                    : stage == 1 ? FsdpSharding::kOptim
                                 : FsdpSharding::kNoShard;
  const bool sharded = stage > 0;
  if (c.use_distributed_optimizer != sharded) {
    notes->push_back(fmt::format("{}: taken as {}: Megatron-FSDP \"{}\" {} the optimizer state",
                                 t.At("use_distributed_optimizer"), sharded ? "true" : "false",
                                 kNames[stage], sharded ? "shards" : "does not shard"));
    c.use_distributed_optimizer = sharded;
  }
}

// The optimizer and the data-parallel wrapper's optimizer settings.
void ReadOptimizer(ObjectReader& t, TrainingConfig& c, BlockReader reader,
                   std::vector<std::string>* notes) {
  const bool pytorch = reader == BlockReader::kPlainPyTorch;
  if (std::optional<std::string> o = t.Choice("optimizer", {"adam", "adamw", "sgd"})) {
    c.optimizer = *o == "sgd" ? OptimizerKind::kSgd : OptimizerKind::kAdam;
    // torch.optim.Adam adds weight_decay × param to the gradient (L2); AdamW and Megatron's
    // Adam (TE FusedAdam, adam_w_mode) decay the parameters.
    if (PyTorchOptions* p = c.pytorch()) p->adam_coupled_weight_decay = *o == "adam";
    if (*o == "adamw" && !pytorch) {
      notes->push_back(fmt::format("{}: 'adamw' taken as Megatron's 'adam' (which is AdamW)",
                                   t.At("optimizer")));
    }
  }
  if (std::optional<std::string> o = t.Choice("optimizer_impl", {"fused", "foreach"})) {
    c.optimizer_impl = *o == "foreach" ? OptimizerImpl::kForeach : OptimizerImpl::kFused;
  } else if (pytorch) {
    // torch/optim/optimizer.py _default_to_fused_or_foreach: with foreach and fused unset, the
    // multi-tensor (foreach) implementation on CUDA tensors.
    c.optimizer_impl = OptimizerImpl::kForeach;
    notes->push_back(
        fmt::format("{}: absent, 'foreach' taken (torch.optim's default on the "
                    "device)",
                    t.At("optimizer_impl")));
  }
  c.weight_decay = t.Number("weight_decay", 0, 1e6, false, false).value_or(0.01);
  c.sgd_momentum = t.Number("sgd_momentum", 0, 1, false, true).value_or(0.9);
  c.use_distributed_optimizer = t.Bool("use_distributed_optimizer").value_or(false);
  c.use_megatron_fsdp = t.Bool("use_megatron_fsdp").value_or(false);
  const std::optional<std::string> sharding =
      t.Choice("data_parallel_sharding_strategy",
               {"no_shard", "optim", "optim_grads", "optim_grads_params"});
  const std::optional<int> zero = t.IntInRange("zero_stage", 0, 3);
  if (c.use_megatron_fsdp) {
    ReadMegatronFsdp(t, sharding, zero, c, notes);
    return;
  }
  if (sharding && *sharding != "no_shard") {
    // Megatron-LM reads --data-parallel-sharding-strategy only with --use-megatron-fsdp.
    Fail(t.At("data_parallel_sharding_strategy"),
         fmt::format("\"{}\" applies to Megatron-FSDP only; set use_megatron_fsdp true, or "
                     "use_distributed_optimizer for Megatron's ZeRO-1",
                     *sharding));
  }
  if (zero == 0 && c.use_distributed_optimizer) {
    Fail(t.At("zero_stage"), "0 disagrees with use_distributed_optimizer true (ZeRO-1)");
  }
  if (zero == 1 && !c.use_distributed_optimizer) {
    c.use_distributed_optimizer = true;
    notes->push_back(
        fmt::format("{}: ZeRO-1 taken as use_distributed_optimizer true", t.At("zero_stage")));
  }
}

// The precision-aware optimizer and its dtypes (TrainingConfig::use_precision_aware_optimizer).
// Megatron's rules: OptimizerConfig.__post_init__ (megatron/core/optimizer/optimizer_config.py)
// asserts the dtypes stay fp32 without it and Adam with it; get_megatron_optimizer
// (megatron/core/optimizer/__init__.py) needs the distributed optimizer.
void ReadPrecisionAware(ObjectReader& t, TrainingConfig& c, BlockReader reader) {
  c.use_precision_aware_optimizer = t.Bool("use_precision_aware_optimizer").value_or(false);
  if (t.Choice("main_params_dtype", {"fp32", "fp16"}) == "fp16") {
    c.main_params_dtype = Precision::kFp16;
  }
  const std::vector<std::string> moments = {"fp32", "fp16", "bf16", "fp8"};
  auto moment = [&](const char* key) {
    const std::optional<std::string> v = t.Choice(key, moments);
    return !v || *v == "fp32" ? StateDtype::kFp32
           : *v == "fp16"     ? StateDtype::kFp16
           : *v == "bf16"     ? StateDtype::kBf16
                              : StateDtype::kFp8;
  };
  c.exp_avg_dtype = moment("exp_avg_dtype");
  c.exp_avg_sq_dtype = moment("exp_avg_sq_dtype");
  if (!c.use_precision_aware_optimizer) {
    for (const char* key : {"main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"}) {
      const std::optional<std::string> dtype = t.String(key);  // absent if not a string
      if (dtype && *dtype != "fp32") {
        Fail(t.At(key), fmt::format("{} needs use_precision_aware_optimizer true (Megatron keeps "
                                    "it fp32 otherwise)",
                                    Printable(*dtype)));
      }
    }
    return;
  }
  const char* refusal = reader == BlockReader::kPlainPyTorch ? "framework \"megatron\""
                        : c.optimizer != OptimizerKind::kAdam ? "optimizer \"adam\""
                        : c.use_megatron_fsdp                 ? "Megatron's DDP, not Megatron-FSDP"
                        : !c.use_distributed_optimizer        ? "use_distributed_optimizer true"
                                                              : nullptr;
  if (refusal != nullptr) {
    Fail(t.At("use_precision_aware_optimizer"), fmt::format("true needs {}", refusal));
  }
  if (c.precision == Precision::kFp32) {
    throw UnsupportedError(
        fmt::format("{}: with fp32 parameters (memsim models it for bf16 and "
                    "fp16 training)",
                    t.At("use_precision_aware_optimizer")));
  }
}

// MindSpeed --swap-optimizer (TrainingConfig::swap_optimizer). swap_optimizer_feature.py
// SwapOptimizerFeature: incompatible with reuse_fp32_param, needs the distributed optimizer; its
// patch replaces the DistributedOptimizer and MindSpeed's AdamW.step (Adam only).
void ReadSwapOptimizer(ObjectReader& t, TrainingConfig& c, BlockReader reader) {
  c.swap_optimizer = t.Bool("swap_optimizer").value_or(false);
  const std::optional<int> times = t.NonNegativeInt("swap_optimizer_times");
  c.swap_optimizer_times = times.value_or(16);
  if (!c.swap_optimizer) return;
  const char* refusal = reader == BlockReader::kPlainPyTorch ? "framework \"megatron\" (MindSpeed)"
                        : !c.use_distributed_optimizer      ? "use_distributed_optimizer true"
                        : c.use_megatron_fsdp               ? "Megatron's DDP, not Megatron-FSDP"
                        : c.optimizer != OptimizerKind::kAdam ? "optimizer \"adam\""
                        : c.use_precision_aware_optimizer   ? "use_precision_aware_optimizer false"
                        : t.Bool("reuse_fp32_param").value_or(false)
                            ? "reuse_fp32_param false (MindSpeed refuses both)"
                            : nullptr;
  if (refusal != nullptr) Fail(t.At("swap_optimizer"), fmt::format("true needs {}", refusal));
}

// MindSpeed's memory features (TrainingConfig::reuse_fp32_param, recompute_activation_function).
// MindSpeed's own checks:
// mindspeed/features_manager/memory/reuse_fp32_param.py ReuseFP32Param.validate_args needs bf16;
// its patches wrap Megatron's mixed-precision and distributed optimizers, so the precision-aware
// optimizer (FusedAdam's own master weights) and Megatron-FSDP are outside what it changes.
void ReadMindSpeedMemory(ObjectReader& t, TrainingConfig& c, BlockReader reader) {
  c.recompute_activation_function = t.Bool("recompute_activation_function").value_or(false);
  // activation_function.py RecomputeActivationFeature.validate_args: 0 <= N <= num_layers.
  const std::optional<int> n = t.NonNegativeInt("recompute_activation_function_num_layers");
  c.recompute_activation_function_num_layers = n.value_or(-1);
  if (n && !c.recompute_activation_function) {
    Fail(t.At("recompute_activation_function_num_layers"),
         "needs recompute_activation_function true");
  }
  if (c.recompute_activation_function && reader == BlockReader::kPlainPyTorch) {
    Fail(t.At("recompute_activation_function"), "true needs framework \"megatron\" (MindSpeed)");
  }
  ReadSwapOptimizer(t, c, reader);
  c.reuse_fp32_param = t.Bool("reuse_fp32_param").value_or(false);
  if (!c.reuse_fp32_param) return;
  const char* refusal = reader == BlockReader::kPlainPyTorch   ? "framework \"megatron\" (MindSpeed)"
                        : c.precision != Precision::kBf16      ? "precision \"bf16\" (MindSpeed asserts it)"
                        : c.use_precision_aware_optimizer      ? "use_precision_aware_optimizer false"
                        : c.use_megatron_fsdp                  ? "Megatron's DDP, not Megatron-FSDP"
                                                               : nullptr;
  if (refusal != nullptr) Fail(t.At("reuse_fp32_param"), fmt::format("true needs {}", refusal));
}

// overlap_grad_reduce and overlap_param_gather, and what memsim assumes of them.
void ReadOverlap(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* notes) {
  c.overlap_grad_reduce = t.Bool("overlap_grad_reduce").value_or(false);
  c.overlap_param_gather = t.Bool("overlap_param_gather").value_or(false);
  if (c.overlap_param_gather && !c.use_distributed_optimizer && !c.use_megatron_fsdp) {
    // Megatron arguments.py: --overlap-param-gather needs the distributed optimizer or
    // Megatron-FSDP.
    Fail(t.At("overlap_param_gather"),
         "true needs use_distributed_optimizer or use_megatron_fsdp true (as in Megatron)");
  }
  if (c.overlap_param_gather && c.use_distributed_optimizer) {
    notes->push_back(fmt::format(
        "{}: true, but memsim emits the distributed optimizer's parameter all-gather at the end "
        "of the step, as without overlap (overlapping it with the next forward is not modelled)",
        t.At("overlap_param_gather")));
  } else if (c.overlap_param_gather) {
    notes->push_back(
        fmt::format("{}: true, no effect: Megatron-FSDP \"no_shard\" shards no "
                    "parameters, so there is no all-gather to overlap",
                    t.At("overlap_param_gather")));
  }
  if (c.use_megatron_fsdp && c.fsdp_sharding == FsdpSharding::kOptimGrads &&
      !c.overlap_grad_reduce) {
    // MegatronFSDP.__init__ switches overlap_grad_reduce on for optim_grads, but Megatron-LM's
    // get_model has already set bucket_size to None (one bucket) when it was off at launch.
    notes->push_back(fmt::format(
        "{}: false with Megatron-FSDP \"optim_grads\": Megatron-FSDP overlaps the reduce-scatter "
        "anyway, with the whole model in one bucket (a full-size gradient temporary each "
        "backward); set true for max(4e7, 1e6·d·cp)-element buckets",
        t.At("overlap_grad_reduce")));
  }
}

// recompute_modules: Megatron's names; those of features memsim does not model are unsupported.
void ReadRecomputeModules(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* warnings) {
  const Json* mods = t.Get("recompute_modules");
  if (mods == nullptr) return;
  if (!mods->is_array()) {
    Fail(t.At("recompute_modules"),
         fmt::format("expected a list of module names, got {}", Describe(*mods)));
  }
  // The choices offered are the modelled modules; the others are Megatron's too (a name of
  // theirs is "unsupported", not "unknown"), listed after them.
  std::vector<std::string> names;
  std::string list, others;
  for (const RecomputeModule& m : kRecomputeModules) {
    names.emplace_back(m.name);
    std::string& to = m.unsupported.empty() ? list : others;
    to += (to.empty() ? "'" : ", '") + std::string(m.name) + "'";
  }
  list += " (Megatron's " + others + " are not modelled)";
  c.recompute_modules.clear();
  for (size_t i = 0; i < mods->size(); ++i) {
    const Json& m = (*mods)[i];
    const std::string at =
        t.source().At(Child(t.PointerOf("recompute_modules"), std::to_string(i)));
    const std::string name = m.is_string() ? m.get<std::string>() : std::string();
    const auto known = std::find_if(std::begin(kRecomputeModules), std::end(kRecomputeModules),
                                    [&](const RecomputeModule& r) { return r.name == name; });
    if (!m.is_string() || known == std::end(kRecomputeModules)) {
      std::string message = fmt::format("expected one of {}, got {}", list, Describe(m));
      const std::string guess = m.is_string() ? ClosestMatch(name, names) : std::string();
      if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
      Fail(at, message);
    }
    if (!known->unsupported.empty()) {
      throw UnsupportedError(
          fmt::format("{}: recompute module '{}' ({})", at, name, known->unsupported));
    }
    c.recompute_modules.push_back(name);
  }
  if (c.recompute_granularity != RecomputeGranularity::kSelective) {
    warnings->push_back(
        fmt::format("{}: not used: the modules apply to recompute_granularity "
                    "\"selective\"",
                    t.At("recompute_modules")));
  } else if (c.recompute_modules.empty()) {
    warnings->push_back(
        fmt::format("{}: empty: selective recompute re-runs nothing", t.At("recompute_modules")));
  }
}

// recompute_granularity, recompute_method, recompute_num_layers, recompute_modules.
void ReadRecompute(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* notes,
                   std::vector<std::string>* warnings) {
  std::optional<std::string> g = t.Choice("recompute_granularity", {"none", "selective", "full"});
  const std::string granularity = g.value_or("none");
  c.recompute_granularity = granularity == "full"        ? RecomputeGranularity::kFull
                            : granularity == "selective" ? RecomputeGranularity::kSelective
                                                         : RecomputeGranularity::kNone;
  std::optional<std::string> method = t.Choice("recompute_method", {"uniform", "block"});
  std::optional<int> num_layers = t.PositiveInt("recompute_num_layers");
  if (c.recompute_granularity == RecomputeGranularity::kFull) {
    if (!method) {
      notes->push_back(
          fmt::format("{}: absent with full recompute, 'uniform' taken", t.At("recompute_method")));
    }
    c.recompute_method =
        method.value_or("uniform") == "block" ? RecomputeMethod::kBlock : RecomputeMethod::kUniform;
    c.recompute_num_layers = num_layers.value_or(1);
  } else if (method) {
    // Megatron arguments.py: recompute_method is only for full recompute.
    Fail(t.At("recompute_method"), fmt::format("applies only to recompute_granularity \"full\", "
                                               "got recompute_granularity \"{}\"",
                                               granularity));
  }
  ReadRecomputeModules(t, c, warnings);
}

// Kernels and software: attention, the Transformer Engine switch, gradient accumulation fusion,
// versions, iterations and Megatron's empty_cache level.
void ReadKernels(ObjectReader& t, TrainingConfig& c, BlockReader reader,
                 std::vector<std::string>* notes, std::vector<std::string>* warnings) {
  const bool pytorch = reader == BlockReader::kPlainPyTorch;
  c.use_flash_attn = t.Bool("use_flash_attn").value_or(false);
  c.transformer_impl =
      t.Choice("transformer_impl", {"transformer_engine", "local"}).value_or("transformer_engine");
  c.gradient_accumulation_fusion = t.Bool("gradient_accumulation_fusion").value_or(true);
  c.create_attention_mask_in_dataloader =
      t.Bool("create_attention_mask_in_dataloader").value_or(true);
  if (pytorch && c.gradient_accumulation_fusion) {
    // Megatron's fused weight-gradient accumulation into main_grad; plain PyTorch's autograd
    // hands every weight gradient to the parameter's .grad.
    c.gradient_accumulation_fusion = false;
    (t.Has("gradient_accumulation_fusion") ? warnings : notes)
        ->push_back(fmt::format("{}: taken as false with framework \"pytorch\" (Megatron's fused "
                                "weight-gradient accumulation; autograd produces each weight "
                                "gradient)",
                                t.At("gradient_accumulation_fusion")));
  }
  if (c.use_megatron_fsdp && c.gradient_accumulation_fusion) {
    // Megatron-Bridge's ConfigContainer.validate (src/megatron/bridge/training/config.py, r0.2.0)
    // switches the fusion off whenever Megatron-FSDP is on; Megatron-LM's own launcher does not.
    notes->push_back(
        fmt::format("{}: true with Megatron-FSDP; Megatron-Bridge (NeMo) launches turn "
                    "it off, set false for those",
                    t.At("gradient_accumulation_fusion")));
  }
  c.transformer_engine_version = Version(t, "transformer_engine_version", "2.9");
  c.megatron_core_version = Version(t, "megatron_core_version", "0.15");
  c.train_iters = t.PositiveInt("train_iters").value_or(4);
  c.empty_unused_memory_level = t.IntInRange("empty_unused_memory_level", 0, 2).value_or(0);
  c.log_params_norm = t.Bool("log_params_norm").value_or(false);
  if (pytorch && c.log_params_norm) {
    Fail(t.At("log_params_norm"),
         fmt::format("Megatron's --log-params-norm needs framework \"megatron\", not \"{}\"",
                     c.framework));
  }
  if (pytorch && c.empty_unused_memory_level > 0) {
    // Megatron's train_step calls torch.cuda.empty_cache() at these levels; a plain loop does
    // not.
    Fail(t.At("empty_unused_memory_level"),
         fmt::format("{} needs framework \"megatron\" (train_step's empty_cache calls); {}",
                     c.empty_unused_memory_level, kSingleDevice));
  }
}

// The keys accepted without effect, each with a note.
void NoteAcceptedKeys(ObjectReader& t, std::vector<std::string>* notes) {
  for (const std::string& key : kNoMemoryEffect) {
    if (t.Get(key) != nullptr)
      notes->push_back(fmt::format("{}: accepted, no effect on memory", t.At(key)));
  }
  for (const char* key : {"load", "no_load_optim", "finetune"}) t.Skip(key);
  if (t.Has("load"))
    notes->push_back(fmt::format(
        "{}: weights loaded from a checkpoint (optimizer state not loaded)", t.At("load")));
}

// DistributedDataParallel's constructor arguments (torch/nn/parallel/distributed.py), framework
// "pytorch" only: under "megatron" each is an error naming what Megatron-core DDP reads instead.
void ReadTorchDdpKeys(ObjectReader& t, TrainingConfig& c, BlockReader reader,
                      std::vector<std::string>* notes) {
  static const char* const kKeys[] = {"bucket_cap_mb", "find_unused_parameters",
                                      "gradient_as_bucket_view"};
  if (reader != BlockReader::kPlainPyTorch) {
    for (const char* key : kKeys) {
      if (t.Has(key)) {
        Fail(t.At(key), "a framework \"pytorch\" key (PyTorch DistributedDataParallel's "
                        "argument); Megatron-core DDP lays out its buckets by itself "
                        "(overlap_grad_reduce, use_distributed_optimizer)");
      }
    }
    return;
  }
  PyTorchOptions& p = *c.pytorch();  // ReadTraining set it for this reader
  p.ddp_bucket_cap_mb = t.Number("bucket_cap_mb", 0, 1e6, true, false).value_or(0);
  p.ddp_find_unused_parameters = t.Bool("find_unused_parameters").value_or(false);
  p.ddp_gradient_as_bucket_view = t.Bool("gradient_as_bucket_view").value_or(false);
  if (c.data_parallel_size > 1) return;
  for (const char* key : kKeys) {
    if (t.Has(key)) {
      notes->push_back(fmt::format("{}: no effect with data_parallel_size 1 (no "
                                   "DistributedDataParallel)",
                                   t.At(key)));
    }
  }
}

// torch_dtype and zero_grad_set_to_none: read under either framework (a wrong value is an error),
// used with "pytorch" only; with "megatron" a note says so. With "pytorch", what memsim assumes
// where the config is silent.
void ReadPlainPytorchKeys(ObjectReader& t, TrainingConfig& c, BlockReader reader,
                          std::vector<std::string>* notes, std::vector<std::string>* warnings) {
  const std::optional<std::string> d =
      t.Choice("torch_dtype", {"float32", "bfloat16", "float16"});
  const bool set_to_none = t.Bool("zero_grad_set_to_none").value_or(true);
  if (PyTorchOptions* p = c.pytorch()) {  // checked above under "megatron" too, not kept
    if (d) {
      p->torch_dtype = *d == "bfloat16"  ? Precision::kBf16
                       : *d == "float16" ? Precision::kFp16
                                         : Precision::kFp32;
    }
    p->zero_grad_set_to_none = set_to_none;
  }
  ReadTorchDdpKeys(t, c, reader, notes);
  if (reader != BlockReader::kPlainPyTorch) {
    for (const char* key : {"torch_dtype", "zero_grad_set_to_none"}) {
      if (t.Has(key)) {
        warnings->push_back(
            fmt::format("{}: not used with framework \"megatron\" (it applies to "
                        "framework \"pytorch\")",
                        t.At(key)));
      }
    }
    return;
  }
  if (!t.Has("precision") && !t.Has("fp16") && !t.Has("bf16")) {
    notes->push_back(
        fmt::format("{}: absent, bf16 taken (memsim's default): torch.autocast to "
                    "bfloat16 over the weights; \"fp32\" for no autocast",
                    t.At("precision")));
  }
  if (t.Has("make_vocab_size_divisible_by")) {
    warnings->push_back(
        fmt::format("{}: not used with framework \"pytorch\" (the Hugging Face model "
                    "keeps vocab_size rows)",
                    t.At("make_vocab_size_divisible_by")));
  }
  if (c.optimizer == OptimizerKind::kSgd && !t.Has("sgd_momentum")) {
    notes->push_back(
        fmt::format("{}: absent, 0.9 taken (Megatron's default; torch.optim.SGD's "
                    "own default is 0, without a momentum buffer)",
                    t.At("sgd_momentum")));
  }
}

// "dp:200;tp:300" (MindSpeed --hccl-group-buffer, MiB per group), keyed by memsim's group name.
// Only a group of core/comm_group.h made with get_nccl_options takes a size; any other name is
// warned about and dropped, so what the warning says and what the device model applies agree.
std::map<std::string, Bytes> ParseGroupBuffers(const std::string& text, const std::string& at,
                                               std::vector<std::string>* warnings) {
  std::map<std::string, Bytes> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(';', start), text.size());
    const std::string item = text.substr(start, end - start);
    const size_t colon = item.find(':');
    int mib = 0;
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < item.size();
    for (size_t i = colon + 1; ok && i < item.size(); ++i) {
      ok = std::isdigit(static_cast<unsigned char>(item[i])) != 0 && mib < 1'000'000;
      if (ok) mib = mib * 10 + (item[i] - '0');
    }
    if (!ok || mib == 0) {
      Fail(at, fmt::format("expected \"group:MiB;group:MiB\" with MiB from 1 to 10^6, got \"{}\"",
                           text));
    }
    const std::string key = item.substr(0, colon);
    if (const std::optional<CommGroup> group = CommGroupForBufferKey(key)) {
      const std::string name(CommGroupName(*group));
      if (!out.emplace(name, Bytes{mib} << 20).second) {
        Fail(at, fmt::format("\"{}\" names group \"{}\", which an earlier entry sizes already",
                             key, name));
      }
    } else if (CommGroupFromName(key)) {  // the world: init_process_group, no pg_options
      warnings->push_back(fmt::format("{}: group \"{}\" is the default process group, made "
                                      "without get_nccl_options; its buffer size is not used",
                                      at, key));
    } else {
      warnings->push_back(fmt::format("{}: group \"{}\" not modelled (memsim makes communicators "
                                      "for {}); its buffer size is not used",
                                      at, key, BufferKeyNames()));
    }
    start = end + 1;
  }
  return out;
}

// tp_comm_overlap, hccl_group_buffer and the env block (JobEnvironment).
void ReadOutsideAllocator(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* warnings) {
  c.tp_comm_overlap = t.Bool("tp_comm_overlap").value_or(false);
  if (std::optional<std::string> g = t.String("hccl_group_buffer")) {
    c.env.hccl_group_buffer = ParseGroupBuffers(*g, t.At("hccl_group_buffer"), warnings);
  }
  const Json* env = t.Get("env");
  if (env == nullptr) return;
  ObjectReader e(t.source(), *env, t.PointerOf("env"));
  // NCCL_BUFFSIZE: bytes; NCCL accepts any positive value, memsim bounds it at 1 GiB.
  if (std::optional<std::int64_t> b = e.NonNegativeInt64("NCCL_BUFFSIZE")) {
    if (*b < 1 || *b > (std::int64_t{1} << 30)) {
      Fail(e.At("NCCL_BUFFSIZE"), fmt::format("expected bytes from 1 to 2^30, got {}", *b));
    }
    c.env.nccl_buffsize = *b;
  }
  if (std::optional<int> v = e.IntInRange("NCCL_NVLS_ENABLE", 0, 2)) c.env.nccl_nvls_enable = *v != 0;
  if (std::optional<int> mib = e.IntInRange("HCCL_BUFFSIZE", 1, 1'000'000)) {
    c.env.hccl_buffsize = Bytes{*mib} << 20;
  }
  if (std::optional<std::string> m = e.Choice("CUDA_MODULE_LOADING", {"LAZY", "EAGER"})) {
    c.env.cuda_module_loading_eager = *m == "EAGER";
  }
  e.RejectUnknown({"NCCL_BUFFSIZE", "NCCL_NVLS_ENABLE", "HCCL_BUFFSIZE", "CUDA_MODULE_LOADING"});
}

}  // namespace

// skipped_iterations: the fp16 loss scaler's skipped steps (TrainingConfig::skipped_iterations).
void ReadSkippedIterations(ObjectReader& t, TrainingConfig& c) {
  c.skipped_iterations = t.NonNegativeInt("skipped_iterations").value_or(0);
  if (c.skipped_iterations > 0 && c.precision != Precision::kFp16) {
    // Megatron builds a grad scaler for fp16 (DynamicGradScaler) and, in bf16, only with an
    // explicit --loss-scale (megatron/core/optimizer/__init__.py); memsim's bf16 and fp32 have
    // none, and torch.amp's GradScaler is an fp16 device.
    Fail(t.At("skipped_iterations"),
         fmt::format("{} needs precision \"fp16\" (only the fp16 loss scaler skips steps)",
                     c.skipped_iterations));
  }
}

void RejectUnsupported(ObjectReader& t, BlockReader reader) {
  const bool fsdp = t.Bool("use_megatron_fsdp").value_or(false);
  if (std::optional<std::string> s =
          t.Choice("data_parallel_sharding_strategy",
                   {"no_shard", "optim", "optim_grads", "optim_grads_params"});
      fsdp && s == "optim_grads_params") {
    throw UnsupportedError(
        fmt::format("{}: Megatron-FSDP sharding 'optim_grads_params' (sharded "
                    "weights, gathered per layer; memsim models no_shard, "
                    "optim and optim_grads)",
                    t.At("data_parallel_sharding_strategy")));
  }
  const bool pytorch = reader == BlockReader::kPlainPyTorch;
  if (std::optional<int> z = t.IntInRange("zero_stage", 0, 3); pytorch && z && *z >= 2) {
    // Sharding across data-parallel devices (DeepSpeed ZeRO); not "models ZeRO-1", which is a
    // Megatron feature.
    throw UnsupportedError(fmt::format("{}: ZeRO stage {} with framework \"pytorch\" ({})",
                                       t.At("zero_stage"), *z, kSingleDevice));
  }
  if (std::optional<int> z = t.IntInRange("zero_stage", 0, 3); !fsdp && z && *z >= 2) {
    throw UnsupportedError(
        fmt::format("{}: ZeRO stage {} (memsim models ZeRO-1, Megatron's "
                    "distributed optimizer, and Megatron-FSDP's optim and "
                    "optim_grads)",
                    t.At("zero_stage"), *z));
  }
  if (std::optional<bool> g = t.Bool("enable_cuda_graph"); g.value_or(false)) {
    throw UnsupportedError(fmt::format("{}: CUDA graphs", t.At("enable_cuda_graph")));
  }
  if (std::optional<std::string> g = t.String("cuda_graph_impl"); g && *g != "none") {
    throw UnsupportedError(
        fmt::format("{}: CUDA graphs ('{}')", t.At("cuda_graph_impl"), Printable(*g)));
  }
  for (const char* key : {"fp8", "fp8_format"}) {
    if (const Json* v = t.Get(key); v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
      throw UnsupportedError(fmt::format("{}: FP8 training", t.At(key)));
    }
  }
  std::optional<std::string> load = t.String("load");
  const bool no_load_optim = t.Bool("no_load_optim").value_or(false);
  const bool finetune = t.Bool("finetune").value_or(false);
  if (load && !load->empty() && !no_load_optim && !finetune) {
    throw UnsupportedError(fmt::format(
        "{}: resuming from a checkpoint with optimizer state (set no_load_optim to load "
        "weights only)",
        t.At("load")));
  }
}

namespace {

// A key of the training block that memsim does not read but Megatron's argument parsers
// define (optimizer_cpu_offload = --optimizer-cpu-offload): said as --megatron-args says it,
// from the same table (megatron_flags.h), rather than as an unknown key.
void RejectMegatronArgumentKeys(const ObjectReader& t, const std::vector<std::string>& known) {
  for (const std::string& key : t.Unread()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const FlagInfo* info = FindFlag(flag);
    if (info == nullptr || info->flag_class == FlagClass::kModelled) continue;
    if (info->flag_class == FlagClass::kUnsupported) {
      throw UnsupportedError(
          fmt::format("{}: {} (the launch-script argument {})", t.At(key), info->why, flag));
    }
    Fail(t.At(key),
         info->flag_class == FlagClass::kNotModelled
             ? fmt::format("not modelled: {} (the launch-script argument {}); remove the key, or "
                           "give the launch script with --megatron-args, which warns and goes on",
                           info->why, flag)
             : fmt::format("the launch-script argument {} is memory-neutral and not a key memsim "
                           "reads: remove it",
                           flag));
  }
}

}  // namespace

const std::vector<std::string>& TrainingKeys() { return kTrainingKeys; }

const Stack& StackOfBlock(ObjectReader& t) {
  const std::string name = t.String("framework").value_or("megatron");
  const Stack* stack = FindStack(name);
  if (stack == nullptr) {
    throw UnsupportedError(fmt::format("{}: framework '{}' (memsim models {})", t.At("framework"),
                                       Printable(name), QuotedStackNames()));
  }
  return *stack;
}

void CheckMegatronNamedKeys(ObjectReader& t, std::string_view framework, BlockReader reader,
                            const std::vector<std::string>& stack_keys) {
  RejectUnsupported(t, reader);
  RejectHfTrainerKeys(t, framework);
  std::vector<std::string> known = TrainingKeys();
  known.insert(known.end(), stack_keys.begin(), stack_keys.end());
  for (const std::vector<std::string>* more :
       {&MegatronArchitectureKeys(), &MegatronMlaArchitectureKeys(), &MegatronMoeArchitectureKeys(),
        &MoeTrainingKeys()}) {
    known.insert(known.end(), more->begin(), more->end());
  }
  RejectMegatronArgumentKeys(t, known);
  t.RejectUnknown(known);
}

TrainingConfig ReadTraining(ObjectReader& t, std::string_view framework, BlockReader reader,
                            std::vector<std::string>* notes, std::vector<std::string>* warnings) {
  TrainingConfig c;
  c.framework = std::string(framework);
  if (reader == BlockReader::kPlainPyTorch) {
    c.stack.emplace<PyTorchOptions>();  // its block (setup.h); "megatron" keeps the default
    CheckSingleDevice(t);
  }
  ReadBatch(t, c, notes);
  ReadPrecision(t, c, notes);
  ReadOptimizer(t, c, reader, notes);
  ReadSkippedIterations(t, c);
  ReadPrecisionAware(t, c, reader);
  ReadMindSpeedMemory(t, c, reader);
  ReadOverlap(t, c, notes);
  ReadRecompute(t, c, notes, warnings);
  ReadKernels(t, c, reader, notes, warnings);
  ReadMoeTraining(t, c);
  NoteAcceptedKeys(t, notes);
  ReadPlainPytorchKeys(t, c, reader, notes, warnings);
  ReadOutsideAllocator(t, c, warnings);
  return c;
}

void ReadMegatronNamedBlock(ObjectReader& t, LocatedModel* model, std::string_view framework,
                            BlockReader reader, Setup* s) {
  ApplyMegatronArchitecture(t, model, &s->notes);
  s->training = ReadTraining(t, framework, reader, &s->notes, &s->warnings);
}

}  // namespace memsim::config::internal
