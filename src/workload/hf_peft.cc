// PEFT parameter rewrite and kernel rules (hf_peft.h).
#include "workload/hf_peft.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"

namespace memsim::workload {
namespace {

// A targeted Transformers linear: the memsim parameter (suffix after "layer{l}.") that holds
// it and its [in, out] width.
struct Target {
  const char* hf_name;
  const char* memsim_weight;
};
constexpr Target kTargets[] = {
    {"q_proj", "self_attn.q_proj.weight"},   {"k_proj", "self_attn.k_proj.weight"},
    {"v_proj", "self_attn.v_proj.weight"},   {"o_proj", "self_attn.o_proj.weight"},
    {"gate_proj", "mlp.gate_proj.weight"}, {"up_proj", "mlp.up_proj.weight"},
    {"down_proj", "mlp.down_proj.weight"},
};

// in and out features of the HF linear `name` (LlamaAttention / LlamaMLP __init__).
std::pair<std::int64_t, std::int64_t> Widths(const std::string& name, const ModelDims& d) {
  if (name == "q_proj") return {d.h, d.q};
  if (name == "k_proj" || name == "v_proj") return {d.h, d.kv};
  if (name == "o_proj") return {d.q, d.h};
  if (name == "down_proj") return {d.ffn, d.h};
  return {d.h, d.ffn};  // gate_proj, up_proj
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The memsim parameters a modules_to_save name covers: lm_head, embed_tokens, classifier,
// score, pooler.
bool SavedModule(const std::vector<std::string>& modules, const std::string& param) {
  auto starts = [&](const char* p) { return param.rfind(p, 0) == 0; };
  for (const std::string& m : modules) {
    if (m == "lm_head" && starts("output_layer.")) return true;
    if (m == "embed_tokens" && starts("embedding.word_embeddings.")) return true;
    if ((m == "classifier" || m == "score") && starts("classifier.")) return true;
    if (m == "pooler" && starts("pooler.")) return true;
  }
  return false;
}

// The linear weights of a decoder layer: what bitsandbytes replaces with Linear4bit
// (transformers/integrations/bitsandbytes.py replace_with_bnb_linear: every nn.Linear except
// the modules it keeps, lm_head by default).
bool LayerLinearWeight(const ParamTensor& pt) {
  if (pt.layer < 0) return false;
  for (const char* w : {"attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight",
                        "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                        "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                        "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"}) {
    const std::string suffix = std::string(".") + w;
    if (pt.name.size() > suffix.size() &&
        pt.name.compare(pt.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return true;
    }
  }
  return false;
}

// A decoder-layer linear that llm_int8_skip_modules keeps in 16 bits (transformers
// integrations/bitsandbytes.py _replace_with_bnb_linear: the module's own name listed, or a
// listed key found as "key." in its dotted name: "self_attn" keeps q/k/v/o_proj, "mlp" the MLP's).
bool SkippedModule(const std::vector<std::string>& skip, const std::string& param) {
  for (const std::string& key : skip) {
    if (param.find("." + key + ".") != std::string::npos) return true;
  }
  return false;
}

// What peft prepare_model_for_kbit_training leaves in fp32 (config/setup.h
// HfTrainerOptions::kbit_prepared): every 16-bit parameter that is not quantised, unless the
// caller casts its module kind back to torch_dtype afterwards (kbit_recast_*). The norms are
// the parameters named "...norm..." (LlamaRMSNorm weights, Qwen3's q_norm / k_norm, the final
// norm), as TRL and axolotl pick them ("norm" in the module's name).
bool KbitFp32(const config::HfTrainerOptions& tc, const ModelDims& d, const ParamTensor& pt,
              bool quantised) {
  if (!tc.kbit_prepared || quantised || d.param_bytes != 2) return false;
  if (pt.name.find("norm") != std::string::npos) return !tc.kbit_recast_norms;
  if (pt.name.rfind("embedding.", 0) == 0) return !tc.kbit_recast_embed_tokens;
  if (pt.name.rfind("output_layer.", 0) == 0) return !tc.kbit_recast_lm_head;
  return true;  // a bias, or a linear llm_int8_skip_modules keeps in 16 bits
}

}  // namespace

bool KbitWideResidual(const config::TrainingConfig& tc) {
  const config::HfTrainerOptions* h = tc.hf_trainer();
  return h != nullptr && h->kbit_prepared && !h->deepspeed &&
         tc.precision != config::Precision::kFp32 && h->torch_dtype != config::Precision::kFp32 &&
         (!h->kbit_recast_norms || !h->kbit_recast_embed_tokens);
}

bool UsesPeft(const config::TrainingConfig& tc) {
  const config::HfTrainerOptions* h = tc.hf_trainer();
  return h != nullptr && (h->lora_r > 0 || h->load_in_4bit || h->load_in_8bit);
}

Bytes Int8WeightBytes(std::int64_t numel, std::int64_t row_numel) {
  return numel + 4 * (numel / std::max<std::int64_t>(row_numel, 1));
}

Bytes FourBitBytes(std::int64_t numel, bool double_quant, Bytes storage_bytes) {
  const std::int64_t blocks = (numel + 63) / 64;
  const Bytes packed = (numel + 1) / (2 * storage_bytes) * storage_bytes;
  if (!double_quant) return packed + 4 * blocks;
  return packed + blocks + 4 * ((blocks + 255) / 256);
}

std::vector<ParamTensor> ApplyPeft(const config::Setup& setup, const ModelDims& d,
                                   std::vector<ParamTensor> params, PeftKernels* k) {
  const config::HfTrainerOptions& tc = config::HfTrainerOf(setup.training);
  k->r = tc.lora_r;
  k->dropout = tc.lora_dropout > 0.0;
  k->adapter_bytes = 4;
  k->compute_bytes = d.act_bytes;
  // The activations' dtype: autocast's, else the weights' (torch_dtype).
  k->input_fp16 = setup.training.precision == config::Precision::kFp16 ||
                  (setup.training.precision == config::Precision::kFp32 &&
                   tc.torch_dtype == config::Precision::kFp16);
  std::vector<ParamTensor> out;
  std::vector<ParamTensor> saved_copies;
  for (size_t i = 0; i < params.size(); ++i) {
    ParamTensor pt = params[i];
    const bool quantised = LayerLinearWeight(pt) && !SkippedModule(tc.bnb_skip_modules, pt.name);
    if (KbitFp32(tc, d, pt, (tc.load_in_4bit || tc.load_in_8bit) && quantised)) {
      // prepare_model_for_kbit_training: `param.data = param.data.to(torch.float32)`.
      pt.storage_bytes = 4 * pt.numel;
      if (pt.row_numel > 1) k->fp32_weights.insert(pt.name);  // a linear's (or embedding's) matrix
    }
    if (tc.load_in_4bit && quantised) {
      pt.storage_bytes =
          FourBitBytes(pt.numel, tc.bnb_4bit_use_double_quant, tc.bnb_4bit_quant_storage_bytes);
      k->four_bit.insert(pt.name);
    }
    if (tc.load_in_8bit && quantised) {
      pt.storage_bytes = Int8WeightBytes(pt.numel, pt.row_numel);
      k->eight_bit.insert(pt.name);
    }
    const bool save = SavedModule(tc.lora_modules_to_save, pt.name);
    if (tc.lora_r > 0 || tc.load_in_4bit || tc.load_in_8bit) {
      pt.frozen = true;
      k->frozen.insert(pt.name);
    }
    out.push_back(pt);
    if (save) {
      // ModulesToSaveWrapper: the original frozen, a trainable deep copy used in its place.
      ParamTensor copy = params[i];
      k->saved_modules.insert(copy.name);
      copy.name = "modules_to_save." + copy.name;
      saved_copies.push_back(copy);
    }
    // After a layer's last parameter, that layer's adapters (construction order of
    // update_layer: lora_A then lora_B of each targeted module, in the layer's module order).
    const bool layer_ends =
        pt.layer >= 0 && (i + 1 == params.size() || params[i + 1].layer != pt.layer);
    if (!layer_ends || tc.lora_r <= 0) continue;
    for (const Target& t : kTargets) {
      if (!Contains(tc.lora_target_modules, t.hf_name)) continue;
      const auto [in, o] = Widths(t.hf_name, d);
      LoraAdapter a{fmt::format("layer{}.{}.lora_A.weight", pt.layer, t.hf_name),
                    fmt::format("layer{}.{}.lora_B.weight", pt.layer, t.hf_name), in, o};
      const std::int64_t r = tc.lora_r;
      ParamTensor lora_a = MakeParam(a.a_name, r * in, in, pt.chunk, pt.layer, false, false);
      ParamTensor lora_b = MakeParam(a.b_name, o * r, r, pt.chunk, pt.layer, false, false);
      for (ParamTensor* ap : {&lora_a, &lora_b}) {
        ap->storage_bytes = ap->numel * k->adapter_bytes;
        out.push_back(*ap);
      }
      k->adapters[fmt::format("layer{}.{}", pt.layer, t.memsim_weight)].push_back(a);
    }
  }
  out.insert(out.end(), saved_copies.begin(), saved_copies.end());
  return out;
}

}  // namespace memsim::workload
