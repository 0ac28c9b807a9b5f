// The training block of framework "hf-trainer" (hf_trainer.h) -> TrainingConfig. Field names and
// defaults are those of transformers/training_args.py (class TrainingArguments); what the Trainer
// does with them is transformers/trainer.py (Trainer.create_optimizer, get_optimizer_cls_and_kwargs,
// _inner_training_loop, training_step).
#include "config/hf_trainer.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "config/documents.h"
#include "config/iterations.h"
#include "core/error.h"
#include "config/rules.h"
#include "config/sample_data.h"
#include "config/training.h"

namespace memsim::config::internal {
namespace {

constexpr std::string_view kFramework = "hf-trainer";

// The TrainingArguments fields memsim reads, with an effect on memory.
const std::vector<std::string> kModelled = {
    "per_device_train_batch_size", "gradient_accumulation_steps", "fp16", "bf16",
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "optim", "weight_decay",
    "max_steps", "eval_steps", "eval_strategy", "evaluation_strategy",
    "per_device_eval_batch_size", "prediction_loss_only", "eval_accumulation_steps", "eval_delay",
    "eval_do_concat_batches", "logging_steps", "ddp_bucket_cap_mb", "ddp_find_unused_parameters",
    // the sampler of the data's lengths (sample_data.h)
    "group_by_length", "seed", "data_seed",
    // recognised; unsupported when set to what memsim does not model (torch_compile_backend,
    // torch_compile_mode and the deprecated torchdynamo switch torch_compile on:
    // TrainingArguments.__post_init__; adafactor true sets optim "adafactor" there)
    "deepspeed", "fsdp", "torch_compile", "optim_args", "torch_compile_backend",
    "torch_compile_mode", "torchdynamo", "adafactor"};

// TrainingArguments fields with an effect on device memory that memsim does not model, at their
// default (null, false, "auto") in every trainer.args.to_json_string(): a warning each when set
// to anything else (transformers/training_args.py for the defaults, transformers/trainer.py for
// what the Trainer does with them).
// `errs`: which way memsim's figures are off when the field is set (the out-of-memory verdict's
// caveat, setup.h NotModelled): kHigh where the Trainer then holds less than memsim simulates,
// kLow where more, kEither where it depends on the run.
struct NotModelledField {
  std::string_view key;
  std::string_view default_string;  // a string default ("auto"); empty: null or false
  std::string_view what;
  NotModelled::Direction errs;
};
constexpr NotModelledField kNotModelledFields[] = {
    {"torch_empty_cache_steps", "",
     "Trainer.training_step calls torch.cuda.empty_cache() every N steps, between the forward and "
     "the backward: reserved drops there, while memsim keeps the cache",
     NotModelled::Direction::kHigh},
    {"auto_find_batch_size", "",
     "after an out-of-memory error the Trainer retries with half the batch "
     "(accelerate find_executable_batch_size in Trainer.train); memsim simulates "
     "per_device_train_batch_size as given",
     NotModelled::Direction::kHigh},
    {"use_liger_kernel", "",
     "Liger's kernels (a fused linear cross-entropy that never holds the whole logits, fused "
     "RMSNorm, SwiGLU and RoPE) replace the model's ops; memsim is high",
     NotModelled::Direction::kHigh},
    {"neftune_noise_alpha", "",
     "NEFTune's forward hook adds noise to the embedding output in training (one "
     "embedding-output-sized tensor more)",
     NotModelled::Direction::kLow},
    {"include_inputs_for_metrics", "",
     "the evaluation also gathers and keeps each batch's inputs on the device", NotModelled::Direction::kLow},
    {"batch_eval_metrics", "", "metrics computed after each evaluation batch", NotModelled::Direction::kEither},
    {"eval_on_start", "", "an evaluation before the first training step", NotModelled::Direction::kLow},
    {"half_precision_backend", "auto", "apex AMP instead of torch.autocast", NotModelled::Direction::kEither},
    {"fp16_backend", "auto", "apex AMP instead of torch.autocast (the deprecated name of "
                             "half_precision_backend)",
     NotModelled::Direction::kEither},
    {"split_batches", "", "accelerate splits each batch over the processes", NotModelled::Direction::kHigh},
};

// memsim's own keys of the block: what a Trainer run fixes outside TrainingArguments.
const std::vector<std::string> kOwnKeys = {
    "framework",     "training_args",  "max_seq_length",     "torch_dtype",
    "attn_implementation", "world_size", "adapter_config", "quantization_config",
    "torch_version", "transformers_version", "eval_batches", "compute_metrics",
    "skipped_iterations", "prepare_model_for_kbit_training", "kbit_modules_recast", "data"};

// TrainingArguments fields without an effect on device memory in a Trainer run on one device
// (schedules, logging, saving, seeds, the data loader's host side): accepted with a note.
const std::vector<std::string> kNoMemoryEffect = {
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "learning_rate",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "num_train_epochs",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "log_level",
    "logging_dir", "logging_strategy", "logging_first_step", "save_strategy",
    "save_steps", "save_total_limit", "save_safetensors", "run_name",
    "report_to", "disable_tqdm", "remove_unused_columns", "label_names", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_drop_last", "push_to_hub", "hub_model_id",
    "label_smoothing_factor", "length_column_name", "ddp_backend", "ddp_timeout", "local_rank", "tf32", "use_cpu", "no_cuda",
    "include_num_input_tokens_seen", "logging_nan_inf_filter", "skip_memory_metrics",
    // host side, logging, the Hub, checkpoint files, TPUs / CPUs / Apple devices
    "log_level_replica", "log_on_each_node", "save_on_each_node", "save_only_model",
    "restore_callback_states_from_checkpoint", "hub_strategy", "hub_token", "hub_private_repo",
    "hub_always_push", "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token",
    "ignore_data_skip", "past_index", "tpu_num_cores", "tpu_metrics_debug", "debug", "ray_scope",
    "mp_parameters", "full_determinism", "dataloader_prefetch_factor",
    "dataloader_persistent_workers", "include_tokens_per_second", "use_mps_device", "use_ipex",
    "eval_use_gather_object",
    // not used by the Trainer itself ("intended to be used by your training/evaluation
    // scripts", its help text)
    "resume_from_checkpoint",
    // read only with fsdp set, which is unsupported
    "fsdp_min_num_params", "fsdp_config", "fsdp_transformer_layer_cls_to_wrap",
    // read only under apex AMP (half_precision_backend "apex", warned)
    "fp16_opt_level"};

// Keys of the other frameworks' training block and what "hf-trainer" reads instead.
struct Foreign {
  std::string_view key;
  std::string_view instead;
};
constexpr Foreign kForeign[] = {
    {"micro_batch_size", "per_device_train_batch_size"},
    {"global_batch_size",
     "per_device_train_batch_size and gradient_accumulation_steps (the global batch is their "
     "product times world_size)"},
    {"seq_length", "max_seq_length (the length the data collator pads or truncates to)"},
    {"precision", "fp16 or bf16 (autocast), and torch_dtype for the weights"},
    {"recompute_granularity", "gradient_checkpointing"},
    {"recompute_method", "gradient_checkpointing"},
    {"recompute_num_layers", "gradient_checkpointing (every decoder layer)"},
    {"optimizer", "optim (adamw_torch, adamw_torch_fused, adamw_hf, sgd)"},
    {"optimizer_impl", "optim (adamw_torch is foreach, adamw_torch_fused is fused)"},
    {"train_iters", "max_steps"},
    {"data_parallel_size", "world_size"},
    {"use_flash_attn", "attn_implementation"},
    {"zero_grad_set_to_none", "nothing (Trainer calls model.zero_grad(), which sets to None)"},
    {"sgd_momentum", "nothing (optim sgd is torch.optim.SGD without momentum)"},
    {"tensor_model_parallel_size", "nothing (the Trainer runs data parallel only)"},
    {"pipeline_model_parallel_size", "nothing (the Trainer runs data parallel only)"},
    {"context_parallel_size", "nothing (the Trainer runs data parallel only)"},
    {"sequence_parallel", "nothing (the Trainer runs data parallel only)"},
    {"use_distributed_optimizer", "deepspeed or fsdp (not modelled)"},
    {"transformer_impl", "nothing (Transformers modelling code, no Transformer Engine)"},
    {"num_layers", "num_hidden_layers in the model file (config.json)"},
    {"ffn_hidden_size", "intermediate_size in the model file (config.json)"},
    {"hidden_size", "hidden_size in the model file (config.json)"},
    {"num_attention_heads", "num_attention_heads in the model file (config.json)"},
    {"per_gpu_train_batch_size", "per_device_train_batch_size (the deprecated name)"},
    {"bucket_cap_mb", "ddp_bucket_cap_mb"},
    {"find_unused_parameters", "ddp_find_unused_parameters"},
    {"gradient_as_bucket_view",
     "nothing (the Trainer leaves DistributedDataParallel's gradient_as_bucket_view at False: "
     "accelerate's DistributedDataParallelKwargs default)"},
};

// The TrainingArguments fields memsim knows (kOwnKeys added for an inline block).
std::vector<std::string> KnownKeys(bool own) {
  std::vector<std::string> k = kModelled;
  k.insert(k.end(), kNoMemoryEffect.begin(), kNoMemoryEffect.end());
  for (const NotModelledField& f : kNotModelledFields) k.emplace_back(f.key);
  k.emplace_back("accelerator_config");
  if (own) k.insert(k.end(), kOwnKeys.begin(), kOwnKeys.end());
  return k;
}

// The block's readers: `args` holds the TrainingArguments fields (the block itself, or the file
// named by training_args), `own` memsim's own keys (always the block).
struct Readers {
  ObjectReader& args;
  ObjectReader& own;
  const Document& config;
};

// The TrainingConfig fields this reader sets from a key of another name, or from a
// TrainingArguments field that may sit in the training_args file: the key the user wrote, for
// the rules' messages (origin.h KeyAliases). `own`: memsim's own key of the block, else a
// TrainingArguments field (the block, or the training_args file).
struct Alias {
  std::string_view field;
  std::string_view key;
  bool own;
};
constexpr Alias kAliases[] = {
    {"micro_batch_size", "per_device_train_batch_size", false},
    {"gradient_accumulation_steps", "gradient_accumulation_steps", false},
    // global_batch_size = per_device_train_batch_size × gradient_accumulation_steps ×
    // world_size (ReadBatch); the rules name it for the micro-batches of a step, which
    // gradient_accumulation_steps sets.
    {"global_batch_size", "gradient_accumulation_steps", false},
    {"seq_length", "max_seq_length", true},
    {"train_iters", "max_steps", false},
    {"data_parallel_size", "world_size", true},
    {"use_flash_attn", "attn_implementation", true},
    {"recompute_granularity", "gradient_checkpointing", false},
    {"recompute_num_layers", "gradient_checkpointing", false},
    {"optimizer", "optim", false},
    {"optimizer_impl", "optim", false},
    {"eval_steps", "eval_steps", false},
    {"eval_batch_size", "per_device_eval_batch_size", false},
    {"ddp_bucket_cap_mb", "ddp_bucket_cap_mb", false},
    {"ddp_find_unused_parameters", "ddp_find_unused_parameters", false},
};

Precision DtypeOf(const std::string& name) {
  return name == "bfloat16" ? Precision::kBf16 : name == "float16" ? Precision::kFp16 : Precision::kFp32;
}

// memsim's limit on the tokens of one batch (rules.h): `batch_key` (per_device_train_batch_size
// or per_device_eval_batch_size) × max_seq_length. Named at the factor nearer its own limit
// (reader.cc kLimits: 2^16 samples, 2^26 tokens), the other one with where it was written: with
// a training_args file the two are in different files.
void CheckBatchTokens(const Readers& r, const char* batch_key, int batch, int seq_length) {
  const std::int64_t tokens = std::int64_t{batch} * seq_length;
  if (tokens <= kMaxTokensPerMicroBatch) return;
  const bool by_batch =
      static_cast<double>(batch) / (1 << 16) > static_cast<double>(seq_length) / (1 << 26);
  const std::string batch_at = r.args.At(batch_key);
  const std::string seq_at = r.own.At("max_seq_length");
  Fail(by_batch ? batch_at : seq_at,
       fmt::format("{} × max_seq_length = {} × {} = {} tokens exceed memsim's limit of {} (with "
                   "{} at {})",
                   batch_key, batch, seq_length, tokens, kMaxTokensPerMicroBatch,
                   by_batch ? "max_seq_length" : batch_key, by_batch ? seq_at : batch_at));
}

// memsim's limits (rules.h) on what ReadBatch read, named by the keys of this block (rules.cc
// checks them again on the derived Megatron values, under Megatron's names): micro-batches per
// step (gradient_accumulation_steps), tokens of a micro-batch, and the global batch in an int.
void CheckBatchLimits(const Readers& r, const TrainingConfig& c, int ga) {
  if (ga > kMaxMicroBatches) {
    Fail(r.args.At("gradient_accumulation_steps"),
         fmt::format("{} micro-batches per step exceed memsim's limit of {}", ga, kMaxMicroBatches));
  }
  CheckBatchTokens(r, "per_device_train_batch_size", c.micro_batch_size, c.seq_length);
  const std::int64_t global = std::int64_t{c.micro_batch_size} * ga * c.data_parallel_size;
  if (global > std::numeric_limits<int>::max()) {
    Fail(r.own.At("world_size"),
         fmt::format("the global batch per_device_train_batch_size × gradient_accumulation_steps "
                     "× world_size = {} × {} × {} = {} samples exceeds memsim's limit of {}",
                     c.micro_batch_size, ga, c.data_parallel_size, global,
                     std::numeric_limits<int>::max()));
  }
}

// Batch, sequence, steps and processes.
void ReadBatch(const Readers& r, TrainingConfig& c, std::vector<std::string>* notes) {
  ObjectReader& t = r.args;
  ObjectReader& own = r.own;
  // TrainingArguments.per_device_train_batch_size default 8, gradient_accumulation_steps 1.
  c.micro_batch_size = t.PositiveInt("per_device_train_batch_size").value_or(8);
  if (!t.Has("per_device_train_batch_size")) {
    notes->push_back(fmt::format("{}: absent, 8 taken (TrainingArguments' default)",
                                 t.At("per_device_train_batch_size")));
  }
  const int ga = t.PositiveInt("gradient_accumulation_steps").value_or(1);
  if (std::optional<int> s = own.PositiveInt("max_seq_length")) {
    c.seq_length = *s;
  } else if (!own.Has("max_seq_length")) {  // present: its error is recorded (reader.h)
    Fail(own.At("max_seq_length"),
         "missing key, expected a positive integer (the length the data collator pads or "
         "truncates every sample to)");
  }
  // torchrun's WORLD_SIZE: one process per device, the model wrapped in DistributedDataParallel
  // when above 1 (Trainer._wrap_model, accelerate Accelerator.prepare_model).
  c.data_parallel_size = own.PositiveInt("world_size").value_or(1);
  CheckBatchLimits(r, c, ga);
  c.global_batch_size = c.micro_batch_size * ga * c.data_parallel_size;
  // TrainingArguments.max_steps default -1 (epochs decide); memsim simulates a few steps.
  if (std::optional<int> m = t.IntInRange("max_steps", -1, 1 << 30); m && *m > 0) {
    c.train_iters = *m;
  } else {
    c.train_iters = 4;
    notes->push_back(fmt::format("{}: absent, 0 or -1 (the epochs decide), 4 optimizer steps "
                                 "simulated (memory repeats from step 2 on)",
                                 t.At("max_steps")));
  }
}

// The DistributedDataParallel arguments Trainer._wrap_model passes (transformers/trainer.py):
// find_unused_parameters = ddp_find_unused_parameters if set, else, for a PreTrainedModel, not
// model.is_gradient_checkpointing (a PEFT PeftModel is not one: True); bucket_cap_mb =
// ddp_bucket_cap_mb if set. accelerate's DistributedDataParallelKwargs.to_kwargs passes only
// values that differ from its defaults (bucket_cap_mb 25, gradient_as_bucket_view False).
void ReadDdp(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* notes) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  const bool ddp = c.data_parallel_size > 1;
  const std::optional<double> cap = t.Number("ddp_bucket_cap_mb", 0, 1e6, true, false);
  const std::optional<bool> unused = t.Bool("ddp_find_unused_parameters");
  if (!ddp) {
    for (const char* key : {"ddp_bucket_cap_mb", "ddp_find_unused_parameters"}) {
      if (t.Has(key)) {
        notes->push_back(fmt::format("{}: no effect on one device (world_size 1: no "
                                     "DistributedDataParallel)",
                                     t.At(key)));
      }
    }
    return;
  }
  hf.ddp_bucket_cap_mb = cap.value_or(0);
  if (cap && *cap == 25) {
    hf.ddp_bucket_cap_mb = 0;
    notes->push_back(fmt::format("{}: 25 is accelerate's default, so it is not passed to "
                                 "DistributedDataParallel (the first bucket stays 1 MiB)",
                                 t.At("ddp_bucket_cap_mb")));
  }
  const bool peft = hf.lora_r > 0;
  hf.ddp_find_unused_parameters =
      unused.value_or(peft || c.recompute_granularity == RecomputeGranularity::kNone);
  if (!unused) {
    notes->push_back(fmt::format(
        "{}: absent, {} taken (Trainer._wrap_model: {})", t.At("ddp_find_unused_parameters"),
        hf.ddp_find_unused_parameters ? "true" : "false",
        peft ? "a PeftModel is not a PreTrainedModel"
             : "not model.is_gradient_checkpointing"));
  }
  hf.ddp_gradient_as_bucket_view = false;
}

// fp16 / bf16 (torch.autocast through accelerate, GradScaler with fp16) and from_pretrained's
// torch_dtype.
void ReadPrecision(const Readers& r, TrainingConfig& c, std::vector<std::string>* notes) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  ObjectReader& t = r.args;
  ObjectReader& own = r.own;
  const bool fp16 = t.Bool("fp16").value_or(false);
  const bool bf16 = t.Bool("bf16").value_or(false);
  // TrainingArguments.__post_init__ refuses both.
  if (fp16 && bf16) Fail(t.At("bf16"), "fp16 and bf16 are both true (TrainingArguments refuses this)");
  c.precision = fp16 ? Precision::kFp16 : bf16 ? Precision::kBf16 : Precision::kFp32;
  // GradScaler.step skips the optimizer step on inf/nan gradients (torch/amp/grad_scaler.py).
  ReadSkippedIterations(own, c);
  if (std::optional<std::string> d =
          own.Choice("torch_dtype", {"float32", "bfloat16", "float16"})) {
    hf.torch_dtype = DtypeOf(*d);
  } else {
    hf.torch_dtype = Precision::kFp32;
    notes->push_back(fmt::format("{}: absent, float32 taken (from_pretrained without torch_dtype "
                                 "loads float32 weights)",
                                 own.At("torch_dtype")));
  }
  if (fp16 && hf.torch_dtype == Precision::kFp16) {
    // Trainer raises "Attempting to unscale FP16 gradients." through GradScaler.unscale_
    // (torch/amp/grad_scaler.py _unscale_grads_ refuses fp16 gradients).
    Fail(own.At("torch_dtype"), "\"float16\" with fp16 true: GradScaler cannot unscale fp16 "
                              "gradients (load the weights in float32)");
  }
  if (c.precision != Precision::kFp32 && c.precision == hf.torch_dtype) {
    notes->push_back(fmt::format("{}: autocast to the weights' own dtype: no weight copies",
                                 t.At(fp16 ? "fp16" : "bf16")));
  }
  if (fp16) {
    // torch/amp/grad_scaler.py: _scale and _growth_tracker (one element each), found_inf per
    // device in unscale_: a few bytes, below the allocator's 512-byte block; not emitted.
    notes->push_back(fmt::format("{}: GradScaler's scale, growth tracker and found_inf (one "
                                 "element each) are not emitted",
                                 t.At("fp16")));
  }
}

