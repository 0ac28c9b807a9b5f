// A Setup from a Megatron launch (megatron_args.h): the arguments become a JSON training config
// whose every value is labelled with the script line and flag that gave it, then LoadSetup's
// reader, rules and derive step run on it (load_internal.h). Megatron's argument meanings:
// megatron/training/arguments.py (add_*_args, validate_args) at the commit pinned in
// tools/megatron_flags/flags.txt.
#include "config/megatron_args.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>

#include <fmt/core.h>

#include "config/documents.h"
#include "config/load_internal.h"
#include "config/megatron_flags.h"
#include "config/reader.h"
#include "core/check.h"
#include "core/error.h"

namespace memsim::config {
namespace {

using internal::Json;
using internal::Printable;

// How a modelled flag's value becomes a training-config key.
enum class Kind {
  kInt,       // --seq-length 4096 -> "seq_length": 4096
  kNumber,    // --weight-decay 0.1
  kString,    // --normalization RMSNorm
  kList,      // --recompute-modules core_attn mlp
  kTrue,      // store_true: --sequence-parallel -> true
  kFalse,     // store_false: --disable-bias-linear -> "add_bias_linear": false
  kSpecial,   // handled in code (Special below)
};
struct Modelled {
  std::string_view flag;
  std::string_view key;  // training-config key (Megatron's attribute name unless kFalse)
  Kind kind;
};
constexpr Modelled kModelled[] = {
    {"--seq-length", "seq_length", Kind::kInt},
    {"--micro-batch-size", "micro_batch_size", Kind::kInt},
    {"--global-batch-size", "global_batch_size", Kind::kInt},
    {"--tensor-model-parallel-size", "tensor_model_parallel_size", Kind::kInt},
    {"--pipeline-model-parallel-size", "pipeline_model_parallel_size", Kind::kInt},
    {"--context-parallel-size", "context_parallel_size", Kind::kInt},
    {"--expert-model-parallel-size", "expert_model_parallel_size", Kind::kInt},
    {"--expert-tensor-parallel-size", "expert_tensor_parallel_size", Kind::kInt},
    {"--num-layers-per-virtual-pipeline-stage", "num_layers_per_virtual_pipeline_stage",
     Kind::kInt},
    {"--num-virtual-stages-per-pipeline-rank", "num_virtual_stages_per_pipeline_rank", Kind::kInt},
    {"--decoder-first-pipeline-num-layers", "decoder_first_pipeline_num_layers", Kind::kInt},
    {"--decoder-last-pipeline-num-layers", "decoder_last_pipeline_num_layers", Kind::kInt},
    {"--sequence-parallel", "sequence_parallel", Kind::kTrue},
    {"--fp16", "fp16", Kind::kTrue},
    {"--bf16", "bf16", Kind::kTrue},
    {"--accumulate-allreduce-grads-in-fp32", "accumulate_allreduce_grads_in_fp32", Kind::kTrue},
    {"--grad-reduce-in-bf16", "grad_reduce_in_bf16", Kind::kTrue},
    {"--main-grads-dtype", "main_grads_dtype", Kind::kSpecial},
    {"--use-precision-aware-optimizer", "use_precision_aware_optimizer", Kind::kTrue},
    {"--reuse-fp32-param", "reuse_fp32_param", Kind::kTrue},
    {"--recompute-activation-function", "recompute_activation_function", Kind::kTrue},
    {"--recompute-activation-function-num-layers", "recompute_activation_function_num_layers",
     Kind::kInt},
    {"--swap-optimizer", "swap_optimizer", Kind::kTrue},
    {"--swap-optimizer-times", "swap_optimizer_times", Kind::kInt},
    {"--main-params-dtype", "main_params_dtype", Kind::kString},
    {"--exp-avg-dtype", "exp_avg_dtype", Kind::kString},
    {"--exp-avg-sq-dtype", "exp_avg_sq_dtype", Kind::kString},
    {"--optimizer", "optimizer", Kind::kString},
    {"--weight-decay", "weight_decay", Kind::kNumber},
    {"--sgd-momentum", "sgd_momentum", Kind::kNumber},
    {"--use-distributed-optimizer", "use_distributed_optimizer", Kind::kTrue},
    {"--overlap-grad-reduce", "overlap_grad_reduce", Kind::kTrue},
    {"--overlap-param-gather", "overlap_param_gather", Kind::kTrue},
    {"--use-megatron-fsdp", "use_megatron_fsdp", Kind::kTrue},
    {"--data-parallel-sharding-strategy", "data_parallel_sharding_strategy", Kind::kString},
    {"--recompute-granularity", "recompute_granularity", Kind::kString},
    {"--recompute-method", "recompute_method", Kind::kString},
    {"--recompute-num-layers", "recompute_num_layers", Kind::kInt},
    {"--recompute-modules", "recompute_modules", Kind::kList},
    {"--recompute-activations", "recompute_activations", Kind::kSpecial},
    {"--use-flash-attn", "use_flash_attn", Kind::kTrue},
    {"--attention-backend", "attention_backend", Kind::kSpecial},
    {"--transformer-impl", "transformer_impl", Kind::kString},
    {"--no-gradient-accumulation-fusion", "gradient_accumulation_fusion", Kind::kFalse},
    {"--no-create-attention-mask-in-dataloader", "create_attention_mask_in_dataloader", Kind::kFalse},
    {"--train-iters", "train_iters", Kind::kSpecial},
    {"--train-samples", "train_samples", Kind::kSpecial},
    {"--empty-unused-memory-level", "empty_unused_memory_level", Kind::kInt},
    {"--num-layers", "num_layers", Kind::kInt},
    {"--hidden-size", "hidden_size", Kind::kInt},
    {"--ffn-hidden-size", "ffn_hidden_size", Kind::kInt},
    {"--num-attention-heads", "num_attention_heads", Kind::kInt},
    {"--group-query-attention", "group_query_attention", Kind::kTrue},
    {"--num-query-groups", "num_query_groups", Kind::kInt},
    {"--kv-channels", "kv_channels", Kind::kInt},
    {"--max-position-embeddings", "max_position_embeddings", Kind::kInt},
    {"--vocab-size", "vocab_size", Kind::kInt},
    {"--padded-vocab-size", "padded_vocab_size", Kind::kSpecial},
    {"--make-vocab-size-divisible-by", "make_vocab_size_divisible_by", Kind::kInt},
    {"--swiglu", "swiglu", Kind::kTrue},
    {"--normalization", "normalization", Kind::kString},
    {"--disable-bias-linear", "add_bias_linear", Kind::kFalse},
    {"--add-qkv-bias", "add_qkv_bias", Kind::kTrue},
    {"--qk-layernorm", "qk_layernorm", Kind::kTrue},
    {"--multi-latent-attention", "multi_latent_attention", Kind::kTrue},
    {"--q-lora-rank", "q_lora_rank", Kind::kInt},
    {"--kv-lora-rank", "kv_lora_rank", Kind::kInt},
    {"--qk-head-dim", "qk_head_dim", Kind::kInt},
    {"--qk-pos-emb-head-dim", "qk_pos_emb_head_dim", Kind::kInt},
    {"--v-head-dim", "v_head_dim", Kind::kInt},
    {"--position-embedding-type", "position_embedding_type", Kind::kString},
    {"--no-position-embedding", "add_position_embedding", Kind::kSpecial},
    {"--untie-embeddings-and-output-weights", "untie_embeddings_and_output_weights", Kind::kTrue},
    {"--hidden-dropout", "hidden_dropout", Kind::kNumber},
    {"--attention-dropout", "attention_dropout", Kind::kNumber},
    {"--load", "load", Kind::kString},
    {"--no-load-optim", "no_load_optim", Kind::kTrue},
    {"--finetune", "finetune", Kind::kTrue},
    {"--num-experts", "num_experts", Kind::kInt},
    {"--moe-router-topk", "moe_router_topk", Kind::kInt},
    {"--moe-ffn-hidden-size", "moe_ffn_hidden_size", Kind::kInt},
    {"--moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size", Kind::kInt},
    {"--moe-layer-freq", "moe_layer_freq", Kind::kSpecial},
    {"--first-k-dense-replace", "first_k_dense_replace", Kind::kInt},
    {"--n-shared-experts", "n_shared_experts", Kind::kInt},
    {"--shared-expert-gate", "moe_shared_expert_gate", Kind::kTrue},
    {"--moe-shared-expert-gate", "moe_shared_expert_gate", Kind::kTrue},
    {"--moe-token-dispatcher-type", "moe_token_dispatcher_type", Kind::kString},
    {"--moe-aux-loss-coeff", "moe_aux_loss_coeff", Kind::kNumber},
    {"--moe-permute-fusion", "moe_permute_fusion", Kind::kTrue},
    // MindSpeed's alias: FusedMoEPermuteFeature.validate_args sets moe_permute_fusion from it
    // (mindspeed/features_manager/fusions/fused_moe_permute.py at 028de58).
    {"--use-fused-moe-token-permute-and-unpermute", "moe_permute_fusion", Kind::kTrue},
    {"--moe-expert-capacity-factor", "moe_expert_capacity_factor", Kind::kNumber},
    {"--moe-pad-expert-input-to-capacity", "moe_pad_expert_input_to_capacity", Kind::kTrue},
    {"--moe-grouped-gemm", "moe_grouped_gemm", Kind::kTrue},
    {"--moe-router-pre-softmax", "moe_router_pre_softmax", Kind::kTrue},
    {"--cuda-graph-impl", "cuda_graph_impl", Kind::kString},
    {"--tp-comm-overlap", "tp_comm_overlap", Kind::kTrue},
    {"--log-params-norm", "log_params_norm", Kind::kTrue},
    {"--hccl-group-buffer", "hccl_group_buffer", Kind::kString},
};

// The tail of a not-modelled flag's warning: which way memsim errs while it is ignored
// (tools/megatron_flags/reviewed.txt, direction).
std::string ErrsText(FlagError error) {
  switch (error) {
    case FlagError::kHigh:
      return "; memsim errs high (predicts more than the run uses)";
    case FlagError::kLow:
      return "; memsim errs low (predicts less than the run uses)";
    case FlagError::kEither:
    case FlagError::kNone:
      break;
  }
  return "";
}

const Modelled* FindModelled(std::string_view flag) {
  for (const Modelled& m : kModelled) {
    if (m.flag == flag) return &m;
  }
  return nullptr;
}

// Builds the training block: one value per key, each with its label.
class Translator {
 public:
  Translator(const MegatronLaunch& launch, const MegatronOptions& options)
      : launch_(launch), options_(options) {}

