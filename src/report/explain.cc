#include "report/explain.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <unordered_map>

#include <fmt/core.h>

#include "core/check.h"
#include "device/communicators.h"
#include "engine/recorder.h"
#include "report/format.h"
#include "workload/build.h"
#include "workload/model.h"
#include "workload/recompute.h"

namespace memsim::report {
namespace {

// The Recorder's spans plus what only `explain` needs. Tensors are tracked by id; the map is only
// looked up, never iterated (determinism).
class ExplainObserver final : public engine::Observer {
 public:
  void OnOpBoundary(const engine::OpBoundary& b) override {
    const workload::Op& op = *b.op;
    const size_t spans_before = recorder_.spans().size();
    const Bytes peak_before = spans_before > 0 ? recorder_.spans().back().peak_allocated_bytes : 0;
    recorder_.OnOpBoundary(b);
    SpanFacts& f = Facts(op.iteration);
    if (b.at_start) {
      for (std::string& group : pending_communicators_) {
        f.communicators.push_back({op.iteration, op.phase, std::move(group)});
      }
      pending_communicators_.clear();
    } else {
      for (workload::TensorId id : op.frees) {
        live_activations_.erase(id);
        DropFromForward(op, id);
      }
    }
    if (b.reserved_bytes != last_reserved_) {
      f.reserved_changes.push_back(
          {op.iteration, op.phase, op.micro_batch, op.name, b.reserved_bytes - last_reserved_,
           op.empty_cache && !b.at_start});
      last_reserved_ = b.reserved_bytes;
    }
    const timeline::SpanSummary& s = recorder_.spans().back();
    if (recorder_.spans().size() != spans_before || s.peak_allocated_bytes > peak_before) {
      std::vector<int> in_flight;
      for (int mb : activation_micro_batches_) {
        if (live_per_micro_batch_[mb] > 0) in_flight.push_back(mb);
      }
      f.micro_batches_in_flight_at_peak = in_flight;
      f.reserved_at_peak_bytes = b.reserved_bytes;
    }
  }

  void OnCommunicatorCreated(SimTimeUs time_us, const std::string& group) override {
    recorder_.OnCommunicatorCreated(time_us, group);
    pending_communicators_.push_back(group);  // placed at the op that created it (next boundary)
  }

  void OnTensorAllocated(const workload::Op& op, const workload::TensorAlloc& t,
                         Bytes block_bytes) override {
    SpanFacts& f = Facts(op.iteration);
    f.first_allocated_in.emplace(t.category, op.phase);
    if (t.category != Category::kActivations) return;
    if (op.micro_batch >= 0) {
      live_activations_[t.id] = {op.micro_batch, block_bytes};
      if (live_per_micro_batch_.emplace(op.micro_batch, 0).second) {
        activation_micro_batches_.insert(
            std::upper_bound(activation_micro_batches_.begin(), activation_micro_batches_.end(),
                             op.micro_batch),
            op.micro_batch);
      }
      live_per_micro_batch_[op.micro_batch] += block_bytes;
    }
    if (op.phase != Phase::kForward || op.micro_batch < 0) return;
    if (f.first_micro_batch < 0) f.first_micro_batch = op.micro_batch;
    if (op.micro_batch == f.first_micro_batch) {
      f.activation_bytes_by_layer[op.layer] += block_bytes;
      first_forward_[t.id] = {op.iteration, op.micro_batch, op.layer, block_bytes};
    }
  }

  engine::Recorder& recorder() { return recorder_; }

  // REQUIRES: recorder().Finish() was called.
  std::vector<SpanFacts> TakeFacts() {
    std::vector<SpanFacts> out;
    for (const timeline::SpanSummary& s : recorder_.spans()) out.push_back(Facts(s.iteration));
    return out;
  }

