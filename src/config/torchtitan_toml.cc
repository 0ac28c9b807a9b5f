// LoadTorchtitanToml (torchtitan_toml.h): the TOML parsed by toml++ (the only file that includes
// it), each key of torchtitan's JobConfig (torchtitan/config/job_config.py at commit
// 31a17bfdb70bab6f62a13d21816a5339b911d6e3) read, passed as neutral, warned about or refused,
// and the framework "torchtitan" config that results loaded.
#include "config/torchtitan_toml.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "config/load_internal.h"
#include "config/reader.h"
#include "core/error.h"

namespace memsim::config::internal {

const std::vector<TorchtitanFlavor>& Llama3Flavors() {
  // torchtitan/models/llama3/__init__.py llama3_args (the sdpa flavors; "_flex" and "_varlen"
  // change the attention kernel only and are refused by name).
  static const std::vector<TorchtitanFlavor> flavors = {
      {"debugmodel", 256, 6, 16, 16, 0, 256, 500000},
      {"8B", 4096, 32, 32, 8, 1.3, 1024, 500000},
      {"70B", 8192, 80, 64, 8, 1.3, 4096, 500000},
      {"405B", 16384, 126, 128, 8, 1.2, 4096, 500000},
  };
  return flavors;
}

std::int64_t TorchtitanFfnHidden(const TorchtitanFlavor& f) {
  std::int64_t hidden = 2 * (std::int64_t{4} * f.dim) / 3;
  if (f.ffn_dim_multiplier > 0) {
    hidden = static_cast<std::int64_t>(f.ffn_dim_multiplier * static_cast<double>(hidden));
  }
  return (hidden + f.multiple_of - 1) / f.multiple_of * f.multiple_of;
}

namespace {

// The first line that is neither blank nor a '#' comment, trimmed.
std::string_view FirstStatement(std::string_view text) {
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())))
      line.remove_prefix(1);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
      line.remove_suffix(1);
    if (!line.empty() && line.front() != '#') return line;
  }
  return {};
}

// One value of the job config, by its dotted path ("training.seq_len").
struct Value {
  Json json;
  int line = 0;
};

// The TOML's leaf values by path, with the reads that check their types.
class JobConfig {
 public:
  JobConfig(const Document& doc, const toml::table& root) : doc_(doc) { Flatten(root, ""); }

