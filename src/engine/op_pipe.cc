#include "engine/op_pipe.h"

#include <utility>

namespace memsim::engine {

OpPipe::OpPipe(workload::OpSink& target) : target_(target) {
  filling_.reserve(kOpBatch);
  thread_ = std::thread([this] { Feed(); });
}

OpPipe::~OpPipe() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    full_.clear();
  }
  changed_.notify_all();
  thread_.join();
}

void OpPipe::OnOp(workload::Op&& op) {
  filling_.push_back(std::move(op));
  if (filling_.size() == kOpBatch) Send();
}

workload::Op OpPipe::TakeSpareOp() {
  if (spare_.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (returned_.empty()) return {};
    blank_ = std::move(spare_);
    spare_ = std::move(returned_.front());
    returned_.pop_front();
  }
  workload::Op op = std::move(spare_.back());
  spare_.pop_back();
  return op;
}

void OpPipe::Send() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return busy_ < kBatchesInFlight || error_; });
    if (error_) std::rethrow_exception(error_);
    ++busy_;
    full_.push_back(std::move(filling_));
  }
  changed_.notify_all();
  filling_ = std::move(blank_);
  filling_.clear();
  filling_.reserve(kOpBatch);
}

void OpPipe::Drain() {
  if (!filling_.empty()) Send();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return busy_ == 0; });
  if (error_) std::rethrow_exception(error_);
}

void OpPipe::Feed() {
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return closing_ || !full_.empty(); });
      if (closing_) return;
      batch = std::move(full_.front());
      full_.pop_front();
    }
    std::exception_ptr error;
    try {
      // Each op's place takes one of the target's spent ops (cleared, with its buffers), as the
      // generator would take one for its next op if it fed the target itself.
      for (workload::Op& op : batch) {
        target_.OnOp(std::move(op));
        op = target_.TakeSpareOp();
      }
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error) {
        // The ops after the one the target failed on are never fed, as they would not be if
        // the generator fed the target itself (it would have stopped at the exception).
        error_ = error;
        full_.clear();
        busy_ = 0;
      } else {
        // The generator takes about one spent op per op it sends; more are dropped here.
        if (returned_.size() < kBatchesInFlight) returned_.push_back(std::move(batch));
        --busy_;
      }
    }
    changed_.notify_all();
  }
}

}  // namespace memsim::engine