 private:
  struct LiveActivation {
    int micro_batch = -1;
    Bytes block_bytes = 0;
  };
  // An activation the first forward micro-batch of a span allocated, not yet freed.
  struct ForwardActivation {
    int iteration = 0;
    int micro_batch = -1;
    int layer = -1;
    Bytes block_bytes = 0;
  };
  // A tensor the forward frees again (a temporary; under full recompute everything a
  // checkpointed layer makes but its output) is not saved for backward: its bytes leave the
  // layer's figure. Freed later (by the backward) it was saved, and stays counted.
  void DropFromForward(const workload::Op& op, workload::TensorId id) {
    const auto it = first_forward_.find(id);
    if (it == first_forward_.end()) return;
    const ForwardActivation a = it->second;
    first_forward_.erase(it);
    if (op.phase == Phase::kForward && op.micro_batch == a.micro_batch) {
      Facts(a.iteration).activation_bytes_by_layer[a.layer] -= a.block_bytes;
    }
  }
  SpanFacts& Facts(int iteration) {
    auto [it, inserted] = facts_.try_emplace(iteration);
    if (inserted) it->second.iteration = iteration;
    return it->second;
  }

  engine::Recorder recorder_{true};
  std::map<int, SpanFacts> facts_;
  std::vector<std::string> pending_communicators_;
  Bytes last_reserved_ = 0;
  // Live activation tensors by id; erase keeps the bytes per micro-batch in step.
  class LiveActivations {
   public:
    explicit LiveActivations(std::map<int, Bytes>& per_mb) : per_mb_(per_mb) {}
    LiveActivation& operator[](workload::TensorId id) { return by_id_[id]; }
    void erase(workload::TensorId id) {
      auto it = by_id_.find(id);
      if (it == by_id_.end()) return;
      per_mb_[it->second.micro_batch] -= it->second.block_bytes;
      by_id_.erase(it);
    }

