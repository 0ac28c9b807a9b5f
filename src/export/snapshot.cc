// The memory snapshot export. Field names and meanings follow torch.cuda.memory._snapshot()
// (torch/cuda/memory.py, _snapshot; c10/cuda/CUDACachingAllocator.h SegmentInfo / BlockInfo /
// TraceEntry) and what pytorch.org/memory_viz reads (torch/utils/viz/MemoryViz.js).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

#include "core/check.h"
#include "export/exports.h"
#include "export/pickle_writer.h"

namespace memsim::exports {
namespace {

using alloc::TraceAction;

std::string_view ActionName(TraceAction a) {
  switch (a) {
    case TraceAction::kSegmentAlloc: return "segment_alloc";
    case TraceAction::kSegmentMap: return "segment_map";
    case TraceAction::kAlloc: return "alloc";
    case TraceAction::kFreeRequested: return "free_requested";
    case TraceAction::kFreeCompleted: return "free_completed";
    case TraceAction::kSegmentUnmap: return "segment_unmap";
    case TraceAction::kSegmentFree: return "segment_free";
  }
  return "alloc";
}

struct Seg {
  Bytes size_bytes = 0;
  int stream = 0;
  std::uint8_t pool = 0;
  bool expandable = false;
};
struct Blk {
  Bytes size_bytes = 0;
  Bytes requested_bytes = 0;
  bool pending = false;  // freed, waiting for stream events
  std::string tensor;
  int op = -1;
};

// The allocator's state at the end, rebuilt from its events. Mapped ranges of expandable
// segments are kept merged, so each maximal mapped range is one segment (as memory_viz draws
// expandable segments).
struct EndState {
  std::map<Bytes, Seg> segments;  // by address
  std::map<Bytes, Blk> blocks;    // live (allocated or pending) by address

  void Map(Bytes addr, const Seg& s) {
    Bytes begin = addr, end = addr + s.size_bytes;
    auto it = segments.lower_bound(begin);
    if (it != segments.begin()) {
      auto prev = std::prev(it);
      if (prev->second.expandable && prev->first + prev->second.size_bytes == begin) {
        begin = prev->first;
        it = segments.erase(prev);
      }
    }
    if (it != segments.end() && it->second.expandable && it->first == end) {
      end += it->second.size_bytes;
      segments.erase(it);
    }
    Seg merged = s;
    merged.size_bytes = end - begin;
    segments[begin] = merged;
  }
  void Unmap(Bytes addr, Bytes size) {
    auto it = segments.upper_bound(addr);
    MEMSIM_CHECK(it != segments.begin());
    --it;
    const Bytes base = it->first;
    const Seg s = it->second;
    MEMSIM_CHECK(addr + size <= base + s.size_bytes);
    segments.erase(it);
    if (addr > base) segments[base] = {addr - base, s.stream, s.pool, s.expandable};
    const Bytes end = base + s.size_bytes;
    if (addr + size < end) segments[addr + size] = {end - addr - size, s.stream, s.pool, s.expandable};
  }

