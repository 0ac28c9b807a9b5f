#include "engine/stages.h"

#include <algorithm>
#include <mutex>
#include <numeric>

#include "config/iterations.h"
#include "core/check.h"
#include "core/parallel.h"
#include "workload/build.h"

namespace memsim::engine {
namespace {

bool SameCategories(const CategoryBytes& a, const CategoryBytes& b) { return a == b; }

// Two spans alike in everything but their number and times.
bool SameMemory(const timeline::SpanSummary& a, const timeline::SpanSummary& b) {
  auto same_phase_peaks = [&] {
    for (size_t i = 0; i < a.phase_peaks.size(); ++i) {
      const timeline::PhasePeak& x = a.phase_peaks[i];
      const timeline::PhasePeak& y = b.phase_peaks[i];
      if (x.seen != y.seen || x.allocated_bytes != y.allocated_bytes || x.op != y.op ||
          x.micro_batch != y.micro_batch || !SameCategories(x.by_category, y.by_category)) {
        return false;
      }
    }
    return true;
  };
  return a.start_allocated_bytes == b.start_allocated_bytes &&
         a.start_reserved_bytes == b.start_reserved_bytes &&
         a.start_device_bytes == b.start_device_bytes &&
         a.end_allocated_bytes == b.end_allocated_bytes &&
         a.end_reserved_bytes == b.end_reserved_bytes && a.end_device_bytes == b.end_device_bytes &&
         a.peak_allocated_bytes == b.peak_allocated_bytes &&
         a.peak_reserved_bytes == b.peak_reserved_bytes &&
         a.peak_device_bytes == b.peak_device_bytes && a.peak_active_bytes == b.peak_active_bytes &&
         a.peak_phase == b.peak_phase && a.peak_op == b.peak_op &&
         a.peak_micro_batch == b.peak_micro_batch &&
         SameCategories(a.by_category_at_peak, b.by_category_at_peak) &&
         SameCategories(a.start_by_category, b.start_by_category) &&
         SameCategories(a.end_by_category, b.end_by_category) &&
         a.peak_reserved_phase == b.peak_reserved_phase && same_phase_peaks();
}

// StageResult::steady_state_from and its period over `simulated` iterations; states[k] is the
// start of k. The earliest k wins, then the shortest period.
struct Steady {
  int from = 0;
  int period = 1;
};
std::optional<Steady> SteadyFrom(const StageResult& stage, const std::vector<EngineState>& states,
                                 int first, int simulated) {
  const int known = std::min(simulated, static_cast<int>(states.size()) - 1);
  for (int k = first; k < known; ++k) {
    for (int period = 1; period <= kMaxSteadyPeriod && k + 2 * period - 1 <= known; ++period) {
      if (states[k].empty() || states[k] != states[k + period]) continue;
      bool alike = true;
      for (int j = 0; j < period && alike; ++j) {
        const timeline::SpanSummary* a = stage.Span(k + j);
        const timeline::SpanSummary* b = stage.Span(k + period + j);
        alike = a != nullptr && b != nullptr && SameMemory(*a, *b);
      }
      if (alike) return Steady{k, period};
    }
  }
  return std::nullopt;
}

// What the simulation of one stage leaves for the merge in rank order.
struct StageOutcome {
  StageResult stage;
  timeline::Timeline timeline;  // the kept curve, when the stage may be reported
};

RunResult RunStages(const config::Setup& setup, const RunOptions& options, int iterations);

}  // namespace

const timeline::SpanSummary* StageResult::Span(int iteration) const {
  for (const timeline::SpanSummary& s : spans) {
    if (s.iteration == iteration) return &s;
  }
  return nullptr;
}

RunResult RunAllStages(const config::Setup& setup, const RunOptions& options) {
  const int train = setup.training.train_iters;
  const int first = config::FirstRepeatingIteration(setup);
  const int most = config::MaxSimulatedIterations(setup);
  // Varying data lengths: every iteration, no steady state looked for (most == train).
  int n = setup.training.data.Varies()
              ? train
              : std::min(train, std::max(config::kMinSimulatedIterations, first + 1));
  for (;;) {
    RunResult r = RunStages(setup, options, n);
    r.train_iters = train;
    r.simulated_iterations = n;
    if (!r.IsLongRun()) return r;
    bool all = true;
    for (const StageResult& s : r.stages) {
      if (!s.steady_state_from) {
        all = false;
        continue;
      }
      if (!r.steady_state_from || *s.steady_state_from > *r.steady_state_from) {
        r.steady_state_from = s.steady_state_from;
      }
      r.steady_state_period = std::lcm(r.steady_state_period, s.steady_state_period);
    }
    if (!all) {
      r.steady_state_from.reset();
      r.steady_state_period = 1;
    }
    if (all || n >= most) return r;
    n = std::min(most, 2 * n);
  }
}

config::Setup SimulatedSetup(const config::Setup& setup, const RunResult& run) {
  MEMSIM_CHECK(run.simulated_iterations >= 1 &&
               run.simulated_iterations <= setup.training.train_iters);
  config::Setup out = setup;
  out.training.train_iters = run.simulated_iterations;
  return out;
}

namespace {

// One pass over every stage: what the stages' simulations share.
class StagePass {
 public:
  StagePass(const config::Setup& user_setup, const RunOptions& options, int iterations)
      : setup_(user_setup),
        options_(options),
        iterations_(iterations),
        long_run_(iterations < user_setup.training.train_iters),
        first_repeating_(config::FirstRepeatingIteration(user_setup)),
        stages_(user_setup.training.pipeline_model_parallel_size),
        done_(static_cast<size_t>(stages_), 0.0) {
    setup_.training.train_iters = iterations;
  }

