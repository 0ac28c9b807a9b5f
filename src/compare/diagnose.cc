#include "compare/diagnose.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

namespace memsim::compare {
namespace {

std::string Size(Bytes b) {
  const double a = std::abs(static_cast<double>(b));
  if (a >= static_cast<double>(kGiB)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / kGiB);
  return fmt::format("{:.1f} MiB", static_cast<double>(b) / kMiB);
}

double Pct(double measured, double simulated) { return (measured - simulated) / simulated * 100.0; }

// The categories held, largest first, those of at least 1% of `total` (and 1 MiB).
std::string Held(const CategoryBytes& c) {
  Bytes total = 0;
  for (Bytes b : c) total += b;
  std::vector<std::pair<Bytes, int>> held;
  for (int k = 0; k < kNumCategories; ++k) {
    const Bytes b = c[static_cast<size_t>(k)];
    if (b >= kMiB && b * 100 >= total) held.emplace_back(b, k);
  }
  std::stable_sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  for (const auto& [b, k] : held) {
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", Size(b), CategoryName(static_cast<Category>(k)));
  }
  return out.empty() ? "nothing" : out;
}

// The single category whose size is within 15% of -gap (the profile holds less), if any.
std::optional<Category> ExplainsGap(const CategoryBytes& c, Bytes gap) {
  if (gap >= 0) return std::nullopt;
  const double want = -static_cast<double>(gap);
  std::optional<Category> best;
  double best_off = 0.15 * want;
  for (int k = 0; k < kNumCategories; ++k) {
    const double off = std::abs(static_cast<double>(c[static_cast<size_t>(k)]) - want);
    if (off <= best_off) best = static_cast<Category>(k), best_off = off;
  }
  return best;
}

// One moment (a peak or an iteration's end) of one iteration, when the gap is 2% or more.
// `later`: the first later iteration whose same moment agrees (within 2%) while the simulation
// holds there at least 85% of `category`'s share of the gap; nullptr when none.
using LaterAgreement = std::function<const IterationResult*(Category category, Bytes gap)>;

// The finding's text after "iteration N (simulated M), ", or nothing when the moment agrees.
std::optional<std::string> MomentFinding(std::string_view moment, std::string_view curve,
                                         Bytes measured, Bytes simulated,
                                         const CategoryBytes& held, const LaterAgreement& later) {
  if (measured < 0 || simulated <= 0) return std::nullopt;
  const Bytes gap = measured - simulated;
  if (std::abs(static_cast<double>(gap)) < 0.02 * static_cast<double>(simulated)) {
    return std::nullopt;
  }
  std::string text = fmt::format(
      "{} {}: measured {}, simulated {} ({:+.1f}%); the simulation holds then {}", moment, curve,
      Size(measured), Size(simulated),
      Pct(static_cast<double>(measured), static_cast<double>(simulated)), Held(held));
  const std::optional<Category> c = ExplainsGap(held, gap);
  const IterationResult* agrees = c ? later(*c, gap) : nullptr;
  if (c && agrees) {
    // The run holds them one or more iterations on: not their absence, but their timing.
    text += fmt::format(
        "; the gap ({}) is the size of {} ({}), but at iteration {}'s {} the run agrees with the "
        "simulation, which holds them then: the run holds them, only later than this moment of "
        "the simulation (a skipped optimizer step, or a profile iteration that ends before its "
        "step)",
        Size(gap), CategoryName(*c), Size(held[static_cast<size_t>(*c)]), agrees->iteration,
        moment);
  } else if (c) {
    text += fmt::format("; the gap ({}) is the size of {} alone ({}): the run may not hold them",
                        Size(gap), CategoryName(*c), Size(held[static_cast<size_t>(*c)]));
  } else if (gap > 0) {
    text += fmt::format("; the run holds {} more than any simulated category accounts for", Size(gap));
  } else {
    text += fmt::format("; no single category is the size of the gap ({})", Size(gap));
  }
  return text + ".";
}

// Moment findings of consecutive iterations with the same text (the steady iterations of a
// profile repeat one gap) are one finding over the range: "iterations 2..6 (simulated 2..4), ".
class MomentFindings {
 public:
  explicit MomentFindings(std::vector<Finding>* out) : out_(out) {}

  void Add(const IterationResult& it, std::optional<std::string> body) {
    if (!body) return;
    for (Run& r : runs_) {
      if (r.body != *body || r.last + 1 != it.iteration) continue;
      r.last = it.iteration;
      r.sim_last = it.simulated_iteration;
      (*out_)[r.index].text = Text(r);
      return;
    }
    runs_.push_back({std::move(*body), it.iteration, it.iteration, it.simulated_iteration,
                     it.simulated_iteration, out_->size()});
    out_->push_back({false, Text(runs_.back())});
  }

