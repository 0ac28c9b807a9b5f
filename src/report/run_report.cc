#include "report/run_report.h"

#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "config/load.h"
#include "config/stack.h"
#include "report/format.h"
#include "workload/build.h"
#include "workload/not_modelled.h"

namespace memsim::report {
namespace {

using json = nlohmann::ordered_json;

std::string_view PrecisionName(config::Precision p) {
  switch (p) {
    case config::Precision::kFp32:
      return "fp32";
    case config::Precision::kFp16:
      return "fp16";
    case config::Precision::kBf16:
      return "bf16";
  }
  return "?";
}

const char* StateDtypeName(config::StateDtype d) {
  switch (d) {
    case config::StateDtype::kFp32:
      return "fp32";
    case config::StateDtype::kFp16:
      return "fp16";
    case config::StateDtype::kBf16:
      return "bf16";
    case config::StateDtype::kFp8:
      return "fp8";
  }
  return "fp32";
}

std::string_view RecomputeName(config::RecomputeGranularity g) {
  switch (g) {
    case config::RecomputeGranularity::kNone:
      return "none";
    case config::RecomputeGranularity::kSelective:
      return "selective";
    case config::RecomputeGranularity::kFull:
      return "full";
  }
  return "?";
}

// Category changes between two splits, largest magnitude first, those of at least 1 MiB.
std::string CategoryDelta(const CategoryBytes& before, const CategoryBytes& after) {
  std::vector<std::pair<Bytes, int>> deltas;
  for (int c = 0; c < kNumCategories; ++c) {
    const Bytes d = after[static_cast<size_t>(c)] - before[static_cast<size_t>(c)];
    if (d >= kMiB || d <= -kMiB) deltas.emplace_back(d, c);
  }
  std::stable_sort(deltas.begin(), deltas.end(), [](const auto& a, const auto& b) {
    return std::abs(a.first) > std::abs(b.first);
  });
  std::string out;
  for (const auto& [d, c] : deltas) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", SignedHuman(d), CategoryName(static_cast<Category>(c)));
  }
  return out.empty() ? "no change" : out;
}

std::string PeakWhere(const timeline::SpanSummary& s) {
  std::string where(PhaseName(s.peak_phase));
  if (s.peak_micro_batch >= 0) where += fmt::format(" mb{}", s.peak_micro_batch);
  return where;
}

}  // namespace

PeakComparison CompareAtSameMoment(const timeline::SpanSummary& prev,
                                   const timeline::SpanSummary& span) {
  PeakComparison c;
  c.phase = span.peak_phase;
  const size_t p = static_cast<size_t>(span.peak_phase);
  if (span.iteration > 0 && prev.iteration > 0 && p < span.phase_peaks.size() &&
      prev.phase_peaks[p].seen && span.phase_peaks[p].seen) {
    c.against_previous = true;
    c.before = prev.phase_peaks[p].by_category;
    c.after = span.phase_peaks[p].by_category;
    c.reserved_change_bytes = span.peak_reserved_bytes - prev.peak_reserved_bytes;
  } else {
    c.before = span.start_by_category;
    c.after = span.by_category_at_peak;
    c.reserved_change_bytes = span.peak_reserved_bytes - span.start_reserved_bytes;
  }
  return c;
}