// The bitsandbytes optimizers of TrainingArguments.optim (OptimizerNames: adamw_bnb_8bit and
// its alias adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_8bit, lion_32bit,
// paged_lion_8bit, paged_lion_32bit, rmsprop_bnb, rmsprop_bnb_8bit, rmsprop_bnb_32bit), read
// as Trainer.get_optimizer_cls_and_kwargs reads the name (setup.h BnbOptimizer). Trainer.
// create_optimizer's 32-bit override of embeddings applies to a class named "Adam8bit" only,
// which no optim name builds, so every parameter follows optim_bits. Returns false for another
// optimizer.
bool ReadBnbOptim(const std::string& optim, BnbOptimizer& out) {
  const bool lion = optim.find("lion") != std::string::npos;
  const bool bnb_rmsprop = optim.rfind("rmsprop_bnb", 0) == 0;
  const bool bnb_adamw = optim == "adamw_bnb_8bit" || optim == "adamw_8bit" ||
                         optim == "paged_adamw_8bit" || optim == "paged_adamw_32bit";
  if (!lion && !bnb_rmsprop && !bnb_adamw) return false;
  out.optim_bits = optim.find("8bit") != std::string::npos ? 8 : 32;
  // bnb_kwargs["is_paged"] is passed for all but RMSprop (which has no paged variant).
  out.is_paged = optim.find("paged") != std::string::npos;
  out.states = bnb_adamw ? 2 : 1;
  return true;
}

