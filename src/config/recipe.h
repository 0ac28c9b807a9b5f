// Internal to config/: a fine-tuning recipe -- the YAML file that LLaMA-Factory
// (`llamafactory-cli train FILE`), axolotl (`axolotl train FILE`) or TRL / alignment-handbook
// (`TrlParser`: SFTConfig + ModelConfig + ScriptArguments) reads -- translated into a memsim
// training config of framework "hf-trainer" (hf_trainer.h) with an inline adapter_config and
// quantization_config (hf_peft_config.h), then loaded as one (load_internal.h). Each tool's keys
// and defaults are those of one pinned release (recipe_llamafactory.cc, recipe_axolotl.cc,
// recipe_trl.cc cite the source lines); what the tool does that memsim does not model is a
// warning naming the tool, the key and the direction of the error, or, for a stack memsim does
// not model (DeepSpeed, FSDP), an UnsupportedError naming it. The recipe's model is a hub id
// resolved as the user's machine would (FindHubModel), or a directory.
// Every value carries the recipe's line: "<file>:<line>: <key>".
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/documents.h"
#include "config/load.h"
#include "config/reader.h"
#include "config/yaml_document.h"

namespace memsim::config::internal {

// True iff `config` is a YAML recipe: named *.yaml or *.yml.
bool IsYamlRecipe(const Document& config);

// Loads a recipe into a Setup. REQUIRES: IsYamlRecipe(config). `options.device` is required (a
// recipe names no device); `options.model_path` replaces the recipe's model. Errors as
// LoadSetup's; the Setup's `recipe` lines say which tool's recipe was read and what was assumed.
Setup LoadRecipe(const Document& config, const LoadOptions& options);

// ---- the hub id of a recipe's model ----

// The directories that hold Hugging Face's cache of models (models--ORG--NAME/snapshots/REV/),
// in the order huggingface_hub looks (huggingface_hub/constants.py: HF_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub).
// `getenv` returns a variable's value or nullptr.
std::vector<std::string> HubCacheDirs(const std::function<const char*(const char*)>& getenv);

// The model file a recipe's model reference names: a directory holding config.json (as
// FindModelDocument), else a hub id ("Qwen/Qwen3-4B-Instruct-2507") found in one of
// `cache_dirs` (the config.json of a snapshot; several snapshots: the newest by modification
// time), else a model shipped with memsim whose "_hub_ids" lists the id (models/*.json). Error
// (InputError at `location`): none of these, naming the places looked in and saying to pass
// --model DIR|FILE|NAME. `*how` says which was found ("HF cache", "shipped catalogue").
Document FindHubModel(const std::string& ref, const std::string& location, const Document& recipe,
                      const std::vector<std::string>& cache_dirs, std::string* how);

// ---- what the tool readers share ----

// One recipe being translated: its keys as read (marked when a reader takes them), the
// training block built, the labels of its values and what the reader assumed.
class RecipeReader {
 public:
  // `tool`: "LLaMA-Factory v0.9.5" (the name and release whose keys are read).
  RecipeReader(const Document& doc, const YamlDocument& yaml, std::string tool);

  const std::string& tool() const { return tool_; }
  const Document& document() const { return doc_; }
  // True iff `key` is present with a non-null value (PyYAML's None is the tool's default).
  bool Has(std::string_view key) const;
  // The value, or nullptr when absent or null. Marks it read.
  const Json* Get(std::string_view key);
  // Typed reads; a value of another type is an InputError "<file>:<line>: <key>: expected ...".
  std::optional<bool> Bool(std::string_view key);
  std::optional<std::int64_t> PositiveInt(std::string_view key);
  std::optional<double> Number(std::string_view key);
  std::optional<std::string> String(std::string_view key);
  // A string or a list of strings (a comma-separated string is split, as LLaMA-Factory's
  // split_arg does when `split_commas`).
  std::optional<std::vector<std::string>> Strings(std::string_view key, bool split_commas);
  // Marks read without interpreting (no effect on device memory).
  void Skip(std::string_view key);
  // "<file>:<line>: <key>", or "<file>: <key> (absent: <tool> default)" when not written.
  std::string At(std::string_view key) const;