namespace {

// "at forward peak vs iter 1's forward peak: +6.28 GiB optimizer_states; reserved +2.19 GiB":
// a peak is set against the previous iteration's peak of the same phase, never against a peak
// of another phase (iteration 1's optimizer step holds no activations, iteration 2's forward
// does: comparing them reads as "activations grew"). Iteration 1, which has no previous
// iteration, is set against its own start.
std::string LikeForLike(const timeline::SpanSummary& prev, const timeline::SpanSummary& s) {
  const PeakComparison c = CompareAtSameMoment(prev, s);
  std::string line =
      c.against_previous
          ? fmt::format("      at {} peak vs iter {}'s {} peak: ", PhaseName(c.phase),
                        prev.iteration, PhaseName(c.phase))
          : fmt::format("      at {} peak vs the start of the iteration: ", PhaseName(c.phase));
  line += CategoryDelta(c.before, c.after);
  if (c.reserved_change_bytes != 0)
    line += fmt::format("; reserved {}", SignedHuman(c.reserved_change_bytes));
  return line;
}

json CategoriesJson(const CategoryBytes& bytes) {
  json j = json::object();
  for (int c = 0; c < kNumCategories; ++c) {
    j[std::string(CategoryName(static_cast<Category>(c)))] = bytes[static_cast<size_t>(c)];
  }
  return j;
}

json StatsJson(const alloc::AllocatorStats& s) {
  json j = json::object();
  auto gauge = [&](const char* name, const alloc::Gauge& g) {
    j[name] = g.current;
    j[std::string("peak_") + name] = g.peak;
  };
  gauge("allocated_bytes", s.allocated_bytes);
  gauge("reserved_bytes", s.reserved_bytes);
  gauge("active_bytes", s.active_bytes);
  gauge("requested_bytes", s.requested_bytes);
  gauge("inactive_split_bytes", s.inactive_split_bytes);
  gauge("segment", s.segment);
  j["num_alloc_retries"] = s.num_alloc_retries;
  j["num_ooms"] = s.num_ooms;
  return j;
}

const char* FsdpShardingName(config::FsdpSharding s) {
  switch (s) {
    case config::FsdpSharding::kOptim:
      return "optim";
    case config::FsdpSharding::kOptimGrads:
      return "optim_grads";
    case config::FsdpSharding::kNoShard:
      break;
  }
  return "no_shard";
}

json SetupJson(const config::Setup& setup) {
  const config::ModelConfig& m = setup.model;
  const config::TrainingConfig& t = setup.training;
  json j;
  j["config_path"] = setup.config_path;
  j["model_path"] = setup.model_path;
  if (!setup.recipe.empty()) {  // a fine-tuning recipe (config/recipe.h): its tool and assumptions
    j["recipe"] = {{"read_as", setup.recipe.front()},
                   {"assumed", std::vector<std::string>(setup.recipe.begin() + 1, setup.recipe.end())}};
  }
  j["model"] = {{"model_type", m.model_type},
                {"hidden_size", m.hidden_size},
                {"intermediate_size", m.intermediate_size},
                {"num_attention_heads", m.num_attention_heads},
                {"num_key_value_heads", m.num_key_value_heads},
                {"head_dim", m.head_dim},
                {"num_hidden_layers", m.num_hidden_layers},
                {"vocab_size", m.vocab_size},
                {"tie_word_embeddings", m.tie_word_embeddings},
                {"hidden_act", m.hidden_act}};
  j["training"] = {
      {"framework", t.framework},
      {"seq_length", t.seq_length},
      {"micro_batch_size", t.micro_batch_size},
      {"global_batch_size", t.global_batch_size},
      {"tensor_model_parallel_size", t.tensor_model_parallel_size},
      {"pipeline_model_parallel_size", t.pipeline_model_parallel_size},
      {"data_parallel_size", t.data_parallel_size},
      {"context_parallel_size", t.context_parallel_size},
      {"num_layers_per_virtual_pipeline_stage", t.num_layers_per_virtual_pipeline_stage},
      {"sequence_parallel", t.sequence_parallel},
      {"precision", PrecisionName(t.precision)},
      {"optimizer", t.optimizer == config::OptimizerKind::kAdam  ? "adam"
                    : t.optimizer == config::OptimizerKind::kSgd ? "sgd"
                                                                 : "adafactor"},
      {"optimizer_impl", t.optimizer_impl == config::OptimizerImpl::kFused ? "fused" : "foreach"},
      {"use_distributed_optimizer", t.use_distributed_optimizer},
      {"recompute_granularity", RecomputeName(t.recompute_granularity)},
      {"use_flash_attn", t.use_flash_attn},
      {"train_iters", t.train_iters}};
  if (config::StackOf(t).Traits().plain_pytorch_step) {  // absent from Megatron reports (their schema is unchanged)
    const config::PyTorchOptions& torch = config::PyTorchOf(t);
    j["training"]["torch_dtype"] = PrecisionName(torch.torch_dtype);
    j["training"]["zero_grad_set_to_none"] = torch.zero_grad_set_to_none;
  }
  if (t.skipped_iterations > 0) j["training"]["skipped_iterations"] = t.skipped_iterations;
  if (t.use_precision_aware_optimizer) {  // absent otherwise (reports without it are unchanged)
    j["training"]["use_precision_aware_optimizer"] = true;
    j["training"]["main_params_dtype"] = PrecisionName(t.main_params_dtype);
    j["training"]["exp_avg_dtype"] = StateDtypeName(t.exp_avg_dtype);
    j["training"]["exp_avg_sq_dtype"] = StateDtypeName(t.exp_avg_sq_dtype);
  }
  if (t.use_megatron_fsdp) {
    j["training"]["use_megatron_fsdp"] = true;
    j["training"]["data_parallel_sharding_strategy"] = FsdpShardingName(t.fsdp_sharding);
  }
  const alloc::AllocatorOptions& a = setup.allocator;
  j["allocator"] = {
      {"backend", a.backend == alloc::Backend::kCuda ? "cuda" : "npu"},
      {"expandable_segments", a.expandable_segments},
      {"max_split_size_bytes", a.max_split_size_bytes ? json(*a.max_split_size_bytes) : json()},
      {"garbage_collection_threshold", a.garbage_collection_threshold}};
  return j;
}

json DeviceJson(const config::DevicePreset& d) {
  return {{"name", d.name},
          {"allocator_backend", d.allocator_backend == alloc::Backend::kCuda ? "cuda" : "npu"},
          {"total_memory_bytes", d.total_memory_bytes},
          {"usable_memory_bytes", d.usable_memory_bytes},
          {"idle_baseline_bytes", d.idle_baseline_bytes},
          {"context_bytes", d.context_bytes},
          {"communicator_buffer_bytes", d.communicator_buffer_bytes}};
}

// "8030261248 (8.03 B)": a parameter count, exact and rounded.
std::string ParameterCount(std::int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{} ({:.2f} B)", n, x / 1e9);
  if (x >= 1e6) return fmt::format("{} ({:.1f} M)", n, x / 1e6);
  return fmt::format("{}", n);
}

// The optimizer's wrapper, as the header's third line names it.
std::string OptimizerDetail(const config::TrainingConfig& t) {
  if (t.use_megatron_fsdp) {
    return fmt::format(" (Megatron-FSDP {})", FsdpShardingName(t.fsdp_sharding));
  }
  if (!t.use_distributed_optimizer) return "";
  if (!t.use_precision_aware_optimizer) return " (distributed optimizer)";
  return fmt::format(" (distributed, precision-aware: main params {}, exp_avg {}, exp_avg_sq {})",
                     PrecisionName(t.main_params_dtype), StateDtypeName(t.exp_avg_dtype),
                     StateDtypeName(t.exp_avg_sq_dtype));
}

// "selective (core_attn, mlp)", "full", "none".
std::string RecomputeDetail(const config::TrainingConfig& t) {
  std::string out(RecomputeName(t.recompute_granularity));
  if (t.recompute_granularity != config::RecomputeGranularity::kSelective) return out;
  std::string modules;
  for (const std::string& m : t.recompute_modules) modules += (modules.empty() ? "" : ", ") + m;
  return out + " (" + modules + ")";
}

// fp16 only: what the loss scaler's skipped steps change (TrainingConfig::skipped_iterations).
std::string SkippedStepsLines(const config::TrainingConfig& t) {
  if (t.precision != config::Precision::kFp16) return "";
  return fmt::format(
      "  fp16: the loss scaler may skip the first steps (inf/nan gradients at the initial loss\n"
      "  scale); a skipped step creates no optimizer state, so the state appears at the first\n"
      "  step taken: {} skipped here (training.skipped_iterations)\n",
      t.skipped_iterations);
}

// Host memory the rank keeps besides the device's (workload::StaticSizes host_pinned_bytes,
// host_pageable_bytes), each kind on its own line; "" when none.
std::string HostMemoryLine(const workload::StaticSizes& sizes) {
  if (sizes.host == workload::HostMemory::kSwapOptimizer) {
    return fmt::format(
        "  host memory (pinned, per rank): {} GiB: the fp32 main parameters and Adam moments of "
        "{} elements, off the device between steps (MindSpeed --swap-optimizer)\n",
        GiB(sizes.host_pinned_bytes), ParameterCount(sizes.main_param_count));
  }
  if (sizes.host != workload::HostMemory::kZeroOffload) return "";
  if (!sizes.host_pinned_what.empty() || !sizes.host_pageable_what.empty()) {
    return fmt::format(
        "  host memory (pinned, per rank): {} GiB: {}\n"
        "  host memory (pageable, per rank): {} GiB: {}\n",
        GiB(sizes.host_pinned_bytes), sizes.host_pinned_what.empty() ? "none" : sizes.host_pinned_what,
        GiB(sizes.host_pageable_bytes),
        sizes.host_pageable_what.empty() ? "none" : sizes.host_pageable_what);
  }
  const char* buffers = ", its fp32 gradient and the host gradient buffers";
  return fmt::format(
      "  host memory (pinned, per rank): {} GiB: DeepSpeed offload_optimizer cpu: the fp32 "
      "partition of {} elements{}\n"
      "  host memory (pageable, per rank): {} GiB: the optimizer's state over the partition{}\n",
      GiB(sizes.host_pinned_bytes), ParameterCount(sizes.host_optimizer_count),
      sizes.host_buffers_pinned ? buffers : "", GiB(sizes.host_pageable_bytes),
      sizes.host_buffers_pinned ? "" : buffers);
}

}  // namespace

