// Internal to config/: the PEFT and quantisation keys of a framework "hf-trainer" block
// (docs/config.md "PEFT"): adapter_config (an adapter_config.json as PEFT saves it, by path or
// inline; peft/tuners/lora/config.py LoraConfig) and quantization_config (transformers'
// BitsAndBytesConfig names; transformers/utils/quantization_config.py).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/documents.h"
#include "config/reader.h"
#include "config/setup.h"

namespace memsim::config::internal {

// What PEFT decides from the model's module names (peft/tuners/tuners_utils.py
// check_target_module_exists), kept from ReadPeft until the model is read: target_modules given
// as a string other than "all-linear" (a regular expression matched with re.fullmatch against
// each module's full name; peft/utils/other.py match_target_against_key) and exclude_modules
// (a list matches a name or its last dotted parts, a string is such a regular expression).
// A target_modules list with a dotted entry ("self_attn.q_proj") is matched against the names
// too (a name or its last dotted parts). modules_to_save entries are kept as written: PEFT
// matches them against the names twice (peft/utils/other.py _set_trainable: the modules whose
// full name ends with the entry get a trainable copy; tuners_utils.py
// check_target_module_exists: re.match(rf"(^|.*\.){m}($|\..*)", name) keeps adapters out of
// them and what they hold).
struct LoraModuleMatch {
  std::optional<std::string> target_regex;
  bool target_dotted = false;
  std::string target_where;  // "<file>: <pointer>" of target_modules
  std::vector<std::string> exclude_names;
  std::optional<std::string> exclude_regex;
  std::string exclude_where;  // of exclude_modules
  std::vector<std::string> save_entries;
  std::string save_where;  // of modules_to_save
  bool needed() const {
    return target_regex || target_dotted || exclude_regex || !exclude_names.empty() ||
           !save_entries.empty();
  }
};

// Reads both keys of `own` into c.lora_* and c.load_in_4bit / bnb_4bit_use_double_quant, and
// into `match` what needs the model's module names. Errors: InputError for a bad value (an
// invalid regular expression in target_modules or exclude_modules too); UnsupportedError for
// what memsim recognises and does not model (DoRA, bias training, per-layer patterns, 8-bit
// loading, another peft_type).
void ReadPeft(ObjectReader& own, const Document& config, TrainingConfig& c,
              std::vector<std::string>* notes, std::vector<std::string>* warnings,
              LoraModuleMatch* match);

// Sets c.lora_target_modules and c.lora_modules_to_save from `match` and the module names of
// `model` (a llama-family
// decoder: model.layers.<i>.self_attn.q_proj, ..., model.layers.<i>.mlp.down_proj, the norms,
// model.embed_tokens, lm_head), as PEFT's inject_adapter does. REQUIRES: match.needed(), the
// model is llama-family. Errors: InputError naming target_modules (or exclude_modules) when no
// module is left, or a matched module is not a linear (PEFT refuses it); UnsupportedError when a
// linear is matched in some layers only (per-layer adapters) or an adapter would sit on
// lm_head, embed_tokens or a classification head, or modules_to_save copies a decoder layer's
// module. `warnings` gets exclude_modules that excludes nothing (PEFT warns too), and a
// modules_to_save entry that copies nothing or only modules memsim does not copy (norms).
// A regular expression whose automaton would be too large for a bounded match (more than about
// 1024 states: counted repetitions multiply) is an InputError naming its key, never a hang.
void ResolveLoraModules(const LoraModuleMatch& match, const ModelConfig& model,
                        TrainingConfig& c, std::vector<std::string>* warnings);

}  // namespace memsim::config::internal
