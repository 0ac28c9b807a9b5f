// A LLaMA-Factory recipe (`llamafactory-cli train FILE`), keys and defaults of LLaMA-Factory
// v0.9.5 (github.com/hiyouga/LLaMA-Factory, tag v0.9.5; files below are under
// src/llamafactory/). The YAML holds ModelArguments, DataArguments, FinetuningArguments and
// Seq2SeqTrainingArguments fields in one mapping (hparams/parser.py); the TrainingArguments
// fields pass on unchanged.
#include <fmt/format.h>

#include "config/recipe.h"
#include "config/recipe_vocabulary.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// Keys of the recipe without an effect on device memory (data, templates, logging, export,
// evaluation-only generation).
const std::set<std::string>& LlamaFactoryNoEffect() {
  static const std::set<std::string> k = {
      "trust_remote_code", "model_revision", "cache_dir", "hf_hub_token", "ms_hub_token",
      "om_hub_token", "use_fast_tokenizer", "split_special_tokens", "new_special_tokens",
      "resize_vocab", "low_cpu_mem_usage", "infer_dtype", "infer_backend", "dataset",
      "eval_dataset", "dataset_dir", "media_dir", "template", "max_samples", "val_size",
      "preprocessing_num_workers", "overwrite_cache", "mix_strategy", "interleave_probs",
      "streaming", "buffer_size", "tokenized_path", "train_on_prompt", "mask_history",
      "ignore_pad_token_for_loss", "enable_thinking", "tool_format", "default_system",
      "plot_loss", "include_effective_tokens_per_second", "use_rslora", "loraplus_lr_ratio",
      "loraplus_lr_embedding", "lora_alpha", "print_param_status", "compute_accuracy",
      "disable_shuffling", "do_sample", "temperature", "top_p", "top_k", "num_beams",
      "max_new_tokens", "repetition_penalty", "length_penalty", "adapter_name_or_path",
      "export_dir", "export_size", "export_device", "export_legacy_format", "create_new_adapter"};
  return k;
}

// Stacks and methods memsim does not model: an UnsupportedError each, before anything else is
// read (a DeepSpeed recipe says so whatever else it holds).
void LlamaFactoryRejectStacks(RecipeReader& r) {
  r.RejectStack("deepspeed", "DeepSpeed (ZeRO sharding and its own optimizer and buffers) is "
                             "not modelled yet; memsim models the plain Trainer on one device "
                             "or under DDP");
  r.RejectStack("fsdp", "FSDP is not modelled yet with the Hugging Face Trainer");
  if (const auto stage = r.String("stage"); stage && *stage != "sft" && *stage != "pt") {
    throw UnsupportedError(fmt::format("{}: {} stage '{}' (memsim models supervised fine-tuning "
                                       "and pre-training, stage sft and pt: one model, one loss)",
                                       r.At("stage"), r.tool(), *stage));
  }
  for (const char* key : {"use_galore", "use_apollo", "use_badam", "use_adam_mini", "use_muon",
                          "use_llama_pro", "use_unsloth", "pissa_init", "use_dora", "use_mca",
                          "use_kt", "use_v1_kernels"}) {
    r.RejectStack(key, "not modelled (another optimizer, adapter or model implementation)");
  }
}

// finetuning_type (default "lora", finetuning_args.py) and the LoRA keys: lora_rank 8,
// lora_alpha None -> lora_rank * 2 (FinetuningArguments.__post_init__), lora_dropout 0.0,
// lora_target "all" -> every linear but the output layer (model/adapter.py _setup_lora_tuning:
// find_all_linear_modules), additional_target -> modules_to_save.
std::string LlamaFactoryMethod(RecipeReader& r) {
  const std::string type = r.String("finetuning_type").value_or("lora");
  if (type == "full") return type;
  if (type != "lora") {
    throw UnsupportedError(fmt::format("{}: {} finetuning_type '{}' (memsim models lora and full; "
                                       "freeze trains the last layers only)",
                                       r.At("finetuning_type"), r.tool(), type));
  }
  if (!r.Has("finetuning_type")) r.Assume("finetuning_type: lora (LLaMA-Factory's default, hparams/finetuning_args.py)");
  const std::int64_t rank = r.PositiveInt("lora_rank").value_or(8);
  r.Set("adapter_config/peft_type", "LORA", r.At("finetuning_type"));
  r.Set("adapter_config/task_type", "CAUSAL_LM", r.At("finetuning_type"));
  r.Set("adapter_config/r", rank, r.At("lora_rank"));
  if (!r.Has("lora_rank")) r.Assume("lora_rank: 8 (LLaMA-Factory's default)");
  const std::int64_t alpha = r.PositiveInt("lora_alpha").value_or(rank * 2);
  r.Set("adapter_config/lora_alpha", alpha, r.At("lora_alpha"));
  r.Set("adapter_config/lora_dropout", r.Number("lora_dropout").value_or(0.0), r.At("lora_dropout"));
  const std::vector<std::string> target = r.Strings("lora_target", true).value_or(std::vector<std::string>{"all"});
  if (target.size() == 1 && target[0] == "all") {
    r.Set("adapter_config/target_modules", "all-linear", r.At("lora_target"));
    r.Assume(fmt::format("lora_target all: every linear layer but lm_head ({}; LLaMA-Factory "
                         "find_all_linear_modules)",
                         fmt::join(LlamaLinearNames(), ", ")));
  } else {
    r.Set("adapter_config/target_modules", target, r.At("lora_target"));
  }
  if (auto extra = r.Strings("additional_target", true)) {
    r.Set("adapter_config/modules_to_save", *extra, r.At("additional_target"));
  }
  return type;
}

