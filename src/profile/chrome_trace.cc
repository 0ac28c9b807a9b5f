// PyTorch profiler Chrome trace (docs/profile-formats.md, 'PyTorch profiler trace'): `[memory]`
// instant events carry the allocator's running "Total Allocated" / "Total Reserved" after each
// event (c10 CUDACachingAllocator.cpp reportMemoryUsageToProfiler), so each is one step sample; the
// file is not time-sorted. Iterations: the CPU-side `ProfilerStep#N` complete events (cat
// user_annotation; the gpu_user_annotation mirror is ignored); N counts profiler steps from 0, so
// ProfilerStep#N is training iteration N + 1 when profiling starts with training. Phases: user
// annotations named forward / backward / optimizer_step, and "Optimizer.step#..." (torch.optim's
// profiling hook) as the optimizer step. Timestamps: "ts" read as decimal text to integer ns (a
// double loses absolute-epoch precision); baseTimeNanoseconds is a constant offset, irrelevant once
// times are made relative.
#include "profile/chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <istream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "profile/importers.h"
#include "profile/json_error.h"

namespace memsim::profile::internal {
namespace {

using json = nlohmann::json;

struct Event {
  std::string ph, name, cat;
  std::optional<TimeNs> ts, dur;
  bool ts_bad = false;
  std::optional<int64_t> device_type, device_id, bytes, total_allocated, total_reserved;
};

class Handler : public nlohmann::json_sax<json> {
 public:
  Handler(ChromeTraceScan* scan, size_t max_samples) : scan_(scan), max_samples_(max_samples) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t v) override { return Number(v, nullptr); }
  bool number_unsigned(number_unsigned_t v) override {
    return Number(v > static_cast<number_unsigned_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v),
                  nullptr);
  }
  bool number_float(number_float_t, const string_t& raw) override { return Number(0, &raw); }
  bool string(string_t& v) override {
    if (InEvent()) {
      const std::string& k = keys_.back();
      if (depth_ == event_depth_) {
        if (k == "ph") ev_.ph = v;
        else if (k == "name") ev_.name = v;
        else if (k == "cat") ev_.cat = v;
        else if (k == "ts") SetTime(&ev_.ts, ParseMicrosToNs(v));
        else if (k == "dur") SetTime(&ev_.dur, ParseMicrosToNs(v));
      }
    }
    return true;
  }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (TooDeep()) return false;
    ++depth_;
    keys_.emplace_back();
    object_keys_.emplace_back();
    if (events_depth_ > 0 && depth_ == events_depth_ + 1) {
      ev_ = Event{};
      event_depth_ = depth_;
    }
    return true;
  }
  bool key(string_t& k) override {
    if (!object_keys_.back().Insert(k)) {
      // A document would keep the last value silently ("ts" twice in an event).
      std::string where;
      for (size_t i = 0; i + 1 < keys_.size(); ++i) where += "/" + (keys_[i].empty() ? "*" : keys_[i]);
      error_ = fmt::format("duplicate key '{}' in one object (at {})", k, where.empty() ? "/" : where);
      semantic_ = true;
      return false;
    }
    keys_.back() = k;
    return true;
  }
  bool end_object() override {
    if (event_depth_ > 0 && depth_ == event_depth_) {
      Finish();
      event_depth_ = 0;
    }
    --depth_;
    keys_.pop_back();
    object_keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (TooDeep()) return false;
    ++depth_;
    keys_.emplace_back();
    // The events: "traceEvents" of the top object, or a top-level array (JSON Array Format).
    if (events_depth_ == 0 && ((depth_ == 2 && keys_[0] == "traceEvents") || depth_ == 1)) {
      events_depth_ = depth_;
      scan_->has_trace_events = true;
    }
    return true;
  }
  bool end_array() override {
    if (depth_ == events_depth_) events_depth_ = -1;  // done; later arrays are not events
    --depth_;
    keys_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    error_position_ = position;
    error_ = ex.what();
    return false;
  }

  std::optional<size_t> error_position_;
  std::string error_;
  bool semantic_ = false;  // error_ is memsim's (duplicate key, nesting), not the parser's

 private:
  bool TooDeep() {
    if (keys_.size() < kMaxJsonProfileDepth) return false;
    error_ = fmt::format("nested deeper than memsim's limit of {} levels (a Chrome trace nests "
                         "about 5)",
                         kMaxJsonProfileDepth);
    semantic_ = true;
    return true;
  }
  std::vector<ObjectKeys> object_keys_;  // of the open objects, innermost last
  bool InEvent() const { return event_depth_ > 0 && depth_ >= event_depth_; }

  void SetTime(std::optional<TimeNs>* out, std::optional<TimeNs> v) {
    if (v) *out = v;
    else ev_.ts_bad = true;
  }

  bool Number(int64_t v, const std::string* raw) {
    if (depth_ == 1 && keys_[0] == "baseTimeNanoseconds") scan_->relative_ts = true;
    if (!InEvent()) return true;
    const std::string& k = keys_.back();
    if (depth_ == event_depth_) {
      if (k == "ts" || k == "dur") {
        std::optional<TimeNs> t = raw ? ParseMicrosToNs(*raw) : ToTimeNs(v, 1000);
        SetTime(k == "ts" ? &ev_.ts : &ev_.dur, t);
      }
      return true;
    }
    if (depth_ == event_depth_ + 1 && keys_[keys_.size() - 2] == "args") {
      // All [memory] args are integers (profiler_kineto.cpp AddGenericMetadata); a float there is
      // read by value.
      std::optional<int64_t> value = ToBytes(v, 1);
      if (raw) {
        const std::optional<double> d = ParseDouble(*raw);
        value = d ? ToBytes(*d, 1.0) : std::nullopt;
      }
      if (!value) return true;  // not a byte count (beyond 2^62): ignored

      if (k == "Device Type") ev_.device_type = *value;
      else if (k == "Device Id") ev_.device_id = *value;
      else if (k == "Bytes") ev_.bytes = *value;
      else if (k == "Total Allocated") ev_.total_allocated = *value;
      else if (k == "Total Reserved") ev_.total_reserved = *value;
    }
    return true;
  }

  void Finish() {
    if (ev_.name == "[memory]") {
      if (!ev_.ts || ev_.ts_bad) {
        if (ev_.ts_bad) ++scan_->bad_ts_events;
        return;
      }
      if (ev_.device_type.value_or(1) == 0) {
        ++scan_->cpu_events;
        return;
      }
      const int device = static_cast<int>(ev_.device_id.value_or(0));
      if (ev_.total_allocated) {
        timeline::Sample s;
        s.allocated_bytes = *ev_.total_allocated;
        if (ev_.total_reserved) s.reserved_bytes = *ev_.total_reserved;
        auto [it, inserted] = scan_->devices.try_emplace(device, max_samples_);
        it->second.Add(*ev_.ts, s);
      } else if (ev_.bytes) {
        scan_->deltas[device].emplace_back(*ev_.ts, *ev_.bytes);
      }
      return;
    }
    if (ev_.name == "[OutOfMemory]") {
      ++scan_->oom_events;
      return;
    }
    if (ev_.ph != "X" || !ev_.ts || !ev_.dur || ev_.cat == "gpu_user_annotation") return;
    const std::optional<TimeNs> end = AddTimeNs(*ev_.ts, *ev_.dur);
    if (!end) return;  // a span ending beyond the time range is not a step or phase
    if (ev_.name.rfind("ProfilerStep#", 0) == 0) {
      auto step = ParseInt(std::string_view(ev_.name).substr(13));
      if (!step || *step < 0 || *step >= 1'000'000'000) return;
      scan_->spans.push_back({*ev_.ts, *end, static_cast<int>(*step) + 1, Phase::kUnknown, ev_.name});
      return;
    }
    if (ev_.cat != "user_annotation") return;
    std::optional<Phase> phase;
    if (ev_.name == "forward") phase = Phase::kForward;
    if (ev_.name == "backward") phase = Phase::kBackward;
    if (ev_.name == "optimizer_step" || ev_.name.rfind("Optimizer.step#", 0) == 0) {
      phase = Phase::kOptimizerStep;
    }
    if (phase) scan_->spans.push_back({*ev_.ts, *end, -1, *phase, ev_.name});
  }

  ChromeTraceScan* scan_;
  size_t max_samples_;
  int depth_ = 0;
  int events_depth_ = 0;  // depth of the events array; -1 once it has ended
  int event_depth_ = 0;   // depth of the event object being read; 0 outside
  std::vector<std::string> keys_;
  Event ev_;
};

}  // namespace

