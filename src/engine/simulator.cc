#include "engine/simulator.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <queue>
#include <unordered_set>
#include <vector>

#include "core/check.h"
#include "core/id_table.h"
#include "device/device_model.h"

namespace memsim::engine {
namespace {

struct Event {
  SimTimeUs time_us;
  std::uint64_t sequence;  // 2 × op index (+1 for the end)
  // Later first: std::priority_queue pops the greatest.
  bool operator<(const Event& o) const {
    return time_us != o.time_us ? time_us > o.time_us : sequence > o.sequence;
  }
};

struct LiveTensor {
  alloc::BlockHandle block = 0;
  Bytes block_bytes = 0;  // the allocated-bytes increase the malloc caused
  Category category = Category::kOther;
};

// An issued op until its end event is processed.
struct PendingOp {
  workload::Op op;
  bool ended = false;
  // Whether the communication stream is idle at its end; unknown (nullopt) for a comm op until
  // the next comm op is issued -- known true once the compute stream is free after its end,
  // since the next comm op cannot be issued earlier (simulator.h, 'Streaming').
  std::optional<bool> comm_idle_at_end;
};

}  // namespace

class Simulation::Engine {
 public:
  Engine(const config::Setup& setup, const SimulateOptions& options, Observer& observer)
      : device_(setup),
        usable_(options.usable_memory_bytes.value_or(setup.device.usable_memory_bytes)),
        record_states_(options.record_iteration_states),
        iterations_(setup.training.train_iters),
        progress_(options.progress),
        observer_(observer) {
    alloc::AllocatorOptions alloc_options = setup.allocator;
    alloc_options.capacity_bytes = device_.AllocatorCapacity(usable_);
    allocator_ = alloc::NewCachingAllocator(alloc_options);
    allocator_->SetTraceSink(observer_.AllocatorTraceSink());
    by_category_.fill(0);
    if (record_states_) states_.resize(1);
  }

  // Assigns the op's start and end times (see the header's timing rules), settles whether the
  // previous comm op leaves the communication stream idle, and processes every event due before
  // the op's own.
  void Issue(workload::Op&& op) {
    ProcessUntil(compute_free_);
    const std::uint64_t i = base_ + pending_.size();
    SimTimeUs start = op.synchronize || op.stream == workload::kCommStream
                          ? std::max(compute_free_, comm_free_)
                          : compute_free_;
    const SimTimeUs end = start + std::max(0.0, op.duration_us);
    std::optional<bool> idle;
    if (op.stream == workload::kCommStream) {
      // The previous comm op left the stream idle iff this one was issued after it ended.
      if (PendingOp* last = Pending(last_comm_)) last->comm_idle_at_end = compute_free_ >= last_comm_end_;
      last_comm_ = i;
      last_comm_end_ = end;
      comm_free_ = end;
      if (op.synchronize) compute_free_ = end;
    } else {
      compute_free_ = end;
      // A blocking collective issued on the compute stream (Megatron P2P: p2p_communication.py
      // _communicate waits on its requests unless overlap_p2p_comm): when it ends its NCCL work
      // is done, so the communication stream is idle if nothing else is queued on it.
      idle = !op.collective_group.empty() && comm_free_ <= end;
    }
    pending_.push_back(PendingOp{std::move(op), false, idle});
    events_.push({start, 2 * i});
    events_.push({end, 2 * i + 1});
  }

  // OpSink::TakeSpareOp.
  workload::Op TakeSpareOp() {
    if (spare_.empty()) return {};
    workload::Op op = std::move(spare_.back());
    spare_.pop_back();
    return op;
  }

  SimulateResult Finish() {
    if (PendingOp* last = Pending(last_comm_)) last->comm_idle_at_end = true;
    ProcessUntil(std::numeric_limits<SimTimeUs>::infinity());
    SimulateResult result;
    result.allocator_stats = allocator_->Stats();
    result.first_oom = first_oom_;
    result.end_time_us = end_time_;
    result.num_communicators = device_.NumCommunicators();
    result.outside_allocator_bytes = device_.OutsideAllocatorBytes();
    if (record_states_) {
      states_.push_back(State());
      result.iteration_states = std::move(states_);
    }
    return result;
  }

 private:
  PendingOp* Pending(std::uint64_t i) {
    return i >= base_ && i < base_ + pending_.size() ? &pending_[i - base_] : nullptr;
  }

