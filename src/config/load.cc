// LoadSetup: the training config (Megatron-LM argument names) plus model file plus device preset
// -> Setup. See load.h and docs/config.md.
#include "config/load.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string_view>

#include <fmt/core.h>

#include "config/embedded.h"
#include "config/parts.h"
#include "config/reader.h"
#include "core/error.h"

namespace memsim::config {
namespace {

using internal::Child;
using internal::Describe;
using internal::Fail;
using internal::Json;
using internal::ObjectReader;
using internal::Source;

namespace fs = std::filesystem;

// A text and how to name it: a disk path, or "<embedded>/<relative path>".
struct Document {
  std::string label;  // shown in messages and kept in Setup
  std::string text;
  bool embedded = false;
  std::string embedded_path;  // relative path within the embedded set
};

bool ReadFile(const std::string& path, std::string* text) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return !in.bad();
}

std::string Normal(const fs::path& p) { return p.lexically_normal().generic_string(); }

std::optional<Document> FindEmbeddedDocument(const std::string& relative) {
  const std::string normal = Normal(fs::path(relative));
  const std::string_view* text = FindEmbedded(normal);
  if (text == nullptr) return std::nullopt;
  return Document{std::string(kEmbeddedPrefix) + normal, std::string(*text), true, normal};
}

// Resolves `ref` (a path as written in `from`) relative to the document `from`.
// Returns the label used in messages and, when found, the document.
std::optional<Document> Resolve(const Document& from, const std::string& ref, std::string* label) {
  if (from.embedded) {
    const fs::path rel = fs::path(from.embedded_path).parent_path() / ref;
    *label = std::string(kEmbeddedPrefix) + Normal(rel);
    return FindEmbeddedDocument(Normal(rel));
  }
  fs::path p(ref);
  if (p.is_relative()) p = fs::path(from.label).parent_path() / p;
  *label = Normal(p);
  Document d{*label, "", false, ""};
  if (!ReadFile(*label, &d.text)) return std::nullopt;
  return d;
}

bool LooksLikePath(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.ends_with(".json"));
}

// --set KEY=VALUE -> (pointer, value).
void ApplyOverride(const std::string& text, Json* root, Source* source) {
  const size_t eq = text.find('=');
  // Echoed safely: invalid UTF-8 replaced, long keys and values shortened.
  const std::string label =
      "--set " + (eq == std::string::npos
                      ? internal::Printable(text)
                      : internal::Printable(std::string_view(text).substr(0, eq)) + "=" +
                            internal::Printable(std::string_view(text).substr(eq + 1)));
  if (eq == std::string::npos || eq == 0) {
    throw InputError(fmt::format("{}: expected KEY=VALUE, e.g. training.micro_batch_size=2", label));
  }
  const std::string key = text.substr(0, eq);
  const std::string raw = text.substr(eq + 1);
  const size_t dot = key.find('.');
  const std::string section = dot == std::string::npos ? key : key.substr(0, dot);
  if (dot == std::string::npos || (section != "training" && section != "allocator") ||
      dot + 1 == key.size()) {
    throw InputError(fmt::format("{}: expected a key training.<name> or allocator.<name>", label));
  }
  const std::string name = key.substr(dot + 1);
  Json value;
  if (raw == "True" || raw == "False") {
    value = raw == "True";
  } else if (internal::FindTooDeep(raw)) {
    throw InputError(fmt::format("{}: value nested deeper than memsim's limit of {} levels", label,
                                 internal::kMaxJsonDepth));
  } else {
    try {
      value = Json::parse(raw);
    } catch (const Json::exception&) {
      value = raw;  // a bare word: a string
    }
  }
  Json& sec = (*root)[section];
  if (sec.is_null()) sec = Json::object();
  if (!sec.is_object()) {
    throw InputError(fmt::format("{}: {}: /{} is not an object", label, source->file, section));
  }
  sec[name] = value;
  source->set_labels[Child("/" + section, name)] = label;
}

DevicePreset ReadDevice(const Document& doc) {
  Source s{doc.label, {}};
  return internal::ReadDevicePreset(s, internal::ParseJson(doc.text, doc.label), "");
}

