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

// The modules of which memsim places a trainable copy (workload/hf_peft.cc SavedModule), by the
// name of the module in model.named_modules() and the name memsim keeps in lora_modules_to_save.
struct Savable {
  std::string_view module;
  std::string_view saved;
};
constexpr Savable kSavable[] = {
    {"lm_head", "lm_head"}, {"model.embed_tokens", "embed_tokens"}, {"score", "score"}};

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

// memsim's bound on the automaton of a module-name regular expression: matching time grows with
// it (below). 1024 states is an estimate far above real patterns (a list of 80 layer numbers
// is about 250): at 3831 states, matching every module of an 80-layer model took 2 s (measured
// on this repository's build machine), at 965 states 0.3 s.
constexpr std::int64_t kMaxRegexStates = 1024;

std::int64_t SaturatingProduct(std::int64_t a, std::int64_t b) {
  return a > (std::int64_t{1} << 40) / std::max<std::int64_t>(b, 1) ? std::int64_t{1} << 40 : a * b;
}

// The length of the counted repetition "{n}", "{n,}" or "{n,m}" at p[i] and its largest count
// (n for "{n,}"), or 0 when p[i] does not start one.
size_t CountedRepetition(std::string_view p, size_t i, std::int64_t* count) {
  size_t j = i + 1;
  std::int64_t n[2] = {0, -1};
  int which = 0;
  bool digits = false;
  for (; j < p.size() && p[j] != '}'; ++j) {
    if (p[j] == ',' && which == 0 && digits) {
      which = 1;
    } else if (p[j] >= '0' && p[j] <= '9') {
      if (which == 1 && n[1] < 0) n[1] = 0;
      n[which] = std::min<std::int64_t>(n[which] * 10 + (p[j] - '0'), std::int64_t{1} << 30);
      digits = true;
    } else {
      return 0;
    }
  }
  if (j == p.size() || !digits) return 0;
  *count = std::max(n[0], n[1]);
  return j - i;
}

// An upper bound of the states of the automaton a regular expression compiles to: a few per
// character, class or group, and a counted repetition {n,m} copies its atom max(n, m) + 1 times
// (libstdc++ bits/regex_compiler.tcc _M_quantifier clones it). Saturates at 2^40.
std::int64_t RegexStates(std::string_view p) {
  std::vector<std::vector<std::int64_t>> groups(1);  // the atoms of each open group
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<std::int64_t>& atoms = groups.back();
    const char c = p[i];
    std::int64_t count = 0;
    if (c == '\\') {
      ++i;
      atoms.push_back(2);
    } else if (c == '[') {  // a class is one state; skip to its closing ']'
      size_t j = i + 1;
      if (j < p.size() && p[j] == '^') ++j;
      if (j < p.size() && p[j] == ']') ++j;
      while (j < p.size() && p[j] != ']') j += p[j] == '\\' ? 2 : 1;
      i = j;
      atoms.push_back(2);
    } else if (c == '(') {
      groups.emplace_back();
    } else if (c == ')' && groups.size() > 1) {
      std::int64_t sum = 2;
      for (const std::int64_t a : groups.back()) sum = std::min(sum + a, std::int64_t{1} << 40);
      groups.pop_back();
      groups.back().push_back(sum);
    } else if (const size_t n = c == '{' ? CountedRepetition(p, i, &count) : 0; n > 0) {
      if (!atoms.empty()) atoms.back() = SaturatingProduct(atoms.back(), count + 1);
      i += n;
    } else if ((c == '*' || c == '+' || c == '?') && !atoms.empty()) {
      atoms.back() += 2;
    } else {
      atoms.push_back(c == '|' ? 2 : 1);
    }
  }
  std::int64_t total = 0;
  for (const std::vector<std::int64_t>& atoms : groups) {
    for (const std::int64_t a : atoms) total = std::min(total + a, std::int64_t{1} << 40);
  }
  return total;
}

