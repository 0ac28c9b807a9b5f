// The length of every micro-batch one data-parallel rank trains on, from the data's sample
// lengths (config/setup.h SampleData; docs/config.md, 'Sample lengths'), and the seam through
// which the workload follows it: BatchShapes sets ModelDims::s and ::T (model.h) before each
// forward and backward step, so every module sizes its tensors by the micro-batch's own length.
//
// The data loader modelled (transformers 4.4x Trainer over accelerate):
// - the sampler: each epoch a fresh random permutation of the dataset (torch RandomSampler), or
//   with group_by_length transformers/trainer_pt_utils.py get_length_grouped_indices over
//   per_device_train_batch_size × gradient_accumulation_steps (Trainer._get_train_sampler):
//   permuted, cut into mega-batches of min(N / (4·batch), 50) batches (at least 1), each sorted
//   by length, longest first, and the longest sample of all swapped to the very front;
// - batches of per_device_train_batch_size consecutive indices, dealt round robin to the
//   world_size processes (accelerate data_loader.py BatchSamplerShard, split_batches False);
//   memsim simulates process 0. The last, incomplete batch of an epoch is dropped;
// - the collator: each sample truncated to max_seq_length, the batch padded to its longest
//   sample (DataCollatorWithPadding padding=True), rounded up to pad_to_multiple_of
//   (transformers tokenization_utils_base.py _pad).
// The permutation is memsim's own (a seeded std::mt19937_64, Fisher-Yates), not torch's
// generator: the same seed gives the same run in memsim, not the same order as PyTorch.
// Lengths are in tokens, counts in samples.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "config/setup.h"
#include "workload/model.h"

namespace memsim::workload {

// The micro-batch lengths of one rank, iteration after iteration. Deterministic for a seed.
class BatchLengths {
 public:
  // REQUIRES: tc.data.Varies() (config/ validated the lengths and the batch sizes).
  BatchLengths(const config::TrainingConfig& tc, int data_parallel_rank);

  // The padded lengths of the next iteration's micro-batches, in order (num_micro_batches).
  const std::vector<int>& NextIteration();

 private:
  void NewEpoch();
  int NextBatch();

  const config::SampleData& data_;
  int seq_length_;
  int batch_;       // per_device_train_batch_size
  int world_;       // data-parallel processes
  int rank_;
  int per_iteration_;
  std::vector<int> samples_;  // the dataset's lengths, ascending
  std::vector<std::int32_t> order_;  // this epoch's order of sample indices
  std::int64_t next_batch_ = 0;      // in the epoch
  std::mt19937_64 rng_;
  std::vector<int> current_;
};

// The sampler order of one epoch (exposed for tests): a permutation of [0, lengths.size()),
// grouped by length as get_length_grouped_indices does when `group_batch` > 0.
std::vector<std::int32_t> EpochOrder(const std::vector<int>& lengths, int group_batch,
                                     std::mt19937_64& rng);

// The padded length of a batch whose longest sample is `longest`: truncated to seq_length,
// rounded up to a multiple of pad_to_multiple_of when > 0.
int PaddedLength(int longest, int seq_length, int pad_to_multiple_of);

// The micro-batch lengths of iterations 1..iterations (rank 0), [k - 1][micro_batch]; empty when
// the data's lengths do not vary (every micro-batch seq_length long).
std::vector<std::vector<int>> MicroBatchLengths(const config::TrainingConfig& tc, int iterations);

// Sets `dims`' s and T to a micro-batch's length before its forward or backward step, and back
// to seq_length after the iteration. Every part of the rank holds `dims` by reference.
class BatchShapes {
 public:
  // REQUIRES: tc.data.Varies(); `dims` outlives this.
  BatchShapes(const config::TrainingConfig& tc, ModelDims& dims);
  void BeginIteration();
  void Select(int micro_batch);
  void EndIteration();

 private:
  ModelDims& dims_;
  std::int64_t full_s_;
  BatchLengths lengths_;
  const std::vector<int>* current_ = nullptr;
};

}  // namespace memsim::workload