  // Every argument is read before anything fails: the errors and unsupported flags of the whole
  // launch come in one message (one per line after the first), not one per rerun. An argument
  // whose value cannot be read (`--num-layers abc`) is left out and kept in errors_, which the
  // loader reports with the values it refuses (TranslateAndLoad), unless unsupported flags
  // refuse the launch: then they are reported here, with those flags.
  void Run() {
    for (const LaunchArgument& a : launch_.arguments) {
      try {
        if (launch_.kind == MegatronLaunch::Kind::kLog) {
          LogArgument(a);
        } else {
          ScriptArgument(a);
        }
      } catch (const UnsupportedError&) {
        throw;
      } catch (const InputError& e) {
        errors_.push_back({Label(a), e.what()});
      }
    }
    const bool refuse = !unsupported_.empty() && !options_.allow_unsupported;
    if (!errors_.empty() && refuse) {
      std::string all = fmt::format("{} problems in {}:", errors_.size() + unsupported_.size(),
                                    launch_.label);
      for (const internal::KeyError& e : errors_) all += "\n  " + e.message;
      for (const std::string& u : unsupported_) all += "\n  unsupported: " + u;
      throw InputError(all + "\n  (--allow-unsupported runs without the unsupported flags)");
    }
    if (refuse) {
      std::string all = unsupported_.front();
      for (size_t i = 1; i < unsupported_.size(); ++i) all += "\n  also unsupported: " + unsupported_[i];
      throw UnsupportedError(all + (unsupported_.size() > 1 ? "\n  " : "; ") +
                             "--allow-unsupported runs without " +
                             (unsupported_.size() > 1 ? "them" : "it"));
    }
    for (const std::string& u : unsupported_) warnings_.push_back(u + ": ignored (--allow-unsupported)");
    CheckpointLoad();
    if (launch_.kind == MegatronLaunch::Kind::kLog && training.value("group_query_attention", true) == false) {
      training.erase("num_query_groups");  // printed, but Megatron uses it only with GQA
    }
  }

