// OpPipe: an OpSink that hands the ops a generator emits to another OpSink (a Simulation) on a
// thread of its own, so that generating a stage's ops (workload/) and simulating them (the
// engine, the allocator model, the recorder) run at once on two CPUs. The target receives the
// same ops in the same order as it would directly, so its results are the same; only the time
// taken changes. Ops travel in batches of kOpBatch, at most kBatchesInFlight batches at once
// (memory stays bounded whatever the run), and spent ops come back for reuse
// (OpSink::TakeSpareOp).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "workload/program.h"

namespace memsim::engine {

class OpPipe final : public workload::OpSink {
 public:
  static constexpr std::size_t kOpBatch = 128;
  static constexpr std::size_t kBatchesInFlight = 3;

  // Starts the thread that feeds `target`. `target` must outlive the OpPipe; it is used only by
  // that thread until Drain returns.
  explicit OpPipe(workload::OpSink& target);
  // Stops the thread; ops not yet handed to the target are dropped (after an exception).
  ~OpPipe() override;
  OpPipe(const OpPipe&) = delete;
  OpPipe& operator=(const OpPipe&) = delete;

  // Rethrows, on the generator's thread, an exception the target threw for an earlier op.
  void OnOp(workload::Op&& op) override;
  workload::Op TakeSpareOp() override;

  // Hands over the last ops and waits until the target has taken every op given so far; then
  // rethrows the target's exception, if it threw one. Call it after the generator returns, and
  // also when the generator throws: the target's exception, for an earlier op, comes first.
  void Drain();

 private:
  using Batch = std::vector<workload::Op>;
  void Send();   // hands `filling_` to the thread
  void Feed();   // the thread's loop

  workload::OpSink& target_;
  // The generator's thread only:
  Batch filling_;  // ops not yet handed over
  Batch spare_;    // spent ops to fill again
  Batch blank_;    // an emptied batch, to fill next
  // Shared, under mutex_:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> full_;      // for the thread, in order
  std::deque<Batch> returned_;  // spent ops, from the thread
  std::size_t busy_ = 0;        // batches handed over and not yet fed entirely
  bool closing_ = false;
  // The target's exception; once set, no op is fed to the target again.
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace memsim::engine
