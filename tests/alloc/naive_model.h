// A second, deliberately naive model of the rules in docs/allocator-rules.md, for differential
// testing of the real one (src/alloc/). Written straight from the rules' text with linear scans and
// no shared code: segments hold their blocks in address order; a "pool" is computed by scanning;
// blocks are named by address. Slow (O(blocks) or worse per operation); tests only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "alloc/allocator.h"
#include "core/units.h"

namespace memsim::alloc::testing {

class NaiveModel {
 public:
  explicit NaiveModel(const AllocatorOptions& o) : o_(o) {
    if (o.max_split_size_bytes) max_split_ = *o.max_split_size_bytes;
  }

  // Returns the block address, or nullopt on OOM / refused request.
  std::optional<Bytes> Malloc(Bytes orig, int stream) {
    if (orig == 0 || orig >= (Bytes{1} << 60)) return std::nullopt;
    ProcessEvents(false);
    const Bytes size = Round(orig);
    const bool small = size <= kMiB;
    const Bytes alloc_size = small ? 2 * kMiB : size < 10 * kMiB ? 20 * kMiB : RoundUp(size, 2 * kMiB);
    Ref found = GetFree(small, stream, size);
    if (!found.ok()) {
      if (Fraction() && o_.garbage_collection_threshold > 0) Gc();
      found = Alloc(small, stream, size, alloc_size, false);
      if (!found.ok() && ReleaseAvailable(small, stream, size)) {
        found = Alloc(small, stream, size, alloc_size, false);
      }
      if (!found.ok()) {
        ProcessEvents(true);
        ReleaseAll();
        found = Alloc(small, stream, size, alloc_size, true);
      }
      if (!found.ok()) {
        ++num_ooms;
        return std::nullopt;
      }
    }
    Seg& sg = segs_[found.seg];
    if (npu() && o_.expandable_segments && size >= 2 * kMiB && o_.base_addr_aligned_bytes > 0) {
      B& b = sg.blocks[found.blk];
      const Bytes mis = (b.addr - sg.base) % o_.base_addr_aligned_bytes;
      if (mis != 0 && o_.base_addr_aligned_bytes - mis + size <= b.size) {
        const Bytes off = o_.base_addr_aligned_bytes - mis;
        B frag = b;
        frag.size = off;
        frag.gc_base = GcClock(sg.small);
        b.addr += off;
        b.size -= off;
        sg.blocks.insert(sg.blocks.begin() + found.blk, frag);
        found.blk++;
      }
    }
    B& b = sg.blocks[found.blk];
    const Bytes rem = b.size - size;
    const bool split = (sg.small || o_.expandable_segments) ? rem >= 512
                                                            : (size < max_split_ && rem > kMiB);
    if (split) {
      B r = b;
      r.addr = b.addr + size;
      r.size = rem;
      r.gc_base = GcClock(sg.small);
      b.size = size;
      sg.blocks.insert(sg.blocks.begin() + found.blk + 1, r);
    }
    B& a = segs_[found.seg].blocks[found.blk];
    a.allocated = true;
    a.req = orig;
    Up(allocated, a.size);
    Up(active, a.size);
    Up(requested, orig);
    return a.addr;
  }

  void Free(Bytes addr) {
    Ref r = Find(addr);
    B& b = segs_[r.seg].blocks[r.blk];
    b.allocated = false;
    allocated.current -= b.size;
    if (!b.uses.empty()) {
      b.events = static_cast<int>(b.uses.size());
      for (int s : b.uses) events_[s].push_back({seq_++, addr});
      b.uses.clear();
      return;
    }
    FreeBlock(r);
  }

  void Record(Bytes addr, int stream) {
    Ref r = Find(addr);
    B& b = segs_[r.seg].blocks[r.blk];
    if (!npu() && stream == segs_[r.seg].stream) return;
    if (std::find(b.uses.begin(), b.uses.end(), stream) == b.uses.end()) b.uses.push_back(stream);
  }
  void Complete(int stream) {
    if (events_.count(stream)) done_[stream] = seq_;
  }
  void EmptyCache() {
    ProcessEvents(true);
    ReleaseAll();
  }

