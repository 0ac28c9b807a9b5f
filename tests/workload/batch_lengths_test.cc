// The micro-batch lengths of data of varying sample lengths (workload/batch_lengths.h), and the
// workload following them: each step's tensors sized by its micro-batch's length.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "engine/simulator.h"
#include "engine/stages.h"
#include "test_setups.h"
#include "workload/batch_lengths.h"
#include "workload/build.h"

namespace memsim::workload {
namespace {

config::TrainingConfig Data(std::vector<std::pair<int, std::int64_t>> lengths, int batch, int ga) {
  config::TrainingConfig tc;
  tc.seq_length = 1024;
  tc.micro_batch_size = batch;
  tc.num_micro_batches = ga;
  tc.data.lengths = std::move(lengths);
  return tc;
}

TEST_CASE("a batch is padded to its longest sample, truncated to max_seq_length, rounded up to "
          "pad_to_multiple_of", "[workload][batch_lengths]") {
  CHECK(PaddedLength(100, 1024, 0) == 100);
  CHECK(PaddedLength(2000, 1024, 0) == 1024);  // truncation=True, max_length=1024
  CHECK(PaddedLength(100, 1024, 64) == 128);   // _pad: (100 // 64 + 1) * 64
  CHECK(PaddedLength(128, 1024, 64) == 128);   // already a multiple
  CHECK(PaddedLength(1000, 1000, 64) == 1024); // the multiple may exceed max_length, as in _pad
}

TEST_CASE("each epoch's order is a permutation of the dataset", "[workload][batch_lengths]") {
  std::vector<int> lengths(97);
  for (int i = 0; i < 97; ++i) lengths[static_cast<size_t>(i)] = i + 1;
  std::mt19937_64 rng(7);
  std::vector<std::int32_t> order = EpochOrder(lengths, 0, rng);
  std::sort(order.begin(), order.end());
  for (int i = 0; i < 97; ++i) CHECK(order[static_cast<size_t>(i)] == i);
}

TEST_CASE("group_by_length sorts each mega-batch longest first and puts the longest sample first",
          "[workload][batch_lengths]") {
  // 400 samples, group batch 2: mega_batch_mult = min(400 // (2 * 4), 50) = 50, mega-batches of
  // 100 (get_length_grouped_indices).
  std::vector<int> lengths(400);
  for (int i = 0; i < 400; ++i) lengths[static_cast<size_t>(i)] = 1 + (i * 37) % 400;
  std::mt19937_64 rng(3);
  const std::vector<std::int32_t> order = EpochOrder(lengths, 2, rng);
  CHECK(lengths[static_cast<size_t>(order[0])] == 400);
  for (size_t m = 0; m < 4; ++m) {
    for (size_t i = m * 100 + 2; i < (m + 1) * 100; ++i) {
      // Descending within a mega-batch (its first element may be the swapped one).
      CHECK(lengths[static_cast<size_t>(order[i - 1])] >= lengths[static_cast<size_t>(order[i])]);
    }
  }
}

TEST_CASE("the micro-batch lengths are the same for a seed and cover the dataset each epoch",
          "[workload][batch_lengths]") {
  // Four samples 10, 20, 30, 40; batches of 2, two micro-batches a step: each step is one epoch,
  // its two batches a partition of the four samples. One batch holds 40; the other's longest is
  // 20 (with 10) or 30: never 10, and 40 exactly once.
  config::TrainingConfig tc = Data({{10, 1}, {20, 1}, {30, 1}, {40, 1}}, 2, 2);
  tc.data.seed = 5;
  const std::vector<std::vector<int>> a = MicroBatchLengths(tc, 50);
  REQUIRE(a.size() == 50);
  std::set<int> others;
  for (const std::vector<int>& step : a) {
    REQUIRE(step.size() == 2);
    CHECK(std::count(step.begin(), step.end(), 40) == 1);
    others.insert(step[0] == 40 ? step[1] : step[0]);
  }
  CHECK(others == std::set<int>{20, 30});  // both partitions happen over 50 epochs
  CHECK(MicroBatchLengths(tc, 50) == a);   // deterministic
  tc.data.seed = 6;
  CHECK(MicroBatchLengths(tc, 50) != a);
}

TEST_CASE("padding to max_length or packing keeps every micro-batch max_seq_length long",
          "[workload][batch_lengths]") {
  config::TrainingConfig tc = Data({{10, 3}, {700, 1}}, 2, 2);
  CHECK(tc.data.Varies());
  tc.data.padding = config::SampleData::Padding::kMaxLength;
  CHECK_FALSE(tc.data.Varies());
  CHECK(MicroBatchLengths(tc, 3).empty());
  tc.data.padding = config::SampleData::Padding::kLongest;
  tc.data.packing = true;
  CHECK_FALSE(tc.data.Varies());
}

// Bytes the op named `name` allocates in iteration k.
Bytes AllocatedBy(const Program& p, const std::string& name, int iteration) {
  Bytes sum = 0;
  for (const Op& op : p.ops) {
    if (op.iteration != iteration || op.name != name) continue;
    for (const TensorAlloc& t : op.allocs) sum += t.size_bytes;
  }
  return sum;
}

TEST_CASE("each step's activations follow its micro-batch's length", "[workload][batch_lengths]") {
  // TinyHfLlama, one micro-batch of 1 sample per step; a dataset of one sample of 8 tokens and
  // one of 32: each epoch (two steps) has one step of each length, in a seeded order.
  config::Setup s = testing::TinyHfLlama(config::Precision::kBf16);
  s.training.train_iters = 4;
  s.training.data.lengths = {{8, 1}, {32, 1}};
  const std::vector<std::vector<int>> lengths = MicroBatchLengths(s.training, 4);
  const Program p = Build(s, 0);
  // The embedding's output, embedding.cc Embedding::Forward: [b, s, h] in the weights' bf16,
  // 2 · b · s · h = 2 · 1 · s · 64 bytes, s the step's length.
  for (int k = 1; k <= 4; ++k) {
    const int len = lengths[static_cast<size_t>(k - 1)][0];
    INFO("step " << k << " of length " << len);
    CHECK(AllocatedBy(p, "embedding.lookup", k) == Bytes{2} * len * 64);
  }
  // Each epoch of two steps holds both samples once.
  CHECK(lengths[0][0] + lengths[1][0] == 40);
  CHECK(lengths[2][0] + lengths[3][0] == 40);
}

}  // namespace
}  // namespace memsim::workload
