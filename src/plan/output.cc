// What `memsim plan` prints and writes: the table, the JSON and the plans' configs
// (plan/plan.h; docs/plan.md, 'Output').
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "report/format.h"

namespace memsim::plan {
namespace {

using json = nlohmann::ordered_json;

const char* VerdictName(Verdict v) {
  return v == Verdict::kFits ? "fits" : v == Verdict::kDoesNotFit ? "does not fit" : "not allowed";
}

int Count(const PlanResult& r, Verdict v) {
  return static_cast<int>(std::count_if(r.candidates.begin(), r.candidates.end(),
                                        [v](const Candidate& c) { return c.verdict == v; }));
}

// The reasons (by_rule: the rules) of the candidates with verdict `v`, with their counts and the
// first candidate of each, most common first (ties: first seen).
struct Group {
  std::string key;
  int count = 0;
  const Candidate* first = nullptr;
};

std::vector<Group> Groups(const PlanResult& r, Verdict v, bool by_rule) {
  std::vector<Group> out;
  std::map<std::string, size_t> index;
  for (const Candidate& c : r.candidates) {
    if (c.verdict != v) continue;
    const std::string& key = by_rule ? c.rule : c.reason;
    const auto [it, added] = index.emplace(key, out.size());
    if (added) out.push_back({key, 0, &c});
    ++out[it->second].count;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Group& a, const Group& b) { return a.count > b.count; });
  return out;
}

// "not allowed (108), by rule:" and one line a rule, with the first layout's own message.
std::string NotAllowed(const PlanResult& r) {
  const std::vector<Group> rules = Groups(r, Verdict::kNotAllowed, /*by_rule=*/true);
  if (rules.empty()) return "";
  std::string out = fmt::format("\nnot allowed ({}), by rule:\n", Count(r, Verdict::kNotAllowed));
  for (const Group& g : rules) {
    out += fmt::format("  {:>5} × {}; e.g. {}: {}\n", g.count, g.key, LayoutLabel(g.first->layout),
                       g.first->reason);
  }
  return out;
}

std::string Seconds(double s) { return s > 0 ? StepSecondsText(s) + " s" : "-"; }

// The shown plans' rows, the layout column as wide as the longest label (at least 40 characters:
// "tp8 pp8 cp1 ep1 dp131072 mbs4 selective dist_opt" keeps the columns after it aligned).
std::string FittingRows(const PlanResult& r, int top) {
  std::vector<const Candidate*> shown;
  size_t width = 40;
  for (const Candidate& c : r.candidates) {
    if (c.verdict != Verdict::kFits || static_cast<int>(shown.size()) == top) continue;
    shown.push_back(&c);
    width = std::max(width, LayoutLabel(c.layout).size());
  }
  std::string out = fmt::format("{:>3}  {:<{}} {:>12} {:>12} {:>11} {:>11}\n", "#", "layout", width,
                                "microbatches", "peak", "headroom", "est. step");
  for (size_t i = 0; i < shown.size(); ++i) {
    const Candidate& c = *shown[i];
    out += fmt::format("{:>3}  {:<{}} {:>12} {:>12} {:>11} {:>11}\n", i + 1, LayoutLabel(c.layout),
                       width, c.num_micro_batches, report::HumanBytes(c.peak_bytes),
                       report::HumanBytes(c.usable_bytes - c.peak_bytes), Seconds(c.step_seconds));
  }
  return out;
}

// "do not fit (75: 40 out of memory, 35 within the 5% margin); the smallest: ...".
std::string NotFitting(const PlanResult& r) {
  std::map<std::string, int> by;
  const Candidate* smallest = nullptr;
  for (const Candidate& c : r.candidates) {
    if (c.verdict != Verdict::kDoesNotFit) continue;
    ++by[c.check_verdict];
    if (smallest == nullptr) smallest = &c;  // sorted by peak
  }
  if (smallest == nullptr) return "";
  std::string kinds;
  for (const auto& [verdict, label] :
       {std::pair<std::string, std::string>{"oom", "out of memory"},
        {"over", "peak over usable memory"},
        {"margin", fmt::format("inside the {}% headroom", r.headroom_pct)}}) {
    if (by[verdict] > 0) kinds += fmt::format(", {} {}", by[verdict], label);
  }
  return fmt::format("\ndo not fit ({}{}); the smallest: {}: {}\n", Count(r, Verdict::kDoesNotFit),
                     kinds, LayoutLabel(smallest->layout), smallest->reason);
}

}  // namespace

