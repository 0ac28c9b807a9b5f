// Internal to config/: where the values of one Setup were written, so that the rules (rules.h)
// and the derive step (derive.h) can name them in messages, plus the values the training config
// wrote that the Setup keeps only in derived form. Built by LoadSetup from its documents; a plain
// value, no reference into them.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "config/reader.h"

namespace memsim::config::internal {

// A training key as the user wrote it, where the framework's key set names a TrainingConfig
// field differently (framework "hf-trainer": max_seq_length for seq_length, ...), or holds it
// in another file (a training_args JSON).
struct WrittenKey {
  std::string key;    // the user's spelling, e.g. "max_seq_length"
  std::string where;  // "<file>: <JSON pointer>", or the --set label that gave it
};
// TrainingConfig field name -> the key written for it. Made by the reader that maps the keys
// (hf_trainer.h ReadHfTrainer); empty for the Megatron / "pytorch" key set, whose keys are the
// fields' names.
using KeyAliases = std::map<std::string, WrittenKey, std::less<>>;

struct Origin {
  Source training;  // the training config's file label and --set labels
  // ModelConfig field name -> "<file>: <JSON pointer>" of the key that set it (model file, inline
  // model or a Megatron override in the training config).
  std::map<std::string, std::string> model;
  // As written; the Setup keeps num_layers_per_virtual_pipeline_stage and num_micro_batches.
  std::optional<int> virtual_stages_per_pipeline_rank;
  std::optional<int> gradient_accumulation_steps;
  KeyAliases training_keys;

  // Where the TrainingConfig field `field` was written: its alias's place, else
  // "<file>: /training/<field>" or the --set label that gave it.
  std::string Training(std::string_view field) const {
    auto it = training_keys.find(field);
    return it != training_keys.end() ? it->second.where : training.At(Child("/training", field));
  }
  // The name the user wrote for the TrainingConfig field `field` (the field's own name unless
  // aliased), for the text of a message.
  std::string TrainingKey(std::string_view field) const {
    auto it = training_keys.find(field);
    return it != training_keys.end() ? it->second.key : std::string(field);
  }
  // Where the ModelConfig field `field` was written, or the bare field name when unknown.
  std::string Model(const std::string& field) const {
    auto it = model.find(field);
    return it == model.end() ? field : it->second;
  }
};

}  // namespace memsim::config::internal
