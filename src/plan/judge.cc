// Each surviving layout loaded and simulated in full, judged as `memsim check` judges a run,
// and the step-time estimate that ranks the fitting ones (plan/plan.h; docs/plan.md).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config/load.h"
#include "config/stack.h"
#include "core/error.h"
#include "core/parallel.h"
#include "engine/stages.h"
#include "plan/plan.h"
#include "report/check.h"

namespace memsim::plan {
namespace {

// The per-token terms of Megatron's num_floating_point_operations (megatron/training/training.py)
// in units of 12 × h² per layer: attention projections, core attention, MLP.
struct LayerTerms {
  double projections = 0;
  double core_attention = 0;
  double dense_mlp = 0;
  double moe_mlp = 0;
  int moe_layers = 0;
};

LayerTerms TermsOf(const config::Setup& plan) {
  const config::ModelConfig& m = plan.model;
  const double h = m.hidden_size;
  const double heads = m.num_attention_heads;
  const double head_dim = m.head_dim > 0 ? m.head_dim : h / heads;
  const double q_ratio = head_dim * heads / h;  // query projection size / hidden size
  const double gated = m.gated_mlp ? 1.5 : 1.0;  // training.py gated_linear_multiplier (swiglu)
  LayerTerms t;
  t.projections = (1.0 + m.num_key_value_heads / heads) * q_ratio;
  t.core_attention = plan.training.seq_length / h * q_ratio;
  t.dense_mlp = m.intermediate_size / h * gated;
  if (m.num_experts > 1) {
    const double expert = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.intermediate_size;
    t.moe_mlp = (expert * m.moe_router_topk + m.moe_shared_expert_intermediate_size) / h * gated;
    t.moe_layers = m.moe_layer_pattern.empty()
                       ? m.num_hidden_layers
                       : static_cast<int>(std::count(m.moe_layer_pattern.begin(),
                                                     m.moe_layer_pattern.end(), true));
  }
  return t;
}

double PeakFlops(const config::Setup& plan) {
  switch (plan.training.precision) {
    case config::Precision::kBf16: return plan.device.peak_flops_bf16;
    case config::Precision::kFp16: return plan.device.peak_flops_fp16;
    case config::Precision::kFp32: return plan.device.peak_flops_fp32;
  }
  return 0;
}

// Loads, simulates and judges one layout that passed the rules.
void Judge(const config::Setup& base, const Request& request, Candidate* c) {
  config::Setup plan;
  try {
    plan = config::LoadVariant(base, Overrides(c->layout, request),
                               "plan " + LayoutLabel(c->layout));
  } catch (const InputError& e) {
    // A rule of the loader (config/rules.h) the planner's own rules do not repeat.
    c->verdict = Verdict::kNotAllowed;
    c->reason = InUserKeys(e.what());
    c->rule = "the config loader's rules (config/rules.h)";
    return;
  }
  engine::RunOptions options;
  options.keep_timeline = false;
  options.threads = 1;  // candidates run on threads of their own (Plan)
  const engine::RunResult run = engine::RunAllStages(plan, options);
  report::CheckOptions check;
  check.margin_pct = request.headroom_pct;
  const std::vector<report::StageVerdict> verdicts =
      report::CheckStages("plan", run, plan, check, nullptr);
  // The stage that decides: the first that fails, else the one with the highest peak.
  const report::StageVerdict* decisive = &verdicts.front();
  for (const report::StageVerdict& v : verdicts) {
    if (v.peak_bytes > decisive->peak_bytes) decisive = &v;
  }
  for (const report::StageVerdict& v : verdicts) {
    if (v.verdict != "ok") {
      decisive = &v;
      break;
    }
  }
  c->verdict = decisive->verdict == "ok" ? Verdict::kFits : Verdict::kDoesNotFit;
  c->reason = fmt::format("stage {}: {}", decisive->pipeline, decisive->message);
  c->check_verdict = decisive->verdict;
  for (const engine::StageResult& s : run.stages) c->stage_peak_bytes.push_back(s.peak_device_bytes);
  for (const report::StageVerdict& v : verdicts) c->peak_bytes = std::max(c->peak_bytes, v.peak_bytes);
  c->usable_bytes = decisive->usable_bytes;
  c->num_micro_batches = plan.training.num_micro_batches;
  c->step_seconds = EstimateStepSeconds(plan);
  c->config_json = plan.reproducing_config;
}

int Rank(Verdict v) { return v == Verdict::kFits ? 0 : v == Verdict::kDoesNotFit ? 1 : 2; }

// The order of the result (docs/plan.md, 'Ranking'): fitting plans first, by the step-time
// estimate to the 3 significant digits the table shows (RankedStepSeconds), ties by the lower
// peak; then the plans that do not fit, by peak; then the not-allowed layouts. What is still
// tied keeps the enumeration order (a stable sort), so the order never depends on threads.
bool RankedBefore(const Candidate& a, const Candidate& b) {
  if (Rank(a.verdict) != Rank(b.verdict)) return Rank(a.verdict) < Rank(b.verdict);
  if (a.verdict == Verdict::kNotAllowed) return false;
  if (a.verdict == Verdict::kFits) {
    const double sa = RankedStepSeconds(a.step_seconds);
    const double sb = RankedStepSeconds(b.step_seconds);
    if (sa != sb) return sa < sb;
  }
  return a.peak_bytes < b.peak_bytes;
}

}  // namespace

std::string StepSecondsText(double seconds) {
  if (!(seconds > 0)) return "-";
  const int decimals = std::max(0, 2 - static_cast<int>(std::floor(std::log10(seconds))));
  return fmt::format("{:.{}f}", seconds, decimals);
}

double RankedStepSeconds(double seconds) {
  return seconds > 0 ? std::stod(StepSecondsText(seconds)) : 0;
}

double EstimateStepSeconds(const config::Setup& plan) {
  const double peak = PeakFlops(plan) * kAssumedEfficiency;
  if (peak <= 0) return 0;
  const config::TrainingConfig& c = plan.training;
  const config::ModelConfig& m = plan.model;
  const LayerTerms t = TermsOf(plan);
  const double tokens = static_cast<double>(c.global_batch_size) * c.seq_length;
  const double h2 = static_cast<double>(m.hidden_size) * m.hidden_size;
  const int dense_layers = m.num_hidden_layers - t.moe_layers;
  const double layer_units = m.num_hidden_layers * (t.projections + t.core_attention) +
                             dense_layers * t.dense_mlp + t.moe_layers * t.moe_mlp;
  double flops = 12.0 * tokens * h2 * layer_units +
                 6.0 * tokens * m.hidden_size * static_cast<double>(m.padded_vocab_size);
  // Recompute's extra forward: a third of a term that counts forward and two backward GEMMs.
  if (c.recompute_granularity == config::RecomputeGranularity::kFull) {
    flops += 12.0 * tokens * h2 * layer_units / 3.0;
  } else if (c.recompute_granularity == config::RecomputeGranularity::kSelective &&
             std::find(c.recompute_modules.begin(), c.recompute_modules.end(), "core_attn") !=
                 c.recompute_modules.end()) {
    flops += 12.0 * tokens * h2 * m.num_hidden_layers * t.core_attention / 3.0;
  }
  const double devices = static_cast<double>(c.tensor_model_parallel_size) *
                         c.pipeline_model_parallel_size * c.data_parallel_size *
                         c.context_parallel_size;
  // 1F1B: (PP - 1) micro-batch slots of fill and drain beside num_micro_batches of work
  // (Narayanan et al. 2021, arXiv:2104.04473, section 2.2.1: bubble fraction (p - 1) / m).
  const double bubble = 1.0 + (c.pipeline_model_parallel_size - 1.0) / c.num_micro_batches;
  return flops / devices / peak * bubble;
}

PlanResult Plan(const config::Setup& base, const Request& request,
                const std::function<void(int, int)>& progress) {
  if (!config::StackOf(base.training).Traits().model_parallel) {
    throw InputError(fmt::format("framework \"{}\" has no model-parallel layouts to vary (plan "
                                 "a framework \"megatron\" config)",
                                 base.training.framework));
  }
  PlanResult result;
  result.model = config::ModelName(base);
  result.device = base.device.name;
  result.headroom_pct = request.headroom_pct;
  result.devices = request.devices;
  result.global_batch_size = request.global_batch_size;
  result.seq_length = request.seq_length;
  std::vector<Candidate> all = Enumerate(base, request);
  result.enumerated = static_cast<int>(all.size());
  std::vector<size_t> todo;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].verdict != Verdict::kNotAllowed) todo.push_back(i);
  }
  const int n = static_cast<int>(todo.size());
  if (n > request.max_candidates) {
    throw InputError(fmt::format("{} layouts pass the rules, more than --max-candidates {}: "
                                 "narrow the space with --fix KEY=VALUE (or raise the bound)",
                                 n, request.max_candidates));
  }
  const int threads = request.threads > 0 ? request.threads : AvailableCpus();
  RunInOrder(
      n, threads, [&](int i) { Judge(base, request, &all[todo[i]]); },
      [&](int i) {
        if (progress) progress(i + 1, n);
      });
  for (const Candidate& c : all) {
    result.simulated += !c.stage_peak_bytes.empty();
    result.fitting += c.verdict == Verdict::kFits;
  }
  std::stable_sort(all.begin(), all.end(), RankedBefore);
  result.candidates = std::move(all);
  return result;
}

}  // namespace memsim::plan
