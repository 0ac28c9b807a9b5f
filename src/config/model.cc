// Hugging Face config.json -> ModelConfig, with the defaults of each supported model_type, and
// the Megatron-LM argument overrides of the training config.
#include <algorithm>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "config/mla.h"
#include "config/moe.h"
#include "config/parts.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// Defaults of the transformers configuration classes (transformers/models/<type>/
// configuration_<type>.py: LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, GPT2Config,
// GemmaConfig, Gemma2Config, Phi3Config, GPTNeoXConfig) and the architecture their modeling
// files hard-code.
struct Family {
  std::string_view model_type;
  int vocab_size;
  int hidden_size;
  int intermediate_size;  // 0 = 4 × hidden_size (GPT2Config n_inner=None)
  int num_hidden_layers;
  int num_attention_heads;
  int num_key_value_heads;  // 0 = num_attention_heads (None in HF)
  int head_dim;             // 0 = hidden_size / num_attention_heads
  int max_position_embeddings;
  bool tie_word_embeddings;
  std::string_view hidden_act;
  bool gated_mlp;        // LlamaMLP-style gate_proj/up_proj/down_proj (modeling code)
  bool layer_norm;       // LayerNorm (GPT-2) rather than RMSNorm
  bool bias_linear;      // biases on every linear layer (GPT-2 Conv1D)
  bool qkv_bias;         // Qwen2Attention: q/k/v projections with bias=True (hard-coded)
  bool qk_norm;          // Qwen3Attention q_norm/k_norm
  bool learned_positions;
  double hidden_dropout;     // GPT2Config resid_pdrop
  double attention_dropout;  // attention_dropout / GPT2Config attn_pdrop
  bool has_attention_bias_key;  // attention_bias key exists (llama, qwen3)
};