  // --load DIR restores optimizer state only if DIR holds a checkpoint, which a script cannot
  // tell: a fresh start is simulated, with a warning unless --no-load-optim or --finetune.
  void CheckpointLoad() {
    if (!training.contains("load")) return;
    const std::string label = labels[internal::Child("/training", "load")];
    if (!training.value("no_load_optim", false) && !training.value("finetune", false)) {
      warnings_.push_back(fmt::format(
          "{}: a resumed run restores the optimizer state, so its first iteration differs from a "
          "fresh start (not modelled yet; the steady state does not differ); a fresh start "
          "simulated",
          label));
    }
    training.erase("load");
    labels.erase(internal::Child("/training", "load"));
  }

  Json training = Json::object();
  std::map<std::string, std::string> labels;  // JSON pointer -> "file:line: --flag"
  // The arguments whose values could not be read (Run): location "file:line: --flag", message.
  std::vector<internal::KeyError> errors_;
  std::vector<std::string> warnings_;
  std::vector<std::string> notes_;
  std::vector<NotModelled> not_modelled_;
  std::optional<std::int64_t> train_samples;
  std::string train_samples_label;

  std::string Label(const LaunchArgument& a) const {
    if (a.line == 0) return fmt::format("{} {}", launch_.label, Printable(a.name, 60));
    return fmt::format("{}:{}: {}", launch_.label, a.line, Printable(a.name, 60));
  }

  void Set(std::string_view key, Json value, const std::string& label) {
    training[std::string(key)] = std::move(value);
    labels[internal::Child("/training", key)] = label;
  }

 private:
  [[noreturn]] void Fail(const LaunchArgument& a, const std::string& what) const {
    throw InputError(fmt::format("{}: {}", Label(a), what));
  }
  std::string One(const LaunchArgument& a) const {
    if (a.values.size() != 1) {
      Fail(a, a.values.empty() ? "expected a value" : fmt::format("expected one value, got {}", a.values.size()));
    }
    return a.values[0];
  }
  std::int64_t Int(const LaunchArgument& a) const {
    const std::string v = One(a);
    std::int64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
      Fail(a, fmt::format("expected an integer, got '{}'", Printable(v, 40)));
    }
    return n;
  }
  double Number(const LaunchArgument& a) const {
    const std::string v = One(a);
    double x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
      Fail(a, fmt::format("expected a number, got '{}'", Printable(v, 40)));
    }
    return x;
  }

  void ScriptArgument(const LaunchArgument& a) {
    const FlagInfo* info = FindFlag(a.name);
    if (info == nullptr) {
      warnings_.push_back(fmt::format("{}: unknown flag (in none of the pinned Megatron-LM, "
                                      "MindSpeed, MindSpeed-LLM parsers); ignored",
                                      Label(a)));
      return;
    }
    switch (info->flag_class) {
      case FlagClass::kNeutral:
        notes_.push_back(fmt::format("{}: accepted, no effect on memory", Label(a)));
        return;
      case FlagClass::kNotModelled:
        warnings_.push_back(fmt::format("{}: not modelled ({}){}", Label(a), info->why, ErrsText(info->error)));
        RecordNotModelled(a, *info);
        return;
      case FlagClass::kUnsupported:
        unsupported_.push_back(fmt::format("{}: {}", Label(a), info->why));
        if (options_.allow_unsupported) RecordNotModelled(a, *info);
        return;
      case FlagClass::kModelled:
        break;
    }
    const Modelled* m = FindModelled(a.name);
    MEMSIM_CHECK(m != nullptr);  // the table and kModelled agree (megatron_flags_test.cc)
    WarnRepeated(a);
    Convert(*m, a);
  }

  // The flag kept for the verdict's caveat (setup.h NotModelled).
  void RecordNotModelled(const LaunchArgument& a, const FlagInfo& info) {
    NotModelled n{Label(a), a.name, a.values, NotModelled::Direction::kEither};
    if (info.error == FlagError::kHigh) n.direction = NotModelled::Direction::kHigh;
    if (info.error == FlagError::kLow) n.direction = NotModelled::Direction::kLow;
    not_modelled_.push_back(std::move(n));
  }

  // A modelled flag given again with other values (a flag in an argument group and again on
  // the command): argparse keeps the last one, and so does memsim, but it is said.
  void WarnRepeated(const LaunchArgument& a) {
    const auto [it, first] = seen_.try_emplace(a.name, &a);
    if (first) return;
    if (it->second->values != a.values) {
      auto shown = [](const LaunchArgument& x) {
        std::string v;
        for (const std::string& w : x.values) v += (v.empty() ? "" : " ") + w;
        return x.values.empty() ? std::string("no value") : fmt::format("'{}'", Printable(v, 40));
      };
      const LaunchArgument& before = *it->second;
      warnings_.push_back(fmt::format(
          "{}: given again with {} ({} before{}); the last taken, as argparse does", Label(a),
          shown(a), shown(before),
          before.line == 0 ? std::string() : fmt::format(", line {}", before.line)));
    }
    it->second = &a;
  }

