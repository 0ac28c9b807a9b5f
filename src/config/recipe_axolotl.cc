// An axolotl recipe (`axolotl train FILE`), keys and defaults of axolotl v0.18.0
// (github.com/axolotl-ai-cloud/axolotl, tag v0.18.0; files below are under src/axolotl/):
// the pydantic schema utils/schemas/*.py (AxolotlInputConfig), normalised by utils/config/
// __init__.py and turned into from_pretrained arguments by loaders/model.py and into
// TrainingArguments by core/builders/base.py.
#include <fmt/format.h>

#include "config/recipe.h"
#include "config/recipe_vocabulary.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// Keys without an effect on device memory: data, logging, saving, schedules, the Hub.
const std::set<std::string>& AxolotlNoEffect() {
  static const std::set<std::string> k = {
      "model_type", "tokenizer_type", "tokenizer_config", "trust_remote_code", "datasets",
      "test_datasets", "dataset_prepared_path", "val_set_size", "output_dir", "hub_model_id",
      "hub_strategy", "wandb_project", "wandb_entity", "wandb_watch", "wandb_name",
      "wandb_log_model", "wandb_run_id", "mlflow_tracking_uri", "mlflow_experiment_name",
      "num_epochs", "lr_scheduler", "learning_rate", "warmup_ratio", "warmup_steps", "weight_decay",
      "logging_steps", "saves_per_epoch", "save_steps", "save_strategy", "save_total_limit",
      "evals_per_epoch", "eval_steps", "eval_sample_packing", "eval_batch_size",
      "resume_from_checkpoint", "lora_model_dir", "special_tokens", "chat_template",
      "dataset_processes", "seed", "tf32", "train_on_inputs", "group_by_length", "strict",
      "loss_watchdog_threshold", "loss_watchdog_patience", "max_grad_norm", "adam_beta1",
      "adam_beta2", "adam_epsilon", "lr_scheduler_kwargs", "early_stopping_patience",
      "local_rank", "logging_dir", "shuffle_merged_datasets", "peft_use_rslora",
      "save_first_step", "xformers_attention", "sdp_attention", "flash_attention",
      "eager_attention", "flash_attn_cross_entropy", "flash_attn_rms_norm",
      "flash_attn_fuse_mlp", "pad_to_sequence_len", "save_safetensors", "use_tensorboard",
      "default_system_message", "plugins"};
  return k;
}

void AxolotlRejectStacks(RecipeReader& r) {
  r.RejectStack("deepspeed", "DeepSpeed (ZeRO sharding and its own optimizer and buffers) is not "
                             "modelled yet; memsim models the plain Trainer on one device or "
                             "under DDP");
  r.RejectStack("fsdp", "FSDP is not modelled yet with the Hugging Face Trainer");
  r.RejectStack("fsdp_config", "FSDP is not modelled yet with the Hugging Face Trainer");
  r.RejectStack("rl", "a preference / RL trainer (reference model, pairs or generations) is not "
                      "modelled; memsim models supervised fine-tuning");
  r.RejectStack("gptq", "GPTQ weights are not modelled (bitsandbytes only)");
  r.RejectStack("peft_use_dora", "DoRA is not modelled");
  r.RejectStack("relora", "ReLoRA is not modelled");
  for (const char* key : {"tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree"}) {
    if (const Json* v = r.Get(key); v != nullptr && !(v->is_number_integer() && v->get<int>() <= 1)) {
      throw UnsupportedError(fmt::format("{}: {} parallelism is not modelled with the Hugging Face "
                                         "Trainer",
                                         r.At(key), r.tool()));
    }
  }
}

