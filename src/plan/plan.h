// `memsim plan` (docs/plan.md): which parallel layouts of one training config fit the device,
// each fitting one simulated in full. Given a base Setup (a training config or a Megatron launch,
// as `run` reads it), a device count, a global batch and a sequence length, the planner
// enumerates layouts -- tensor (TP), pipeline (PP), context (CP) and expert (EP) parallel sizes,
// the data-parallel size DP = devices / (TP × PP × CP) they leave, the micro-batch size,
// recompute (none, selective core attention, full uniform) and the distributed optimizer on or
// off -- prunes those Megatron's rules refuse (each with the rule, Rule* below), loads each
// survivor as a config (config::LoadVariant: every rule of the loader checked again), simulates
// every pipeline stage of it (engine::RunAllStages) and judges its peaks against the device's
// usable memory less a headroom (report::CheckStages, the verdicts of `memsim check`). Fitting
// plans are ranked by an estimated step time (EstimateStepSeconds: a ranking aid, not a
// prediction).
//
// Scope: stacks with model parallelism (config::StackTraits::model_parallel, framework
// "megatron"). Not varied yet: virtual pipeline stages, expert tensor parallel sizes other than
// the base config's, ZeRO / FSDP choices, expandable_segments, communication time in the
// estimate, a cheaper pre-pass to skip hopeless candidates.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::plan {

// One layout: the values a candidate sets in the base config's training block (Overrides).
struct Layout {
  int tp = 1;   // tensor_model_parallel_size
  int pp = 1;   // pipeline_model_parallel_size
  int cp = 1;   // context_parallel_size
  int ep = 1;   // expert_model_parallel_size
  int dp = 1;   // data_parallel_size = devices / (tp × pp × cp)
  int mbs = 1;  // micro_batch_size
  config::RecomputeGranularity recompute = config::RecomputeGranularity::kNone;
  bool distributed_optimizer = false;
  bool operator==(const Layout&) const = default;
};

// The values tried for each key; a layout is one value of each. Keys (Fix / Vary): tp, pp, cp,
// ep, mbs, recompute (none | selective | full), dist_opt (true | false).
struct Space {
  std::vector<int> tp, pp, cp, ep, mbs;
  std::vector<config::RecomputeGranularity> recompute;
  std::vector<bool> dist_opt;
};

// The default space (docs/plan.md): tp, pp, mbs in {1, 2, 4, 8}, {1, 2, 4, 8}, {1, 2, 4}; cp
// {1}; ep {1} for a dense model, {1, 2, 4, 8} for a mixture of experts; recompute none,
// selective, full; the distributed optimizer on and off. Megatron-FSDP bases keep their own
// use_distributed_optimizer (Megatron-FSDP builds its optimizer sharded or not by its strategy).
Space DefaultSpace(const config::Setup& base);

// --fix KEY=VALUE (one value) and --vary KEY=V1,V2,... (a list): replace KEY's values in
// `space`. Throws InputError "--fix KEY=VALUE: ..." naming the unknown key or bad value.
void ApplyFix(std::string_view text, Space* space);
void ApplyVary(std::string_view text, Space* space);

struct Request {
  int devices = 1;             // world size
  int per_node = 0;            // devices a node (--per-node); 0 = not known (no TP bound)
  int global_batch_size = 0;   // samples a step
  int seq_length = 0;          // tokens a sample
  double headroom_pct = 5.0;   // fits when peak <= usable × (1 - headroom / 100)
  int max_candidates = 200;    // most layouts simulated; more is an InputError
  Space space;
  int threads = 0;             // candidates simulated at once (0: one per CPU)
};

enum class Verdict { kFits, kDoesNotFit, kNotAllowed };

struct Candidate {
  Layout layout;
  Verdict verdict = Verdict::kNotAllowed;
  // kNotAllowed: the rule ("TP 3 does not divide num_attention_heads 32 (...)"); kDoesNotFit: the
  // worst stage's check message ("peak 81.2 GiB exceeds ..."); kFits: that stage's message.
  std::string reason;
  // kNotAllowed: the rule broken, in the same words for every layout that breaks it ("TP × PP ×
  // CP divides the devices"; "the config loader's rules" for a LoadVariant error); the table
  // groups the not-allowed layouts by it. "" otherwise.
  std::string rule;
  // Simulated candidates: the deciding stage's `memsim check` verdict ("ok", "oom", "over",
  // "margin"; report/check.h).
  std::string check_verdict;
  std::vector<Bytes> stage_peak_bytes;  // by pipeline rank (simulated candidates)
  Bytes peak_bytes = 0;                 // the highest stage's, as `check` counts it
  Bytes usable_bytes = 0;
  int num_micro_batches = 0;
  double step_seconds = 0;              // EstimateStepSeconds (simulated candidates)
  std::string config_json;              // the plan as a training config (reproducing_config)
};