std::string FormatLongRun(const engine::RunResult& run) {
  if (!run.IsLongRun()) return "";
  if (run.steady_state_from && run.steady_state_period == 1) {
    return fmt::format(
        "  simulated {} of {} iterations: from iteration {} on they are identical (allocator\n"
        "  state included), so iterations {}..{} repeat it\n",
        run.simulated_iterations, run.train_iters, *run.steady_state_from,
        *run.steady_state_from + 1, run.train_iters);
  }
  if (run.steady_state_from) {
    const int from = *run.steady_state_from;
    const int period = run.steady_state_period;
    return fmt::format(
        "  simulated {} of {} iterations: from iteration {} on they repeat every {} iterations\n"
        "  (allocator state included: the blocks alternate between {} layouts), so iterations\n"
        "  {}..{} repeat iterations {}..{}\n",
        run.simulated_iterations, run.train_iters, from, period, period, from + period,
        run.train_iters, from, from + period - 1);
  }
  return fmt::format(
      "  simulated {} of {} iterations: no two consecutive ones were identical yet (allocator\n"
      "  state included); the later iterations are not simulated (memsim's limit)\n",
      run.simulated_iterations, run.train_iters);
}

// The tool whose recipe was read and what was assumed (config/recipe.h), or "".
std::string RecipeLines(const config::Setup& setup) {
  if (setup.recipe.empty()) return "";
  std::string out = fmt::format("  read as: {}\n", setup.recipe.front());
  for (size_t i = 1; i < setup.recipe.size(); ++i) out += fmt::format("    assumed: {}\n", setup.recipe[i]);
  return out;
}