// optim (TrainingArguments.optim; Trainer.get_optimizer_cls_and_kwargs).
void ReadOptim(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* notes) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  static const std::vector<std::string> kKnown = {
      "adamw_torch", "adamw_torch_fused", "adamw_hf", "sgd", "adafactor", "adamw_bnb_8bit",
      "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "adamw_apex_fused", "adagrad",
      "rmsprop", "lion_32bit", "lion_8bit", "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb",
      "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw", "lomo", "adalomo",
      "schedule_free_adamw"};
  const std::string optim = t.Choice("optim", kKnown).value_or("adamw_torch");
  // TrainingArguments.__post_init__: the deprecated adafactor true replaces optim by "adafactor"
  // (so trainer.args.to_json_string() writes both).
  if (t.Bool("adafactor").value_or(false) && optim != "adafactor") {
    Fail(t.At("adafactor"), fmt::format("true makes the Trainer use optim \"adafactor\" "
                                        "(TrainingArguments.__post_init__), not \"{}\"; write "
                                        "\"optim\": \"adafactor\"",
                                        optim));
  }
  if (!t.Has("optim")) {
    notes->push_back(fmt::format("{}: absent, \"adamw_torch\" taken (TrainingArguments' default "
                                 "before torch 2.8; from 2.8 on the default is adamw_torch_fused)",
                                 t.At("optim")));
  }
  c.optimizer = OptimizerKind::kAdam;
  hf.adam_coupled_weight_decay = false;  // AdamW: decoupled decay, in place
  hf.bnb_optimizer = {};
  if (ReadBnbOptim(optim, hf.bnb_optimizer)) {
    // Its update kernels work in place, one parameter at a time (bitsandbytes/functional.py
    // optimizer_update_32bit / optimizer_update_8bit_blockwise): no foreach temporaries.
    c.optimizer_impl = OptimizerImpl::kFused;
  } else if (optim == "adamw_torch") {
    // torch.optim.AdamW with foreach unset: _default_to_fused_or_foreach picks foreach on CUDA.
    c.optimizer_impl = OptimizerImpl::kForeach;
  } else if (optim == "adamw_torch_fused") {
    c.optimizer_impl = OptimizerImpl::kFused;  // torch.optim.AdamW(fused=True)
  } else if (optim == "adamw_hf") {
    // transformers.optimization.AdamW.step: a loop over parameters; exp_avg and exp_avg_sq
    // created at the first step (zeros_like), denom = exp_avg_sq.sqrt().add_(eps) one
    // parameter-sized temporary at a time. Modelled as the per-parameter (fused) update: the
    // state is the same; the one transient denom is not emitted.
    c.optimizer_impl = OptimizerImpl::kFused;
    notes->push_back(fmt::format("{}: \"adamw_hf\" modelled as a per-parameter AdamW; its "
                                 "transient denom (one parameter's size) is not emitted",
                                 t.At("optim")));
  } else if (optim == "adafactor") {
    // Trainer.get_optimizer_cls_and_kwargs: transformers.optimization.Adafactor with
    // scale_parameter=False, relative_step=False and the lr; beta1 stays None (no exp_avg). Its
    // step is a loop over parameters (optimizer.cc AdafactorGroup).
    c.optimizer = OptimizerKind::kAdafactor;
    c.optimizer_impl = OptimizerImpl::kFused;
    if (t.Has("optim_args")) {
      notes->push_back(fmt::format("{}: not read for adafactor (beta1 taken as None: no exp_avg)",
                                   t.At("optim_args")));
    }
  } else if (optim == "sgd") {
    // Trainer passes only lr: torch.optim.SGD's momentum 0, no momentum buffer.
    c.optimizer = OptimizerKind::kSgd;
    c.sgd_momentum = 0.0;
    c.optimizer_impl = OptimizerImpl::kForeach;
  } else {
    throw UnsupportedError(fmt::format(
        "{}: optim \"{}\" (memsim models adamw_torch, adamw_torch_fused, adamw_hf, adafactor, "
        "sgd and the bitsandbytes optimizers adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit, "
        "paged_adamw_32bit, lion_8bit, lion_32bit, paged_lion_8bit, paged_lion_32bit, "
        "rmsprop_bnb, rmsprop_bnb_8bit and rmsprop_bnb_32bit; the state layout of this optimizer "
        "is not modelled)",
        t.At("optim"), optim));
  }
  c.weight_decay = t.Number("weight_decay", 0, 1e6, false, false).value_or(0.0);
  if (t.Has("optim_args")) {
    throw UnsupportedError(fmt::format("{}: optimizer arguments (not modelled)", t.At("optim_args")));
  }
}