  void Convert(const Modelled& m, const LaunchArgument& a) {
    const std::string label = Label(a);
    switch (m.kind) {
      case Kind::kInt:
        Set(m.key, Int(a), label);
        return;
      case Kind::kNumber:
        Set(m.key, Number(a), label);
        return;
      case Kind::kString:
        if (m.key == "load" && a.values.size() != 1) {
          // `--load $1` with the script's argument unknown here, or a placeholder with blanks
          // (`CKPT_LOAD_DIR="your model ckpt path"`): a checkpoint directory all the same
          // (CheckpointLoad says what that means).
          Set(m.key, "", label);
          return;
        }
        Set(m.key, One(a), label);
        return;
      case Kind::kList:
        if (a.values.empty()) Fail(a, "expected one or more values");
        Set(m.key, a.values, label);
        return;
      case Kind::kTrue:
      case Kind::kFalse:
        if (!a.values.empty()) {
          Fail(a, fmt::format("takes no value, got '{}'", Printable(a.values[0], 40)));
        }
        Set(m.key, m.kind == Kind::kTrue, label);
        return;
      case Kind::kSpecial:
        Special(m, a.name, a.values.empty() ? std::optional<std::string>() : One(a), a);
        return;
    }
  }

  // Flags whose meaning is more than one key. `value` is the script's value (or the log's,
  // already stripped of Python's enum prefix).
  void Special(const Modelled& m, std::string_view flag, std::optional<std::string> value,
               const LaunchArgument& a) {
    const std::string label = Label(a);
    if (flag == "--attention-backend") {
      // megatron/core/transformer/enums.py AttnBackend. flash and fused (cuDNN) keep no
      // s x s scores; unfused and local materialise them; auto lets Transformer Engine pick,
      // which picks flash or fused where they apply.
      const std::string v = value.value_or("");
      if (v != "flash" && v != "fused" && v != "unfused" && v != "local" && v != "auto") {
        Fail(a, fmt::format("expected one of flash, fused, unfused, local, auto, got '{}'", Printable(v, 40)));
      }
      Set("use_flash_attn", v == "flash" || v == "fused" || v == "auto", label);
      if (v == "local") Set("transformer_impl", "local", label);
      if (v == "auto") notes_.push_back(label + ": auto taken as flash or fused attention (no s x s scores)");
    } else if (flag == "--recompute-activations") {
      Set("recompute_granularity", "selective", label);  // arguments.py validate_args
    } else if (flag == "--main-grads-dtype") {
      const std::string v = value.value_or("");
      if (v != "fp32" && v != "bf16") Fail(a, fmt::format("expected fp32 or bf16, got '{}'", Printable(v, 40)));
      // arguments.py validate_args: bf16 main grads leave the fp32 accumulation off.
      if (v == "bf16") Set("grad_reduce_in_bf16", true, label);
    } else if (flag == "--train-iters") {
      TrainIters(Int(a), label);
    } else if (flag == "--train-samples") {
      train_samples = Int(a);
      train_samples_label = label;
    } else if (flag == "--padded-vocab-size") {
      Set("vocab_size", Int(a), label);
      Set("make_vocab_size_divisible_by", 1, label);
    } else if (flag == "--no-position-embedding") {
      no_position_embedding_label = label;  // DerivedArguments: rope stays rope
    } else if (flag == "--moe-layer-freq") {
      Set("moe_layer_freq", MoeLayerFreq(a, value.value_or("")), label);
    }
    (void)m;
  }

 public:
  std::string no_position_embedding_label;

