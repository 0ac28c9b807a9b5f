#include "report/check.h"

#include <algorithm>
#include <map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <tinyxml2.h>

#include "core/error.h"
#include "report/format.h"

namespace memsim::report {
namespace {

using json = nlohmann::ordered_json;

// A byte count: an integer in [0, 2^62] (anything larger cannot come from a run report).
Bytes GetBytes(const json& j, const std::string& key, const std::string& path,
               const std::string& pointer) {
  const bool ok = j.contains(key) && j[key].is_number_integer() &&
                  (j[key].is_number_unsigned() ? j[key].get<std::uint64_t>() <= (std::uint64_t{1} << 62)
                                               : j[key].get<std::int64_t>() >= 0);
  if (!ok) {
    throw InputError(fmt::format("{}: {}/{}: expected a byte count (an integer from 0 to 2^62){}",
                                 path, pointer, key, j.contains(key) ? "" : ", missing"));
  }
  return j[key].get<Bytes>();
}

double GrowthPct(Bytes baseline, Bytes now) {
  if (baseline <= 0) return now > 0 ? 100.0 : 0.0;
  return 100.0 * static_cast<double>(now - baseline) / static_cast<double>(baseline);
}

}  // namespace

std::vector<BaselineStage> ParseBaseline(const std::string& path, const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(fmt::format("{}: byte {}: not valid JSON (expected a `memsim run --json` report)",
                                 path, e.byte));
  }
  if (!j.is_object() || !j.contains("schema_version") || j["schema_version"] != 1) {
    throw InputError(fmt::format("{}: /schema_version: expected 1 (a `memsim run --json` report)", path));
  }
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty()) {
    throw InputError(fmt::format("{}: /stages: expected a non-empty array of stages", path));
  }
  std::vector<BaselineStage> stages;
  for (size_t i = 0; i < j["stages"].size(); ++i) {
    const json& s = j["stages"][i];
    const std::string pointer = fmt::format("/stages/{}", i);
    if (!s.is_object()) throw InputError(fmt::format("{}: {}: expected an object", path, pointer));
    BaselineStage b;
    if (!s.contains("pipeline") || !s["pipeline"].is_number_integer() ||
        s["pipeline"].get<std::int64_t>() < 0 || s["pipeline"].get<std::int64_t>() > 100000) {
      throw InputError(fmt::format("{}: {}/pipeline: expected a pipeline rank (an integer from 0)",
                                   path, pointer));
    }
    b.pipeline = s["pipeline"].get<int>();
    b.peak_allocated_bytes = GetBytes(s, "peak_allocated_bytes", path, pointer);
    b.peak_reserved_bytes = GetBytes(s, "peak_reserved_bytes", path, pointer);
    b.peak_device_bytes = GetBytes(s, "peak_device_bytes", path, pointer);
    if (s.contains("by_category_at_peak")) {
      const json& c = s["by_category_at_peak"];
      if (!c.is_object()) {
        throw InputError(fmt::format("{}: {}/by_category_at_peak: expected an object", path, pointer));
      }
      for (int k = 0; k < kNumCategories; ++k) {
        const std::string name(CategoryName(static_cast<Category>(k)));
        if (c.contains(name)) {
          b.by_category_at_peak[static_cast<size_t>(k)] =
              GetBytes(c, name, path, pointer + "/by_category_at_peak");
        }
      }
    }
    stages.push_back(b);
  }
  return stages;
}