// gradient_checkpointing: PreTrainedModel.gradient_checkpointing_enable wraps every decoder layer
// in torch.utils.checkpoint (transformers/modeling_utils.py; modeling_layers.py
// GradientCheckpointingLayer): only each layer's input is kept, the layer re-runs in backward.
void ReadCheckpointing(ObjectReader& t, TrainingConfig& c, std::vector<std::string>* notes) {
  const bool on = t.Bool("gradient_checkpointing").value_or(false);
  c.recompute_granularity = on ? RecomputeGranularity::kFull : RecomputeGranularity::kNone;
  c.recompute_method = RecomputeMethod::kUniform;
  c.recompute_num_layers = 1;
  if (const Json* kw = t.Get("gradient_checkpointing_kwargs"); kw != nullptr && !kw->is_null()) {
    ObjectReader k(t.source(), *kw, t.PointerOf("gradient_checkpointing_kwargs"));
    k.RejectUnknown({"use_reentrant", "preserve_rng_state", "determinism_check", "debug"});
    const bool reentrant = k.Bool("use_reentrant").value_or(true);
    (void)k.Bool("preserve_rng_state");
    // Both variants keep the layer input and re-run the layer in backward; the non-reentrant
    // one (torch/utils/checkpoint.py _checkpoint_without_reentrant) saves through hooks and
    // may free recomputed tensors earlier, which memsim does not distinguish.
    notes->push_back(fmt::format("{}: use_reentrant {}: modelled as the layer input kept and the "
                                 "layer re-run in backward",
                                 k.At("use_reentrant"), reentrant ? "true" : "false"));
    if (!on) notes->push_back(fmt::format("{}: no effect without gradient_checkpointing",
                                          t.At("gradient_checkpointing_kwargs")));
  }
}