  // Processes the events at or before `time_us` in (time, sequence) order.
  void ProcessUntil(SimTimeUs time_us) {
    while (!events_.empty() && events_.top().time_us <= time_us) {
      const Event e = events_.top();
      events_.pop();
      end_time_ = e.time_us;
      PendingOp& p = *Pending(e.sequence / 2);
      if (progress_ && ++done_ % kProgressEvents == 0) {
        progress_(std::min(1.0, p.op.iteration / (iterations_ + 1.0)));
      }
      if (e.sequence % 2 == 0) {
        if (record_states_ && p.op.iteration >= static_cast<int>(states_.size())) {
          while (static_cast<int>(states_.size()) < p.op.iteration) states_.emplace_back();
          states_.push_back(State());
        }
        Start(p.op, e.time_us);
      } else {
        End(p.op, e.time_us, p.comm_idle_at_end.value_or(true));
        p.ended = true;
        while (!pending_.empty() && pending_.front().ended) {
          if (spare_.size() < kMaxSpareOps) {
            pending_.front().op.Clear();
            spare_.push_back(std::move(pending_.front().op));
          }
          pending_.pop_front();
          ++base_;
        }
      }
    }
  }

  void Start(const workload::Op& op, SimTimeUs time_us) {
    if (op.synchronize) CompleteAllStreams();
    if (op.managed_bytes != 0) device_.OnManaged(op.managed_bytes);
    if (!op.collective_group.empty() && device_.OnCollective(op.collective_group, op.collective_ranks)) {
      allocator_->SetCapacity(unbounded_ ? std::nullopt
                                         : std::optional(device_.AllocatorCapacity(usable_)));
      observer_.OnCommunicatorCreated(time_us, op.collective_group);
    }
    for (const auto& [tensor, stream] : op.record_streams) {
      // Absent for a tensor that was never allocated.
      if (const LiveTensor* t = live_.Find(tensor)) allocator_->RecordStream(t->block, stream);
    }
    for (const workload::TensorAlloc& t : op.allocs) Allocate(op, t, time_us);
    Notify(op, time_us, /*at_start=*/true);
  }

  void End(const workload::Op& op, SimTimeUs time_us, bool comm_idle) {
    for (workload::TensorId id : op.frees) {
      if (!failed_.empty() && failed_.erase(id) > 0) continue;
      const LiveTensor* t = live_.Find(id);
      MEMSIM_CHECK(t != nullptr);  // the workload frees only what it allocated before
      allocator_->Free(t->block);
      by_category_[static_cast<int>(t->category)] -= t->block_bytes;
      live_.Erase(id);
    }
    if (comm_idle) {
      allocator_->CompleteStream(workload::kCommStream);
    }
    if (op.empty_cache) allocator_->EmptyCache();
    Notify(op, time_us, /*at_start=*/false);
  }

  void Allocate(const workload::Op& op, const workload::TensorAlloc& t, SimTimeUs time_us) {
    MEMSIM_CHECK(!live_.Contains(t.id));
    if (t.size_bytes <= 0) return;  // allocate(0) touches nothing (c10 NativeCachingAllocator)
    const Bytes before = allocator_->Stats().allocated_bytes.current;
    std::optional<alloc::BlockHandle> block = allocator_->Malloc(t.size_bytes, op.stream);
    if (!block) {
      if (!first_oom_) {
        const alloc::AllocatorStats& s = allocator_->Stats();
        first_oom_ = OomEvent{time_us, op.iteration, op.phase, op.name, t.label, t.size_bytes,
                              s.allocated_bytes.current, s.reserved_bytes.current, usable_,
                              device_.AllocatorCapacity(usable_)};
        observer_.OnOom(*first_oom_);
      }
      unbounded_ = true;
      allocator_->SetCapacity(std::nullopt);
      block = allocator_->Malloc(t.size_bytes, op.stream);
      if (!block) {
        // Even an unbounded device refuses it (a request of 2^60 bytes or more, as PyTorch
        // refuses): the tensor is not allocated, its later free does nothing. The first
        // out-of-memory event above already reports the run as not fitting.
        failed_.insert(t.id);
        return;
      }
    }
    const Bytes block_bytes = allocator_->Stats().allocated_bytes.current - before;
    live_.Insert(t.id, LiveTensor{*block, block_bytes, t.category});
    by_category_[static_cast<int>(t.category)] += block_bytes;
    observer_.OnTensorAllocated(op, t, block_bytes);
  }