constexpr Family kFamilies[] = {
    // LlamaConfig: vocab 32000, hidden 4096, intermediate 11008, 32 layers, 32 heads, kv None,
    // max_position_embeddings 2048, tie False, silu, attention_bias False, mlp_bias False.
    {"llama", 32000, 4096, 11008, 32, 32, 0, 0, 2048, false, "silu", true, false, false, false,
     false, false, 0.0, 0.0, true},
    // MistralConfig: intermediate 14336, kv 8, max_position_embeddings 4096 * 32.
    {"mistral", 32000, 4096, 14336, 32, 32, 8, 0, 131072, false, "silu", true, false, false,
     false, false, false, 0.0, 0.0, false},
    // Qwen2Config: vocab 151936, intermediate 22016, kv 32, max_position_embeddings 32768.
    {"qwen2", 151936, 4096, 22016, 32, 32, 32, 0, 32768, false, "silu", true, false, false, true,
     false, false, 0.0, 0.0, false},
    // Qwen3Config: as Qwen2 plus head_dim 128 and per-head RMSNorm on q and k.
    {"qwen3", 151936, 4096, 22016, 32, 32, 32, 128, 32768, false, "silu", true, false, false,
     false, true, false, 0.0, 0.0, true},
    // MixtralConfig: vocab 32000, hidden 4096, intermediate 14336 (each expert), 32 layers, 32
    // heads, kv 8, max_position_embeddings 4096 * 32, untied (configuration_mixtral.py).
    {"mixtral", 32000, 4096, 14336, 32, 32, 8, 0, 131072, false, "silu", true, false, false,
     false, false, false, 0.0, 0.0, false},
    // Qwen2MoeConfig: vocab 151936, hidden 2048, intermediate 5632, 24 layers, 16 heads, kv 16,
    // max_position_embeddings 32768; q/k/v biases as Qwen2 (configuration_qwen2_moe.py).
    {"qwen2_moe", 151936, 2048, 5632, 24, 16, 16, 0, 32768, false, "silu", true, false, false,
     true, false, false, 0.0, 0.0, false},
    // Qwen3MoeConfig: vocab 151936, hidden 2048, intermediate 6144, 24 layers, 32 heads, kv 4,
    // head_dim 128 (as Qwen3: q/k norms), max_position_embeddings 32768
    // (configuration_qwen3_moe.py).
    {"qwen3_moe", 151936, 2048, 6144, 24, 32, 4, 128, 32768, false, "silu", true, false, false,
     false, true, false, 0.0, 0.0, true},
    // GPT2Config: vocab 50257, n_embd 768, n_layer 12, n_head 12, n_positions 1024, n_inner None,
    // activation_function gelu_new, resid/attn/embd_pdrop 0.1, tied embeddings.
    {"gpt2", 50257, 768, 0, 12, 12, 0, 0, 1024, true, "gelu_new", false, true, true, false, false,
     true, 0.1, 0.1, false},
    // GemmaConfig: vocab 256000, hidden 3072, intermediate 24576, 28 layers, 16 heads, kv 16,
    // head_dim 256, max_position_embeddings 8192, tied, hidden_activation gelu_pytorch_tanh;
    // modeling_gemma.py GemmaMLP is gated (gate_proj, up_proj, down_proj), GemmaRMSNorm.
    {"gemma", 256000, 3072, 24576, 28, 16, 16, 256, 8192, true, "gelu_pytorch_tanh", true, false,
     false, false, false, false, 0.0, 0.0, true},
    // Gemma2Config: vocab 256000, hidden 2304, intermediate 9216, 26 layers, 8 heads, kv 4,
    // head_dim 256, max_position_embeddings 8192, tied; four norms a layer (ReadArchitecture).
    {"gemma2", 256000, 2304, 9216, 26, 8, 4, 256, 8192, true, "gelu_pytorch_tanh", true, false,
     false, false, false, false, 0.0, 0.0, true},
    // Phi3Config: vocab 32064, hidden 3072, intermediate 8192, 32 layers, 32 heads, kv None,
    // max_position_embeddings 4096, untied, silu; modeling_phi3.py fuses qkv_proj and
    // gate_up_proj (gated), no biases, Phi3RMSNorm.
    {"phi3", 32064, 3072, 8192, 32, 32, 0, 0, 4096, false, "silu", true, false, false, false,
     false, false, 0.0, 0.0, false},
    // GPTNeoXConfig: vocab 50432, hidden 6144, intermediate 24576, 44 layers, 64 heads,
    // max_position_embeddings 2048, gelu, untied (embed_out), attention_bias True;
    // modeling_gpt_neox.py: LayerNorm with bias, fused query_key_value with bias, dense,
    // dense_h_to_4h / dense_4h_to_h with bias, rotary positions.
    {"gpt_neox", 50432, 6144, 24576, 44, 64, 0, 0, 2048, false, "gelu", false, true, true, false,
     false, false, 0.0, 0.0, false},
    // BertConfig (transformers/models/bert/configuration_bert.py): vocab 30522, hidden 768,
    // 12 layers, 12 heads, intermediate 3072, gelu, hidden_dropout_prob and
    // attention_probs_dropout_prob 0.1, max_position_embeddings 512; modeling_bert.py: LayerNorm,
    // biases on every nn.Linear, absolute learned positions. The encoder pieces (token types,
    // embedding LayerNorm, classification head) are read by ReadEncoder.
    {"bert", 30522, 768, 3072, 12, 12, 0, 0, 512, true, "gelu", false, true, true, false, false,
     true, 0.1, 0.1, false},
    // RobertaConfig: vocab 50265 in roberta-base's config.json (the class default is BertConfig's
    // 30522), max_position_embeddings 514; modeling_roberta.py is BERT's code with a
    // RobertaClassificationHead (dense + tanh + out_proj) instead of pooler + classifier, the
    // same parameters.
    {"roberta", 50265, 768, 3072, 12, 12, 0, 0, 514, true, "gelu", false, true, true, false, false,
     true, 0.1, 0.1, false},
    // DeepseekV3Config (configuration_deepseek_v3.py at 001f85b3): vocab 129280, hidden 7168,
    // intermediate 18432 (the dense layers' MLP), 61 layers, 128 heads, max_position_embeddings
    // 4096, untied, silu; the attention and MoE keys are read by ReadHfDeepseek (mla.h).
    {"deepseek_v3", 129280, 7168, 18432, 61, 128, 128, 0, 4096, false, "silu", true, false, false,
     false, false, false, 0.0, 0.0, false},
    // DeepseekV2Config (configuration_deepseek_v2.py at 008e5743): vocab 32000, hidden 4096,
    // intermediate 11008, 32 layers, 32 heads, max_position_embeddings 2048, untied, silu.
    {"deepseek_v2", 32000, 4096, 11008, 32, 32, 0, 0, 2048, false, "silu", true, false, false,
     false, false, false, 0.0, 0.0, false},
};