   private:
    std::map<int, Bytes>& per_mb_;
    std::unordered_map<workload::TensorId, LiveActivation> by_id_;
  };
  std::unordered_map<workload::TensorId, ForwardActivation> first_forward_;  // looked up only
  std::map<int, Bytes> live_per_micro_batch_;
  std::vector<int> activation_micro_batches_;  // sorted
  LiveActivations live_activations_{live_per_micro_batch_};
};

std::string SpanName(int iteration) {
  return iteration == 0 ? std::string("init") : fmt::format("iteration {}", iteration);
}

std::string Where(Phase phase, int micro_batch) {
  std::string w(PhaseName(phase));
  if (micro_batch >= 0) w += fmt::format(" mb{}", micro_batch);
  return w;
}

// "optimizer.step()" reads better than "optimizer_step" in a sentence.
std::string PhaseInWords(Phase phase) {
  switch (phase) {
    case Phase::kInit: return "init";
    case Phase::kForward: return "forward pass";
    case Phase::kBackward: return "backward pass";
    case Phase::kOptimizerStep: return "optimizer.step()";
    case Phase::kUnknown: break;
  }
  return "an unknown phase";
}

Bytes Cat(const CategoryBytes& c, Category k) { return c[static_cast<size_t>(k)]; }

// Appends `text` wrapped at `width` columns: the first line at `indent`, the rest 2 further.
// A size ("8.46 GiB") is never split across lines.
void Wrapped(std::string* out, std::string_view raw, int indent, int width) {
  std::string text(raw);
  for (std::string_view unit : {" GiB", " MiB", " KiB"}) {
    for (size_t p = text.find(unit); p != std::string::npos; p = text.find(unit, p + 1)) text[p] = '\x01';
  }
  const std::string_view view = text;
  const size_t start = out->size();
  std::string line(static_cast<size_t>(indent), ' ');
  const size_t first_len = line.size();
  size_t pos = 0;
  while (pos < view.size()) {
    size_t end = view.find(' ', pos);
    if (end == std::string_view::npos) end = view.size();
    const std::string_view word = view.substr(pos, end - pos);
    const bool empty = line.size() == first_len || line.find_first_not_of(' ') == std::string::npos;
    if (!empty && static_cast<int>(line.size() + 1 + word.size()) > width) {
      *out += line + "\n";
      line = std::string(static_cast<size_t>(indent + 2), ' ');
      line += word;
    } else {
      if (!empty) line += ' ';
      line += word;
    }
    pos = end + 1;
  }
  *out += line + "\n";
  std::replace(out->begin() + static_cast<std::ptrdiff_t>(start), out->end(), '\x01', ' ');
}

// The span's kept changes: category, bytes, and where in the span it was first allocated.
std::string KeptSentence(const timeline::SpanSummary& s, const SpanFacts& f) {
  std::vector<std::pair<Bytes, Category>> kept;
  for (int c = 0; c < kNumCategories; ++c) {
    const Category k = static_cast<Category>(c);
    const Bytes d = Cat(s.end_by_category, k) - Cat(s.start_by_category, k);
    if (std::abs(d) >= kMiB) kept.emplace_back(d, k);
  }
  std::stable_sort(kept.begin(), kept.end(),
                   [](const auto& a, const auto& b) { return std::abs(a.first) > std::abs(b.first); });
  if (kept.empty()) return "nothing new is kept: allocated ends where it started";
  std::string out = "kept after the span: ";
  bool first = true;
  for (const auto& [d, k] : kept) {
    if (!first) out += "; ";
    first = false;
    out += fmt::format("{} {}", SignedHuman(d), CategoryName(k));
    auto where = f.first_allocated_in.find(k);
    if (d > 0 && where != f.first_allocated_in.end()) {
      out += s.iteration == 0 ? std::string(", created in init")
                              : fmt::format(", created inside {}'s {}", SpanName(s.iteration),
                                            PhaseInWords(where->second));
    }
  }
  return out;
}

// Bytes over a set of layers (or checkpoints): count, smallest, largest, sum, layer range.
struct LayerSpread {
  int count = 0, first_layer = -1, last_layer = -1;
  Bytes lo = 0, hi = 0, total = 0;
  void Add(int first, int last, Bytes bytes) {
    if (count == 0 || first < first_layer) first_layer = first;
    last_layer = std::max(last_layer, last);
    lo = count == 0 ? bytes : std::min(lo, bytes);
    hi = count == 0 ? bytes : std::max(hi, bytes);
    total += bytes;
    ++count;
  }
  std::string Range() const {
    return lo == hi ? HumanBytes(lo) : fmt::format("{} to {}", HumanBytes(lo), HumanBytes(hi));
  }
};

// What the first forward micro-batch keeps, split as the Program runs the layers
// (workload/recompute.h RecomputeRuns, the runs of each model chunk): a full-recompute
// checkpoint keeps only its input (attributed to the layer that made it: the previous run's
// last layer, or the embedding outside the layers), so its bytes are summed per checkpoint;
// the other layers (no recompute, selective, block's remainder) per layer.
struct LayerGroups {
  LayerSpread checkpoints, saved;
  Bytes outside = 0;
};
LayerGroups GroupLayers(const config::Setup& setup, const SpanFacts& f) {
  const workload::ModelDims d = workload::ComputeDims(setup);
  LayerGroups g;
  std::map<int, std::pair<int, Bytes>> by_checkpoint;  // first layer -> (last layer, bytes)
  for (const auto& [layer, bytes] : f.activation_bytes_by_layer) {
    if (layer < 0) {
      g.outside += bytes;
      continue;
    }
    // The layer's position in its model chunk (an uneven split's stages differ in length).
    const int i = d.IndexInChunk(layer), chunk_start = layer - i;
    const std::vector<workload::LayerRun> runs =
        workload::RecomputeRuns(setup.training, std::max(1, d.ChunkLayersAt(layer)));
    const auto run = std::find_if(runs.begin(), runs.end(),
                                  [i](const workload::LayerRun& r) { return i >= r.first && i <= r.last; });
    if (run == runs.end() || !run->checkpointed) {
      g.saved.Add(layer, layer, bytes);
      continue;
    }
    auto& [last, sum] = by_checkpoint[chunk_start + run->first];
    last = chunk_start + run->last;
    sum += bytes;
  }
  for (const auto& [first, last_and_bytes] : by_checkpoint) {
    g.checkpoints.Add(first, last_and_bytes.first, last_and_bytes.second);
  }
  return g;
}

// Full recompute (recompute.h): what the checkpoints keep, and how the layers are grouped.
std::string CheckpointedPart(const config::TrainingConfig& t, const LayerSpread& c) {
  const int layers = std::max(1, t.recompute_num_layers);
  const char* plural = layers == 1 ? "" : "s";
  return fmt::format(
      "keeps only the input of each full-recompute checkpoint ({}; re-run by its backward): {} per "
      "checkpoint in layers {}..{} ({})",
      t.recompute_method == config::RecomputeMethod::kUniform
          ? fmt::format("uniform, {} layer{} per checkpoint", layers, plural)
          : fmt::format("block, the first {} layer{} of each model chunk one by one", layers, plural),
      c.Range(), c.first_layer, c.last_layer, HumanBytes(c.total));
}

// The layers that run with grad: everything their forward saves for backward.
std::string SavedPart(const config::TrainingConfig& t, const LayerSpread& s) {
  std::string modules;
  if (t.recompute_granularity == config::RecomputeGranularity::kSelective) {
    for (const std::string& m : t.recompute_modules) modules += (modules.empty() ? "" : ", ") + m;
  }
  return fmt::format("saves {} per layer in layers {}..{} ({}{})", s.Range(), s.first_layer,
                     s.last_layer, HumanBytes(s.total),
                     modules.empty() ? "" : "; selective recompute of " + modules);
}

// Activations: how much one micro-batch saves, per layer, and how many are in flight at the peak.
std::string ActivationSentence(const config::Setup& setup, const timeline::SpanSummary& s,
                               const SpanFacts& f) {
  const Bytes at_peak = Cat(s.by_category_at_peak, Category::kActivations);
  std::string out = fmt::format("activations at the peak ({}): {}", Where(s.peak_phase, s.peak_micro_batch),
                                HumanBytes(at_peak));
  const size_t n = f.micro_batches_in_flight_at_peak.size();
  if (n == 1) {
    out += fmt::format(", of one micro-batch (mb{})", f.micro_batches_in_flight_at_peak[0]);
  } else if (n > 1) {
    out += fmt::format(", of {} micro-batches in flight (mb{}..mb{})", n,
                       f.micro_batches_in_flight_at_peak.front(),
                       f.micro_batches_in_flight_at_peak.back());
  }
  if (f.first_micro_batch < 0) return out;
  const LayerGroups g = GroupLayers(setup, f);
  std::vector<std::string> parts;
  if (g.checkpoints.count > 0) parts.push_back(CheckpointedPart(setup.training, g.checkpoints));
  if (g.saved.count > 0) parts.push_back(SavedPart(setup.training, g.saved));
  if (g.outside > 0 || parts.empty()) {
    parts.push_back(parts.empty() ? "saves " + HumanBytes(g.outside)
                                  : HumanBytes(g.outside) + " outside the layers");
  }
  // The breakdown is of the first micro-batch the span runs; when the peak holds another one,
  // say so rather than mix two micro-batch numbers in one sentence.
  const bool same = n == 1 && f.micro_batches_in_flight_at_peak[0] == f.first_micro_batch;
  out += same ? std::string("; its forward ")
              : fmt::format("; each micro-batch's forward (counted on mb{}) ", f.first_micro_batch);
  for (size_t i = 0; i < parts.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  }
  out += parts.size() > 1 ? ", all freed by its backward" : ", freed by its backward";
  return out;
}

// Where reserved memory went back to the device: the program's empty_cache() calls, or the
// caching allocator's own release. When a device allocation fails, DeviceCachingAllocator::malloc
// frees every cached unused segment and retries (PyTorch c10/cuda/CUDACachingAllocator.cpp
// release_cached_blocks after alloc_block fails; torch_npu NPUCachingAllocator.cpp the same);
// with garbage_collection_threshold it also frees old cached blocks before allocating
// (garbage_collect_cached_blocks).
std::string ReleasedClause(Bytes by_empty_cache, Bytes by_allocator, bool cuda, bool gc) {
  std::string out;
  if (by_empty_cache > 0) {
    out += fmt::format("; {} released by {}", HumanBytes(by_empty_cache),
                       cuda ? "torch.cuda.empty_cache()" : "torch.npu.empty_cache()");
  }
  if (by_allocator > 0) {
    out += fmt::format(
        "; {} released by the caching allocator itself: {}", HumanBytes(by_allocator),
        gc ? "garbage_collection_threshold frees old cached blocks, and a failed device "
             "allocation frees every cached unused segment before its retry"
           : fmt::format("a {} failed, so it freed every cached unused segment and retried "
                         "(no empty_cache() call)",
                         cuda ? "cudaMalloc" : "aclrtMalloc"));
  }
  return out;
}

std::string ReservedSentence(const timeline::SpanSummary& s, const SpanFacts& f, bool cuda, bool gc) {
  Bytes grown = 0, released = 0, released_by_empty_cache = 0;
  int grow_ops = 0;
  const ReservedChange* largest = nullptr;
  for (const ReservedChange& c : f.reserved_changes) {
    if (c.bytes > 0) {
      grown += c.bytes;
      ++grow_ops;
      if (!largest || c.bytes > largest->bytes) largest = &c;
    } else if (c.empty_cache) {
      released_by_empty_cache -= c.bytes;
    } else {
      released -= c.bytes;
    }
  }
  std::string out;
  if (grow_ops == 0) {
    out = "reserved: no new segment; every request was served from a cached block";
  } else {
    out = fmt::format("reserved: new segments of {} at {} op{}, the largest {} at {} ({})",
                      HumanBytes(grown), grow_ops, grow_ops == 1 ? "" : "s", HumanBytes(largest->bytes),
                      largest->op, Where(largest->phase, largest->micro_batch));
  }
  out += ReleasedClause(released_by_empty_cache, released, cuda, gc);
  out += fmt::format("; at the allocated peak {} of {} reserved is cached, not allocated",
                     HumanBytes(f.reserved_at_peak_bytes - s.peak_allocated_bytes),
                     HumanBytes(f.reserved_at_peak_bytes));
  return out;
}

std::string DeviceSentence(const ExplainFacts& x, const timeline::SpanSummary& s, const SpanFacts& f) {
  const char* smi = x.npu ? "npu-smi" : "nvidia-smi";
  std::string out;
  if (s.iteration == 0) {
    out = fmt::format("{} adds the idle baseline {} and this process's runtime context {} (from the "
                      "first device call)",
                      smi, HumanBytes(x.idle_baseline_bytes), HumanBytes(x.context_bytes));
  }
  if (!f.communicators.empty()) {
    out += out.empty() ? fmt::format("{} adds ", smi) : std::string("; then ");
    std::string list;
    std::set<Bytes> sizes;
    for (const CommunicatorCreated& c : f.communicators) {
      const auto it = x.communicator_bytes.find(c.group);
      sizes.insert(it == x.communicator_bytes.end() ? 0 : it->second);
    }
    for (const CommunicatorCreated& c : f.communicators) {
      if (!list.empty()) list += ", ";
      list += fmt::format("{} ({}", c.group, PhaseName(c.phase));
      const auto it = x.communicator_bytes.find(c.group);
      if (sizes.size() > 1 && it != x.communicator_bytes.end()) {
        list += ", " + HumanBytes(it->second);
      }
      list += ")";
    }
    if (sizes.size() == 1) {
      out += fmt::format("{} communicator{} of {} each at the first collective of its group: {}",
                         f.communicators.size(), f.communicators.size() == 1 ? "" : "s",
                         HumanBytes(*sizes.begin()), list);
    } else {
      out += fmt::format("{} communicators at the first collective of each group: {}",
                         f.communicators.size(), list);
    }
  }
  if (!out.empty()) out += fmt::format("; peak {} {}", smi, HumanBytes(s.peak_device_bytes));
  return out;
}

// The iteration from which reserved never grows again (0 if it grows in the last one).
int SteadyFrom(const ExplainFacts& x) {
  int steady = 0;
  for (size_t i = x.spans.size(); i-- > 0;) {
    bool grows = false;
    for (const ReservedChange& c : x.span_facts[i].reserved_changes) grows = grows || c.bytes > 0;
    if (grows || x.spans[i].iteration == 0) break;
    steady = x.spans[i].iteration;
  }
  return steady;
}

Bytes GrowthOf(const SpanFacts& f) {
  Bytes g = 0;
  for (const ReservedChange& c : f.reserved_changes) g += std::max<Bytes>(0, c.bytes);
  return g;
}

// The seed's two questions, when iteration 1 created optimizer state and a second iteration ran.
std::string SeedAnswers(const ExplainFacts& x, int width) {
  const timeline::SpanSummary* it1 = nullptr;
  const timeline::SpanSummary* it2 = nullptr;
  const SpanFacts* f1 = nullptr;
  const SpanFacts* f2 = nullptr;
  for (size_t i = 0; i < x.spans.size(); ++i) {
    if (x.spans[i].iteration == 1) it1 = &x.spans[i], f1 = &x.span_facts[i];
    if (x.spans[i].iteration == 2) it2 = &x.spans[i], f2 = &x.span_facts[i];
  }
  if (!it1 || !it2) return "";
  const Bytes state = Cat(it1->end_by_category, Category::kOptimizerStates) -
                      Cat(it1->start_by_category, Category::kOptimizerStates);
  auto where = f1->first_allocated_in.find(Category::kOptimizerStates);
  if (state < kMiB || where == f1->first_allocated_in.end()) return "";
  const Phase p = it2->peak_phase;
  const timeline::PhasePeak& p1 = it1->PeakOf(p);
  const timeline::PhasePeak& p2 = it2->PeakOf(p);
  if (!p1.seen || !p2.seen) return "";
  std::string out = "\nwhy iteration 2 differs from iteration 1\n";
  const Bytes a1 = Cat(p1.by_category, Category::kActivations);
  const Bytes a2 = Cat(p2.by_category, Category::kActivations);
  const Bytes growth2 = GrowthOf(*f2);
  std::string twice;
  if (std::abs(a2 - a1) <= std::max<Bytes>(64 * kMiB, a1 / 100)) {
    twice = fmt::format(
        "Are activations stored twice? No. At the {} peak iteration 2 holds {} of activations and "
        "iteration 1 held {}: one iteration's worth each, because iteration 1's activations were "
        "freed by its backward and iteration 2's reuse those cached blocks",
        PhaseName(p), HumanBytes(a2), HumanBytes(a1));
    twice += growth2 < a2 ? fmt::format(" (its new segments, {}, are less than its activations).",
                                        HumanBytes(growth2))
                          : ".";
  } else {
    twice = fmt::format(
        "At the {} peak iteration 2 holds {} of activations and iteration 1 held {}: the "
        "difference, {}, is how the schedule differs between them, not a second copy.",
        PhaseName(p), HumanBytes(a2), HumanBytes(a1), SignedHuman(a2 - a1));
  }
  Wrapped(&out, twice, 2, width);
  Wrapped(&out,
          fmt::format("Why does allocated rise? Iteration 2 starts at {} instead of {}: the {} of "
                      "{} created inside iteration 1's optimizer.step() (Adam's "
                      "exp_avg and exp_avg_sq, created lazily at the first step) never leave.",
                      HumanBytes(it2->start_allocated_bytes), HumanBytes(it1->start_allocated_bytes),
                      HumanBytes(state), CategoryName(Category::kOptimizerStates)),
          2, width);
  const int steady = SteadyFrom(x);
  std::string resv = fmt::format(
      "Why does reserved grow in iteration 2? The step placed its state partly in cached blocks "
      "that served iteration 1; iteration 2 repeats iteration 1's requests, and those that no "
      "longer fit a cached block map new segments: {} in iteration 2.",
      HumanBytes(growth2));
  if (steady > 0) {
    resv += fmt::format(
        " From iteration {} on every request fits a cached block, so reserved stops growing "
        "at {}.",
        steady, HumanBytes(x.spans.back().end_reserved_bytes));
  } else {
    resv += " Reserved still grows in the last simulated iteration: run more (--iterations).";
  }
  Wrapped(&out, resv, 2, width);
  return out;
}

}  // namespace

std::string FormatStageComparison(const config::Setup& setup, const engine::RunResult& run) {
  if (run.stages.size() <= 1) return "";
  const config::TrainingConfig& t = setup.training;
  const std::vector<int> layers = config::StageLayerCounts(setup.model, t);
  const int p = static_cast<int>(run.stages.size());
  const bool interleaved = t.num_layers_per_virtual_pipeline_stage > 0;
  int heaviest = 0;
  std::string list;
  for (const engine::StageResult& s : run.stages) {
    const int r = s.pipeline_rank;
    if (s.peak_allocated_bytes > run.stages[static_cast<std::size_t>(heaviest)].peak_allocated_bytes) {
      heaviest = r;
    }
    const workload::StaticSizes sizes = workload::ComputeStaticSizes(setup, r);
    const Bytes state = sizes.parameter_bytes + sizes.gradient_bytes + sizes.main_param_bytes +
                        sizes.optimizer_state_bytes;
    std::string holds = fmt::format("{} layers", layers[static_cast<std::size_t>(r)]);
    if (r == 0) holds += " + embedding";
    if (r == p - 1) holds += " + output layer and loss";
    list += fmt::format("{}stage {}: peak {} ({}; weights, grads and optimizer state {}{})",
                        list.empty() ? "" : "; ", r, HumanBytes(s.peak_allocated_bytes), holds,
                        HumanBytes(state),
                        interleaved ? ""
                                    : fmt::format("; {} micro-batches in flight",
                                                  std::max(1, std::min(p - r, t.num_micro_batches))));
  }
  const engine::StageResult& top = run.stages[static_cast<std::size_t>(heaviest)];
  const Bytes act = top.by_category_at_peak[static_cast<std::size_t>(Category::kActivations)];
  const std::string why = fmt::format(": at its peak {} are activations and {} the rest",
                                      HumanBytes(act), HumanBytes(top.peak_allocated_bytes - act));
  return fmt::format("the heaviest pipeline stage is stage {}{} ({})", heaviest, why, list);
}

ExplainFacts CollectExplainFacts(const config::Setup& setup, int pipeline_rank,
                                 const engine::SimulateOptions& options) {
  MEMSIM_CHECK(pipeline_rank >= 0 && pipeline_rank < setup.training.pipeline_model_parallel_size);
  const workload::Program program = workload::Build(setup, pipeline_rank);
  ExplainObserver observer;
  const engine::SimulateResult result = engine::Simulate(program, setup, options, observer);
  observer.recorder().Finish();
  ExplainFacts x;
  x.pipeline_rank = pipeline_rank;
  x.num_stages = setup.training.pipeline_model_parallel_size;
  x.spans = observer.recorder().spans();
  x.span_facts = observer.TakeFacts();
  x.inactive_split_bytes_at_end = result.allocator_stats.inactive_split_bytes.current;
  x.idle_baseline_bytes = setup.device.idle_baseline_bytes;
  x.context_bytes = device::ContextBytes(setup);
  std::map<std::string, int> groups;
  for (const workload::Op& op : program.ops) {
    if (!op.collective_group.empty()) groups.emplace(op.collective_group, op.collective_ranks);
  }
  for (const auto& [group, ranks] : groups) {
    x.communicator_bytes[group] =
        device::CommunicatorBytes(setup.device, setup.training.env, group, ranks);
  }
  x.outside_allocator_lines = device::DescribeOutsideAllocator(setup, groups);
  x.npu = setup.device.allocator_backend == alloc::Backend::kNpu;
  return x;
}

std::string FormatExplanation(const config::Setup& setup, const ExplainFacts& x, int width) {
  MEMSIM_CHECK(width >= 40);
  const bool cuda = !x.npu;
  std::string out = fmt::format("memsim explain: pipeline stage {} of {} on {}, init and {} iterations\n",
                                x.pipeline_rank, x.num_stages, setup.device.name,
                                x.spans.empty() ? 0 : x.spans.back().iteration);
  out += x.long_run;
  if (!x.stages.empty()) Wrapped(&out, x.stages, 0, width);
  for (size_t i = 0; i < x.spans.size(); ++i) {
    const timeline::SpanSummary& s = x.spans[i];
    const SpanFacts& f = x.span_facts[i];
    out += "\n";
    Wrapped(&out,
            fmt::format("{}: allocated {} -> {}, peak {} at {}{}", SpanName(s.iteration),
                        HumanBytes(s.start_allocated_bytes), HumanBytes(s.end_allocated_bytes),
                        HumanBytes(s.peak_allocated_bytes), Where(s.peak_phase, s.peak_micro_batch),
                        s.peak_op.empty() ? "" : fmt::format(" ({})", s.peak_op)),
            0, width);
    Wrapped(&out, KeptSentence(s, f), 2, width);
    if (s.iteration == 0) {
      const Bytes transient = s.peak_allocated_bytes - s.end_allocated_bytes;
      if (transient >= kMiB) {
        Wrapped(&out,
                fmt::format("the peak is {} above what init keeps: copies held for a moment "
                            "(weights moved into buffers, cloned master shards) and freed before "
                            "init ends",
                            HumanBytes(transient)),
                2, width);
      }
    } else {
      Wrapped(&out, ActivationSentence(setup, s, f), 2, width);
    }
    Wrapped(&out,
            ReservedSentence(s, f, cuda, setup.allocator.garbage_collection_threshold > 0.0), 2,
            width);
    const std::string device = DeviceSentence(x, s, f);
    if (!device.empty()) Wrapped(&out, device, 2, width);
  }
  if (!x.spans.empty()) {
    out += "\n";
    const int steady = SteadyFrom(x);
    const timeline::SpanSummary& last = x.spans.back();
    std::string s = steady > 0 ? fmt::format("reserved stops growing from iteration {} on, at {}: "
                                             "every request of those iterations fits a cached block",
                                             steady, HumanBytes(last.end_reserved_bytes))
                               : fmt::format("reserved still grows in the last simulated iteration "
                                             "({}): run more iterations to see it settle",
                                             last.iteration);
    s += fmt::format("; at the end {} of free pieces of split blocks remain (inactive_split_bytes)",
                     HumanBytes(x.inactive_split_bytes_at_end));
    Wrapped(&out, s, 0, width);
  }
  if (!x.outside_allocator_lines.empty()) {
    out += "\noutside the allocator, by mechanism (device/communicators.h):\n";
    for (const std::string& line : x.outside_allocator_lines) Wrapped(&out, "- " + line, 2, width);
  }
  out += SeedAnswers(x, width);
  return out;
}

}  // namespace memsim::report
