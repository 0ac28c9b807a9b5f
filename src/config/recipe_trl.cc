// A TRL / alignment-handbook recipe (`trl sft --config FILE`, alignment-handbook's
// `scripts/sft.py FILE`), keys and defaults of TRL v1.9.0 (github.com/huggingface/trl, tag
// v1.9.0): TrlParser reads ModelConfig (trl/trainer/model_config.py), SFTConfig
// (trl/trainer/sft_config.py over trl/trainer/base_config.py, a TrainingArguments) and
// ScriptArguments (trl/scripts/utils.py; alignment-handbook main 925acdf adds its dataset
// mixture, src/alignment/configs.py) from one mapping; trl/trainer/utils.py get_peft_config and
// get_quantization_config build the LoraConfig and BitsAndBytesConfig.
#include <fmt/core.h>

#include "config/recipe.h"
#include "config/recipe_vocabulary.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

const std::set<std::string>& TrlNoEffect() {
  static const std::set<std::string> k = {
      "model_revision", "trust_remote_code", "chat_template", "chat_template_path",
      "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split",
      "dataset_streaming", "dataset_mixture", "dataset_num_proc", "dataset_text_field",
      "dataset_kwargs", "datasets", "eos_token", "pad_token", "truncation_mode",
      "shuffle_dataset", "completion_only_loss", "assistant_only_loss", "loss_type",
      "use_rslora", "lora_task_type", "packing_strategy", "eval_packing", "pad_to_multiple_of",
      "ignore_bias_buffers", "router_aux_loss_coef", "config", "gradient_checkpointing_use_reentrant"};
  return k;
}

// ModelConfig's LoRA keys (use_peft false, lora_r 16, lora_alpha 32, lora_dropout 0.05,
// lora_target_modules None: PEFT's default per model type; a one-entry list becomes that
// string in ModelConfig.__post_init__), as get_peft_config passes them to LoraConfig.
void TrlPeft(RecipeReader& r) {
  if (!r.Bool("use_peft").value_or(false)) {
    for (const char* key : {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save"}) {
      if (r.Has(key)) r.Note(fmt::format("{}: without use_peft: true, no adapter (TRL ignores it)", r.At(key)));
      r.Skip(key);
    }
    r.Assume("use_peft false: full fine-tuning, every parameter trained");
    return;
  }
  const std::string at = r.At("use_peft");
  r.Set("adapter_config/peft_type", "LORA", at);
  r.Set("adapter_config/task_type", r.String("lora_task_type").value_or("CAUSAL_LM"), r.At("lora_task_type"));
  r.Set("adapter_config/r", r.PositiveInt("lora_r").value_or(16), r.At("lora_r"));
  r.Set("adapter_config/lora_alpha", r.PositiveInt("lora_alpha").value_or(32), r.At("lora_alpha"));
  r.Set("adapter_config/lora_dropout", r.Number("lora_dropout").value_or(0.05), r.At("lora_dropout"));
  if (!r.Has("lora_r")) r.Assume("lora_r: 16 (TRL ModelConfig default)");
  if (!r.Has("lora_dropout")) r.Assume("lora_dropout: 0.05 (TRL ModelConfig default)");
  if (auto modules = r.Strings("lora_target_modules", false)) {
    r.Set("adapter_config/target_modules", modules->size() == 1 ? Json((*modules)[0]) : Json(*modules),
          r.At("lora_target_modules"));
  } else {
    r.Assume("lora_target_modules: PEFT's default for the model type (q_proj, v_proj)");
  }
  if (auto save = r.Strings("lora_modules_to_save", false)) {
    r.Set("adapter_config/modules_to_save", *save, r.At("lora_modules_to_save"));
  }
  if (auto dora = r.Bool("use_dora"); dora && *dora) r.Set("adapter_config/use_dora", true, r.At("use_dora"));
  r.RejectStack("lora_target_parameters", "LoRA on parameters (MoE experts) is not modelled");
}

// get_quantization_config: load_in_4bit -> BitsAndBytesConfig(load_in_4bit, bnb_4bit_compute_dtype
// dtype, bnb_4bit_quant_type (nf4), bnb_4bit_use_double_quant use_bnb_nested_quant (false),
// bnb_4bit_quant_storage (None: uint8)); load_in_8bit -> BitsAndBytesConfig(load_in_8bit).
void TrlQuantization(RecipeReader& r, const std::string& dtype) {
  const bool four = r.Bool("load_in_4bit").value_or(false);
  const bool eight = r.Bool("load_in_8bit").value_or(false);
  const std::string type = r.String("bnb_4bit_quant_type").value_or("nf4");
  const bool nested = r.Bool("use_bnb_nested_quant").value_or(false);
  const std::optional<std::string> storage = r.String("bnb_4bit_quant_storage");
  if (four && eight) Fail(r.At("load_in_8bit"), "load_in_8bit and load_in_4bit both true (TRL's ModelConfig refuses it)");
  if (four) {
    const std::string at = r.At("load_in_4bit");
    r.Set("quantization_config/load_in_4bit", true, at);
    r.Set("quantization_config/bnb_4bit_compute_dtype", dtype == "auto" ? "float32" : dtype, at);
    r.Set("quantization_config/bnb_4bit_quant_type", type, r.At("bnb_4bit_quant_type"));
    r.Set("quantization_config/bnb_4bit_use_double_quant", nested, r.At("use_bnb_nested_quant"));
    if (storage) r.Set("quantization_config/bnb_4bit_quant_storage", *storage, r.At("bnb_4bit_quant_storage"));
    r.Assume(fmt::format("load_in_4bit: bitsandbytes {}{}, storage {}", type,
                         nested ? " with nested quantization" : " without nested quantization (use_bnb_nested_quant false)",
                         storage.value_or("uint8")));
  } else if (eight) {
    r.Set("quantization_config/load_in_8bit", true, r.At("load_in_8bit"));
  }
}

// SFTTrainer with a peft_config and a 4-bit or 8-bit model (not sharded QLoRA: FSDP and
// DeepSpeed are refused above) calls peft's prepare_model_for_kbit_training, then with bf16 and
// 4-bit weights peft_module_casting_to_bf16 casts lm_head and embed_tokens back to bf16 and
// leaves the norms fp32 (trl/trainer/sft_trainer.py SFTTrainer.__init__ and trainer/utils.py
// peft_module_casting_to_bf16, v0.8 to v0.14; SFTTrainer._prepare_peft_model from v0.15).
// Without an adapter it calls neither.
void TrlKbitPreparation(RecipeReader& r) {
  const bool four = r.Bool("load_in_4bit").value_or(false);
  const bool eight = r.Bool("load_in_8bit").value_or(false);
  if (!four && !eight) return;
  const bool peft = r.Bool("use_peft").value_or(false);
  r.Set("prepare_model_for_kbit_training", peft, r.At("use_peft"));
  if (peft && four && r.Bool("bf16").value_or(!r.Bool("fp16").value_or(false))) {
    r.Set("kbit_modules_recast", Json::array({"embed_tokens", "lm_head"}), r.At("bf16"));
    r.Assume("prepare_model_for_kbit_training, then peft_module_casting_to_bf16: norms fp32, "
             "embed_tokens and lm_head bf16 (TRL SFTTrainer)");
  }
}

}  // namespace

