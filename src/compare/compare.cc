#include "compare/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/core.h>

namespace memsim::compare {
namespace {

using timeline::kUnknownBytes;
using timeline::Sample;
using timeline::Timeline;

enum class Curve { kAllocated, kReserved, kDevice };
constexpr Curve kCurves[] = {Curve::kAllocated, Curve::kReserved, Curve::kDevice};

const char* CurveName(Curve c) {
  switch (c) {
    case Curve::kAllocated: return "allocated";
    case Curve::kReserved: return "reserved";
    case Curve::kDevice: return "device";
  }
  return "";
}

Bytes Value(const Sample& s, Curve c) {
  switch (c) {
    case Curve::kAllocated: return s.allocated_bytes;
    case Curve::kReserved: return s.reserved_bytes;
    case Curve::kDevice: return s.device_bytes;
  }
  return kUnknownBytes;
}

bool HasCurve(const Timeline& t, Curve c) {
  for (const Sample& s : t.samples) {
    if (Value(s, c) >= 0) return true;
  }
  return false;
}

// Sample indices of one iteration, in time order, plus its time span [start, end].
struct IterSpan {
  std::vector<size_t> index;
  double start_us = 0, end_us = 0;
};

std::map<int, IterSpan> SpansByIteration(const Timeline& t) {
  std::map<int, IterSpan> spans;
  for (size_t i = 0; i < t.samples.size(); ++i) {
    const int k = t.samples[i].iteration;
    if (k < 0) continue;
    spans[k].index.push_back(i);
  }
  for (auto& [k, span] : spans) {
    const size_t first = span.index.front(), last = span.index.back();
    span.start_us = t.samples[first].time_us;
    // The iteration lasts until the next sample that belongs to another iteration.
    span.end_us = last + 1 < t.samples.size() ? t.samples[last + 1].time_us : t.samples[last].time_us;
  }
  return spans;
}

// `a` then `b` (a before b in time) as one span.
IterSpan Joined(const IterSpan& a, const IterSpan& b) {
  IterSpan out = a;
  out.index.insert(out.index.end(), b.index.begin(), b.index.end());
  out.end_us = b.end_us;
  return out;
}

Bytes MaxOf(const Timeline& t, const std::vector<size_t>& index, Curve c) {
  Bytes m = kUnknownBytes;
  for (size_t i : index) m = std::max(m, Value(t.samples[i], c));
  return m;
}

Bytes LastOf(const Timeline& t, const std::vector<size_t>& index, Curve c) {
  for (auto it = index.rbegin(); it != index.rend(); ++it) {
    if (Value(t.samples[*it], c) >= 0) return Value(t.samples[*it], c);
  }
  return kUnknownBytes;
}

Peaks PeaksOf(const Timeline& t, const std::vector<size_t>& index) {
  Peaks p;
  p.peak_allocated_bytes = MaxOf(t, index, Curve::kAllocated);
  p.peak_reserved_bytes = MaxOf(t, index, Curve::kReserved);
  p.peak_device_bytes = MaxOf(t, index, Curve::kDevice);
  p.end_allocated_bytes = LastOf(t, index, Curve::kAllocated);
  p.end_reserved_bytes = LastOf(t, index, Curve::kReserved);
  return p;
}

std::optional<double> Pct(Bytes measured, Bytes simulated) {
  if (measured < 0 || simulated <= 0) return std::nullopt;
  return (static_cast<double>(measured) - static_cast<double>(simulated)) /
         static_cast<double>(simulated) * 100.0;
}

PeakErrors ErrorsOf(const Peaks& m, const Peaks& s) {
  return {Pct(m.peak_allocated_bytes, s.peak_allocated_bytes),
          Pct(m.peak_reserved_bytes, s.peak_reserved_bytes),
          Pct(m.peak_device_bytes, s.peak_device_bytes), Pct(m.end_allocated_bytes, s.end_allocated_bytes),
          Pct(m.end_reserved_bytes, s.end_reserved_bytes)};
}

// Step-hold value at time q among index (sorted by time): the last known sample at or before q,
// else the first known one.
Bytes HoldAt(const Timeline& t, const std::vector<size_t>& index, Curve c, double q) {
  Bytes v = kUnknownBytes;
  for (size_t i : index) {
    const Bytes x = Value(t.samples[i], c);
    if (x < 0) continue;
    if (t.samples[i].time_us > q && v >= 0) break;
    v = x;
    if (t.samples[i].time_us > q) break;
  }
  return v;
}

// Phase start times in order of first appearance (phases other than kUnknown).
std::vector<std::pair<Phase, double>> PhaseStarts(const Timeline& t, const IterSpan& span) {
  std::vector<std::pair<Phase, double>> out;
  for (size_t i : span.index) {
    const Phase p = t.samples[i].phase;
    if (p == Phase::kUnknown) continue;
    if (out.empty() || out.back().first != p) out.emplace_back(p, t.samples[i].time_us);
  }
  return out;
}

// Query times (measured, simulated) for `n` points of normalised time u = (i + 0.5) / n.
void QueryTimes(const Timeline& m, const IterSpan& ms, const Timeline& s, const IterSpan& ss, int n,
                std::vector<double>* mt, std::vector<double>* st, bool* phase_normalised) {
  const auto mp = PhaseStarts(m, ms), sp = PhaseStarts(s, ss);
  bool same = mp.size() >= 2 && mp.size() == sp.size();
  for (size_t i = 0; same && i < mp.size(); ++i) same = mp[i].first == sp[i].first;
  *phase_normalised = same;
  std::vector<double> mb, sb;  // boundaries: start, phase 2.., end
  if (same) {
    mb.push_back(ms.start_us);
    sb.push_back(ss.start_us);
    for (size_t i = 1; i < mp.size(); ++i) {
      mb.push_back(mp[i].second);
      sb.push_back(sp[i].second);
    }
  } else {
    mb.push_back(ms.start_us);
    sb.push_back(ss.start_us);
  }
  mb.push_back(ms.end_us);
  sb.push_back(ss.end_us);
  const double s_len = ss.end_us - ss.start_us;
  for (int i = 0; i < n; ++i) {
    const double u = (i + 0.5) / n;
    const double s_time = ss.start_us + u * s_len;
    // Which simulated segment holds u, and where within it.
    size_t j = 0;
    while (j + 2 < sb.size() && s_time >= sb[j + 1]) ++j;
    const double seg = sb[j + 1] - sb[j];
    const double v = seg > 0 ? (s_time - sb[j]) / seg : u;
    mt->push_back(mb[j] + v * (mb[j + 1] - mb[j]));
    st->push_back(same ? s_time : ss.start_us + u * s_len);
  }
  if (!same) {
    for (int i = 0; i < n; ++i) (*mt)[i] = ms.start_us + (i + 0.5) / n * (ms.end_us - ms.start_us);
  }
}

std::optional<int> SteadyState(const std::vector<std::pair<int, Bytes>>& peaks) {
  // The first iteration after which the peak reserved never exceeds the maximum so far.
  std::optional<int> steady;
  Bytes max_so_far = kUnknownBytes;
  for (const auto& [k, v] : peaks) {
    if (v < 0) continue;
    if (v > max_so_far) {
      max_so_far = v;
      steady = k;
    }
  }
  return steady;
}

// SteadyState of the simulated iterations' peak reserved (peak device where reserved is
// unknown).
std::optional<int> SimulatedSteadyState(const Timeline& simulated,
                                        const std::map<int, IterSpan>& spans) {
  std::vector<std::pair<int, Bytes>> peaks;
  for (const auto& [k, span] : spans) {
    if (k < 1) continue;
    const Bytes res = MaxOf(simulated, span.index, Curve::kReserved);
    peaks.emplace_back(k, res >= 0 ? res : MaxOf(simulated, span.index, Curve::kDevice));
  }
  return SteadyState(peaks);
}

Bytes ConvergedLevel(const Timeline& t, Curve c) {
  std::vector<Bytes> v;
  for (const Sample& s : t.samples) {
    if (Value(s, c) >= 0) v.push_back(Value(s, c));
  }
  if (v.empty()) return kUnknownBytes;
  std::vector<Bytes> tail(v.end() - static_cast<std::ptrdiff_t>(std::max<size_t>(1, v.size() / 5)), v.end());
  std::sort(tail.begin(), tail.end());
  return tail[(tail.size() - 1) / 2];
}

void SplitEvenly(Timeline& t, int count) {
  if (t.samples.empty() || count <= 0) return;
  const double t0 = t.samples.front().time_us, t1 = t.samples.back().time_us;
  const double len = (t1 - t0) / count;
  for (Sample& s : t.samples) {
    int k = len > 0 ? static_cast<int>((s.time_us - t0) / len) : 0;
    s.iteration = std::min(k, count - 1) + 1;
  }
}

// A note when the two sides' overall peaks (allocated, else reserved, else device) differ by more
// than 10x either way: errors that large (thousands of percent) say the profile is of another
// job, rank or device, or in another unit, rather than how well memsim models this one. The
// errors themselves are left as computed. "" when the peaks are within 10x or unknown.
std::string ScaleNote(const Peaks& m, const Peaks& s) {
  const std::pair<Bytes, Bytes> pairs[] = {{m.peak_allocated_bytes, s.peak_allocated_bytes},
                                           {m.peak_reserved_bytes, s.peak_reserved_bytes},
                                           {m.peak_device_bytes, s.peak_device_bytes}};
  for (const auto& [mb, sb] : pairs) {
    if (mb == timeline::kUnknownBytes || sb == timeline::kUnknownBytes) continue;
    if (mb <= 0 || sb <= 0) return "";
    const double ratio = static_cast<double>(mb) / static_cast<double>(sb);
    if (ratio <= 10.0 && ratio >= 0.1) return "";
    constexpr double kMiBd = 1024.0 * 1024.0;
    return fmt::format(
        "the measured peak ({:.1f} MiB) is {:.0f}x {} than the simulated one ({:.1f} MiB): the "
        "profile looks like another job, rank or device, or another unit (bytes, KiB, MiB; "
        "check --format and the columns), so its errors say little about this config",
        static_cast<double>(mb) / kMiBd, ratio > 1 ? ratio : 1 / ratio,
        ratio > 1 ? "larger" : "smaller", static_cast<double>(sb) / kMiBd);
  }
  return "";
}

bool HasIterations(const Timeline& t) {
  for (const Sample& s : t.samples) {
    if (s.iteration >= 1) return true;
  }
  return false;
}

// The candidate iteration periods of y in samples, shortest first, from its autocorrelation
// r(lag) (normalised by the overlap). A candidate is a local maximum of r above 0.3 r(0) that
// exceeds every r in [lag/2, 0.95 lag] (which rejects multiples of the period, r(2P) <= r(P),
// and, in a curve with many micro-batches, the sub-period's multiples, whose r decays with the
// lag), or that stands above the comb of sub-period maxima: higher by 3% of r(0) than the
// nearest local maxima on both sides (many micro-batches make that comb decay slowly, so r(P)
// can fall short of r just after P/2 while it still rises clear of its neighbours). The 3% is a
// heuristic margin, not from a source.
std::vector<int> PeriodCandidates(const std::vector<double>& y) {
  const int n = static_cast<int>(y.size());
  const double mean = std::accumulate(y.begin(), y.end(), 0.0) / n;
  std::vector<double> r(n / 2 + 2, 0.0);
  for (int lag = 0; lag <= n / 2 + 1; ++lag) {
    double sum = 0;
    for (int i = 0; i + lag < n; ++i) sum += (y[i] - mean) * (y[i + lag] - mean);
    r[lag] = sum / (n - lag);
  }
  std::vector<int> out;
  if (r[0] <= 0) return out;
  auto local_max = [&r](int lag) { return r[lag] >= r[lag - 1] && r[lag] >= r[lag + 1]; };
  auto stands_clear = [&](int lag) {
    int before = lag - 1, after = lag + 1;
    while (before >= 1 && !local_max(before)) --before;
    while (after <= n / 2 && !local_max(after)) ++after;
    if (before < 1 || after > n / 2) return false;
    return r[lag] > std::max(r[before], r[after]) + 0.03 * r[0];
  };
  for (int lag = n / 64; lag < n / 2; ++lag) {
    if (r[lag] < r[lag - 1] || r[lag] < r[lag + 1] || r[lag] <= 0.3 * r[0]) continue;
    const auto window_begin = r.begin() + lag / 2;
    const auto window_end = r.begin() + static_cast<int>(0.95 * lag) + 1;
    if (r[lag] > *std::max_element(window_begin, window_end) || stands_clear(lag)) out.push_back(lag);
  }
  return out;
}

// Iteration boundaries on a curve resampled at y.size() points (indices into y).
class Boundaries {
 public:
  explicit Boundaries(const std::vector<double>& y) : y_(y), n_(static_cast<int>(y.size())) {
    const auto [lo, hi] = std::minmax_element(y.begin(), y.end());
    range_ = *hi - *lo;
  }
  double range() const { return range_; }

