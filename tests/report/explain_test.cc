// `memsim explain` (issue 15): every byte figure in the narrative is one this test computes
// itself, from the Timeline samples, the SpanSummaries of RunAllStages and the block sizes an
// observer of its own records -- never through report::ExplainFacts or the formatter. Then the
// sentences that answer the seed's questions are checked verbatim.
#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include <catch2/catch.hpp>
#include <fmt/core.h>

#include "cli/cli_test_util.h"
#include "config/load.h"
#include "device/communicators.h"
#include "engine/stages.h"
#include "report/explain.h"
#include "report/format.h"
#include "workload/build.h"

namespace memsim {
namespace {

using report::HumanBytes;
using report::SignedHuman;

Bytes Cat(const CategoryBytes& c, Category k) { return c[static_cast<size_t>(k)]; }

// Block bytes of the activations the first forward micro-batch of each iteration saves (those
// its own forward does not free again), by the layer that allocated them.
class ActivationBlocks final : public engine::Observer {
 public:
  void OnOpBoundary(const engine::OpBoundary& b) override {
    if (b.at_start) return;
    for (workload::TensorId id : b.op->frees) {
      auto it = pending.find(id);
      if (it == pending.end()) continue;
      const auto [iteration, mb, layer, bytes] = it->second;
      if (b.op->phase == Phase::kForward && b.op->micro_batch == mb) by_layer[iteration][layer] -= bytes;
      pending.erase(it);
    }
  }
  void OnTensorAllocated(const workload::Op& op, const workload::TensorAlloc& t, Bytes block) override {
    if (t.category != Category::kActivations || op.phase != Phase::kForward || op.micro_batch < 0) return;
    auto [it, inserted] = first_mb.try_emplace(op.iteration, op.micro_batch);
    if (it->second != op.micro_batch) return;
    by_layer[op.iteration][op.layer] += block;
    pending[t.id] = {op.iteration, op.micro_batch, op.layer, block};
  }
  std::map<int, int> first_mb;
  std::map<int, std::map<int, Bytes>> by_layer;
  std::map<workload::TensorId, std::tuple<int, int, int, Bytes>> pending;
};

struct Expected {
  std::set<std::string> figures;  // every byte figure the narrative may print
  std::vector<std::string> phrases;
  void Add(Bytes b) {
    figures.insert(HumanBytes(b));
    figures.insert(SignedHuman(b));
  }
};

// The figures of one stage, computed from the simulation's own records.
Expected ExpectedFigures(const config::Setup& setup, const engine::RunResult& run) {
  const engine::StageResult& stage = run.Reported();
  Expected e;
  e.Add(setup.device.idle_baseline_bytes);
  // Outside the allocator (device/communicators.h): the context, each group's communicator and the
  // parameters its size is derived from, in HumanBytes and in the mechanism lines' whole MiB.
  const auto add_mib = [&e](Bytes b) {
    e.Add(b);
    e.figures.insert(fmt::format("{:.0f} MiB", static_cast<double>(b) / static_cast<double>(kMiB)));
  };
  add_mib(device::ContextBytes(setup));
  const config::JobEnvironment& env = setup.training.env;
  add_mib(device::NcclSendConnectionBytes(setup.device.nccl, env.nccl_buffsize));
  add_mib(device::NcclRecvConnectionBytes(setup.device.nccl, env.nccl_buffsize));
  add_mib(device::NcclProxySharedBytes(setup.device.nccl));
  add_mib(env.nccl_buffsize);
  add_mib(env.hccl_buffsize);
  add_mib(device::UserbufferBytes(setup));
  for (const workload::Op& op : workload::Build(setup, stage.pipeline_rank).ops) {
    if (!op.collective_group.empty()) {
      add_mib(device::CommunicatorBytes(setup.device, env, op.collective_group, op.collective_ranks));
    }
  }
  e.Add(stage.simulation.allocator_stats.inactive_split_bytes.current);
  const timeline::SampleVector& samples = run.timeline.samples;
  for (const timeline::SpanSummary& s : stage.spans) {
    e.Add(s.start_allocated_bytes);
    e.Add(s.end_allocated_bytes);
    e.Add(s.peak_allocated_bytes);
    e.Add(s.peak_device_bytes);
    e.Add(s.end_reserved_bytes);
    e.Add(s.peak_allocated_bytes - s.end_allocated_bytes);
    e.Add(Cat(s.by_category_at_peak, Category::kActivations));
    for (int c = 0; c < kNumCategories; ++c) {
      e.Add(s.end_by_category[static_cast<size_t>(c)] - s.start_by_category[static_cast<size_t>(c)]);
    }
    for (const timeline::PhasePeak& p : s.phase_peaks) e.Add(Cat(p.by_category, Category::kActivations));
    // Reserved: every change between consecutive samples of the span, their sums, and reserved
    // at the allocated peak.
    Bytes prev = 0, grown = 0, released = 0;
    bool at_peak_seen = false;
    for (const timeline::Sample& x : samples) {
      const Bytes d = x.reserved_bytes - prev;
      prev = x.reserved_bytes;
      if (x.iteration != s.iteration) continue;
      if (d > 0) grown += d, e.Add(d);
      if (d < 0) released -= d;
      if (!at_peak_seen && x.time_us == s.peak_time_us && x.allocated_bytes == s.peak_allocated_bytes) {
        at_peak_seen = true;
        e.Add(x.reserved_bytes);
        e.Add(x.reserved_bytes - s.peak_allocated_bytes);
      }
    }
    e.Add(grown);
    e.Add(released);
  }
  return e;
}

// Adds the per-layer activation figures from an independent replay of the stage.
void AddActivationFigures(const config::Setup& setup, int rank, Expected* e) {
  const workload::Program program = workload::Build(setup, rank);
  ActivationBlocks blocks;
  engine::Simulate(program, setup, {}, blocks);
  for (const auto& [iteration, layers] : blocks.by_layer) {
    Bytes total = 0;
    for (const auto& [layer, bytes] : layers) {
      e->Add(bytes);
      if (layer >= 0) total += bytes;
      else e->Add(bytes);
    }
    e->Add(total);
  }
}

// Every "<number> <unit>" of `text`.
std::vector<std::string> ByteFigures(const std::string& text) {
  static const std::regex figure(R"([+-]?\d+(\.\d+)? (GiB|MiB|KiB|B)\b)");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), figure); it != std::sregex_iterator(); ++it) {
    out.push_back(it->str());
  }
  return out;
}