std::vector<StageVerdict> CheckStages(const std::string& config, const engine::RunResult& run,
                                      const config::Setup& setup, const CheckOptions& options,
                                      const std::vector<BaselineStage>* baseline) {
  const Bytes usable = options.usable_memory_bytes.value_or(setup.device.usable_memory_bytes);
  const Bytes margin_line =
      static_cast<Bytes>(static_cast<double>(usable) * (1.0 - options.margin_pct / 100.0));
  std::vector<StageVerdict> out;
  for (const engine::StageResult& stage : run.stages) {
    StageVerdict v;
    v.config = config;
    v.pipeline = stage.pipeline_rank;
    v.peak_bytes = stage.peak_device_bytes - setup.device.idle_baseline_bytes;
    v.usable_bytes = usable;
    v.headroom_bytes = usable - v.peak_bytes;
    v.verdict = "ok";
    v.message = fmt::format("peak {} of {} usable, headroom {}", HumanBytes(v.peak_bytes),
                            HumanBytes(usable), HumanBytes(v.headroom_bytes));
    if (stage.simulation.first_oom) {
      const engine::OomEvent& o = *stage.simulation.first_oom;
      v.verdict = "oom";
      v.message = fmt::format(
          "out of memory in iteration {} {} ({} request); needs {} of {} usable, short by {}",
          o.iteration, PhaseName(o.phase), HumanBytes(o.request_bytes), HumanBytes(v.peak_bytes),
          HumanBytes(usable), HumanBytes(-v.headroom_bytes));
    } else if (v.peak_bytes > usable) {
      v.verdict = "over";
      v.message = fmt::format("peak {} exceeds usable {} by {}", HumanBytes(v.peak_bytes),
                              HumanBytes(usable), HumanBytes(-v.headroom_bytes));
    } else if (v.peak_bytes > margin_line) {
      v.verdict = "margin";
      v.message = fmt::format("peak {} leaves {} headroom, less than the {}% margin ({})",
                              HumanBytes(v.peak_bytes), HumanBytes(v.headroom_bytes),
                              options.margin_pct, HumanBytes(usable - margin_line));
    }
    if (baseline) {
      const BaselineStage* base = nullptr;
      for (const BaselineStage& b : *baseline) {
        if (b.pipeline == stage.pipeline_rank) base = &b;
      }
      if (!base) {
        throw InputError(fmt::format(
            "baseline for {}: /stages: no stage {} (the config has {} pipeline stages; "
            "regenerate the baseline with --update-baseline)",
            config, stage.pipeline_rank, run.stages.size()));
      }
      {
        for (int k = 0; k < kNumCategories; ++k) {
          const Bytes d = stage.by_category_at_peak[static_cast<size_t>(k)] -
                          base->by_category_at_peak[static_cast<size_t>(k)];
          if (d > 0) v.grew.emplace_back(std::string(CategoryName(static_cast<Category>(k))), d);
        }
        std::stable_sort(v.grew.begin(), v.grew.end(),
                         [](const auto& a, const auto& b) { return a.second > b.second; });
        const std::pair<const char*, std::pair<Bytes, Bytes>> metrics[] = {
            {"allocated", {base->peak_allocated_bytes, stage.peak_allocated_bytes}},
            {"reserved", {base->peak_reserved_bytes, stage.peak_reserved_bytes}},
            {"device", {base->peak_device_bytes, stage.peak_device_bytes}}};
        std::string grown;
        for (const auto& [name, values] : metrics) {
          const double pct = GrowthPct(values.first, values.second);
          if (pct > options.tolerance_pct) {
            if (!grown.empty()) grown += ", ";
            grown += fmt::format("peak {} {:+.2f}% ({} -> {})", name, pct,
                                 HumanBytes(values.first), HumanBytes(values.second));
          }
        }
        if (!grown.empty() && v.verdict == "ok") {
          v.verdict = "regression";
          std::string by;
          for (const auto& [cat, bytes] : v.grew) {
            by += fmt::format("{}{} +{}", by.empty() ? "" : ", ", cat, HumanBytes(bytes));
          }
          v.message = fmt::format("grew beyond {}% over the baseline: {}{}", options.tolerance_pct,
                                  grown, by.empty() ? "" : "; at the peak: " + by);
        }
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

StageVerdict PlanGateVerdict(const std::string& config, int fitting, int simulated, int required,
                             const std::string& best, Bytes best_peak_bytes, Bytes usable_bytes,
                             const std::string& reason) {
  StageVerdict v;
  v.config = config;
  v.pipeline = -1;
  v.plans = true;
  v.verdict = fitting >= required ? "ok" : "no-plan";
  v.peak_bytes = fitting > 0 ? best_peak_bytes : 0;
  v.usable_bytes = usable_bytes;
  v.headroom_bytes = fitting > 0 ? usable_bytes - best_peak_bytes : 0;
  v.message = fmt::format("{} of {} simulated layouts fit, {} required", fitting, simulated,
                          required);
  if (fitting > 0) {
    v.message += fmt::format("; best: {}, peak {}", best, HumanBytes(best_peak_bytes));
  }
  if (v.verdict != "ok" && !reason.empty()) v.message += "; closest: " + reason;
  return v;
}

std::string FormatCheckText(const std::vector<StageVerdict>& verdicts,
                            const std::vector<CheckError>& errors) {
  std::string out;
  for (const StageVerdict& v : verdicts) {
    out += fmt::format("{:<10} {} {}: {}\n", v.verdict == "ok" ? "ok" : "FAIL " + v.verdict,
                       v.config, v.plans ? "plans" : fmt::format("stage {}", v.pipeline),
                       v.message);
  }
  for (const CheckError& e : errors) {
    // The loader's messages already start with the file they are about.
    const bool named = e.message.rfind(e.config + ":", 0) == 0;
    out += named ? fmt::format("{:<10} {}\n", "ERROR", e.message)
                 : fmt::format("{:<10} {}: {}\n", "ERROR", e.config, e.message);
  }
  return out;
}

std::string CheckJson(const std::vector<StageVerdict>& verdicts,
                      const std::vector<CheckError>& errors) {
  json j;
  j["schema_version"] = 1;
  json results = json::array();
  for (const StageVerdict& v : verdicts) {
    json grew = json::object();
    for (const auto& [cat, bytes] : v.grew) grew[cat] = bytes;
    results.push_back({{"config", v.config},
                       {"pipeline", v.plans ? json(nullptr) : json(v.pipeline)},
                       {"gate", v.plans ? "plans" : "stage"},
                       {"peak_bytes", v.peak_bytes},
                       {"usable_bytes", v.usable_bytes},
                       {"headroom_bytes", v.headroom_bytes},
                       {"verdict", v.verdict},
                       {"message", v.message},
                       {"grew", grew}});
  }
  // A config that could not be checked is a result too (verdict "error"), so a CI report keeps
  // every other config's verdict and shows this one.
  for (const CheckError& e : errors) {
    results.push_back({{"config", e.config},
                       {"pipeline", nullptr},
                       {"gate", "config"},
                       {"peak_bytes", nullptr},
                       {"usable_bytes", nullptr},
                       {"headroom_bytes", nullptr},
                       {"verdict", "error"},
                       {"message", e.message},
                       {"grew", json::object()}});
  }
  j["results"] = results;
  json errs = json::array();
  for (const CheckError& e : errors) errs.push_back({{"config", e.config}, {"message", e.message}});
  j["errors"] = errs;
  return j.dump(2) + "\n";
}

std::string CheckJUnit(const std::vector<StageVerdict>& verdicts,
                       const std::vector<CheckError>& errors) {
  // Group by config, keeping first-appearance order.
  std::vector<std::string> configs;
  for (const StageVerdict& v : verdicts) {
    if (std::find(configs.begin(), configs.end(), v.config) == configs.end()) configs.push_back(v.config);
  }
  int failures = 0;
  for (const StageVerdict& v : verdicts) failures += v.verdict != "ok";
  tinyxml2::XMLPrinter printer;
  printer.PushHeader(false, true);
  printer.OpenElement("testsuites");
  printer.PushAttribute("name", "memsim check");
  printer.PushAttribute("tests", static_cast<int>(verdicts.size() + errors.size()));
  printer.PushAttribute("failures", failures);
  printer.PushAttribute("errors", static_cast<int>(errors.size()));
  for (const std::string& config : configs) {
    int tests = 0, fails = 0;
    for (const StageVerdict& v : verdicts) {
      if (v.config != config) continue;
      ++tests;
      fails += v.verdict != "ok";
    }
    printer.OpenElement("testsuite");
    printer.PushAttribute("name", config.c_str());
    printer.PushAttribute("tests", tests);
    printer.PushAttribute("failures", fails);
    printer.PushAttribute("errors", 0);
    for (const StageVerdict& v : verdicts) {
      if (v.config != config) continue;
      printer.OpenElement("testcase");
      printer.PushAttribute("classname", ("memsim.check." + config).c_str());
      const std::string name =
          v.plans ? std::string("plans") : fmt::format("pipeline stage {}", v.pipeline);
      printer.PushAttribute("name", name.c_str());
      printer.PushAttribute("time", "0");
      if (v.verdict != "ok") {
        printer.OpenElement("failure");
        printer.PushAttribute("type", v.verdict.c_str());
        printer.PushAttribute("message", v.message.c_str());
        printer.PushText(v.message.c_str());
        printer.CloseElement();
      } else {
        printer.OpenElement("system-out");
        printer.PushText(v.message.c_str());
        printer.CloseElement();
      }
      printer.CloseElement();
    }
    printer.CloseElement();
  }
  for (const CheckError& e : errors) {
    printer.OpenElement("testsuite");
    printer.PushAttribute("name", e.config.c_str());
    printer.PushAttribute("tests", 1);
    printer.PushAttribute("failures", 0);
    printer.PushAttribute("errors", 1);
    printer.OpenElement("testcase");
    printer.PushAttribute("classname", ("memsim.check." + e.config).c_str());
    printer.PushAttribute("name", "config");
    printer.OpenElement("error");
    printer.PushAttribute("type", "input");
    printer.PushAttribute("message", e.message.c_str());
    printer.PushText(e.message.c_str());
    printer.CloseElement();
    printer.CloseElement();
    printer.CloseElement();
  }
  printer.CloseElement();
  return printer.CStr();
}

}  // namespace memsim::report