  // The rise after the lowest point of [from, to) (the last one on ties).
  int LowestIn(int from, int to) const {
    from = std::max(from, 0);
    to = std::min(to, n_);
    int arg = from;
    for (int i = from; i < to; ++i) {
      if (y_[i] <= y_[arg]) arg = i;
    }
    return EndOfPlateau(arg, to);
  }
  // The rise after the point nearest to `level` (the level the curve returns to between
  // iterations; the last one on ties) among the indices of [from, to) within 2% of the range
  // of it; -1 when there is none. Nearest rather than lowest: the first optimizer step creates
  // the state tensor by tensor, so the curve climbs to the level through points within 2%
  // below it.
  int AtLevel(int from, int to, double level) const {
    from = std::max(from, 0);
    to = std::min(to, n_);
    int arg = -1;
    for (int i = from; i < to; ++i) {
      const double off = std::fabs(y_[i] - level);
      if (off > 0.02 * range_) continue;
      if (arg < 0 || off <= std::fabs(y_[arg] - level)) arg = i;
    }
    return arg < 0 ? -1 : EndOfPlateau(arg, to);
  }

  // N iterations given: 0, then the starts of iterations 2..N, then n. The profile ends with
  // iteration N: its start (the low point a period before the end) gives the level the steady
  // iterations return to, and the boundaries before it are followed backwards at that level,
  // one period apart. Iteration 1 returns to a lower level (no optimizer state before its
  // step), so its end is sought at the level of the later ones, not at its own lowest point;
  // whatever precedes the first boundary (init, iteration 1) is iteration 1. Where no point of
  // a window is at the level: its lowest point.
  std::vector<int> Forced(int period, int count) const {
    int b = LowestIn(n_ - period - period / 2, n_ - period / 2);
    const double level = y_[b];
    std::vector<int> bounds = {b};
    for (int k = count - 2; k >= 1; --k) {
      const int from = b - period - period / 2, to = b - period / 2;
      const int at_level = AtLevel(from, to, level);
      b = at_level >= 0 ? at_level : LowestIn(from, to);
      if (b <= 0) break;
      bounds.insert(bounds.begin(), b);
    }
    bounds.insert(bounds.begin(), 0);
    bounds.push_back(n_);
    return bounds;
  }

