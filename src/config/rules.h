// Internal to config/: the cross-field rules a Setup must satisfy -- Megatron's divisibility
// rules and memsim's simulation-size limits -- as checks that read a Setup and never change it.
// Each throws InputError "<where the field was written>: <what is wrong>", naming the field
// through `origin`. The rules come in two sets because some are about derived values:
// CheckWritten runs on the Setup as read, CheckDerived after Derive (derive.h). LoadSetup runs
// CheckWritten, Derive, CheckDerived; the order of the checks inside each set is the order in
// which a config with several problems reports the first.
#pragma once

#include <cstdint>

#include "config/origin.h"
#include "config/setup.h"

namespace memsim::config::internal {

// memsim's simulation-size limits (estimates: every accepted setup simulates in about a minute
// at most; the measurement is in rules.cc and docs/config.md "Limits"): micro-batches per
// iteration, layer passes of all stages over the simulated iterations (forward passes of an
// hf-trainer evaluation count as one each), tokens of one micro-batch (an evaluation batch too).
// The hf-trainer reader (hf_trainer.cc) checks them too, where it can name the keys it read.
inline constexpr int kMaxMicroBatches = 65536;
inline constexpr std::int64_t kMaxLayerPasses = std::int64_t{1} << 21;
inline constexpr std::int64_t kMaxTokensPerMicroBatch = std::int64_t{1} << 26;

// Heads, key/value heads and FFN width divisible by TP; layers by PP and, with interleaving, by
// the virtual stages; global_batch_size by micro_batch_size × DP; the tokens of a micro-batch.
void CheckWritten(const Setup& s, const Origin& origin);

// The rules on derived values (num_micro_batches, sequence_parallel, padded_vocab_size) and those
// Megatron checks after deriving them: sequence and context parallel divisibility, learned
// positions, recompute_num_layers, memsim's size limits, gradient_accumulation_steps.
void CheckDerived(const Setup& s, const Origin& origin);

// memsim's estimate of the parameters of one rank, for its size limits (an upper bound of the
// workload's exact count; estimates only, never simulated). Per layer: QKV h × (q + 2 kv), output
// projection q × h, MLP (γ + 1) × h × ffn and up to 4 h of norms and biases, over TP; embedding
// and output layer 2 × padded vocab × h / TP (both on one stage when PP = 1) plus learned
// positions. In double: the products can pass int64. REQUIRES: Derive has run.
struct RankParameters {
  int layers_per_stage = 0;
  double per_layer = 0;
  double embedding = 0;
  double total = 0;  // layers_per_stage × per_layer + embedding
};
RankParameters EstimateRankParameters(const Setup& s);

}  // namespace memsim::config::internal