// evaluation_strategy, the old name of eval_strategy (TrainingArguments keeps it as a
// deprecated alias): when both are given they must agree, as one of them would be dropped.
void CheckOldStrategyName(ObjectReader& t, const std::string& strategy) {
  const std::optional<std::string> old =
      t.Choice("evaluation_strategy", {"no", "steps", "epoch"});
  if (old && t.Has("eval_strategy") && *old != strategy) {
    Fail(t.At("evaluation_strategy"),
         fmt::format("\"{}\" conflicts with eval_strategy \"{}\" (evaluation_strategy is its "
                     "old name; write one of them)",
                     *old, strategy));
  }
}

// The evaluation pass inside training (setup.h eval_steps). TrainingArguments.__post_init__:
// eval_strategy (evaluation_strategy, its old name) "no" by default; "steps" without eval_steps
// takes logging_steps (default 500); an eval_steps below 1 is a ratio of max_steps
// (Trainer._inner_training_loop: ceil(max_steps * eval_steps)). Trainer.evaluate keeps the
// predictions only with a compute_metrics function (it passes prediction_loss_only=True
// otherwise) and prediction_loss_only false.
void ReadEval(const Readers& r, TrainingConfig& c, std::vector<std::string>* notes,
              std::vector<std::string>* warnings) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  ObjectReader& t = r.args;
  ObjectReader& own = r.own;
  static const std::vector<std::string> kStrategies = {"no", "steps", "epoch"};
  const char* strategy_key = t.Has("eval_strategy") ? "eval_strategy" : "evaluation_strategy";
  const std::string strategy = t.Choice(strategy_key, kStrategies).value_or("no");
  CheckOldStrategyName(t, strategy);
  const std::optional<double> steps = t.Number("eval_steps", 0, 1e9, false, false);
  const int logging_steps = t.PositiveInt("logging_steps").value_or(500);
  hf.eval_batch_size = t.PositiveInt("per_device_eval_batch_size").value_or(8);
  const bool loss_only = t.Bool("prediction_loss_only").value_or(false);
  hf.eval_accumulation_steps = t.PositiveInt("eval_accumulation_steps").value_or(0);
  hf.eval_do_concat_batches = t.Bool("eval_do_concat_batches").value_or(true);
  hf.eval_delay = static_cast<int>(t.Number("eval_delay", 0, 1e9, false, false).value_or(0));
  const bool metrics = own.Bool("compute_metrics").value_or(false);
  const std::optional<int> batches = own.PositiveInt("eval_batches");
  hf.eval_steps = 0;
  if (strategy == "epoch") {
    t.WarnNotModelled(strategy_key,
                      fmt::format("{}: \"epoch\": evaluation at epoch ends is not modelled "
                                  "(memsim simulates max_steps steps and no epoch boundary)",
                                  t.At(strategy_key)),
                      NotModelled::Direction::kLow, warnings);
  }
  if (strategy != "steps") {
    for (const char* key : {"eval_steps", "eval_batches"}) {
      ObjectReader& holder = std::string_view(key) == "eval_batches" ? own : t;
      if (holder.Has(key)) {
        notes->push_back(fmt::format("{}: no effect: {} is \"{}\"", holder.At(key), strategy_key,
                                     strategy));
      }
    }
    return;
  }
  if (!steps || *steps == 0) {
    hf.eval_steps = logging_steps;
    notes->push_back(fmt::format("{}: absent, logging_steps ({}) taken (TrainingArguments."
                                 "__post_init__)",
                                 t.At("eval_steps"), logging_steps));
  } else if (*steps < 1) {
    hf.eval_steps = std::max(1, static_cast<int>(std::ceil(c.train_iters * *steps)));
  } else {
    if (*steps != std::floor(*steps)) {
      Fail(t.At("eval_steps"), "expected an integer, or a ratio of max_steps below 1");
    }
    hf.eval_steps = static_cast<int>(*steps);
  }
  if (!batches) {
    Fail(own.At("eval_batches"),
         "missing key with eval_strategy \"steps\", expected a positive integer: the evaluation "
         "batches each process runs, ceil(len(eval_dataset) / (per_device_eval_batch_size x "
         "world_size)) (memsim's own key)");
  }
  hf.eval_batches = *batches;
  CheckBatchTokens(r, "per_device_eval_batch_size", hf.eval_batch_size, c.seq_length);
  hf.eval_keep_predictions = metrics && !loss_only;
  if (!own.Has("compute_metrics")) {
    notes->push_back(fmt::format("{}: absent, false taken (Trainer(compute_metrics=None): "
                                 "evaluate keeps the loss only, no logits)",
                                 own.At("compute_metrics")));
  }
  const int first = FirstEvaluationStep(c);
  if (first > 0 && hf.eval_steps > 4 && first + hf.eval_steps <= c.train_iters) {
    // config/iterations.h: a long run is simulated until it repeats with a period of 1 to 4
    // steps; the steps after the first evaluation repeat before the next one comes.
    warnings->push_back(fmt::format(
        "{}: only the first evaluation (after step {}) is simulated; the later ones, every {} "
        "steps, come after the run's steady state is found and are not",
        t.At("eval_steps"), first, hf.eval_steps));
  }
  if (hf.eval_steps > c.train_iters) {
    notes->push_back(fmt::format("{}: {} is above the {} steps simulated: no evaluation runs",
                                 t.At("eval_steps"), hf.eval_steps, c.train_iters));
  }
}