  // training[key] = value (key is a JSON pointer below /training, e.g. "adapter_config/r"),
  // labelled `label` in messages.
  void Set(std::string_view key, Json value, const std::string& label);
  bool IsSet(std::string_view key) const;
  // A line of the report's "assumed" list, a warning, a --verbose note.
  void Assume(std::string text) { assumed_.push_back(std::move(text)); }
  void Warn(std::string text) { warnings_.push_back(std::move(text)); }
  void Note(std::string text) { notes_.push_back(std::move(text)); }
  // Throws UnsupportedError "<file>:<line>: <key>: <what>" when `key` is set to other than
  // null / false / empty.
  void RejectStack(std::string_view key, std::string_view what);
  // A key of the tool that changes memory in a way memsim does not model, set to other than
  // null / false / empty: a warning "<at>: <tool> <key>: <what>", and the key with which way
  // memsim errs without it (`errs`) in not_modelled(), for the out-of-memory verdict's caveat.
  void WarnIfSet(std::string_view key, std::string_view what, NotModelled::Direction errs);

  // Copies every unread key that is a TrainingArguments field memsim reads into the block
  // under the same name (LLaMA-Factory and TRL pass their TrainingArguments on unchanged).
  void PassTrainingArguments();
  // Every key still unread: a key of `vocabulary` (the tool's own) is a warning "<at>: <tool>
  // key <key> not read by memsim (no effect simulated)" unless listed in `no_effect` (a note);
  // any other key a warning "not a <tool> key" with the closest of `vocabulary` (within the
  // tool only).
  void WarnUnread(const std::vector<std::string>& vocabulary, const std::set<std::string>& no_effect);

  Json& training() { return training_; }
  const std::map<std::string, std::string>& labels() const { return labels_; }
  std::vector<std::string>& assumed() { return assumed_; }
  std::vector<std::string>& warnings() { return warnings_; }
  std::vector<std::string>& notes() { return notes_; }
  std::vector<NotModelled>& not_modelled() { return not_modelled_; }

 private:
  const Json* Lookup(std::string_view key) const;
  const Document& doc_;
  const YamlDocument& yaml_;
  std::string tool_;
  std::set<std::string> read_;
  Json training_ = Json::object();
  std::map<std::string, std::string> labels_;  // JSON pointer in the config -> label
  std::vector<std::string> assumed_, warnings_, notes_;
  std::vector<NotModelled> not_modelled_;
};

// What a tool reader returns besides the block in the RecipeReader: the model reference and
// where it was written.
struct RecipeModel {
  std::string ref;
  std::string where;
};

// The tool readers (one file each). Each names its release in the RecipeReader's tool, fills
// the training block and returns the model reference. `model_dtype` reads the torch_dtype of
// the resolved model file ("bfloat16"; "" when it has none), for tools that load the
// checkpoint's own dtype.
using ModelDtype = std::function<std::string(const RecipeModel&)>;
RecipeModel ReadLlamaFactoryRecipe(RecipeReader& r, const ModelDtype& model_dtype);
RecipeModel ReadAxolotlRecipe(RecipeReader& r);
RecipeModel ReadTrlRecipe(RecipeReader& r, const ModelDtype& model_dtype);

// The linear modules of a llama-family decoder layer, the set lora_target "all" (LLaMA-Factory
// find_all_linear_modules) and lora_target_linear (axolotl find_all_linear_names) select: every
// nn.Linear but the output layer.
inline const std::vector<std::string>& LlamaLinearNames() {
  static const std::vector<std::string> k = {"q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  return k;
}

}  // namespace memsim::config::internal
