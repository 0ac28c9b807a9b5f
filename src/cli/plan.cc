// memsim plan [CONFIG] ... (docs/plan.md): which layouts fit, each fitting one simulated in full.
#include <fmt/core.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "plan/plan.h"
#include "report/format.h"

namespace memsim::cli {
namespace {

struct PlanArgs {
  std::string config;
  ConfigArgs load;
  MegatronArgs megatron;
  std::vector<std::string> trailing;
  int devices = kNotGiven;
  int per_node = kNotGiven;
  int nodes = kNotGiven;
  int global_batch_size = kNotGiven;
  int seq_length = kNotGiven;
  std::string headroom = "5";
  std::vector<std::string> fixes;
  std::vector<std::string> varies;
  int top = 10;
  int require = 1;
  int max_candidates = 200;
  std::string json_path;
  std::string write_dir;
};

// Each KEY once over --fix and --vary: a second would silently replace the first's values.
// REQUIRES: every text is KEY=VALUE (plan::ApplyFix / ApplyVary checked it).
void RejectKeyGivenTwice(const PlanArgs& a) {
  std::map<std::string, std::string> given;  // key -> "--fix KEY=VALUE"
  const auto check = [&given](const std::string& flag, const std::string& text) {
    const std::string key = text.substr(0, text.find('='));
    const auto [it, added] = given.emplace(key, flag + " " + text);
    if (!added) {
      throw InputError(fmt::format("{} {}: {} is already given by {}; give each key once",
                                   flag, text, key, it->second));
    }
  };
  for (const std::string& f : a.fixes) check("--fix", f);
  for (const std::string& v : a.varies) check("--vary", v);
}

// The device count: --devices, or --nodes × --per-node, else the base config's world size.
int Devices(const PlanArgs& a, const config::TrainingConfig& t) {
  if (a.nodes != kNotGiven) {
    if (a.per_node == kNotGiven) {
      throw InputError(
          fmt::format("--nodes {}: give --per-node too (the devices a node)", a.nodes));
    }
    const long long world = 1LL * a.nodes * a.per_node;
    if (world > (1 << 20)) {
      throw InputError(fmt::format("--nodes {} --per-node {}: {} devices, more than {}", a.nodes,
                                   a.per_node, world, 1 << 20));
    }
    if (a.devices != kNotGiven && a.devices != world) {
      throw InputError(fmt::format("--devices {} disagrees with --nodes {} × --per-node {} = {}",
                                   a.devices, a.nodes, a.per_node, world));
    }
    return static_cast<int>(world);
  }
  if (a.devices != kNotGiven) return a.devices;
  return t.tensor_model_parallel_size * t.pipeline_model_parallel_size * t.data_parallel_size *
         t.context_parallel_size;
}

// The request: the flags given, else the base config's world size, batch and sequence.
plan::Request ToRequest(const PlanArgs& a, const config::Setup& base) {
  const config::TrainingConfig& t = base.training;
  plan::Request r;
  r.devices = Devices(a, t);
  r.per_node = a.per_node != kNotGiven ? a.per_node : 0;
  r.global_batch_size = a.global_batch_size != kNotGiven ? a.global_batch_size : t.global_batch_size;
  r.seq_length = a.seq_length != kNotGiven ? a.seq_length : t.seq_length;
  r.headroom_pct = ParsePercentArg(a.headroom, "--headroom");
  r.max_candidates = a.max_candidates;
  r.space = plan::DefaultSpace(base);
  for (const std::string& f : a.fixes) plan::ApplyFix(f, &r.space);
  for (const std::string& v : a.varies) plan::ApplyVary(v, &r.space);
  RejectKeyGivenTwice(a);
  return r;
}

// --write-config DIR: an existing directory, or one that can be made (made only when writing).
void CheckWriteDir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
    throw InputError(fmt::format("--write-config {}: not a directory", dir));
  }
}