struct Explained {
  config::Setup setup;
  engine::RunResult run;
  std::string text;
};

Explained ExplainConfig(const std::string& path, std::vector<std::string> sets = {}) {
  config::LoadOptions load;
  load.overrides = std::move(sets);
  Explained x{config::LoadSetup(path, load), {}, {}};
  engine::RunOptions options;
  options.keep_timeline = false;
  const int worst = engine::RunAllStages(x.setup, options).Reported().pipeline_rank;
  options.pipeline_rank = worst;
  options.keep_timeline = true;
  x.run = engine::RunAllStages(x.setup, options);
  x.text = report::FormatExplanation(x.setup, report::CollectExplainFacts(x.setup, worst, {}), 1000);
  return x;
}

void CheckEveryFigure(const Explained& x) {
  Expected e = ExpectedFigures(x.setup, x.run);
  AddActivationFigures(x.setup, x.run.Reported().pipeline_rank, &e);
  std::string unexplained;
  const std::vector<std::string> figures = ByteFigures(x.text);
  for (const std::string& f : figures) {
    if (!e.figures.count(f)) unexplained += "  " + f + "\n";
  }
  INFO(x.text);
  INFO("figures not computed by the test:\n" << unexplained);
  CHECK(figures.size() > 20);
  CHECK(unexplained.empty());
}

