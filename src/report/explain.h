// `memsim explain`: the simulation of one pipeline stage told in words, span by span (init, then
// each iteration): what was created and kept, what rises and falls, what reserved does and why,
// and what npu-smi / nvidia-smi add. Like ninja's `-d explain`, nothing here runs unless asked:
// `run` never builds ExplainFacts; `explain` replays the reported stage once more with an
// observer of its own (CollectExplainFacts) and formats the facts (FormatExplanation, a pure
// function). Every figure printed is a field of ExplainFacts or of its SpanSummaries; nothing is
// estimated here. Not covered: pipeline stages other than the one replayed, and memory that the
// simulation does not model (other processes, driver fragmentation).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/setup.h"
#include "engine/simulator.h"
#include "engine/stages.h"
#include "timeline/span_summary.h"

namespace memsim::report {

// One op at which reserved changed: new segments mapped (bytes > 0) or segments released
// (bytes < 0): by the op's torch.cuda.empty_cache() (`empty_cache`), else by the allocator itself
// (the retry after a failed device allocation, or garbage_collection_threshold).
struct ReservedChange {
  int iteration = 0;
  Phase phase = Phase::kInit;
  int micro_batch = -1;
  std::string op;
  Bytes bytes = 0;
  bool empty_cache = false;
};

// A communicator created by its group's first collective.
struct CommunicatorCreated {
  int iteration = 0;
  Phase phase = Phase::kInit;
  std::string group;
};

// What the span-level Recorder does not keep, per span.
struct SpanFacts {
  int iteration = 0;
  // The phase of the first allocation of each category in this span (those allocated at all).
  std::map<Category, Phase> first_allocated_in;
  // Activation bytes (block bytes) saved by the first forward micro-batch of the span, by global
  // layer index (-1: outside the transformer layers: input batch, embedding, output and loss).
  int first_micro_batch = -1;
  std::map<int, Bytes> activation_bytes_by_layer;
  // At the span's allocated peak: the micro-batches holding activations, and reserved then.
  std::vector<int> micro_batches_in_flight_at_peak;
  Bytes reserved_at_peak_bytes = 0;
  std::vector<ReservedChange> reserved_changes;  // in time order
  std::vector<CommunicatorCreated> communicators;
};

struct ExplainFacts {
  int pipeline_rank = 0;
  int num_stages = 1;
  std::vector<timeline::SpanSummary> spans;  // init, then iterations 1..N
  std::vector<SpanFacts> span_facts;         // parallel to spans
  Bytes inactive_split_bytes_at_end = 0;     // allocator gauge after the last op
  Bytes idle_baseline_bytes = 0;
  Bytes context_bytes = 0;
  std::map<std::string, Bytes> communicator_bytes;      // by group (device/communicators.h)
  std::vector<std::string> outside_allocator_lines;  // device::DescribeOutsideAllocator
  bool npu = false;
  // A long run: report::FormatLongRun of the run (the iterations simulated, from which one on
  // they repeat), printed under the first line; empty when every iteration was simulated.
  std::string long_run;
  // With pipeline stages: FormatStageComparison of the run, printed under the first line.
  std::string stages;
};

// Which pipeline stage is the heaviest and why (empty for one stage): each stage's peak
// allocated bytes, transformer layers (config::StageLayerCounts: an uneven split shows here),
// whether it holds the embedding or the output layer and loss, its weights, gradients and
// optimizer state (workload::ComputeStaticSizes), and the micro-batches whose activations
// 1F1B keeps in flight on it, min(p - r, m) (megatron/core/pipeline_parallel/schedules.py
// forward_backward_pipelining_without_interleaving: p - r - 1 warm-up forwards, then one more
// before the first backward).
std::string FormatStageComparison(const config::Setup& setup, const engine::RunResult& run);

// Replays `pipeline_rank` of `setup` with a Recorder and the explain observer.
// REQUIRES: 0 <= pipeline_rank < pipeline_model_parallel_size.
ExplainFacts CollectExplainFacts(const config::Setup& setup, int pipeline_rank,
                                 const engine::SimulateOptions& options);

// The narrative, lines wrapped at `width` columns (REQUIRES: width >= 40).
std::string FormatExplanation(const config::Setup& setup, const ExplainFacts& facts, int width);

}  // namespace memsim::report