// Model-loading and kernel choices and the stacks memsim does not model.
// A TrainingArguments value other than its "unset" form: null, false, an empty string, list or
// object.
bool IsSetValue(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) return !v.get<std::string>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return true;
}

// kNotModelledFields set to other than their default: a warning each, naming what they change.
void WarnNotModelled(ObjectReader& t, std::vector<std::string>* warnings) {
  for (const NotModelledField& f : kNotModelledFields) {
    const Json* v = t.Get(f.key);
    if (v == nullptr || !IsSetValue(*v)) continue;
    if (!f.default_string.empty() && v->is_string() && v->get<std::string>() == f.default_string) {
      continue;
    }
    t.WarnNotModelled(f.key,
                      fmt::format("{}: {}: not modelled ({})", t.At(f.key), Printable(v->dump()),
                                  f.what),
                      f.errs, warnings);
  }
  // accelerate's AcceleratorConfig: only split_batches changes what a process holds.
  if (const Json* v = t.Get("accelerator_config");
      v != nullptr && v->is_object() && v->contains("split_batches") &&
      IsSetValue((*v)["split_batches"])) {
    t.WarnNotModelled("accelerator_config",
                      fmt::format("{}/split_batches: true: not modelled (accelerate splits each "
                                  "batch over the processes)",
                                  t.At("accelerator_config")),
                      NotModelled::Direction::kHigh, warnings);
  }
}

// A release "MAJOR.MINOR" (more dot-separated numbers allowed) at `key`, if given; exits 2 naming
// the key otherwise.
std::optional<std::pair<int, int>> MajorMinor(ObjectReader& o, const char* key,
                                              const char* example) {
  std::optional<std::string> v = o.String(key);
  if (!v) return std::nullopt;
  const int major = std::atoi(v->c_str());
  const std::size_t dot = v->find('.');
  if (major < 1 || dot == std::string::npos || dot + 1 == v->size() ||
      v->find_first_not_of("0123456789.") != std::string::npos) {
    Fail(o.At(key),
         fmt::format("expected a version such as \"{}\", got \"{}\"", example, Printable(*v)));
  }
  return std::pair<int, int>(major, std::atoi(v->c_str() + dot + 1));
}

