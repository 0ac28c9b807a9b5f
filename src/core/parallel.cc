#include "core/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace memsim {

int AvailableCpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

namespace {

// The state the workers and the merging thread share, under `mutex`.
class InOrderQueue {
 public:
  InOrderQueue(int n, int window) : n_(n), window_(window), done_(n), errors_(n) {}

  // The next item to work on, or -1 when there is none (all started, or stopped).
  int Take() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return stop_ || next_ >= n_ || next_ < merged_ + window_; });
    if (stop_ || next_ >= n_) return -1;
    return next_++;
  }
  void Finish(int i, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_[i] = true;
      errors_[i] = error;
      if (error) stop_ = true;
    }
    changed_.notify_all();
  }
  // Waits for item i; returns its exception (null when it succeeded).
  std::exception_ptr Wait(int i) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return static_cast<bool>(done_[i]); });
    return errors_[i];
  }
  void Merged(int i) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      merged_ = i + 1;
    }
    changed_.notify_all();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  const int n_;
  const int window_;
  int next_ = 0;    // items started: [0, next_)
  int merged_ = 0;  // items merged: [0, merged_)
  bool stop_ = false;
  std::vector<char> done_;
  std::vector<std::exception_ptr> errors_;
};

}  // namespace

void RunInOrder(int n, int threads, const std::function<void(int)>& work,
                const std::function<void(int)>& merge) {
  threads = std::min(threads, n);
  if (threads <= 1) {
    for (int i = 0; i < n; ++i) {
      work(i);
      merge(i);
    }
    return;
  }
  InOrderQueue queue(n, threads);
  auto worker = [&] {
    for (int i = queue.Take(); i >= 0; i = queue.Take()) {
      std::exception_ptr error;
      try {
        work(i);
      } catch (...) {
        error = std::current_exception();
      }
      queue.Finish(i, error);
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(threads));
  try {
    for (int t = 0; t < threads; ++t) workers.emplace_back(worker);
  } catch (const std::system_error&) {
    // No more threads to be had: those started do the work (one at least, else no thread).
    if (workers.empty()) return RunInOrder(n, 1, work, merge);
  }
  std::exception_ptr failure;
  for (int i = 0; i < n && !failure; ++i) {
    failure = queue.Wait(i);
    if (!failure) {
      try {
        merge(i);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (failure) {
      queue.Stop();
    } else {
      queue.Merged(i);
    }
  }
  for (std::thread& w : workers) w.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace memsim