// Model types memsim recognises but does not model.
struct Unmodelled {
  std::string_view model_type;
  std::string_view why;
};
constexpr Unmodelled kUnmodelled[] = {
    {"t5", "encoder-decoder model_type 't5'"},
};

// Expert-count keys of HF configs (MixtralConfig num_local_experts, Qwen2MoeConfig num_experts,
// DeepseekV3Config n_routed_experts).
constexpr std::string_view kExpertKeys[] = {"num_local_experts", "num_experts", "n_routed_experts",
                                            "moe_num_experts"};

// The activation names Hugging Face accepts for hidden_act / activation_function: the keys of
// ACT2CLS in transformers/activations.py (ACT2FN looks names up there and raises KeyError on any
// other). memsim's memory model does not depend on the activation, but a name transformers would
// reject means a broken file.
const std::vector<std::string> kActivations = {
    "gelu",      "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
    "gelu_accurate", "laplace", "leaky_relu", "linear", "mish", "quick_gelu", "relu", "relu2",
    "relu6",     "sigmoid", "silu",      "swish",    "tanh",        "prelu"};

std::string Known() {
  std::string out;
  for (const Family& f : kFamilies) out += (out.empty() ? "'" : ", '") + std::string(f.model_type) + "'";
  return out;
}

// The model_type's family. Throws UnsupportedError for expert counts in files of a dense
// model_type (whatever else they say) and for the model types memsim recognises but does not model.
const Family& FindFamily(ObjectReader& r) {
  const std::optional<std::string> declared = r.String("model_type");
  for (std::string_view key : kExpertKeys) {
    if (declared && (IsMoeModelType(*declared) || IsDeepseekModelType(*declared))) break;
    if (const Json* v = r.Get(key); v != nullptr && v->is_number() && v->get<double>() > 1) {
      throw UnsupportedError(fmt::format("{}: mixture of experts ({} experts) in a model_type "
                                         "'{}' file; memsim reads the experts of 'mixtral', "
                                         "'qwen2_moe', 'qwen3_moe', 'deepseek_v2' and "
                                         "'deepseek_v3' files",
                                         r.At(key), Describe(*v), Printable(declared.value_or(""))));
    }
  }
  std::vector<std::string> types;
  for (const Family& f : kFamilies) types.emplace_back(f.model_type);
  std::optional<std::string> type = r.String("model_type");
  if (!type) Fail(r.At("model_type"), fmt::format("missing key, expected one of {}", Known()));
  for (const Unmodelled& u : kUnmodelled) {
    if (*type == u.model_type) throw UnsupportedError(fmt::format("{}: {}", r.At("model_type"), u.why));
  }
  for (const Family& f : kFamilies) {
    if (f.model_type == *type) return f;
  }
  std::string message = fmt::format("unknown model_type \"{}\", expected one of {}",
                                    Printable(*type), Known());
  const std::string guess = ClosestMatch(*type, types);
  if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
  Fail(r.At("model_type"), message);
}