// A regular expression of target_modules, exclude_modules or modules_to_save, compiled once to
// check it (ECMAScript grammar: Python's re extensions such as (?P<name>...) are refused).
// Matching never backtracks exponentially: with libstdc++ the automaton is run breadth-first
// (regex_constants::__polynomial: time linear in states × name length; back-references, which
// it cannot run, are refused), and the automaton is bounded by kMaxRegexStates. Python's re,
// which PEFT uses, backtracks: a pattern such as (a+)+$ can run for hours there.
std::regex CompileModuleRegex(const std::string& pattern, const std::string& where) {
  if (const std::int64_t states = RegexStates(pattern); states > kMaxRegexStates) {
    Fail(where, fmt::format("the regular expression \"{}\" is too complex for memsim (about {} "
                            "automaton states, limit {}: counted repetitions such as {{100}} "
                            "multiply); write a shorter pattern or a list of module names",
                            Printable(pattern, 80),
                            states >= (std::int64_t{1} << 40) ? std::string("2^40") : std::to_string(states),
                            kMaxRegexStates));
  }
  try {
#if defined(__GLIBCXX__)
    return std::regex(pattern, std::regex::ECMAScript | std::regex_constants::__polynomial);
#else
    return std::regex(pattern, std::regex::ECMAScript);
#endif
  } catch (const std::regex_error& e) {
    const bool backref = e.code() == std::regex_constants::error_complexity;
    Fail(where, fmt::format("\"{}\" is not a valid regular expression ({}; memsim reads the "
                            "ECMAScript grammar{})",
                            Printable(pattern, 80), e.what(),
                            backref ? ", without back-references" : ""));
  }
}

// The pattern PEFT builds of a modules_to_save entry to keep adapters out of it
// (tuners_utils.py check_target_module_exists).
std::string SaveExclusionPattern(const std::string& entry) {
  return "(^|.*\\.)" + entry + "($|\\..*)";
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
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  const std::string where = a.At("target_modules");
  match->target_where = where;
  if (!a.Has("target_modules")) {
    hf.lora_target_modules = {"q_proj", "v_proj"};
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
      hf.lora_target_modules = kTargets;  // not lm_head
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
    // PEFT matches a listed name as the module's name or its last dotted parts
    // (check_target_module_exists: key == target or key.endswith("." + target)), so a dotted
    // entry ("self_attn.q_proj") is resolved against the module names (ResolveLoraModules).
    if (name.find('.') != std::string::npos) {
      match->target_dotted = true;
      continue;
    }
    if (std::find(kTargets.begin(), kTargets.end(), name) == kTargets.end()) {
      const std::string guess = ClosestMatch(name, kTargets);
      Fail(where,
           fmt::format("'{}' is not a linear of a llama-family decoder layer (q_proj, k_proj, "
                       "v_proj, o_proj, gate_proj, up_proj, down_proj){}",
                       Printable(name), guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
    }
  }
  hf.lora_target_modules = t.names;
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
      // Trained parameters memsim leaves out: memsim errs low (a few MiB).
      a.WarnNotModelled(key,
                        fmt::format("{}: not modelled (a trained bias of each lora_B, or trained "
                                    "rows of the embedding: a few MiB at most), ignored",
                                    a.At(key)),
                        NotModelled::Direction::kLow, warnings);
    }
  }
}