int Plan(const PlanArgs& a) {
  report::CheckOutputs({a.json_path}, {a.config, a.load.model, a.load.device, a.megatron.file});
  CheckWriteDir(a.write_dir);
  const config::Setup base =
      LoadConfigOrLaunch(a.config, a.trailing, a.megatron, ToLoadOptions(a.load));
  PrintWarnings(base);
  const plan::Request request = ToRequest(a, base);
  ProgressLine progress;
  const plan::PlanResult result = plan::Plan(base, request, [&progress](int done, int all) {
    progress.Update(fmt::format("simulated {} of {} layouts", done, all),
                    static_cast<double>(done) / all);
  });
  progress.Done();
  std::vector<std::pair<std::string, std::string>> files;
  if (!a.json_path.empty()) files.emplace_back(a.json_path, plan::PlanJson(result, a.top));
  if (!a.write_dir.empty()) {
    for (auto& [name, text] : plan::PlanConfigFiles(result, a.top)) {
      files.emplace_back((std::filesystem::path(a.write_dir) / name).string(), std::move(text));
    }
  }
  report::WriteFilesIntoDirectory(files, a.write_dir);
  std::fputs(plan::FormatPlanTable(result, a.top).c_str(), stdout);
  // The gate (docs/plan.md, 'In CI'): exit 1 when fewer than --require plans fit, as `check`
  // exits 1 when a config does not fit.
  if (result.fitting < a.require) {
    std::fprintf(stderr, "memsim plan: %d layouts fit, fewer than --require %d\n", result.fitting,
                 a.require);
    return 1;
  }
  return 0;
}

}  // namespace

Action AddPlanCommand(CLI::App& sub) {
  auto a = std::make_shared<PlanArgs>();
  sub.add_option("config", a->config,
                 "training config (JSON) whose layout is varied; the embedded default if omitted");
  AddConfigOptions(sub, a->load, /*with_iterations=*/true);
  sub.add_option("--devices", a->devices, "devices in all (default: the config's world size)")
      ->check(PositiveInt);
  sub.add_option("--per-node", a->per_node, "devices a node: TP stays within one node")
      ->check(PositiveInt);
  sub.add_option("--nodes", a->nodes, "nodes, with --per-node: --devices is nodes × per-node")
      ->check(PositiveInt);
  sub.add_option("--global-batch-size", a->global_batch_size,
                 "samples a step (default: the config's)")->check(PositiveInt);
  sub.add_option("--seq-length", a->seq_length, "tokens a sample (default: the config's)")
      ->check(PositiveInt);
  sub.add_option("--headroom", a->headroom,
                 "memory kept free: a plan fits when its peak is within usable × (1 - H%) "
                 "(default 5%)");
  sub.add_option("--fix", a->fixes, "KEY=VALUE: one value for KEY (tp, pp, cp, ep, mbs, "
                 "recompute, dist_opt); repeat for more")
      ->allow_extra_args(false)
      ->check(KeyValue);
  sub.add_option("--vary", a->varies, "KEY=V1,V2,...: the values tried for KEY; repeat for more")
      ->allow_extra_args(false)
      ->check(KeyValue);
  sub.add_option("--top", a->top, "fitting plans shown, written and put in --json (default 10)")
      ->check(PositiveInt);
  sub.add_option("--require", a->require,
                 "exit 1 when fewer than N layouts fit (default 1: a plan exists)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--max-candidates", a->max_candidates,
                 "most layouts simulated; more is an error (default 200)")->check(PositiveInt);
  sub.add_option("--json", a->json_path, "write the plans as JSON to FILE")->check(NonEmpty);
  sub.add_option("--write-config", a->write_dir,
                 "write each shown plan's training config into DIR (memsim run gives its peak)")
      ->check(NonEmpty);
  sub.add_option("args", a->trailing, "with --megatron-args: the training arguments after --");
  AddMegatronOptions(sub, a->megatron);
  return [a] { return Plan(*a); };
}

}  // namespace memsim::cli
