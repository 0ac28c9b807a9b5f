// memsim check CONFIG... (docs/interfaces.md, 'Command line'; issue 6).
#include "report/check.h"

#include <fmt/core.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "config/load.h"
#include "core/error.h"
#include "core/read_file.h"
#include "engine/stages.h"
#include "plan/plan.h"
#include "report/format.h"
#include "report/run_report.h"

namespace memsim::cli {
namespace {

namespace fs = std::filesystem;

struct CheckArgs {
  std::vector<std::string> configs;
  ConfigArgs load;
  MegatronArgs megatron;
  std::string capacity;
  bool capacity_given = false;
  std::string margin = "5";
  std::string baseline;
  std::string tolerance = "1";
  CLI::Option* tolerance_option = nullptr;  // count() > 0 when --tolerance was given
  bool update_baseline = false;
  std::string junit_path;
  std::string json_path;
  int require_plans = 0;  // --require-plans N; 0 = no plan gate
};

// A baseline is a `run --json` report: kilobytes to a few MiB. memsim's bound, 64 MiB (an
// estimate far above any report), stops a read of an endless file such as /dev/zero.
constexpr std::int64_t kMaxBaselineBytes = std::int64_t{1} << 26;

std::string ReadBaselineFile(const std::string& path) {
  std::optional<std::string> text =
      ReadBoundedFile(path, path, kMaxBaselineBytes, "a baseline report");
  if (!text) throw InputError(fmt::format("{}: cannot read the baseline file", path));
  return *std::move(text);
}

// The baseline file of `config`: --baseline FILE itself, or DIR/<config stem>.json.
std::string BaselinePath(const std::string& baseline, const std::string& config) {
  if (baseline.empty()) return "";
  if (fs::is_directory(baseline) || baseline.back() == '/') {
    return (fs::path(baseline) / (fs::path(config).stem().string() + ".json")).string();
  }
  return baseline;
}

// --update-baseline writes FILE, or DIR/<config stem>.json: never over one of the configs (a
// config kept in the baseline directory has that very name; it used to be replaced by a report).
void CheckBaselineTargets(const std::string& baseline, const std::vector<std::string>& configs) {
  for (const std::string& config : configs) {
    const std::string path = BaselinePath(baseline, config);
    for (const std::string& input : configs) {
      std::error_code ec;
      if (fs::equivalent(path, input, ec)) {
        throw InputError(fmt::format("--baseline {}: {} is the config {}; --update-baseline would "
                                     "replace it with a report (keep baselines in a directory of "
                                     "their own)",
                                     baseline, path, input));
      }
    }
  }
}

// The configs checked: each path, or one launch (--megatron-args FILE, or the words after `--`,
// which CLI11 leaves in `configs`), named by its file or "--megatron-args".
std::vector<std::string> CheckedNames(const CheckArgs& a) {
  if (a.megatron.given()) return {a.megatron.file.empty() ? "--megatron-args" : a.megatron.file};
  if (a.configs.empty()) throw InputError("expected one or more training configs (or --megatron-args)");
  return a.configs;
}

// The Setup of `name` (CheckedNames) with --model, --device, --set and --capacity.
config::Setup LoadChecked(const CheckArgs& a, const std::string& name,
                          const std::optional<Bytes>& capacity) {
  config::LoadOptions load = ToLoadOptions(a.load);
  load.use_embedded_default = false;
  load.capacity_bytes = capacity;
  if (a.megatron.given()) {
    return LoadMegatronLaunch(a.megatron, a.configs, load);
  }
  return config::LoadSetup(name, load);
}

// --baseline, --update-baseline and --tolerance together: a file for one config or a directory,
// something to write to or compare with. Throws InputError naming the option.
void CheckBaselineOptions(const CheckArgs& a, bool baseline_is_dir, std::size_t num_configs) {
  if (!a.baseline.empty() && !baseline_is_dir && num_configs > 1) {
    throw InputError(
        fmt::format("--baseline {}: with several configs, name a directory of "
                    "<config stem>.json reports ({}; a trailing / names one that "
                    "--update-baseline creates: --baseline {}/)",
                    a.baseline, fs::exists(a.baseline) ? "it is a file" : "it does not exist",
                    a.baseline));
  }
  if (a.update_baseline && a.baseline.empty()) {
    throw InputError("--update-baseline: needs --baseline FILE|DIR to write to");
  }
  if (a.tolerance_option != nullptr && a.tolerance_option->count() > 0 && a.baseline.empty()) {
    // The growth allowed over a baseline: without one it would be ignored without a word.
    throw InputError("--tolerance: applies to the comparison with --baseline FILE|DIR, which is "
                     "not given (--margin is the headroom asked of the usable memory)");
  }
  if (baseline_is_dir && !a.update_baseline && !fs::is_directory(a.baseline)) {
    throw InputError(fmt::format(
        "--baseline {}: no such directory (create it with --update-baseline)", a.baseline));
  }
}

// What checking the configs gathers, config after config.
struct CheckResults {
  std::vector<report::StageVerdict> verdicts;
  std::vector<report::CheckError> errors;
  std::vector<std::pair<std::string, std::string>> to_write;  // baseline path, report
  std::vector<std::string> notes;
};

// --require-plans N (docs/ci.md, 'A plan exists'): `memsim plan` over the default space of the
// config's own job (its world size, global batch and sequence length), with --margin as the
// headroom; the verdict says how many layouts fit. Every layout that passes the rules is
// simulated (no --max-candidates bound: CI is not interactive).
report::StageVerdict PlanGate(const std::string& config_path, const config::Setup& setup,
                              const report::CheckOptions& options, int required) {
  const config::TrainingConfig& t = setup.training;
  plan::Request request;
  request.devices = t.tensor_model_parallel_size * t.pipeline_model_parallel_size *
                    t.data_parallel_size * t.context_parallel_size;
  request.global_batch_size = t.global_batch_size;
  request.seq_length = t.seq_length;
  request.headroom_pct = options.margin_pct;
  request.max_candidates = plan::kMaxLayouts;
  request.space = plan::DefaultSpace(setup);
  const plan::PlanResult result = plan::Plan(setup, request, nullptr);
  std::string best, reason;
  Bytes best_peak = 0;
  Bytes usable = setup.device.usable_memory_bytes;
  if (result.fitting > 0) {
    const plan::Candidate& c = result.candidates.front();  // fitting plans rank first
    best = plan::LayoutLabel(c.layout);
    best_peak = c.peak_bytes;
    usable = c.usable_bytes;
  } else if (!result.candidates.empty()) {
    // The closest: the not-fitting plan of the lowest peak (they rank by peak), else a rule.
    const plan::Candidate& c = result.candidates.front();
    reason = plan::LayoutLabel(c.layout) + ": " + c.reason;
  }
  return report::PlanGateVerdict(config_path, result.fitting, result.simulated, required, best,
                                 best_peak, usable, reason);
}

// Simulates `config_path` and adds its stages' verdicts (against its baseline when there is one)
// to `out`, or its report to out.to_write with --update-baseline. Throws InputError.
void CheckConfig(const CheckArgs& a, const std::string& config_path,
                 const std::optional<Bytes>& capacity, const report::CheckOptions& options,
                 bool baseline_is_dir, CheckResults& out) {
  const config::Setup setup = LoadChecked(a, config_path, capacity);
  PrintWarnings(setup);
  engine::RunOptions run_options;
  run_options.usable_memory_bytes = capacity;
  run_options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(setup, run_options);
  const std::string baseline_path = BaselinePath(a.baseline, config_path);
  std::vector<report::BaselineStage> baseline;
  const bool have_baseline =
      !baseline_path.empty() && !a.update_baseline && fs::exists(baseline_path);
  if (!baseline_path.empty() && !a.update_baseline && !have_baseline && !baseline_is_dir) {
    throw InputError(fmt::format("--baseline {}: no such file", baseline_path));
  }
  if (have_baseline) {
    baseline = report::ParseBaseline(baseline_path, ReadBaselineFile(baseline_path));
  }
  if (baseline_is_dir && !a.update_baseline && !have_baseline) {
    out.notes.push_back(fmt::format("note: no baseline {} for {}: checked against capacity only",
                                    baseline_path, config_path));
  }
  auto v = report::CheckStages(config_path, run, setup, options,
                               have_baseline ? &baseline : nullptr);
  // The plan gate before any verdict is kept: a config it refuses is an error row alone.
  if (a.require_plans > 0) v.push_back(PlanGate(config_path, setup, options, a.require_plans));
  out.verdicts.insert(out.verdicts.end(), v.begin(), v.end());
  if (a.update_baseline)
    out.to_write.emplace_back(baseline_path, report::RunReportJson(run, setup));
}

int Check(const CheckArgs& a) {
  const std::vector<std::string> configs = CheckedNames(a);
  report::CheckOptions options;
  std::optional<Bytes> capacity;
  if (a.capacity_given) capacity = ParseSizeArg(a.capacity, "--capacity");
  options.usable_memory_bytes = capacity;
  options.margin_pct = ParsePercentArg(a.margin, "--margin");
  options.tolerance_pct = ParsePercentArg(a.tolerance, "--tolerance");
  const bool baseline_is_dir =
      !a.baseline.empty() && (fs::is_directory(a.baseline) || a.baseline.back() == '/');
  CheckBaselineOptions(a, baseline_is_dir, configs.size());
  report::CheckOutputs({a.junit_path, a.json_path}, configs);
  if (a.update_baseline) CheckBaselineTargets(a.baseline, configs);

  CheckResults r;
  for (const std::string& config_path : configs) {
    try {
      CheckConfig(a, config_path, capacity, options, baseline_is_dir, r);
    } catch (const InputError& e) {
      r.errors.push_back({config_path, e.what()});
    }
  }
  // The JSON and JUnit reports are written even when a config could not be checked: they hold
  // its error case beside every other verdict (exit 2 all the same). Baselines only when every
  // config could be checked. All files or none.
  std::vector<std::pair<std::string, std::string>> files;
  std::string baseline_dir;  // made only when the files are written
  if (r.errors.empty()) {
    files = r.to_write;
    if (!r.to_write.empty() && baseline_is_dir) baseline_dir = a.baseline;
  }
  if (!a.json_path.empty()) {
    files.emplace_back(a.json_path, report::CheckJson(r.verdicts, r.errors));
  }
  if (!a.junit_path.empty()) {
    files.emplace_back(a.junit_path, report::CheckJUnit(r.verdicts, r.errors));
  }
  report::WriteFilesIntoDirectory(files, baseline_dir);
  std::fputs(report::FormatCheckText(r.verdicts, r.errors).c_str(), stdout);
  for (const std::string& note : r.notes) std::printf("%s\n", note.c_str());
  for (const report::CheckError& e : r.errors)
    std::fprintf(stderr, "memsim check: %s\n", e.message.c_str());
  if (!r.to_write.empty() && r.errors.empty()) {
    std::printf("wrote %zu baseline report(s) to %s\n", r.to_write.size(), a.baseline.c_str());
  }
  if (!r.errors.empty()) return 2;
  for (const report::StageVerdict& v : r.verdicts) {
    if (v.verdict != "ok") return 1;
  }
  return 0;
}

}  // namespace

Action AddCheckCommand(CLI::App& sub) {
  auto a = std::make_shared<CheckArgs>();
  sub.add_option("configs", a->configs,
                 "training configs to check (with --megatron-args: the arguments after --)");
  AddConfigOptions(sub, a->load, /*with_iterations=*/false);
  AddMegatronOptions(sub, a->megatron);
  sub.add_option("--capacity", a->capacity,
                 "usable device memory, e.g. 60GiB (replaces the presets')");
  sub.add_option("--margin", a->margin, "required headroom, percent of usable memory (default 5)");
  sub.add_option("--baseline", a->baseline,
                 "a previous `run --json` report, or a directory of <stem>.json")
      ->check(NonEmpty);
  a->tolerance_option = sub.add_option("--tolerance", a->tolerance,
                 "allowed growth over the baseline, percent (default 1)");
  sub.add_flag("--update-baseline", a->update_baseline, "write the new reports as the baseline");
  sub.add_option("--junit", a->junit_path, "write JUnit XML to FILE")->check(NonEmpty);
  sub.add_option("--json", a->json_path, "write the verdicts as JSON to FILE")->check(NonEmpty);
  sub.add_option("--require-plans", a->require_plans,
                 "also run `memsim plan` on each config's job: fail unless N layouts fit")
      ->check(PositiveInt);
  CLI::Option* capacity = sub.get_option("--capacity");
  return [a, capacity] {
    a->capacity_given = capacity->count() > 0;
    return Check(*a);
  };
}

}  // namespace memsim::cli
