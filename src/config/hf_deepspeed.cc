// TrainingArguments `deepspeed` under framework "hf-trainer": the ds_config JSON (a path,
// relative to the config that names it, or the object inline) read into setup.h DeepSpeedZero.
// Sources, DeepSpeed v0.16.9: deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig: the keys
// and their defaults), runtime/zero/offload_config.py (offload_optimizer), runtime/config.py
// (bf16 / fp16 / data_types), runtime/engine.py (_do_optimizer_sanity_check: which optimizer
// wrapper runs); transformers integrations/deepspeed.py (HfTrainerDeepSpeedConfig
// trainer_config_process / trainer_config_finalize: the "auto" values and the mismatch check).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "config/hf_trainer.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// Keys DeepSpeed reads that change nothing memsim models (loss scaling parameters, logging,
// monitors, checkpoint layout, communication choices without buffers of their own).
const std::set<std::string> kNoEffectTop = {
    "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "scheduler",
    "gradient_clipping", "prescale_gradients", "gradient_predivide_factor", "tensorboard",
    "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger", "checkpoint",
    "dump_state", "zero_force_ds_cpu_optimizer", "memory_breakdown", "communication_data_type"};
const std::set<std::string> kNoEffectZero = {
    "reduce_scatter", "allgather_partitions", "elastic_checkpoint", "ignore_unused_parameters",
    "load_from_fp32_weights", "use_multi_rank_bucket_allreduce", "cpu_offload_use_pin_memory"};
// Stage 3 only: DeepSpeedZeroOptimizer (stages 1 and 2) never reads them.
bool IsStage3Key(const std::string& key) {
  return key.rfind("stage3_", 0) == 0 || key == "sub_group_size" || key == "offload_param" ||
         key == "zero_hpz_partition_size" || key == "zero_quantized_weights" ||
         key == "zero_quantized_nontrainable_weights" || key == "zero_quantized_gradients" ||
         key == "mics_shard_size" || key == "mics_hierarchical_params_gather" ||
         key == "model_persistence_threshold" || key == "max_live_parameters" ||
         key == "max_reuse_distance" || key == "prefetch_bucket_size" ||
         key == "param_persistence_threshold" || key == "module_granularity_threshold" ||
         key == "memory_efficient_linear" || key == "override_module_apply" ||
         key == "pipeline_loading_checkpoint" || key == "zeropp_loco_param";
}

bool IsAuto(const Json* v) { return v != nullptr && v->is_string() && v->get<std::string>() == "auto"; }

// A bucket size: a non-negative number of elements (DeepSpeed's pp_int accepts 5e8). A bad value
// is a field error (reported with the config's others) and reads as `fallback`.
std::int64_t BucketSize(ObjectReader& z, std::string_view key, std::int64_t fallback) {
  const Json* v = z.Get(key);
  if (v == nullptr) return fallback;
  if (!v->is_number() || v->get<double>() < 0 || v->get<double>() > 1e15 ||
      std::floor(v->get<double>()) != v->get<double>()) {
    z.FieldError(key, fmt::format("expected a whole number of elements, got {}", Describe(*v)));
    return fallback;
  }
  return static_cast<std::int64_t>(v->get<double>());
}

// bf16.enabled / fp16.enabled: "auto" takes the Trainer's (fill_match); another value must equal
// it (trainer_config_finalize raises on a mismatch). An absent section is DeepSpeed's default,
// disabled, which fill_match leaves alone.
bool ReadEnabled(ObjectReader& ds, const char* section, bool trainer, const char* trainer_key,
                 std::vector<std::string>* notes) {
  const Json* s = ds.Get(section);
  if (s == nullptr) {
    if (trainer) {
      notes->push_back(fmt::format("{}: absent: DeepSpeed runs without {} although {} is true "
                                   "(HfTrainerDeepSpeedConfig fills only keys that exist)",
                                   ds.At(section), section, trainer_key));
    }
    return false;
  }
  ObjectReader r(ds.source(), *s, ds.PointerOf(section));
  bool enabled = false;
  if (IsAuto(r.Get("enabled"))) {
    enabled = trainer;
  } else if (std::optional<bool> b = r.Bool("enabled")) {
    enabled = *b;
    if (enabled != trainer) {
      Fail(r.At("enabled"), fmt::format("{} while TrainingArguments {} is {} (the Trainer "
                                        "refuses the mismatch; write \"auto\")",
                                        enabled, trainer_key, trainer));
    }
  }
  for (const std::string& key : r.Unread()) r.Skip(key);  // loss-scale settings: no memory
  return enabled;
}