  bool Has(const std::string& path) const { return values_.contains(path); }
  const Json* Get(const std::string& path) {
    const auto it = values_.find(path);
    if (it == values_.end()) return nullptr;
    read_.insert(path);
    return &it->second.json;
  }
  // "<file>:<line>: [section] key", or "<file>: [section] key (absent: torchtitan's default)".
  std::string At(const std::string& path) const {
    const size_t dot = path.rfind('.');
    const std::string name = fmt::format("[{}] {}", path.substr(0, dot), path.substr(dot + 1));
    const auto it = values_.find(path);
    if (it == values_.end())
      return fmt::format("{}: {} (absent: torchtitan's default)", doc_.label, name);
    return fmt::format("{}:{}: {}", doc_.label, it->second.line, name);
  }
  std::optional<std::int64_t> Int(const std::string& path) {
    const Json* v = Get(path);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer())
      Fail(At(path), fmt::format("expected an integer, got {}", Describe(*v)));
    return v->get<std::int64_t>();
  }
  std::optional<bool> Bool(const std::string& path) {
    const Json* v = Get(path);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean())
      Fail(At(path), fmt::format("expected true or false, got {}", Describe(*v)));
    return v->get<bool>();
  }
  std::optional<std::string> Choice(const std::string& path,
                                    const std::vector<std::string>& choices) {
    const Json* v = Get(path);
    if (v == nullptr) return std::nullopt;
    if (v->is_string()) {
      const std::string s = v->get<std::string>();
      for (const std::string& c : choices) {
        if (c == s) return s;
      }
    }
    std::string list;
    for (const std::string& c : choices) list += (list.empty() ? "'" : ", '") + c + "'";
    Fail(At(path), fmt::format("expected one of {}, got {}", list, Describe(*v)));
  }
  std::vector<std::string> Strings(const std::string& path) {
    const Json* v = Get(path);
    std::vector<std::string> out;
    if (v == nullptr) return out;
    if (!v->is_array())
      Fail(At(path), fmt::format("expected a list of strings, got {}", Describe(*v)));
    for (const Json& e : *v) {
      if (!e.is_string())
        Fail(At(path), fmt::format("expected a list of strings, got {}", Describe(*v)));
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  void Skip(const std::string& path) { read_.insert(path); }
  std::vector<std::string> Unread() const {
    std::vector<std::string> out;
    for (const auto& [path, v] : values_) {
      if (!read_.contains(path)) out.push_back(path);
    }
    return out;
  }
  const Document& doc() const { return doc_; }

 private:
  void Flatten(const toml::table& t, const std::string& prefix) {
    for (const auto& [key, node] : t) {
      const std::string path =
          prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
      if (const toml::table* sub = node.as_table()) {
        Flatten(*sub, path);
      } else {
        values_[path] = {ToJson(node), static_cast<int>(node.source().begin.line)};
      }
    }
  }
  static Json ToJson(const toml::node& n) {
    if (const auto* s = n.as_string()) return s->get();
    if (const auto* i = n.as_integer()) return i->get();
    if (const auto* f = n.as_floating_point()) return f->get();
    if (const auto* b = n.as_boolean()) return b->get();
    if (const auto* a = n.as_array()) {
      Json out = Json::array();
      for (const toml::node& e : *a) out.push_back(ToJson(e));
      return out;
    }
    return "(a TOML date, time or table)";  // never a value memsim reads
  }

  const Document& doc_;
  std::map<std::string, Value> values_;
  std::set<std::string> read_;
};

// What the translation collects: the training block with each key's label, and the report's
// lines.
struct Translation {
  Json training = Json::object();
  Source source;
  std::vector<std::string> assumed, warnings, notes;
  std::vector<NotModelled> not_modelled;

  void Set(const std::string& key, Json value, const std::string& label) {
    training[key] = std::move(value);
    source.set_labels[Child("/training", key)] = label;
  }
  void Warn(JobConfig& job, const std::string& path, std::string_view what,
            NotModelled::Direction errs) {
    warnings.push_back(fmt::format("{}: {}", job.At(path), what));
    not_modelled.push_back({job.At(path), path, {job.Get(path)->dump()}, errs, true});
  }
};

[[noreturn]] void Refuse(JobConfig& job, const std::string& path, std::string_view what) {
  throw UnsupportedError(fmt::format("{}: {}", job.At(path), what));
}

// [model]: name "llama3" and a flavor of Llama3Flavors, as an inline Hugging Face-form model.
Json ReadModel(JobConfig& job, Translation* t) {
  const std::string name = job.Choice("model.name", {"llama3"}).value_or("llama3");
  const Json* flavor_json = job.Get("model.flavor");
  const std::string flavor = flavor_json != nullptr && flavor_json->is_string()
                                 ? flavor_json->get<std::string>()
                                 : "debugmodel";
  const TorchtitanFlavor* f = nullptr;
  std::string names;
  for (const TorchtitanFlavor& c : Llama3Flavors()) {
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", c.name);
    if (c.name == flavor) f = &c;
  }
  if (f == nullptr) {
    Fail(job.At("model.flavor"),
         fmt::format("expected one of {} (torchtitan's {} flavors memsim reads), got {}", names,
                     name, flavor_json != nullptr ? Describe(*flavor_json) : "nothing"));
  }
  for (const std::string& c : job.Strings("model.converters")) {
    Refuse(job, "model.converters",
           fmt::format("converter '{}' (Float8 / MX training: torchao's fp8 weight copies and "
                       "scales, fp8 saved activations and all-gathers; memsim models bf16 and "
                       "would err high)",
                       Printable(c)));
  }
  for (const char* skip :
       {"model.hf_assets_path", "model.tokenizer_path", "model.print_after_conversion"})
    job.Skip(skip);
  t->assumed.push_back(fmt::format(
      "model {} {}: dim {}, {} layers, {} heads, {} kv heads, ffn {} "
      "(torchtitan/models/llama3/__init__.py at 31a17bf)",
      name, f->name, f->dim, f->n_layers, f->n_heads, f->n_kv_heads, TorchtitanFfnHidden(*f)));
  return Json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", f->dim},
              {"intermediate_size", TorchtitanFfnHidden(*f)},
              {"num_attention_heads", f->n_heads},
              {"num_key_value_heads", f->n_kv_heads},
              {"num_hidden_layers", f->n_layers},
              {"vocab_size", 128256},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", f->rope_theta},
              {"tie_word_embeddings", false},
              {"hidden_act", "silu"}};
}