namespace {

// The stack and its precision: a plain step's weight dtype and autocast, or DeepSpeed ZeRO's
// stage with the dtype its engine casts the model to (no autocast under DeepSpeed).
std::string StackLine(const config::TrainingConfig& t, const config::StackTraits& stack) {
  if (!stack.plain_pytorch_step) return std::string(PrecisionName(t.precision));
  const config::DataParallelWrapper w = config::DataParallelOf(t);
  if (const auto* zero = std::get_if<config::DeepSpeedZero>(&w)) {
    return fmt::format("{} + DeepSpeed ZeRO-{}{}, {} weights, no autocast", stack.label,
                       zero->stage, zero->offload_optimizer_cpu ? " (optimizer on CPU)" : "",
                       PrecisionName(t.precision == config::Precision::kFp32
                                         ? config::PyTorchOf(t).torch_dtype
                                         : t.precision));
  }
  if (const auto* fsdp = std::get_if<config::TorchFsdp2>(&w)) {
    return fmt::format("{} + FSDP2, {} weights gathered in {}, reduce-scatter in {}, no autocast",
                       stack.label, PrecisionName(config::PyTorchOf(t).torch_dtype),
                       PrecisionName(t.precision), PrecisionName(fsdp->reduce_dtype));
  }
  return fmt::format("{}, {} weights, {}", stack.label,
                     PrecisionName(config::PyTorchOf(t).torch_dtype),
                     t.precision == config::Precision::kFp32
                         ? std::string("no autocast")
                         : fmt::format("{} autocast", PrecisionName(t.precision)));
}

}  // namespace


std::string FormatRunHeader(const engine::RunResult& run, const config::Setup& setup) {
  const config::TrainingConfig& t = setup.training;
  const config::StackTraits& stack = config::StackOf(t).Traits();
  const int m = t.global_batch_size / std::max(1, t.micro_batch_size * t.data_parallel_size);
  const bool coupled_decay = t.pytorch() != nullptr && t.pytorch()->adam_coupled_weight_decay;
  std::string out = fmt::format(
      "memsim run: {} ({} layers, h {}) on {} ({} allocator)\n"
      "  TP{} PP{} DP{} CP{}{}; seq {}, micro-batch {} x {} per iteration\n"
      "  {}, {}{}, recompute {}\n",
      config::ModelName(setup), setup.model.num_hidden_layers, setup.model.hidden_size,
      setup.device.name, setup.device.allocator_backend == alloc::Backend::kCuda ? "CUDA" : "NPU",
      t.tensor_model_parallel_size, t.pipeline_model_parallel_size, t.data_parallel_size,
      t.context_parallel_size, t.sequence_parallel ? " SP" : "", t.seq_length, t.micro_batch_size,
      m,
      StackLine(t, stack),
      t.optimizer == config::OptimizerKind::kSgd         ? "SGD"
      : t.optimizer == config::OptimizerKind::kAdafactor ? "Adafactor"
      : coupled_decay                            ? "Adam (L2 weight decay)"
      : !stack.adam_label.empty()                ? stack.adam_label
                                                 : "Adam",
      OptimizerDetail(t), RecomputeDetail(t));
  out += SkippedStepsLines(t);
  out += RecipeLines(setup);
  const engine::StageResult& stage = run.Reported();
  const workload::ParameterCounts counts = workload::TotalParameterCounts(setup);
  const workload::StaticSizes sizes = workload::ComputeStaticSizes(setup, stage.pipeline_rank);
  out += fmt::format("  parameters: {} total, {} on this rank", ParameterCount(counts.total),
                     ParameterCount(sizes.parameter_count));
  // With PEFT most are frozen: the trainable share, as print_trainable_parameters says it.
  if (counts.trainable != counts.total) {
    out += fmt::format("; trainable {}, {:.4f}%", ParameterCount(counts.trainable),
                       100.0 * static_cast<double>(counts.trainable) / static_cast<double>(counts.total));
  }
  out += "\n";
  out += HostMemoryLine(sizes);
  const bool npu = setup.device.allocator_backend == alloc::Backend::kNpu;
  out +=
      fmt::format("  reported: pipeline stage {} of {}{}\n", stage.pipeline_rank, run.stages.size(),
                  run.reported_stage_chosen ? " (--pipeline-rank)"
                  : run.stages.size() <= 1  ? ""
                  : run.reported_stage_default
                      ? " (compare's default; --pipeline-rank picks another)"
                      : " (the highest peak device memory)");
  // Two different budgets: the device total that npu-smi / nvidia-smi shows (which includes the
  // idle baseline), and what the framework may use (usable memory, which excludes it).
  out += fmt::format("  peak device ({}) {} GiB of {} GiB total\n", npu ? "npu-smi" : "nvidia-smi",
                     GiB(stage.peak_device_bytes), GiB(setup.device.total_memory_bytes));
  out += fmt::format("  peak reserved + runtime {} GiB of {} GiB usable by the framework\n",
                     GiB(stage.peak_device_bytes - setup.device.idle_baseline_bytes),
                     GiB(run.usable_memory_bytes));
  out += FormatLongRun(run);
  if (run.stages.size() > 1) {
    out += "  stages, peak allocated / reserved / device GiB:\n";
    std::string line = " ";
    for (const engine::StageResult& s : run.stages) {
      std::string item = fmt::format(" [{}] {}/{}/{}", s.pipeline_rank, GiB(s.peak_allocated_bytes),
                                     GiB(s.peak_reserved_bytes), GiB(s.peak_device_bytes));
      if (line.size() + item.size() > 78) {
        out += line + "\n";
        line = " ";
      }
      line += item;
    }
    out += line + "\n";
  }
  if (config::UnevenPipeline(setup.training)) {
    std::string layer_counts;
    for (int n : config::StageLayerCounts(setup.model, setup.training)) {
      layer_counts += fmt::format(" {}", n);
    }
    out += fmt::format("  transformer layers per stage (uneven split):{}\n", layer_counts);
  }
  return out;
}