  // No count given: anchored at the low point in the middle of the profile and followed both
  // ways while the low point one period on stays at the anchor's level; a last iteration that
  // runs to the end of the profile counts when it is nearly a whole period.
  std::vector<int> Anchored(int period) const {
    const int mid = LowestIn(n_ / 2 - period / 2, n_ / 2 + period / 2);
    const double level = y_[mid];
    std::vector<int> bounds = {mid};
    for (int b = mid;;) {  // backwards
      const int from = b - period - period / 2, to = b - period / 2;
      if (from < 0) break;
      b = AtLevel(from, to, level);
      if (b < 0) break;
      bounds.insert(bounds.begin(), b);
    }
    for (int b = mid;;) {  // forwards
      const int from = b + period / 2, to = b + period + period / 2;
      if (to > n_) break;
      b = AtLevel(from, to, level);
      if (b < 0) break;
      bounds.push_back(b);
    }
    if (n_ - 1 - bounds.back() >= 0.8 * period) bounds.push_back(n_);
    return bounds;
  }

  // Whether the iterations between `bounds` repeat: their peaks within 2% of the range. A
  // micro-batch sub-period also returns to the level, but the stretch holding the optimizer
  // step peaks lower than those holding a forward and backward.
  bool Repeat(const std::vector<int>& bounds) const {
    double lo = 0, hi = 0;
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      const double peak = *std::max_element(y_.begin() + bounds[k], y_.begin() + bounds[k + 1]);
      lo = k == 0 ? peak : std::min(lo, peak);
      hi = k == 0 ? peak : std::max(hi, peak);
    }
    return bounds.size() >= 2 && hi - lo <= 0.02 * range_;
  }