// The sizes: widths, heads, layers, positions, vocabulary; absent keys take the family's default
// (with a note). GPT-2 names its keys n_embd, n_layer, n_head, n_positions, n_inner; hidden_size
// etc. map onto them (GPT2Config.attribute_map). A file giving both must agree.
void ReadSizes(ObjectReader& r, const Family& fam, LocatedModel& out,
               std::vector<std::string>* notes) {
  ModelConfig& m = out.model;
  const bool gpt2 = m.model_type == "gpt2";
  auto note_where = [&](const std::string& field, std::string_view key) {
    out.where[field] = r.At(key);
  };
  auto read_int = [&](const char* field, std::string_view hf_key, std::string_view gpt2_key,
                      int fallback, int* dst) {
    std::optional<int> a = r.PositiveInt(hf_key);
    std::optional<int> b;
    if (gpt2 && !gpt2_key.empty()) b = r.PositiveInt(gpt2_key);
    if (a && b && *a != *b) {
      Fail(r.At(hf_key), fmt::format("{} disagrees with {} = {}", *a, gpt2_key, *b));
    }
    const std::string_view key = b ? gpt2_key : a ? hf_key : gpt2 && !gpt2_key.empty() ? gpt2_key : hf_key;
    *dst = b ? *b : a ? *a : fallback;
    note_where(field, key);
    if (!a && !b) {
      notes->push_back(fmt::format("{}: absent, {} default {} taken", r.At(key), m.model_type, fallback));
    }
  };
  read_int("hidden_size", "hidden_size", "n_embd", fam.hidden_size, &m.hidden_size);
  read_int("num_hidden_layers", "num_hidden_layers", "n_layer", fam.num_hidden_layers,
           &m.num_hidden_layers);
  read_int("num_attention_heads", "num_attention_heads", "n_head", fam.num_attention_heads,
           &m.num_attention_heads);
  read_int("max_position_embeddings", "max_position_embeddings", "n_positions",
           fam.max_position_embeddings, &m.max_position_embeddings);
  read_int("vocab_size", "vocab_size", "", fam.vocab_size, &m.vocab_size);
  // intermediate_size: GPT-2's n_inner (None = 4 × n_embd); intermediate_size is accepted for
  // GPT-2 files as memsim's alias when n_inner is absent or null.
  read_int("intermediate_size", "intermediate_size", "n_inner",
           fam.intermediate_size != 0 ? fam.intermediate_size : 4 * m.hidden_size,
           &m.intermediate_size);

  if (std::optional<int> kv = r.PositiveInt("num_key_value_heads")) {
    m.num_key_value_heads = *kv;
  } else {
    m.num_key_value_heads = fam.num_key_value_heads != 0 ? fam.num_key_value_heads
                                                         : m.num_attention_heads;
  }
  note_where("num_key_value_heads", "num_key_value_heads");
  if (std::optional<int> hd = r.PositiveInt("head_dim")) {
    m.head_dim = *hd;
  } else if (fam.head_dim != 0) {
    m.head_dim = fam.head_dim;
  } else {
    if (m.hidden_size % m.num_attention_heads != 0) {
      Fail(out.where["hidden_size"],
           fmt::format("hidden_size {} is not divisible by num_attention_heads {} (set head_dim)",
                       m.hidden_size, m.num_attention_heads));
    }
    m.head_dim = m.hidden_size / m.num_attention_heads;
  }
  note_where("head_dim", "head_dim");
}

// What gemma, gemma2, phi3 and gpt_neox add to the Llama / GPT-2 layouts: flags the modules
// read, and one warning per feature whose memory memsim does not model.
void ReadFamilyExtras(ObjectReader& r, LocatedModel& out) {
  ModelConfig& m = out.model;
  auto warn = [&](std::string_view key, const std::string& what, NotModelled::Direction errs) {
    r.WarnNotModelled(key, fmt::format("{}: {} not modelled", r.At(key), what), errs,
                      &out.warnings);
  };
  const auto set = [&](std::string_view key) {
    const Json* v = r.Get(key);
    return v != nullptr && !v->is_null() && !(v->is_boolean() && !v->get<bool>());
  };
  if (m.model_type == "gemma" || m.model_type == "gemma2") {
    // GemmaModel.forward scales the embeddings by sqrt(hidden_size) (one more [b, s, h]
    // tensor), and GemmaRMSNorm multiplies by (1 + weight) in fp32 before casting back.
    // Both hold one tensor more than memsim's Llama layers: memsim errs low.
    r.WarnNotModelled(
        "model_type",
        fmt::format("{}: \"{}\": GemmaRMSNorm (its fp32 (1 + weight) product) is modelled as "
                    "LlamaRMSNorm and the embedding's sqrt(hidden_size) scaling is not modelled",
                    r.At("model_type"), m.model_type),
        NotModelled::Direction::kLow, &out.warnings);
  }
  if (m.model_type == "gemma2") {
    m.sandwich_norms = true;
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
      // The tanh's output is one more [b, heads, s, s] or [b, s, vocab] tensor: memsim low.
      if (set(key)) {
        warn(key, "soft-capping (a tanh over the attention scores or the logits):",
             NotModelled::Direction::kLow);
      }
    }
    (void)r.Get("sliding_window");  // no memory effect with sdpa / flash
    (void)r.Get("query_pre_attn_scalar");
  }
  if (m.model_type == "phi3") m.fused_projections = true;
  if (m.model_type == "gpt_neox") {
    if (r.Bool("attention_bias").value_or(true) == false) {
      throw UnsupportedError(fmt::format("{}: false (memsim models gpt_neox with biases on every "
                                         "linear, GPTNeoXConfig's default)",
                                         r.At("attention_bias")));
    }
    if (r.Bool("use_parallel_residual").value_or(true)) {  // GPTNeoXConfig's default
      warn("use_parallel_residual", "true (or absent: GPTNeoXConfig's default): the parallel "
                                    "residual x + attn(ln1(x)) + mlp(ln2(x)) (memsim runs the "
                                    "sequential layer, with the same parameters):",
           NotModelled::Direction::kEither);
    }
    (void)r.Number("rotary_pct", 0, 1, false, false);  // partial rotary: no saved tensor of its own
    m.hidden_dropout = r.Number("hidden_dropout", 0, 1, false, true).value_or(0.0);
  }
}