struct PlanResult {
  std::vector<Candidate> candidates;  // fitting first (RankedStepSeconds, then lower peak); then
                                      // the rest by peak; then not allowed (docs/plan.md)
  int enumerated = 0;                 // layouts of the space
  int simulated = 0;                  // those that passed the rules and were simulated
  int fitting = 0;
  double headroom_pct = 5.0;
  std::string model;                  // config::ModelName of the base
  std::string device;                 // the preset's name
  int devices = 0;
  int global_batch_size = 0;
  int seq_length = 0;
};

// The first rule `layout` breaks for `base` under `request`, as a sentence naming the rule and
// its source; "" when none. Pure. Sets layout.dp from the device count first (Enumerate does).
std::string RuleViolated(const config::Setup& base, const Request& request, const Layout& layout);

// Every layout of request.space with its dp set, in a fixed order (tp, pp, cp, ep, mbs,
// recompute, dist_opt, the last varying fastest); those that break a rule get kNotAllowed and
// the rule, the rest kDoesNotFit and an empty reason (not judged yet). Throws InputError when
// the space has more than kMaxLayouts layouts.
inline constexpr int kMaxLayouts = 100000;
std::vector<Candidate> Enumerate(const config::Setup& base, const Request& request);

// The --set lines that turn the base config into `layout`'s plan (training.<key>=VALUE), with
// request's global batch and sequence length; sequence_parallel is on exactly when tp > 1.
std::vector<std::string> Overrides(const Layout& layout, const Request& request);

// A loader message about the plan's own --set lines (Overrides) in the planner's words: "--set
// training.pipeline_model_parallel_size=4: ..." becomes "pp=4: ...", the global batch and
// sequence length "--global-batch-size N" / "--seq-length N"; other text is kept.
std::string InUserKeys(std::string message);

// The step-time estimate (seconds) of a loaded plan, docs/plan.md: Megatron's FLOPs a step
// (megatron/training/training.py num_floating_point_operations: 12 × tokens × layers × h² ×
// (attention + MLP terms) + 6 × tokens × h × vocab), plus recompute's extra forward (full: one
// forward of every layer, a third of the layer term; selective: a third of the core-attention
// term), spread over the devices at the preset's peak FLOPs for the precision times
// kAssumedEfficiency, stretched by the 1F1B bubble (1 + (PP - 1) / num_micro_batches). A ranking
// aid: communication is not counted. 0 when the preset has no peak FLOPs.
inline constexpr double kAssumedEfficiency = 0.4;
double EstimateStepSeconds(const config::Setup& plan);

// The estimate as the table prints it: at least 3 significant digits, no exponent ("38.4",
// "1235", "0.0123"; "-" when 0, no peak FLOPs). RankedStepSeconds is that text's value: the
// ranking compares what the table shows. Plans whose estimates differ by less (layouts that differ
// only in what the estimate does not count, or in the vocabulary padding) tie, and the lower peak
// goes first.
std::string StepSecondsText(double seconds);
double RankedStepSeconds(double seconds);

// Enumerates, prunes, loads and simulates (threads: request.threads candidates at once with
// core RunInOrder, each one's stages on its own thread), judges and ranks. `progress(done, all)`
// is called on the calling thread after each simulated candidate. Throws InputError when the
// base is not a model-parallel stack, or more than request.max_candidates pass the rules.
PlanResult Plan(const config::Setup& base, const Request& request,
                const std::function<void(int, int)>& progress);

// The top `top` fitting plans as a table (layout, DP, micro-batches, peak of the worst stage,
// headroom, estimated step time), then counts of the rest and the most common reasons for each
// verdict.
std::string FormatPlanTable(const PlanResult& result, int top);
// The result as JSON (docs/plan.md): {"schema":1, "model", "device", "headroom_pct",
// "enumerated", "simulated", "fitting", "plans": [the top `top` fitting, each with layout,
// verdict, reason, stage_peak_bytes, peak_bytes, usable_bytes, step_seconds], "rejected":
// [{"verdict", "reason", "count"}]}.
std::string PlanJson(const PlanResult& result, int top);
// The files --write-config DIR writes: "plan-<rank>-tp<T>-pp<P>-....json" and the plan's config
// (its `_comment` naming the plan, the base config's `_comment` / `_about` dropped), for the top
// `top` fitting plans.
std::vector<std::pair<std::string, std::string>> PlanConfigFiles(const PlanResult& result,
                                                                  int top);
// "tp2 pp1 cp1 ep1 dp4 mbs1 selective dist_opt"
std::string LayoutLabel(const Layout& layout);

}  // namespace memsim::plan