void ReadOffload(ObjectReader& z, DeepSpeedZero& out, std::vector<std::string>* warnings) {
  const Json* o = z.Get("offload_optimizer");
  if (o == nullptr) return;
  ObjectReader r(z.source(), *o, z.PointerOf("offload_optimizer"));
  const std::string device = r.Choice("device", {"none", "cpu", "nvme"}).value_or("none");
  if (device == "nvme") {
    throw UnsupportedError(fmt::format("{}: \"nvme\": ZeRO-Infinity's NVMe offload is not "
                                       "modelled",
                                       r.At("device")));
  }
  out.offload_optimizer_cpu = device == "cpu";
  const bool pin = r.Bool("pin_memory").value_or(false);  // which host memory is page-locked
  out.offload_pin_memory = out.offload_optimizer_cpu && pin;
  for (const std::string& key : r.Unread()) {
    r.WarnNotModelled(key, fmt::format("{}: not modelled, ignored", r.At(key)),
                      NotModelled::Direction::kEither, warnings);
  }
}

// offload_param (stage 3): "cpu" puts the 16-bit partitions on the host.
void ReadOffloadParam(ObjectReader& z, DeepSpeedZero& out, std::vector<std::string>* warnings) {
  const Json* o = z.Get("offload_param");
  if (o == nullptr) return;
  ObjectReader r(z.source(), *o, z.PointerOf("offload_param"));
  const std::string device = r.Choice("device", {"none", "cpu", "nvme"}).value_or("none");
  if (device == "nvme") {
    throw UnsupportedError(fmt::format("{}: \"nvme\": ZeRO-Infinity's NVMe offload is not "
                                       "modelled",
                                       r.At("device")));
  }
  out.offload_param_cpu = device == "cpu";
  const bool pin = r.Bool("pin_memory").value_or(false);  // read with any device
  out.offload_param_pin_memory = out.offload_param_cpu && pin;
  for (const std::string& key : r.Unread()) {
    r.WarnNotModelled(key, fmt::format("{}: not modelled, ignored", r.At(key)),
                      NotModelled::Direction::kEither, warnings);
  }
}

// A stage-3 size that the Trainer may fill ("auto": held as -1, ResolveDeepSpeedAuto).
std::int64_t AutoOrSize(ObjectReader& z, std::string_view key, std::int64_t fallback) {
  if (IsAuto(z.Get(key))) return -1;
  return BucketSize(z, key, fallback);
}