 private:
  // The end of the flat stretch that starts at index b (the rise after a low point).
  int EndOfPlateau(int b, int to) const {
    while (b + 1 < to && y_[b + 1] == y_[b]) ++b;
    return b;
  }
  const std::vector<double>& y_;
  int n_ = 0;
  double range_ = 0;
};

// The curve of `known` samples of t resampled at n points over [t0, t1] (step-hold).
std::vector<double> Resample(const Timeline& t, const std::vector<size_t>& known, Curve c, int n,
                             double t0, double dt) {
  std::vector<double> y(n);
  size_t j = 0;
  for (int i = 0; i < n; ++i) {
    const double q = t0 + i * dt;
    while (j + 1 < known.size() && t.samples[known[j + 1]].time_us <= q) ++j;
    y[i] = static_cast<double>(Value(t.samples[known[j]], c));
  }
  return y;
}

// The boundaries DetectIterations labels by (see there); empty when none are found.
std::vector<int> FindBoundaries(const std::vector<double>& y, int expected_count) {
  const int n = static_cast<int>(y.size());
  const Boundaries b(y);
  if (b.range() <= 0) return {};
  const std::vector<int> candidates = PeriodCandidates(y);
  if (expected_count > 0) {
    // The period is at most n / N (the profile may hold init too); the autocorrelation's is
    // taken when it is near that, else n / N.
    int period = n / expected_count;
    for (int c : candidates) {
      if (c * expected_count <= n && c * expected_count >= 0.7 * n) period = c;
    }
    return period < 4 ? std::vector<int>{} : b.Forced(period, expected_count);
  }
  for (int period : candidates) {
    if (period < 4) continue;
    std::vector<int> bounds = b.Anchored(period);
    if (b.Repeat(bounds)) return bounds;
  }
  return {};
}

}  // namespace

