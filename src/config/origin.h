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

struct Origin {
  Source training;  // the training config's file label and --set labels
  // ModelConfig field name -> "<file>: <JSON pointer>" of the key that set it (model file, inline
  // model or a Megatron override in the training config).
  std::map<std::string, std::string> model;
  // As written; the Setup keeps num_layers_per_virtual_pipeline_stage and num_micro_batches.
  std::optional<int> virtual_stages_per_pipeline_rank;
  std::optional<int> gradient_accumulation_steps;

  // "<file>: /training/<key>", or the --set label that gave it.
  std::string Training(std::string_view key) const { return training.At(Child("/training", key)); }
  // Where the ModelConfig field `field` was written, or the bare field name when unknown.
  std::string Model(const std::string& field) const {
    auto it = model.find(field);
    return it == model.end() ? field : it->second;
  }
};

}  // namespace memsim::config::internal
