#include "timeline/bounded_curve.h"

#include <algorithm>
#include <iterator>

#include "core/check.h"

namespace memsim::timeline {
namespace {

Bytes DeviceOrReserved(const Sample& s) {
  return s.device_bytes != kUnknownBytes ? s.device_bytes : s.reserved_bytes;
}

// Keeps, of the n samples at `in` (time order), the first lowest and first highest allocated
// and device samples, in time order, without repeats; writes them to `out` (which may be `in`:
// the k-th kept sample comes from an index >= k) and returns how many (1 to 4).
std::size_t KeepExtremes(const Sample* in, std::size_t n, Sample* out) {
  std::size_t lo_a = 0, hi_a = 0, lo_d = 0, hi_d = 0;
  for (std::size_t i = 1; i < n; ++i) {
    if (in[i].allocated_bytes < in[lo_a].allocated_bytes) lo_a = i;
    if (in[i].allocated_bytes > in[hi_a].allocated_bytes) hi_a = i;
    if (DeviceOrReserved(in[i]) < DeviceOrReserved(in[lo_d])) lo_d = i;
    if (DeviceOrReserved(in[i]) > DeviceOrReserved(in[hi_d])) hi_d = i;
  }
  std::size_t idx[4] = {lo_a, hi_a, lo_d, hi_d};
  std::sort(std::begin(idx), std::end(idx));
  std::size_t kept = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    if (k == 0 || idx[k] != idx[k - 1]) out[kept++] = in[idx[k]];
  }
  return kept;
}

void KeepExtremes(std::vector<Sample>& in) {
  in.resize(KeepExtremes(in.data(), in.size(), in.data()));
}

}  // namespace

BoundedCurve::BoundedCurve(std::size_t max_samples) : max_samples_(max_samples) {
  MEMSIM_CHECK(max_samples >= 8);
}

void BoundedCurve::Add(const Sample& sample) {
  ++added_;
  if (bucket_size_ == 1) {
    // Nothing merged yet: each sample is a closed bucket of its own (the open one stays empty),
    // what CloseOpenBucket does below, without the detour.
    if (kept_.capacity() == 0) kept_.reserve(max_samples_ + 4);
    kept_.push_back(sample);
    counts_.push_back(1);
    if (kept_.size() > max_samples_) MergeBuckets();
    return;
  }
  open_.push_back(sample);
  ++open_raw_;
  if (open_.size() > 4) KeepExtremes(open_);
  if (open_raw_ == bucket_size_) CloseOpenBucket();
}

void BoundedCurve::CloseOpenBucket() {
  if (open_raw_ == 0) return;
  if (bucket_size_ > 1) KeepExtremes(open_);
  // Reserved once, so the kept samples are never copied to a larger buffer (pages are touched
  // only as samples arrive).
  if (kept_.capacity() == 0) kept_.reserve(max_samples_ + 4);
  kept_.insert(kept_.end(), open_.begin(), open_.end());
  counts_.push_back(static_cast<std::uint8_t>(open_.size()));
  open_.clear();
  open_raw_ = 0;
  if (kept_.size() > max_samples_) MergeBuckets();
}

void BoundedCurve::MergeBuckets() {
  // Merges buckets 2i and 2i+1 until the kept samples fit; a last odd bucket stays alone (it
  // holds fewer raw samples, which changes no extreme). In place: a merged bucket keeps at most
  // as many samples as its two parts hold, so the write position never passes the read one.
  while (kept_.size() > max_samples_) {
    std::size_t read = 0, write = 0, merged = 0;
    for (std::size_t b = 0; b < counts_.size(); b += 2) {
      const std::size_t n = counts_[b] + (b + 1 < counts_.size() ? counts_[b + 1] : 0);
      const std::size_t k = KeepExtremes(&kept_[read], n, &kept_[write]);
      read += n;
      write += k;
      counts_[merged++] = static_cast<std::uint8_t>(k);
    }
    kept_.resize(write);
    counts_.resize(merged);
    bucket_size_ *= 2;
  }
}

SampleVector BoundedCurve::Take() {
  CloseOpenBucket();
  SampleVector out;
  out.swap(kept_);
  counts_.clear();
  return out;
}

}  // namespace memsim::timeline
