// adapter_config and quantization_config of an "hf-trainer" block (hf_peft_config.h).
#include "config/hf_peft_config.h"

#include <fmt/core.h>

#include <algorithm>

#include "core/error.h"

namespace memsim::config::internal {
namespace {

constexpr int kMaxLoraRank = 65536;  // 2^16, docs/config.md "Limits"

const std::vector<std::string> kTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};

// LoraConfig fields (peft/tuners/lora/config.py and PeftConfig) read or accepted.
const std::vector<std::string> kLoraKeys = {
    "peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "bias",
    "task_type", "use_dora", "layers_to_transform", "layers_pattern", "rank_pattern",
    "alpha_pattern",
    // no effect on memory
    "base_model_name_or_path", "revision", "inference_mode", "fan_in_fan_out", "init_lora_weights",
    "use_rslora", "auto_mapping", "exclude_modules", "megatron_config", "megatron_core",
    "loftq_config", "layer_replication", "lora_bias", "eva_config", "corda_config",
    "trainable_token_indices", "runtime_config", "target_parameters", "use_qalora",
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

void ReadLora(ObjectReader& a, TrainingConfig& c, std::vector<std::string>* warnings) {
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
  std::vector<std::string> targets = StringList(a, "target_modules");
  if (targets.size() == 1 && targets[0] == "all-linear") targets = kTargets;  // not lm_head
  if (targets.empty()) {
    Fail(a.At("target_modules"), "missing, expected names among q_proj, k_proj, v_proj, o_proj, "
                                 "gate_proj, up_proj, down_proj or \"all-linear\"");
  }
  for (const std::string& t : targets) {
    if (std::find(kTargets.begin(), kTargets.end(), t) == kTargets.end()) {
      const std::string guess = ClosestMatch(t, kTargets);
      Fail(a.At("target_modules"),
           fmt::format("'{}' is not a linear of a llama-family decoder layer (q_proj, k_proj, "
                       "v_proj, o_proj, gate_proj, up_proj, down_proj){}",
                       Printable(t), guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
    }
  }
  c.lora_target_modules = targets;
  c.lora_modules_to_save = StringList(a, "modules_to_save");
  // PeftModelForSequenceClassification adds its heads to modules_to_save (peft/peft_model.py).
  if (a.String("task_type").value_or("") == "SEQ_CLS") {
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
  for (const char* key : {"layers_to_transform", "rank_pattern", "alpha_pattern"}) {
    const Json* v = a.Get(key);
    if (v != nullptr && !v->is_null() && !v->empty()) {
      throw UnsupportedError(fmt::format("{}: per-layer adapters (not modelled)", a.At(key)));
    }
  }
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

}  // namespace

const std::vector<std::string>& LoraTargetNames() { return kTargets; }

void ReadPeft(ObjectReader& own, const Document& config, TrainingConfig& c,
              std::vector<std::string>* notes, std::vector<std::string>* warnings) {
  if (const Json* v = own.Get("adapter_config"); v != nullptr && !v->is_null()) {
    if (v->is_string()) {
      const Document doc = FindReferencedDocument(v->get<std::string>(), own.At("adapter_config"),
                                                   config, "the adapter_config.json");
      const Json json = ParseJson(doc.text, doc.label);
      if (!json.is_object()) Fail(doc.label, fmt::format("expected an object, got {}", Describe(json)));
      Source source{doc.label, {}};
      ObjectReader a(source, json, "");
      ReadLora(a, c, warnings);
    } else if (v->is_object()) {
      ObjectReader a(own.source(), *v, own.PointerOf("adapter_config"));
      ReadLora(a, c, warnings);
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
