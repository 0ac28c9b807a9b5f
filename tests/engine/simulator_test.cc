#include "engine/simulator.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <tuple>

#include "engine/recorder.h"

namespace memsim::engine {
namespace {

using namespace memsim::literals;
using workload::Op;
using workload::Program;
using workload::TensorAlloc;

// A device whose outside-allocator terms are easy to add up by hand.
config::Setup TestSetup() {
  config::Setup setup;
  setup.device.name = "test";
  setup.device.usable_memory_bytes = 1_GiB;
  setup.device.idle_baseline_bytes = 100_MiB;
  setup.device.context_bytes = 300_MiB;
  setup.device.communicator_buffer_bytes = 400_MiB;
  return setup;
}

Op MakeOp(std::string name, int iteration, Phase phase, std::vector<TensorAlloc> allocs,
          std::vector<workload::TensorId> frees, double duration_us = 10) {
  Op op;
  op.name = std::move(name);
  op.iteration = iteration;
  op.phase = phase;
  op.allocs = std::move(allocs);
  op.frees = std::move(frees);
  op.duration_us = duration_us;
  return op;
}

class Collect final : public Observer {
 public:
  void OnOpBoundary(const OpBoundary& b) override { boundaries.push_back(Copy(b)); }
  void OnOom(const OomEvent& oom) override { ooms.push_back(oom); }
  struct Seen {
    SimTimeUs time_us;
    std::string op;
    bool at_start;
    Bytes allocated, device;
    CategoryBytes by_category;
  };
  static Seen Copy(const OpBoundary& b) {
    return {b.time_us, b.op->name, b.at_start, b.allocated_bytes, b.device_bytes,
            *b.allocated_by_category};
  }
  std::vector<Seen> boundaries;
  std::vector<OomEvent> ooms;
};

TEST_CASE("engine: allocations at op start, frees at op end, categories sum to allocated",
          "[engine]") {
  Program program;
  // 2 MiB and 512 B requests are multiples of 512 B, so each block is exactly the request
  // (CUDACachingAllocator.cpp kMinBlockSize = 512; no split remainder is allocated).
  program.ops.push_back(MakeOp("init.param", 0, Phase::kInit,
                               {{1, 2_MiB, Category::kParameters, "w"}}, {}));
  program.ops.push_back(MakeOp("fwd", 1, Phase::kForward,
                               {{2, 512, Category::kActivations, "act"},
                                {3, 512, Category::kTemporaries, "tmp"}},
                               {3}));
  program.ops.push_back(MakeOp("bwd", 1, Phase::kBackward, {}, {2}));
  Collect seen;
  const SimulateResult r = Simulate(program, TestSetup(), {}, seen);
  REQUIRE(seen.boundaries.size() == 6);
  // fwd start: 2 MiB + 512 + 512 allocated; the temporary is freed at fwd's end.
  CHECK(seen.boundaries[2].op == "fwd");
  CHECK(seen.boundaries[2].allocated == 2_MiB + 1024);
  CHECK(seen.boundaries[2].by_category[static_cast<int>(Category::kTemporaries)] == 512);
  CHECK(seen.boundaries[3].allocated == 2_MiB + 512);
  CHECK(seen.boundaries[5].allocated == 2_MiB);
  // Ops run back to back: bwd starts at 2 × 10 us.
  CHECK(seen.boundaries[4].time_us == 20.0);
  CHECK(r.end_time_us == 30.0);
  for (const auto& b : seen.boundaries) {
    Bytes sum = 0;
    for (Bytes c : b.by_category) sum += c;
    CHECK(sum == b.allocated);
  }
  CHECK(r.num_communicators == 0);
}

TEST_CASE("engine: a group's first collective adds its communicator buffer to the device",
          "[engine]") {
  Program program;
  Op c1 = MakeOp("allreduce.dp", 1, Phase::kBackward, {}, {});
  c1.stream = workload::kCommStream;
  c1.collective_group = "dp";
  c1.collective_ranks = 8;
  Op c2 = c1;
  program.ops = {MakeOp("a", 1, Phase::kForward, {}, {}), c1, c2};
  Collect seen;
  const SimulateResult r = Simulate(program, TestSetup(), {}, seen);
  // Before: baseline 100 MiB + context 300 MiB. After "dp" first used: + 400 MiB, once.
  CHECK(seen.boundaries[0].device == 400_MiB);
  CHECK(seen.boundaries[2].device == 800_MiB);
  CHECK(seen.boundaries.back().device == 800_MiB);
  CHECK(r.num_communicators == 1);
  CHECK(r.outside_allocator_bytes == 700_MiB);
}

TEST_CASE("engine: a communication op overlaps the compute ops issued after it", "[engine]") {
  Program program;
  Op comm = MakeOp("comm", 1, Phase::kBackward, {}, {}, 100);
  comm.stream = workload::kCommStream;
  program.ops = {MakeOp("c0", 1, Phase::kBackward, {}, {}, 10), comm,
                 MakeOp("c1", 1, Phase::kBackward, {}, {}, 10)};
  Op sync = MakeOp("step", 1, Phase::kOptimizerStep, {}, {}, 5);
  sync.synchronize = true;
  program.ops.push_back(sync);
  Collect seen;
  const SimulateResult r = Simulate(program, TestSetup(), {}, seen);
  // c0 [0,10]; comm issued at 10, runs [10,110]; c1 [10,20]; step waits for comm: [110,115].
  CHECK(r.end_time_us == 115.0);
  std::vector<std::string> order;
  for (const auto& b : seen.boundaries) order.push_back(b.op + (b.at_start ? "+" : "-"));
  CHECK(order == std::vector<std::string>{"c0+", "c0-", "comm+", "c1+", "c1-", "comm-", "step+",
                                          "step-"});
}

// Megatron P2P (p2p_communication.py _communicate) runs on the compute stream and waits for its
// NCCL requests; the tensor it recorded on the communication stream is reusable once it ends.
// Without that, every micro-batch's send buffer stays pending and reserved creeps (issue 4,
// docs/validation.md: the slurm-on-aws 70B case, +91% reserved before this rule).
TEST_CASE("engine: a blocking collective on the compute stream completes its recorded stream",
          "[engine]") {
  struct Reserved final : public Observer {
    void OnOpBoundary(const OpBoundary& b) override { last_reserved = b.reserved_bytes; }
    Bytes last_reserved = 0;
  };
  Program program;
  program.ops.push_back(
      MakeOp("fwd", 1, Phase::kForward, {{1, 64_MiB, Category::kActivations, "out"}}, {}));
  Op send = MakeOp("p2p.send_forward", 1, Phase::kForward, {}, {1});
  send.collective_group = "pp";
  send.collective_ranks = 2;
  send.record_streams = {{1, workload::kCommStream}};
  program.ops.push_back(send);
  program.ops.push_back(
      MakeOp("fwd2", 1, Phase::kForward, {{2, 64_MiB, Category::kActivations, "out2"}}, {}));
  Reserved seen;
  Simulate(program, TestSetup(), {}, seen);
  // One 64 MiB segment: the freed "out" block is reused for "out2" (64 MiB is a multiple of the
  // 2 MiB large-pool rounding, so the block is exactly the request).
  CHECK(seen.last_reserved == 64_MiB);
}

TEST_CASE("engine: the first out-of-memory is reported once and the run continues unbounded",
          "[engine]") {
  Program program;
  // Usable 1 GiB minus context 300 MiB leaves 724 MiB for the allocator: a 600 MiB request
  // fits, a second one (1200 MiB in all, more than 724) does not.
  program.ops.push_back(MakeOp("a", 1, Phase::kForward, {{1, 600_MiB, Category::kActivations, "x"}}, {}));
  program.ops.push_back(MakeOp("b", 1, Phase::kForward, {{2, 600_MiB, Category::kActivations, "y"}}, {}));
  program.ops.push_back(MakeOp("c", 1, Phase::kForward, {{3, 600_MiB, Category::kActivations, "z"}}, {}));
  Collect seen;
  const SimulateResult r = Simulate(program, TestSetup(), {}, seen);
  REQUIRE(seen.ooms.size() == 1);
  CHECK(seen.ooms[0].tensor_label == "y");
  CHECK(seen.ooms[0].request_bytes == 600_MiB);
  CHECK(seen.ooms[0].allocated_bytes == 600_MiB);
  CHECK(seen.ooms[0].capacity_bytes == 724_MiB);
  REQUIRE(r.first_oom.has_value());
  CHECK(seen.boundaries.back().allocated == 1800_MiB);
}

TEST_CASE("recorder: spans start where the previous one ended", "[engine]") {
  Program program;
  program.ops.push_back(MakeOp("p", 0, Phase::kInit, {{1, 4_MiB, Category::kParameters, "w"}}, {}));
  program.ops.push_back(MakeOp("f", 1, Phase::kForward, {{2, 2_MiB, Category::kActivations, "a"}}, {}));
  program.ops.push_back(MakeOp("b", 1, Phase::kBackward, {}, {2}));
  program.ops.push_back(MakeOp("s", 1, Phase::kOptimizerStep, {{3, 8_MiB, Category::kOptimizerStates, "m"}}, {}));
  program.ops.push_back(MakeOp("f", 2, Phase::kForward, {{4, 2_MiB, Category::kActivations, "a"}}, {}));
  program.ops.push_back(MakeOp("b", 2, Phase::kBackward, {}, {4}));
  Recorder recorder;
  Simulate(program, TestSetup(), {}, recorder);
  recorder.Finish();
  const auto& spans = recorder.spans();
  REQUIRE(spans.size() == 3);
  CHECK(spans[0].end_allocated_bytes == 4_MiB);
  CHECK(spans[1].start_allocated_bytes == 4_MiB);
  // Iteration 1 peaks at the optimizer step: 4 MiB params + 8 MiB states (activations freed).
  CHECK(spans[1].peak_allocated_bytes == 12_MiB);
  CHECK(spans[1].peak_phase == Phase::kOptimizerStep);
  CHECK(spans[1].end_allocated_bytes - spans[1].start_allocated_bytes == 8_MiB);
  // Iteration 2 peaks in forward: 4 + 8 + 2 MiB.
  CHECK(spans[2].start_allocated_bytes == 12_MiB);
  CHECK(spans[2].peak_allocated_bytes == 14_MiB);
  CHECK(spans[2].peak_phase == Phase::kForward);
  CHECK(recorder.timeline().samples.size() == 12);
}

}  // namespace
}  // namespace memsim::engine