std::string KnownDevices() {
  std::string out;
  for (const std::string& n : EmbeddedDeviceNames()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The file at path `ref`: relative to the document `from` (which may itself be embedded), or to
// the working directory when `from` is null. Sets *label to the name used in messages.
std::optional<Document> ReadByPath(const std::string& ref, const Document* from, std::string* label) {
  if (from != nullptr) return Resolve(*from, ref, label);
  *label = Normal(fs::path(ref));
  Document d{*label, "", false, ""};
  if (!ReadFile(*label, &d.text)) return std::nullopt;
  return d;
}

// A device by preset name (embedded) or path; `location` names where the reference was written.
DevicePreset LoadDevice(const std::string& ref, const std::string& location, const Document* from,
                        std::string* device_path) {
  if (ref.empty()) Fail(location, "expected a device preset name or a path to a preset file");
  if (LooksLikePath(ref)) {
    std::string label;
    const std::optional<Document> doc = ReadByPath(ref, from, &label);
    if (!doc) Fail(location, fmt::format("cannot read device preset file '{}'", internal::Printable(label)));
    *device_path = doc->label;
    return ReadDevice(*doc);
  }
  std::optional<Document> doc = FindEmbeddedDocument("configs/devices/" + ref + ".json");
  if (!doc) {
    std::string message = fmt::format("unknown device preset '{}'", internal::Printable(ref));
    const std::string guess = ClosestMatch(ref, EmbeddedDeviceNames());
    if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
    message += fmt::format("; known presets: {}; or give a path to a preset file", KnownDevices());
    Fail(location, message);
  }
  *device_path = doc->label;
  return ReadDevice(*doc);
}

std::vector<std::string> EmbeddedModelNames() {
  std::vector<std::string> out;
  constexpr std::string_view kDir = "models/";
  for (const EmbeddedFile& f : EmbeddedFiles()) {
    if (f.path.starts_with(kDir) && f.path.ends_with(".json")) {
      out.emplace_back(f.path.substr(kDir.size(), f.path.size() - kDir.size() - 5));
    }
  }
  return out;
}

// A model by shipped name ("llama2-7b", embedded models/NAME.json) or path (relative to `from`,
// or to the working directory when `from` is null).
Document LoadModelDocument(const std::string& ref, const std::string& location, const Document* from) {
  if (ref.empty()) Fail(location, "expected a path to a model file or a shipped model name");
  if (!LooksLikePath(ref)) {
    std::optional<Document> doc = FindEmbeddedDocument("models/" + ref + ".json");
    if (doc) return *doc;
    std::string known;
    for (const std::string& n : EmbeddedModelNames()) known += (known.empty() ? "" : ", ") + n;
    std::string message = fmt::format("unknown model '{}'", internal::Printable(ref));
    const std::string guess = ClosestMatch(ref, EmbeddedModelNames());
    if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
    message += fmt::format("; shipped models: {}; or give a path to a model file", known);
    Fail(location, message);
  }
  std::string label;
  const std::optional<Document> doc = ReadByPath(ref, from, &label);
  if (!doc) Fail(location, fmt::format("cannot read model file '{}'", internal::Printable(label)));
  return *doc;
}

// Keys of the training block, in groups (docs/config.md).
const std::vector<std::string> kTrainingKeys = {
    "framework", "seq_length", "micro_batch_size", "global_batch_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
    "sequence_parallel", "precision", "fp16", "bf16", "accumulate_allreduce_grads_in_fp32",
    "optimizer", "optimizer_impl", "weight_decay", "sgd_momentum", "use_distributed_optimizer",
    "overlap_grad_reduce", "overlap_param_gather", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "recompute_modules", "use_flash_attn", "transformer_impl",
    "gradient_accumulation_fusion", "transformer_engine_version", "megatron_core_version",
    "train_iters", "empty_unused_memory_level", "gradient_accumulation_steps",
    // recognised; unsupported when set to what memsim does not model
    "zero_stage", "use_megatron_fsdp", "data_parallel_sharding_strategy", "load", "no_load_optim",
    "finetune", "enable_cuda_graph", "cuda_graph_impl", "fp8", "fp8_format",
    // accepted; only meaningful for mixture-of-experts models (which are unsupported)
    "moe_token_dispatcher_type", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
    "moe_grouped_gemm", "moe_enable_deepep", "moe_router_topk",
    // accepted; no effect on memory
    "ckpt_format", "save", "save_interval", "lr", "min_lr", "lr_decay_style", "lr_warmup_iters",
    "clip_grad", "adam_beta1", "adam_beta2", "adam_eps", "init_method_std", "seed",
    "log_interval", "eval_interval", "eval_iters", "tokenizer_type", "norm_epsilon",
    "rotary_base", "attention_softmax_in_fp32"};

const std::vector<std::string> kNoMemoryEffect = {
    "ckpt_format", "save", "save_interval", "lr", "min_lr", "lr_decay_style", "lr_warmup_iters",
    "clip_grad", "adam_beta1", "adam_beta2", "adam_eps", "init_method_std", "seed",
    "log_interval", "eval_interval", "eval_iters", "tokenizer_type", "norm_epsilon",
    "rotary_base", "attention_softmax_in_fp32"};
const std::vector<std::string> kMoeOnly = {
    "moe_token_dispatcher_type", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
    "moe_grouped_gemm", "moe_enable_deepep", "moe_router_topk"};

// Reads the training keys that do not depend on the model. Unsupported features first, so that a
// config for another stack reports "unsupported" rather than its first unknown key.
void ReadUnsupported(ObjectReader& t) {
  if (std::optional<std::string> fw = t.String("framework"); fw && *fw != "megatron") {
    throw UnsupportedError(fmt::format("{}: framework '{}' (memsim models Megatron-LM only)",
                                       t.At("framework"), internal::Printable(*fw)));
  }
  const bool fsdp = t.Bool("use_megatron_fsdp").value_or(false);
  if (std::optional<std::string> s =
          t.Choice("data_parallel_sharding_strategy",
                   {"no_shard", "optim", "optim_grads", "optim_grads_params"});
      fsdp && s == "optim_grads_params") {
    throw UnsupportedError(
        fmt::format("{}: Megatron-FSDP sharding 'optim_grads_params' (sharded "
                    "weights, gathered per layer; memsim models no_shard, "
                    "optim and optim_grads)",
                    t.At("data_parallel_sharding_strategy")));
  }
  if (std::optional<int> z = t.IntInRange("zero_stage", 0, 3); !fsdp && z && *z >= 2) {
    throw UnsupportedError(
        fmt::format("{}: ZeRO stage {} (memsim models ZeRO-1, Megatron's "
                    "distributed optimizer, and Megatron-FSDP's optim and "
                    "optim_grads)",
                    t.At("zero_stage"), *z));
  }
  if (std::optional<int> ep = t.PositiveInt("expert_model_parallel_size"); ep && *ep > 1) {
    throw UnsupportedError(fmt::format("{}: expert parallelism (mixture of experts)",
                                       t.At("expert_model_parallel_size")));
  }
  if (std::optional<int> etp = t.PositiveInt("expert_tensor_parallel_size"); etp && *etp > 1) {
    throw UnsupportedError(fmt::format("{}: expert tensor parallelism (mixture of experts)",
                                       t.At("expert_tensor_parallel_size")));
  }
  if (std::optional<bool> g = t.Bool("enable_cuda_graph"); g.value_or(false)) {
    throw UnsupportedError(fmt::format("{}: CUDA graphs", t.At("enable_cuda_graph")));
  }
  if (std::optional<std::string> g = t.String("cuda_graph_impl"); g && *g != "none") {
    throw UnsupportedError(fmt::format("{}: CUDA graphs ('{}')", t.At("cuda_graph_impl"),
                                       internal::Printable(*g)));
  }
  for (const char* key : {"fp8", "fp8_format"}) {
    if (const Json* v = t.Get(key); v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
      throw UnsupportedError(fmt::format("{}: FP8 training", t.At(key)));
    }
  }
  std::optional<std::string> load = t.String("load");
  const bool no_load_optim = t.Bool("no_load_optim").value_or(false);
  const bool finetune = t.Bool("finetune").value_or(false);
  if (load && !load->empty() && !no_load_optim && !finetune) {
    throw UnsupportedError(fmt::format(
        "{}: resuming from a checkpoint with optimizer state (set no_load_optim to load "
        "weights only)",
        t.At("load")));
  }
}

// A software version "MAJOR[.MINOR[.PATCH]]" (a leading "v" or "core_v"/"core_r" as in release
// tags is accepted) as {major, minor}; {} when absent. `example` is quoted in the error.
std::vector<int> Version(ObjectReader& t, std::string_view key, std::string_view example) {
  const Json* json = t.Get(key);
  if (json == nullptr || json->is_null()) {
    t.Skip(std::string(key));
    return {};
  }
  const std::string expected = fmt::format("expected a version string such as \"{}\"", example);
  if (json->is_number()) {
    // A JSON number drops trailing zeros (2.10 reads as 2.1), so it is never taken as a version.
    Fail(t.At(key), fmt::format("{}, got the number {} (quote it; with --set: "
                                "'training.{}=\"{}\"')",
                                expected, Describe(*json), key, example));
  }
  std::optional<std::string> v = t.String(key);
  std::string_view text = *v;
  for (std::string_view prefix : {"core_v", "core_r", "v"}) {
    if (text.substr(0, prefix.size()) == prefix) {
      text.remove_prefix(prefix.size());
      break;
    }
  }
  // One to three dot-separated groups of one to six digits.
  std::vector<int> parts;
  bool ok = true;
  size_t start = 0;
  while (ok) {
    const size_t dot = std::min(text.find('.', start), text.size());
    const std::string_view group = text.substr(start, dot - start);
    ok = !group.empty() && group.size() <= 6 && parts.size() < 3 &&
         std::all_of(group.begin(), group.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (ok) parts.push_back(std::stoi(std::string(group)));
    if (dot == text.size()) break;
    start = dot + 1;
  }
  if (!ok) Fail(t.At(key), fmt::format("{}, got {}", expected, Describe(*json)));
  parts.resize(2, 0);
  return parts;
}

// Megatron-FSDP (use_megatron_fsdp true): the sharding strategy, from
// data_parallel_sharding_strategy (Megatron-LM's default "no_shard") or from the equivalent
// zero_stage (0, 1, 2); the two must agree when both are given. Megatron-FSDP builds its optimizer
// through the distributed-optimizer path (megatron/core/optimizer/distrib_optimizer.py returns
// early for it) and shards optimizer state exactly when the strategy says so, so
// use_distributed_optimizer follows the strategy. Pipeline parallelism and fp32 parameters with
// Megatron-FSDP are not modelled (reported unsupported).
void ReadMegatronFsdp(ObjectReader& t, const std::optional<std::string>& sharding,
                      std::optional<int> zero, TrainingConfig& c, std::vector<std::string>* notes) {
  if (c.pipeline_model_parallel_size > 1) {
    throw UnsupportedError(
        fmt::format("{}: Megatron-FSDP with pipeline parallelism (memsim models "
                    "Megatron-FSDP with pipeline_model_parallel_size 1)",
                    t.At("pipeline_model_parallel_size")));
  }
  if (c.precision == Precision::kFp32) {
    throw UnsupportedError(
        fmt::format("{}: Megatron-FSDP with fp32 parameters (memsim models "
                    "Megatron-FSDP for bf16 and fp16)",
                    t.At("use_megatron_fsdp")));
  }
  static const char* const kNames[] = {"no_shard", "optim", "optim_grads"};
  int stage = 0;
  if (sharding) {
    stage = *sharding == "optim_grads" ? 2 : *sharding == "optim" ? 1 : 0;
    if (zero && *zero != stage) {
      Fail(t.At("zero_stage"),
           fmt::format("{} disagrees with data_parallel_sharding_strategy \"{}\" (ZeRO stage {} "
                       "under Megatron-FSDP)",
                       *zero, *sharding, stage));
    }
  } else if (zero) {
    if (*zero == 3) {
      throw UnsupportedError(
          fmt::format("{}: ZeRO stage 3 (Megatron-FSDP optim_grads_params, not "
                      "modelled)",
                      t.At("zero_stage")));
    }
    stage = *zero;
    notes->push_back(fmt::format("{}: Megatron-FSDP sharding taken as \"{}\"", t.At("zero_stage"),
                                 kNames[stage]));
  } else {
    notes->push_back(fmt::format("{}: absent, Megatron-LM's default \"no_shard\" taken",
                                 t.At("data_parallel_sharding_strategy")));
  }
  c.fsdp_sharding = stage == 2   ? FsdpSharding::kOptimGrads
                    : stage == 1 ? FsdpSharding::kOptim
                                 : FsdpSharding::kNoShard;
  const bool sharded = stage > 0;
  if (c.use_distributed_optimizer != sharded) {
    notes->push_back(fmt::format("{}: taken as {}: Megatron-FSDP \"{}\" {} the optimizer state",
                                 t.At("use_distributed_optimizer"), sharded ? "true" : "false",
                                 kNames[stage], sharded ? "shards" : "does not shard"));
    c.use_distributed_optimizer = sharded;
  }
}

TrainingConfig ReadTraining(ObjectReader& t, std::vector<std::string>* notes) {
  TrainingConfig c;
  c.framework = "megatron";
  if (std::optional<int> v = t.PositiveInt("seq_length")) {
    c.seq_length = *v;
  } else {
    Fail(t.At("seq_length"), "missing key, expected a positive integer (tokens per sample)");
  }
  c.micro_batch_size = t.PositiveInt("micro_batch_size").value_or(1);
  c.tensor_model_parallel_size = t.PositiveInt("tensor_model_parallel_size").value_or(1);
  c.pipeline_model_parallel_size = t.PositiveInt("pipeline_model_parallel_size").value_or(1);
  c.data_parallel_size = t.PositiveInt("data_parallel_size").value_or(1);
  c.context_parallel_size = t.PositiveInt("context_parallel_size").value_or(1);
  c.expert_model_parallel_size = 1;
  if (std::optional<int> g = t.PositiveInt("global_batch_size")) {
    c.global_batch_size = *g;
  } else {
    // Megatron arguments.py: global_batch_size defaults to micro_batch_size × DP.
    c.global_batch_size = c.micro_batch_size * c.data_parallel_size;
    notes->push_back(fmt::format("{}: absent, micro_batch_size × data_parallel_size = {} taken "
                                 "(Megatron's default)",
                                 t.At("global_batch_size"), c.global_batch_size));
  }
  std::optional<int> vpp = t.PositiveInt("num_layers_per_virtual_pipeline_stage");
  std::optional<int> vstages = t.PositiveInt("num_virtual_stages_per_pipeline_rank");
  if (vpp && vstages) {
    Fail(t.At("num_virtual_stages_per_pipeline_rank"),
         "give num_layers_per_virtual_pipeline_stage or num_virtual_stages_per_pipeline_rank, not both");
  }
  c.num_layers_per_virtual_pipeline_stage = vpp.value_or(0);
  c.sequence_parallel = t.Bool("sequence_parallel").value_or(false);

  // precision, and Megatron's --fp16 / --bf16 flags, which must agree with it.
  std::optional<std::string> precision = t.Choice("precision", {"fp32", "fp16", "bf16"});
  std::optional<bool> fp16 = t.Bool("fp16");
  std::optional<bool> bf16 = t.Bool("bf16");
  if (fp16.value_or(false) && bf16.value_or(false)) Fail(t.At("bf16"), "fp16 and bf16 are both true");
  std::string from_flags = fp16.value_or(false) ? "fp16" : bf16.value_or(false) ? "bf16" : "";
  if (precision && !from_flags.empty() && *precision != from_flags) {
    Fail(t.At(from_flags), fmt::format("true disagrees with precision \"{}\"", *precision));
  }
  if (precision && *precision != "fp16" && fp16.has_value() && *fp16) {
    Fail(t.At("fp16"), fmt::format("true disagrees with precision \"{}\"", *precision));
  }
  for (const char* flag : {"fp16", "bf16"}) {
    const std::optional<bool>& f = std::string_view(flag) == "fp16" ? fp16 : bf16;
    if (precision && *precision == flag && f.has_value() && !*f) {
      Fail(t.At(flag), fmt::format("false disagrees with precision \"{}\"", *precision));
    }
  }
  // Megatron trains in fp32 unless --fp16 or --bf16 is given: an explicit "bf16": false without a
  // precision means fp32 (memsim's own default, bf16, applies only when nothing is said).
  const bool fp32_by_flags = !precision && from_flags.empty() && bf16.has_value() && !*bf16;
  if (fp32_by_flags) {
    notes->push_back(
        fmt::format("{}: false and no fp16 or precision: fp32, as Megatron", t.At("bf16")));
  }
  const std::string p = precision             ? *precision
                        : !from_flags.empty() ? from_flags
                        : fp32_by_flags       ? "fp32"
                                              : "bf16";
  c.precision = p == "fp32" ? Precision::kFp32 : p == "fp16" ? Precision::kFp16 : Precision::kBf16;
  c.accumulate_allreduce_grads_in_fp32 = t.Bool("accumulate_allreduce_grads_in_fp32").value_or(false);
  if (c.precision == Precision::kBf16 && !c.accumulate_allreduce_grads_in_fp32) {
    // Megatron arguments.py (validate_args): bf16 requires gradient accumulation and
    // all-reduce in fp32, so it switches the flag on.
    c.accumulate_allreduce_grads_in_fp32 = true;
    notes->push_back(fmt::format("{}: set to true for bf16, as Megatron does",
                                 t.At("accumulate_allreduce_grads_in_fp32")));
  }

  if (std::optional<std::string> o = t.Choice("optimizer", {"adam", "adamw", "sgd"})) {
    c.optimizer = *o == "sgd" ? OptimizerKind::kSgd : OptimizerKind::kAdam;
    if (*o == "adamw") {
      notes->push_back(fmt::format("{}: 'adamw' taken as Megatron's 'adam' (which is AdamW)",
                                   t.At("optimizer")));
    }
  }
  if (std::optional<std::string> o = t.Choice("optimizer_impl", {"fused", "foreach"})) {
    c.optimizer_impl = *o == "foreach" ? OptimizerImpl::kForeach : OptimizerImpl::kFused;
  }
  c.weight_decay = t.Number("weight_decay", 0, 1e6, false, false).value_or(0.01);
  c.sgd_momentum = t.Number("sgd_momentum", 0, 1, false, true).value_or(0.9);
  c.use_distributed_optimizer = t.Bool("use_distributed_optimizer").value_or(false);
  c.use_megatron_fsdp = t.Bool("use_megatron_fsdp").value_or(false);
  const std::optional<std::string> sharding =
      t.Choice("data_parallel_sharding_strategy",
               {"no_shard", "optim", "optim_grads", "optim_grads_params"});
  const std::optional<int> zero = t.IntInRange("zero_stage", 0, 3);
  if (c.use_megatron_fsdp) {
    ReadMegatronFsdp(t, sharding, zero, c, notes);
  } else {
    if (sharding && *sharding != "no_shard") {
      // Megatron-LM reads --data-parallel-sharding-strategy only with --use-megatron-fsdp.
      Fail(t.At("data_parallel_sharding_strategy"),
           fmt::format("\"{}\" applies to Megatron-FSDP only; set use_megatron_fsdp true, or "
                       "use_distributed_optimizer for Megatron's ZeRO-1",
                       *sharding));
    }
    if (zero == 0 && c.use_distributed_optimizer) {
      Fail(t.At("zero_stage"), "0 disagrees with use_distributed_optimizer true (ZeRO-1)");
    }
    if (zero == 1 && !c.use_distributed_optimizer) {
      c.use_distributed_optimizer = true;
      notes->push_back(
          fmt::format("{}: ZeRO-1 taken as use_distributed_optimizer true", t.At("zero_stage")));
    }
  }
  c.overlap_grad_reduce = t.Bool("overlap_grad_reduce").value_or(false);
  c.overlap_param_gather = t.Bool("overlap_param_gather").value_or(false);
  if (c.overlap_param_gather && !c.use_distributed_optimizer && !c.use_megatron_fsdp) {
    // Megatron arguments.py: --overlap-param-gather needs the distributed optimizer or
    // Megatron-FSDP.
    Fail(t.At("overlap_param_gather"),
         "true needs use_distributed_optimizer or use_megatron_fsdp true (as in Megatron)");
  }
  if (c.use_megatron_fsdp && c.fsdp_sharding == FsdpSharding::kOptimGrads &&
      !c.overlap_grad_reduce) {
    // MegatronFSDP.__init__ switches overlap_grad_reduce on for optim_grads, but Megatron-LM's
    // get_model has already set bucket_size to None (one bucket) when it was off at launch.
    notes->push_back(fmt::format(
        "{}: false with Megatron-FSDP \"optim_grads\": Megatron-FSDP overlaps the reduce-scatter "
        "anyway, with the whole model in one bucket (a full-size gradient temporary each "
        "backward); set true for max(4e7, 1e6·d·cp)-element buckets",
        t.At("overlap_grad_reduce")));
  }

  std::optional<std::string> g = t.Choice("recompute_granularity", {"none", "selective", "full"});
  const std::string granularity = g.value_or("none");
  c.recompute_granularity = granularity == "full"        ? RecomputeGranularity::kFull
                            : granularity == "selective" ? RecomputeGranularity::kSelective
                                                         : RecomputeGranularity::kNone;
  std::optional<std::string> method = t.Choice("recompute_method", {"uniform", "block"});
  std::optional<int> num_layers = t.PositiveInt("recompute_num_layers");
  if (c.recompute_granularity == RecomputeGranularity::kFull) {
    if (!method) {
      notes->push_back(fmt::format("{}: absent with full recompute, 'uniform' taken",
                                   t.At("recompute_method")));
    }
    c.recompute_method = method.value_or("uniform") == "block" ? RecomputeMethod::kBlock
                                                              : RecomputeMethod::kUniform;
    c.recompute_num_layers = num_layers.value_or(1);
  } else if (method) {
    // Megatron arguments.py: recompute_method is only for full recompute.
    Fail(t.At("recompute_method"), fmt::format("applies only to recompute_granularity \"full\", "
                                               "got recompute_granularity \"{}\"",
                                               granularity));
  }
  if (const Json* mods = t.Get("recompute_modules")) {
    // Megatron --recompute-modules choices (arguments.py).
    const std::vector<std::string> choices = {"core_attn", "moe_act", "layernorm", "mla_up_proj",
                                              "mlp", "moe", "shared_experts"};
    if (!mods->is_array()) {
      Fail(t.At("recompute_modules"), fmt::format("expected a list of module names, got {}", Describe(*mods)));
    }
    c.recompute_modules.clear();
    for (size_t i = 0; i < mods->size(); ++i) {
      const Json& m = (*mods)[i];
      const std::string at = t.source().At(Child(t.PointerOf("recompute_modules"), std::to_string(i)));
      if (!m.is_string() || std::find(choices.begin(), choices.end(), m.get<std::string>()) == choices.end()) {
        std::string list;
        for (const std::string& ch : choices) list += (list.empty() ? "'" : ", '") + ch + "'";
        Fail(at, fmt::format("expected one of {}, got {}", list, Describe(m)));
      }
      c.recompute_modules.push_back(m.get<std::string>());
    }
  }
  c.use_flash_attn = t.Bool("use_flash_attn").value_or(false);
  c.transformer_impl = t.Choice("transformer_impl", {"transformer_engine", "local"}).value_or("transformer_engine");
  c.gradient_accumulation_fusion = t.Bool("gradient_accumulation_fusion").value_or(true);
  if (c.use_megatron_fsdp && c.gradient_accumulation_fusion) {
    // Megatron-Bridge's ConfigContainer.validate (src/megatron/bridge/training/config.py, r0.2.0)
    // switches the fusion off whenever Megatron-FSDP is on; Megatron-LM's own launcher does not.
    notes->push_back(
        fmt::format("{}: true with Megatron-FSDP; Megatron-Bridge (NeMo) launches turn "
                    "it off, set false for those",
                    t.At("gradient_accumulation_fusion")));
  }
  c.transformer_engine_version = Version(t, "transformer_engine_version", "2.9");
  c.megatron_core_version = Version(t, "megatron_core_version", "0.15");
  c.train_iters = t.PositiveInt("train_iters").value_or(4);
  c.empty_unused_memory_level = t.IntInRange("empty_unused_memory_level", 0, 2).value_or(0);

  for (const std::string& key : kMoeOnly) {
    if (t.Get(key) != nullptr) notes->push_back(fmt::format("{}: ignored (dense model)", t.At(key)));
  }
  for (const std::string& key : kNoMemoryEffect) {
    if (t.Get(key) != nullptr) notes->push_back(fmt::format("{}: accepted, no effect on memory", t.At(key)));
  }
  for (const char* key : {"load", "no_load_optim", "finetune"}) t.Skip(key);
  if (t.Has("load")) notes->push_back(fmt::format("{}: weights loaded from a checkpoint (optimizer state not loaded)", t.At("load")));
  return c;
}

// Simulation-size limits (estimates, chosen so that every accepted setup simulates in about a
// minute at most and in about 2 GB). Each micro-batch is a forward and a backward pass of every
// layer of a stage; `memsim run` builds and replays one stage's Program at a time, all stages one
// after another, so time grows with the layer passes of all stages and memory with those of one
// stage. Measured (`memsim run` of configs/default.json, g++ 12 -O2 build, 2 shared cores): about
// 15 KB of peak RSS per layer pass of a stage (global_batch_size 1024 and 4096 at PP 4: 143 MB and
// 538 MB) and about 37 microseconds per layer pass of all stages (4096 at PP 4: 4.8 s for
// 131072 passes). So 2^17 passes per stage stay near 2 GB and 2^20 in all near 40 s.
constexpr int kMaxMicroBatches = 4096;
constexpr std::int64_t kMaxLayerPasses = std::int64_t{1} << 20;
constexpr std::int64_t kMaxStageLayerPasses = std::int64_t{1} << 17;

// memsim's bound on the bytes of one rank: any one tensor, and the weights, gradients and
// optimizer state of one pipeline stage, at most 2^50 bytes (1 PiB), far below the 2^60-byte
// request that PyTorch's allocator refuses and int64 overflow in sums.
constexpr double kMaxRankBytes = 1125899906842624.0;  // 2^50
// Bytes of weight, gradient and optimizer state per parameter, an upper bound: Megatron mixed
// precision with Adam keeps 2 (bf16 weight) + 4 (fp32 main grad) + 12 (fp32 main weight, exp_avg,
// exp_avg_sq) = 18 (Rajbhandari et al. 2020, ZeRO, section 3.1, counts 16 without the fp32 grad);
// rounded up to 20 for biases and buffers.
constexpr double kStateBytesPerParameter = 20;

// Cross-field rules, each with Megatron's source.
void Validate(Setup& s, const std::map<std::string, std::string>& where, const ObjectReader& t,
              std::optional<int> vstages) {
  ModelConfig& m = s.model;
  TrainingConfig& c = s.training;
  auto at_model = [&](const char* field) {
    auto it = where.find(field);
    return it == where.end() ? std::string(field) : it->second;
  };
  const int tp = c.tensor_model_parallel_size;
  const int pp = c.pipeline_model_parallel_size;
  // When a value from the model file conflicts with a training setting, the message names the
  // model file's field and, after it, the training config's (the file alone does not say which
  // config referenced it).
  auto also = [&](const char* field, const char* training_key) {
    auto it = where.find(field);
    const bool in_model_file = !s.model_path.empty() && it != where.end() &&
                               it->second.starts_with(s.model_path + ": ");
    return in_model_file ? fmt::format(" (training config {})", t.At(training_key)) : std::string();
  };
  // Megatron core: divide(num_attention_heads, TP) and divide(num_query_groups, TP) in
  // attention.py (ensure_divisibility).
  if (m.num_attention_heads % tp != 0) {
    Fail(at_model("num_attention_heads"),
         fmt::format("{} heads are not divisible by tensor_model_parallel_size {}{}",
                     m.num_attention_heads, tp,
                     also("num_attention_heads", "tensor_model_parallel_size")));
  }
  if (m.num_key_value_heads > m.num_attention_heads ||
      m.num_attention_heads % m.num_key_value_heads != 0) {
    Fail(at_model("num_key_value_heads"),
         fmt::format("{} key/value heads do not divide the {} attention heads",
                     m.num_key_value_heads, m.num_attention_heads));
  }
  if (m.num_key_value_heads % tp != 0) {
    Fail(at_model("num_key_value_heads"),
         fmt::format("{} key/value heads are not divisible by tensor_model_parallel_size {}{}",
                     m.num_key_value_heads, tp,
                     also("num_key_value_heads", "tensor_model_parallel_size")));
  }
  // Megatron core tensor_parallel/layers.py: the MLP's ColumnParallelLinear (fc1) and
  // RowParallelLinear (fc2) take divide(ffn_hidden_size, TP) columns / rows per rank
  // (ensure_divisibility), so ffn_hidden_size must be a multiple of TP.
  if (m.intermediate_size % tp != 0) {
    Fail(at_model("intermediate_size"),
         fmt::format("FFN hidden size {} is not divisible by tensor_model_parallel_size {}{}",
                     m.intermediate_size, tp,
                     also("intermediate_size", "tensor_model_parallel_size")));
  }
  // Megatron arguments.py: num_layers % pipeline_model_parallel_size == 0.
  if (m.num_hidden_layers % pp != 0) {
    Fail(at_model("num_hidden_layers"),
         fmt::format("{} layers are not divisible by pipeline_model_parallel_size {}{}",
                     m.num_hidden_layers, pp,
                     also("num_hidden_layers", "pipeline_model_parallel_size")));
  }
  const int layers_per_stage = m.num_hidden_layers / pp;
  if (vstages) {
    if (layers_per_stage % *vstages != 0) {
      Fail(t.At("num_virtual_stages_per_pipeline_rank"),
           fmt::format("{} layers per pipeline stage are not divisible into {} virtual stages",
                       layers_per_stage, *vstages));
    }
    c.num_layers_per_virtual_pipeline_stage = *vstages > 1 ? layers_per_stage / *vstages : 0;
  }
  if (c.num_layers_per_virtual_pipeline_stage > 0) {
    const std::string at = t.At(vstages ? "num_virtual_stages_per_pipeline_rank"
                                        : "num_layers_per_virtual_pipeline_stage");
    if (pp < 2) Fail(at, "needs pipeline_model_parallel_size > 1 (interleaved schedule)");
    // Megatron arguments.py: (num_layers // PP) % num_layers_per_virtual_pipeline_stage == 0.
    if (layers_per_stage % c.num_layers_per_virtual_pipeline_stage != 0) {
      Fail(at, fmt::format("{} layers per pipeline stage ({} layers / pipeline_model_parallel_size "
                           "{}) are not divisible by {}",
                           layers_per_stage, m.num_hidden_layers, pp,
                           c.num_layers_per_virtual_pipeline_stage));
    }
    if (c.num_layers_per_virtual_pipeline_stage == layers_per_stage) {
      c.num_layers_per_virtual_pipeline_stage = 0;  // one chunk per stage: not interleaved
    }
  }
  // Megatron microbatches.py: global batch divisible by micro batch × DP.
  const std::int64_t per_step = std::int64_t{c.micro_batch_size} * c.data_parallel_size;
  if (c.global_batch_size % per_step != 0) {
    Fail(t.At("global_batch_size"),
         fmt::format("{} is not divisible by micro_batch_size × data_parallel_size = {} × {}",
                     c.global_batch_size, c.micro_batch_size, c.data_parallel_size));
  }
  c.num_micro_batches = static_cast<int>(c.global_batch_size / per_step);
  if (std::int64_t{c.seq_length} * c.micro_batch_size > (std::int64_t{1} << 26)) {
    Fail(t.At("micro_batch_size"),
         fmt::format("seq_length × micro_batch_size = {} tokens exceeds memsim's limit of {}",
                     std::int64_t{c.seq_length} * c.micro_batch_size, std::int64_t{1} << 26));
  }
  if (c.num_micro_batches > kMaxMicroBatches) {
    Fail(t.At("global_batch_size"),
         fmt::format("{} micro-batches per iteration exceed memsim's limit of {}",
                     c.num_micro_batches, kMaxMicroBatches));
  }
  if (c.sequence_parallel && tp == 1) {
    // Megatron arguments.py: "Disabling sequence parallelism because tensor model parallelism
    // is disabled" (a warning, not an error).
    c.sequence_parallel = false;
    s.notes.push_back(fmt::format("{}: switched off because tensor_model_parallel_size is 1, as "
                                  "Megatron does",
                                  t.At("sequence_parallel")));
  }
  if (c.sequence_parallel && c.seq_length % tp != 0) {
    Fail(t.At("seq_length"), fmt::format("{} is not divisible by tensor_model_parallel_size {} "
                                         "(needed by sequence_parallel)",
                                         c.seq_length, tp));
  }
  if (c.context_parallel_size > 1 && c.seq_length % (2 * c.context_parallel_size) != 0) {
    // Megatron: with context parallelism each rank takes 2 chunks of the sequence.
    Fail(t.At("seq_length"), fmt::format("{} is not divisible by 2 × context_parallel_size = {}",
                                         c.seq_length, 2 * c.context_parallel_size));
  }
  if (m.position_embedding_type == PositionEmbedding::kLearnedAbsolute &&
      c.seq_length > m.max_position_embeddings) {
    Fail(t.At("seq_length"), fmt::format("{} exceeds max_position_embeddings {} (learned "
                                         "absolute position embeddings)",
                                         c.seq_length, m.max_position_embeddings));
  }
  if (c.recompute_granularity == RecomputeGranularity::kFull &&
      c.recompute_num_layers > layers_per_stage) {
    Fail(t.At("recompute_num_layers"),
         fmt::format("{} exceeds the {} layers per pipeline stage", c.recompute_num_layers,
                     layers_per_stage));
  }
  // Megatron _vocab_size_with_padding: multiple of make_vocab_size_divisible_by × TP.
  const std::int64_t multiple = std::int64_t{m.make_vocab_size_divisible_by} * tp;
  const std::int64_t padded = (m.vocab_size + multiple - 1) / multiple * multiple;
  if (padded > (std::int64_t{1} << 27)) {
    Fail(t.At("make_vocab_size_divisible_by"),
         fmt::format("padding vocab_size {} to a multiple of {} × tensor_model_parallel_size {} "
                     "gives {}, over memsim's limit of {}",
                     m.vocab_size, m.make_vocab_size_divisible_by, tp, padded, 1 << 27));
  }
  m.padded_vocab_size = static_cast<int>(padded);

  // Simulation size: iterations × micro-batches × layers, all stages and one stage (see
  // kMaxLayerPasses).
  const std::int64_t passes =
      std::int64_t{c.train_iters} * c.num_micro_batches * m.num_hidden_layers;
  if (passes > kMaxLayerPasses) {
    Fail(t.At("train_iters"),
         fmt::format("train_iters × micro-batches per iteration × num_hidden_layers = {} × {} × {} "
                     "= {} layer passes exceed memsim's limit of {}; reduce train_iters, "
                     "global_batch_size (micro-batches) or num_hidden_layers",
                     c.train_iters, c.num_micro_batches, m.num_hidden_layers, passes,
                     kMaxLayerPasses));
  }
  const std::int64_t stage_passes = passes / pp;
  if (stage_passes > kMaxStageLayerPasses) {
    Fail(t.At("train_iters"),
         fmt::format("train_iters × micro-batches per iteration × layers per pipeline stage = {} × "
                     "{} × {} = {} layer passes in one stage exceed memsim's limit of {} (memory "
                     "of the simulation); reduce train_iters, global_batch_size (micro-batches) or "
                     "num_hidden_layers{}",
                     c.train_iters, c.num_micro_batches, layers_per_stage, stage_passes,
                     kMaxStageLayerPasses,
                     c.use_megatron_fsdp ? "" : ", or raise pipeline_model_parallel_size"));
  }

  // Model size per rank, in double (the products can pass int64): weights, gradients and
  // optimizer state of the largest pipeline stage, and the largest activation of a micro-batch.
  const double h = m.hidden_size, ffn = m.intermediate_size;
  const double q = static_cast<double>(m.num_attention_heads) * m.head_dim;
  const double kv = static_cast<double>(m.num_key_value_heads) * m.head_dim;
  const double gamma = m.gated_mlp ? 2 : 1;
  // Per layer: QKV (h × (q + 2 kv)), output projection (q × h), MLP (γ h ffn + ffn h), and up to
  // 4 h of norms and biases; split over TP.
  const double per_layer = (h * (q + 2 * kv) + q * h + (gamma + 1) * h * ffn + 4 * h) / tp;
  // Embedding and output layer (both on one stage when PP = 1), and learned positions.
  const double embedding =
      2 * static_cast<double>(m.padded_vocab_size) * h / tp +
      (m.position_embedding_type == PositionEmbedding::kLearnedAbsolute
           ? static_cast<double>(m.max_position_embeddings) * h
           : 0);
  const double parameters = layers_per_stage * per_layer + embedding;
  if (parameters * kStateBytesPerParameter > kMaxRankBytes) {
    Fail(at_model("hidden_size"),
         fmt::format("model too large for memsim: about {:.3g} parameters per rank ({} layers per "
                     "stage × {:.3g} + {:.3g} embedding), {:.3g} bytes of weights, gradients and "
                     "optimizer state at {} bytes each, over memsim's limit of 2^50 bytes (1 PiB); "
                     "reduce hidden_size, intermediate_size, num_hidden_layers or vocab_size, or "
                     "raise tensor_model_parallel_size or pipeline_model_parallel_size",
                     parameters, layers_per_stage, per_layer, embedding,
                     parameters * kStateBytesPerParameter, kStateBytesPerParameter));
  }
  // Megatron-FSDP pads every bucket to a multiple of d·cp × the lcm of its weights' row widths
  // (h, q/TP, ffn/TP; workload/model.h LayoutGradBuffers). Odd widths make that multiple huge.
  if (c.use_megatron_fsdp && c.fsdp_sharding != FsdpSharding::kNoShard) {
    const std::int64_t widths[] = {m.hidden_size,
                                   std::int64_t{m.num_attention_heads} / tp * m.head_dim,
                                   std::int64_t{m.intermediate_size} / tp};
    double factor = 1;  // the lcm, in double once it passes 2^50 (then only its size matters)
    std::int64_t lcm = 1;
    for (std::int64_t w : widths) {
      if (w <= 0 || factor > kMaxRankBytes) continue;
      const std::int64_t step = w / std::gcd(lcm, w);
      factor = static_cast<double>(lcm) * static_cast<double>(step);
      if (factor <= kMaxRankBytes) lcm *= step;
    }
    const double buckets =
        c.overlap_grad_reduce ? 1 + std::floor(parameters / 4e7) : 1;  // bucket_size >= 4e7
    const double pad = factor * c.data_parallel_size * c.context_parallel_size * buckets;
    if ((parameters + pad) * kStateBytesPerParameter > kMaxRankBytes) {
      Fail(t.At("data_parallel_size"),
           fmt::format(
               "model too large for memsim: Megatron-FSDP pads each of {:.3g} bucket(s) to a "
               "multiple of data_parallel_size × context_parallel_size × lcm(hidden_size, "
               "heads/TP × head_dim, ffn/TP) = {:.3g} elements, over memsim's limit of "
               "2^50 bytes (1 PiB) with the weights, gradients and optimizer state; reduce "
               "data_parallel_size or use widths with common factors",
               buckets, factor * c.data_parallel_size * c.context_parallel_size));
    }
  }
  // Largest activation of one micro-batch, at 4 bytes an element (fp32, the widest): attention
  // scores b × heads/TP × (seq/CP) × seq without flash attention, logits T × V/TP, the MLP's
  // T × γ ffn/TP, the QKV output T × (q + 2 kv)/TP, T = seq/CP × b tokens.
  const double tokens = static_cast<double>(c.seq_length) / c.context_parallel_size * c.micro_batch_size;
  double largest = std::max({tokens * m.padded_vocab_size / tp, tokens * gamma * ffn / tp,
                             tokens * (q + 2 * kv) / tp, tokens * h});
  if (!c.use_flash_attn) {
    largest = std::max(largest, tokens * (static_cast<double>(m.num_attention_heads) / tp) * c.seq_length);
  }
  if (largest * 4 > kMaxRankBytes) {
    Fail(t.At("seq_length"),
         fmt::format("model too large for memsim: one activation of a micro-batch would take "
                     "about {:.3g} bytes, over memsim's limit of 2^50 bytes (1 PiB); reduce "
                     "seq_length, micro_batch_size or the model's width{}",
                     largest * 4, c.use_flash_attn ? "" : ", or set use_flash_attn"));
  }
}

}  // namespace

namespace {

Setup LoadSetupUnguarded(const std::string& config_path, const LoadOptions& options) {
  Document config;
  if (config_path.empty()) {
    if (!options.use_embedded_default) throw InputError("no config file given");
    std::optional<Document> d = FindEmbeddedDocument("configs/default.json");
    if (!d) throw InputError("this build has no embedded default config");
    config = *d;
  } else {
    config.label = config_path;
    if (!ReadFile(config_path, &config.text)) {
      throw InputError(fmt::format("{}: cannot read the config file", config_path));
    }
  }
  Setup s;
  s.config_path = config.label;
  Source source{config.label, {}};
  Json root = internal::ParseJson(config.text, config.label);
  if (!root.is_object()) Fail(source.At(""), fmt::format("expected an object, got {}", Describe(root)));
  for (const std::string& o : options.overrides) ApplyOverride(o, &root, &source);
  if (options.iterations > 0) {  // --iterations N: training.train_iters, named as given
    ApplyOverride(fmt::format("training.train_iters={}", options.iterations), &root, &source);
    source.set_labels[Child("/training", "train_iters")] =
        fmt::format("--iterations {}", options.iterations);
  }

  ObjectReader top(source, root, "");
  top.RejectUnknown({"model", "device", "training", "allocator"});
  if (!top.Has("training")) Fail(top.At("training"), "missing key, expected the training settings");
  ObjectReader t(source, *top.Get("training"), "/training");
  // Unsupported features first, so that a config for another stack says "unsupported" rather
  // than naming its first unknown key; then unknown keys, before any value is read (a misspelt
  // key is reported as such, not as a missing one).
  ReadUnsupported(t);
  std::vector<std::string> known = kTrainingKeys;
  known.insert(known.end(), internal::MegatronArchitectureKeys().begin(),
               internal::MegatronArchitectureKeys().end());
  t.RejectUnknown(known);

  // Model: --model, a path relative to the config, or an inline object.
  internal::LocatedModel located;
  if (!options.model_path.empty()) {
    const Document d = LoadModelDocument(options.model_path, "--model " + internal::Printable(options.model_path), nullptr);
    Source ms{d.label, {}};
    located = internal::ReadHfModel(ms, internal::ParseJson(d.text, d.label), "", &s.notes);
    s.model_path = d.label;
    top.Skip("model");
  } else {
    const Json* model = top.Get("model");
    if (model == nullptr) {
      Fail(top.At("model"), "missing key, expected a path to a model file (Hugging Face config.json "
                            "form), a shipped model name or an inline object");
    }
    if (model->is_string()) {
      const Document d = LoadModelDocument(model->get<std::string>(), top.At("model"), &config);
      Source ms{d.label, {}};
      located = internal::ReadHfModel(ms, internal::ParseJson(d.text, d.label), "", &s.notes);
      s.model_path = d.label;
    } else if (model->is_object()) {
      located = internal::ReadHfModel(source, *model, "/model", &s.notes);
    } else {
      Fail(top.At("model"), fmt::format("expected a path to a model file or an object, got {}",
                                        Describe(*model)));
    }
  }
  internal::ApplyMegatronArchitecture(t, &located, &s.notes);
  s.model = located.model;
  s.training = ReadTraining(t, &s.notes);
  std::optional<int> vstages = t.PositiveInt("num_virtual_stages_per_pipeline_rank");
  std::optional<int> gas = t.PositiveInt("gradient_accumulation_steps");

  // Device: --device, or the config's "device" (a preset name, a path, or an inline object).
  if (!options.device.empty()) {
    s.device = LoadDevice(options.device, "--device " + internal::Printable(options.device), nullptr,
                          &s.device_path);
    top.Skip("device");
  } else {
    const Json* device = top.Get("device");
    if (device == nullptr) Fail(top.At("device"), fmt::format("missing key, expected a device preset name ({})", KnownDevices()));
    if (device->is_string()) {
      s.device = LoadDevice(device->get<std::string>(), top.At("device"), &config, &s.device_path);
    } else if (device->is_object()) {
      s.device = internal::ReadDevicePreset(source, *device, "/device");
      s.device_path = "";
    } else {
      Fail(top.At("device"), fmt::format("expected a device preset name, a path or an object, got {}", Describe(*device)));
    }
  }

  // Allocator block.
  if (const Json* a = top.Get("allocator")) {
    s.allocator = internal::ReadAllocatorBlock(source, *a, "/allocator", s.device.allocator_backend);
  } else {
    s.allocator.backend = s.device.allocator_backend;
  }
  if (options.capacity_bytes) {
    // --capacity replaces the device's usable memory (design.md "Capacity").
    if (*options.capacity_bytes <= 0) {
      throw InputError(fmt::format("--capacity: expected a positive size, got {}", *options.capacity_bytes));
    }
    if (*options.capacity_bytes > (Bytes{1} << 50)) {
      throw InputError(fmt::format("--capacity: {} bytes exceed memsim's limit of 2^50 (1 PiB)",
                                   *options.capacity_bytes));
    }
    s.notes.push_back(fmt::format("--capacity: usable memory {} bytes instead of the preset's {}",
                                  *options.capacity_bytes, s.device.usable_memory_bytes));
    s.device.usable_memory_bytes = *options.capacity_bytes;
  }
  s.allocator.capacity_bytes = s.device.usable_memory_bytes;

  // Transformer Engine runs only on CUDA; say which releases memsim assumed when none is stated
  // (they decide whether dummy weight grads are cached, workload/model.cc).
  const bool te = s.device.allocator_backend == alloc::Backend::kCuda &&
                  (s.training.transformer_impl == "transformer_engine" ||
                   !s.training.transformer_engine_version.empty());
  if (s.device.allocator_backend != alloc::Backend::kCuda) {
    for (const char* key : {"transformer_engine_version", "megatron_core_version"}) {
      if (t.Get(key) != nullptr && !t.Get(key)->is_null()) {
        s.notes.push_back(fmt::format("{}: no effect on this device (torch_npu has no Transformer "
                                      "Engine)",
                                      t.At(key)));
      }
    }
  }
  if (te && s.training.gradient_accumulation_fusion) {
    for (const char* key : {"transformer_engine_version", "megatron_core_version"}) {
      if (t.Get(key) == nullptr || t.Get(key)->is_null()) {
        s.notes.push_back(fmt::format(
            "{}: not stated, a current release taken (TE >= 2.3, Megatron-core >= 0.14: one "
            "cached weight-sized dummy gradient per weight shape stays allocated; "
            "docs/config.md)",
            t.At(key)));
      }
    }
  }
  Validate(s, located.where, t, vstages);
  if (gas && *gas != s.training.num_micro_batches) {
    Fail(t.At("gradient_accumulation_steps"),
         fmt::format("{} disagrees with global_batch_size / (micro_batch_size × data_parallel_size) "
                     "= {}",
                     *gas, s.training.num_micro_batches));
  }
  return s;
}

}  // namespace

Setup LoadSetup(const std::string& config_path, const LoadOptions& options) {
  // Backstop: every read above checks types first, so nlohmann should never throw; if it does,
  // the user still gets one InputError naming the config rather than a library exception.
  try {
    return LoadSetupUnguarded(config_path, options);
  } catch (const Json::exception& e) {
    throw InputError(fmt::format("{}: unexpected JSON error ({})",
                                 config_path.empty() ? "<embedded>/configs/default.json"
                                                     : internal::Printable(config_path),
                                 internal::Printable(e.what())));
  }
}

DevicePreset LoadDevicePreset(const std::string& name_or_path) {
  std::string path;
  return LoadDevice(name_or_path, internal::Printable(name_or_path), nullptr, &path);
}

std::string ModelName(const Setup& setup) {
  if (setup.model_path.empty()) return setup.model.model_type + " (inline)";
  const std::string stem = fs::path(setup.model_path).stem().string();
  // Generic file names say nothing; name the architecture instead.
  if (stem == "model" || stem == "config") return setup.model.model_type + " (" + stem + ".json)";
  return stem;
}

const std::string_view* FindEmbedded(std::string_view path) {
  const std::string normal = Normal(fs::path(std::string(path)));
  for (const EmbeddedFile& f : EmbeddedFiles()) {
    if (f.path == normal) return &f.text;
  }
  return nullptr;
}

std::vector<std::string> EmbeddedDeviceNames() {
  std::vector<std::string> out;
  constexpr std::string_view kDir = "configs/devices/";
  for (const EmbeddedFile& f : EmbeddedFiles()) {
    if (f.path.starts_with(kDir) && f.path.ends_with(".json")) {
      out.emplace_back(f.path.substr(kDir.size(), f.path.size() - kDir.size() - 5));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace memsim::config
