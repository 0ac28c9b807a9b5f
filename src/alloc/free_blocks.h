// Internal to src/alloc/: the free, mapped blocks of one pool (FreeBlocks), in the order of
// PyTorch's BlockComparatorSize (CUDACachingAllocator.cpp): (stream, size, address). The model's
// decisions depend only on that order (the best fit is the first block of the stream at or above
// the request: the smallest size, then the lowest address), so any structure that keeps it gives
// the same results; this one is chosen for speed (docs/performance.md, 'Size-bucketed pools').
//
// Per stream, the blocks fall into size buckets, 16 per power of two of the size (the first 16
// buckets hold one size each): a bucket's sizes are all below the next bucket's, so the order is
// bucket by bucket, and inside a bucket a short vector sorted by (size, address). A bitmap of the
// non-empty buckets finds the next one. Insert and erase search one bucket (a few entries in
// training traces, where sizes repeat) instead of a tree of all the pool's blocks; the buckets
// make a search independent of the pool's other sizes. Sizes are bytes (> 0); the entries hold
// block indices, not pointers. Positions (Pos) are valid until the next change of the stream's
// blocks, except that erasing an entry leaves every earlier position valid.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "alloc/allocator.h"

namespace memsim::alloc::internal {

using BlockIndex = std::int32_t;
inline constexpr BlockIndex kNoBlock = -1;

// One free block's key and index.
struct FreeEntry {
  Bytes size_bytes = 0;
  Bytes addr = 0;
  BlockIndex block = kNoBlock;
};

// The free blocks of one stream, in (size, address) order.
class StreamFreeBlocks {
 public:
  // kSub buckets per power of two of size / 512 + kSub, up to 2^54 (sizes below 2^63 bytes).
  static constexpr int kSubBits = 2;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kBuckets = kSub * (55 - kSubBits);

  // A place in the order: entry `index` of bucket `bucket`; bucket == kBuckets is the end, and
  // bucket == -1 is before the first entry.
  struct Pos {
    int bucket = kBuckets;
    std::uint32_t index = 0;
  };

  // The bucket of a size: monotone (a larger size never has a smaller bucket).
  static int BucketOf(Bytes size_bytes) {
    // u = size / 512 + kSub >= kSub: sizes below kSub x 512 bytes get one bucket each.
    const std::uint64_t u = (static_cast<std::uint64_t>(size_bytes) >> 9) + kSub;
    const int log2 = 63 - __builtin_clzll(u);
    return kSub * (log2 - kSubBits) + static_cast<int>((u >> (log2 - kSubBits)) & (kSub - 1));
  }

  bool IsEnd(Pos p) const { return p.bucket >= kBuckets || p.bucket < 0; }
  const FreeEntry& At(Pos p) const { return buckets_[p.bucket][p.index]; }
  std::size_t size() const { return size_; }

  // The first entry with size >= size_bytes, or the end.
  Pos LowerBound(Bytes size_bytes) const {
    if (size_ == 0) return {};
    const int b = BucketFor(size_bytes);
    if (HasBucket(b)) {
      const std::vector<FreeEntry>& v = buckets_[b];
      const auto n = static_cast<std::uint32_t>(v.size());
      std::uint32_t i = 0;
      if (n > kLinear) {
        i = static_cast<std::uint32_t>(
            std::partition_point(v.begin(), v.end(),
                                 [size_bytes](const FreeEntry& e) { return e.size_bytes < size_bytes; }) -
            v.begin());
      } else {
        while (i < n && v[i].size_bytes < size_bytes) ++i;
      }
      if (i < n) return {b, i};
    }
    return {NextBucket(b + 1), 0};
  }
  Pos Next(Pos p) const {
    if (p.index + 1 < buckets_[p.bucket].size()) return {p.bucket, p.index + 1};
    return {NextBucket(p.bucket + 1), 0};
  }
  // The entry before p (p may be the end), or a position with bucket -1.
  Pos Prev(Pos p) const {
    if (!IsEnd(p) && p.index > 0) return {p.bucket, p.index - 1};
    const int b = PrevBucket((IsEnd(p) ? kBuckets : p.bucket) - 1);
    if (b < 0) return {-1, 0};
    return {b, static_cast<std::uint32_t>(buckets_[b].size() - 1)};
  }