 private:
  struct Run {
    std::string body;
    int first = 0, last = 0, sim_first = 0, sim_last = 0;
    size_t index = 0;  // into *out_
  };
  static std::string Text(const Run& r) {
    if (r.first == r.last) {
      return fmt::format("iteration {} (simulated {}), {}", r.first, r.sim_first, r.body);
    }
    const std::string sim = r.sim_first == r.sim_last
                                ? std::to_string(r.sim_first)
                                : fmt::format("{}..{}", r.sim_first, r.sim_last);
    return fmt::format("iterations {}..{} (simulated {}), {}", r.first, r.last, sim, r.body);
  }
  std::vector<Finding>* out_;
  std::vector<Run> runs_;
};

const SimulatedSide::Iteration* SimIteration(const SimulatedSide& s, int iteration) {
  for (const SimulatedSide::Iteration& i : s.iterations) {
    if (i.iteration == iteration) return &i;
  }
  return nullptr;
}

// Skipped iterations (fp16 loss scaling): Adam's state was created later than simulated, or never.
void SkippedIterationFindings(const Report& report, const timeline::LogStatements& log,
                              const SimulatedSide& sim, std::vector<Finding>& out) {
  if (!log.skipped_iterations || *log.skipped_iterations <= 0) return;
  int measured_last = 0;
  for (const IterationResult& it : report.iterations) measured_last = std::max(measured_last, it.iteration);
  const int logged = std::max(log.last_logged_iteration.value_or(0), measured_last);
  const int skipped = *log.skipped_iterations;
  const std::string of = logged > 0 ? fmt::format(" of {}", logged) : std::string();
  if (logged == 0 || skipped >= logged) {
    out.push_back(
        {true, fmt::format(
                   "likely cause: the log says {}{} iterations were skipped (Megatron "
                   "training_log, 'number of skipped iterations'): the {}loss scaler found "
                   "inf/nan gradients and skipped every optimizer step, so Adam's state was "
                   "never created; the simulation assumes the steps ran and creates {} of "
                   "{} in iteration 1's optimizer.step().",
                   skipped, of, sim.fp16 ? "fp16 " : "", Size(sim.optimizer_state_bytes),
                   CategoryName(Category::kOptimizerStates))});
  } else {
    out.push_back(
        {true, fmt::format("likely cause: the log says {}{} iterations were skipped (Megatron "
                           "training_log, 'number of skipped iterations'): until the first step "
                           "that ran, Adam's state ({} in the simulation) did not exist.",
                           skipped, of, Size(sim.optimizer_state_bytes))});
  }
}

// The parameter count the log prints for the simulated pipeline stage's rank.
void ParameterCountFindings(const timeline::LogStatements& log, const SimulatedSide& sim,
                            std::vector<Finding>& out) {
  if (sim.parameters_on_rank <= 0) return;
  for (const timeline::LogStatements::RankParameters& p : log.parameters) {
    if (p.tensor_rank != 0 || p.pipeline_rank != sim.pipeline_rank) continue;
    const double pct = Pct(static_cast<double>(p.count), static_cast<double>(sim.parameters_on_rank));
    if (std::abs(pct) > 1.0) {
      out.push_back({true, fmt::format(
                               "likely cause: the log's rank (tensor 0, pipeline {}) holds {} "
                               "parameters, the simulated config {} ({:+.1f}%): the config does "
                               "not describe that run (layers, hidden or FFN size, vocabulary "
                               "padding, tensor or pipeline split).",
                               p.pipeline_rank, p.count, sim.parameters_on_rank, pct)});
    } else if (p.count != sim.parameters_on_rank) {
      // A count Megatron prints is exact: any difference is a layer memsim builds otherwise,
      // too small to explain a memory gap.
      out.push_back({false, fmt::format("the log's rank (tensor 0, pipeline {}) holds {} "
                                        "parameters, the simulated config {} ({:+d}, {:+.2f}%): "
                                        "not the same model, though too close to explain a gap.",
                                        p.pipeline_rank, p.count, sim.parameters_on_rank,
                                        p.count - sim.parameters_on_rank, pct)});
    } else {
      out.push_back({false, fmt::format("the log's parameter count of rank (tensor 0, pipeline "
                                        "{}) agrees with the config: {} (simulated {}).",
                                        p.pipeline_rank, p.count, sim.parameters_on_rank)});
    }
  }
}

// The log's theoretical weight and optimizer memory against the same closed form.
void ClosedFormFindings(const timeline::LogStatements& log, const SimulatedSide& sim,
                        std::vector<Finding>& out) {
  if (!log.theoretical_weight_and_optimizer_bytes) return;
  if (sim.closed_form_weight_and_optimizer_bytes <= 0) return;
  const Bytes printed = *log.theoretical_weight_and_optimizer_bytes;
  const double pct = Pct(static_cast<double>(printed),
                         static_cast<double>(sim.closed_form_weight_and_optimizer_bytes));
  const std::string figures =
      fmt::format("the log's theoretical weight and optimizer memory, {}, against {} from the "
                  "same closed form for this config ({:+.1f}%)",
                  Size(printed), Size(sim.closed_form_weight_and_optimizer_bytes), pct);
  if (std::abs(pct) > 2.0) {
    out.push_back({true, "likely cause: " + figures +
                             ": the run's arguments differ from the config (releases before "
                             "NVIDIA/Megatron-LM#4687 also left expert parallelism out of this "
                             "figure; for the dense models memsim simulates both agree)."});
  } else {
    out.push_back({false, figures + ": the config matches the run's arguments."});
  }
}

// The moments (each iteration's allocated peak and end) where the curves part, by category.
void MomentFindingsOf(const Report& report, const SimulatedSide& sim, std::vector<Finding>& out) {
  MomentFindings moments(&out);
  for (size_t i = 0; i < report.iterations.size(); ++i) {
    const IterationResult& it = report.iterations[i];
    const SimulatedSide::Iteration* s = SimIteration(sim, it.simulated_iteration);
    if (!s) continue;
    // A later iteration whose moment agrees while the simulation holds the category there.
    auto later = [&](bool peak) {
      return [&report, &sim, i, peak](Category c, Bytes gap) -> const IterationResult* {
        for (size_t j = i + 1; j < report.iterations.size(); ++j) {
          const IterationResult& next = report.iterations[j];
          const SimulatedSide::Iteration* ns = SimIteration(sim, next.simulated_iteration);
          const Bytes m = peak ? next.measured.peak_allocated_bytes : next.measured.end_allocated_bytes;
          const Bytes v = peak ? next.simulated.peak_allocated_bytes : next.simulated.end_allocated_bytes;
          if (!ns || m < 0 || v <= 0) continue;
          const Bytes held = (peak ? ns->at_peak : ns->at_end)[static_cast<size_t>(c)];
          if (std::abs(static_cast<double>(m - v)) < 0.02 * static_cast<double>(v) &&
              static_cast<double>(held) >= 0.85 * std::abs(static_cast<double>(gap))) {
            return &next;
          }
        }
        return nullptr;
      };
    };
    if (it.measured.peak_allocated_bytes >= 0) {
      moments.Add(it, MomentFinding("peak", "allocated", it.measured.peak_allocated_bytes,
                                    it.simulated.peak_allocated_bytes, s->at_peak, later(true)));
    }
    if (it.measured.end_allocated_bytes >= 0) {
      moments.Add(it, MomentFinding("end", "allocated", it.measured.end_allocated_bytes,
                                    it.simulated.end_allocated_bytes, s->at_end, later(false)));
    }
  }
}

}  // namespace

std::vector<Finding> Diagnose(const Report& report, const timeline::LogStatements& log,
                              const SimulatedSide& sim) {
  std::vector<Finding> out;
  // What the log says about its own run first: those are the likely causes.
  SkippedIterationFindings(report, log, sim, out);
  ParameterCountFindings(log, sim, out);
  ClosedFormFindings(log, sim, out);
  MomentFindingsOf(report, sim, out);
  return out;
}

std::string FormatDiagnosis(const std::vector<Finding>& findings, int width) {
  if (findings.empty()) return "";
  std::string out = "diagnosis:\n";
  for (const Finding& f : findings) {
    std::string line = " -";
    size_t pos = 0;
    const std::string& t = f.text;
    while (pos < t.size()) {
      size_t end = t.find(' ', pos);
      if (end == std::string::npos) end = t.size();
      const std::string_view word(t.data() + pos, end - pos);
      if (line.size() > 3 && static_cast<int>(line.size() + 1 + word.size()) > width) {
        out += line + "\n";
        line = "   ";
        line += word;
      } else {
        line += ' ';
        line += word;
      }
      pos = end + 1;
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace memsim::compare