// [parallelism]: the shard degree; what else would split the model is refused.
void ReadParallelism(JobConfig& job, Translation* t) {
  for (const auto& [key, what] : std::vector<std::pair<std::string, std::string>>{
           {"data_parallel_replicate_degree", "HSDP / DDP replicas (memsim models one shard mesh)"},
           {"tensor_parallel_degree", "tensor parallelism under torchtitan (not modelled yet)"},
           {"pipeline_parallel_degree",
            "pipeline parallelism under torchtitan (its schedules and "
            "per-stage FSDP are not modelled; memsim would err "
            "either way)"},
           {"context_parallel_degree",
            "context parallelism (ring attention's shards of the "
            "sequence and its buffers; memsim would err high)"}}) {
    const std::string path = "parallelism." + key;
    if (const auto v = job.Int(path); v && *v != 1) Refuse(job, path, what);
  }
  std::int64_t shard = job.Int("parallelism.data_parallel_shard_degree").value_or(-1);
  if (shard == 0 || shard < -1) {
    Fail(job.At("parallelism.data_parallel_shard_degree"), "expected -1 or a positive integer");
  }
  std::string label = job.At("parallelism.data_parallel_shard_degree");
  if (shard == -1) {
    // torchtitan/distributed/parallel_dims.py: -1 takes the ranks the other degrees leave, here
    // all of them; run_train.sh launches NGPU=8 by default.
    shard = 8;
    t->assumed.push_back(
        fmt::format("{}: -1 = every rank; 8 taken (run_train.sh's NGPU "
                    "default); --set training.data_parallel_size=N for another",
                    label));
  }
  t->Set("data_parallel_size", shard, label);
  if (const auto r =
          job.Choice("parallelism.fsdp_reshard_after_forward", {"default", "always", "never"})) {
    t->Set("reshard_after_forward", *r != "never",
           job.At("parallelism.fsdp_reshard_after_forward"));
  }
}

// [training]: batch, sequence, steps, dtypes.
void ReadTraining(JobConfig& job, Translation* t) {
  // local_batch_size; `batch_size` in configs before torchtitan#1190.
  const char* batch =
      job.Has("training.local_batch_size") ? "training.local_batch_size" : "training.batch_size";
  const std::int64_t local = job.Int(batch).value_or(8);
  if (local < 1) Fail(job.At(batch), "expected a positive integer");
  t->Set("micro_batch_size", local, job.At(batch));
  const std::int64_t shard = t->training["data_parallel_size"].get<std::int64_t>();
  const std::int64_t global = job.Int("training.global_batch_size").value_or(-1);
  if (global > 0 && global % (local * shard) != 0) {
    Fail(job.At("training.global_batch_size"),
         fmt::format("expected a multiple of local_batch_size × data-parallel degree ({})",
                     local * shard));
  }
  t->Set("global_batch_size", global > 0 ? global : local * shard,
         job.At("training.global_batch_size"));
  const std::int64_t seq = job.Int("training.seq_len").value_or(2048);
  if (seq < 1) Fail(job.At("training.seq_len"), "expected a positive integer");
  t->Set("seq_length", seq, job.At("training.seq_len"));
  const std::int64_t steps = job.Int("training.steps").value_or(10000);
  if (steps < 1) Fail(job.At("training.steps"), "expected a positive integer");
  t->Set("train_iters", steps, job.At("training.steps"));
  const std::string param =
      job.Choice("training.mixed_precision_param", {"bfloat16", "float32"}).value_or("bfloat16");
  t->Set("precision", param == "bfloat16" ? "bf16" : "fp32",
         job.At("training.mixed_precision_param"));
  const std::string reduce =
      job.Choice("training.mixed_precision_reduce", {"float32", "bfloat16"}).value_or("float32");
  t->Set("mixed_precision_reduce", reduce, job.At("training.mixed_precision_reduce"));
  const std::string dtype =
      job.Choice("training.dtype", {"float32", "bfloat16"}).value_or("float32");
  t->Set("torch_dtype", dtype, job.At("training.dtype"));
  if (job.Bool("training.enable_cpu_offload").value_or(false)) {
    Refuse(job, "training.enable_cpu_offload",
           "FSDP2 CPUOffloadPolicy (shards, gradients and optimizer state on the host; memsim "
           "would err high)");
  }
}