  void Insert(const FreeEntry& e) {
    if (buckets_.empty()) buckets_.resize(kBuckets);
    if (flat_ ? size_ >= kFlatMax : size_ < kFlatMin) Regroup();
    const int b = BucketFor(e.size_bytes);
    std::vector<FreeEntry>& v = buckets_[b];
    if (v.size() > kLinear) {
      v.insert(std::upper_bound(v.begin(), v.end(), e, Less), e);
    } else {
      // Insertion sort's step: the later entries move up one place each.
      v.push_back(e);
      std::size_t i = v.size() - 1;
      for (; i > 0 && Less(e, v[i - 1]); --i) v[i] = v[i - 1];
      v[i] = e;
    }
    if (v.size() == 1) SetBit(b);
    ++size_;
  }
  // REQUIRES: an entry (size_bytes, addr) is present.
  void Erase(Bytes size_bytes, Bytes addr) {
    const int b = BucketFor(size_bytes);
    std::vector<FreeEntry>& v = buckets_[b];
    EraseAt(v, Find(v, size_bytes, addr));
    if (v.empty()) ClearBit(b);
    --size_;
  }
  // Replaces the entry (size_bytes, addr) by e (as Erase then Insert): in place when e's key
  // keeps its rank in the same bucket.
  // REQUIRES: an entry (size_bytes, addr) is present and e's key is not.
  void Replace(Bytes size_bytes, Bytes addr, const FreeEntry& e) {
    const int b = BucketFor(size_bytes);
    std::vector<FreeEntry>& v = buckets_[b];
    std::size_t i = Find(v, size_bytes, addr);
    if (BucketFor(e.size_bytes) != b) {
      EraseAt(v, i);
      if (v.empty()) ClearBit(b);
      --size_;
      Insert(e);
      return;
    }
    if (v.size() > kLinear) {  // a long bucket: two moves of its tail (memmove)
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      v.insert(std::upper_bound(v.begin(), v.end(), e, Less), e);
      return;
    }
    // The same bucket: the entries between the old and the new place move one place each.
    for (; i > 0 && Less(e, v[i - 1]); --i) v[i] = v[i - 1];
    for (; i + 1 < v.size() && Less(v[i + 1], e); ++i) v[i] = v[i + 1];
    v[i] = e;
  }
  // The block of entry (size_bytes, addr), or kNoBlock.
  BlockIndex BlockAt(Bytes size_bytes, Bytes addr) const {
    const int b = BucketFor(size_bytes);
    if (!HasBucket(b)) return kNoBlock;
    for (const FreeEntry& e : buckets_[b]) {
      if (e.size_bytes == size_bytes && e.addr == addr) return e.block;
    }
    return kNoBlock;
  }

  // Calls f(entry) in order.
  template <class F>
  void ForEach(F&& f) const {
    for (Pos p = {NextBucket(0), 0}; !IsEnd(p); p = Next(p)) f(At(p));
  }
  // "" or what is wrong: an entry in the wrong bucket, an unsorted bucket, a wrong bitmap or
  // count (CheckInvariants).
  std::string Check() const;