void ReadLora(ObjectReader& a, TrainingConfig& c, std::vector<std::string>* notes,
              std::vector<std::string>* warnings, LoraModuleMatch* match) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
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
    hf.lora_r = *r;
  } else {
    hf.lora_r = 8;  // LoraConfig.r default
  }
  hf.lora_alpha = a.Number("lora_alpha", 0, 1e9, false, false).value_or(8);
  hf.lora_dropout = a.Number("lora_dropout", 0, 1, false, true).value_or(0.0);
  ReadTargets(a, c, notes, match);
  if (a.Has("exclude_modules")) {
    NamesOrRegex x = ReadNamesOrRegex(a, "exclude_modules");
    match->exclude_names = x.names;
    match->exclude_regex = x.regex;
    match->exclude_where = a.At("exclude_modules");
  }
  // Matched against the model's module names once the model is read (ResolveLoraModules).
  match->save_entries = StringList(a, "modules_to_save");
  match->save_where = a.At("modules_to_save");
  for (const std::string& m : match->save_entries) {
    (void)CompileModuleRegex(SaveExclusionPattern(m), match->save_where);
  }
  // peft/config.py PeftConfig.__post_init__ refuses a task_type outside TaskType
  // (peft/utils/peft_types.py).
  const std::optional<std::string> task = a.Choice(
      "task_type", {"SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS",
                    "FEATURE_EXTRACTION"});
  // PeftModelForSequenceClassification adds its heads to modules_to_save (peft/peft_model.py).
  if (task.value_or("") == "SEQ_CLS") {
    for (const char* m : {"classifier", "score"}) hf.lora_modules_to_save.emplace_back(m);
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

// LLM.int8's own keys (BitsAndBytesConfig): the outlier threshold, the modules kept in 16 bits,
// and the two switches memsim does not model.
void ReadInt8Keys(ObjectReader& q, HfTrainerOptions& hf, std::vector<std::string>* notes) {
  for (const char* key : {"llm_int8_has_fp16_weight", "llm_int8_enable_fp32_cpu_offload"}) {
    if (q.Bool(key).value_or(false)) {
      throw UnsupportedError(fmt::format(
          "{}: {} (not modelled)", q.At(key),
          std::string_view(key) == "llm_int8_has_fp16_weight"
              ? "16-bit weights kept beside their int8 copies (Linear8bitLt has_fp16_weights)"
              : "modules offloaded to the CPU in fp32"));
    }
  }
  // MatMul8bitLt splits off the input columns above the threshold (default 6.0) and keeps them
  // (subA) for backward: data-dependent, a few columns of [T, in].
  const double threshold = q.Number("llm_int8_threshold", 0, 1e9, false, false).value_or(6.0);
  if (hf.load_in_8bit && threshold > 0) {
    notes->push_back(fmt::format("{}: {}: the outlier columns MatMul8bitLt keeps for backward "
                                 "(data-dependent, a few columns of each linear's input) are not "
                                 "modelled",
                                 q.At("llm_int8_threshold"), threshold));
  }
  hf.bnb_skip_modules = StringList(q, "llm_int8_skip_modules");
  if (q.Has("llm_int8_skip_modules") &&
      std::find(hf.bnb_skip_modules.begin(), hf.bnb_skip_modules.end(), "lm_head") ==
          hf.bnb_skip_modules.end()) {
    // transformers' quantizer takes the list instead of its default (get_keys_to_not_convert).
    notes->push_back(fmt::format("{}: without \"lm_head\" transformers quantises lm_head too; "
                                 "memsim keeps it 16-bit (high by its 16-bit bytes)",
                                 q.At("llm_int8_skip_modules")));
  }
}

void ReadQuantization(ObjectReader& q, TrainingConfig& c, std::vector<std::string>* notes) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  q.RejectUnknown({"load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_compute_dtype",
                   "bnb_4bit_use_double_quant", "bnb_4bit_quant_storage", "quant_method",
                   "llm_int8_skip_modules", "llm_int8_threshold", "llm_int8_has_fp16_weight",
                   "llm_int8_enable_fp32_cpu_offload"});
  hf.load_in_8bit = q.Bool("load_in_8bit").value_or(false);
  hf.load_in_4bit = q.Bool("load_in_4bit").value_or(false);
  // BitsAndBytesConfig.post_init refuses both.
  if (hf.load_in_8bit && hf.load_in_4bit) {
    Fail(q.At("load_in_8bit"), "true with load_in_4bit true (BitsAndBytesConfig refuses both)");
  }
  // BitsAndBytesConfig default bnb_4bit_quant_type "fp4"; NF4 and FP4 pack the same way.
  (void)q.Choice("bnb_4bit_quant_type", {"nf4", "fp4"});
  hf.bnb_4bit_use_double_quant = q.Bool("bnb_4bit_use_double_quant").value_or(false);
  // The dtypes BitsAndBytesConfig accepts for bnb_4bit_quant_storage, by element size.
  static const std::vector<std::pair<std::string, Bytes>> kStorage = {
      {"uint8", 1}, {"int8", 1}, {"float16", 2}, {"bfloat16", 2}, {"float32", 4}, {"float64", 8}};
  std::vector<std::string> storage_names;
  for (const auto& [name, bytes] : kStorage) storage_names.push_back(name);
  const std::string storage = q.Choice("bnb_4bit_quant_storage", storage_names).value_or("uint8");
  for (const auto& [name, bytes] : kStorage) {
    if (name == storage) hf.bnb_4bit_quant_storage_bytes = bytes;
  }
  if (std::optional<std::string> d =
          q.Choice("bnb_4bit_compute_dtype", {"float32", "bfloat16", "float16"})) {
    (void)d;  // the dequantised copy takes the activation's dtype (MatMul4Bit: .to(A.dtype))
  }
  ReadInt8Keys(q, hf, notes);
}

