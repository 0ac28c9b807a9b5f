// LoadSetup (load.h): reads the documents (documents.h), the model file (parts.h: ReadHfModel)
// and the training block (training.h) into a Setup, then checks what was written (rules.h),
// derives the values that follow (derive.h) and checks those. See docs/config.md.
#include "config/load.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>

#include <fmt/core.h>

#include "config/derive.h"
#include "config/documents.h"
#include "config/embedded.h"
#include "config/hf_trainer.h"
#include "config/load_internal.h"
#include "config/megatron_flags.h"
#include "config/moe.h"
#include "config/origin.h"
#include "config/parts.h"
#include "config/recipe.h"
#include "config/torchtitan_toml.h"
#include "config/reader.h"
#include "config/rules.h"
#include "config/sample_data.h"
#include "config/stack.h"
#include "config/training.h"
#include "core/check.h"
#include "core/error.h"

namespace memsim::config {
namespace {

using internal::Describe;
using internal::Document;
using internal::Fail;
using internal::Json;
using internal::ObjectReader;
using internal::Source;

DevicePreset ReadDevice(const Document& doc) {
  Source s{doc.label, {}};
  return internal::ReadDevicePreset(s, internal::ParseJson(doc.text, doc.label), "");
}

// A model file: every field error of it in one message (ThrowFieldErrors), as for a config.
internal::LocatedModel ReadModelDocument(const Document& d, Setup* s) {
  std::vector<internal::KeyError> errors;
  Source ms{d.label, {}, &errors, &s->not_modelled};
  s->model_path = d.label;
  const Json json = internal::ParseJson(d.text, d.label);
  if (json.is_object() && !json.contains("model_type") && json.contains("training")) {
    throw InputError(fmt::format(
        "{}: a memsim training config (it has \"training\"), not a model file (Hugging Face "
        "config.json with \"model_type\"); give it as the CONFIG argument, not with --model",
        d.label));
  }
  std::optional<internal::LocatedModel> model;
  try {
    model = internal::ReadHfModel(ms, json, "", &s->notes, &s->warnings);
  } catch (const InputError& e) {
    if (errors.empty()) throw;
    internal::ThrowFieldErrors(errors, d.label, &e);
  }
  if (!errors.empty()) internal::ThrowFieldErrors(errors, d.label, nullptr);
  return *model;
}

// The model: --model, or the config's "model" (a path relative to the config, a shipped model
// name or an inline object).
internal::LocatedModel ReadModel(ObjectReader& top, const Document& config,
                                 const LoadOptions& options, Setup* s) {
  if (!options.model_path.empty()) {
    top.Skip("model");
    return ReadModelDocument(
        internal::FindModelDocument(options.model_path,
                                    "--model " + internal::Printable(options.model_path), nullptr),
        s);
  }
  const Json* model = top.Get("model");
  if (model == nullptr) {
    Fail(top.At("model"), "missing key, expected a path to a model file (Hugging Face config.json "
                          "form), a shipped model name or an inline object");
  }
  if (model->is_string()) {
    return ReadModelDocument(
        internal::FindModelDocument(model->get<std::string>(), top.At("model"), &config), s);
  }
  if (!model->is_object()) {
    Fail(top.At("model"), fmt::format("expected a path to a model file or an object, got {}",
                                      Describe(*model)));
  }
  return internal::ReadHfModel(top.source(), *model, "/model", &s->notes, &s->warnings);
}

// The device: --device, or the config's "device" (a preset name, a path or an inline object).
void ReadDeviceSection(ObjectReader& top, const Document& config, const LoadOptions& options,
                       Setup* s) {
  if (!options.device.empty()) {
    const Document d = internal::FindDeviceDocument(
        options.device, "--device " + internal::Printable(options.device), nullptr);
    s->device_path = d.label;
    s->device = ReadDevice(d);
    top.Skip("device");
    return;
  }
  const Json* device = top.Get("device");
  if (device == nullptr) Fail(top.At("device"), fmt::format("missing key, expected a device preset name ({})", internal::KnownDevices()));
  if (device->is_string()) {
    const Document d = internal::FindDeviceDocument(device->get<std::string>(), top.At("device"), &config);
    s->device_path = d.label;
    s->device = ReadDevice(d);
  } else if (device->is_object()) {
    s->device = internal::ReadDevicePreset(top.source(), *device, "/device");
    s->device_path = "";
  } else {
    Fail(top.At("device"), fmt::format("expected a device preset name, a path or an object, got {}", Describe(*device)));
  }
}

// The allocator block, and --capacity, which replaces the device's usable memory
// (docs/config.md, "General rules").
void ReadAllocatorSection(ObjectReader& top, const LoadOptions& options, Setup* s) {
  if (const Json* a = top.Get("allocator")) {
    s->allocator = internal::ReadAllocatorBlock(top.source(), *a, "/allocator", s->device.allocator_backend);
  } else {
    s->allocator.backend = s->device.allocator_backend;
  }
  if (options.capacity_bytes) {
    if (*options.capacity_bytes <= 0) {
      throw InputError(fmt::format("--capacity: expected a positive size, got {}", *options.capacity_bytes));
    }
    if (*options.capacity_bytes > (Bytes{1} << 50)) {
      throw InputError(fmt::format("--capacity: {} bytes exceed memsim's limit of 2^50 (1 PiB)",
                                   *options.capacity_bytes));
    }
    s->notes.push_back(fmt::format("--capacity: usable memory {} bytes instead of the preset's {}",
                                   *options.capacity_bytes, s->device.usable_memory_bytes));
    // A natural slip is the card's marketing size ("80GB"): more than the card holds.
    const Bytes total = s->device.total_memory_bytes;
    if (total > 0 && *options.capacity_bytes > total) {
      s->warnings.push_back(fmt::format(
          "--capacity: {:.2f} GiB exceeds the total memory of device '{}' ({:.2f} GiB; its preset "
          "leaves {:.2f} GiB usable); the run is simulated with more memory than the card has",
          static_cast<double>(*options.capacity_bytes) / kGiB, s->device.name,
          static_cast<double>(total) / kGiB, static_cast<double>(s->device.usable_memory_bytes) / kGiB));
    }
    s->device.usable_memory_bytes = *options.capacity_bytes;
  }
  s->allocator.capacity_bytes = s->device.usable_memory_bytes;
}

// Transformer Engine runs only on CUDA; say which releases memsim assumed when none is stated
// (they decide whether dummy weight grads are cached, workload/facts.cc).
void NoteSoftwareVersions(ObjectReader& t, Setup* s) {
  const bool te = s->device.allocator_backend == alloc::Backend::kCuda &&
                  (s->training.transformer_impl == "transformer_engine" ||
                   !s->training.transformer_engine_version.empty());
  if (s->device.allocator_backend != alloc::Backend::kCuda) {
    for (const char* key : {"transformer_engine_version", "megatron_core_version"}) {
      if (t.Get(key) != nullptr && !t.Get(key)->is_null()) {
        s->notes.push_back(fmt::format("{}: no effect on this device (torch_npu has no Transformer "
                                       "Engine)",
                                       t.At(key)));
      }
    }
  }
  // stacks/megatron.cc: the data loader's causal mask is modelled for Megatron's get_batch on
  // CUDA only (MindSpeed-LLM replaces get_batch on Ascend; a plain PyTorch loop has its own).
  if (t.Has("create_attention_mask_in_dataloader") &&
      (!StackOf(s->training).Traits().megatron_get_batch ||
       s->device.allocator_backend != alloc::Backend::kCuda)) {
    s->notes.push_back(fmt::format("{}: no effect here (modelled for framework \"megatron\" on "
                                   "CUDA devices: Megatron's get_batch)",
                                   t.At("create_attention_mask_in_dataloader")));
  }
  if (te && s->training.gradient_accumulation_fusion) {
    for (const char* key : {"transformer_engine_version", "megatron_core_version"}) {
      if (t.Get(key) == nullptr || t.Get(key)->is_null()) {
        s->notes.push_back(fmt::format(
            "{}: not stated, a current release taken (TE >= 2.3, Megatron-core >= 0.14: one "
            "cached weight-sized dummy gradient per weight shape stays allocated; "
            "docs/config.md)",
            t.At(key)));
      }
    }
  }
}

// ---- the reproducing config (Setup::reproducing_config) ----

namespace fs = std::filesystem;

// A model file or device preset as the reproducing config writes it: a shipped one by its name
// (embedded under `shipped_dir`, or a file with the very text of the shipped one of its name,
// as configs/*.json's "../models/NAME.json"), any other file's object inline, so that nothing
// depends on the directory the config is later read from.
Json Echoed(const Document& d, std::string_view shipped_dir) {
  if (d.embedded && d.embedded_path.starts_with(shipped_dir)) {
    return fs::path(d.embedded_path).stem().string();
  }
  const std::string stem = fs::path(d.label).stem().string();
  const std::string_view* shipped = FindEmbedded(std::string(shipped_dir) + stem + ".json");
  if (shipped != nullptr && *shipped == d.text) return stem;
  return internal::ParseJson(d.text, d.label);
}

// The document `ref` names: given on the command line (`option` non-empty) or in the config.
std::optional<Document> Referenced(const std::string& option, const Json* in_config,
                                   const Document& config, bool model) {
  const auto find = model ? internal::FindModelDocument : internal::FindDeviceDocument;
  if (!option.empty()) return find(option, option, nullptr);
  if (in_config != nullptr && in_config->is_string()) {
    return find(in_config->get<std::string>(), in_config->get<std::string>(), &config);
  }
  return std::nullopt;
}

// The device, with --capacity as its usable memory (and as its total when above it: a preset
// refuses usable > total; only the header's "of N total" differs then).
Json EchoedDevice(const Json& root, const Document& config, const LoadOptions& options,
                  const Setup& s) {
  const Json* written = root.contains("device") ? &root["device"] : nullptr;
  const std::optional<Document> doc = Referenced(options.device, written, config, false);
  if (!doc && written == nullptr) return Json();  // not reached: a Setup has a device
  if (!options.capacity_bytes) return doc ? Echoed(*doc, "configs/devices/") : *written;
  Json d = doc ? internal::ParseJson(doc->text, doc->label) : *written;
  d["usable_memory_bytes"] = *options.capacity_bytes;
  if (*options.capacity_bytes > s.device.total_memory_bytes) {
    d["total_memory_bytes"] = *options.capacity_bytes;
  }
  return d;
}

// A training config that reproduces `s` read from any directory: `root` as read (--set and
// --iterations applied), with the model, device (--model, --device, --capacity applied) and the
// adapter_config and training_args files inline.
std::string ReproducingConfig(const Document& config, const Json& root, const LoadOptions& options,
                              const Setup& s) {
  Json out = root;
  const Json* model = root.contains("model") ? &root["model"] : nullptr;
  if (const std::optional<Document> d = Referenced(options.model_path, model, config, true)) {
    out["model"] = Echoed(*d, "models/");
  }
  out["device"] = EchoedDevice(root, config, options, s);
  Json& training = out["training"];
  if (training.contains("adapter_config") && training["adapter_config"].is_string()) {
    const std::string ref = training["adapter_config"].get<std::string>();
    const Document d = internal::FindReferencedDocument(ref, ref, config, "the adapter_config.json", "adapter_config.json");
    training["adapter_config"] = internal::ParseJson(d.text, d.label);
  }
  if (training.contains("training_args") && training["training_args"].is_string()) {
    // Inline, with the TrainingArguments fields the command line set (which the reader lets
    // into the block only from the command line) moved into it.
    const std::string ref = training["training_args"].get<std::string>();
    const Document d = internal::FindReferencedDocument(ref, ref, config, "the TrainingArguments JSON");
    Json args = internal::ParseJson(d.text, d.label);
    for (auto it = training.begin(); it != training.end();) {
      if (args.is_object() && internal::IsTrainingArgumentsField(it.key())) {
        args[it.key()] = it.value();
        it = training.erase(it);
      } else {
        ++it;
      }
    }
    training["training_args"] = std::move(args);
  }
  // TrainingArguments `deepspeed` naming a ds_config file (relative to the config, in the block
  // or in the training_args file): inline, as hf_deepspeed.cc ReadDeepSpeed reads an object.
  for (Json* holder : {&training, training.contains("training_args") ? &training["training_args"]
                                                                       : nullptr}) {
    if (holder == nullptr || !holder->is_object() || !holder->contains("deepspeed")) continue;
    Json& ds = (*holder)["deepspeed"];
    if (!ds.is_string() || ds.get<std::string>().empty()) continue;
    const std::string ref = ds.get<std::string>();
    const Document d = internal::FindReferencedDocument(ref, ref, config,
                                                        "the DeepSpeed config (ds_config JSON)");
    ds = internal::ParseJson(d.text, d.label);
  }
  // A sample lengths file (sample_data.h): inline as the histogram it reads as.
  if (training.contains("data") && training["data"].is_object() &&
      training["data"].contains("lengths") && training["data"]["lengths"].is_string()) {
    const std::string ref = training["data"]["lengths"].get<std::string>();
    Json histogram = Json::array();
    for (const auto& [length, count] : internal::ReadLengthsFile(ref, ref, config)) {
      histogram.push_back(Json::array({length, count}));
    }
    training["data"]["lengths"] = Json{{"histogram", std::move(histogram)}};
  }
  return out.dump(1);
}

// The parsed training config with --set and --iterations applied, and its Source.
Json ParseConfig(const Document& config, const LoadOptions& options, Source* source) {
  Json root = internal::ParseJson(config.text, config.label);
  if (!root.is_object()) Fail(source->At(""), fmt::format("expected an object, got {}", Describe(root)));
  internal::ApplyCommandLine(options, &root, source);
  return root;
}

Setup LoadSetupUnguarded(const std::string& config_path, const LoadOptions& options) {
  const Document config = internal::ReadConfigDocument(config_path, options.use_embedded_default);
  // A LLaMA-Factory, axolotl or TRL recipe (*.yaml, *.yml) is translated first (recipe.h).
  if (internal::IsYamlRecipe(config)) return internal::LoadRecipe(config, options);
  // A torchtitan job config (*.toml) likewise (torchtitan_toml.h).
  if (internal::IsToml(config)) return internal::LoadTorchtitanToml(config, options);
  Source source{config.label, {}};
  const Json root = ParseConfig(config, options, &source);
  return internal::LoadParsedConfig(config, root, source, options, internal::FieldErrors::kAll);
}

}  // namespace

namespace internal {

namespace {

// True iff `text` names `flag` ("--num-layers") as a whole word: not "--num-layers-foo".
bool NamesFlag(std::string_view text, std::string_view flag) {
  for (size_t at = text.find(flag); at != std::string_view::npos; at = text.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    if (end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) ||
                                text[end] == '-' || text[end] == '_')) {
      return true;
    }
  }
  return false;
}

}  // namespace

