#include "export/detail.h"

#include <unordered_map>

#include "core/check.h"
#include "engine/recorder.h"
#include "workload/build.h"

namespace memsim::exports {
namespace {

class DetailObserver final : public engine::Observer, public alloc::TraceSink {
 public:
  explicit DetailObserver(const DetailOptions& options)
      : allocator_events_(options.allocator_events),
        keep_samples_(options.keep_samples),
        keep_ops_(options.keep_ops || options.allocator_events),
        sample_sink_(options.sample_sink) {}

  void OnOpBoundary(const engine::OpBoundary& b) override {
    recorder_.OnOpBoundary(b);
    const workload::Op& op = *b.op;
    const CategorySample sample{b.time_us, op.iteration, op.phase, b.allocated_bytes,
                                b.reserved_bytes, b.active_bytes, b.device_bytes,
                                *b.allocated_by_category};
    if (sample_sink_ != nullptr) sample_sink_->OnSample(sample);
    if (keep_samples_) detail_.samples.push_back(sample);
    if (!keep_ops_) return;
    int index;
    if (b.at_start) {
      index = static_cast<int>(detail_.ops.size());
      detail_.ops.push_back({op.name, op.stream, b.time_us, b.time_us, op.iteration, op.phase,
                             op.micro_batch});
      open_.emplace(&op, index);
    } else {
      auto it = open_.find(&op);
      MEMSIM_CHECK(it != open_.end());
      index = it->second;
      detail_.ops[static_cast<size_t>(index)].end_us = b.time_us;
      open_.erase(it);
    }
    for (AllocatorEvent& e : pending_) {
      e.time_us = b.time_us;
      e.op = index;
      detail_.allocator_events.push_back(std::move(e));
    }
    pending_.clear();
  }

  void OnCommunicatorCreated(SimTimeUs time_us, const std::string& group) override {
    recorder_.OnCommunicatorCreated(time_us, group);
  }

  void OnTensorAllocated(const workload::Op& /*op*/, const workload::TensorAlloc& tensor,
                         Bytes /*block_bytes*/) override {
    if (!allocator_events_) return;
    // The malloc's own alloc event is the last one recorded.
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
      if (it->event.action != alloc::TraceAction::kAlloc) continue;
      it->tensor = tensor.label;
      it->category = tensor.category;
      live_[it->event.addr] = {tensor.label, tensor.category};
      break;
    }
  }

  alloc::TraceSink* AllocatorTraceSink() override { return allocator_events_ ? this : nullptr; }

  void OnTrace(const alloc::TraceEvent& event) override {
    AllocatorEvent e;
    e.event = event;
    if (event.action == alloc::TraceAction::kFreeRequested ||
        event.action == alloc::TraceAction::kFreeCompleted) {
      auto it = live_.find(event.addr);
      if (it != live_.end()) {
        e.tensor = it->second.label;
        e.category = it->second.category;
        if (event.action == alloc::TraceAction::kFreeCompleted) live_.erase(it);
      }
    }
    pending_.push_back(std::move(e));
  }

  RunDetail Finish() {
    recorder_.Finish();
    detail_.markers = recorder_.timeline().markers;
    detail_.spans = recorder_.spans();
    return std::move(detail_);
  }

 private:
  struct Tensor {
    std::string label;
    Category category = Category::kOther;
  };
  bool allocator_events_;
  bool keep_samples_;
  bool keep_ops_;
  CategorySampleSink* sample_sink_;  // not owned; may be null
  engine::Recorder recorder_{/*keep_samples=*/true};
  RunDetail detail_;
  std::vector<AllocatorEvent> pending_;  // since the last op boundary
  // Lookups only, never iterated (determinism).
  std::unordered_map<const workload::Op*, int> open_;  // op -> index in detail_.ops
  std::unordered_map<Bytes, Tensor> live_;              // block address -> its tensor
};

}  // namespace

RunDetail CollectRunDetail(const config::Setup& setup, int pipeline_rank,
                           const DetailOptions& options) {
  MEMSIM_CHECK(pipeline_rank >= 0 && pipeline_rank < setup.training.pipeline_model_parallel_size);
  const workload::Program program = workload::Build(setup, pipeline_rank);
  DetailObserver observer(options);
  engine::Simulate(program, setup, options.simulate, observer);
  RunDetail detail = observer.Finish();
  detail.pipeline_rank = pipeline_rank;
  detail.backend = setup.allocator.backend;
  return detail;
}

std::vector<RunDetail> CollectStageDetails(const config::Setup& setup,
                                           const engine::RunResult& run) {
  DetailOptions options;
  options.simulate.usable_memory_bytes = run.usable_memory_bytes;
  const config::Setup simulated = engine::SimulatedSetup(setup, run);
  std::vector<RunDetail> out;
  for (const engine::StageResult& stage : run.stages) {
    out.push_back(CollectRunDetail(simulated, stage.pipeline_rank, options));
  }
  return out;
}

RunDetail DetailFromTimeline(const timeline::Timeline& timeline) {
  RunDetail d;
  const auto known = [](Bytes b) { return b < 0 ? 0 : b; };
  for (const timeline::Sample& s : timeline.samples) {
    d.samples.push_back({s.time_us, s.iteration, s.phase, known(s.allocated_bytes),
                         known(s.reserved_bytes), known(s.active_bytes), known(s.device_bytes),
                         CategoryBytes{}});
  }
  d.markers = timeline.markers;
  return d;
}

}  // namespace memsim::exports