// adapter lora / qlora (schemas/peft.py LoraConfig: lora_r, lora_alpha, lora_dropout 0.0,
// lora_target_modules, lora_target_linear, lora_modules_to_save); no adapter: every parameter
// trains. loaders/adapter.py load_lora: lora_target_linear adds find_all_linear_names (every
// nn.Linear but lm_head) to lora_target_modules.
void AxolotlAdapter(RecipeReader& r, const std::string& adapter) {
  const std::string at = r.At("adapter");
  r.Set("adapter_config/peft_type", "LORA", at);
  r.Set("adapter_config/task_type", "CAUSAL_LM", at);
  const std::optional<std::int64_t> rank = r.PositiveInt("lora_r");
  if (!rank) Fail(r.At("lora_r"), fmt::format("missing: adapter {} needs lora_r", adapter));
  r.Set("adapter_config/r", *rank, r.At("lora_r"));
  r.Set("adapter_config/lora_alpha", r.PositiveInt("lora_alpha").value_or(*rank), r.At("lora_alpha"));
  r.Set("adapter_config/lora_dropout", r.Number("lora_dropout").value_or(0.0), r.At("lora_dropout"));
  const std::optional<std::vector<std::string>> modules = r.Strings("lora_target_modules", false);
  if (r.Bool("lora_target_linear").value_or(false)) {
    r.Set("adapter_config/target_modules", "all-linear", r.At("lora_target_linear"));
    r.Assume(fmt::format("lora_target_linear: every linear layer but lm_head ({})",
                         fmt::join(LlamaLinearNames(), ", ")));
    if (modules) {
      for (const std::string& m : *modules) {
        if (std::find(LlamaLinearNames().begin(), LlamaLinearNames().end(), m) == LlamaLinearNames().end()) {
          r.Warn(fmt::format("{}: {} also targets '{}' besides every linear; memsim takes the "
                             "linears only",
                             r.At("lora_target_modules"), r.tool(), m));
        }
      }
    }
  } else if (modules) {
    r.Set("adapter_config/target_modules", modules->size() == 1 ? Json((*modules)[0]) : Json(*modules),
          r.At("lora_target_modules"));
  } else {
    r.Assume("no lora_target_modules: PEFT's default for the model type (q_proj, v_proj)");
  }
  if (auto save = r.Strings("lora_modules_to_save", false)) {
    r.Set("adapter_config/modules_to_save", *save, r.At("lora_modules_to_save"));
  }
  if (const Json* layers = r.Get("peft_layers_to_transform")) {
    r.Set("adapter_config/layers_to_transform", *layers, r.At("peft_layers_to_transform"));
  }
}

// loaders/model.py ModelLoader._set_quantization_config: qlora with load_in_4bit ->
// BitsAndBytesConfig(load_in_4bit, llm_int8_threshold 6.0, bnb_4bit_compute_dtype torch_dtype,
// bnb_4bit_use_double_quant True, bnb_4bit_quant_type nf4, bnb_4bit_quant_storage bfloat16)
// updated by bnb_config_kwargs; lora with load_in_8bit -> BitsAndBytesConfig(load_in_8bit).
void AxolotlQuantization(RecipeReader& r, const std::string& adapter, const std::string& dtype) {
  const bool four = r.Bool("load_in_4bit").value_or(false);
  const bool eight = r.Bool("load_in_8bit").value_or(false);
  const Json* extra = r.Get("bnb_config_kwargs");
  if (adapter == "qlora") {
    if (!four) Fail(r.At("load_in_4bit"), "adapter qlora needs load_in_4bit: true (axolotl refuses it otherwise)");
    const std::string at = r.At("adapter");
    r.Set("quantization_config/load_in_4bit", true, r.At("load_in_4bit"));
    r.Set("quantization_config/bnb_4bit_compute_dtype", dtype, at);
    r.Set("quantization_config/bnb_4bit_use_double_quant", true, at);
    r.Set("quantization_config/bnb_4bit_quant_type", "nf4", at);
    r.Set("quantization_config/bnb_4bit_quant_storage", "bfloat16", at);
    if (extra != nullptr && extra->is_object()) {
      for (auto it = extra->begin(); it != extra->end(); ++it) {
        r.Set("quantization_config/" + it.key(), *it, r.At("bnb_config_kwargs") + "." + it.key());
      }
    }
    r.Assume("qlora: bitsandbytes NF4 with nested quantization, storage dtype bfloat16 "
             "(axolotl loaders/model.py)");
  } else if (adapter == "lora" && eight) {
    r.Set("quantization_config/load_in_8bit", true, r.At("load_in_8bit"));
    r.Assume("lora with load_in_8bit: bitsandbytes LLM.int8 weights (axolotl loaders/model.py)");
  }
  if ((adapter == "qlora" && four) || (adapter == "lora" && eight)) {
    // loaders/model.py ModelLoader._configure_embedding_dtypes: _prepare_model_for_quantization
    // runs peft's prepare_model_for_kbit_training (every 16-bit parameter not quantised to
    // fp32); with an adapter (needs_fa2_dtype) _convert_embedding_modules_dtype then casts the
    // modules named "norm" and the embedding modules (embed_tokens, lm_head) back to torch_dtype.
    r.Set("prepare_model_for_kbit_training", true, r.At("adapter"));
    r.Set("kbit_modules_recast", Json::array({"norm", "embed_tokens", "lm_head"}), r.At("adapter"));
    r.Assume("prepare_model_for_kbit_training, then norms and embeddings back to torch_dtype "
             "(axolotl loaders/model.py _configure_embedding_dtypes)");
  } else if (four || eight) {
    r.Warn(fmt::format("{}: {} quantises only with adapter qlora (4 bits) or lora (8 bits); the "
                       "weights stay {}",
                       r.At(four ? "load_in_4bit" : "load_in_8bit"), r.tool(), dtype));
  }
}