void ReadRest(const Readers& r, TrainingConfig& c, std::vector<std::string>* notes,
              std::vector<std::string>* warnings) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  ObjectReader& t = r.args;
  // from_pretrained(attn_implementation=...): "sdpa" is the default where the model supports
  // it (modeling_utils.py _check_and_adjust_attn_implementation). SDPA's flash and
  // memory-efficient backends, like flash_attention_2, save the output and the logsumexp;
  // "eager" materialises the [b, a, s, s] scores and probabilities.
  const std::string attn =
      r.own.Choice("attn_implementation", {"eager", "sdpa", "flash_attention_2"}).value_or("sdpa");
  c.use_flash_attn = attn != "eager";
  c.transformer_impl = "local";
  c.gradient_accumulation_fusion = false;
  // Trainer calls model.zero_grad(): nn.Module.zero_grad's set_to_none defaults to True since
  // PyTorch 2.0 and to False before (torch/nn/modules/module.py), when the .grad tensors are
  // zeroed in place and stay allocated. torch_version "MAJOR.MINOR" says which; absent: 2.x.
  // Before 1.11 softmax's autograd node also saves its input (setup.h softmax_saves_input).
  hf.zero_grad_set_to_none = true;
  if (std::optional<std::pair<int, int>> v = MajorMinor(r.own, "torch_version", "2.5")) {
    hf.zero_grad_set_to_none = v->first >= 2;
    hf.softmax_saves_input = v->first == 1 && v->second < 11;
  }
  // transformers_version "MAJOR.MINOR": before 4.49 the causal-LM loss copies the shifted
  // logits (setup.h loss_shift_copy); absent: a current release.
  if (std::optional<std::pair<int, int>> v = MajorMinor(r.own, "transformers_version", "4.48")) {
    hf.loss_shift_copy = *v < std::pair<int, int>(4, 49);
  }
  if (const Json* v = t.Get("fsdp"); v != nullptr && IsSetValue(*v)) {
    throw UnsupportedError(fmt::format("{}: FSDP under the Trainer (not modelled)", t.At("fsdp")));
  }
  // DeepSpeed ZeRO-1 / ZeRO-2 (hf_deepspeed.cc); an unset value (null, "", false) is none.
  if (const Json* v = t.Get("deepspeed"); v != nullptr && IsSetValue(*v)) {
    ReadDeepSpeed(t, r.config, c, notes, warnings);
  }
  // torch_compile_backend / torch_compile_mode (or the deprecated torchdynamo) given switch
  // torch_compile on (TrainingArguments.__post_init__).
  for (const char* key : {"torch_compile", "torch_compile_backend", "torch_compile_mode",
                          "torchdynamo"}) {
    const Json* v = t.Get(key);
    if (v != nullptr && IsSetValue(*v)) {
      throw UnsupportedError(fmt::format("{}: torch.compile (its fused kernels save other "
                                         "tensors; not modelled)",
                                         t.At(key)));
    }
  }
  WarnNotModelled(t, warnings);
  for (const std::string& key : kNoMemoryEffect) {
    if (t.Get(key) != nullptr) notes->push_back(fmt::format("{}: accepted, no effect on memory", t.At(key)));
  }
}

KeyAliases AliasesOf(const Readers& r) {
  KeyAliases keys;
  for (const Alias& a : kAliases) {
    keys.emplace(std::string(a.field), WrittenKey{std::string(a.key), (a.own ? r.own : r.args).At(a.key)});
  }
  return keys;
}

TrainingConfig ReadFromArgs(const Readers& r, std::vector<std::string>* notes,
                            std::vector<std::string>* warnings, LoraModuleMatch* lora_modules) {
  TrainingConfig c;
  c.framework = std::string(kFramework);
  c.stack.emplace<HfTrainerOptions>();  // the Trainer's own members (setup.h)
  ReadBatch(r, c, notes);
  ReadSampleData(r.own, r.args, r.config, c, notes);
  ReadPrecision(r, c, notes);
  ReadOptim(r.args, c, notes);
  ReadCheckpointing(r.args, c, notes);
  ReadRest(r, c, notes, warnings);
  ReadEval(r, c, notes, warnings);
  ReadPeft(r.own, r.config, c, notes, warnings, lora_modules);
  ReadDdp(r.args, c, notes);
  return c;
}

// A key of the Megatron / "pytorch" set: an error naming the TrainingArguments field to write.
void RejectForeign(ObjectReader& t) {
  for (const Foreign& f : kForeign) {
    if (t.Has(f.key)) {
      Fail(t.At(f.key), fmt::format("not a framework \"hf-trainer\" key (it is a Megatron / "
                                    "\"pytorch\" training key); write {}",
                                    f.instead));
    }
  }
}

// A training_args file holds TrainingArguments fields only: not another framework's keys, not
// memsim's own keys (they belong in the training block), not a whole memsim training config.
void CheckArgsFile(ObjectReader& args) {
  if (args.Has("training") || args.Has("model")) {
    Fail(args.At(args.Has("training") ? "training" : "model"),
         "a memsim training config, not a TrainingArguments JSON (trainer.args.to_json_string())");
  }
  if (args.Has("model_type")) {
    Fail(args.At("model_type"), "a model's config.json, not a TrainingArguments JSON "
                                "(trainer.args.to_json_string())");
  }
  RejectForeign(args);
  for (const std::string& key : kOwnKeys) {
    if (args.Has(key)) {
      Fail(args.At(key), "memsim's own key, not a TrainingArguments field: write it in the "
                         "training block of the config");
    }
  }
}

// Keys only framework "hf-trainer" reads, and what a "megatron" / "pytorch" block writes instead.
constexpr Foreign kHfOnly[] = {
    {"per_device_train_batch_size", "micro_batch_size"},
    {"max_seq_length", "seq_length"},
    {"max_steps", "train_iters"},
    {"world_size", "data_parallel_size"},
    {"optim", "optimizer and optimizer_impl"},
    {"gradient_checkpointing", "recompute_granularity"},
    {"gradient_checkpointing_kwargs", "recompute_granularity"},
    {"attn_implementation", "use_flash_attn"},
    {"ddp_bucket_cap_mb", "bucket_cap_mb (framework \"pytorch\")"},
    {"ddp_find_unused_parameters", "find_unused_parameters (framework \"pytorch\")"},
    {"torch_version", "zero_grad_set_to_none"},
    {"training_args", "the Megatron / \"pytorch\" keys in the block"},
    {"eval_strategy", ""}, {"evaluation_strategy", ""}, {"eval_steps", ""}, {"eval_delay", ""},
    {"per_device_eval_batch_size", ""}, {"eval_accumulation_steps", ""},
    {"eval_do_concat_batches", ""}, {"prediction_loss_only", ""}, {"eval_batches", ""},
    {"compute_metrics", ""},
    {"adapter_config", ""}, {"quantization_config", ""},
    {"prepare_model_for_kbit_training", ""}, {"kbit_modules_recast", ""},
};

}  // namespace

