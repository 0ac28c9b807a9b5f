#include "validation/validation.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "config/load.h"
#include "core/error.h"
#include "engine/stages.h"
#include "workload/build.h"
#include "workload/model.h"

namespace memsim::validation {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

double Pct(Bytes value, Bytes reference) {
  if (reference == 0) return 0;
  return 100.0 * (static_cast<double>(value) - static_cast<double>(reference)) /
         static_cast<double>(reference);
}

double MiBOf(Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); }

struct Expected {
  std::map<Metric, Bytes> values;
  std::optional<int> pipeline_rank;
  std::optional<int> at_iteration;
  std::optional<Bytes> paper_parameters_and_optimizer;
  std::optional<Bytes> paper_activations;
  std::string source;
  std::vector<Metric> unreliable;
};

// "treat max_* as unreliable" (any case, any metric name) in the notes; max_* names both peaks.
void UnreliableFromNotes(const std::string& notes, std::vector<Metric>& out) {
  static const std::regex re(R"(treat (max_\*|[a-z_]+) as unreliable)", std::regex::icase);
  for (std::sregex_iterator it(notes.begin(), notes.end(), re), end; it != end; ++it) {
    const std::string name = (*it)[1].str();
    for (Metric m : kAllMetrics) {
      const std::string metric = MetricName(m);
      if (name == metric || (name == "max_*" && metric.rfind("max_", 0) == 0)) out.push_back(m);
    }
  }
}

Expected ReadExpected(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open", path.string()));
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
  Expected e;
  try {
    if (j.contains("values") && j["values"].is_object()) {
      for (Metric m : kAllMetrics) {
        const auto it = j["values"].find(MetricName(m));
        if (it != j["values"].end() && it->is_number()) e.values[m] = it->get<Bytes>();
      }
    }
    if (j.contains("pipeline_rank") && j["pipeline_rank"].is_number_integer()) {
      e.pipeline_rank = j["pipeline_rank"].get<int>();
    }
    if (j.contains("at_iteration") && j["at_iteration"].is_number_integer()) {
      e.at_iteration = j["at_iteration"].get<int>();
    }
    if (j.contains("reference_values") && j["reference_values"].is_object()) {
      const Json& r = j["reference_values"];
      if (r.contains("parameters_and_optimizer")) {
        e.paper_parameters_and_optimizer = r["parameters_and_optimizer"].get<Bytes>();
      }
      if (r.contains("activations")) e.paper_activations = r["activations"].get<Bytes>();
    }
    if (j.contains("notes") && j["notes"].is_string()) {
      UnreliableFromNotes(j["notes"].get<std::string>(), e.unreliable);
    }
    if (j.contains("unreliable_readings") && j["unreliable_readings"].is_array()) {
      for (const Json& name : j["unreliable_readings"]) {
        for (Metric m : kAllMetrics) {
          if (name.is_string() && name.get<std::string>() == MetricName(m)) e.unreliable.push_back(m);
        }
      }
    }
    if (j.contains("source") && j["source"].is_object()) {
      const Json& s = j["source"];
      for (const char* k : {"paper", "repo"}) {
        if (s.contains(k) && s[k].is_string()) {
          e.source = s[k].get<std::string>();
          break;
        }
      }
      if (s.contains("file") && s["file"].is_string() && !s.contains("paper")) {
        e.source += ": " + s["file"].get<std::string>();
      }
    }
  } catch (const Json::exception& ex) {
    throw InputError(fmt::format("{}: unexpected field type ({})", path.string(), ex.what()));
  }
  return e;
}

// The value memsim predicts for `m` on `stage` after `iteration` (init = span 0).
Bytes MemsimValue(const engine::StageResult& stage, Metric m, int iteration) {
  Bytes max_alloc = 0, max_res = 0, max_dev = 0;
  const timeline::SpanSummary* last = nullptr;
  for (const timeline::SpanSummary& s : stage.spans) {
    if (s.iteration > iteration) break;
    max_alloc = std::max(max_alloc, s.peak_allocated_bytes);
    max_res = std::max(max_res, s.peak_reserved_bytes);
    max_dev = std::max(max_dev, s.peak_device_bytes);
    last = &s;
  }
  if (last == nullptr) return 0;
  switch (m) {
    case Metric::kAllocated: return last->end_allocated_bytes;
    case Metric::kMaxAllocated: return max_alloc;
    case Metric::kReserved: return last->end_reserved_bytes;
    case Metric::kMaxReserved: return max_res;
    // A device monitor sampled during training: the device-level peak (context, communicator
    // buffers and reserved segments) up to that iteration.
    case Metric::kDevice: return max_dev;
  }
  return 0;
}