ChromeTraceScan ScanChromeTrace(const std::string& path, size_t max_samples) {
  ChromeTraceScan scan;
  GzStreamBuf buf(path);
  std::istream in(&buf);
  Handler handler(&scan, max_samples);
  const bool ok = json::sax_parse(in, &handler, json::input_format_t::json, /*strict=*/true);
  if (handler.semantic_) throw InputError(fmt::format("{}: {}", path, handler.error_));
  if (!ok || handler.error_position_) {
    throw InputError(JsonErrorMessage(path, handler.error_position_.value_or(0), handler.error_,
                                      "a Chrome trace JSON object"));
  }
  return scan;
}

timeline::Timeline LoadChromeTrace(const std::string& path, const LoadProfileOptions& options) {
  ChromeTraceScan scan = ScanChromeTrace(path, options.max_samples);
  if (!scan.has_trace_events) {
    throw InputError(fmt::format(
        "{}: no 'traceEvents' array, expected a PyTorch profiler Chrome trace", path));
  }
  // Old traces: integrate the Bytes deltas in time order (memory from before the profiler
  // started is invisible).
  for (auto& [device, deltas] : scan.deltas) {
    if (scan.devices.count(device)) continue;
    std::stable_sort(deltas.begin(), deltas.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    auto [it, inserted] = scan.devices.try_emplace(device, options.max_samples);
    int64_t allocated = 0;
    for (const auto& [t, d] : deltas) {
      const std::optional<int64_t> sum = CheckedAdd(allocated, d);
      if (!sum) {
        throw InputError(fmt::format("{}: [memory] Bytes: the deltas of device {} add up beyond "
                                     "2^63 bytes, expected allocation sizes",
                                     path, device));
      }
      allocated = *sum;
      timeline::Sample s;
      s.allocated_bytes = std::max<int64_t>(allocated, 0);
      it->second.Add(t, s);
    }
  }
  if (scan.devices.empty()) {
    throw InputError(fmt::format(
        "{}: no device [memory] events, expected a trace recorded with profile_memory=True{}{}",
        path, scan.cpu_events > 0 ? fmt::format(" ({} CPU events ignored)", scan.cpu_events) : "",
        scan.bad_ts_events > 0
            ? fmt::format(" ({} events skipped: 'ts' unreadable or beyond 2^62 ns)", scan.bad_ts_events)
            : ""));
  }
  int device = scan.devices.begin()->first;
  if (options.device_index >= 0) {
    if (!scan.devices.count(options.device_index)) {
      throw InputError(fmt::format("{}: no [memory] events for device {} (devices in the file: {})",
                                   path, options.device_index, [&] {
                                     std::string s;
                                     for (const auto& [k, v] : scan.devices) {
                                       s += fmt::format("{}{}", s.empty() ? "" : ", ", k);
                                     }
                                     return s;
                                   }()));
    }
    device = options.device_index;
  }
  const size_t steps = std::count_if(scan.spans.begin(), scan.spans.end(),
                                     [](const RawSpan& s) { return s.phase == Phase::kUnknown; });
  timeline::Timeline out =
      scan.devices.at(device).Finish(std::move(scan.spans), Format::kTorchTrace);
  out.device_index = device;
  out.notes.push_back(fmt::format("device {}, {} [memory] samples, {} ProfilerStep spans, {} time base{}",
                                  device, out.samples.size(), steps,
                                  scan.relative_ts ? "relative (baseTimeNanoseconds)" : "absolute",
                                  scan.deltas.count(device) ? "; no Total Allocated: Bytes integrated" : ""));
  if (scan.cpu_events > 0) out.notes.push_back(fmt::format("ignored {} CPU [memory] events", scan.cpu_events));
  if (scan.bad_ts_events > 0) {
    out.notes.push_back(fmt::format("skipped {} [memory] events: 'ts' unreadable or beyond 2^62 ns",
                                    scan.bad_ts_events));
  }
  if (scan.oom_events > 0) out.notes.push_back(fmt::format("the trace holds {} [OutOfMemory] events", scan.oom_events));
  return out;
}

}  // namespace memsim::profile::internal