  int stages() const { return stages_; }
  bool long_run() const { return long_run_; }

  // Simulates stage r (any thread; stages run at once share nothing but the callbacks, which
  // this class calls one at a time).
  StageOutcome Simulate(int r);

  // Stage r has processed `fraction` of its events: RunOptions::progress with every stage's part.
  void Progress(int r, double fraction) {
    if (!options_.progress) return;
    std::lock_guard<std::mutex> lock(callbacks_);
    done_[static_cast<size_t>(r)] = fraction;
    options_.progress({stages_, iterations_, std::accumulate(done_.begin(), done_.end(), 0.0)});
  }

 private:
  config::Setup setup_;  // the user's, with train_iters = the iterations of this pass
  const RunOptions& options_;
  const int iterations_;
  const bool long_run_;
  const int first_repeating_;
  const int stages_;
  std::mutex callbacks_;       // RunOptions::progress
  std::vector<double> done_;   // by stage, for progress
};

StageOutcome StagePass::Simulate(int r) {
  StageOutcome out;
  // Keep samples only for a stage that may be reported; the worst stage is only known after
  // all ran, so without --pipeline-rank every stage keeps them until a worse one is merged.
  const bool may_report = !options_.pipeline_rank || *options_.pipeline_rank == r;
  const bool keep = options_.keep_timeline && may_report;
  Progress(r, 0.0);
  SimulateOptions sim_options;
  sim_options.usable_memory_bytes = options_.usable_memory_bytes;
  sim_options.record_iteration_states = long_run_;
  if (options_.progress) sim_options.progress = [this, r](double f) { Progress(r, f); };
  Recorder recorder(keep);
  StageResult& stage = out.stage;
  stage.pipeline_rank = r;
  Simulation simulation(setup_, sim_options, recorder);
  workload::BuildInto(setup_, r, simulation);
  stage.simulation = simulation.Finish();
  recorder.Finish();
  stage.spans = recorder.spans();
  if (long_run_) {
    if (const std::optional<Steady> steady = SteadyFrom(
            stage, stage.simulation.iteration_states, first_repeating_, iterations_)) {
      stage.steady_state_from = steady->from;
      stage.steady_state_period = steady->period;
    }
    stage.simulation.iteration_states = {};
  }
  for (const timeline::SpanSummary& s : stage.spans) {
    if (s.peak_allocated_bytes > stage.peak_allocated_bytes) {
      stage.peak_allocated_bytes = s.peak_allocated_bytes;
      stage.by_category_at_peak = s.by_category_at_peak;
    }
    stage.peak_reserved_bytes = std::max(stage.peak_reserved_bytes, s.peak_reserved_bytes);
    stage.peak_device_bytes = std::max(stage.peak_device_bytes, s.peak_device_bytes);
  }
  if (keep) out.timeline = recorder.TakeTimeline();
  Progress(r, 1.0);
  return out;
}

// Adds stage r, the next in rank order, to `result`; `worst_device` is the reported stage's
// peak device bytes so far (-1 before the first).
void MergeStage(StageOutcome&& out, const RunOptions& options, RunResult* result,
                Bytes* worst_device) {
  const int r = out.stage.pipeline_rank;
  if (out.stage.simulation.first_oom) {
    const OomEvent& oom = *out.stage.simulation.first_oom;
    if (!result->first_oom || oom.time_us < result->first_oom->oom.time_us) {
      result->first_oom = StagedOomEvent{r, oom};
    }
  }
  const bool chosen = options.pipeline_rank ? *options.pipeline_rank == r
                                            : out.stage.peak_device_bytes > *worst_device;
  if (chosen) {
    result->reported_stage = r;
    *worst_device = out.stage.peak_device_bytes;
    result->timeline = std::move(out.timeline);
  }
  result->stages.push_back(std::move(out.stage));
}

// One pass over every stage with `iterations` iterations simulated.
RunResult RunStages(const config::Setup& user_setup, const RunOptions& options, int iterations) {
  StagePass pass(user_setup, options, iterations);
  const int p = pass.stages();
  MEMSIM_CHECK(p >= 1);
  MEMSIM_CHECK(!options.pipeline_rank || (*options.pipeline_rank >= 0 && *options.pipeline_rank < p));
  RunResult result;
  result.reported_stage_chosen = options.pipeline_rank.has_value();
  result.usable_memory_bytes =
      options.usable_memory_bytes.value_or(user_setup.device.usable_memory_bytes);
  result.stages.reserve(static_cast<size_t>(p));
  std::vector<std::optional<StageOutcome>> outcomes(static_cast<size_t>(p));
  Bytes worst_device = -1;
  RunInOrder(
      p, options.threads > 0 ? options.threads : AvailableCpus(),
      [&](int r) { outcomes[static_cast<size_t>(r)] = pass.Simulate(r); },
      [&](int r) {
        MergeStage(std::move(*outcomes[static_cast<size_t>(r)]), options, &result, &worst_device);
        outcomes[static_cast<size_t>(r)].reset();  // a beaten stage's curve goes now
      });
  return result;
}

}  // namespace

}  // namespace memsim::engine