  Gauge allocated, reserved, active, requested, segment;
  std::int64_t num_alloc_retries = 0, num_ooms = 0;
  Bytes InactiveSplitBytes() const {
    Bytes n = 0;
    for (const Seg& s : segs_) {
      if (s.exp || s.blocks.size() < 2) continue;
      for (const B& b : s.blocks) {
        if (!b.allocated && b.events == 0) n += b.size;
      }
    }
    return n;
  }

 private:
  struct B {
    Bytes addr = 0, size = 0, req = 0;
    bool allocated = false, mapped = true;
    int events = 0;
    std::vector<int> uses;
    std::uint64_t gc_base = 0;
  };
  struct Seg {
    Bytes base = 0, vsize = 0, page = 0;
    int stream = 0;
    bool small = false, exp = false;
    std::vector<B> blocks;  // address order, tiling [base, base + vsize)
  };
  struct Ref {
    int seg = -1, blk = -1;
    bool ok() const { return seg >= 0; }
  };

  bool npu() const { return o_.backend == Backend::kNpu; }
  bool Fraction() const { return o_.memory_fraction.has_value(); }
  Bytes Allowed() const {
    return static_cast<Bytes>(std::floor(*o_.memory_fraction *
                                         static_cast<double>(o_.capacity_bytes.value_or(0))));
  }
  static void Up(Gauge& g, Bytes v) {
    g.current += v;
    g.peak = std::max(g.peak, g.current);
  }
  std::uint64_t GcClock(bool small) const { return small ? clock_small_ : clock_large_; }

  Bytes Round(Bytes orig) const {
    const Bytes n = orig + (npu() ? 32 : 0);
    if (n < 512) return 512;
    int log2 = 0;
    while ((Bytes{2} << log2) <= n) ++log2;
    const int idx = std::clamp(log2 - 20, 0, 15);
    const Bytes d = o_.roundup_power2_divisions[idx];
    if (d > 1 && n > 512 * d) {
      const Bytes floor = Bytes{1} << log2;
      if (floor == n) return n;
      const Bytes step = floor / d;
      if (step == 0) return 2 * floor;
      return RoundUp(n, step);
    }
    return RoundUp(n, 512);
  }

  bool IsFree(const B& b) const { return !b.allocated && b.events == 0 && b.uses.empty(); }