  void Apply(const AllocatorEvent& e) {
    const alloc::TraceEvent& t = e.event;
    switch (t.action) {
      case TraceAction::kSegmentAlloc: segments[t.addr] = {t.size_bytes, t.stream, t.pool, false}; break;
      case TraceAction::kSegmentFree: segments.erase(t.addr); break;
      case TraceAction::kSegmentMap: Map(t.addr, {t.size_bytes, t.stream, t.pool, true}); break;
      case TraceAction::kSegmentUnmap: Unmap(t.addr, t.size_bytes); break;
      case TraceAction::kAlloc: blocks[t.addr] = {t.block_bytes, t.size_bytes, false, e.tensor, e.op}; break;
      case TraceAction::kFreeRequested: blocks[t.addr].pending = true; break;
      case TraceAction::kFreeCompleted: blocks.erase(t.addr); break;
    }
  }
};

void Frames(PickleWriter& p, const RunDetail& d, const std::string& tensor, int op) {
  p.BeginList();
  if (op >= 0) {
    const OpSlice& o = d.ops[static_cast<size_t>(op)];
    p.BeginDict();
    p.Str("filename");
    p.Str(o.name);
    p.Str("line");
    p.Int(o.iteration);
    p.Str("name");
    p.Str(tensor.empty() ? std::string(PhaseName(o.phase)) : tensor);
    p.EndDict();
  }
  p.EndList();
}

void Block(PickleWriter& p, const RunDetail& d, Bytes addr, Bytes size, Bytes requested,
           std::string_view state, const Blk* b) {
  p.BeginDict();
  p.Str("address");
  p.UInt(static_cast<std::uint64_t>(addr));
  p.Str("size");
  p.Int(size);
  p.Str("requested_size");
  p.Int(requested);
  p.Str("state");
  p.Str(state);
  p.Str("frames");
  if (b != nullptr) {
    Frames(p, d, b->tensor, b->op);
  } else {
    p.BeginList();
    p.EndList();
  }
  p.EndDict();
}

void Segment(PickleWriter& p, const RunDetail& d, const EndState& st, Bytes base, const Seg& s) {
  Bytes allocated = 0, active = 0, requested = 0;
  const Bytes end = base + s.size_bytes;
  for (auto it = st.blocks.lower_bound(base); it != st.blocks.end() && it->first < end; ++it) {
    active += it->second.size_bytes;
    if (!it->second.pending) {
      allocated += it->second.size_bytes;
      requested += it->second.requested_bytes;
    }
  }
  p.BeginDict();
  p.Str("device");
  p.Int(0);
  p.Str("address");
  p.UInt(static_cast<std::uint64_t>(base));
  p.Str("total_size");
  p.Int(s.size_bytes);
  p.Str("allocated_size");
  p.Int(allocated);
  p.Str("active_size");
  p.Int(active);
  p.Str("requested_size");
  p.Int(requested);
  p.Str("stream");
  p.Int(s.stream);
  p.Str("segment_type");
  p.Str(s.pool == 0 ? "small" : "large");
  p.Str("segment_pool_id");
  p.BeginList();  // (0, 0) in torch: the default pool; a list here (no tuples in this writer)
  p.Int(0);
  p.Int(0);
  p.EndList();
  p.Str("is_expandable");
  p.Bool(s.expandable);
  p.Str("blocks");
  p.BeginList();
  Bytes at = base;
  for (auto it = st.blocks.lower_bound(base); it != st.blocks.end() && it->first < end; ++it) {
    if (it->first > at) Block(p, d, at, it->first - at, 0, "inactive", nullptr);
    const Blk& b = it->second;
    Block(p, d, it->first, b.size_bytes, b.requested_bytes,
          b.pending ? "active_pending_free" : "active_allocated", &b);
    at = it->first + b.size_bytes;
  }
  if (at < end) Block(p, d, at, end - at, 0, "inactive", nullptr);
  p.EndList();
  p.EndDict();
}

void TraceEntry(PickleWriter& p, const RunDetail& d, const AllocatorEvent& e) {
  p.BeginDict();
  p.Str("action");
  p.Str(ActionName(e.event.action));
  p.Str("addr");
  p.UInt(static_cast<std::uint64_t>(e.event.addr));
  p.Str("size");
  p.Int(e.event.size_bytes);
  p.Str("stream");
  p.Int(e.event.stream);
  p.Str("time_us");
  p.Int(std::llround(e.time_us));
  p.Str("frames");
  Frames(p, d, e.tensor, e.op);
  p.EndDict();
}

}  // namespace

size_t SnapshotEventsKept(const RunDetail& d, int iterations) {
  if (iterations <= 0) return d.allocator_events.size();
  // The events before the first one of iteration `iterations` + 1 (events come in time order).
  for (const timeline::SpanSummary& s : d.spans) {
    if (s.iteration != iterations + 1) continue;
    size_t n = 0;
    while (n < d.allocator_events.size() && d.allocator_events[n].time_us < s.start_time_us) ++n;
    return n;
  }
  return d.allocator_events.size();
}

int DefaultSnapshotIterations(const RunDetail& d) {
  if (d.allocator_events.size() <= kSnapshotEntryBudget) return 0;
  int last = 0;
  for (const timeline::SpanSummary& s : d.spans) last = std::max(last, s.iteration);
  int n = 1;
  while (n < last && SnapshotEventsKept(d, n + 1) <= kSnapshotEntryBudget) ++n;
  return n;
}

std::string MemorySnapshotPickle(const RunDetail& d, int iterations) {
  const size_t kept = SnapshotEventsKept(d, iterations);
  EndState st;
  for (size_t i = 0; i < kept; ++i) st.Apply(d.allocator_events[i]);
  PickleWriter p;
  p.BeginDict();
  p.Str("segments");
  p.BeginList();
  for (const auto& [base, s] : st.segments) Segment(p, d, st, base, s);
  p.EndList();
  p.Str("device_traces");
  p.BeginList();
  p.BeginList();
  for (size_t i = 0; i < kept; ++i) TraceEntry(p, d, d.allocator_events[i]);
  p.EndList();
  p.EndList();
  p.Str("allocator_settings");
  p.BeginDict();
  p.Str("memsim_backend");
  p.Str(alloc::BackendName(d.backend));
  p.EndDict();
  p.EndDict();
  return p.Finish();
}

}  // namespace memsim::exports