// The sentences of the seed's answer, from the SpanSummaries.
void CheckSeedAnswers(const Explained& x, int steady_from) {
  const engine::StageResult& stage = x.run.Reported();
  const timeline::SpanSummary& it1 = *stage.Span(1);
  const timeline::SpanSummary& it2 = *stage.Span(2);
  const Phase p = it2.peak_phase;
  const Bytes state = Cat(it1.end_by_category, Category::kOptimizerStates) -
                      Cat(it1.start_by_category, Category::kOptimizerStates);
  INFO(x.text);
  CHECK_THAT(x.text, Catch::Contains(fmt::format(
                         "{} optimizer_states, created inside iteration 1's optimizer.step()",
                         SignedHuman(state))));
  CHECK_THAT(x.text, Catch::Contains(fmt::format(
                         "Are activations stored twice? No. At the {} peak iteration 2 holds {} of "
                         "activations and iteration 1 held {}",
                         PhaseName(p), HumanBytes(Cat(it2.PeakOf(p).by_category, Category::kActivations)),
                         HumanBytes(Cat(it1.PeakOf(p).by_category, Category::kActivations)))));
  CHECK_THAT(x.text, Catch::Contains(fmt::format("Iteration 2 starts at {} instead of {}",
                                                 HumanBytes(it2.start_allocated_bytes),
                                                 HumanBytes(it1.start_allocated_bytes))));
  CHECK_THAT(x.text, Catch::Contains(fmt::format(
                         "From iteration {} on every request fits a cached block, so reserved stops "
                         "growing at {}.",
                         steady_from, HumanBytes(stage.spans.back().end_reserved_bytes))));
}

TEST_CASE("explain, default config: every figure is the simulation's, the seed's questions answered",
          "[report][explain]") {
  const Explained x = ExplainConfig("");
  CheckEveryFigure(x);
  CheckSeedAnswers(x, 3);
  const engine::StageResult& stage = x.run.Reported();
  // Reserved grows in iteration 2 and not after (the walkthrough's pattern).
  CHECK_THAT(x.text, Catch::Contains("iteration 3: "));
  CHECK(x.text.find("reserved: no new segment; every request was served from a cached block") !=
        std::string::npos);
  CHECK_THAT(x.text, Catch::Contains(fmt::format("reserved stops growing from iteration 3 on, at {}",
                                                 HumanBytes(stage.Span(4)->end_reserved_bytes))));
  CHECK_THAT(x.text, Catch::Contains(fmt::format("npu-smi adds the idle baseline {}",
                                                 HumanBytes(x.setup.device.idle_baseline_bytes))));
  // HCCL: 2 × HCCL_BUFFSIZE (200 MiB default) for every group alike. The world's communicator
  // is made at init (pretrain's start-time all-reduce), the others in iteration 1.
  CHECK_THAT(x.text, Catch::Contains(fmt::format("1 communicator of {}",
                                                 HumanBytes(2 * x.setup.training.env.hccl_buffsize))));
  CHECK_THAT(x.text, Catch::Contains("world (init)"));
  CHECK_THAT(x.text, Catch::Contains(fmt::format("{} communicators of {} each",
                                                 stage.simulation.num_communicators - 1,
                                                 HumanBytes(2 * x.setup.training.env.hccl_buffsize))));
}

TEST_CASE("explain, a PP4 shipped config (the stage run reports): every figure is the simulation's",
          "[report][explain][configs]") {
  const Explained x = ExplainConfig(std::string(MEMSIM_SOURCE_DIR) + "/configs/llama3-70b-h200-tp4-pp4.json");
  CheckEveryFigure(x);
  CHECK_THAT(x.text, Catch::Contains("Are activations stored twice? No."));
  CHECK_THAT(x.text, Catch::Contains("micro-batches in flight"));
}

