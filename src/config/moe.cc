// Mixture-of-experts keys: the MoE fields of Hugging Face config.json files (Mixtral, Qwen2-MoE,
// Qwen3-MoE), the Megatron architecture arguments that override them, and the Megatron MoE
// runtime arguments of the training block (docs/config.md "Mixture of experts").
#include "config/moe.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/core.h>

#include "config/stack.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// Megatron `--moe-layer-freq` (TransformerConfig moe_layer_freq, read by
// megatron/core/models/gpt/gpt_layer_specs.py get_gpt_decoder_layer_specs, Megatron-LM
// d98e8a64 line 647): an int N makes layer i (0-based) an MoE layer when Python's i % N == 0,
// which for a negative N (MindSpeed-LLM's `--moe-layer-freq -1`) is when |N| divides i, so -1
// makes every layer MoE; a list gives 1 (MoE) or 0 (dense) per layer. MindSpeed-LLM's
// `--first-k-dense-replace K` (mindspeed_llm/core/transformer/transformer_block.py
// _transformer_block_build_layers, MindSpeed-LLM 927a8d93 lines 112-120) applies when K is not 0
// and the frequency is given: layer i is MoE only if also i >= K (K = -1: no dense layer).
std::vector<bool> MegatronLayerPattern(ObjectReader& t, int layers) {
  const Json* v = t.Get("moe_layer_freq");
  std::vector<bool> out;
  if (v->is_array()) {
    if (static_cast<int>(v->size()) != layers) {
      Fail(t.At("moe_layer_freq"),
           fmt::format("a list of {} entries (one per layer) expected, got {}", layers, v->size()));
    }
    for (const Json& e : *v) {
      if (!e.is_number_integer() || (e.get<int>() != 0 && e.get<int>() != 1)) {
        Fail(t.At("moe_layer_freq"), "list entries must be 0 (dense) or 1 (MoE)");
      }
      out.push_back(e.get<int>() == 1);
    }
  } else {
    if (!v->is_number_integer() || v->get<std::int64_t>() == 0 ||
        v->get<std::int64_t>() < -(1 << 20) || v->get<std::int64_t>() > (1 << 20)) {
      Fail(t.At("moe_layer_freq"), "expected a non-zero integer or a list of 0/1 per layer");
    }
    const int n = std::abs(v->get<int>());
    for (int i = 0; i < layers; ++i) out.push_back(i % n == 0);
  }
  const Json* k = t.Get("first_k_dense_replace");
  if (k == nullptr) return out;
  if (!k->is_number_integer() || k->get<std::int64_t>() < -1 || k->get<std::int64_t>() >= layers) {
    // mindspeed_llm/training/arguments.py _validate_transformer_block_build_layers: K < layers.
    Fail(t.At("first_k_dense_replace"),
         fmt::format("expected an integer from -1 to {} (fewer than the {} layers)", layers - 1,
                     layers));
  }
  for (int i = 0; i < std::min(k->get<int>(), layers); ++i) out[static_cast<size_t>(i)] = false;
  return out;
}

}  // namespace

bool IsMoeModelType(std::string_view model_type) {
  return model_type == "mixtral" || model_type == "qwen2_moe" || model_type == "qwen3_moe";
}

