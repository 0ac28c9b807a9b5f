// LoadRecipe (recipe.h): which tool wrote the recipe, its translation by that tool's reader, the
// model it names, then the load of the framework "hf-trainer" config that results.
#include <cstdlib>
#include <filesystem>

#include <fmt/core.h>

#include "config/embedded.h"
#include "config/load_internal.h"
#include "config/recipe.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

enum class RecipeTool { kLlamaFactory, kAxolotl, kTrl };

bool RecipeHasAny(const Json& root, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (root.contains(k)) return true;
  }
  return false;
}

// The tool by the keys that only its recipes hold: axolotl's required base_model; LLaMA-Factory's
// model_name_or_path with its method or data keys (hparams/finetuning_args.py stage,
// finetuning_type; data_args.py template, cutoff_len); else TRL's model_name_or_path
// (trl/trainer/model_config.py ModelConfig).
RecipeTool DetectRecipeTool(const Document& doc, const Json& root) {
  if (RecipeHasAny(root, {"compute_environment", "distributed_type"})) {
    throw InputError(fmt::format(
        "{}: an accelerate config (`accelerate launch --config_file`: it has \"{}\"), not a "
        "recipe; give the recipe (the YAML the training script reads)",
        doc.label, root.contains("distributed_type") ? "distributed_type" : "compute_environment"));
  }
  if (root.contains("base_model")) return RecipeTool::kAxolotl;
  if (root.contains("model_name_or_path")) {
    if (RecipeHasAny(root, {"stage", "finetuning_type", "template", "cutoff_len", "lora_rank",
                            "lora_target", "quantization_bit", "dataset_dir"})) {
      return RecipeTool::kLlamaFactory;
    }
    return RecipeTool::kTrl;
  }
  throw InputError(fmt::format(
      "{}: not a recipe memsim reads: neither axolotl's base_model nor LLaMA-Factory's or TRL's "
      "model_name_or_path is set (memsim reads YAML recipes of LLaMA-Factory, axolotl and TRL / "
      "alignment-handbook; its own training configs are JSON, docs/config.md)",
      doc.label));
}

const char* RecipeToolRelease(RecipeTool tool) {
  switch (tool) {
    case RecipeTool::kLlamaFactory: return "LLaMA-Factory v0.9.5";
    case RecipeTool::kAxolotl: return "axolotl v0.18.0";
    case RecipeTool::kTrl: return "TRL v1.9.0";
  }
  return "";
}

// The recipe's model, found once: --model when given, else the reference the recipe writes.
struct RecipeModelFinder {
  const Document& recipe;
  const LoadOptions& options;
  std::optional<Document> doc;
  std::string how;

  const Document& Find(const RecipeModel& m) {
    if (doc) return *doc;
    if (!options.model_path.empty()) {
      doc = FindModelDocument(options.model_path, "--model " + Printable(options.model_path), nullptr);
      how = "--model";
    } else {
      const std::vector<std::string> dirs = HubCacheDirs([](const char* n) { return std::getenv(n); });
      doc = FindHubModel(m.ref, m.where, recipe, dirs, &how);
    }
    return *doc;
  }
};

std::string RecipeModelDtype(const Document& d) {
  const Json j = Json::parse(d.text, nullptr, false);
  if (!j.is_object()) return "";
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
  }
  return "";
}

}  // namespace

Setup LoadRecipe(const Document& config, const LoadOptions& options) {
  const YamlDocument yaml = ParseYaml(config.text, config.label);
  if (!yaml.root.is_object()) {
    Fail(config.label, fmt::format("expected a recipe (a mapping of keys), got {}", Describe(yaml.root)));
  }
  const RecipeTool tool = DetectRecipeTool(config, yaml.root);
  RecipeReader r(config, yaml, RecipeToolRelease(tool));
  RecipeModelFinder finder{config, options, std::nullopt, ""};
  const ModelDtype dtype = [&](const RecipeModel& m) { return RecipeModelDtype(finder.Find(m)); };
  RecipeModel model;
  switch (tool) {
    case RecipeTool::kLlamaFactory: model = ReadLlamaFactoryRecipe(r, dtype); break;
    case RecipeTool::kAxolotl: model = ReadAxolotlRecipe(r); break;
    case RecipeTool::kTrl: model = ReadTrlRecipe(r, dtype); break;
  }
  if (options.device.empty()) {
    throw InputError(fmt::format("{}: a recipe does not name its device; give --device NAME ({}) "
                                 "or a preset file",
                                 config.label, KnownDevices()));
  }
  const Document& model_doc = finder.Find(model);
  LoadOptions rest = options;
  if (model_doc.embedded) {
    rest.model_path = std::filesystem::path(model_doc.embedded_path).stem().string();
  } else {
    rest.model_path = model_doc.label;
  }
  if (finder.how != "--model") {
    r.Assume(fmt::format("model {}: {} ({})", model.ref, model_doc.label, finder.how));
  }
  r.Set("framework", "hf-trainer", fmt::format("{} ({} recipe)", config.label, r.tool()));
  Json root = {{"training", r.training()}};
  Source source{config.label, r.labels()};
  ApplyCommandLine(rest, &root, &source);
  Setup s = LoadParsedConfig(config, root, source, rest, FieldErrors::kAll);
  s.recipe.push_back(fmt::format("{} recipe", r.tool()));
  s.recipe.insert(s.recipe.end(), r.assumed().begin(), r.assumed().end());
  s.warnings.insert(s.warnings.begin(), r.warnings().begin(), r.warnings().end());
  s.not_modelled.insert(s.not_modelled.begin(), r.not_modelled().begin(), r.not_modelled().end());
  s.notes.insert(s.notes.begin(), r.notes().begin(), r.notes().end());
  return s;
}

}  // namespace memsim::config::internal