  // Megatron's moe_freq_type (arguments.py, d98e8a64 line 327): an integer, or a Python list
  // expression of 0/1 lists, `+` and `* N` ("([0]+[1]*23)", "([1]*3+[0]*1)*3"), which
  // Megatron hands to eval().
  Json MoeLayerFreq(const LaunchArgument& a, const std::string& v) const {
    if (v.find('[') == std::string::npos) return Int(a);
    size_t at = 0;
    std::vector<int> out = PatternSum(a, v, at);
    SkipBlanks(v, at);
    if (at != v.size()) Fail(a, fmt::format("cannot read '{}' at '{}'", Printable(v, 60), Printable(v.substr(at), 20)));
    return out;
  }
  static void SkipBlanks(const std::string& v, size_t& at) {
    while (at < v.size() && (v[at] == ' ' || v[at] == '"' || v[at] == '\'')) ++at;
  }
  std::vector<int> PatternSum(const LaunchArgument& a, const std::string& v, size_t& at) const {
    std::vector<int> out = PatternProduct(a, v, at);
    for (SkipBlanks(v, at); at < v.size() && v[at] == '+'; SkipBlanks(v, at)) {
      ++at;
      const std::vector<int> more = PatternProduct(a, v, at);
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }
  std::vector<int> PatternProduct(const LaunchArgument& a, const std::string& v, size_t& at) const {
    std::vector<int> base = PatternAtom(a, v, at);
    for (SkipBlanks(v, at); at < v.size() && v[at] == '*'; SkipBlanks(v, at)) {
      ++at;
      SkipBlanks(v, at);
      int n = 0;
      const auto [end, ec] = std::from_chars(v.data() + at, v.data() + v.size(), n);
      if (ec != std::errc() || n < 0 || n > (1 << 16) || base.size() * static_cast<size_t>(n) > (1 << 16)) {
        Fail(a, fmt::format("expected a repeat count after '*' in '{}'", Printable(v, 60)));
      }
      at = static_cast<size_t>(end - v.data());
      std::vector<int> rep;
      for (int i = 0; i < n; ++i) rep.insert(rep.end(), base.begin(), base.end());
      base = std::move(rep);
    }
    return base;
  }
  std::vector<int> PatternAtom(const LaunchArgument& a, const std::string& v, size_t& at) const {
    SkipBlanks(v, at);
    if (at < v.size() && v[at] == '(') {
      ++at;
      std::vector<int> inner = PatternSum(a, v, at);
      SkipBlanks(v, at);
      if (at >= v.size() || v[at] != ')') Fail(a, fmt::format("unbalanced '(' in '{}'", Printable(v, 60)));
      ++at;
      return inner;
    }
    if (at >= v.size() || v[at] != '[') Fail(a, fmt::format("expected '[' or '(' in '{}'", Printable(v, 60)));
    const size_t close = v.find(']', at);
    if (close == std::string::npos) Fail(a, fmt::format("unbalanced '[' in '{}'", Printable(v, 60)));
    std::vector<int> out;
    for (const std::string& e : PythonList(v.substr(at, close - at + 1))) {
      if (e != "0" && e != "1") Fail(a, fmt::format("list entries must be 0 or 1, got '{}'", Printable(e, 20)));
      out.push_back(e == "1" ? 1 : 0);
    }
    at = close + 1;
    return out;
  }

  void TrainIters(std::int64_t n, const std::string& label) {
    if (n < 1) throw InputError(fmt::format("{}: expected a positive number of iterations, got {}", label, n));
    // No limit: a long run is simulated until its steady state (config/iterations.h).
    if (n > std::numeric_limits<int>::max()) {
      throw InputError(fmt::format("{}: {} iterations exceed memsim's limit of {}", label, n,
                                   std::numeric_limits<int>::max()));
    }
    Set("train_iters", n, label);
  }

 private:
  // A log line "name ..... value": Megatron's attribute and Python's repr of its value.
  void LogArgument(const LaunchArgument& a) {
    std::string v = a.values.empty() ? "" : a.values[0];
    if (v == "None") return;
    if (const size_t dot = v.find("AttnBackend."); dot == 0) v = v.substr(12);
    // validate_args maps the dtype flags to torch dtypes before printing (map_dtype; fp8 is
    // torch.uint8).
    for (const auto& [torch_name, flag_value] :
         {std::pair{"torch.float32", "fp32"}, std::pair{"torch.float16", "fp16"},
          std::pair{"torch.bfloat16", "bf16"}, std::pair{"torch.uint8", "fp8"}}) {
      if (v == torch_name) v = flag_value;
    }
    std::string flag = "--" + a.name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    for (const Modelled& m : kModelled) {
      if (m.key != a.name) continue;
      LaunchArgument one{std::string(m.flag), {v}, a.line};
      if (m.kind == Kind::kTrue || m.kind == Kind::kFalse) {
        if (v != "True" && v != "False") Fail(a, fmt::format("expected True or False, got '{}'", Printable(v, 40)));
        // A default printed False never undoes what another attribute set (attention_backend
        // before use_flash_attn).
        if (v == "False" && training.contains(std::string(m.key))) return;
        Set(m.key, v == "True", Label(a));
      } else if (m.kind == Kind::kList) {
        Set(m.key, PythonList(v), Label(a));
      } else if (m.kind == Kind::kSpecial) {
        if (m.key == "train_iters" || m.key == "train_samples" || m.key == "attention_backend" ||
            m.key == "padded_vocab_size" || m.key == "moe_layer_freq") {
          Special(m, m.flag, v, one);
        }
      } else {
        Convert(m, one);
      }
      return;
    }
    if (a.name == "data_parallel_size") log_dp_ = Int(a);
  }
  static std::vector<std::string> PythonList(std::string_view v) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : v) {
      if (c == '\'' || c == '"' || c == '[' || c == ' ') continue;
      if (c == ',' || c == ']') {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    return out;
  }

 public:
  std::optional<std::int64_t> log_dp_;

 private:
  const MegatronLaunch& launch_;
  const MegatronOptions& options_;
  std::vector<std::string> unsupported_;
  std::map<std::string, const LaunchArgument*> seen_;  // modelled flag -> its last occurrence
};

// The data-parallel size: the log's, or world / (TP × PP × CP) with the world from the launcher.
// --set training.data_parallel_size=N gives the world size where the launch does not (the
// arguments after --), so it needs no warning.
void SetDataParallel(const MegatronLaunch& launch, const LoadOptions& options, Translator& t) {
  const std::string where =
      launch.launch_line > 0 ? fmt::format("{}:{}", launch.label, launch.launch_line) : launch.label;
  if (t.log_dp_) {
    t.Set("data_parallel_size", *t.log_dp_, where + ": data_parallel_size");
    return;
  }
  const bool set = std::any_of(options.overrides.begin(), options.overrides.end(), [](const std::string& o) {
    return o.starts_with("training.data_parallel_size=");
  });
  if (set) {
    // The command line wins over the world size the launch implies (ApplyCommandLine sets it).
    if (launch.nproc_per_node || launch.nnodes) {
      t.notes_.push_back(fmt::format("{}: the launch's world size not used (--set "
                                     "training.data_parallel_size given)",
                                     where));
    }
    return;
  }
  if (!launch.nproc_per_node && !launch.nnodes) {
    t.warnings_.push_back(fmt::format("{}: the world size is not given (no --nproc_per_node / "
                                      "--nnodes, GPUS_PER_NODE, NPUS_PER_NODE or NNODES); "
                                      "data_parallel_size 1 taken ({}--set "
                                      "training.data_parallel_size=N gives it)",
                                      where,
                                      launch.kind == MegatronLaunch::Kind::kCommandLine
                                          ? "torchrun's --nproc_per_node N among the arguments or "
                                          : ""));
    return;
  }
  const std::int64_t world = std::int64_t{launch.nproc_per_node.value_or(1)} * launch.nnodes.value_or(1);
  auto get = [&](const char* key) -> std::int64_t {
    // find, not operator[], which would add a null key to the config (and to input_config).
    const auto j = t.training.find(key);
    if (j == t.training.end() || !j->is_number_integer() || j->get<std::int64_t>() <= 0) return 1;
    return j->get<std::int64_t>();
  };
  const std::int64_t model = get("tensor_model_parallel_size") * get("pipeline_model_parallel_size") *
                             get("context_parallel_size");
  if (world % model != 0) {
    throw InputError(fmt::format(
        "{}: world size {} (processes per node × nodes) is not divisible by TP × PP × CP = {}", where,
        world, model));
  }
  t.Set("data_parallel_size", world / model,
        fmt::format("{}: world size {} / (TP × PP × CP)", where, world));
}

std::string DeviceBackend(const LoadOptions& options);
void AttentionBackendDefault(const MegatronLaunch& launch, const LoadOptions& options,
                             Translator& t);

// What Megatron's validate_args derives when a flag is absent (megatron/training/arguments.py at
// Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553), for a script or command line; a log
// prints the values already derived. The rest of validate_args' derivations happen where the
// keys are read: kv_channels = hidden_size / heads (model.cc ApplyMegatronArchitecture,
// arguments.py:1331-1333), num_query_groups only with --group-query-attention (model.cc,
// argument_utils.py:330-333), the vocabulary padded to make_vocab_size_divisible_by × TP
// (setup.cc, vocab_utils.py:58), the global batch micro × DP (training.cc, arguments.py:702-703),
// the virtual stages (training.cc, arguments.py:953-979).
void DerivedArguments(const MegatronLaunch& launch, const LoadOptions& options, Translator& t) {
  if (launch.kind == MegatronLaunch::Kind::kLog) return;
  const Json& tr = t.training;
  // arguments.py:1320-1329: ffn_hidden_size = int(4·h·2/3 / 64)·64 with --swiglu, else 4·h.
  if (!tr.contains("ffn_hidden_size") && tr.contains("hidden_size") &&
      tr["hidden_size"].is_number_integer() && tr["hidden_size"].get<std::int64_t>() > 0) {
    const std::int64_t h = tr["hidden_size"].get<std::int64_t>();
    const bool swiglu = tr.value("swiglu", false);
    const std::int64_t ffn =
        swiglu ? static_cast<std::int64_t>(static_cast<double>(8 * h) / 3.0 / 64.0) * 64 : 4 * h;
    const std::string rule = swiglu ? "int(4·h·2/3 / 64)·64 with --swiglu" : "4·h";
    t.Set("ffn_hidden_size", ffn,
          fmt::format("{}: --ffn-hidden-size (absent: {} = {})", launch.label, rule, ffn));
    t.notes_.push_back(fmt::format("{}: --ffn-hidden-size not given: {} = {}, as Megatron's "
                                   "validate_args",
                                   launch.label, rule, ffn));
  }
  // argument_utils.py:330-333 (d98e8a64): --num-query-groups counts only with
  // --group-query-attention; without it the attention is multi-head.
  if (tr.contains("num_query_groups") && !tr.value("group_query_attention", false)) {
    const std::string where = t.labels[internal::Child("/training", "num_query_groups")];
    t.warnings_.push_back(fmt::format("{}: ignored without --group-query-attention (Megatron "
                                      "builds multi-head attention then)",
                                      where));
    t.training.erase("num_query_groups");
    t.labels.erase(internal::Child("/training", "num_query_groups"));
  }
  // arguments.py:1631-1634: --no-position-embedding leaves RoPE alone (and refuses any other
  // type since core 0.12; before, it dropped the learned position table).
  if (!t.no_position_embedding_label.empty() && tr.value("position_embedding_type", "") != "rope") {
    t.Set("position_embedding_type", "none", t.no_position_embedding_label);
  }
  AttentionBackendDefault(launch, options, t);
}

// The attention when the launch names none (no --attention-backend, --use-flash-attn): Megatron
// core >= 0.10 defaults to AttnBackend.auto (transformer_config.py:151 at d98e8a64), where
// Transformer Engine picks flash or cuDNN fused attention, which keep no s×s scores. The
// legacy model (--use-legacy-models: ParallelAttention's CoreAttention), the local spec
// (--transformer-impl local: DotProductAttention) and MindSpeed on Ascend (its
// dot_product_attention_forward_wrapper takes the fused NPU kernel only with --use-flash-attn,
// mindspeed/core/transformer/dot_product_attention.py) materialise [b, heads, s, s] scores.
void AttentionBackendDefault(const MegatronLaunch& launch, const LoadOptions& options,
                             Translator& t) {
  if (t.training.contains("use_flash_attn")) return;
  const bool legacy = std::any_of(launch.arguments.begin(), launch.arguments.end(),
                                  [](const LaunchArgument& a) { return a.name == "--use-legacy-models"; });
  const bool local = t.training.value("transformer_impl", "") == "local";
  const bool npu = DeviceBackend(options) == "npu";
  if (legacy || local || npu) {
    t.notes_.push_back(fmt::format(
        "{}: no --attention-backend or --use-flash-attn: {} materialises the s×s attention scores",
        launch.label,
        npu ? "MindSpeed on Ascend (no --use-flash-attn)"
            : legacy ? "the legacy model's CoreAttention" : "the local DotProductAttention"));
    return;
  }
  t.Set("use_flash_attn", true,
        fmt::format("{}: --attention-backend (absent: Megatron's default auto)", launch.label));
  t.notes_.push_back(fmt::format("{}: no --attention-backend: Megatron's default auto taken, "
                                 "flash or fused attention (no s×s scores)",
                                 launch.label));
}

// The model: --model, else an inline GPT-2-type object (Megatron's defaults) sized by the
// arguments, which the training block then overrides as for any config. Each model key is
// labelled with the flag it came from (an error names --hidden-size, not /model/n_embd).
Json ModelFromArguments(const MegatronLaunch& launch, Translator& t, const LoadOptions& options) {
  if (!options.model_path.empty()) return options.model_path;
  const Json& tr = t.training;
  Json m = {{"model_type", "gpt2"}};
  const auto copy = [&](const std::string& key, const std::string& hf) {
    m[hf] = tr[key];
    const auto label = t.labels.find(internal::Child("/training", key));
    if (label != t.labels.end()) t.labels[internal::Child("/model", hf)] = label->second;
  };
  for (const auto& [key, hf] : std::map<std::string, std::string>{
           {"hidden_size", "n_embd"}, {"num_attention_heads", "n_head"},
           {"num_layers", "n_layer"}, {"vocab_size", "vocab_size"},
           {"max_position_embeddings", "n_positions"}}) {
    if (tr.contains(key)) copy(key, hf);
  }
  if (!m.contains("n_positions") && tr.contains("seq_length")) copy("seq_length", "n_positions");
  for (const char* need : {"n_embd", "n_head", "n_layer"}) {
    if (!m.contains(need)) {
      throw InputError(fmt::format("{}: the model is not in the arguments (--num-layers, "
                                   "--hidden-size, --num-attention-heads); give --model NAME|FILE",
                                   launch.label));
    }
  }
  return m;
}

// Megatron's argument defaults where a --model file would otherwise give its own: a script that
// leaves out --hidden-dropout / --attention-dropout runs with 0.1 (megatron/training/arguments.py
// _add_regularization_args), whatever dropout the Hugging Face file says (Llama's is 0). A log
// prints the values used; without --model the inline GPT-2 model's defaults are 0.1 already.
void MegatronDropoutDefaults(const MegatronLaunch& launch, const LoadOptions& options,
                             Translator& t) {
  if (launch.kind == MegatronLaunch::Kind::kLog || options.model_path.empty()) return;
  for (const auto& [flag, key] : {std::pair{"--hidden-dropout", "hidden_dropout"},
                                  std::pair{"--attention-dropout", "attention_dropout"}}) {
    if (t.training.contains(key)) continue;
    t.Set(key, 0.1, fmt::format("{}: {} (Megatron's default 0.1)", launch.label, flag));
    t.notes_.push_back(fmt::format("{}: {} not given: Megatron's default 0.1 taken, not the model "
                                   "file's dropout",
                                   launch.label, flag));
  }
}

// ---- the launch environment (MegatronLaunch::exports) ----

// Exported variables memsim models as training.env keys (docs/config.md; training.cc
// ReadOutsideAllocator reads and checks them); `integer` ones are numbers there.
struct EnvKey {
  std::string_view name;
  bool integer;
};
constexpr EnvKey kTrainingEnv[] = {{"NCCL_BUFFSIZE", true},
                                   {"NCCL_NVLS_ENABLE", true},
                                   {"HCCL_BUFFSIZE", true},
                                   {"CUDA_MODULE_LOADING", false}};

// Exported variables known to change device memory that memsim does not model, with what they
// change. Any other export (paths, ports, logging) is silent.
struct UnmodelledEnv {
  std::string_view name;
  std::string_view why;
};
constexpr UnmodelledEnv kUnmodelledEnv[] = {
    {"PYTORCH_NO_CUDA_MEMORY_CACHING",
     "turns the CUDA caching allocator off (c10/cuda/CUDACachingAllocator.cpp); memsim models "
     "the caching allocator"},
    {"PYTORCH_NO_NPU_MEMORY_CACHING",
     "turns torch_npu's caching allocator off; memsim models the caching allocator"},
    {"PYTORCH_ALLOC_CONF",
     "the allocator options under PyTorch's device-generic name; memsim reads "
     "PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF, or give --set allocator.alloc_conf=..."},
    {"TORCH_NCCL_AVOID_RECORD_STREAMS",
     "ProcessGroupNCCL keeps a collective's tensors until wait() instead of record_stream, which "
     "moves when their blocks are freed"},
    {"MULTI_STREAM_MEMORY_REUSE", "torch_npu's reuse of blocks freed on another stream"},
    {"NCCL_MAX_NCHANNELS", "NCCL's channel count, which its buffers scale with; memsim takes the "
                           "preset's nccl.coll_channels"},
    {"NCCL_MIN_NCHANNELS", "NCCL's channel count, which its buffers scale with; memsim takes the "
                           "preset's nccl.coll_channels"},
    {"NCCL_RUNTIME_CONNECT",
     "NCCL >= 2.22 connects only the algorithms used; memsim counts every connection"},
};

// The backend of the --device preset ("npu" or "cuda"), to tell which *_ALLOC_CONF it reads.
std::string DeviceBackend(const LoadOptions& options) {
  const internal::Document d = internal::FindDeviceDocument(
      options.device, "--device " + Printable(options.device), nullptr);
  const Json j = internal::ParseJson(d.text, d.label);
  return j.is_object() && j.value("allocator_backend", "") == "npu" ? "npu" : "cuda";
}

// The exports memsim models become training.env keys and allocator.alloc_conf, each labelled
// "<script>:<line>: export NAME"; the rest known to change memory are warnings. The command
// line wins: with any --set allocator.<key>, the script's allocator options are not used.
void ApplyExports(const MegatronLaunch& launch, const LoadOptions& options, Translator& t,
                  Json* allocator) {
  std::map<std::string, const MegatronLaunch::Export*> last;
  for (const MegatronLaunch::Export& e : launch.exports) last[e.name] = &e;
  const std::string backend = launch.exports.empty() ? "" : DeviceBackend(options);
  for (const auto& [name, e] : last) {
    const std::string label = fmt::format("{}:{}: export {}", launch.label, e->line, name);
    for (const EnvKey& k : kTrainingEnv) {
      if (k.name != name) continue;
      std::int64_t n = 0;
      const auto [end, ec] = std::from_chars(e->value.data(), e->value.data() + e->value.size(), n);
      const bool number = k.integer && !e->value.empty() && ec == std::errc() &&
                          end == e->value.data() + e->value.size();
      t.training["env"][name] = number ? Json(n) : Json(e->value);
      t.labels["/training/env/" + name] = label;
    }
    for (const UnmodelledEnv& u : kUnmodelledEnv) {
      if (u.name != name) continue;
      t.warnings_.push_back(fmt::format("{}: not modelled ({})", label, u.why));
      t.not_modelled_.push_back({label, "export " + name, {e->value}, NotModelled::Direction::kEither});
    }
    const bool cuda_conf = name == "PYTORCH_CUDA_ALLOC_CONF";
    if (!cuda_conf && name != "PYTORCH_NPU_ALLOC_CONF") continue;
    if ((backend == "npu") == cuda_conf) {
      t.warnings_.push_back(fmt::format("{}: ignored (the {} allocator of device '{}' reads {})",
                                        label, backend, Printable(options.device),
                                        cuda_conf ? "PYTORCH_NPU_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF"));
      continue;
    }
    const bool overridden = std::any_of(options.overrides.begin(), options.overrides.end(),
                                        [](const std::string& o) { return o.starts_with("allocator."); });
    if (overridden) {
      t.warnings_.push_back(fmt::format("{}: not used (--set allocator.<key> given)", label));
      continue;
    }
    (*allocator)["alloc_conf"] = e->value;
    t.labels["/allocator/alloc_conf"] = label;
  }
}

}  // namespace