namespace memsim::engine {
namespace {

// The event order of the header's timing rules, computed the way the whole-Program engine did
// it: every op's start and end time from the stream rules, then all events sorted by (time,
// sequence), sequence = 2 × issue index (+1 for the end).
std::vector<std::tuple<SimTimeUs, std::size_t, bool>> SortedEvents(const Program& program) {
  std::vector<std::tuple<SimTimeUs, std::size_t, bool>> events;
  SimTimeUs compute_free = 0, comm_free = 0;
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const Op& op = program.ops[i];
    const bool comm = op.stream == workload::kCommStream;
    const SimTimeUs start =
        op.synchronize || comm ? std::max(compute_free, comm_free) : compute_free;
    const SimTimeUs end = start + op.duration_us;
    if (comm) {
      comm_free = end;
      if (op.synchronize) compute_free = end;
    } else {
      compute_free = end;
    }
    events.emplace_back(start, 2 * i, true);
    events.emplace_back(end, 2 * i + 1, false);
  }
  std::sort(events.begin(), events.end());
  return events;
}

TEST_CASE("engine: ops fed one at a time are processed in the order of all events sorted",
          "[engine][fast_path]") {
  // A deterministic mix (a linear congruential generator): compute ops of 0 to 29 us, comm ops
  // of up to 199 us that outlast many compute ops, some synchronizing, each op allocating one
  // tensor and freeing one that an earlier compute op allocated (compute ops start in issue
  // order and every op starts after the compute ops issued before it ended, so the free never
  // comes before its malloc); comm ops record a live tensor on their stream.
  std::uint64_t seed = 12345;
  auto next = [&seed](std::uint64_t n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (seed >> 33) % n;
  };
  Program program;
  std::vector<workload::TensorId> live;
  for (int i = 0; i < 400; ++i) {
    const bool comm = next(4) == 0;
    std::vector<workload::TensorId> frees;
    if (!live.empty() && next(2) == 0) {
      const std::size_t k = next(live.size());
      frees.push_back(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const workload::TensorId id = static_cast<workload::TensorId>(i) + 1;
    Op op = MakeOp(std::to_string(i), 1 + i / 100, Phase::kForward,
                   {{id, static_cast<Bytes>(512 * (1 + next(64))), Category::kTemporaries, "t"}},
                   frees, static_cast<double>(comm ? next(200) : next(30)));
    op.stream = comm ? workload::kCommStream : workload::kComputeStream;
    op.synchronize = next(10) == 0;
    if (comm && !live.empty()) op.record_streams.emplace_back(live.back(), workload::kCommStream);
    if (!comm) live.push_back(id);
    program.ops.push_back(std::move(op));
  }
  const auto expected = SortedEvents(program);
  Collect seen;
  // The Setup and options must outlive the Simulation (simulator.h): no temporaries here.
  const config::Setup setup = TestSetup();
  const SimulateOptions options;
  Simulation simulation(setup, options, seen);
  for (const Op& op : program.ops) simulation.OnOp(Op(op));
  const SimulateResult r = simulation.Finish();
  REQUIRE(seen.boundaries.size() == expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) {
    const auto& [time, sequence, at_start] = expected[k];
    INFO("event " << k);
    CHECK(seen.boundaries[k].time_us == time);
    CHECK(seen.boundaries[k].op == std::to_string(sequence / 2));
    CHECK(seen.boundaries[k].at_start == at_start);
  }
  CHECK(r.end_time_us == std::get<0>(expected.back()));
}

}  // namespace
}  // namespace memsim::engine