// The architecture the family's modeling code fixes, and the keys that vary it: tied embeddings,
// activation, biases, positions, dropout.
void ReadArchitecture(ObjectReader& r, const Family& fam, LocatedModel& out,
                      std::vector<std::string>* notes) {
  ModelConfig& m = out.model;
  const bool gpt2 = m.model_type == "gpt2";
  m.tie_word_embeddings = r.Bool("tie_word_embeddings").value_or(fam.tie_word_embeddings);
  out.where["tie_word_embeddings"] = r.At("tie_word_embeddings");
  {
    std::optional<std::string> act = r.Choice("hidden_act", kActivations);
    std::optional<std::string> act2;
    if (gpt2) act2 = r.Choice("activation_function", kActivations);
    // GemmaConfig / Gemma2Config: hidden_activation is what GemmaMLP uses (hidden_act is kept
    // for older files only).
    if (m.model_type == "gemma" || m.model_type == "gemma2") {
      act2 = r.Choice("hidden_activation", kActivations);
      if (act && act2 && *act != *act2) act.reset();
    }
    if (act && act2 && *act != *act2) {
      Fail(r.At("hidden_act"), fmt::format("\"{}\" disagrees with activation_function \"{}\"",
                                           *act, *act2));
    }
    m.hidden_act = act2 ? *act2 : act ? *act : std::string(fam.hidden_act);
  }
  // The MLP shape follows the family's modeling code: LlamaMLP/Qwen2MLP/MistralMLP always have
  // gate_proj (with hidden_act silu: SwiGLU); GPT2MLP never does.
  m.gated_mlp = fam.gated_mlp;
  m.normalization = fam.layer_norm ? Normalization::kLayerNorm : Normalization::kRMSNorm;
  m.add_bias_linear = fam.bias_linear;
  m.add_qkv_bias = fam.qkv_bias;
  if (fam.has_attention_bias_key) {
    // LlamaAttention / Qwen3Attention: attention_bias puts biases on q, k, v and o.
    if (r.Bool("attention_bias").value_or(false)) m.add_qkv_bias = true;
  }
  if (m.model_type == "llama" && r.Bool("mlp_bias").value_or(false)) m.add_bias_linear = true;
  m.qk_layernorm = fam.qk_norm;
  m.position_embedding_type =
      fam.learned_positions ? PositionEmbedding::kLearnedAbsolute : PositionEmbedding::kRope;
  if (gpt2) {
    m.hidden_dropout = r.Number("resid_pdrop", 0, 1, false, true).value_or(fam.hidden_dropout);
    m.attention_dropout = r.Number("attn_pdrop", 0, 1, false, true).value_or(fam.attention_dropout);
  } else {
    m.hidden_dropout = fam.hidden_dropout;
    m.attention_dropout =
        r.Number("attention_dropout", 0, 1, false, true).value_or(fam.attention_dropout);
  }
  m.num_experts = 0;
  if (IsMoeModelType(m.model_type)) ReadHfMoe(r, out, notes);
  if (IsDeepseekModelType(m.model_type)) ReadHfDeepseek(r, out, notes);
  ReadFamilyExtras(r, out);
}