void RejectHfTrainerKeys(ObjectReader& t, std::string_view framework) {
  for (const Foreign& f : kHfOnly) {
    if (!t.Has(f.key)) continue;
    const std::string what =
        !f.instead.empty() ? fmt::format("write {}", f.instead)
        : f.key.find("config") != std::string_view::npos || f.key.find("kbit") != std::string_view::npos
            ? std::string("LoRA / QLoRA are modelled with framework \"hf-trainer\" only")
            : std::string("the evaluation pass is modelled with framework \"hf-trainer\" only");
    Fail(t.At(f.key), fmt::format("a framework \"hf-trainer\" key (TrainingArguments or memsim's "
                                  "own), not one of framework \"{}\"; {}",
                                  Printable(framework), what));
  }
}

namespace {

// The TrainingArguments fields of a block that has training_args: only those given on the
// command line (--set training.KEY=..., --iterations for max_steps) may be there, and they
// override the training_args JSON's values, as --set overrides a config.
std::vector<std::pair<std::string, const Json*>> CommandLineFields(ObjectReader& t) {
  const Json* ref = t.Get("training_args");
  const std::string from = ref->is_string() ? Printable(ref->get<std::string>())
                                            : std::string("the training_args object");
  std::vector<std::pair<std::string, const Json*>> fields;
  for (const std::string& key : KnownKeys(false)) {
    if (!t.Has(key)) continue;
    if (t.source().set_labels.count(t.PointerOf(key)) == 0) {
      Fail(t.At(key), fmt::format("a TrainingArguments field: with training_args it is read from "
                                  "{} (set it there)",
                                  from));
    }
    fields.emplace_back(key, t.Get(key));
  }
  std::vector<std::string> block_keys = kOwnKeys;
  for (const auto& field : fields) block_keys.push_back(field.first);
  t.RejectUnknown(block_keys);
  return fields;
}

// The TrainingArguments JSON (trainer.args.to_json_string()): a path to its file, or the object
// inline (run --json's input_config writes it so); where messages name it.
struct ArgsJson {
  Json json;
  Source source;
  std::string pointer;  // of the object within `source` ("" for a file)
  std::string label;    // the file, or "<config>: /training/training_args"
};

ArgsJson ReadArgsJson(ObjectReader& t, const Document& config) {
  const Json* v = t.Get("training_args");
  if (v->is_object()) {
    return {*v, t.source(), t.PointerOf("training_args"), t.At("training_args")};
  }
  if (!v->is_string()) {
    Fail(t.At("training_args"),
         fmt::format("expected a path to a TrainingArguments JSON or an object, got {}",
                     Describe(*v)));
  }
  const Document doc = FindReferencedDocument(v->get<std::string>(), t.At("training_args"), config,
                                              "the TrainingArguments JSON");
  Json json = ParseJson(doc.text, doc.label);
  if (!json.is_object()) Fail(doc.label, fmt::format("expected an object, got {}", Describe(json)));
  // Its field errors join the config's, so that one run reports them all (Source::field_errors);
  // its keys warned not modelled join the config's too (Source::not_modelled).
  return {std::move(json), Source{doc.label, {}, t.source().field_errors, t.source().not_modelled},
          "", doc.label};
}

}  // namespace

bool IsTrainingArgumentsField(std::string_view key) {
  const std::vector<std::string> fields = KnownKeys(false);
  return std::find(fields.begin(), fields.end(), key) != fields.end();
}

TrainingConfig ReadHfTrainer(ObjectReader& t, const Document& config,
                             std::vector<std::string>* notes, std::vector<std::string>* warnings,
                             HfTrainerExtras* extras) {
  RejectForeign(t);
  if (!t.Has("training_args")) {
    t.RejectUnknown(KnownKeys(true));
    extras->keys = AliasesOf(Readers{t, t, config});
    return ReadFromArgs(Readers{t, t, config}, notes, warnings, &extras->lora_modules);
  }
  // The TrainingArguments fields come from the training_args JSON, memsim's own keys from the
  // block.
  const std::vector<std::pair<std::string, const Json*>> overrides = CommandLineFields(t);
  ArgsJson a = ReadArgsJson(t, config);
  for (const auto& [key, value] : overrides) {
    a.json[key] = *value;
    a.source.set_labels[Child(a.pointer, key)] = t.At(key);
  }
  ObjectReader args(a.source, a.json, a.pointer);
  CheckArgsFile(args);
  extras->keys = AliasesOf(Readers{args, t, config});
  TrainingConfig c = ReadFromArgs(Readers{args, t, config}, notes, warnings, &extras->lora_modules);
  // Fields of a newer or older transformers than memsim's list: one warning naming those set,
  // one note naming those at an unset value (null, false, empty), which every
  // to_json_string() holds by the dozen.
  std::string unknown;
  std::string unset;
  for (const std::string& key : args.Unread()) {
    const std::string guess = args.NearMiss(key);
    std::string& list = guess.empty() && !IsSetValue(a.json[key]) ? unset : unknown;
    list += (list.empty() ? "" : ", ") + key;
    if (!guess.empty()) list += fmt::format(" (did you mean '{}'?)", guess);
  }
  if (!unknown.empty()) {
    warnings->push_back(fmt::format("{}: TrainingArguments fields memsim does not know, ignored: {}",
                                    a.label, unknown));
  }
  if (!unset.empty()) {
    notes->push_back(fmt::format("{}: TrainingArguments fields memsim does not know, at an unset "
                                 "value (null, false or empty), ignored: {}",
                                 a.label, unset));
  }
  return c;
}

}  // namespace memsim::config::internal
