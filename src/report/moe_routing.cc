#include "report/moe_routing.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/units.h"
#include "engine/recorder.h"
#include "engine/simulator.h"
#include "engine/stages.h"
#include "workload/build.h"

namespace memsim::report {
namespace {

struct Peaks {
  Bytes allocated = 0, reserved = 0, device = 0;
};

Peaks PeaksOf(const engine::StageResult& s) {
  return {s.peak_allocated_bytes, s.peak_reserved_bytes, s.peak_device_bytes};
}

// One stage of `setup` simulated without keeping its curve: the peaks over its spans.
Peaks SimulateStage(const config::Setup& setup, int rank, std::optional<Bytes> usable) {
  engine::Recorder recorder(false);
  engine::SimulateOptions options;
  options.usable_memory_bytes = usable;
  engine::Simulation simulation(setup, options, recorder);
  workload::BuildInto(setup, rank, simulation);  // streamed: the Program is never held whole
  simulation.Finish();
  recorder.Finish();
  Peaks p;
  for (const timeline::SpanSummary& s : recorder.spans()) {
    p.allocated = std::max(p.allocated, s.peak_allocated_bytes);
    p.reserved = std::max(p.reserved, s.peak_reserved_bytes);
    p.device = std::max(p.device, s.peak_device_bytes);
  }
  return p;
}

std::string Gib(Bytes b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / kGiB); }

std::string Format(const Peaks& p) {
  return fmt::format("allocated {}, reserved {}, device {}", Gib(p.allocated), Gib(p.reserved),
                     Gib(p.device));
}

}  // namespace

double ComparedImbalance(const config::Setup& setup) {
  const double f = setup.training.moe_imbalance_factor;
  return f > 1.0 ? f : 1.5;
}

std::string FormatMoeRouting(const config::Setup& setup, const engine::RunResult& run,
                             std::optional<Bytes> usable_memory_bytes) {
  if (setup.model.num_experts <= 1) return "";
  const double f = setup.training.moe_imbalance_factor;
  const bool balanced = f <= 1.0;
  // The iterations `run` simulated, not train_iters: a long run's later iterations repeat the
  // simulated ones (engine/stages.h), and the other distribution changes the sizes of the
  // dispatcher's buffers, not the ops, so its peaks are over the same iterations the table shows.
  config::Setup other = engine::SimulatedSetup(setup, run);
  other.training.moe_imbalance_factor = balanced ? ComparedImbalance(setup) : 1.0;
  const int stage = run.reported_stage;
  const Peaks shown = PeaksOf(run.Reported());
  const Peaks again = SimulateStage(other, stage, usable_memory_bytes);
  std::string out =
      fmt::format("MoE routing: the table shows {} (moe_imbalance_factor {:g}).\n",
                  balanced ? "balanced routing" : "the most loaded rank", f);
  out += fmt::format("  peaks of stage {}: balanced: {}; imbalance {:g}: {}\n", stage,
                     Format(balanced ? shown : again), ComparedImbalance(setup),
                     Format(balanced ? again : shown));
  return out;
}

}  // namespace memsim::report