void ReadHfMoe(ObjectReader& r, LocatedModel& out, std::vector<std::string>* notes) {
  ModelConfig& m = out.model;
  const bool mixtral = m.model_type == "mixtral";
  // MixtralConfig: num_local_experts 8, num_experts_per_tok 2 (configuration_mixtral.py).
  // Qwen2MoeConfig: num_experts 60, num_experts_per_tok 4, moe_intermediate_size 1408,
  // shared_expert_intermediate_size 5632, decoder_sparse_step 1, mlp_only_layers [].
  // Qwen3MoeConfig: num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768, no
  // shared expert (configuration_qwen3_moe.py).
  const bool qwen2 = m.model_type == "qwen2_moe";
  const char* experts_key = mixtral ? "num_local_experts" : "num_experts";
  m.num_experts = r.PositiveInt(experts_key).value_or(mixtral ? 8 : qwen2 ? 60 : 128);
  m.moe_router_topk = r.PositiveInt("num_experts_per_tok").value_or(mixtral ? 2 : qwen2 ? 4 : 8);
  out.where["num_experts"] = r.At(experts_key);
  out.where["moe_router_topk"] = r.At("num_experts_per_tok");
  if (m.moe_router_topk > m.num_experts) {
    Fail(r.At("num_experts_per_tok"), fmt::format("{} exceeds the {} experts", m.moe_router_topk,
                                                  m.num_experts));
  }
  if (mixtral) {
    // MixtralBlockSparseTop2MLP: every expert is intermediate_size wide; every layer is MoE.
    m.moe_ffn_hidden_size = m.intermediate_size;
    r.Skip("moe_intermediate_size");  // written by some Mixtral-style files; Mixtral ignores it
  } else {
    m.moe_ffn_hidden_size = r.PositiveInt("moe_intermediate_size").value_or(qwen2 ? 1408 : 768);
    out.where["moe_ffn_hidden_size"] = r.At("moe_intermediate_size");
    if (qwen2) {
      // Qwen2MoeSparseMoeBlock: shared_expert (a Qwen2MoeMLP) and shared_expert_gate [1, h].
      m.moe_shared_expert_intermediate_size =
          r.NonNegativeInt("shared_expert_intermediate_size").value_or(5632);
      m.moe_shared_expert_gate = m.moe_shared_expert_intermediate_size > 0;
    }
    // Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer i is sparse when i is not in
    // mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    const int step = r.PositiveInt("decoder_sparse_step").value_or(1);
    std::vector<bool> pattern(m.num_hidden_layers);
    for (int i = 0; i < m.num_hidden_layers; ++i) pattern[i] = (i + 1) % step == 0;
    if (const Json* only = r.Get("mlp_only_layers"); only != nullptr && !only->is_null()) {
      if (!only->is_array()) Fail(r.At("mlp_only_layers"), "a list of layer indices expected");
      for (const Json& e : *only) {
        if (!e.is_number_integer() || e.get<int>() < 0 || e.get<int>() >= m.num_hidden_layers) {
          Fail(r.At("mlp_only_layers"),
               fmt::format("entries must be layer indices in [0, {})", m.num_hidden_layers));
        }
        pattern[e.get<int>()] = false;
      }
    }
    m.moe_layer_pattern = pattern;
  }
  // norm_topk_prob renormalises the top-k weights: arithmetic only, no tensor of its own.
  if (r.Has("norm_topk_prob")) {
    r.Bool("norm_topk_prob");
    notes->push_back(fmt::format("{}: accepted, no effect on memory", r.At("norm_topk_prob")));
  }
  for (const char* key : {"router_aux_loss_coef", "output_router_logits", "router_jitter_noise"}) {
    if (r.Has(key)) {
      r.Skip(key);
      notes->push_back(fmt::format("{}: accepted, no effect on memory (the training block's "
                                   "moe_aux_loss_coeff sets Megatron's auxiliary loss)",
                                   r.At(key)));
    }
  }
}

const std::vector<std::string>& MegatronMoeArchitectureKeys() {
  static const std::vector<std::string> keys = {
      "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
      "moe_layer_freq", "first_k_dense_replace", "n_shared_experts", "moe_shared_expert_gate"};
  return keys;
}