int DetectIterations(Timeline& t, int expected_count) {
  Curve c = Curve::kAllocated;
  if (!HasCurve(t, c)) c = HasCurve(t, Curve::kReserved) ? Curve::kReserved : Curve::kDevice;
  std::vector<size_t> known;
  for (size_t i = 0; i < t.samples.size(); ++i) {
    if (Value(t.samples[i], c) >= 0) known.push_back(i);
  }
  if (known.size() < 8) return 0;
  const double t0 = t.samples[known.front()].time_us, t1 = t.samples[known.back()].time_us;
  if (!(t1 > t0)) return 0;
  constexpr int kN = 2048;
  const double dt = (t1 - t0) / (kN - 1);
  const std::vector<int> bounds = FindBoundaries(Resample(t, known, c, kN, t0, dt), expected_count);
  const int count = static_cast<int>(bounds.size()) - 1;
  if (count < 1) return 0;
  for (Sample& s : t.samples) {
    if (s.iteration >= 0) continue;
    const double pos = (s.time_us - t0) / dt;
    // Iteration k holds (bounds[k], bounds[k + 1]]: the sample that rises off the low point
    // opens the next iteration; the low point itself closes the previous one.
    for (int k = 0; k < count; ++k) {
      const double lo = (expected_count > 0 && k == 0) ? -1e300 : bounds[k];
      const double hi = bounds[k + 1] == kN ? 1e300 : bounds[k + 1];
      if (pos > lo && pos <= hi) {
        s.iteration = k + 1;
        break;
      }
    }
  }
  return count;
}

