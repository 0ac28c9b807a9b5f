// STUB so the rest of memsim links: a non-caching allocator (allocated == reserved, 512-byte
// rounding). Replaced by the caching-allocator model of issue 2.
#include <map>

#include "alloc/allocator.h"

namespace memsim::alloc {
namespace {

class StubAllocator final : public Allocator {
 public:
  explicit StubAllocator(const AllocatorOptions& options) : capacity_(options.capacity_bytes) {}
  std::optional<BlockHandle> Malloc(Bytes size_bytes, StreamId) override {
    const Bytes rounded = RoundUp(std::max<Bytes>(size_bytes, 1), 512);
    if (capacity_ && stats_.reserved_bytes.current + rounded > *capacity_) {
      ++stats_.num_ooms;
      return std::nullopt;
    }
    Add(stats_.allocated_bytes, rounded);
    Add(stats_.reserved_bytes, rounded);
    Add(stats_.active_bytes, rounded);
    Add(stats_.requested_bytes, size_bytes);
    live_[next_] = {rounded, size_bytes};
    return next_++;
  }
  void Free(BlockHandle block) override {
    auto it = live_.find(block);
    if (it == live_.end()) return;
    stats_.allocated_bytes.current -= it->second.first;
    stats_.reserved_bytes.current -= it->second.first;
    stats_.active_bytes.current -= it->second.first;
    stats_.requested_bytes.current -= it->second.second;
    live_.erase(it);
  }
  void RecordStream(BlockHandle, StreamId) override {}
  void CompleteStream(StreamId) override {}
  void EmptyCache() override {}
  void SetCapacity(std::optional<Bytes> capacity_bytes) override { capacity_ = capacity_bytes; }
  void ResetPeakStats() override {}
  const AllocatorStats& Stats() const override { return stats_; }
  std::string CheckInvariants() const override { return ""; }

 private:
  static void Add(Gauge& g, Bytes v) {
    g.current += v;
    g.peak = std::max(g.peak, g.current);
  }
  std::optional<Bytes> capacity_;
  AllocatorStats stats_;
  std::map<BlockHandle, std::pair<Bytes, Bytes>> live_;
  BlockHandle next_ = 1;
};

}  // namespace

std::unique_ptr<Allocator> NewCachingAllocator(const AllocatorOptions& options) {
  return std::make_unique<StubAllocator>(options);
}

}  // namespace memsim::alloc