// The stage-3 keys of zero/config.py DeepSpeedZeroConfig (v0.16.9) and their defaults; ZeRO++
// and MiCS are warned about with the direction memsim errs.
void ReadStage3(ObjectReader& z, DeepSpeedZero& out, std::vector<std::string>* notes,
                std::vector<std::string>* warnings) {
  out.prefetch_bucket_size =
      AutoOrSize(z, "stage3_prefetch_bucket_size", out.prefetch_bucket_size);
  out.param_persistence_threshold =
      AutoOrSize(z, "stage3_param_persistence_threshold", out.param_persistence_threshold);
  out.max_live_parameters = BucketSize(z, "stage3_max_live_parameters", out.max_live_parameters);
  out.max_reuse_distance = BucketSize(z, "stage3_max_reuse_distance", out.max_reuse_distance);
  out.sub_group_size = BucketSize(z, "sub_group_size", out.sub_group_size);
  out.reduce_scatter = z.Bool("reduce_scatter").value_or(true);
  ReadOffloadParam(z, out, warnings);
  for (const char* key : {"stage3_gather_16bit_weights_on_model_save",
                          "stage3_gather_fp16_weights_on_model_save"}) {
    if (z.Has(key)) {
      z.Skip(key);
      notes->push_back(fmt::format("{}: only at checkpoint saving, no effect on the training "
                                   "step's memory",
                                   z.At(key)));
    }
  }
  // ZeRO++ (zero/config.py): a secondary partition per node (hpZ) adds device memory memsim
  // does not hold; quantized weights / gradients make the gathers and reductions smaller.
  const std::pair<const char*, NotModelled::Direction> zeropp[] = {
      {"zero_hpz_partition_size", NotModelled::Direction::kLow},
      {"zero_quantized_weights", NotModelled::Direction::kHigh},
      {"zero_quantized_nontrainable_weights", NotModelled::Direction::kHigh},
      {"zero_quantized_gradients", NotModelled::Direction::kHigh},
      {"mics_shard_size", NotModelled::Direction::kLow},
      {"stage3_module_granularity_threshold", NotModelled::Direction::kEither}};
  for (const auto& [key, direction] : zeropp) {
    const Json* v = z.Get(key);
    if (v == nullptr) continue;
    const bool off = (v->is_boolean() && !v->get<bool>()) ||
                     (v->is_number() && v->get<double>() <= (std::string_view(key) ==
                                                                     "zero_hpz_partition_size"
                                                                 ? 1
                                                                 : 0));
    if (off) {
      notes->push_back(fmt::format("{}: off, no effect", z.At(key)));
    } else {
      z.WarnNotModelled(key,
                        fmt::format("{}: {}: ZeRO++ / MiCS not modelled (memsim errs {})", z.At(key),
                                    Describe(*v),
                                    direction == NotModelled::Direction::kLow ? "low"
                                    : direction == NotModelled::Direction::kHigh ? "high"
                                                                                 : "either way"),
                        direction, warnings);
    }
  }
}

void ReadZero(ObjectReader& ds, DeepSpeedZero& out, std::vector<std::string>* notes,
              std::vector<std::string>* warnings) {
  const Json* zj = ds.Get("zero_optimization");
  static const Json kEmpty = Json::object();
  ObjectReader z(ds.source(), zj != nullptr ? *zj : kEmpty, ds.PointerOf("zero_optimization"));
  const std::string stage_at = z.At("stage");
  // A bad stage is a field error, thrown with the others once every key is read: the rest is
  // read as at stage 2 meanwhile, so that its errors are found in the same run.
  out.stage = z.IntInRange("stage", 0, 3).value_or(z.Has("stage") ? 2 : 0);
  if (out.stage == 0) {
    throw UnsupportedError(fmt::format(
        "{}: 0 (DeepSpeed without ZeRO: BF16_Optimizer, FP16_Optimizer or the bare optimizer "
        "with the engine's all-reduce) is not modelled; stages 1 and 2 are",
        stage_at));
  }
  if (IsAuto(z.Get("reduce_bucket_size"))) {
    out.reduce_bucket_size = -1;  // hidden_size², resolved once the model is read
  } else {
    out.reduce_bucket_size = BucketSize(z, "reduce_bucket_size", out.reduce_bucket_size);
  }
  out.allgather_bucket_size = BucketSize(z, "allgather_bucket_size", out.allgather_bucket_size);
  // config.py overlap_comm_valid: absent, it is on at stage 3 and off below.
  out.overlap_comm = z.Bool("overlap_comm").value_or(out.stage == 3);
  out.contiguous_gradients = z.Bool("contiguous_gradients").value_or(true);
  ReadOffload(z, out, warnings);
  if (out.stage == 3) ReadStage3(z, out, notes, warnings);
  // stage_1_and_2.py __init__: contiguous_gradients = contiguous_gradients or cpu_offload.
  out.contiguous_gradients = out.contiguous_gradients || out.offload_optimizer_cpu;
  if (z.Bool("round_robin_gradients").value_or(false)) {
    z.WarnNotModelled("round_robin_gradients",
                      fmt::format("{}: true: not modelled (the reordering moves which "
                                  "parameters fall in each rank's partition; sizes within "
                                  "one parameter)",
                                  z.At("round_robin_gradients")),
                      NotModelled::Direction::kEither, warnings);
  }
  for (const std::string& key : z.Unread()) {
    if (kNoEffectZero.count(key) != 0) {
      notes->push_back(fmt::format("{}: accepted, no effect on memory", z.At(key)));
    } else if (IsStage3Key(key) && out.stage < 3) {
      notes->push_back(fmt::format("{}: a ZeRO-3 setting, not read at stage {}", z.At(key),
                                   out.stage));
    } else if (IsStage3Key(key)) {
      z.WarnNotModelled(key, fmt::format("{}: a ZeRO-3 setting memsim does not model, ignored",
                                         z.At(key)),
                        NotModelled::Direction::kEither, warnings);
    } else {
      warnings->push_back(fmt::format("{}: not a DeepSpeed ZeRO key memsim knows, ignored",
                                      z.At(key)));
    }
  }
}