namespace {

// How the measured iterations were found (Compare's alignment).
struct Alignment {
  bool detected = false;    // from the periodic curve, without --profile-iterations
  bool from_start = false;  // the measured iteration 1 starts at the profile's first sample
};

// Numbers the iterations of `m` when the profile does not (detection from the periodic curve,
// or --profile-iterations' even split) and says how in r.alignment and r.notes.
Alignment AlignMeasured(Timeline& m, const CompareOptions& o, Report& r) {
  Alignment a;
  const bool allocator_level = HasCurve(m, Curve::kAllocated) || HasCurve(m, Curve::kReserved);
  if (HasIterations(m)) {
    r.alignment = fmt::format("by the iteration numbers in the profile ({})", m.source);
    if (o.profile_iterations > 0) {
      r.notes.push_back(fmt::format("--profile-iterations {} ignored: the profile numbers its "
                                    "iterations itself",
                                    o.profile_iterations));
    }
  } else if (allocator_level) {
    const int n = DetectIterations(m, o.profile_iterations);
    a.detected = n > 0 && o.profile_iterations == 0;
    a.from_start = n > 0 && o.profile_iterations > 0;
    r.alignment = n > 0 ? fmt::format("{} iterations detected from the periodic {} curve{}", n,
                                      HasCurve(m, Curve::kAllocated) ? "allocated" : "reserved",
                                      o.profile_iterations > 0 ? " (--profile-iterations)" : "")
                        : o.profile_iterations > 0
                            ? fmt::format("no {} iterations found in the periodic {} curve "
                                          "(--profile-iterations {}): compared on peaks only",
                                          o.profile_iterations,
                                          HasCurve(m, Curve::kAllocated) ? "allocated" : "reserved",
                                          o.profile_iterations)
                            : "no iterations found in the profile: compared on peaks only "
                              "(--profile-iterations N says how many it covers)";
  } else if (o.profile_iterations > 0) {
    SplitEvenly(m, o.profile_iterations);
    a.from_start = true;
    r.alignment = fmt::format("device-level samples split into {} equal iterations "
                              "(--profile-iterations)", o.profile_iterations);
  } else {
    r.alignment = "device-level samples without iteration markers: compared on the peak and the "
                  "converged level";
  }
  return a;
}

// Detected iterations repeat by construction, so they are compared with the simulated steady
// state: detected iteration j with simulated iteration S + j - 1, where S is the simulated
// iteration after which reserved stops growing. Returns S - 1 (0 when there is none).
int SteadyStateOffset(const Timeline& simulated, const std::map<int, IterSpan>& sspans,
                      Report& r) {
  std::vector<std::pair<int, Bytes>> sim_reserved;
  for (const auto& [k, span] : sspans) {
    if (k < 1) continue;
    const Bytes res = MaxOf(simulated, span.index, Curve::kReserved);
    sim_reserved.emplace_back(k, res >= 0 ? res : MaxOf(simulated, span.index, Curve::kAllocated));
  }
  const std::optional<int> steady = SteadyState(sim_reserved);
  if (!steady) return 0;
  r.alignment +=
      fmt::format("; compared from the simulated steady state (iteration {}) on", *steady);
  return *steady - 1;
}

// What the comparison of every aligned iteration shares.
struct IterationInputs {
  const Timeline& m;  // measured, with its iterations numbered
  const Timeline& simulated;
  const CompareOptions& o;
  std::map<int, timeline::ReportedPeak> reported;  // the profile's own peaks, by iteration
  std::optional<Curve> chart_curve;                // the first curve both sides have
};

// Peaks since the start of the process (a profile of cumulative peaks): the simulated maximum
// over init..the end of `ss`, the measured one as reported for iteration k.
void UseCumulativePeaks(const IterationInputs& in, const IterSpan& ss, int k,
                        IterationResult& it) {
  std::vector<size_t> upto;
  for (size_t i = 0; i < in.simulated.samples.size(); ++i) {
    if (in.simulated.samples[i].time_us <= ss.end_us) upto.push_back(i);
  }
  const Peaks cum = PeaksOf(in.simulated, upto);
  it.simulated.peak_allocated_bytes = cum.peak_allocated_bytes;
  it.simulated.peak_reserved_bytes = cum.peak_reserved_bytes;
  it.simulated.peak_device_bytes = cum.peak_device_bytes;
  auto rp = in.reported.find(k);
  const bool known = rp != in.reported.end();
  it.measured.peak_allocated_bytes = known ? rp->second.max_allocated_bytes : kUnknownBytes;
  it.measured.peak_reserved_bytes = known ? rp->second.max_reserved_bytes : kUnknownBytes;
  it.measured.peak_device_bytes = kUnknownBytes;  // one sample per report: no peak
}

// The curve errors of one iteration (mean absolute difference at o.curve_points matched times,
// over the measured peak), the chart's points on the way; the iteration's headline error (the
// first curve of allocated, reserved, device) is appended to `curve_errors`.
void CompareCurves(const IterationInputs& in, const IterSpan& ms, const IterSpan& ss,
                   IterationResult& it, Report& r, std::vector<double>* curve_errors) {
  const int points = in.o.curve_points;
  std::vector<double> mt, st;
  QueryTimes(in.m, ms, in.simulated, ss, points, &mt, &st, &it.phase_normalised);
  for (Curve c : kCurves) {
    const Bytes peak = MaxOf(in.m, ms.index, c);
    if (peak <= 0 || MaxOf(in.simulated, ss.index, c) < 0) continue;
    double sum = 0;
    for (int i = 0; i < points; ++i) {
      const Bytes a = HoldAt(in.m, ms.index, c, mt[i]);
      const Bytes b = HoldAt(in.simulated, ss.index, c, st[i]);
      sum += std::fabs(static_cast<double>(a - b));
      if (in.chart_curve == c) {
        r.chart_measured.push_back(a);
        r.chart_simulated.push_back(b);
      }
    }
    const double e = sum / points / static_cast<double>(peak) * 100.0;
    (c == Curve::kAllocated ? it.curve_error_pct.allocated
                            : c == Curve::kReserved ? it.curve_error_pct.reserved
                                                    : it.curve_error_pct.device) = e;
  }
  const auto& ce = it.curve_error_pct;
  if (auto e = ce.allocated ? ce.allocated : ce.reserved ? ce.reserved : ce.device) {
    curve_errors->push_back(*e);
  }
}

// The overall peaks from the aligned iterations: maxima over them, ends from the last one.
// `measured_index`: the samples of every aligned measured iteration.
void OverallOfIterations(const Timeline& m, const std::vector<size_t>& measured_index,
                         Report& r) {
  Peaks om, os;
  for (const IterationResult& it : r.iterations) {
    om.peak_allocated_bytes = std::max(om.peak_allocated_bytes, it.measured.peak_allocated_bytes);
    om.peak_reserved_bytes = std::max(om.peak_reserved_bytes, it.measured.peak_reserved_bytes);
    om.peak_device_bytes = std::max(om.peak_device_bytes, it.measured.peak_device_bytes);
    os.peak_allocated_bytes = std::max(os.peak_allocated_bytes, it.simulated.peak_allocated_bytes);
    os.peak_reserved_bytes = std::max(os.peak_reserved_bytes, it.simulated.peak_reserved_bytes);
    os.peak_device_bytes = std::max(os.peak_device_bytes, it.simulated.peak_device_bytes);
  }
  om.end_allocated_bytes = r.iterations.back().measured.end_allocated_bytes;
  om.end_reserved_bytes = r.iterations.back().measured.end_reserved_bytes;
  os.end_allocated_bytes = r.iterations.back().simulated.end_allocated_bytes;
  os.end_reserved_bytes = r.iterations.back().simulated.end_reserved_bytes;
  if (om.peak_device_bytes < 0 && os.peak_device_bytes >= 0 && HasCurve(m, Curve::kDevice)) {
    om.peak_device_bytes = MaxOf(m, measured_index, Curve::kDevice);
  }
  r.overall_measured = om;
  r.overall_simulated = os;
}

// No iteration aligned: the overall peaks of the whole curves, and the chart over both whole.
void OverallOfWholeCurves(const IterationInputs& in, Report& r) {
  const Timeline& m = in.m;
  const Timeline& simulated = in.simulated;
  std::vector<size_t> mi(m.samples.size()), si(simulated.samples.size());
  std::iota(mi.begin(), mi.end(), size_t{0});
  std::iota(si.begin(), si.end(), size_t{0});
  r.overall_measured = PeaksOf(m, mi);
  r.overall_simulated = PeaksOf(simulated, si);
  if (in.chart_curve) {
    IterSpan ms{mi, m.samples.empty() ? 0 : m.samples.front().time_us,
                m.samples.empty() ? 0 : m.samples.back().time_us};
    IterSpan ss{si, simulated.samples.empty() ? 0 : simulated.samples.front().time_us,
                simulated.samples.empty() ? 0 : simulated.samples.back().time_us};
    for (int i = 0; i < in.o.curve_points; ++i) {
      const double u = (i + 0.5) / in.o.curve_points;
      r.chart_measured.push_back(
          HoldAt(m, mi, *in.chart_curve, ms.start_us + u * (ms.end_us - ms.start_us)));
      r.chart_simulated.push_back(
          HoldAt(simulated, si, *in.chart_curve, ss.start_us + u * (ss.end_us - ss.start_us)));
    }
  }
  if (!HasIterations(simulated)) r.notes.push_back("the simulated timeline has no iterations");
}

// What follows the overall peaks: their errors and scale note, the mean curve error, the
// converged device levels, the simulated steady state and the verdict against --tolerance.
void FinishReport(const IterationInputs& in, const std::map<int, IterSpan>& sspans,
                  const std::vector<double>& curve_errors, Report& r) {
  // The simulated steady state over all simulated iterations, whether or not the profile has
  // iterations to align with (an nvidia-smi or npu-smi log has none).
  r.steady_state_simulated = SimulatedSteadyState(in.simulated, sspans);
  r.overall_error_pct = ErrorsOf(r.overall_measured, r.overall_simulated);
  if (std::string n = ScaleNote(r.overall_measured, r.overall_simulated); !n.empty()) {
    r.notes.push_back(std::move(n));
  }
  if (!curve_errors.empty()) {
    r.overall_curve_error_pct =
        std::accumulate(curve_errors.begin(), curve_errors.end(), 0.0) / curve_errors.size();
  }
  r.converged_device_measured = ConvergedLevel(in.m, Curve::kDevice);
  r.converged_device_simulated = ConvergedLevel(in.simulated, Curve::kDevice);
  r.converged_device_error_pct = Pct(r.converged_device_measured, r.converged_device_simulated);
  if (in.o.tolerance_pct) {
    for (const auto& e : {r.overall_error_pct.peak_allocated, r.overall_error_pct.peak_reserved,
                          r.overall_error_pct.peak_device}) {
      if (e && std::fabs(*e) > *in.o.tolerance_pct) r.failed = true;
    }
  }
}

}  // namespace