void ApplyMegatronMoe(ObjectReader& t, LocatedModel* located, std::vector<std::string>* notes) {
  ModelConfig& m = located->model;
  if (std::optional<int> e = t.NonNegativeInt("num_experts")) {
    m.num_experts = *e;
    located->where["num_experts"] = t.At("num_experts");
  }
  if (std::optional<int> k = t.PositiveInt("moe_router_topk")) {
    m.moe_router_topk = *k;
    located->where["moe_router_topk"] = t.At("moe_router_topk");
  }
  if (std::optional<int> f = t.PositiveInt("moe_ffn_hidden_size")) {
    m.moe_ffn_hidden_size = *f;
    located->where["moe_ffn_hidden_size"] = t.At("moe_ffn_hidden_size");
  }
  if (std::optional<int> s = t.NonNegativeInt("moe_shared_expert_intermediate_size")) {
    m.moe_shared_expert_intermediate_size = *s;
  }
  if (std::optional<bool> g = t.Bool("moe_shared_expert_gate")) m.moe_shared_expert_gate = *g;
  if (t.Has("moe_layer_freq")) {
    m.moe_layer_pattern = MegatronLayerPattern(t, m.num_hidden_layers);
  } else if (t.Has("first_k_dense_replace")) {
    // transformer_block.py:113-115: without a frequency MindSpeed-LLM leaves the layers alone.
    t.Skip("first_k_dense_replace");
    notes->push_back(fmt::format("{}: ignored without moe_layer_freq (MindSpeed-LLM's "
                                 "_transformer_block_build_layers)",
                                 t.At("first_k_dense_replace")));
  }
  if (m.num_experts <= 1) {
    for (const auto* keys : {&MegatronMoeArchitectureKeys(), &MoeTrainingKeys()}) {
      for (const std::string& key : *keys) {
        if (t.Has(key)) notes->push_back(fmt::format("{}: ignored (dense model)", t.At(key)));
      }
    }
    return;
  }
  // Megatron: moe_ffn_hidden_size defaults to ffn_hidden_size (arguments.py validate_args,
  // d98e8a64 line 1651).
  if (m.moe_ffn_hidden_size == 0) m.moe_ffn_hidden_size = m.intermediate_size;
  // MindSpeed-LLM's --n-shared-experts N: one shared expert N × moe_ffn_hidden_size wide
  // unless moe_shared_expert_intermediate_size is given
  // (mindspeed_llm/features_manager/moe/shared_expert.py validate_args, 927a8d93 lines 16-18).
  if (std::optional<int> n = t.NonNegativeInt("n_shared_experts");
      n && !t.Has("moe_shared_expert_intermediate_size")) {
    m.moe_shared_expert_intermediate_size = *n * m.moe_ffn_hidden_size;
  }
  if (m.moe_router_topk > m.num_experts) {
    Fail(located->where["moe_router_topk"],
         fmt::format("{} exceeds num_experts {}", m.moe_router_topk, m.num_experts));
  }
  if (!m.moe_layer_pattern.empty() &&
      static_cast<int>(m.moe_layer_pattern.size()) != m.num_hidden_layers) {
    // num_layers changed after the HF file's pattern was made: Megatron's default (every layer).
    m.moe_layer_pattern.assign(m.num_hidden_layers, true);
  }
}

const std::vector<std::string>& MoeTrainingKeys() {
  static const std::vector<std::string> keys = {
      "moe_token_dispatcher_type", "moe_aux_loss_coeff", "moe_permute_fusion",
      "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_grouped_gemm",
      "moe_imbalance_factor", "moe_enable_deepep", "moe_router_pre_softmax"};
  return keys;
}

void ReadMoeTraining(ObjectReader& t, TrainingConfig& c) {
  c.expert_model_parallel_size = t.PositiveInt("expert_model_parallel_size").value_or(1);
  c.expert_tensor_parallel_size = t.PositiveInt("expert_tensor_parallel_size").value_or(0);
  if (std::optional<std::string> d =
          t.Choice("moe_token_dispatcher_type", {"allgather", "alltoall", "alltoall_seq", "flex"})) {
    if (*d == "flex") {
      throw UnsupportedError(fmt::format("{}: the flex dispatcher (DeepEP / HybridEP)",
                                         t.At("moe_token_dispatcher_type")));
    }
    // alltoall_seq: Megatron-core's MoEAlltoAllSEQTokenDispatcher (core 0.8-0.11, MindSpeed-LLM
    // scripts), the alltoall dispatcher's tensors over the sequence-parallel split.
    c.moe_token_dispatcher_type = *d == "alltoall_seq" ? "alltoall" : *d;
  }
  if (t.Bool("moe_enable_deepep").value_or(false)) {
    throw UnsupportedError(fmt::format("{}: DeepEP dispatch", t.At("moe_enable_deepep")));
  }
  c.moe_aux_loss_coeff = t.Number("moe_aux_loss_coeff", 0, 1e6, false, false).value_or(0.0);
  c.moe_permute_fusion = t.Bool("moe_permute_fusion").value_or(false);
  c.moe_expert_capacity_factor =
      t.Number("moe_expert_capacity_factor", 0, 1e6, true, false).value_or(0.0);
  c.moe_pad_expert_input_to_capacity = t.Bool("moe_pad_expert_input_to_capacity").value_or(false);
  if (c.moe_pad_expert_input_to_capacity && c.moe_expert_capacity_factor == 0.0) {
    // Megatron TransformerConfig.__post_init__: padding needs a capacity factor.
    Fail(t.At("moe_pad_expert_input_to_capacity"),
         "needs moe_expert_capacity_factor (Megatron refuses padding without a capacity)");
  }
  c.moe_grouped_gemm = t.Bool("moe_grouped_gemm").value_or(false);
  c.moe_router_pre_softmax = t.Bool("moe_router_pre_softmax").value_or(false);
  c.moe_imbalance_factor = t.Number("moe_imbalance_factor", 1, 1e6, false, false).value_or(1.0);
}