// The encoder pieces of model_type bert / roberta (modeling_bert.py BertEmbeddings,
// BertForSequenceClassification): hidden_dropout_prob and attention_probs_dropout_prob,
// token types, and the head named by `architectures` (only *ForSequenceClassification is
// modelled; num_labels from num_labels or id2label, PretrainedConfig's default 2).
void ReadEncoder(ObjectReader& r, LocatedModel& out) {
  ModelConfig& m = out.model;
  if (m.model_type != "bert" && m.model_type != "roberta") return;
  m.hidden_dropout = r.Number("hidden_dropout_prob", 0, 1, false, true).value_or(0.1);
  m.attention_dropout = r.Number("attention_probs_dropout_prob", 0, 1, false, true).value_or(0.1);
  (void)r.Number("classifier_dropout", 0, 1, false, true);  // a [b, h] mask: not emitted
  if (std::optional<std::string> p = r.String("position_embedding_type"); p && *p != "absolute") {
    throw UnsupportedError(fmt::format("{}: position_embedding_type \"{}\" (memsim models "
                                       "\"absolute\")",
                                       r.At("position_embedding_type"), Printable(*p)));
  }
  m.type_vocab_size = r.PositiveInt("type_vocab_size").value_or(2);
  m.sequence_classification = true;
  if (const Json* a = r.Get("architectures"); a != nullptr && a->is_array() && !a->empty() &&
                                              (*a)[0].is_string()) {
    const std::string arch = (*a)[0].get<std::string>();
    if (arch.find("ForSequenceClassification") == std::string::npos) {
      throw UnsupportedError(fmt::format("{}: head '{}' (memsim models the encoder with a "
                                         "*ForSequenceClassification head)",
                                         r.At("architectures"), Printable(arch)));
    }
  }
  if (std::optional<int> n = r.PositiveInt("num_labels")) {
    m.num_labels = *n;
  } else if (const Json* ids = r.Get("id2label"); ids != nullptr && ids->is_object() && !ids->empty()) {
    m.num_labels = static_cast<int>(ids->size());
  }
  (void)r.Get("label2id");
}

}  // namespace

LocatedModel ReadHfModel(const Source& source, const Json& object, const std::string& pointer,
                         std::vector<std::string>* notes, std::vector<std::string>* warnings) {
  ObjectReader r(source, object, pointer);
  LocatedModel out;
  const Family& fam = FindFamily(r);
  out.model.model_type = std::string(fam.model_type);
  ReadSizes(r, fam, out, notes);
  ReadArchitecture(r, fam, out, notes);
  ReadEncoder(r, out);
  for (const std::string& key : r.Unread()) {
    if (const std::string guess = r.NearMiss(key); !guess.empty()) {
      warnings->push_back(fmt::format("{}: not a key memsim reads, ignored (did you mean '{}'? "
                                      "its default is taken)",
                                      r.At(key), guess));
    } else {
      notes->push_back(fmt::format("{}: ignored (not used by memsim)", r.At(key)));
    }
  }
  return out;
}

namespace {
const std::vector<std::string> kArchKeys = {
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "group_query_attention", "kv_channels", "max_position_embeddings", "vocab_size", "swiglu",
    "normalization", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "position_embedding_type",
    "untie_embeddings_and_output_weights", "make_vocab_size_divisible_by", "hidden_dropout",
    "attention_dropout", "num_experts"};
}  // namespace

const std::vector<std::string>& MegatronArchitectureKeys() { return kArchKeys; }