// The batch keys: "auto" or the Trainer's values (trainer_config_process fill_match).
void CheckBatchKeys(ObjectReader& ds, const TrainingConfig& c) {
  const std::pair<const char*, std::int64_t> keys[] = {
      {"train_micro_batch_size_per_gpu", c.micro_batch_size},
      {"gradient_accumulation_steps",
       c.global_batch_size / (std::int64_t{c.micro_batch_size} * c.data_parallel_size)},
      {"train_batch_size", c.global_batch_size}};
  for (const auto& [key, trainer] : keys) {
    const Json* v = ds.Get(key);
    if (v == nullptr || IsAuto(v)) continue;
    if (!v->is_number_integer()) {
      ds.FieldError(key, fmt::format("expected \"auto\" or an integer, got {}", Describe(*v)));
    } else if (v->get<std::int64_t>() != trainer) {
      Fail(ds.At(key), fmt::format("{} differs from the Trainer's {} (the Trainer refuses the "
                                   "mismatch; write \"auto\")",
                                   Describe(*v), trainer));
    }
  }
}

// The ds_config's own optimizer (the Trainer then passes DummyOptim, transformers
// integrations/deepspeed.py deepspeed_optim_sched), built by engine.py _configure_basic_optimizer:
// Adam / AdamW as FusedAdam (ops/adam/fused_adam.py: multi_tensor_adam updates in place, no
// per-step temporaries), DeepSpeedCPUAdam with offload, torch.optim's with params.torch_adam.
void ReadOptimizerSection(ObjectReader& ds, TrainingConfig& c, bool offload,
                          std::vector<std::string>* notes) {
  const Json* o = ds.Get("optimizer");
  if (o == nullptr) return;
  ObjectReader r(ds.source(), *o, ds.PointerOf("optimizer"));
  const std::optional<std::string> type = r.String("type");
  std::string lower = type.value_or("");
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (lower != "adam" && lower != "adamw") {
    throw UnsupportedError(fmt::format("{}: {}: only DeepSpeed's Adam / AdamW is modelled",
                                       r.At("type"), Describe(type ? Json(*type) : Json())));
  }
  bool torch_adam = false;
  if (const Json* p = r.Get("params"); p != nullptr && p->is_object()) {
    const auto it = p->find("torch_adam");
    torch_adam = it != p->end() && it->is_boolean() && it->get<bool>();
  }
  c.optimizer = OptimizerKind::kAdam;
  if (!offload) c.optimizer_impl = torch_adam ? OptimizerImpl::kForeach : OptimizerImpl::kFused;
  notes->push_back(fmt::format("{}: DeepSpeed builds its own {} (FusedAdam, or DeepSpeedCPUAdam "
                               "with offload): fp32 exp_avg and exp_avg_sq as torch.optim's",
                               r.At("type"), *type));
}

}  // namespace