// Megatron's closed form for the same quantity: weight + optimizer for what stays allocated
// after a step; weight + optimizer + activations for peaks and readings (the closed form has
// no allocator or device-level terms).
Bytes ClosedFormValue(const workload::ClosedFormEstimate& e, Metric m) {
  return m == Metric::kAllocated ? e.weight_and_optimizer_bytes : e.total_bytes;
}

bool IsLayerMatrixWeight(const std::string& name) {
  static const std::regex re(R"(layer[0-9]+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.weight)");
  return std::regex_match(name, re);
}

// Korthikanti subtotals of stage 0 from its simulated Program (see PaperSubtotals).
void PaperFromProgram(const config::Setup& setup, PaperSubtotals& out) {
  const workload::ModelDims dims = workload::ComputeDims(setup);
  const workload::Program program = workload::Build(setup, 0);
  struct Live {
    Bytes bytes;
    bool layer_activation;
  };
  std::map<workload::TensorId, Live> live;
  Bytes layer_act = 0, static_bytes = 0;
  bool measured = false;
  for (const workload::Op& op : program.ops) {
    // The stored activations peak when the first backward starts: every in-flight micro-batch
    // (and chunk) has run its forward and nothing has been released or recomputed yet.
    if (!measured && op.phase == Phase::kBackward) {
      out.memsim_activations = layer_act;
      measured = true;
    }
    for (const workload::TensorAlloc& a : op.allocs) {
      // What the layers save: tensors labelled "layer..." plus each chunk's input (the embedding
      // output or the P2P receive buffer), which the chunk's first layer keeps as its LN1 input.
      const bool is_act = (a.category == Category::kActivations && a.label.rfind("layer", 0) == 0) ||
                          a.label == "embedding.out" || a.label == "p2p.recv_forward";
      live[a.id] = Live{a.size_bytes, is_act};
      if (is_act) layer_act += a.size_bytes;
      if (op.iteration > 1) continue;
      const std::string& name = a.label;
      if (a.category == Category::kParameters && IsLayerMatrixWeight(name)) {
        static_bytes += a.size_bytes;
        static_bytes += a.size_bytes / dims.param_bytes * dims.grad_bytes;  // its grad-buffer share
      } else if (a.category == Category::kMainParameters && name.rfind("main.", 0) == 0 &&
                 IsLayerMatrixWeight(name.substr(5))) {
        static_bytes += a.size_bytes;
      } else if (a.category == Category::kOptimizerStates) {
        for (const char* prefix : {"optim.exp_avg.", "optim.exp_avg_sq."}) {
          const std::string p = prefix;
          if (name.rfind(p, 0) == 0 && IsLayerMatrixWeight(name.substr(p.size()))) {
            static_bytes += a.size_bytes;
          }
        }
      }
    }
    for (workload::TensorId id : op.frees) {
      const auto it = live.find(id);
      if (it == live.end()) continue;
      if (it->second.layer_activation) layer_act -= it->second.bytes;
      live.erase(it);
    }
  }
  out.memsim_parameters_and_optimizer = static_bytes;
}

std::string FormatRow(const std::string& id, const MetricRow& r, bool primary, bool unreliable) {
  return fmt::format("| {} | {}{}{} | {}/{} | {:.1f} | {:.1f} | {:+.1f} | {:.1f} | {:+.1f} |\n", id,
                     MetricName(r.metric), primary ? " *" : "", unreliable ? " (unreliable)" : "", r.pipeline_rank, r.iteration,
                     MiBOf(r.measured), MiBOf(r.memsim), r.error_pct(), MiBOf(r.closed_form),
                     r.closed_form_error_pct());
}