[[noreturn]] void ThrowFieldErrors(const std::vector<KeyError>& errors, const std::string& label,
                                   const InputError* stop) {
  std::vector<std::string> all;
  for (const KeyError& e : errors) all.push_back(e.message);
  // A stop that follows from a field error: at a key with one, naming the flag of a launch's
  // argument with one ("the model is not in the arguments (--num-layers, ...)": the location
  // "t.sh:3: --num-layers" ends in the flag), or "missing key" of a key an unknown key's "did
  // you mean" names (a misspelt key is reported as such, not as missing).
  const auto follows_from = [&](const KeyError& e) {
    const std::string_view what = stop->what();
    if (what.starts_with(e.location + ":")) return true;
    const size_t flag = e.location.rfind(" --");
    if (flag != std::string::npos && NamesFlag(what, std::string_view(e.location).substr(flag + 1))) {
      return true;
    }
    const size_t mean = e.message.rfind("(did you mean '");
    if (mean == std::string::npos) return false;
    const std::string key = e.message.substr(mean + 15, e.message.size() - mean - 15 - 3);
    return what.find("/" + key + ": missing key") != std::string_view::npos;
  };
  const bool follows = stop != nullptr && std::any_of(errors.begin(), errors.end(), follows_from);
  if (stop != nullptr && !follows) all.push_back(stop->what());
  if (all.size() == 1) throw InputError(all.front());
  std::string text = fmt::format("{} problems in {}:", all.size(), label);
  for (const std::string& e : all) text += "\n  " + e;
  if (stop != nullptr) {
    text += follows ? "\n  (reading stopped after these; the rest is checked once they are fixed)"
                    : "\n  (reading stopped at the last; the rest is checked once it is fixed)";
  }
  throw InputError(text);
}

