#include "workload/batch_lengths.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace memsim::workload {
namespace {

// A uniform integer in [0, n) from `rng` (rejection of the top remainder: unbiased and the same
// on every standard library, unlike std::uniform_int_distribution).
std::uint64_t Below(std::uint64_t n, std::mt19937_64& rng) {
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
  std::uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % n;
}

}  // namespace

std::vector<std::int32_t> EpochOrder(const std::vector<int>& lengths, int group_batch,
                                     std::mt19937_64& rng) {
  const auto n = static_cast<std::int64_t>(lengths.size());
  std::vector<std::int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  for (std::int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates, as torch.randperm's result
    std::swap(order[static_cast<size_t>(i)],
              order[Below(static_cast<std::uint64_t>(i + 1), rng)]);
  }
  if (group_batch <= 0 || n == 0) return order;
  // get_length_grouped_indices: mega_batch_mult = min(N // (batch * 4), 50), 0 -> 1.
  const std::int64_t mult = std::max<std::int64_t>(1, std::min<std::int64_t>(n / (group_batch * 4), 50));
  const std::int64_t mega = mult * group_batch;
  const auto longer = [&](std::int32_t x, std::int32_t y) { return lengths[x] > lengths[y]; };
  size_t longest_mega = 0;
  for (std::int64_t start = 0; start < n; start += mega) {
    const auto first = order.begin() + start;
    const auto last = order.begin() + std::min(n, start + mega);
    std::stable_sort(first, last, longer);
    if (lengths[*first] > lengths[order[longest_mega]]) longest_mega = static_cast<size_t>(start);
  }
  // The mega-batch whose first element is the longest gives it to the front.
  std::swap(order[0], order[longest_mega]);
  return order;
}

int PaddedLength(int longest, int seq_length, int pad_to_multiple_of) {
  int l = std::min(longest, seq_length);  // truncation to max_length
  if (pad_to_multiple_of > 0 && l % pad_to_multiple_of != 0) {
    l = (l / pad_to_multiple_of + 1) * pad_to_multiple_of;
  }
  return l;
}

BatchLengths::BatchLengths(const config::TrainingConfig& tc, int data_parallel_rank)
    : data_(tc.data),
      seq_length_(tc.seq_length),
      batch_(tc.micro_batch_size),
      world_(tc.data_parallel_size),
      rank_(data_parallel_rank),
      per_iteration_(tc.num_micro_batches),
      rng_(tc.data.seed) {
  MEMSIM_CHECK(data_.Varies() && batch_ >= 1 && world_ >= 1 && rank_ >= 0 && rank_ < world_);
  for (const auto& [length, count] : data_.lengths) samples_.insert(samples_.end(), count, length);
  // Fewer samples than one batch of every process: the loader repeats the dataset (memsim
  // draws epochs until a batch is full).
  current_.resize(static_cast<size_t>(per_iteration_));
  NewEpoch();
}

void BatchLengths::NewEpoch() {
  const int group = data_.group_by_length ? batch_ * per_iteration_ : 0;
  order_ = EpochOrder(samples_, group, rng_);
  next_batch_ = 0;
}

// The next batch of this rank: batches rank, rank + world, ... of the epoch's order.
int BatchLengths::NextBatch() {
  const auto n = static_cast<std::int64_t>(order_.size());
  std::int64_t start = (next_batch_ * world_ + rank_) * batch_;
  if (start + batch_ > n) {
    NewEpoch();
    start = std::int64_t{rank_} * batch_;
  }
  ++next_batch_;
  int longest = 0;
  for (std::int64_t i = start; i < start + batch_; ++i) {
    // A dataset smaller than world × batch wraps around (the sampler's own repeat).
    longest = std::max(longest, samples_[static_cast<size_t>(order_[static_cast<size_t>(i % n)])]);
  }
  return PaddedLength(longest, seq_length_, data_.pad_to_multiple_of);
}

const std::vector<int>& BatchLengths::NextIteration() {
  for (int& l : current_) l = NextBatch();
  return current_;
}

std::vector<std::vector<int>> MicroBatchLengths(const config::TrainingConfig& tc, int iterations) {
  std::vector<std::vector<int>> out;
  if (!tc.data.Varies()) return out;
  BatchLengths lengths(tc, 0);
  out.reserve(static_cast<size_t>(std::max(0, iterations)));
  for (int k = 1; k <= iterations; ++k) out.push_back(lengths.NextIteration());
  return out;
}

BatchShapes::BatchShapes(const config::TrainingConfig& tc, ModelDims& dims)
    : dims_(dims), full_s_(dims.s), lengths_(tc, 0) {
  MEMSIM_CHECK(dims.cp == 1);  // config/ allows varying lengths under the Trainer only
}

void BatchShapes::BeginIteration() { current_ = &lengths_.NextIteration(); }

void BatchShapes::Select(int micro_batch) {
  MEMSIM_CHECK(current_ != nullptr && micro_batch >= 0 &&
               micro_batch < static_cast<int>(current_->size()));
  dims_.s = (*current_)[static_cast<size_t>(micro_batch)];
  dims_.T = dims_.s * dims_.b;
}

void BatchShapes::EndIteration() {
  dims_.s = full_s_;
  dims_.T = dims_.s * dims_.b;
  current_ = nullptr;
}

}  // namespace memsim::workload