// quantization_bit / quantization_method (model_args.py: bnb by default, double_quantization
// true, quantization_type nf4) as model/model_utils/quantization.py configure_quantization builds
// BitsAndBytesConfig: 4 bits with bnb_4bit_compute_dtype and bnb_4bit_quant_storage both the
// compute dtype; 8 bits load_in_8bit only.
void LlamaFactoryQuantization(RecipeReader& r, const std::string& compute_dtype) {
  const std::optional<std::int64_t> bits = r.PositiveInt("quantization_bit");
  const std::string method = r.String("quantization_method").value_or("bnb");
  const bool double_quant = r.Bool("double_quantization").value_or(true);
  const std::string type = r.String("quantization_type").value_or("nf4");
  r.Skip("quantization_device_map");
  if (!bits) return;
  if (method != "bnb") {
    throw UnsupportedError(fmt::format("{}: {} quantization_method '{}' (memsim models bitsandbytes: bnb)",
                                       r.At("quantization_method"), r.tool(), method));
  }
  const std::string at = r.At("quantization_bit");
  if (*bits == 8) {
    r.Set("quantization_config/load_in_8bit", true, at);
  } else if (*bits == 4) {
    r.Set("quantization_config/load_in_4bit", true, at);
    r.Set("quantization_config/bnb_4bit_quant_type", type, r.At("quantization_type"));
    r.Set("quantization_config/bnb_4bit_use_double_quant", double_quant, r.At("double_quantization"));
    r.Set("quantization_config/bnb_4bit_compute_dtype", compute_dtype, at);
    r.Set("quantization_config/bnb_4bit_quant_storage", compute_dtype, at);
    r.Assume(fmt::format("quantization_bit 4: bitsandbytes {}{}, storage dtype {} "
                         "(LLaMA-Factory quantization.py)",
                         type, double_quant ? " with nested quantization (double_quantization default true)" : "",
                         compute_dtype));
  } else {
    throw UnsupportedError(fmt::format("{}: {} quantization_bit {} with bitsandbytes (4 and 8 bits exist)",
                                       at, r.tool(), *bits));
  }
}

// flash_attn (model_args.py, default auto): model_utils/attention.py configure_attn_implementation
// leaves auto to transformers (sdpa), maps fa2, sdpa, disabled (eager).
void LlamaFactoryAttention(RecipeReader& r) {
  const std::string fa = r.String("flash_attn").value_or("auto");
  if (fa == "auto") {
    r.Assume("flash_attn auto: sdpa attention (transformers' default where available)");
  } else if (fa == "fa2") {
    r.Set("attn_implementation", "flash_attention_2", r.At("flash_attn"));
  } else if (fa == "sdpa") {
    r.Set("attn_implementation", "sdpa", r.At("flash_attn"));
  } else if (fa == "disabled") {
    r.Set("attn_implementation", "eager", r.At("flash_attn"));
  } else {
    Fail(r.At("flash_attn"), fmt::format("expected one of 'auto', 'disabled', 'sdpa', 'fa2', got \"{}\"", fa));
  }
}

// Gradient checkpointing: on unless disable_gradient_checkpointing (model/model_utils/
// checkpointing.py prepare_model_for_training, use_reentrant_gc default true); the
// TrainingArguments field gradient_checkpointing is not what decides it.
void LlamaFactoryCheckpointing(RecipeReader& r) {
  const bool off = r.Bool("disable_gradient_checkpointing").value_or(false);
  r.Skip("gradient_checkpointing");
  r.Set("gradient_checkpointing", !off, r.At("disable_gradient_checkpointing"));
  if (off) return;
  const bool reentrant = r.Bool("use_reentrant_gc").value_or(true);
  r.Set("gradient_checkpointing_kwargs", Json{{"use_reentrant", reentrant}}, r.At("use_reentrant_gc"));
  r.Assume(fmt::format("gradient checkpointing on (LLaMA-Factory enables it unless "
                       "disable_gradient_checkpointing), use_reentrant {}",
                       reentrant));
  r.WarnIfSet("use_unsloth_gc", "unsloth's checkpointing offloads each layer's saved input to the "
                                "CPU; memsim keeps it on the device (memsim high)",
              NotModelled::Direction::kHigh);
}

}  // namespace