void ApplyMegatronArchitecture(ObjectReader& t, LocatedModel* located,
                               std::vector<std::string>* notes) {
  ModelConfig& m = located->model;
  auto set_int = [&](std::string_view key, const char* field, int* dst) {
    if (std::optional<int> v = t.PositiveInt(key)) {
      if (*dst != *v) {
        notes->push_back(fmt::format("{}: {} overrides the model's {} = {}", t.At(key), *v, field, *dst));
      }
      *dst = *v;
      located->where[field] = t.At(key);
    }
  };
  const int old_hidden = m.hidden_size;
  const int old_heads = m.num_attention_heads;
  set_int("num_layers", "num_hidden_layers", &m.num_hidden_layers);
  set_int("hidden_size", "hidden_size", &m.hidden_size);
  set_int("ffn_hidden_size", "intermediate_size", &m.intermediate_size);
  set_int("num_attention_heads", "num_attention_heads", &m.num_attention_heads);
  set_int("max_position_embeddings", "max_position_embeddings", &m.max_position_embeddings);
  set_int("vocab_size", "vocab_size", &m.vocab_size);
  // A changed width or head count re-derives kv_channels (Megatron: hidden_size //
  // num_attention_heads when --kv-channels is not given) unless kv_channels is set.
  if ((m.hidden_size != old_hidden || m.num_attention_heads != old_heads) && !t.Has("kv_channels")) {
    if (m.hidden_size % m.num_attention_heads != 0) {
      Fail(located->where["hidden_size"],
           fmt::format("hidden_size {} is not divisible by num_attention_heads {} (set kv_channels)",
                       m.hidden_size, m.num_attention_heads));
    }
    m.head_dim = m.hidden_size / m.num_attention_heads;
    located->where["head_dim"] = located->where["hidden_size"];
  }
  set_int("kv_channels", "head_dim", &m.head_dim);
  // Megatron: num_query_groups is used only with --group-query-attention; without it, MHA.
  std::optional<bool> gqa = t.Bool("group_query_attention");
  if (t.Has("num_query_groups") && gqa.has_value() && !*gqa) {
    Fail(t.At("num_query_groups"), "needs group_query_attention true (Megatron ignores it otherwise)");
  }
  if (gqa.has_value() && !*gqa) {
    m.num_key_value_heads = m.num_attention_heads;
    located->where["num_key_value_heads"] = t.At("group_query_attention");
  } else if (m.num_attention_heads != old_heads && m.num_key_value_heads == old_heads &&
             !t.Has("num_query_groups")) {
    m.num_key_value_heads = m.num_attention_heads;  // MHA stays MHA when heads change
  }
  set_int("num_query_groups", "num_key_value_heads", &m.num_key_value_heads);
  if (std::optional<bool> sw = t.Bool("swiglu")) {
    m.gated_mlp = *sw;
    if (*sw) {
      m.hidden_act = "silu";
    } else if (m.hidden_act == "silu") {
      m.hidden_act = "gelu";  // Megatron's activation without --swiglu (TransformerConfig)
    }
  }
  if (std::optional<std::string> n = t.Choice("normalization", {"LayerNorm", "RMSNorm"})) {
    m.normalization = *n == "LayerNorm" ? Normalization::kLayerNorm : Normalization::kRMSNorm;
  }
  if (std::optional<bool> b = t.Bool("add_bias_linear")) m.add_bias_linear = *b;
  if (std::optional<bool> b = t.Bool("add_qkv_bias")) m.add_qkv_bias = *b;
  if (std::optional<bool> b = t.Bool("qk_layernorm")) m.qk_layernorm = *b;
  if (std::optional<std::string> p =
          t.Choice("position_embedding_type", {"rope", "learned_absolute", "none"})) {
    m.position_embedding_type = *p == "rope"               ? PositionEmbedding::kRope
                                : *p == "learned_absolute" ? PositionEmbedding::kLearnedAbsolute
                                                           : PositionEmbedding::kNone;
  }
  if (std::optional<bool> u = t.Bool("untie_embeddings_and_output_weights")) {
    m.tie_word_embeddings = !*u;
  }
  if (std::optional<int> d = t.PositiveInt("make_vocab_size_divisible_by")) {
    m.make_vocab_size_divisible_by = *d;
  }
  if (std::optional<double> d = t.Number("hidden_dropout", 0, 1, false, true)) m.hidden_dropout = *d;
  if (std::optional<double> d = t.Number("attention_dropout", 0, 1, false, true)) {
    m.attention_dropout = *d;
  }
  ApplyMegatronMla(t, located, notes);
  ApplyMegatronMoe(t, located, notes);
}

}  // namespace memsim::config::internal