void ReadDeepSpeed(ObjectReader& t, const Document& config, TrainingConfig& c,
                   std::vector<std::string>* notes, std::vector<std::string>* warnings) {
  const Json* v = t.Get("deepspeed");
  if (v == nullptr) return;
  Json json;
  Source source = t.source();
  std::string pointer = t.PointerOf("deepspeed");
  if (v->is_string()) {
    const Document doc = FindReferencedDocument(v->get<std::string>(), t.At("deepspeed"), config,
                                                "the DeepSpeed config (ds_config JSON)");
    json = ParseJson(doc.text, doc.label);
    source = Source{doc.label, {}, t.source().field_errors,  // one run reports every error
                    t.source().not_modelled};
    pointer = "";
  } else if (v->is_object()) {
    json = *v;
  } else {
    Fail(t.At("deepspeed"), fmt::format("expected a path to a ds_config JSON or an object, got {}",
                                        Describe(*v)));
  }
  ObjectReader ds(source, json, pointer);
  HfTrainerOptions& hf = *c.hf_trainer();
  const bool trainer_bf16 = c.precision == Precision::kBf16;
  const bool trainer_fp16 = c.precision == Precision::kFp16;
  const bool bf16 = ReadEnabled(ds, "bf16", trainer_bf16, "bf16", notes);
  const bool fp16 = ReadEnabled(ds, "fp16", trainer_fp16, "fp16", notes);
  if (bf16 && fp16) Fail(ds.At("fp16"), "fp16 and bf16 both enabled (DeepSpeed refuses this)");
  for (const char* key : {"amp", "data_types"}) {
    if (ds.Has(key)) {
      throw UnsupportedError(fmt::format("{}: {} is not modelled", ds.At(key),
                                         std::string_view(key) == "amp"
                                             ? "apex amp under DeepSpeed"
                                             : "a gradient-accumulation dtype of DeepSpeed's own"));
    }
  }
  c.precision = bf16 ? Precision::kBf16 : fp16 ? Precision::kFp16 : Precision::kFp32;
  DeepSpeedZero zero;
  ReadZero(ds, zero, notes, warnings);
  CheckBatchKeys(ds, c);
  ReadOptimizerSection(ds, c, zero.offload_optimizer_cpu, notes);
  if (ds.Has("activation_checkpointing")) {
    warnings->push_back(fmt::format("{}: DeepSpeed's activation checkpointing is for "
                                    "Megatron-DeepSpeed models, not the Trainer's; ignored "
                                    "(gradient_checkpointing is read)",
                                    ds.At("activation_checkpointing")));
    ds.Skip("activation_checkpointing");
  }
  for (const std::string& key : ds.Unread()) {
    if (kNoEffectTop.count(key) != 0) {
      notes->push_back(fmt::format("{}: accepted, no effect on memory", ds.At(key)));
    } else {
      warnings->push_back(fmt::format("{}: not a DeepSpeed key memsim knows, ignored", ds.At(key)));
    }
  }
  hf.deepspeed = zero;
}

void ResolveDeepSpeedAuto(int hidden_size, const std::string& where, DeepSpeedZero* zero,
                          std::vector<std::string>* notes) {
  // trainer_config_finalize: fill_only of the three hidden-size keys (the last two at stage 3).
  const std::int64_t h = hidden_size;
  const std::tuple<std::int64_t*, std::int64_t, const char*, const char*> keys[] = {
      {&zero->reduce_bucket_size, h * h, "reduce_bucket_size", "hidden_size²"},
      {&zero->prefetch_bucket_size, static_cast<std::int64_t>(0.9 * static_cast<double>(h * h)),
       "stage3_prefetch_bucket_size", "int(0.9 · hidden_size²)"},
      {&zero->param_persistence_threshold, 10 * h, "stage3_param_persistence_threshold",
       "10 · hidden_size"}};
  for (const auto& [value, resolved, key, rule] : keys) {
    if (*value >= 0) continue;
    *value = resolved;
    notes->push_back(fmt::format("{} zero_optimization.{}: \"auto\" is {} = {} elements "
                                 "(HfTrainerDeepSpeedConfig.trainer_config_finalize)",
                                 where, key, rule, resolved));
  }
}

}  // namespace memsim::config::internal