int ExpertTensorParallelSize(const TrainingConfig& c) {
  return c.expert_tensor_parallel_size > 0 ? c.expert_tensor_parallel_size
                                           : c.tensor_model_parallel_size;
}

void CheckMoe(const Setup& s, const Origin& origin) {
  const ModelConfig& m = s.model;
  const TrainingConfig& c = s.training;
  const int ep = c.expert_model_parallel_size;
  const int etp = ExpertTensorParallelSize(c);
  if (m.num_experts <= 1) {
    if (ep > 1) {
      Fail(origin.Training("expert_model_parallel_size"),
           fmt::format("{} needs a mixture-of-experts model (num_experts > 1)", ep));
    }
    return;
  }
  if (!StackOf(c).Traits().mixture_of_experts) {
    throw UnsupportedError(fmt::format("{}: a mixture-of-experts model under framework "
                                       "\"{}\" (memsim models Megatron-core's MoE layer)",
                                       origin.Model("num_experts"), c.framework));
  }
  if (c.use_megatron_fsdp) {
    throw UnsupportedError(fmt::format("{}: Megatron-FSDP with a mixture-of-experts model",
                                       origin.Training("use_megatron_fsdp")));
  }
  // megatron/core/transformer/moe/moe_layer.py BaseMoELayer: num_experts % ep == 0;
  // parallel_state.initialize_model_parallel: the expert grid etp × ep × expert-DP fills the
  // t × d × cp ranks of a pipeline stage.
  if (m.num_experts % ep != 0) {
    Fail(origin.Training("expert_model_parallel_size"),
         fmt::format("num_experts {} is not divisible by expert_model_parallel_size {}",
                     m.num_experts, ep));
  }
  const int stage_ranks =
      c.tensor_model_parallel_size * c.data_parallel_size * c.context_parallel_size;
  if (stage_ranks % (ep * etp) != 0) {
    Fail(origin.Training("expert_model_parallel_size"),
         fmt::format("tensor × data × context parallel ranks {} are not divisible by "
                     "expert_model_parallel_size {} × expert_tensor_parallel_size {}",
                     stage_ranks, ep, etp));
  }
  if (m.moe_ffn_hidden_size % etp != 0 ||
      m.moe_shared_expert_intermediate_size % c.tensor_model_parallel_size != 0) {
    Fail(origin.Model("moe_ffn_hidden_size"),
         fmt::format("the expert FFN width {} (shared {}) is not divisible by the expert / "
                     "tensor parallel size",
                     m.moe_ffn_hidden_size, m.moe_shared_expert_intermediate_size));
  }
  if (c.tensor_model_parallel_size > 1 && !c.sequence_parallel) {
    // moe_layer.py MoELayer.forward raises during training.
    Fail(origin.Training("sequence_parallel"),
         "Megatron's MoE layer needs sequence_parallel with tensor_model_parallel_size > 1");
  }
}

}  // namespace memsim::config::internal