TEST_CASE("explain, the shipped fp16 config: every figure is the simulation's", "[report][explain][configs]") {
  const Explained x =
      ExplainConfig(std::string(MEMSIM_SOURCE_DIR) + "/configs/gpt3-175b-a100-80g-tp8-pp16.json");
  CheckEveryFigure(x);
  CHECK_THAT(x.text, Catch::Contains("nvidia-smi adds"));
}

// Finding 2 of tryout 7: under full recompute a checkpointed layer's forward runs under no_grad
// and keeps only the checkpoint's input (Megatron-core transformer_block.py
// _checkpointed_forward; workload/recompute.h). Default config: TP 2 with sequence parallelism,
// so a hidden state is [s/t, b, h] in bf16 = 4096/2 · 1 · 4096 · 2 B = 16 MiB per checkpoint.
// 32 layers: uniform 1 layer per checkpoint = 32 checkpoints (512 MiB); 2 per checkpoint = 16
// (256 MiB); block 2 = checkpoints at layers 0 and 1 (32 MiB), layers 2..31 saved in full, as
// every layer is without recompute.
TEST_CASE("explain under full recompute gives what each checkpoint keeps", "[report][explain]") {
  const std::vector<std::string> small = {"training.global_batch_size=8", "training.train_iters=2"};
  auto explain = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), small.begin(), small.end());
    return ExplainConfig("", sets).text;
  };
  const Bytes hidden = 4096 / 2 * 4096 * 2;
  const std::string uniform1 = explain({"training.recompute_granularity=full",
                                        "training.recompute_method=uniform",
                                        "training.recompute_num_layers=1"});
  CHECK_THAT(uniform1, Catch::Contains(fmt::format(
                           "keeps only the input of each full-recompute checkpoint (uniform, 1 "
                           "layer per checkpoint; re-run by its backward): {} per checkpoint in "
                           "layers 0..31 ({})",
                           HumanBytes(hidden), HumanBytes(32 * hidden))));
  CHECK_THAT(uniform1, !Catch::Contains("per layer in layers"));
  const std::string uniform2 = explain({"training.recompute_granularity=full",
                                        "training.recompute_method=uniform",
                                        "training.recompute_num_layers=2"});
  CHECK_THAT(uniform2, Catch::Contains(fmt::format("(uniform, 2 layers per checkpoint; re-run by "
                                                   "its backward): {} per checkpoint in layers "
                                                   "0..31 ({})",
                                                   HumanBytes(hidden), HumanBytes(16 * hidden))));
  const std::string block2 = explain({"training.recompute_granularity=full",
                                      "training.recompute_method=block",
                                      "training.recompute_num_layers=2"});
  CHECK_THAT(block2, Catch::Contains(fmt::format("one by one; re-run by its backward): {} per "
                                                 "checkpoint in layers 0..1 ({}), saves ",
                                                 HumanBytes(hidden), HumanBytes(2 * hidden))));
  // The layers block leaves alone save what every layer saves without recompute.
  const std::string none = explain({});
  std::smatch per_layer;
  REQUIRE(std::regex_search(none, per_layer, std::regex("saves (.*?) per layer in layers 0\\.\\.31")));
  CHECK_THAT(block2, Catch::Contains("saves " + per_layer[1].str() + " per layer in layers 2..31"));
}

TEST_CASE("explain fits the width it is given and runs from the command line", "[report][explain][cli]") {
  testing::ScratchDir dir("explain");
  const testing::CommandResult r = testing::RunMemsim(dir, "explain --width 80");
  REQUIRE(r.exit_code == 0);
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    INFO(line);
    CHECK(line.size() <= 80);
  }
  CHECK_THAT(r.out, Catch::Contains("Are activations stored twice? No."));
  const testing::CommandResult bad = testing::RunMemsim(dir, "explain --set training.nope=1");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("memsim explain: ") == 0);
}

}  // namespace
}  // namespace memsim