namespace {

// Appends `detail` (lines joined by '\n') to `out`, each line wrapped at `width`: after a ", "
// if one fits, else at the last space that fits (never inside a word).
void AppendWrapped(const std::string& detail, int width, std::string* out) {
  size_t line_start = 0;
  while (line_start < detail.size()) {
    size_t end = detail.find('\n', line_start);
    if (end == std::string::npos) end = detail.size();
    std::string line = detail.substr(line_start, end - line_start);
    while (static_cast<int>(line.size()) > width) {
      size_t keep = 0, skip = 0;
      size_t cut = line.rfind(", ", static_cast<size_t>(width) - 1);
      if (cut != std::string::npos && cut >= 8) {
        keep = cut + 1, skip = cut + 2;
      } else if (cut = line.rfind(' ', static_cast<size_t>(width));
                 cut != std::string::npos && cut >= 8) {
        keep = cut, skip = cut + 1;
      } else {
        keep = skip = static_cast<size_t>(width);
      }
      *out += line.substr(0, keep) + "\n";
      line = "        " + line.substr(std::min(skip, line.size()));
    }
    if (!line.empty()) *out += line + "\n";
    line_start = end + 1;
  }
}

// The columns of a table row after the iteration's name.
std::string TableColumns(const timeline::SpanSummary& s, const timeline::SpanSummary* prev) {
  return fmt::format(" {:>11} {:>10} {:>9} {:>7} {:>6} {:>6}  {}", GiB(s.peak_allocated_bytes),
                     GiB(s.peak_reserved_bytes), GiB(s.peak_device_bytes),
                     GiB(s.start_allocated_bytes), GiB(s.end_allocated_bytes),
                     prev ? SignedGiB(s.peak_allocated_bytes - prev->peak_allocated_bytes) : "",
                     PeakWhere(s));
}

// True iff iteration `s` prints as `prev` did and changes nothing: the same columns, no change
// at the like-for-like peak, nothing kept after it.
bool RepeatsRow(const timeline::SpanSummary& prev, const timeline::SpanSummary& s) {
  if (prev.iteration == 0 || s.end_allocated_bytes != s.start_allocated_bytes) return false;
  const PeakComparison c = CompareAtSameMoment(prev, s);
  return c.against_previous && c.before == c.after && c.reserved_change_bytes == 0 &&
         s.peak_allocated_bytes == prev.peak_allocated_bytes &&
         s.peak_reserved_bytes == prev.peak_reserved_bytes &&
         s.peak_device_bytes == prev.peak_device_bytes &&
         s.start_allocated_bytes == prev.start_allocated_bytes && s.peak_phase == prev.peak_phase;
}

}  // namespace

