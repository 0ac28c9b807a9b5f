// adapter_config and quantization_config of an "hf-trainer" block (hf_peft_config.h).
#include "config/hf_peft_config.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <regex>

#include "core/error.h"

namespace memsim::config::internal {
namespace {

constexpr int kMaxLoraRank = 65536;  // 2^16, docs/config.md "Limits"

const std::vector<std::string> kTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};

// modules_to_save names memsim places a trainable copy of (workload/hf_peft.cc SavedModule).
const std::vector<std::string> kSavable = {"lm_head", "embed_tokens", "classifier", "score",
                                           "pooler"};

// LoraConfig fields (peft/tuners/lora/config.py and PeftConfig) read or accepted.
const std::vector<std::string> kLoraKeys = {
    "peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "bias",
    "task_type", "use_dora", "exclude_modules", "layers_to_transform", "layers_pattern", "rank_pattern",
    "alpha_pattern", "layer_replication", "lora_bias", "trainable_token_indices",
    "target_parameters",
    // no effect on memory
    "base_model_name_or_path", "revision", "inference_mode", "fan_in_fan_out", "init_lora_weights",
    "use_rslora", "auto_mapping", "megatron_config", "megatron_core",
    "loftq_config", "eva_config", "corda_config", "runtime_config", "use_qalora",
    "qalora_group_size"};

std::vector<std::string> StringList(ObjectReader& r, const char* key) {
  std::vector<std::string> out;
  const Json* v = r.Get(key);
  if (v == nullptr || v->is_null()) return out;
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) Fail(r.At(key), fmt::format("expected a list of names, got {}", Describe(*v)));
  for (const Json& e : *v) {
    if (!e.is_string()) Fail(r.At(key), fmt::format("expected a list of names, got {}", Describe(*v)));
    out.push_back(e.get<std::string>());
  }
  return out;
}

// A regular expression of target_modules or exclude_modules, compiled once to check it
// (ECMAScript grammar: Python's re extensions such as (?P<name>...) are refused).
std::regex CompileModuleRegex(const std::string& pattern, const std::string& where) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    Fail(where, fmt::format("\"{}\" is not a valid regular expression ({}; memsim reads the "
                            "ECMAScript grammar)",
                            Printable(pattern), e.what()));
  }
}

// A string that PEFT treats as a regular expression, or a list of names.
struct NamesOrRegex {
  std::vector<std::string> names;
  std::optional<std::string> regex;
};
NamesOrRegex ReadNamesOrRegex(ObjectReader& a, const char* key) {
  const Json* v = a.Get(key);
  if (v != nullptr && v->is_string()) {
    (void)CompileModuleRegex(v->get<std::string>(), a.At(key));
    return {{}, v->get<std::string>()};
  }
  return {StringList(a, key), std::nullopt};
}