std::vector<std::string> ModelledMegatronFlags() {
  std::vector<std::string> out;
  for (const Modelled& m : kModelled) out.emplace_back(m.flag);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// An error at "<label>:<line>: " gains the reader's warnings and hints about that line: a value the
// reader could not evaluate (`$((1<<70))`, `$UNSET`) and took as 0 or empty is what the error
// is about, and the warnings are not printed when loading fails. An error without a line (a
// field of the model built from the arguments), or one at a line that has none about a value a
// substitution gives (", got 0" or ", got \"\"": N=$((2+)) ... --num-layers $N), gains every
// such substitution of the launch ("taken as ..."), at most three.
std::string WithLineWarnings(const std::string& message, const MegatronLaunch& launch) {
  const std::string label = launch.label + ":";
  if (!message.starts_with(label)) return message;
  const size_t end = message.find(": ", label.size());
  const bool at_line = end != std::string::npos && end > label.size() &&
                       message.find_first_not_of("0123456789", label.size()) == end;
  const auto collect = [&](bool has_line) {
    const std::string prefix = has_line ? message.substr(0, end + 2) : std::string();
    std::string said;
    int count = 0;
    for (const std::vector<std::string>* list : {&launch.warnings, &launch.hints}) {
      for (const std::string& w : *list) {
        const bool about =
            has_line ? w.starts_with(prefix) : w.find("; taken as ") != std::string::npos;
        if (!about || ++count > 3) continue;
        said += (said.empty() ? "" : "; ") + (has_line ? w.substr(prefix.size()) : w);
      }
    }
    if (count > 3) said += fmt::format("; {} more", count - 3);
    return said;
  };
  if (at_line) {
    if (const std::string said = collect(true); !said.empty()) {
      return message + " (on that line: " + said + ")";
    }
  }
  if (at_line && !message.ends_with(", got 0") && !message.ends_with(", got \"\"")) return message;
  const std::string said = collect(false);
  return said.empty() ? message : message + " (" + said + ")";
}

// The training config built from the translated arguments `t`, loaded: the loader's field errors
// are reported with t.errors_ (FieldErrors::kAll). `*loading` is set once the loader has them.
Setup LoadTranslated(const MegatronLaunch& launch, const LoadOptions& options, Translator& t,
                     bool* loading) {
  if (t.train_samples) {  // arguments.py: iterations = samples / global batch
    const Json g = t.training.value("global_batch_size", Json());
    const std::int64_t gbs = g.is_number_integer() && g.get<std::int64_t>() > 0 ? g.get<std::int64_t>() : 1;
    t.TrainIters(std::max<std::int64_t>(1, *t.train_samples / gbs), t.train_samples_label);
  }
  SetDataParallel(launch, options, t);
  if (options.device.empty()) {
    throw InputError(fmt::format("{}: a launch does not name its device; give --device NAME ({}) "
                                 "or a preset file",
                                 launch.label, internal::KnownDevices()));
  }
  DerivedArguments(launch, options, t);
  MegatronDropoutDefaults(launch, options, t);
  Json allocator = Json::object();
  ApplyExports(launch, options, t, &allocator);
  Json root = {{"model", ModelFromArguments(launch, t, options)}, {"training", t.training}};
  if (!allocator.empty()) root["allocator"] = allocator;
  internal::Source source{launch.label, t.labels};
  LoadOptions rest = options;
  rest.model_path.clear();  // already in root
  internal::ApplyCommandLine(rest, &root, &source);
  if (root["model"].is_object() && !root["model"].contains("vocab_size") &&
      !root["training"].contains("vocab_size")) {
    throw InputError(fmt::format(
        "{}: the vocabulary size is not in the arguments (the script leaves it to the tokenizer); "
        "give --model NAME|FILE or --set model.vocab_size=N",
        launch.label));
  }
  internal::Document doc{launch.label, "", false, ""};
  if (!options.model_path.empty()) rest.model_path = options.model_path;
  *loading = true;
  Setup s = internal::LoadParsedConfig(doc, root, source, rest, internal::FieldErrors::kAll,
                                       t.errors_);
  if (options.model_path.empty()) {
    // Built from the arguments (ModelFromArguments: Megatron's GPT with the architecture flags
    // given), not a Hugging Face model of its model_type.
    s.model_label = launch.kind == MegatronLaunch::Kind::kCommandLine
                        ? "-- ARGS (Megatron arguments)"
                        : launch.label + " (Megatron arguments)";
  }
  // The reader's and translator's warnings first, then the loader's (near-miss model keys,
  // --capacity).
  std::vector<std::string> warnings = launch.warnings;
  warnings.insert(warnings.end(), t.warnings_.begin(), t.warnings_.end());
  s.warnings.insert(s.warnings.begin(), warnings.begin(), warnings.end());
  s.not_modelled.insert(s.not_modelled.begin(), t.not_modelled_.begin(), t.not_modelled_.end());
  s.notes.insert(s.notes.begin(), t.notes_.begin(), t.notes_.end());
  s.notes.insert(s.notes.begin(), launch.notes.begin(), launch.notes.end());
  return s;
}

// Every reading error of the launch in one run: the arguments whose values could not be read
// (left out), then the values the loader refuses; an error that stops the reading before the
// loader (no device, no model, a derived argument) comes after the first, unless it may follow
// from one of them (it names the flag: ThrowFieldErrors).
Setup TranslateAndLoad(const MegatronLaunch& launch, const LoadOptions& options,
                       const MegatronOptions& megatron) {
  Translator t(launch, megatron);
  t.Run();
  bool loading = false;
  try {
    return LoadTranslated(launch, options, t, &loading);
  } catch (const InputError& e) {
    if (loading || t.errors_.empty()) throw;
    internal::ThrowFieldErrors(t.errors_, launch.label, &e);
  }
}

}  // namespace

Setup LoadSetupFromMegatron(const MegatronLaunch& launch, const LoadOptions& options,
                            const MegatronOptions& megatron) {
  try {
    return TranslateAndLoad(launch, options, megatron);
  } catch (const UnsupportedError&) {
    throw;  // about a flag, not a value
  } catch (const InputError& e) {
    throw InputError(WithLineWarnings(e.what(), launch));
  }
}

}  // namespace memsim::config