std::string FormatIterationTable(const engine::RunResult& run, int width, size_t max_rows) {
  const std::vector<timeline::SpanSummary>& spans = run.Reported().spans;
  std::string out;
  out += "iter  peak alloc  peak resv  peak dev   start    end  dpeak  peak at\n";
  out += "      ----------------------- GiB -------------------------\n";
  for (size_t i = 0; i < spans.size(); ++i) {
    if (max_rows > 0 && i >= max_rows) {
      out += fmt::format("  {} more iterations (run --steps-csv lists every one)\n", spans.size() - i);
      break;
    }
    const timeline::SpanSummary& s = spans[i];
    const timeline::SpanSummary* prev = i > 0 ? &spans[i - 1] : nullptr;
    // kMinRepeatedRows or more iterations in a row that repeat the one before them: one line.
    size_t last = i;
    while (prev != nullptr && last < spans.size() && RepeatsRow(spans[last - 1], spans[last])) {
      ++last;
    }
    if (last - i >= kMinRepeatedRows) {
      out += fmt::format("{:>4}..{}: {} iterations, each as iteration {} (no change)\n",
                         s.iteration, spans[last - 1].iteration, last - i, prev->iteration);
      i = last - 1;
      continue;
    }
    const std::string name = s.iteration == 0 ? "init" : fmt::format("{:>4}", s.iteration);
    out += fmt::format("{:<4}{}\n", name, TableColumns(s, prev));
    std::string detail;
    if (prev) detail = LikeForLike(*prev, s);
    if (s.end_allocated_bytes != s.start_allocated_bytes && s.iteration > 0) {
      if (!detail.empty()) detail += "\n";
      detail += fmt::format("      kept after the iteration: {}",
                            CategoryDelta(s.start_by_category, s.end_by_category));
    }
    AppendWrapped(detail, width, &out);
  }
  return out;
}

std::string FormatMegatronLines(const engine::RunResult& run, const config::Setup& setup) {
  const engine::StageResult& stage = run.Reported();
  const int rank = stage.pipeline_rank * setup.training.tensor_model_parallel_size *
                   setup.training.data_parallel_size * setup.training.context_parallel_size;
  std::string out;
  // Megatron's own closed form, as `report_theoretical_memory` prints it before training
  // (megatron/training/theoretical_memory_usage.py; MB = MiB), for this stage: what the
  // simulation is compared with ("allocated" ~ weight and optimizer, "max allocated" ~ total).
  const workload::ClosedFormEstimate cf =
      workload::ComputeClosedFormEstimate(setup, stage.pipeline_rank);
  out += fmt::format(
      "Theoretical memory footprints (closed form, stage {}): weight and optimizer={} MB, "
      "activation={} MB, total={} MB\n",
      stage.pipeline_rank, MiB(cf.weight_and_optimizer_bytes), MiB(cf.activation_bytes),
      MiB(cf.total_bytes));
  Bytes max_allocated = 0, max_reserved = 0;
  for (const timeline::SpanSummary& s : stage.spans) {
    max_allocated = std::max(max_allocated, s.peak_allocated_bytes);
    max_reserved = std::max(max_reserved, s.peak_reserved_bytes);
    if (s.iteration == 0) continue;
    out += fmt::format(
        "[Rank {}] (after {} iterations) memory (MB) | allocated: {} | max allocated: {} | "
        "reserved: {} | max reserved: {}\n",
        rank, s.iteration, MiB(s.end_allocated_bytes), MiB(max_allocated),
        MiB(s.end_reserved_bytes), MiB(max_reserved));
  }
  return out;
}