// target_modules (peft/tuners/tuners_utils.py check_target_module_exists): a string is
// "all-linear" (any case; _maybe_include_all_linear_layers: every linear but the output layer)
// or a regular expression, resolved against the model's module names (ResolveLoraModules); a
// list holds module names matched as a name's last dotted parts. Absent: PEFT's default for the
// model_type (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q_proj
// and v_proj for llama, mistral, qwen2 and qwen3, the model types memsim models LoRA on).
void ReadTargets(ObjectReader& a, TrainingConfig& c, std::vector<std::string>* notes,
                 LoraModuleMatch* match) {
  const std::string where = a.At("target_modules");
  match->target_where = where;
  if (!a.Has("target_modules")) {
    c.lora_target_modules = {"q_proj", "v_proj"};
    notes->push_back(fmt::format("{}: absent, [\"q_proj\", \"v_proj\"] taken (PEFT's default for "
                                 "llama-family models)",
                                 where));
    return;
  }
  NamesOrRegex t = ReadNamesOrRegex(a, "target_modules");
  if (t.regex) {
    std::string lower = *t.regex;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (lower == "all-linear") {
      c.lora_target_modules = kTargets;  // not lm_head
    } else {
      match->target_regex = t.regex;
    }
    return;
  }
  if (t.names.empty()) {
    Fail(where, "empty, expected names among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj, \"all-linear\" or a regular expression");
  }
  for (const std::string& name : t.names) {
    if (name == "all-linear") {
      Fail(where, "\"all-linear\" inside a list is a module name to PEFT (it matches no module); "
                  "write it as a string: \"target_modules\": \"all-linear\"");
    }
    if (std::find(kTargets.begin(), kTargets.end(), name) == kTargets.end()) {
      const std::string guess = ClosestMatch(name, kTargets);
      Fail(where,
           fmt::format("'{}' is not a linear of a llama-family decoder layer (q_proj, k_proj, "
                       "v_proj, o_proj, gate_proj, up_proj, down_proj){}",
                       Printable(name), guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
    }
  }
  c.lora_target_modules = t.names;
}

// LoraConfig fields that change the adapters in ways memsim does not model: unsupported when
// they move much memory, a warning when little.
void ReadUnmodelled(ObjectReader& a, std::vector<std::string>* warnings) {
  auto set = [&a](const char* key) {
    const Json* v = a.Get(key);
    return v != nullptr && !v->is_null() && !(v->is_boolean() && !v->get<bool>()) &&
           !((v->is_array() || v->is_object()) && v->empty());
  };
  for (const char* key : {"layers_to_transform", "rank_pattern", "alpha_pattern"}) {
    if (set(key)) throw UnsupportedError(fmt::format("{}: per-layer adapters (not modelled)", a.At(key)));
  }
  if (set("layers_pattern") && !set("layers_to_transform")) {
    // peft/tuners/lora/config.py LoraConfig.__post_init__ raises ValueError.
    Fail(a.At("layers_pattern"), "needs layers_to_transform (PEFT refuses layers_pattern alone)");
  }
  if (set("layer_replication")) {
    throw UnsupportedError(fmt::format("{}: replicated decoder layers (not modelled)",
                                       a.At("layer_replication")));
  }
  if (set("target_parameters")) {
    throw UnsupportedError(fmt::format("{}: LoRA on parameters rather than modules (not modelled)",
                                       a.At("target_parameters")));
  }
  for (const char* key : {"lora_bias", "trainable_token_indices"}) {
    if (set(key)) {
      warnings->push_back(fmt::format("{}: not modelled (a trained bias of each lora_B, or "
                                      "trained rows of the embedding: a few MiB at most), ignored",
                                      a.At(key)));
    }
  }
}

void ReadLora(ObjectReader& a, TrainingConfig& c, std::vector<std::string>* notes,
              std::vector<std::string>* warnings, LoraModuleMatch* match) {
  // Another JSON given as the adapter's (its keys would only be listed as unknown and every
  // LoraConfig default taken).
  if (a.Has("training") || a.Has("model_type")) {
    Fail(a.At(a.Has("training") ? "training" : "model_type"),
         fmt::format("{}, not an adapter_config.json (PEFT's LoraConfig fields)",
                     a.Has("training") ? "a memsim training config"
                                       : "a model's config.json"));
  }
  if (std::optional<std::string> t = a.String("peft_type"); t && *t != "LORA") {
    throw UnsupportedError(fmt::format("{}: peft_type '{}' (memsim models LORA)", a.At("peft_type"),
                                       Printable(*t)));
  }
  // LoraConfig.r has no upper bound; memsim's limit (an estimate far above real adapters, whose
  // rank is at most the layer width) keeps r × width × layers within its 64-bit byte counts.
  if (std::optional<int> r = a.IntInRange("r", 1, kMaxLoraRank)) {
    c.lora_r = *r;
  } else {
    c.lora_r = 8;  // LoraConfig.r default
  }
  c.lora_alpha = a.Number("lora_alpha", 0, 1e9, false, false).value_or(8);
  c.lora_dropout = a.Number("lora_dropout", 0, 1, false, true).value_or(0.0);
  ReadTargets(a, c, notes, match);
  if (a.Has("exclude_modules")) {
    NamesOrRegex x = ReadNamesOrRegex(a, "exclude_modules");
    match->exclude_names = x.names;
    match->exclude_regex = x.regex;
    match->exclude_where = a.At("exclude_modules");
  }
  c.lora_modules_to_save = StringList(a, "modules_to_save");
  for (const std::string& m : c.lora_modules_to_save) {
    if (std::find(kSavable.begin(), kSavable.end(), m) == kSavable.end()) {
      warnings->push_back(fmt::format("{}: '{}': no trainable copy of it is modelled (memsim copies "
                                      "lm_head, embed_tokens, classifier, score, pooler)",
                                      a.At("modules_to_save"), Printable(m)));
    }
  }
  // peft/config.py PeftConfig.__post_init__ refuses a task_type outside TaskType
  // (peft/utils/peft_types.py).
  const std::optional<std::string> task = a.Choice(
      "task_type", {"SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS",
                    "FEATURE_EXTRACTION"});
  // PeftModelForSequenceClassification adds its heads to modules_to_save (peft/peft_model.py).
  if (task.value_or("") == "SEQ_CLS") {
    for (const char* m : {"classifier", "score"}) c.lora_modules_to_save.emplace_back(m);
  }
  if (a.Bool("use_dora").value_or(false)) {
    throw UnsupportedError(fmt::format("{}: DoRA (its magnitude vectors and weight norms are not "
                                       "modelled)",
                                       a.At("use_dora")));
  }
  if (std::optional<std::string> b = a.String("bias"); b && *b != "none") {
    throw UnsupportedError(fmt::format("{}: bias '{}' (trained biases of the base model are not "
                                       "modelled)",
                                       a.At("bias"), Printable(*b)));
  }
  ReadUnmodelled(a, warnings);
  std::string unknown;
  for (const std::string& key : a.Unread()) {
    if (std::find(kLoraKeys.begin(), kLoraKeys.end(), key) == kLoraKeys.end()) {
      unknown += (unknown.empty() ? "" : ", ") + key;
      if (const std::string guess = a.NearMiss(key, kLoraKeys); !guess.empty()) {
        unknown += fmt::format(" (did you mean '{}'?)", guess);
      }
    }
  }
  if (!unknown.empty()) {
    warnings->push_back(fmt::format("{}: adapter_config keys memsim does not know, ignored: {}",
                                    a.source().At(a.pointer()), unknown));
  }
}

void ReadQuantization(ObjectReader& q, TrainingConfig& c) {
  q.RejectUnknown({"load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_compute_dtype",
                   "bnb_4bit_use_double_quant", "bnb_4bit_quant_storage", "quant_method",
                   "llm_int8_skip_modules", "llm_int8_threshold", "llm_int8_has_fp16_weight",
                   "llm_int8_enable_fp32_cpu_offload"});
  if (q.Bool("load_in_8bit").value_or(false)) {
    throw UnsupportedError(fmt::format("{}: LLM.int8 weights (not modelled)", q.At("load_in_8bit")));
  }
  c.load_in_4bit = q.Bool("load_in_4bit").value_or(false);
  // BitsAndBytesConfig default bnb_4bit_quant_type "fp4"; NF4 and FP4 pack the same way.
  (void)q.Choice("bnb_4bit_quant_type", {"nf4", "fp4"});
  c.bnb_4bit_use_double_quant = q.Bool("bnb_4bit_use_double_quant").value_or(false);
  if (std::optional<std::string> s = q.String("bnb_4bit_quant_storage"); s && *s != "uint8") {
    throw UnsupportedError(fmt::format("{}: 4-bit storage '{}' (memsim models uint8)",
                                       q.At("bnb_4bit_quant_storage"), Printable(*s)));
  }
  if (std::optional<std::string> d =
          q.Choice("bnb_4bit_compute_dtype", {"float32", "bfloat16", "float16"})) {
    (void)d;  // the dequantised copy takes the activation's dtype (MatMul4Bit: .to(A.dtype))
  }
}

// A module of a llama-family causal LM, as model.named_modules() names it.
struct Module {
  std::string name;
  int target = -1;    // index in kTargets for a decoder layer's linear, else -1
  bool head = false;  // lm_head, embed_tokens or a classification head: adaptable, not modelled
};

// transformers/models/llama/modeling_llama.py (LlamaForCausalLM: model, lm_head; LlamaModel:
// embed_tokens, layers, norm, rotary_emb; LlamaDecoderLayer: self_attn, mlp, input_layernorm,
// post_attention_layernorm; LlamaMLP: gate_proj, up_proj, down_proj, act_fn); mistral and qwen2
// alike, qwen3's attention adds q_norm and k_norm (modeling_qwen3.py Qwen3Attention). The root
// module ("") is skipped as PEFT's inject_adapter skips it; "score" stands for the head of a
// *ForSequenceClassification model.
std::vector<Module> LlamaModules(const ModelConfig& m) {
  std::vector<Module> out = {{"model"}, {"model.embed_tokens", -1, true}, {"model.layers"}};
  const bool qk_norm = m.model_type == "qwen3";
  for (int i = 0; i < m.num_hidden_layers; ++i) {
    const std::string layer = fmt::format("model.layers.{}", i);
    out.push_back({layer});
    out.push_back({layer + ".self_attn"});
    for (int k = 0; k < 4; ++k) out.push_back({layer + ".self_attn." + kTargets[k], k});
    if (qk_norm) {
      out.push_back({layer + ".self_attn.q_norm"});
      out.push_back({layer + ".self_attn.k_norm"});
    }
    out.push_back({layer + ".mlp"});
    for (int k = 4; k < 7; ++k) out.push_back({layer + ".mlp." + kTargets[k], k});
    out.push_back({layer + ".mlp.act_fn"});
    out.push_back({layer + ".input_layernorm"});
    out.push_back({layer + ".post_attention_layernorm"});
  }
  for (const char* n : {"model.norm", "model.rotary_emb"}) out.push_back({n});
  out.push_back({"lm_head", -1, true});
  out.push_back({"score", -1, true});
  return out;
}

bool FullMatch(const std::regex& re, const std::string& name, const std::string& where) {
  try {
    return std::regex_match(name, re);
  } catch (const std::regex_error& e) {
    Fail(where, fmt::format("matching the regular expression failed on '{}' ({})", name, e.what()));
  }
}

// A name listed in target_modules / exclude_modules: the module's name, or its last dotted parts.
bool ListMatches(const std::vector<std::string>& list, const std::string& name) {
  return std::any_of(list.begin(), list.end(), [&name](const std::string& e) {
    return name == e || (name.size() > e.size() && name.ends_with(e) &&
                         name[name.size() - e.size() - 1] == '.');
  });
}

// modules_to_save: PEFT never adapts them nor what is inside them
// (re.match(rf"(^|.*\.){m}($|\..*)", key), here with m taken literally).
bool InModulesToSave(const std::vector<std::string>& save, const std::string& name) {
  return std::any_of(save.begin(), save.end(), [&name](const std::string& m) {
    const std::string dotted = "." + name + ".";
    return dotted.find("." + m + ".") != std::string::npos;
  });
}

// PEFT's matching (tuners_utils.py check_target_module_exists, in inject_adapter's order of
// model.named_modules()): exclude_modules and modules_to_save first, then target_modules.
// Returns, for each linear of kTargets, the layers it is adapted in; `targeted_excluded`: a
// module target_modules matches was excluded; `exclude_used`: exclude_modules excluded one.
// Fails as ResolveLoraModules (hf_peft_config.h) on a matched head or a module not a linear.
struct Matched {
  std::vector<int> layers = std::vector<int>(kTargets.size(), 0);
  bool targeted_excluded = false;
  bool exclude_used = false;
};
Matched MatchModules(const LoraModuleMatch& match, const ModelConfig& model,
                     const TrainingConfig& c) {
  const std::string& where = match.target_where;
  std::optional<std::regex> target, exclude;
  if (match.target_regex) target = CompileModuleRegex(*match.target_regex, match.target_where);
  if (match.exclude_regex) exclude = CompileModuleRegex(*match.exclude_regex, match.exclude_where);
  Matched out;
  for (const Module& m : LlamaModules(model)) {
    const bool targeted = target ? FullMatch(*target, m.name, match.target_where)
                                 : ListMatches(c.lora_target_modules, m.name);
    const bool excluded = (exclude && FullMatch(*exclude, m.name, match.exclude_where)) ||
                          ListMatches(match.exclude_names, m.name);
    out.exclude_used |= excluded;
    if (!targeted) continue;
    if (excluded || InModulesToSave(c.lora_modules_to_save, m.name)) {
      out.targeted_excluded = true;
      continue;
    }
    if (m.head) {
      throw UnsupportedError(fmt::format("{}: an adapter on '{}' (LoRA on the embedding or an "
                                         "output head is not modelled)",
                                         where, m.name));
    }
    if (m.target < 0) {
      // peft/tuners/lora/model.py _create_new_module: "Target module ... is not supported".
      Fail(where, fmt::format("matches '{}', which is not a linear layer (PEFT refuses to adapt "
                              "it: LoRA replaces Linear, Embedding and Conv layers)",
                              m.name));
    }
    ++out.layers[static_cast<std::size_t>(m.target)];
  }
  return out;
}

}  // namespace

void ResolveLoraModules(const LoraModuleMatch& match, const ModelConfig& model,
                        TrainingConfig& c, std::vector<std::string>* warnings) {
  const std::string& where = match.target_where;
  // A linear adapted in some layers only, or no module left: named by exclude_modules when it
  // took modules from a list of names (the list itself adapts every layer).
  const bool by_exclude = !match.exclude_where.empty();
  const std::string& narrowed = !match.target_regex && by_exclude ? match.exclude_where : where;
  const Matched matched = MatchModules(match, model, c);
  const std::vector<int>& layers = matched.layers;
  const bool excluded = matched.targeted_excluded;
  if (by_exclude && !matched.exclude_used) {
    // tuners_utils.py inject_adapter warns "You have passed exclude_modules=... but no modules
    // were excluded".
    warnings->push_back(fmt::format("{}: excludes no module of the model (module names look like "
                                    "model.layers.0.mlp.down_proj)",
                                    match.exclude_where));
  }
  std::vector<std::string> targets;
  for (std::size_t k = 0; k < kTargets.size(); ++k) {
    if (layers[k] == 0) continue;
    if (layers[k] != model.num_hidden_layers) {
      throw UnsupportedError(fmt::format("{}: adapts {} in {} of the {} layers (per-layer "
                                         "adapters, not modelled)",
                                         narrowed, kTargets[k], layers[k], model.num_hidden_layers));
    }
    targets.push_back(kTargets[k]);
  }
  if (targets.empty()) {
    // tuners_utils.py inject_adapter: "All modules were excluded" / "Target modules ... not found
    // in the base model".
    if (!excluded) {
      Fail(where, "matches no module of the model (PEFT: target modules not found in the base "
                  "model); module names look like model.layers.0.self_attn.q_proj");
    }
    Fail(by_exclude ? match.exclude_where : where,
         fmt::format("{} every module target_modules matches{}: PEFT refuses an adapter without "
                     "modules",
                     by_exclude ? "excludes" : "modules_to_save holds",
                     by_exclude ? " (with modules_to_save)" : ""));
  }
  c.lora_target_modules = targets;
}

const std::vector<std::string>& LoraTargetNames() { return kTargets; }

void ReadPeft(ObjectReader& own, const Document& config, TrainingConfig& c,
              std::vector<std::string>* notes, std::vector<std::string>* warnings,
              LoraModuleMatch* match) {
  if (const Json* v = own.Get("adapter_config"); v != nullptr && !v->is_null()) {
    if (v->is_string()) {
      const Document doc = FindReferencedDocument(v->get<std::string>(), own.At("adapter_config"),
                                                   config, "the adapter_config.json");
      const Json json = ParseJson(doc.text, doc.label);
      if (!json.is_object()) Fail(doc.label, fmt::format("expected an object, got {}", Describe(json)));
      Source source{doc.label, {}};
      ObjectReader a(source, json, "");
      ReadLora(a, c, notes, warnings, match);
    } else if (v->is_object()) {
      ObjectReader a(own.source(), *v, own.PointerOf("adapter_config"));
      ReadLora(a, c, notes, warnings, match);
    } else {
      Fail(own.At("adapter_config"),
           fmt::format("expected a path to adapter_config.json or an object, got {}", Describe(*v)));
    }
  }
  if (const Json* v = own.Get("quantization_config"); v != nullptr && !v->is_null()) {
    if (!v->is_object()) {
      Fail(own.At("quantization_config"),
           fmt::format("expected an object (BitsAndBytesConfig names), got {}", Describe(*v)));
    }
    ObjectReader q(own.source(), *v, own.PointerOf("quantization_config"));
    ReadQuantization(q, c);
  }
  if (c.load_in_4bit && c.lora_r == 0) {
    notes->push_back(fmt::format("{}: 4-bit weights without an adapter: every weight frozen",
                                 own.At("quantization_config")));
  }
}

}  // namespace memsim::config::internal