  // EngineState (simulator.h): live tensors in id order (ids grow in emission order, so equal
  // Programs of two iterations list their tensors alike).
  EngineState State() const {
    std::vector<workload::TensorId> ids;
    ids.reserve(live_.size());
    live_.ForEach([&ids](workload::TensorId id, const LiveTensor&) { ids.push_back(id); });
    std::sort(ids.begin(), ids.end());
    std::vector<alloc::BlockHandle> handles;
    handles.reserve(ids.size());
    EngineState tail;
    for (workload::TensorId id : ids) {
      const LiveTensor& t = *live_.Find(id);
      handles.push_back(t.block);
      tail.push_back(t.block_bytes);
      tail.push_back(static_cast<std::int64_t>(t.category));
    }
    EngineState state = allocator_->CanonicalState(handles);
    state.insert(state.end(), tail.begin(), tail.end());
    state.insert(state.end(), {device_.OutsideAllocatorBytes(), device_.ManagedBytes(),
                               unbounded_ ? 1 : 0,
                               static_cast<std::int64_t>(failed_.size())});
    return state;
  }

  void CompleteAllStreams() {
    allocator_->CompleteStream(workload::kComputeStream);
    allocator_->CompleteStream(workload::kCommStream);
  }

  void Notify(const workload::Op& op, SimTimeUs time_us, bool at_start) {
    const alloc::AllocatorStats& s = allocator_->Stats();
    OpBoundary b;
    b.time_us = time_us;
    b.op = &op;
    b.at_start = at_start;
    b.allocated_bytes = s.allocated_bytes.current;
    b.reserved_bytes = s.reserved_bytes.current;
    b.active_bytes = s.active_bytes.current;
    b.device_bytes = device_.DeviceBytes(s.reserved_bytes.current);
    b.allocated_by_category = &by_category_;
    observer_.OnOpBoundary(b);
  }

  device::DeviceModel device_;
  Bytes usable_;
  bool record_states_;
  int iterations_;
  const std::function<void(double)>& progress_;
  Observer& observer_;
  std::unique_ptr<alloc::Allocator> allocator_;
  // Keyed by tensor id; only looked up, or iterated into a sorted list (determinism).
  IdTable<LiveTensor> live_;
  std::unordered_set<workload::TensorId> failed_;  // never allocated even when unbounded
  CategoryBytes by_category_;
  std::optional<OomEvent> first_oom_;
  bool unbounded_ = false;
  std::vector<EngineState> states_;
  // Streaming (simulator.h): the ops from index base_ on, the events not processed yet.
  std::deque<PendingOp> pending_;
  // Ended ops, cleared, for the generator to fill again (TakeSpareOp): the op count of a run
  // costs no heap blocks for names and lists.
  static constexpr std::size_t kMaxSpareOps = 64;
  std::vector<workload::Op> spare_;
  std::uint64_t base_ = 0;
  std::priority_queue<Event> events_;
  SimTimeUs compute_free_ = 0, comm_free_ = 0;
  std::uint64_t last_comm_ = std::numeric_limits<std::uint64_t>::max();  // the previous comm op
  SimTimeUs last_comm_end_ = 0;
  SimTimeUs end_time_ = 0;
  std::size_t done_ = 0;
};

Simulation::Simulation(const config::Setup& setup, const SimulateOptions& options,
                       Observer& observer)
    : engine_(std::make_unique<Engine>(setup, options, observer)) {}
Simulation::~Simulation() = default;
void Simulation::OnOp(workload::Op&& op) { engine_->Issue(std::move(op)); }
workload::Op Simulation::TakeSpareOp() { return engine_->TakeSpareOp(); }
SimulateResult Simulation::Finish() { return engine_->Finish(); }

SimulateResult Simulate(const workload::Program& program, const config::Setup& setup,
                        const SimulateOptions& options, Observer& observer) {
  Simulation simulation(setup, options, observer);
  for (const workload::Op& op : program.ops) simulation.OnOp(workload::Op(op));
  return simulation.Finish();
}

}  // namespace memsim::engine