namespace {
std::string_view DirectionName(config::NotModelled::Direction d) {
  switch (d) {
    case config::NotModelled::Direction::kHigh:
      return "high";
    case config::NotModelled::Direction::kLow:
      return "low";
    case config::NotModelled::Direction::kEither:
      break;
  }
  return "either way";
}

// On the stage that ran out of memory, else the reported one.
json NotModelledJson(const config::Setup& setup, const engine::RunResult& run) {
  const int rank = run.first_oom ? run.first_oom->pipeline_rank : run.Reported().pipeline_rank;
  json out = json::array();
  for (const workload::NotModelledEstimate& e : workload::EstimateNotModelled(setup, rank)) {
    out.push_back({{"what", e.flag.what},
                   {"flag", e.flag.flag},
                   {"kind", e.flag.config_key ? "config key" : "flag"},
                   {"memsim_errs", DirectionName(e.flag.direction)},
                   {"about_bytes", e.about_bytes > 0 ? json(e.about_bytes) : json(nullptr)},
                   {"basis", e.basis},
                   {"stage", rank}});
  }
  return out;
}

// Steady-state sizes: what the first optimizer step leaves allocated, by category ("static");
// and host memory besides the device's ("host"), only when there is some (reports without it
// are unchanged).
void AddStaticJson(const engine::StageResult& stage, const config::Setup& setup, json* j) {
  const timeline::SpanSummary* first = stage.Span(1);
  const CategoryBytes after_step = first ? first->end_by_category : CategoryBytes{};
  auto cat = [&](Category c) { return after_step[static_cast<size_t>(c)]; };
  (*j)["static"] = {{"parameter_bytes", cat(Category::kParameters)},
                    {"gradient_bytes", cat(Category::kGradients)},
                    {"main_param_bytes", cat(Category::kMainParameters)},
                    {"optimizer_state_bytes", cat(Category::kOptimizerStates)}};
  const workload::StaticSizes sizes = workload::ComputeStaticSizes(setup, stage.pipeline_rank);
  if (sizes.host == workload::HostMemory::kSwapOptimizer) {
    (*j)["host"] = {{"pinned_bytes", sizes.host_pinned_bytes},
                    {"pageable_bytes", sizes.host_pageable_bytes},
                    {"what", "fp32 main parameters and Adam moments (MindSpeed --swap-optimizer)"}};
  } else if (sizes.host == workload::HostMemory::kZeroOffload) {
    const std::string own = "pinned: " + sizes.host_pinned_what + "; pageable: " +
                            sizes.host_pageable_what;
    (*j)["host"] = {{"pinned_bytes", sizes.host_pinned_bytes},
                    {"pageable_bytes", sizes.host_pageable_bytes},
                    {"what", !sizes.host_pinned_what.empty() || !sizes.host_pageable_what.empty()
                                 ? own
                             : sizes.host_buffers_pinned
                                 ? "pinned: fp32 partition, its fp32 gradient, host gradient "
                                   "buffers; pageable: optimizer state (DeepSpeed "
                                   "offload_optimizer cpu, pin_memory true)"
                                 : "pinned: fp32 partition; pageable: its fp32 gradient, host "
                                   "gradient buffers, optimizer state (DeepSpeed "
                                   "offload_optimizer cpu)"}};
  }
}

}  // namespace

std::string FormatOom(const engine::RunResult& run) {
  if (!run.first_oom) return "";
  const engine::OomEvent& o = run.first_oom->oom;
  return fmt::format(
      "*** OUT OF MEMORY predicted: stage {}, iteration {}, {}\n"
      "***   {}: a request of {} failed\n"
      "***   with {} allocated and {} reserved; the allocator could hold {}\n"
      "***   ({} usable minus context and communicator buffers).\n"
      "*** The simulation went on as if the device were unbounded, to show what the job needs.\n",
      run.first_oom->pipeline_rank, o.iteration, PhaseName(o.phase),
      o.tensor_label.empty() ? o.op_name : o.tensor_label, HumanBytes(o.request_bytes),
      HumanBytes(o.allocated_bytes), HumanBytes(o.reserved_bytes), HumanBytes(o.capacity_bytes),
      HumanBytes(o.usable_memory_bytes));
}

std::string RunReportJson(const engine::RunResult& run, const config::Setup& setup) {
  const engine::StageResult& stage = run.Reported();
  json j;
  j["schema_version"] = 1;
  j["memsim_version"] = MEMSIM_VERSION;
  j["config"] = SetupJson(setup);
  // A training config that reproduces this run (config/setup.h reproducing_config).
  if (!setup.reproducing_config.empty()) {
    j["input_config"] = json::parse(setup.reproducing_config);
  }
  j["device"] = DeviceJson(setup.device);
  j["rank"] = {{"pipeline", stage.pipeline_rank}, {"tensor", 0}, {"data", 0}};
  AddStaticJson(stage, setup, &j);
  if (const timeline::SpanSummary* init = stage.Span(0)) {
    j["init"] = {{"peak_allocated_bytes", init->peak_allocated_bytes},
                 {"peak_reserved_bytes", init->peak_reserved_bytes},
                 {"end_allocated_bytes", init->end_allocated_bytes},
                 {"end_reserved_bytes", init->end_reserved_bytes}};
  } else {
    j["init"] = nullptr;
  }
  json iterations = json::array();
  for (const timeline::SpanSummary& s : stage.spans) {
    if (s.iteration == 0) continue;
    iterations.push_back({{"iteration", s.iteration},
                          {"peak_allocated_bytes", s.peak_allocated_bytes},
                          {"peak_reserved_bytes", s.peak_reserved_bytes},
                          {"peak_device_bytes", s.peak_device_bytes},
                          {"start_allocated_bytes", s.start_allocated_bytes},
                          {"end_allocated_bytes", s.end_allocated_bytes},
                          {"end_reserved_bytes", s.end_reserved_bytes},
                          {"end_device_bytes", s.end_device_bytes},
                          {"peak_phase", PhaseName(s.peak_phase)},
                          {"peak_micro_batch", s.peak_micro_batch},
                          {"by_category_at_peak", CategoriesJson(s.by_category_at_peak)},
                          {"start_by_category", CategoriesJson(s.start_by_category)},
                          {"end_by_category", CategoriesJson(s.end_by_category)}});
  }
  j["iterations"] = iterations;
  if (run.IsLongRun()) {  // absent when every iteration was simulated (schema unchanged)
    j["train_iters"] = run.train_iters;
    j["steady_state_from"] = run.steady_state_from ? json(*run.steady_state_from) : json();
    if (run.steady_state_period > 1) j["steady_state_period"] = run.steady_state_period;
  }
  json stages = json::array();
  for (const engine::StageResult& s : run.stages) {
    stages.push_back({{"pipeline", s.pipeline_rank},
                      {"peak_allocated_bytes", s.peak_allocated_bytes},
                      {"peak_reserved_bytes", s.peak_reserved_bytes},
                      {"peak_device_bytes", s.peak_device_bytes},
                      {"by_category_at_peak", CategoriesJson(s.by_category_at_peak)}});
  }
  j["stages"] = stages;
  j["allocator"] = StatsJson(stage.simulation.allocator_stats);
  j["device_outside_allocator_bytes"] = stage.simulation.outside_allocator_bytes;
  j["num_communicators"] = stage.simulation.num_communicators;
  if (run.first_oom) {
    const engine::OomEvent& o = run.first_oom->oom;
    j["oom"] = {{"stage", run.first_oom->pipeline_rank},
                {"iteration", o.iteration},
                {"phase", PhaseName(o.phase)},
                {"time_us", o.time_us},
                {"request_bytes", o.request_bytes},
                {"allocated_bytes", o.allocated_bytes},
                {"reserved_bytes", o.reserved_bytes},
                {"usable_memory_bytes", o.usable_memory_bytes},
                {"tensor", o.tensor_label}};
  } else {
    j["oom"] = nullptr;
  }
  // Only when a flag was warned not modelled (docs/interfaces.md 'JSON report').
  if (!setup.not_modelled.empty()) j["not_modelled"] = NotModelledJson(setup, run);
  return j.dump(2) + "\n";
}