std::string FormatPlanTable(const PlanResult& r, int top) {
  std::string out = fmt::format(
      "memsim plan: {} on {} × {}, global batch {}, sequence {}, headroom {}%\n"
      "{} layouts: {} fit, {} do not fit, {} not allowed ({} simulated in full)\n\n",
      r.model, r.devices, r.device, r.global_batch_size, r.seq_length, r.headroom_pct,
      r.enumerated, r.fitting, Count(r, Verdict::kDoesNotFit), Count(r, Verdict::kNotAllowed),
      r.simulated);
  if (r.fitting > 0) {
    out += FittingRows(r, top);
    out += fmt::format("peak: the worst pipeline stage's device memory as `memsim check` counts "
                       "it; est. step: a ranking aid (docs/plan.md), not a prediction\n");
  } else {
    out += "no layout fits\n";
  }
  out += NotFitting(r);
  out += NotAllowed(r);
  return out;
}

std::string PlanJson(const PlanResult& r, int top) {
  json plans = json::array();
  for (const Candidate& c : r.candidates) {
    if (c.verdict != Verdict::kFits || static_cast<int>(plans.size()) == top) continue;
    const Layout& l = c.layout;
    plans.push_back({{"layout",
                      {{"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"ep", l.ep}, {"dp", l.dp},
                       {"mbs", l.mbs},
                       {"recompute", l.recompute == config::RecomputeGranularity::kFull ? "full"
                                     : l.recompute == config::RecomputeGranularity::kSelective
                                         ? "selective"
                                         : "none"},
                       {"dist_opt", l.distributed_optimizer}}},
                     {"verdict", VerdictName(c.verdict)},
                     {"reason", c.reason},
                     {"check_verdict", c.check_verdict},
                     {"num_micro_batches", c.num_micro_batches},
                     {"stage_peak_device_bytes", c.stage_peak_bytes},
                     {"peak_bytes", c.peak_bytes},
                     {"usable_bytes", c.usable_bytes},
                     {"estimated_step_seconds", c.step_seconds}});
  }
  json rejected = json::array();
  for (const Verdict v : {Verdict::kDoesNotFit, Verdict::kNotAllowed}) {
    for (const Group& g : Groups(r, v, /*by_rule=*/false)) {
      json row = {{"verdict", VerdictName(v)}, {"reason", g.key}, {"count", g.count}};
      if (v == Verdict::kNotAllowed) row["rule"] = g.first->rule;
      rejected.push_back(std::move(row));
    }
  }
  json j = {{"schema", 1},          {"model", r.model},
            {"device", r.device},   {"devices", r.devices},
            {"global_batch_size", r.global_batch_size}, {"seq_length", r.seq_length},
            {"headroom_pct", r.headroom_pct}, {"enumerated", r.enumerated},
            {"simulated", r.simulated}, {"fitting", r.fitting},
            {"plans", std::move(plans)}, {"rejected", std::move(rejected)}};
  return j.dump(1) + "\n";
}

namespace {

// The plan's config with its own `_comment` first, in place of the base config's `_comment` /
// `_about` (which described the base's model, device or layout, not this plan's).
std::string WithPlanComment(const PlanResult& r, const Candidate& c, int number) {
  const json config = json::parse(c.config_json);
  json out = {{"_comment", fmt::format("memsim plan #{}: {} for {} on {} x {}, global batch {}, "
                                       "sequence {}",
                                       number, LayoutLabel(c.layout), r.model, r.devices,
                                       r.device, r.global_batch_size, r.seq_length)}};
  for (const auto& [key, value] : config.items()) {
    if (key != "_comment" && key != "_about") out[key] = value;
  }
  return out.dump(1) + "\n";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> PlanConfigFiles(const PlanResult& r, int top) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Candidate& c : r.candidates) {
    if (c.verdict != Verdict::kFits || static_cast<int>(out.size()) == top) continue;
    std::string name = LayoutLabel(c.layout);
    std::replace(name.begin(), name.end(), ' ', '-');
    const int number = static_cast<int>(out.size()) + 1;
    out.emplace_back(fmt::format("plan-{:02}-{}.json", number, name), WithPlanComment(r, c, number));
  }
  return out;
}

}  // namespace memsim::plan