// [activation_checkpoint], [compile], [optimizer].
void ReadRecomputeAndOptimizer(JobConfig& job, Translation* t) {
  const std::string mode =
      job.Choice("activation_checkpoint.mode", {"none", "selective", "full", "memory_budget"})
          .value_or("selective");
  const std::string at = job.At("activation_checkpoint.mode");
  if (mode == "memory_budget")
    Refuse(job, "activation_checkpoint.mode",
           "memory_budget (the partitioner's budgeted recompute under torch.compile)");
  if (mode == "full") {
    // apply_ac: ptd_checkpoint_wrapper around each transformer block.
    t->Set("recompute_granularity", "full", at);
    t->Set("recompute_method", "uniform", at);
    t->Set("recompute_num_layers", 1, at);
  } else {
    t->Set("recompute_granularity", "none", at);
  }
  if (mode == "selective") {
    job.Skip("activation_checkpoint.selective_ac_option");
    t->warnings.push_back(fmt::format(
        "{}: 'selective' ({} = '{}') is modelled as 'none': torchtitan's selective checkpoint "
        "keeps fewer tensors than memsim saves, so memsim errs high",
        at, job.At("activation_checkpoint.selective_ac_option"),
        job.Has("activation_checkpoint.selective_ac_option")
            ? job.Get("activation_checkpoint.selective_ac_option")->dump()
            : "2"));
    t->not_modelled.push_back(
        {at, "activation_checkpoint.mode", {"\"selective\""}, NotModelled::Direction::kHigh, true});
  }
  if (job.Bool("compile.enable").value_or(false)) {
    t->Warn(job, "compile.enable",
            "torch.compile is not modelled: AOTAutograd's partitioner saves fewer tensors than "
            "eager, so memsim errs high (torchtitan's Llama 3.1 8B table: 82.4 GiB eager, 77.0 "
            "compiled)",
            NotModelled::Direction::kHigh);
  }
  const std::string name = job.Choice("optimizer.name", {"AdamW", "Adam"}).value_or("AdamW");
  t->Set("optimizer", name == "AdamW" ? "adamw" : "adam", job.At("optimizer.name"));
  const std::string impl =
      job.Choice("optimizer.implementation", {"fused", "foreach", "for-loop"}).value_or("fused");
  t->Set("optimizer_impl", impl == "fused" ? "fused" : "foreach",
         job.At("optimizer.implementation"));
  if (impl == "for-loop") {
    t->notes.push_back(
        fmt::format("{}: 'for-loop' taken as 'foreach' (one group-sized temporary "
                    "rather than one per parameter: memsim errs high)",
                    job.At("optimizer.implementation")));
  }
  if (const Json* wd = job.Get("optimizer.weight_decay"))
    t->Set("weight_decay", *wd, job.At("optimizer.weight_decay"));
}