// utils/config/__init__.py: resolve_dtype (bf16 "auto", the default, is true on a GPU with
// bf16) and normalize_config (torch_dtype bf16 if bf16, else fp16 if load_in_8bit or fp16,
// else fp32), the dtype from_pretrained loads the weights in.
std::string AxolotlPrecision(RecipeReader& r) {
  const Json* b = r.Get("bf16");
  const bool fp16 = r.Bool("fp16").value_or(false) || r.Bool("float16").value_or(false);
  bool bf16 = false;
  if (b == nullptr || (b->is_string() && b->get<std::string>() == "auto")) {
    bf16 = !fp16;
    if (bf16) r.Assume("bf16 auto: true (a GPU with bf16: Ampere or newer)");
  } else if (b->is_boolean()) {
    bf16 = b->get<bool>();
  } else if (b->is_string() && b->get<std::string>() == "full") {
    bf16 = true;
  } else {
    Fail(r.At("bf16"), fmt::format("expected true, false, \"auto\" or \"full\", got {}", Describe(*b)));
  }
  bf16 = bf16 || r.Bool("bfloat16").value_or(false);
  if (bf16) r.Set("bf16", true, r.At("bf16"));
  if (!bf16 && fp16) r.Set("fp16", true, r.At("fp16"));
  const bool eight = r.Has("load_in_8bit") && r.Get("load_in_8bit")->is_boolean() && r.Get("load_in_8bit")->get<bool>();
  const std::string dtype = bf16 ? "bfloat16" : (eight || fp16) ? "float16" : "float32";
  r.Set("torch_dtype", dtype, r.At("bf16"));
  return dtype;
}

void AxolotlCheckpointing(RecipeReader& r) {
  const Json* gc = r.Get("gradient_checkpointing");
  const bool on = gc != nullptr && !(gc->is_boolean() && !gc->get<bool>());
  if (!on) return;
  r.Set("gradient_checkpointing", true, r.At("gradient_checkpointing"));
  if (gc->is_string()) {
    r.Warn(fmt::format("{}: {} gradient_checkpointing \"{}\" offloads each layer's saved input to "
                       "the CPU; memsim keeps it on the device (memsim high)",
                       r.At("gradient_checkpointing"), r.tool(), gc->get<std::string>()));
  }
  if (const Json* kw = r.Get("gradient_checkpointing_kwargs")) {
    r.Set("gradient_checkpointing_kwargs", *kw, r.At("gradient_checkpointing_kwargs"));
  } else {  // utils/config/__init__.py normalize_config
    r.Set("gradient_checkpointing_kwargs", Json{{"use_reentrant", true}}, r.At("gradient_checkpointing"));
  }
}

// attn_implementation, or the deprecated flags (schemas/config.py
// normalize_attn_implementation: flash_attention -> flash_attention_2, sdp_attention -> sdpa,
// eager_attention -> eager); none: transformers' default (sdpa).
void AxolotlAttention(RecipeReader& r) {
  if (auto impl = r.String("attn_implementation")) {
    r.Set("attn_implementation", *impl, r.At("attn_implementation"));
    return;
  }
  const std::pair<const char*, const char*> flags[] = {
      {"flash_attention", "flash_attention_2"}, {"sdp_attention", "sdpa"}, {"eager_attention", "eager"}};
  for (const auto& [flag, impl] : flags) {
    if (r.Bool(flag).value_or(false)) {
      r.Set("attn_implementation", impl, r.At(flag));
      return;
    }
  }
  r.WarnIfSet("xformers_attention", "xformers attention; memsim models sdpa's saved tensors",
              NotModelled::Direction::kEither);
}