Report Compare(const Timeline& measured_in, const Timeline& simulated, const CompareOptions& o) {
  Report r;
  r.format = o.format.empty() ? measured_in.source : o.format;
  r.pipeline_rank = o.pipeline_rank;
  r.tolerance_pct = o.tolerance_pct;
  Timeline m = measured_in;
  for (const std::string& n : measured_in.notes) r.notes.push_back(n);
  const Alignment aligned = AlignMeasured(m, o, r);
  // --skip: drop the first N measured iterations (>= 1).
  std::map<int, IterSpan> mspans = SpansByIteration(m);
  mspans.erase(0);  // init is not an iteration
  r.measured_iterations = static_cast<int>(mspans.size());
  for (int i = 0; i < o.skip && !mspans.empty(); ++i) mspans.erase(mspans.begin());
  if (o.skip > 0) r.notes.push_back(fmt::format("skipped the profile's first {} iterations", o.skip));
  std::map<int, IterSpan> sspans = SpansByIteration(simulated);
  const int last_simulated = sspans.empty() ? -1 : sspans.rbegin()->first;
  const int offset = aligned.detected ? SteadyStateOffset(simulated, sspans, r) : 0;

  r.cumulative_peaks = !m.reported_peaks.empty();
  IterationInputs in{m, simulated, o, {}, std::nullopt};
  for (const auto& p : m.reported_peaks) in.reported[p.iteration] = p;
  for (Curve c : kCurves) {
    if (!in.chart_curve && HasCurve(m, c) && HasCurve(simulated, c)) in.chart_curve = c;
  }
  std::vector<size_t> all_measured_index;
  std::vector<std::pair<int, Bytes>> m_reserved;
  std::vector<double> curve_errors;
  for (const auto& [k, ms] : mspans) {
    if (last_simulated < 1) break;
    const int sk = std::min(k + offset, last_simulated);
    if (!sspans.count(sk)) continue;
    IterSpan ss = sspans.at(sk);
    // --profile-iterations on a profile without markers: its iteration 1 runs from the first
    // sample, so it holds whatever preceded (init); the simulated side then does too.
    if (k == 1 && sk == 1 && aligned.from_start && sspans.count(0)) ss = Joined(sspans.at(0), ss);
    IterationResult it;
    it.iteration = k;
    it.simulated_iteration = sk;
    it.measured = PeaksOf(m, ms.index);
    it.simulated = PeaksOf(simulated, ss.index);
    if (r.cumulative_peaks) UseCumulativePeaks(in, ss, k, it);
    it.error_pct = ErrorsOf(it.measured, it.simulated);
    if (!r.cumulative_peaks && ms.index.size() >= 2) {
      CompareCurves(in, ms, ss, it, r, &curve_errors);
    }
    all_measured_index.insert(all_measured_index.end(), ms.index.begin(), ms.index.end());
    m_reserved.emplace_back(k, it.measured.peak_reserved_bytes >= 0 ? it.measured.peak_reserved_bytes
                                                                    : it.measured.peak_device_bytes);
    r.iterations.push_back(it);
  }
  if (in.chart_curve) r.chart_curve = CurveName(*in.chart_curve);
  if (!r.iterations.empty()) {
    OverallOfIterations(m, all_measured_index, r);
    // Detected iterations repeat by construction and are numbered from the first repeat, so
    // where the profile's reserved stops growing is not known from them (left absent, "-").
    if (!aligned.detected) r.steady_state_measured = SteadyState(m_reserved);
  } else {
    OverallOfWholeCurves(in, r);
  }
  FinishReport(in, sspans, curve_errors, r);
  return r;
}

}  // namespace memsim::compare