  // Free mapped blocks of a pool, sorted by (stream, size, addr).
  std::vector<std::tuple<int, Bytes, Bytes, Ref>> PoolBlocks(bool small) const {
    std::vector<std::tuple<int, Bytes, Bytes, Ref>> v;
    for (int s = 0; s < static_cast<int>(segs_.size()); ++s) {
      if (segs_[s].small != small) continue;
      for (int k = 0; k < static_cast<int>(segs_[s].blocks.size()); ++k) {
        const B& b = segs_[s].blocks[k];
        if (IsFree(b) && b.mapped) v.push_back({segs_[s].stream, b.size, b.addr, Ref{s, k}});
      }
    }
    std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) {
      return std::tie(std::get<0>(x), std::get<1>(x), std::get<2>(x)) <
             std::tie(std::get<0>(y), std::get<1>(y), std::get<2>(y));
    });
    return v;
  }

  Ref GetFree(bool small, int stream, Bytes size) {
    if (Fraction() && o_.garbage_collection_threshold > 0) (small ? clock_small_ : clock_large_)++;
    auto v = PoolBlocks(small);
    std::size_t i = 0;
    while (i < v.size() && std::tie(std::get<0>(v[i]), std::get<1>(v[i])) <
                               std::make_tuple(stream, size)) {
      ++i;
    }
    if (i == v.size() || std::get<0>(v[i]) != stream) return {};
    auto xsize = [&](std::size_t j) {
      const Ref r = std::get<3>(v[j]);
      const Seg& s = segs_[r.seg];
      Bytes n = s.blocks[r.blk].size;
      if (r.blk + 1 < static_cast<int>(s.blocks.size()) && !s.blocks[r.blk + 1].mapped) {
        n += s.blocks[r.blk + 1].size;
      }
      return n;
    };
    if (o_.expandable_segments) {
      while (i + 1 < v.size() && std::get<0>(v[i + 1]) == stream && xsize(i + 1) < xsize(i)) ++i;
    }
    const Bytes bsize = std::get<1>(v[i]);
    if (size < max_split_ && bsize >= max_split_) return {};
    const Bytes tol = npu() ? 20 * kMiB : o_.max_non_split_rounding_bytes;
    if (size >= max_split_ && bsize >= size + tol) return {};
    // The caller marks it allocated right after the split decision.
    return std::get<3>(v[i]);
  }

  bool CapOk(Bytes n) const {
    return !o_.capacity_bytes || reserved.current + n <= *o_.capacity_bytes;
  }

  Ref Alloc(bool small, int stream, Bytes size, Bytes alloc_size, bool retry) {
    if (retry) ++num_alloc_retries;
    if (Fraction() && reserved.current + alloc_size > Allowed()) return {};
    if (o_.expandable_segments) return Expand(small, stream, size);
    if (!CapOk(alloc_size)) return {};
    Seg s;
    s.base = next_;
    next_ += RoundUp(alloc_size, 2 * kMiB);
    s.vsize = alloc_size;
    s.stream = stream;
    s.small = small;
    B b;
    b.addr = s.base;
    b.size = alloc_size;
    s.blocks.push_back(b);
    segs_.push_back(s);
    Up(reserved, alloc_size);
    Up(segment, 1);
    return {static_cast<int>(segs_.size()) - 1, 0};
  }

  // Expandable: candidates are unmapped ranges of this stream and pool in address order.
  Ref Expand(bool small, int stream, Bytes size) {
    struct Cand {
      Bytes addr;
      int seg, blk;
    };
    std::vector<Cand> unm;
    for (int s = 0; s < static_cast<int>(segs_.size()); ++s) {
      if (!segs_[s].exp || segs_[s].small != small || segs_[s].stream != stream) continue;
      for (int k = 0; k < static_cast<int>(segs_[s].blocks.size()); ++k) {
        if (!segs_[s].blocks[k].mapped) unm.push_back({segs_[s].blocks[k].addr, s, k});
      }
    }
    std::sort(unm.begin(), unm.end(), [](const Cand& a, const Cand& b) { return a.addr < b.addr; });
    int seg = -1, start = -1;
    for (const Cand& c : unm) {
      int k = c.blk;
      if (k > 0 && IsFree(segs_[c.seg].blocks[k - 1])) --k;
      Bytes room = 0;
      for (int j = k; j < static_cast<int>(segs_[c.seg].blocks.size()) && room < size; ++j) {
        if (!IsFree(segs_[c.seg].blocks[j])) break;
        room += segs_[c.seg].blocks[j].size;
      }
      if (room >= size) {
        seg = c.seg;
        start = k;
        break;
      }
    }
    if (seg < 0) {
      const Bytes page = small ? 2 * kMiB : 20 * kMiB;
      Bytes vsize = RoundUp(Bytes{1} << 40, page);
      if (o_.capacity_bytes) {
        const long double pages = std::ceil(1.125L * static_cast<long double>(*o_.capacity_bytes) /
                                            static_cast<long double>(page));
        vsize = std::max<Bytes>(1, static_cast<Bytes>(pages)) * page;
      }
      if (vsize < size) return {};
      Seg s;
      s.base = next_;
      next_ += RoundUp(vsize, 2 * kMiB);
      s.vsize = vsize;
      s.page = page;
      s.stream = stream;
      s.small = small;
      s.exp = true;
      B b;
      b.addr = s.base;
      b.size = vsize;
      b.mapped = false;
      s.blocks.push_back(b);
      segs_.push_back(s);
      seg = static_cast<int>(segs_.size()) - 1;
      start = 0;
    }
    // Grow block `start` (free mapped, or unmapped) until it holds `size`.
    Seg& s = segs_[seg];
    int cur = start;
    if (!s.blocks[cur].mapped) {
      if (!Map(seg, cur, std::min(size, s.blocks[cur].size))) return {};
      cur = MergeAround(seg, cur);
    }
    while (segs_[seg].blocks[cur].size < size) {
      const Bytes need = size - segs_[seg].blocks[cur].size;
      const int nx = cur + 1;
      if (!Map(seg, nx, std::min(need, segs_[seg].blocks[nx].size))) return {};
      cur = MergeAround(seg, nx);
    }
    return {seg, cur};
  }

  // Maps whole pages from the start of unmapped block k; splits the unmapped rest off.
  bool Map(int seg, int k, Bytes bytes) {
    Seg& s = segs_[seg];
    const Bytes m = RoundUp(bytes, s.page);
    if (!CapOk(m)) return false;
    B& b = s.blocks[k];
    if (m < b.size) {
      B rest = b;
      rest.addr = b.addr + m;
      rest.size = b.size - m;
      b.size = m;
      s.blocks.insert(s.blocks.begin() + k + 1, rest);
    }
    s.blocks[k].mapped = true;
    s.blocks[k].gc_base = GcClock(s.small);
    Up(reserved, m);
    return true;
  }

  // Merges block k with free neighbours of the same mapped state; returns its new index.
  int MergeAround(int seg, int k) {
    auto& v = segs_[seg].blocks;
    if (k + 1 < static_cast<int>(v.size()) && IsFree(v[k + 1]) && v[k + 1].mapped == v[k].mapped) {
      v[k].size += v[k + 1].size;
      v.erase(v.begin() + k + 1);
    }
    if (k > 0 && IsFree(v[k - 1]) && v[k - 1].mapped == v[k].mapped) {
      v[k - 1].size += v[k].size;
      v[k - 1].gc_base = v[k].gc_base;
      v[k - 1].req = v[k].req;
      v.erase(v.begin() + k);
      --k;
    }
    v[k].gc_base = GcClock(segs_[seg].small);
    return k;
  }

  void FreeBlock(Ref r) {
    B& b = segs_[r.seg].blocks[r.blk];
    active.current -= b.size;
    requested.current -= b.req;
    b.req = 0;
    MergeAround(r.seg, r.blk);
  }

  void ProcessEvents(bool all) {
    for (auto& [stream, q] : events_) {
      const std::uint64_t done = all ? seq_ : done_[stream];
      while (!q.empty() && q.front().first < done) {
        const Bytes addr = q.front().second;
        q.erase(q.begin());
        Ref r = Find(addr);
        if (--segs_[r.seg].blocks[r.blk].events == 0) FreeBlock(r);
      }
    }
  }

  // npuSynchronizeDevice: every event recorded so far is done; blocks return at the next
  // ProcessEvents (torch_npu NPUCachingAllocator.cpp, garbage_collect_cached_blocks and
  // release_available_cached_blocks).
  void SyncDevice() {
    for (auto& [stream, q] : events_) {
      if (!q.empty()) done_[stream] = seq_;
    }
  }

  void ReleaseSeg(int s) {
    reserved.current -= segs_[s].vsize;
    segment.current -= 1;
    segs_.erase(segs_.begin() + s);
  }

  bool ReleaseAvailable(bool small, int stream, Bytes size) {
    if (max_split_ == INT64_MAX) return false;
    if (npu()) SyncDevice();
    const Bytes key = std::max(size, max_split_);
    auto v = PoolBlocks(small);
    // The smallest block of this stream >= key, if any, else the largest ones downward.
    for (const auto& e : v) {
      const Ref r = std::get<3>(e);
      if (std::get<0>(e) == stream && std::get<1>(e) >= key) {
        if (segs_[r.seg].exp) break;  // (expandable: nothing is released)
        ReleaseSeg(r.seg);
        return true;
      }
    }
    Bytes released = 0;
    std::vector<Bytes> bases;
    for (auto it = v.rbegin(); it != v.rend(); ++it) {
      if (std::get<0>(*it) != stream) continue;
      if (released >= key || std::get<1>(*it) < max_split_) break;
      const Ref r = std::get<3>(*it);
      if (segs_[r.seg].exp) continue;
      released += std::get<1>(*it);
      bases.push_back(segs_[r.seg].base);
    }
    for (Bytes base : bases) {
      for (int s = 0; s < static_cast<int>(segs_.size()); ++s) {
        if (segs_[s].base == base) {
          ReleaseSeg(s);
          break;
        }
      }
    }
    return released >= key;
  }

  void Gc() {
    const Bytes thr =
        static_cast<Bytes>(o_.garbage_collection_threshold * static_cast<double>(Allowed()));
    if (reserved.current <= thr) return;
    const Bytes target = reserved.current - thr;
    auto whole = [&]() {
      std::vector<int> v;
      for (int s = 0; s < static_cast<int>(segs_.size()); ++s) {
        if (!segs_[s].small && segs_[s].blocks.size() == 1 && IsFree(segs_[s].blocks[0]) &&
            segs_[s].blocks[0].mapped) {
          v.push_back(s);
        }
      }
      return v;
    };
    double total = 0;
    int count = 0;
    for (int s : whole()) {
      total += static_cast<double>(clock_large_ - segs_[s].blocks[0].gc_base);
      ++count;
    }
    if (count == 0) return;
    if (npu()) SyncDevice();  // after both early returns
    Bytes reclaimed = 0;
    bool freed = true;
    while (reclaimed < target && freed && count > 0) {
      const double avg = total / count;
      freed = false;
      std::vector<Bytes> bases;
      for (int s : whole()) {
        const double age = static_cast<double>(clock_large_ - segs_[s].blocks[0].gc_base);
        if (!segs_[s].exp && age >= avg) {
          bases.push_back(segs_[s].base);
          reclaimed += segs_[s].vsize;
          total -= age;
          --count;
          freed = true;
        }
      }
      for (Bytes base : bases) {
        for (int s = 0; s < static_cast<int>(segs_.size()); ++s) {
          if (segs_[s].base == base) {
            ReleaseSeg(s);
            break;
          }
        }
      }
    }
  }

  void ReleaseAll() {
    for (int s = static_cast<int>(segs_.size()) - 1; s >= 0; --s) {
      Seg& sg = segs_[s];
      if (!sg.exp) {
        if (sg.blocks.size() == 1 && IsFree(sg.blocks[0])) ReleaseSeg(s);
        continue;
      }
      for (int k = 0; k < static_cast<int>(sg.blocks.size()); ++k) {
        B& b = sg.blocks[k];
        if (!IsFree(b) || !b.mapped) continue;
        const Bytes rel = b.addr - sg.base;
        const Bytes begin = RoundUp(rel, sg.page), end = (rel + b.size) / sg.page * sg.page;
        if (begin >= end) continue;
        std::vector<B> pieces;
        if (begin > rel) {
          B x = b;
          x.size = begin - rel;
          x.gc_base = GcClock(sg.small);
          pieces.push_back(x);
        }
        B u = b;
        u.addr = sg.base + begin;
        u.size = end - begin;
        u.mapped = false;
        pieces.push_back(u);
        if (rel + b.size > end) {
          B x = b;
          x.addr = sg.base + end;
          x.size = rel + b.size - end;
          x.gc_base = GcClock(sg.small);
          pieces.push_back(x);
        }
        reserved.current -= end - begin;
        sg.blocks.erase(sg.blocks.begin() + k);
        sg.blocks.insert(sg.blocks.begin() + k, pieces.begin(), pieces.end());
        const int uk = k + (begin > rel ? 1 : 0);
        const int merged = MergeAround(s, uk);
        k = merged;
      }
      if (sg.blocks.size() == 1 && !sg.blocks[0].mapped) segs_.erase(segs_.begin() + s);
    }
  }

  Ref Find(Bytes addr) const {
    for (int s = 0; s < static_cast<int>(segs_.size()); ++s) {
      for (int k = 0; k < static_cast<int>(segs_[s].blocks.size()); ++k) {
        if (segs_[s].blocks[k].addr == addr) return {s, k};
      }
    }
    return {};
  }

  AllocatorOptions o_;
  Bytes max_split_ = INT64_MAX;
  std::vector<Seg> segs_;
  Bytes next_ = Bytes{1} << 40;
  std::uint64_t clock_small_ = 0, clock_large_ = 0, seq_ = 0;
  std::map<int, std::vector<std::pair<std::uint64_t, Bytes>>> events_;
  std::map<int, std::uint64_t> done_;
};

}  // namespace memsim::alloc::testing