std::vector<std::string> WarningsWithEstimates(const config::Setup& setup) {
  std::vector<std::string> out = setup.warnings;
  if (setup.not_modelled.empty()) return out;
  const bool staged = setup.training.pipeline_model_parallel_size > 1;
  for (const workload::NotModelledEstimate& e : workload::EstimateNotModelled(setup, 0)) {
    if (e.about_bytes == 0) continue;
    const std::string head = e.flag.what + ": ";
    for (std::string& w : out) {
      if (!w.starts_with(head)) continue;
      w += fmt::format("; by about {}{}: {}", HumanBytes(e.about_bytes),
                       staged ? " on pipeline stage 0" : "", e.basis);
      break;
    }
  }
  return out;
}

// "2 flags", "1 key", "1 flag and 2 keys": what setup.not_modelled holds.
std::string FlagsAndKeys(const std::vector<config::NotModelled>& all) {
  const auto keys = static_cast<size_t>(std::count_if(
      all.begin(), all.end(), [](const config::NotModelled& n) { return n.config_key; }));
  const size_t flags = all.size() - keys;
  const auto count = [](size_t n, std::string_view what) {
    return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
  };
  if (keys == 0) return count(flags, "flag");
  if (flags == 0) return count(keys, "key");
  return count(flags, "flag") + " and " + count(keys, "key");
}

std::string FormatNotModelledCaveat(const engine::RunResult& run, const config::Setup& setup) {
  if (!run.first_oom || setup.not_modelled.empty()) return "";
  const int rank = run.first_oom->pipeline_rank;
  std::string out = fmt::format(
      "*** Caveat: {} warned not modelled; so this verdict may be off (stage {}):\n",
      FlagsAndKeys(setup.not_modelled), rank);
  Bytes high = 0, low = 0;
  int unknown = 0;
  for (const workload::NotModelledEstimate& e : workload::EstimateNotModelled(setup, rank)) {
    const std::string_view dir = DirectionName(e.flag.direction);
    if (e.about_bytes == 0) {
      ++unknown;
      out += fmt::format("***   {}: memsim errs {}, by an amount not estimated{}\n", e.flag.what,
                         dir, e.basis.empty() ? "" : " (" + e.basis + ")");
      continue;
    }
    if (e.flag.direction == config::NotModelled::Direction::kHigh) high += e.about_bytes;
    if (e.flag.direction == config::NotModelled::Direction::kLow) low += e.about_bytes;
    out += fmt::format("***   {}: memsim errs {} by about {} ({})\n", e.flag.what, dir,
                       HumanBytes(e.about_bytes), e.basis);
  }
  if (high == 0 && low == 0) {
    out += "***   In all: no amount is estimated for any of them.\n";
    return out;
  }
  out += fmt::format("***   In all: memsim predicts up to about {} more and {} less than the run "
                     "would use{}.\n",
                     HumanBytes(high), HumanBytes(low),
                     unknown > 0 ? fmt::format(", {} not estimated", unknown) : std::string());
  return out;
}

}  // namespace memsim::report