RecipeModel ReadTrlRecipe(RecipeReader& r, const ModelDtype& model_dtype) {
  r.RejectStack("deepspeed", "DeepSpeed (ZeRO sharding and its own optimizer and buffers) is not "
                             "modelled yet; memsim models the plain Trainer on one device or "
                             "under DDP");
  r.RejectStack("fsdp", "FSDP is not modelled yet with the Hugging Face Trainer");
  RecipeModel model{r.String("model_name_or_path").value_or(""), r.At("model_name_or_path")};
  // ModelConfig.dtype (torch_dtype before TRL 0.20), default "float32"; "auto": the checkpoint's.
  const char* dtype_key = r.Has("dtype") ? "dtype" : "torch_dtype";
  std::string dtype = r.String(dtype_key).value_or("float32");
  r.Skip("dtype");
  r.Skip("torch_dtype");
  if (!r.Has(dtype_key)) r.Assume("dtype: float32 (TRL ModelConfig default)");
  if (dtype == "auto") {
    const std::string own = model_dtype(model);
    dtype = own.empty() ? "float32" : own;
    r.Assume(fmt::format("{} auto: the checkpoint's {}", dtype_key, dtype));
  }
  r.Set("torch_dtype", dtype, r.At(dtype_key));
  if (auto attn = r.String("attn_implementation")) r.Set("attn_implementation", *attn, r.At("attn_implementation"));
  TrlPeft(r);
  TrlQuantization(r, dtype);
  // SFTConfig.max_length, default 1024 (max_seq_length before TRL 0.20).
  const char* length_key = r.Has("max_length") || !r.Has("max_seq_length") ? "max_length" : "max_seq_length";
  const std::int64_t length = r.PositiveInt(length_key).value_or(1024);
  r.Skip("max_length");
  r.Skip("max_seq_length");
  r.Set("max_seq_length", length, r.At(length_key));
  if (!r.Has(length_key)) r.Assume("max_length: 1024 (SFTConfig default)");
  const bool packing = r.Bool("packing").value_or(false);
  const bool padding_free = r.Bool("padding_free").value_or(false);
  r.Assume(packing ? fmt::format("packing: every sample is {} tokens", length)
           : padding_free ? fmt::format("padding_free: the batch's tokens taken at {} per sample (an upper bound)", length)
                          : fmt::format("no packing: every sample taken at {} tokens (the collator pads to the batch's longest: an upper bound)", length));
  // base_config.py: gradient_checkpointing defaults to true, bf16 to `not fp16`.
  if (!r.Has("gradient_checkpointing")) {
    r.Set("gradient_checkpointing", true, r.At("gradient_checkpointing"));
    r.Assume("gradient_checkpointing: true (TRL's default, base_config.py)");
  }
  if (!r.Has("bf16") && !r.Bool("fp16").value_or(false)) {
    r.Set("bf16", true, r.At("bf16"));
    r.Assume("bf16: true (TRL's default when fp16 is not set)");
  }
  TrlKbitPreparation(r);
  r.WarnIfSet("activation_offloading", "saved activations offloaded to the CPU; memsim keeps them on "
                                       "the device (memsim high)",
              NotModelled::Direction::kHigh);
  r.WarnIfSet("model_init_kwargs", "from_pretrained arguments memsim does not read",
              NotModelled::Direction::kEither);
  r.PassTrainingArguments();
  std::vector<std::string> vocabulary = TrlKeyNames();
  vocabulary.insert(vocabulary.end(), TrainingArgumentsKeyNames().begin(), TrainingArgumentsKeyNames().end());
  r.WarnUnread(vocabulary, TrlNoEffect());
  return model;
}

}  // namespace memsim::config::internal