void ApplyCommandLine(const LoadOptions& options, Json* root, Source* source) {
  for (const std::string& o : options.overrides) internal::ApplyOverride(o, root, source);
  if (options.iterations > 0) {
    // --iterations N: the key of the training block's key set that counts optimizer steps,
    // named as given: train_iters, or max_steps for a stack that reads TrainingArguments names
    // ("hf-trainer", hf_trainer.h).
    const char* key = TrainingArgumentsKeys(*root) ? "max_steps" : "train_iters";
    internal::ApplyOverride(fmt::format("training.{}={}", key, options.iterations), root, source);
    source->set_labels[internal::Child("/training", key)] =
        fmt::format("--iterations {}", options.iterations);
  }
}

// Where the model's model_type was written: its key in the model file, else the model file, else
// the config's /model (an inline model, or a shipped one by name).
std::string ModelTypeWhere(const ObjectReader& top, const internal::LocatedModel& located,
                           const Setup& s) {
  const auto it = located.where.find("model_type");
  if (it != located.where.end()) return it->second;
  return s.model_path.empty() ? top.At("model") : s.model_path;
}

namespace {

// Other tools' JSON files where a training config is expected (no "training" block): a Hugging
// Face model config.json, a PEFT adapter_config.json (every PeftConfig has peft_type:
// peft/config.py PeftConfigMixin), a TrainingArguments JSON (trainer.args.to_json_string(): its
// output_dir and per_device_train_batch_size fields, transformers/training_args.py), or a
// DeepSpeed config (the top-level keys of DeepSpeed's runtime/config.py: zero_optimization,
// train_micro_batch_size_per_gpu, train_batch_size). The first three sit beside the training
// configs that name them, so `memsim check memsim/*.json` meets them (docs/ci.md).
void RejectOtherJsonKinds(const ObjectReader& top, const std::string& label) {
  if (top.Has("training")) return;
  if (top.Has("peft_type")) {
    throw InputError(fmt::format(
        "{}: a PEFT adapter config (adapter_config.json: it has \"peft_type\"), not a training "
        "config; name it in a training config's training.adapter_config (framework "
        "\"hf-trainer\")",
        label));
  }
  for (const char* key : {"output_dir", "per_device_train_batch_size"}) {
    if (!top.Has(key)) continue;
    throw InputError(fmt::format(
        "{}: a TrainingArguments JSON (trainer.args.to_json_string(): it has \"{}\"), not a "
        "training config; name it in a training config's training.training_args (framework "
        "\"hf-trainer\")",
        label, key));
  }
  if (top.Has("model_type") || top.Has("architectures")) {
    throw InputError(fmt::format(
        "{}: a model file (Hugging Face config.json: it has \"{}\"), not a training config; give "
        "it with --model {} and a training config (or --megatron-args for a launch script)",
        label, top.Has("model_type") ? "model_type" : "architectures", Printable(label)));
  }
  // A device preset (configs/devices/*.json; config/device.cc reads its keys).
  for (const char* key : {"allocator_backend", "total_memory_bytes", "usable_memory_bytes"}) {
    if (!top.Has(key)) continue;
    throw InputError(fmt::format(
        "{}: a device preset (it has \"{}\"), not a training config; give it with --device {} "
        "and a training config",
        label, key, Printable(label)));
  }
  for (const char* key : {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"}) {
    if (!top.Has(key)) continue;
    throw InputError(fmt::format(
        "{}: a DeepSpeed config (ds_config.json: it has \"{}\"), not a memsim training config; "
        "memsim does not model DeepSpeed's engine (it models frameworks \"megatron\", "
        "\"pytorch\" and \"hf-trainer\"; ZeRO-1 as Megatron's distributed optimizer): write a "
        "training config (docs/config.md)",
        label, key));
  }
}

// Two --set of one key with other values, or --iterations with a --set of the key it sets: the
// last is taken (as ApplyCommandLine applies them in order), and said.
void WarnCommandLineRepeats(const LoadOptions& options, std::vector<std::string>* warnings) {
  std::map<std::string, std::string> given;  // key -> its last "KEY=VALUE"
  for (const std::string& o : options.overrides) {
    const auto [it, fresh] = given.try_emplace(o.substr(0, o.find('=')), o);
    if (!fresh && it->second != o) {
      warnings->push_back(fmt::format("--set {}: overrides --set {} given before it; the last "
                                      "is taken",
                                      Printable(o), Printable(it->second)));
    }
    it->second = o;
  }
  if (options.iterations <= 0) return;
  for (const char* key : {"training.train_iters", "training.max_steps"}) {
    if (const auto it = given.find(key); it != given.end()) {
      warnings->push_back(fmt::format("--iterations {}: overrides --set {}", options.iterations,
                                      Printable(it->second)));
    }
  }
}

// The part of LoadParsedConfig that reads the document's keys into `*s` (field errors go to
// source.field_errors); returns where the training values were written.
Origin ReadConfigKeys(const Document& config, const Json& root, const Source& source,
                      const LoadOptions& options, Setup* out) {
  Setup& s = *out;
  s.config_path = config.label;
  WarnCommandLineRepeats(options, &s.warnings);
  ObjectReader top(source, root, "");
  RejectOtherJsonKinds(top, config.label);
  top.RejectUnknown({"model", "device", "training", "allocator"});
  if (!top.Has("training")) Fail(top.At("training"), "missing key, expected the training settings");
  ObjectReader t(source, *top.Get("training"), "/training");
  // Unsupported features first, so that a config for another stack says "unsupported" rather
  // than naming its first unknown key; then unknown keys, before any value is read (a misspelt
  // key is reported as such, not as a missing one).
  // The stack the block names reads it (config/stack.h; each has its own key set).
  const Stack& stack = internal::StackOfBlock(t);
  internal::HfTrainerExtras hf;
  stack.ReadBeforeModel(t, config, &s, &hf);

  internal::LocatedModel located = ReadModel(top, config, options, &s);
  s.warnings.insert(s.warnings.end(), located.warnings.begin(), located.warnings.end());
  stack.ReadAfterModel(t, &located, &s);
  s.model = located.model;
  const HfTrainerOptions* trainer = s.training.hf_trainer();
  const bool lora = trainer != nullptr && trainer->lora_r > 0;
  if (lora && s.model.model_type != "llama" && s.model.model_type != "mistral" &&
      s.model.model_type != "qwen2" && s.model.model_type != "qwen3") {
    throw UnsupportedError(
        fmt::format("{}: LoRA on model_type '{}' (memsim maps target_modules onto "
                    "llama-family layers: llama, mistral, qwen2, qwen3)",
                    ModelTypeWhere(top, located, s), s.model.model_type));
  }
  if (lora && hf.lora_modules.needed()) {
    internal::ResolveLoraModules(hf.lora_modules, s.model, s.training, &s.warnings);
  }
  if (s.model.type_vocab_size > 0 && !stack.Traits().encoder_models) {
    throw UnsupportedError(fmt::format(
        "{}: encoder model_type '{}' under framework \"{}\" (memsim models encoders with "
        "framework \"hf-trainer\" or \"pytorch\")",
        ModelTypeWhere(top, located, s), s.model.model_type, s.training.framework));
  }
  internal::Origin origin{source, located.where,
                          t.PositiveInt("num_virtual_stages_per_pipeline_rank"),
                          t.PositiveInt("gradient_accumulation_steps"), hf.keys};
  ReadDeviceSection(top, config, options, &s);
  ReadAllocatorSection(top, options, &s);
  NoteSoftwareVersions(t, &s);
  return origin;
}


}  // namespace

// FieldErrors::kAll: every field error of the document (a value of the wrong type or out of
// range, an unknown key) is reported in one run: the readers record them (Source::field_errors) and read the key as
// absent; they are thrown together once the keys are read, before the checks of how the values
// fit together (CheckWritten, Derive), which would see defaults in their place.
Setup LoadParsedConfig(const Document& config, const Json& root, const Source& source,
                       const LoadOptions& options, FieldErrors mode,
                       const std::vector<KeyError>& earlier) {
  std::vector<KeyError> field_errors = earlier;
  Setup s;
  Source collecting = source;
  if (mode == FieldErrors::kAll) collecting.field_errors = &field_errors;
  collecting.not_modelled = &s.not_modelled;
  std::optional<Origin> origin;
  try {
    origin = ReadConfigKeys(config, root, collecting, options, &s);
  } catch (const InputError& e) {
    if (field_errors.empty()) throw;
    ThrowFieldErrors(field_errors, config.label, &e);
  }
  if (!field_errors.empty()) ThrowFieldErrors(field_errors, config.label, nullptr);
  origin->training.field_errors = nullptr;
  internal::CheckWritten(s, *origin);
  internal::Derive(&s, *origin);
  internal::CheckDerived(s, *origin);
  s.reproducing_config = ReproducingConfig(config, root, options, s);
  return s;
}

}  // namespace internal

