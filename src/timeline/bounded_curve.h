// BoundedCurve: a memory curve kept at a bounded resolution. Up to `max_samples` samples it keeps
// every one; beyond, it groups consecutive samples into buckets of 2^j and keeps, per bucket, the
// samples where allocated and device memory (reserved where the device figure is unknown) are
// lowest and highest -- min/max per bucket, so every peak and every trough of the curve stays
// in it (the first of equal extremes, at its own time). Each time the kept samples would exceed
// `max_samples`, adjacent buckets merge (the extremes of a union are among the extremes of its
// parts, so merging is exact). Memory: O(max_samples) whatever the number of samples added.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "timeline/timeline.h"

namespace memsim::timeline {

class BoundedCurve {
 public:
  // REQUIRES: max_samples >= 8.
  explicit BoundedCurve(std::size_t max_samples);

  void Add(const Sample& sample);
  // The kept samples in time order; the curve is empty afterwards.
  SampleVector Take();

  std::size_t samples_added() const { return added_; }
  // Raw samples per bucket: 1 while nothing was merged.
  std::size_t bucket_size() const { return bucket_size_; }

 private:
  void CloseOpenBucket();
  void MergeBuckets();

  std::size_t max_samples_;
  std::size_t bucket_size_ = 1;
  std::size_t added_ = 0;
  SampleVector kept_;                 // closed buckets' samples, in time order
  std::vector<std::uint8_t> counts_;  // samples kept per closed bucket (1 to 4)
  std::vector<Sample> open_;          // the open bucket's kept samples
  std::size_t open_raw_ = 0;          // raw samples added to the open bucket
};

}  // namespace memsim::timeline
