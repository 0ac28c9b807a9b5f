// Internal to config/: the training block of framework "hf-trainer" (docs/config.md "Hugging Face
// Trainer"). Its keys are the Hugging Face TrainingArguments field names
// (transformers/training_args.py, class TrainingArguments), inline or in a JSON file as
// trainer.args.to_json_string() prints it (training_args: its path), plus the few things a Trainer run
// fixes elsewhere: the padded sequence length of the data collator (max_seq_length, the name of
// run_glue.py's and TRL's argument), the dtype and attention implementation of from_pretrained
// (torch_dtype, attn_implementation) and the number of processes (world_size). The result is a
// TrainingConfig that runs a plain PyTorch loop (setup.h PyTorchLoop). A key of the Megatron /
// "pytorch" set is an error naming the TrainingArguments key to use instead.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/documents.h"
#include "config/hf_peft_config.h"
#include "config/origin.h"
#include "config/reader.h"
#include "config/setup.h"

namespace memsim::config::internal {

// Throws InputError naming the first key of the block that only framework "hf-trainer" reads
// (per_device_train_batch_size, max_seq_length, optim, the evaluation keys, adapter_config, ...)
// and the key `framework` ("megatron" or "pytorch") reads instead.
void RejectHfTrainerKeys(ObjectReader& t, std::string_view framework);

// Rejects unknown and foreign keys, then reads the block. Throws InputError (a bad or foreign
// key, naming it and what to write instead) or UnsupportedError (a setting memsim recognises and
// does not model: DeepSpeed, FSDP, torch.compile, optimizers without a model).
// What ReadHfTrainer hands on besides the TrainingConfig: for each TrainingConfig field set
// from a key of another name or from the training_args file, the key and its place (origin.h),
// so that the rules (rules.h) name what the user wrote; and the adapter's module matching, which
// needs the model (hf_peft_config.h ResolveLoraModules).
struct HfTrainerExtras {
  KeyAliases keys;
  LoraModuleMatch lora_modules;
};

// Whether `key` is a TrainingArguments field memsim reads (transformers' TrainingArguments; the
// run report's input_config moves such a field given on the command line into training_args).
bool IsTrainingArgumentsField(std::string_view key);

// `notes` collects defaults taken and keys without effect; `warnings` what the user should see.
// `config` is the document holding the block (a training_args or adapter_config path is
// relative to it). training_args is a path to a TrainingArguments JSON or that object inline;
// with it, the block holds memsim's own keys and only those TrainingArguments fields given on
// the command line (--set, --iterations), which override the JSON's.
TrainingConfig ReadHfTrainer(ObjectReader& t, const Document& config,
                             std::vector<std::string>* notes, std::vector<std::string>* warnings,
                             HfTrainerExtras* extras);

// TrainingArguments `deepspeed` of `t` (a ds_config path relative to `config`, or the object):
// sets c.hf_trainer()->deepspeed and c.precision (the ds_config's bf16 / fp16, "auto" taking the
// Trainer's). Throws InputError (a bad value, a mismatch with the Trainer's) or UnsupportedError
// (stage 0, NVMe offload, amp, data_types, an optimizer other than Adam / AdamW); warns for
// each key memsim does not know (hf_deepspeed.cc). REQUIRES: c's batch and precision are read.
void ReadDeepSpeed(ObjectReader& t, const Document& config, TrainingConfig& c,
                   std::vector<std::string>* notes, std::vector<std::string>* warnings);
// The "auto" sizes (held as -1): reduce_bucket_size hidden_size², stage3_prefetch_bucket_size
// int(0.9·hidden_size²), stage3_param_persistence_threshold 10·hidden_size
// (HfTrainerDeepSpeedConfig trainer_config_finalize), each with a note naming `where` (the
// `deepspeed` field) and the key. Nothing for a set value.
void ResolveDeepSpeedAuto(int hidden_size, const std::string& where, DeepSpeedZero* zero,
                          std::vector<std::string>* notes);

}  // namespace memsim::config::internal