// The loader's message with the case folder's path replaced by "<id>/" (machine independent).
std::string ShortPaths(std::string text, const fs::path& dir) {
  const std::string from = dir.string() + "/";
  const std::string to = dir.filename().string() + "/";
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

const char* MetricName(Metric m) {
  switch (m) {
    case Metric::kAllocated: return "allocated";
    case Metric::kMaxAllocated: return "max_allocated";
    case Metric::kReserved: return "reserved";
    case Metric::kMaxReserved: return "max_reserved";
    case Metric::kDevice: return "device";
  }
  return "?";
}

double MetricRow::error_pct() const { return Pct(memsim, measured); }
double MetricRow::closed_form_error_pct() const { return Pct(closed_form, measured); }

const MetricRow* CaseResult::PrimaryRow() const {
  if (!primary) return nullptr;
  for (const MetricRow& r : rows) {
    if (r.metric == *primary) return &r;
  }
  return nullptr;
}

bool CaseResult::IsUnreliable(Metric m) const {
  return std::find(unreliable.begin(), unreliable.end(), m) != unreliable.end();
}

namespace {
bool IsPeakMetric(Metric m) {
  return m == Metric::kMaxAllocated || m == Metric::kMaxReserved || m == Metric::kDevice;
}
}  // namespace

CaseResult RunCase(const std::string& case_dir) {
  const fs::path dir(case_dir);
  CaseResult result;
  result.id = dir.filename().string();
  const Expected expected = ReadExpected(dir / "expected.json");
  result.source = expected.source;
  result.unreliable = expected.unreliable;
  config::Setup setup;
  try {
    setup = config::LoadSetup((dir / "config.json").string(), {});
  } catch (const UnsupportedError& e) {
    result.status = "unsupported";
    result.reason = ShortPaths(e.what(), dir);
    return result;
  } catch (const InputError& e) {
    result.status = "error";
    result.reason = ShortPaths(e.what(), dir);
    return result;
  }
  result.status = "ok";
  engine::RunOptions options;
  options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(setup, options);
  const int iteration = std::min(expected.at_iteration.value_or(1), setup.training.train_iters);

  for (Metric m : kAllMetrics) {
    const auto it = expected.values.find(m);
    if (it == expected.values.end()) continue;
    MetricRow row;
    row.metric = m;
    row.measured = it->second;
    row.iteration = iteration;
    if (expected.pipeline_rank) {
      row.pipeline_rank = *expected.pipeline_rank;
    } else {  // the worst stage for this metric (lowest rank on ties)
      Bytes worst = -1;
      for (const engine::StageResult& s : run.stages) {
        const Bytes v = MemsimValue(s, m, iteration);
        if (v > worst) {
          worst = v;
          row.pipeline_rank = s.pipeline_rank;
        }
      }
    }
    row.memsim = MemsimValue(run.stages.at(row.pipeline_rank), m, iteration);
    row.closed_form = ClosedFormValue(workload::ComputeClosedFormEstimate(setup, row.pipeline_rank), m);
    result.rows.push_back(row);
  }
  for (Metric m : {Metric::kMaxAllocated, Metric::kDevice, Metric::kAllocated}) {
    if (expected.values.count(m) != 0) {
      result.primary = m;
      break;
    }
  }

  if (expected.paper_parameters_and_optimizer && expected.paper_activations) {
    PaperSubtotals p;
    p.paper_parameters_and_optimizer = *expected.paper_parameters_and_optimizer;
    p.paper_activations = *expected.paper_activations;
    PaperFromProgram(setup, p);
    const engine::StageResult& s0 = run.stages.at(0);
    p.memsim_peak_allocated = s0.peak_allocated_bytes;
    p.memsim_reserved_peak = s0.peak_reserved_bytes;
    const auto cat = [&](Category c) { return s0.by_category_at_peak[static_cast<int>(c)]; };
    p.memsim_activation_peak_bytes = cat(Category::kActivations);
    p.memsim_temporaries_at_peak = cat(Category::kTemporaries);
    const workload::StaticSizes st = workload::ComputeStaticSizes(setup, 0);
    p.memsim_static_bytes = st.total_bytes();
    if (run.first_oom) {
      p.oom = true;
      const engine::OomEvent& o = run.first_oom->oom;
      p.oom_text = fmt::format("OOM on stage {} (iteration {}, {}): {:.0f} MiB request at {:.0f} MiB allocated, {:.0f} MiB usable",
                               run.first_oom->pipeline_rank, o.iteration, PhaseName(o.phase),
                               MiBOf(o.request_bytes), MiBOf(o.allocated_bytes),
                               MiBOf(o.usable_memory_bytes));
    }
    result.paper = p;
  }
  return result;
}

std::vector<CaseResult> RunAllCases(const std::string& cases_dir) {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(cases_dir)) {
    if (e.is_directory() && fs::exists(e.path() / "expected.json")) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  std::vector<CaseResult> out;
  for (const fs::path& d : dirs) out.push_back(RunCase(d.string()));
  return out;
}

Summary Summarize(const std::vector<CaseResult>& results) {
  Summary s;
  std::vector<double> memsim, closed;
  for (const CaseResult& c : results) {
    if (c.status != "ok") continue;
    for (const MetricRow& r : c.rows) {
      if (IsPeakMetric(r.metric) && !c.IsUnreliable(r.metric)) s.peak_errors_pct.push_back(r.error_pct());
    }
    if (const MetricRow* r = c.PrimaryRow()) {
      memsim.push_back(std::fabs(r->error_pct()));
      closed.push_back(std::fabs(r->closed_form_error_pct()));
    }
    if (c.paper) {
      s.worst_paper_subtotal_error_pct = std::max(
          {s.worst_paper_subtotal_error_pct,
           std::fabs(Pct(c.paper->memsim_parameters_and_optimizer, c.paper->paper_parameters_and_optimizer)),
           std::fabs(Pct(c.paper->memsim_activations, c.paper->paper_activations))});
    }
  }
  s.supported_measured = static_cast<int>(memsim.size());
  s.median_abs_error_pct = Median(memsim);
  s.median_abs_closed_form_error_pct = Median(closed);
  std::sort(s.peak_errors_pct.begin(), s.peak_errors_pct.end());
  std::vector<double> peak_abs;
  for (double e : s.peak_errors_pct) {
    peak_abs.push_back(std::fabs(e));
    if (e < 0) ++s.peak_below;
  }
  s.median_abs_peak_error_pct = Median(peak_abs);
  return s;
}

std::string FormatReport(const std::vector<CaseResult>& results) {
  std::string out;
  out += "Measured cases (MiB = 2^20 bytes; * = primary metric; stage/iteration compared; closed "
         "form = Megatron theoretical weight+optimizer [+ activations])\n\n";
  out += "| case | metric | stage/iter | measured | memsim | error % | closed form | its error % |\n";
  out += "|---|---|---|---:|---:|---:|---:|---:|\n";
  for (const CaseResult& c : results) {
    if (c.status != "ok") continue;
    for (const MetricRow& r : c.rows) {
      out += FormatRow(c.id, r, c.primary && *c.primary == r.metric, c.IsUnreliable(r.metric));
    }
  }
  bool any_paper = false;
  for (const CaseResult& c : results) any_paper |= c.paper.has_value();
  if (any_paper) {
    out += "\nKorthikanti et al. 2022 Figure 1 (closed forms, not measurements): first stage's "
           "transformer-layer subtotals, MiB\n\n";
    out += "| case | par+opt paper | memsim | error % | activations paper | memsim | error % | "
           "full model: static | peak allocated | activations at peak | temporaries at peak | "
           "peak reserved | OOM |\n";
    out += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (const CaseResult& c : results) {
      if (!c.paper) continue;
      const PaperSubtotals& p = *c.paper;
      out += fmt::format(
          "| {} | {:.1f} | {:.1f} | {:+.2f} | {:.1f} | {:.1f} | {:+.2f} | {:.1f} | {:.1f} | {:.1f} | "
          "{:.1f} | {:.1f} | {} |\n",
          c.id, MiBOf(p.paper_parameters_and_optimizer), MiBOf(p.memsim_parameters_and_optimizer),
          Pct(p.memsim_parameters_and_optimizer, p.paper_parameters_and_optimizer),
          MiBOf(p.paper_activations), MiBOf(p.memsim_activations),
          Pct(p.memsim_activations, p.paper_activations), MiBOf(p.memsim_static_bytes),
          MiBOf(p.memsim_peak_allocated), MiBOf(p.memsim_activation_peak_bytes),
          MiBOf(p.memsim_temporaries_at_peak), MiBOf(p.memsim_reserved_peak),
          p.oom ? p.oom_text : "no");
    }
  }
  out += "\nNot run (memsim exits 2 for these configs):\n\n";
  for (const CaseResult& c : results) {
    if (c.status != "ok") out += fmt::format("- {}: {}\n", c.id, c.reason);
  }
  const Summary s = Summarize(results);
  out += fmt::format(
      "\nSummary: {} supported measured cases; median |error| of the primary metric: memsim "
      "{:.2f}%, closed form {:.2f}%; worst Korthikanti subtotal error {:.2f}%\n",
      s.supported_measured, s.median_abs_error_pct, s.median_abs_closed_form_error_pct,
      s.worst_paper_subtotal_error_pct);
  std::string signed_list;
  for (double e : s.peak_errors_pct) {
    signed_list += fmt::format("{}{:+.1f}", signed_list.empty() ? "" : ", ", e);
  }
  out += fmt::format(
      "Peak metric: {} peak readings (max_allocated, max_reserved, device; unreliable ones left "
      "out); median |error| {:.2f}% (primary metric {:.2f}%); {} below the measurement, {} at or "
      "above; signed errors %: {}\n",
      s.peak_errors_pct.size(), s.median_abs_peak_error_pct, s.median_abs_error_pct, s.peak_below,
      static_cast<int>(s.peak_errors_pct.size()) - s.peak_below, signed_list);
  return out;
}

}  // namespace memsim::validation