Setup LoadSetup(const std::string& config_path, const LoadOptions& options) {
  // Backstop: every read above checks types first, so nlohmann should never throw; if it does,
  // the user still gets one InputError naming the config rather than a library exception.
  try {
    return LoadSetupUnguarded(config_path, options);
  } catch (const Json::exception& e) {
    throw InputError(fmt::format(
        "{}: unexpected JSON error ({})",
        config_path.empty() ? "<embedded>/configs/default.json" : internal::Printable(config_path),
        internal::Printable(e.what())));
  }
}

Setup LoadVariant(const Setup& base, const std::vector<std::string>& overrides,
                  const std::string& label) {
  MEMSIM_CHECK(!base.reproducing_config.empty());
  LoadOptions options;
  options.overrides = overrides;
  const internal::Document config{label, base.reproducing_config, false, ""};
  try {
    Source source{config.label, {}};
    const Json root = ParseConfig(config, options, &source);
    return internal::LoadParsedConfig(config, root, source, options);
  } catch (const Json::exception& e) {
    throw InputError(fmt::format("{}: unexpected JSON error ({})", label,
                                 internal::Printable(e.what())));
  }
}

DevicePreset LoadDevicePreset(const std::string& name_or_path) {
  return ReadDevice(
      internal::FindDeviceDocument(name_or_path, internal::Printable(name_or_path), nullptr));
}