// A module of a llama-family causal LM, as model.named_modules() names it.
struct Module {
  std::string name;
  int target = -1;    // index in kTargets for a decoder layer's linear, else -1
  bool head = false;  // lm_head, embed_tokens or a classification head: adaptable, not modelled
  bool holds_layers = false;  // holds decoder-layer linears (the model, a layer, self_attn, mlp)
};

// transformers/models/llama/modeling_llama.py (LlamaForCausalLM: model, lm_head; LlamaModel:
// embed_tokens, layers, norm, rotary_emb; LlamaDecoderLayer: self_attn, mlp, input_layernorm,
// post_attention_layernorm; LlamaMLP: gate_proj, up_proj, down_proj, act_fn); mistral and qwen2
// alike, qwen3's attention adds q_norm and k_norm (modeling_qwen3.py Qwen3Attention). The root
// module ("") is skipped as PEFT's inject_adapter skips it; "score" stands for the head of a
// *ForSequenceClassification model.
std::vector<Module> LlamaModules(const ModelConfig& m) {
  std::vector<Module> out = {{"model", -1, false, true},
                             {"model.embed_tokens", -1, true},
                             {"model.layers", -1, false, true}};
  const bool qk_norm = m.model_type == "qwen3";
  for (int i = 0; i < m.num_hidden_layers; ++i) {
    const std::string layer = fmt::format("model.layers.{}", i);
    out.push_back({layer, -1, false, true});
    out.push_back({layer + ".self_attn", -1, false, true});
    for (int k = 0; k < 4; ++k) out.push_back({layer + ".self_attn." + kTargets[k], k});
    if (qk_norm) {
      out.push_back({layer + ".self_attn.q_norm"});
      out.push_back({layer + ".self_attn.k_norm"});
    }
    out.push_back({layer + ".mlp", -1, false, true});
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

// modules_to_save: PEFT never adapts them nor what is inside them (tuners_utils.py
// check_target_module_exists: re.match(rf"(^|.*\.){m}($|\..*)", key), the entry a regular
// expression; re.match anchors at the start only, as match_continuous does).
bool InModulesToSave(const std::vector<std::regex>& save, const std::string& name,
                     const std::string& where) {
  return std::any_of(save.begin(), save.end(), [&](const std::regex& re) {
    try {
      return std::regex_search(name, re, std::regex_constants::match_continuous);
    } catch (const std::regex_error& e) {
      Fail(where, fmt::format("matching the regular expression failed on '{}' ({})", name, e.what()));
    }
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
  const HfTrainerOptions& hf = HfTrainerOf(c);
  const std::string& where = match.target_where;
  std::optional<std::regex> target, exclude;
  if (match.target_regex) target = CompileModuleRegex(*match.target_regex, match.target_where);
  if (match.exclude_regex) exclude = CompileModuleRegex(*match.exclude_regex, match.exclude_where);
  // The entries written, and the heads PeftModelForSequenceClassification adds (c's).
  std::vector<std::regex> save;
  for (const std::string& m : match.save_entries) {
    save.push_back(CompileModuleRegex(SaveExclusionPattern(m), match.save_where));
  }
  for (const std::string& m : hf.lora_modules_to_save) {
    save.push_back(CompileModuleRegex(SaveExclusionPattern(m), match.save_where));
  }
  Matched out;
  for (const Module& m : LlamaModules(model)) {
    const bool targeted = target ? FullMatch(*target, m.name, match.target_where)
                                 : ListMatches(hf.lora_target_modules, m.name);
    const bool excluded = (exclude && FullMatch(*exclude, m.name, match.exclude_where)) ||
                          ListMatches(match.exclude_names, m.name);
    out.exclude_used |= excluded;
    if (!targeted) continue;
    if (excluded || InModulesToSave(save, m.name, match.save_where)) {
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

// modules_to_save as PEFT's _set_trainable (peft/utils/other.py) wraps them in a
// ModulesToSaveWrapper (a trainable copy of the module): every module whose full name ends with
// an entry, as plain text (key.endswith(target_key): "head" copies lm_head, "embed_tokens" and
// "model.embed_tokens" the embedding). Appends memsim's names of the copies to
// c.lora_modules_to_save. A copy of a decoder layer's module is not modelled (unsupported); of
// norms and other small modules, a warning; an entry that matches no module is ignored, as
// PEFT ignores it, with a warning.
void ResolveModulesToSave(const LoraModuleMatch& match, const ModelConfig& model,
                          TrainingConfig& c, std::vector<std::string>* warnings) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  const std::vector<Module> modules = LlamaModules(model);
  for (const std::string& entry : match.save_entries) {
    std::vector<std::string> unmodelled;
    bool found = false;
    for (const Module& m : modules) {
      if (!m.name.ends_with(entry)) continue;
      found = true;
      const auto savable = std::find_if(std::begin(kSavable), std::end(kSavable),
                                        [&m](const Savable& k) { return k.module == m.name; });
      if (savable != std::end(kSavable)) {
        const std::string saved(savable->saved);
        if (std::find(hf.lora_modules_to_save.begin(), hf.lora_modules_to_save.end(), saved) ==
            hf.lora_modules_to_save.end()) {
          hf.lora_modules_to_save.push_back(saved);
        }
      } else if (m.target >= 0 || m.holds_layers) {
        throw UnsupportedError(fmt::format(
            "{}: '{}' copies module {} (PEFT's _set_trainable copies every module whose name "
            "ends with the entry); a trainable copy of a decoder layer's weights is not modelled",
            match.save_where, Printable(entry), m.name));
      } else if (unmodelled.size() < 3) {
        unmodelled.push_back(m.name);
      } else if (unmodelled.size() == 3) {
        unmodelled.push_back("...");
      }
    }
    if (!found) {
      warnings->push_back(fmt::format(
          "{}: '{}' ends no module name of the model, so PEFT copies nothing for it (module names "
          "look like lm_head, model.embed_tokens, model.layers.0.mlp)",
          match.save_where, Printable(entry)));
    } else if (!unmodelled.empty()) {
      std::string names;
      for (const std::string& n : unmodelled) names += (names.empty() ? "" : ", ") + n;
      warnings->push_back(fmt::format(
          "{}: '{}' copies {} (PEFT's _set_trainable: names ending with the entry); their "
          "trainable copies are not modelled (memsim copies lm_head, model.embed_tokens, score)",
          match.save_where, Printable(entry), names));
    }
  }
}

}  // namespace

void ResolveLoraModules(const LoraModuleMatch& match, const ModelConfig& model,
                        TrainingConfig& c, std::vector<std::string>* warnings) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  const std::string& where = match.target_where;
  // A linear adapted in some layers only, or no module left: named by exclude_modules when it
  // took modules from a list of names (the list itself adapts every layer).
  const bool by_exclude = !match.exclude_where.empty();
  const std::string& narrowed = !match.target_regex && by_exclude ? match.exclude_where : where;
  const Matched matched = MatchModules(match, model, c);
  ResolveModulesToSave(match, model, c, warnings);
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
  hf.lora_target_modules = targets;
}

// prepare_model_for_kbit_training and kbit_modules_recast (setup.h HfTrainerOptions): on by
// default with 4-bit or 8-bit weights (the QLoRA recipe: peft's docs and TRL's SFTTrainer call
// it); without quantised weights peft's function would cast the whole 16-bit model to fp32,
// which memsim does not model (a warning, the key ignored).
void ReadKbitPreparation(ObjectReader& own, TrainingConfig& c, std::vector<std::string>* warnings) {
  HfTrainerOptions& hf = *c.hf_trainer();
  const bool quantised = hf.load_in_4bit || hf.load_in_8bit;
  const std::optional<bool> prepare = own.Bool("prepare_model_for_kbit_training");
  if (prepare.value_or(false) && !quantised) {
    warnings->push_back(fmt::format("{}: without load_in_4bit or load_in_8bit peft casts every "
                                    "16-bit parameter to fp32; not modelled (ignored)",
                                    own.At("prepare_model_for_kbit_training")));
  }
  hf.kbit_prepared = quantised && prepare.value_or(true);
  const std::vector<std::string> recast = StringList(own, "kbit_modules_recast");
  for (const std::string& m : recast) {
    if (m == "norm") {
      hf.kbit_recast_norms = true;
    } else if (m == "embed_tokens") {
      hf.kbit_recast_embed_tokens = true;
    } else if (m == "lm_head") {
      hf.kbit_recast_lm_head = true;
    } else {
      Fail(own.At("kbit_modules_recast"),
           fmt::format("\"{}\": expected \"norm\", \"embed_tokens\" or \"lm_head\"", Printable(m)));
    }
  }
  if (hf.kbit_prepared && c.precision == Precision::kFp32 && hf.torch_dtype != Precision::kFp32) {
    // Without autocast the fp32 embedding and norms carry the whole forward in fp32 (the
    // quantised linears return their input's dtype): memsim models 16-bit activations.
    warnings->push_back(fmt::format("{}: prepare_model_for_kbit_training without bf16 / fp16 "
                                    "autocast runs the forward in fp32; memsim models the "
                                    "activations in torch_dtype (memsim low)",
                                    own.At("quantization_config")));
  }
  if (!recast.empty() && !hf.kbit_prepared) {
    warnings->push_back(fmt::format("{}: no effect without prepare_model_for_kbit_training "
                                    "(the modules are in torch_dtype already)",
                                    own.At("kbit_modules_recast")));
  }
}

void ReadPeft(ObjectReader& own, const Document& config, TrainingConfig& c,
              std::vector<std::string>* notes, std::vector<std::string>* warnings,
              LoraModuleMatch* match) {
  HfTrainerOptions& hf = *c.hf_trainer();  // ReadFromArgs set it
  if (const Json* v = own.Get("adapter_config"); v != nullptr && !v->is_null()) {
    if (v->is_string()) {
      const Document doc = FindReferencedDocument(v->get<std::string>(), own.At("adapter_config"),
                                                   config, "the adapter_config.json", "adapter_config.json");
      const Json json = ParseJson(doc.text, doc.label);
      if (!json.is_object()) Fail(doc.label, fmt::format("expected an object, got {}", Describe(json)));
      // Its field errors join the config's (one run reports them all, Source::field_errors).
      Source source{doc.label, {}, own.source().field_errors, own.source().not_modelled};
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
    ReadQuantization(q, c, notes);
  }
  ReadKbitPreparation(own, c, warnings);
  if ((hf.load_in_4bit || hf.load_in_8bit) && hf.lora_r == 0) {
    notes->push_back(fmt::format("{}: {}-bit weights without an adapter: every weight frozen",
                                 own.At("quantization_config"), hf.load_in_4bit ? 4 : 8));
  }
}

}  // namespace memsim::config::internal