 private:
  static bool Less(const FreeEntry& a, const FreeEntry& b) {
    return a.size_bytes != b.size_bytes ? a.size_bytes < b.size_bytes : a.addr < b.addr;
  }
  // Bucket 0 holds every entry while the stream has few (flat_): one short sorted vector is
  // cheaper to search and shift than several; Regroup switches when the count crosses
  // kFlatMax or kFlatMin.
  static constexpr std::size_t kFlatMax = 32;
  static constexpr std::size_t kFlatMin = 8;
  int BucketFor(Bytes size_bytes) const { return flat_ ? 0 : BucketOf(size_bytes); }
  // Moves every entry to the buckets of the other layout (flat or by size), in order.
  void Regroup() {
    std::vector<FreeEntry> all;
    all.reserve(size_);
    ForEach([&all](const FreeEntry& e) { all.push_back(e); });
    for (std::vector<FreeEntry>& v : buckets_) v.clear();
    bits_ = {};
    words_ = 0;
    flat_ = !flat_;
    for (const FreeEntry& e : all) {
      const int b = BucketFor(e.size_bytes);
      buckets_[b].push_back(e);  // in order: each bucket stays sorted
      SetBit(b);
    }
  }
  bool HasBucket(int b) const { return (bits_[b >> 6] >> (b & 63)) & 1; }
  void SetBit(int b) {
    bits_[b >> 6] |= std::uint64_t{1} << (b & 63);
    words_ |= std::uint64_t{1} << (b >> 6);
  }
  void ClearBit(int b) {
    bits_[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
    if (bits_[b >> 6] == 0) words_ &= ~(std::uint64_t{1} << (b >> 6));
  }
  // The first non-empty bucket >= b, or kBuckets.
  int NextBucket(int b) const {
    if (b >= kBuckets) return kBuckets;
    const int w = b >> 6;
    const std::uint64_t m = bits_[w] & (~std::uint64_t{0} << (b & 63));
    if (m != 0) return (w << 6) + __builtin_ctzll(m);
    const std::uint64_t later = w + 1 < 64 ? words_ >> (w + 1) << (w + 1) : 0;
    if (later == 0) return kBuckets;
    const int w2 = __builtin_ctzll(later);
    return (w2 << 6) + __builtin_ctzll(bits_[w2]);
  }
  // The last non-empty bucket <= b, or -1.
  int PrevBucket(int b) const {
    if (b < 0) return -1;
    const int w = b >> 6;
    const std::uint64_t m = bits_[w] & (~std::uint64_t{0} >> (63 - (b & 63)));
    if (m != 0) return (w << 6) + 63 - __builtin_clzll(m);
    const std::uint64_t earlier = words_ & ((std::uint64_t{1} << w) - 1);
    if (earlier == 0) return -1;
    const int w2 = 63 - __builtin_clzll(earlier);
    return (w2 << 6) + 63 - __builtin_clzll(bits_[w2]);
  }
  static void EraseAt(std::vector<FreeEntry>& v, std::size_t i) {
    if (v.size() > kLinear) {
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
    for (; i + 1 < v.size(); ++i) v[i] = v[i + 1];
    v.pop_back();
  }
  static std::size_t Find(const std::vector<FreeEntry>& v, Bytes size_bytes, Bytes addr) {
    if (v.size() > kLinear) {
      return static_cast<std::uint32_t>(
          std::lower_bound(v.begin(), v.end(), FreeEntry{size_bytes, addr, kNoBlock}, Less) -
          v.begin());
    }
    std::uint32_t i = 0;
    while (v[i].size_bytes != size_bytes || v[i].addr != addr) ++i;
    return i;
  }

  static constexpr int kWords = (kBuckets + 63) / 64;
  static constexpr std::size_t kLinear = 16;  // longer buckets are searched by bisection
  std::vector<std::vector<FreeEntry>> buckets_;  // kBuckets once anything was inserted
  std::array<std::uint64_t, kWords> bits_{};     // bit b: buckets_[b] is not empty
  std::uint64_t words_ = 0;                      // bit w: bits_[w] is not 0
  std::size_t size_ = 0;
  bool flat_ = true;  // every entry in bucket 0
};

// The free, mapped blocks of one pool: a StreamFreeBlocks per stream that ever had one, in
// stream order.
class FreeBlocks {
 public:
  FreeBlocks() = default;
  FreeBlocks(const FreeBlocks&) = delete;
  FreeBlocks& operator=(const FreeBlocks&) = delete;

  // The stream's blocks, or nullptr if it never had any.
  const StreamFreeBlocks* Find(StreamId stream) const {
    if (last_ != nullptr && last_stream_ == stream) return last_;
    auto it = streams_.find(stream);
    if (it == streams_.end()) return nullptr;
    last_stream_ = stream;
    last_ = const_cast<StreamFreeBlocks*>(&it->second);
    return last_;
  }
  StreamFreeBlocks& Get(StreamId stream) {
    if (last_ != nullptr && last_stream_ == stream) return *last_;
    last_stream_ = stream;
    last_ = &streams_[stream];  // std::map nodes never move
    return *last_;
  }
  void Insert(StreamId stream, const FreeEntry& e) {
    Get(stream).Insert(e);
    ++size_;
  }
  void Erase(StreamId stream, Bytes size_bytes, Bytes addr) {
    Get(stream).Erase(size_bytes, addr);
    --size_;
  }
  void Replace(StreamId stream, Bytes size_bytes, Bytes addr, const FreeEntry& e) {
    Get(stream).Replace(size_bytes, addr, e);
  }
  BlockIndex BlockAt(StreamId stream, Bytes size_bytes, Bytes addr) const {
    const StreamFreeBlocks* s = Find(stream);
    return s == nullptr ? kNoBlock : s->BlockAt(size_bytes, addr);
  }
  std::size_t size() const { return size_; }

  // Calls f(stream, entry) in (stream, size, address) order.
  template <class F>
  void ForEach(F&& f) const {
    for (const auto& [stream, blocks] : streams_) {
      blocks.ForEach([&f, s = stream](const FreeEntry& e) { f(s, e); });
    }
  }
  // The blocks in order (for loops that free blocks as they go).
  std::vector<BlockIndex> InOrder() const {
    std::vector<BlockIndex> out;
    out.reserve(size_);
    ForEach([&out](StreamId, const FreeEntry& e) { out.push_back(e.block); });
    return out;
  }
  std::string Check() const;

 private:
  std::map<StreamId, StreamFreeBlocks> streams_;
  mutable StreamId last_stream_ = 0;                // the stream of the last lookup, and
  mutable StreamFreeBlocks* last_ = nullptr;  // its blocks (a cache)
  std::size_t size_ = 0;
};

}  // namespace memsim::alloc::internal