RecipeModel ReadLlamaFactoryRecipe(RecipeReader& r, const ModelDtype& model_dtype) {
  LlamaFactoryRejectStacks(r);
  RecipeModel model{r.String("model_name_or_path").value_or(""), r.At("model_name_or_path")};
  const bool bf16 = r.Bool("bf16").value_or(false) || r.Bool("pure_bf16").value_or(false);
  const bool fp16 = r.Bool("fp16").value_or(false);
  if (bf16) r.Set("bf16", true, r.At(r.Has("bf16") ? "bf16" : "pure_bf16"));
  if (fp16) r.Set("fp16", true, r.At("fp16"));
  // hparams/parser.py get_train_args: compute_dtype bf16 > fp16; else the checkpoint's.
  const std::string checkpoint_dtype = model_dtype(model);
  const std::string compute = bf16 ? "bfloat16" : fp16 ? "float16" : checkpoint_dtype.empty() ? "float32" : checkpoint_dtype;
  const std::string method = LlamaFactoryMethod(r);
  // model/loader.py load_model: from_pretrained(torch_dtype="auto"), the checkpoint's dtype;
  // model/adapter.py init_adapter then casts the trainable parameters to fp32 unless pure_bf16
  // (cast_trainable_params_to_fp32): for full tuning every parameter.
  const bool pure = r.Bool("pure_bf16").value_or(false);
  const std::string weights = checkpoint_dtype.empty() ? "float32" : checkpoint_dtype;
  if (method == "full") {
    r.Set("torch_dtype", pure ? "bfloat16" : "float32", r.At("finetuning_type"));
    r.Assume(pure ? "full tuning, pure_bf16: bf16 weights and optimizer states"
                  : "full tuning: every parameter upcast to fp32 (LLaMA-Factory adapter.py "
                    "_setup_full_tuning), bf16 autocast");
  } else {
    r.Set("torch_dtype", weights, r.At("model_name_or_path"));
    r.Assume(fmt::format("frozen weights in the checkpoint's dtype {} (from_pretrained "
                         "torch_dtype=\"auto\"), adapters in fp32",
                         weights));
    if (pure) r.Warn(fmt::format("{}: {} keeps the adapters in bf16; memsim models fp32 adapters (memsim high)",
                                 r.At("pure_bf16"), r.tool()));
  }
  LlamaFactoryQuantization(r, compute);
  // LLaMA-Factory does not call peft's prepare_model_for_kbit_training: its own
  // prepare_model_for_training (model/model_utils/checkpointing.py) casts the norms to fp32 only
  // with upcast_layernorm (warned below) and enables gradient checkpointing.
  if (r.IsSet("quantization_config/load_in_4bit") || r.IsSet("quantization_config/load_in_8bit")) {
    r.Set("prepare_model_for_kbit_training", false, r.At("quantization_bit"));
  }
  const std::int64_t cutoff = r.PositiveInt("cutoff_len").value_or(2048);
  r.Set("max_seq_length", cutoff, r.At("cutoff_len"));
  // data_args.py packing None -> true for stage pt only (hparams/parser.py).
  const bool packing = r.Bool("packing").value_or(r.String("stage").value_or("sft") == "pt");
  const bool neat = r.Bool("neat_packing").value_or(false);
  r.Assume(packing || neat
               ? fmt::format("packing: every sample is cutoff_len {} tokens", cutoff)
               : fmt::format("no packing: every sample taken at cutoff_len {} tokens (the collator "
                             "pads to the batch's longest: an upper bound)",
                             cutoff));
  LlamaFactoryAttention(r);
  LlamaFactoryCheckpointing(r);
  r.WarnIfSet("enable_liger_kernel", "Liger's kernels (fused linear cross-entropy, RMSNorm, SwiGLU, "
                                     "RoPE) replace the model's ops and never hold the whole "
                                     "logits; memsim models the unfused ops (memsim high)",
              NotModelled::Direction::kHigh);
  r.WarnIfSet("upcast_layernorm", "norm weights upcast to fp32 (a few MiB; memsim low)",
              NotModelled::Direction::kLow);
  r.WarnIfSet("upcast_lmhead_output", "an fp32 copy of the logits ([b, s, vocab]); memsim low",
              NotModelled::Direction::kLow);
  r.WarnIfSet("shift_attn", "LongLoRA's shifted sparse attention; not modelled",
              NotModelled::Direction::kEither);
  r.WarnIfSet("rope_scaling", "no effect on memory modelled", NotModelled::Direction::kEither);
  r.PassTrainingArguments();
  std::vector<std::string> vocabulary = LlamaFactoryKeyNames();
  vocabulary.insert(vocabulary.end(), TrainingArgumentsKeyNames().begin(), TrainingArgumentsKeyNames().end());
  r.WarnUnread(vocabulary, LlamaFactoryNoEffect());
  return model;
}

}  // namespace memsim::config::internal