namespace {

// What a gpt2 model (Megatron's defaults: GELU MLP, LayerNorm, learned positions, biases, tied
// embeddings) was changed into by Megatron's architecture keys: "SwiGLU, RMSNorm, RoPE, ...", or
// "" when nothing was (or for another model_type, which its name says).
std::string MegatronArchitecture(const ModelConfig& m) {
  if (m.model_type != "gpt2") return "";
  std::string out;
  auto add = [&out](bool on, const char* what) {
    if (on) out += (out.empty() ? "" : ", ") + std::string(what);
  };
  add(m.gated_mlp, "SwiGLU");
  add(m.normalization == Normalization::kRMSNorm, "RMSNorm");
  add(m.position_embedding_type == PositionEmbedding::kRope, "RoPE");
  add(m.position_embedding_type == PositionEmbedding::kNone, "no position embedding");
  // Megatron's --add-qkv-bias keeps the QKV projection's bias with --disable-bias-linear
  // (megatron/core/transformer/attention.py: bias=config.add_bias_linear or config.add_qkv_bias).
  add(!m.add_bias_linear && m.add_qkv_bias, "QKV bias only");
  add(!m.add_bias_linear && !m.add_qkv_bias, "no linear biases");
  add(!m.tie_word_embeddings, "untied embeddings");
  return out;
}

}  // namespace

std::string ModelName(const Setup& setup) {
  if (!setup.model_label.empty() || setup.model_path.empty()) {
    // "train.sh (Megatron arguments; SwiGLU, RMSNorm, RoPE)", "gpt2 (inline; SwiGLU, ...)".
    std::string name = !setup.model_label.empty() ? setup.model_label
                                                  : setup.model.model_type + " (inline)";
    const std::string architecture = MegatronArchitecture(setup.model);
    if (!architecture.empty() && name.ends_with(')')) {
      name.insert(name.size() - 1, "; " + architecture);
    }
    return name;
  }
  const std::string stem = std::filesystem::path(setup.model_path).stem().string();
  // Generic file names say nothing; name the architecture instead.
  if (stem == "model" || stem == "config") return setup.model.model_type + " (" + stem + ".json)";
  return stem;
}

}  // namespace memsim::config