void AxolotlKernels(RecipeReader& r) {
  for (const char* key : {"liger_rope", "liger_rms_norm", "liger_glu_activation",
                          "liger_layer_norm", "liger_cross_entropy",
                          "liger_fused_linear_cross_entropy"}) {
    r.WarnIfSet(key, "a Liger kernel replaces the model's op (the fused linear cross-entropy never "
                     "holds the whole logits); memsim models the unfused ops (memsim high)",
                NotModelled::Direction::kHigh);
  }
  for (const char* key : {"unsloth_lora_mlp", "unsloth_lora_qkv", "unsloth_lora_o",
                          "unsloth_cross_entropy_loss", "unsloth_rms_norm", "unsloth_rope",
                          "lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel"}) {
    r.WarnIfSet(key, "a fused kernel that saves fewer intermediates; memsim models the unfused "
                     "ops (memsim high)",
                NotModelled::Direction::kHigh);
  }
  r.WarnIfSet("activation_offloading", "saved activations offloaded to the CPU; memsim keeps them "
                                       "on the device (memsim high)",
              NotModelled::Direction::kHigh);
  r.WarnIfSet("tokens", "added tokens resize the embedding and the output layer; memsim takes "
                        "the model's vocab_size",
              NotModelled::Direction::kLow);
}

}  // namespace

RecipeModel ReadAxolotlRecipe(RecipeReader& r) {
  AxolotlRejectStacks(r);
  RecipeModel model{r.String("base_model").value_or(""), r.At("base_model")};
  const std::string adapter = r.String("adapter").value_or("");
  if (!adapter.empty() && adapter != "lora" && adapter != "qlora") {
    throw UnsupportedError(fmt::format("{}: {} adapter '{}' (memsim models lora and qlora)",
                                       r.At("adapter"), r.tool(), adapter));
  }
  const std::string dtype = AxolotlPrecision(r);
  if (adapter.empty()) {
    r.Assume(fmt::format("no adapter: full fine-tuning, every parameter trained in {}", dtype));
  } else {
    AxolotlAdapter(r, adapter);
  }
  AxolotlQuantization(r, adapter, dtype);
  const std::int64_t seq = r.PositiveInt("sequence_len").value_or(512);
  r.Set("max_seq_length", seq, r.At("sequence_len"));
  const std::int64_t micro = r.PositiveInt("micro_batch_size").value_or(1);
  r.Set("per_device_train_batch_size", micro, r.At("micro_batch_size"));
  std::optional<std::int64_t> accumulation = r.PositiveInt("gradient_accumulation_steps");
  if (const std::optional<std::int64_t> batch = r.PositiveInt("batch_size"); batch && !accumulation) {
    accumulation = std::max<std::int64_t>(1, *batch / micro);  // normalize_config
  }
  r.Set("gradient_accumulation_steps", accumulation.value_or(1), r.At("gradient_accumulation_steps"));
  const std::string optimizer = r.String("optimizer").value_or("adamw_torch_fused");
  r.Set("optim", optimizer, r.At("optimizer"));
  if (!r.Has("optimizer")) r.Assume("optimizer: adamw_torch_fused (axolotl's default, schemas/training.py)");
  if (auto steps = r.PositiveInt("max_steps")) r.Set("max_steps", *steps, r.At("max_steps"));
  r.Assume(r.Bool("sample_packing").value_or(false)
               ? fmt::format("sample_packing: every micro-batch row is sequence_len {} tokens", seq)
               : fmt::format("no sample_packing: every sample taken at sequence_len {} tokens (an "
                             "upper bound: the collator pads to the batch's longest)",
                             seq));
  AxolotlCheckpointing(r);
  AxolotlAttention(r);
  AxolotlKernels(r);
  r.WarnUnread(AxolotlKeyNames(), AxolotlNoEffect());
  return model;
}

}  // namespace memsim::config::internal