// Sections and keys that leave device memory alone (logging, paths, schedules), the inert
// Float8 settings (they act only with a float8 converter, refused above), and what is warned.
void ReadTheRest(JobConfig& job, Translation* t) {
  static const std::vector<std::string> neutral_sections = {
      "job.",      "profiling.",       "metrics.",      "lr_scheduler.",      "comm.",  "float8.",
      "quantize.", "fault_tolerance.", "experimental.", "memory_estimation.", "debug.", "mx."};
  for (const std::string& path : job.Unread()) {
    for (const std::string& s : neutral_sections) {
      if (path.rfind(s, 0) == 0) job.Skip(path);
    }
  }
  for (const char* p : {"optimizer.lr",
                        "optimizer.eps",
                        "optimizer.beta1",
                        "optimizer.beta2",
                        "optimizer.early_step_in_backward",
                        "training.max_norm",
                        "training.dataset",
                        "training.dataset_path",
                        "training.gc_freq",
                        "training.seed",
                        "training.deterministic",
                        "training.warmup_steps",
                        "training.gc_debug",
                        "compile.components",
                        "compile.backend",
                        "checkpoint.folder",
                        "checkpoint.interval",
                        "checkpoint.last_save_model_only",
                        "checkpoint.export_dtype",
                        "checkpoint.async_mode",
                        "checkpoint.keep_latest_k",
                        "validation.dataset",
                        "validation.freq",
                        "validation.steps",
                        "parallelism.enable_async_tensor_parallel",
                        "parallelism.disable_loss_parallel",
                        "parallelism.expert_parallel_degree",
                        "parallelism.expert_tensor_parallel_degree",
                        "parallelism.pipeline_parallel_schedule",
                        "parallelism.fsdp_reshard_after_forward"}) {
    job.Skip(p);
  }
  if (job.Bool("checkpoint.enable").value_or(false)) {
    t->Warn(job, "checkpoint.enable", "checkpoint saving is not modelled (DCP's staging copies)",
            NotModelled::Direction::kLow);
  }
  if (job.Bool("validation.enable").value_or(false)) {
    t->Warn(job, "validation.enable",
            "the validation pass is not modelled (its forward's "
            "activations and gathered parameters)",
            NotModelled::Direction::kLow);
  }
  for (const std::string& path : job.Unread()) {
    t->warnings.push_back(
        fmt::format("{}: not a key memsim knows in torchtitan's JobConfig (at "
                    "31a17bf); ignored",
                    job.At(path)));
  }
}

}  // namespace

bool IsToml(const Document& config) {
  const std::string_view first = FirstStatement(config.text);
  const bool table = first.size() > 2 && first.front() == '[' && first.back() == ']' &&
                     std::isalpha(static_cast<unsigned char>(first[1]));
  const bool named =
      config.label.size() > 5 && config.label.compare(config.label.size() - 5, 5, ".toml") == 0;
  return table || named;
}

Setup LoadTorchtitanToml(const Document& config, const LoadOptions& options) {
  toml::table root;
  try {
    root = toml::parse(config.text, config.label);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}:{}: malformed TOML: {}", config.label,
                                 e.source().begin.line, e.source().begin.column, e.description()));
  }
  if (options.device.empty()) {
    throw InputError(
        fmt::format("{}: a torchtitan job config does not name its device; give "
                    "--device NAME ({}) or a preset file",
                    config.label, KnownDevices()));
  }
  JobConfig job(config, root);
  Translation t;
  t.source.file = config.label;
  Json json_root = Json::object();
  json_root["model"] = ReadModel(job, &t);
  t.Set("framework", "torchtitan", fmt::format("{} (torchtitan job config)", config.label));
  // torchtitan's Llama 3: SDPA with is_causal (no mask tensor), torch's own modules.
  t.Set("use_flash_attn", true, fmt::format("{} (torchtitan llama3: SDPA)", config.label));
  t.Set("transformer_impl", "local",
        fmt::format("{} (torchtitan llama3: torch.nn modules)", config.label));
  t.Set("create_attention_mask_in_dataloader", false,
        fmt::format("{} (SDPA is_causal)", config.label));
  t.Set("gradient_accumulation_fusion", false, fmt::format("{} (autograd's .grad)", config.label));
  ReadParallelism(job, &t);
  ReadTraining(job, &t);
  ReadRecomputeAndOptimizer(job, &t);
  ReadTheRest(job, &t);
  json_root["training"] = t.training;
  LoadOptions rest = options;
  ApplyCommandLine(rest, &json_root, &t.source);
  Setup s = LoadParsedConfig(config, json_root, t.source, rest, FieldErrors::kAll);
  s.recipe.push_back("torchtitan job config (JobConfig at torchtitan 31a17bf)");
  s.recipe.insert(s.recipe.end(), t.assumed.begin(), t.assumed.end());
  s.warnings.insert(s.warnings.begin(), t.warnings.begin(), t.warnings.end());
  s.not_modelled.insert(s.not_modelled.begin(), t.not_modelled.begin(), t.not_modelled.end());
  s.notes.insert(s.notes.begin(), t.notes.begin(), t.notes.end());
  return s;
}

}  // namespace memsim::config::internal
