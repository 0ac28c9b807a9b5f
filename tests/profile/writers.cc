#include "profile/writers.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <fmt/core.h>

namespace memsim::testing {

using timeline::kUnknownBytes;
using timeline::Sample;
using timeline::Timeline;

timeline::Timeline KnownTimeline(int iterations) {
  Timeline t;
  t.source = "memsim";
  double now = 0;
  Bytes allocated = 0, reserved = 0;
  auto emit = [&](int iteration, Phase phase) {
    reserved = std::max(reserved, RoundUp(allocated, 512 * kMiB));
    Sample s;
    s.time_us = now;
    s.iteration = iteration;
    s.phase = phase;
    s.allocated_bytes = allocated;
    s.reserved_bytes = reserved;
    s.active_bytes = allocated;
    s.device_bytes = reserved + 3000 * kMiB;
    t.samples.push_back(s);
    now += 1000;
  };
  auto mark = [&](int iteration, Phase phase, std::string label) {
    t.markers.push_back({now, iteration, phase, std::move(label)});
  };
  mark(0, Phase::kInit, "init");
  for (int i = 1; i <= 4; ++i) {  // parameters + gradients: 4 x 512 MiB
    allocated += 512 * kMiB;
    emit(0, Phase::kInit);
  }
  for (int k = 1; k <= iterations; ++k) {
    mark(k, Phase::kForward, "forward");
    for (int i = 0; i < 8; ++i) {
      allocated += 256 * kMiB;
      emit(k, Phase::kForward);
    }
    mark(k, Phase::kBackward, "backward");
    for (int i = 0; i < 8; ++i) {
      allocated -= 256 * kMiB;
      emit(k, Phase::kBackward);
    }
    mark(k, Phase::kOptimizerStep, "optimizer_step");
    if (k == 1) allocated += 1024 * kMiB;  // optimizer states appear in the first step
    allocated += 512 * kMiB;               // temporary
    emit(k, Phase::kOptimizerStep);
    allocated -= 512 * kMiB;
    emit(k, Phase::kOptimizerStep);
  }
  return t;
}

void ScaleIteration(timeline::Timeline& t, int iteration, double factor) {
  auto scale = [&](Bytes& b) {
    if (b >= 0) b = std::llround(static_cast<double>(b) * factor);
  };
  for (Sample& s : t.samples) {
    if (s.iteration != iteration) continue;
    scale(s.allocated_bytes);
    scale(s.reserved_bytes);
    scale(s.active_bytes);
    scale(s.device_bytes);
  }
}

std::string TempPath(const std::string& name) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("memsim_test_{}_{}", ::getpid(), name))
                               .string();
  std::filesystem::remove_all(path);
  return path;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

namespace {
std::string Field(Bytes b) { return b < 0 ? "" : fmt::format("{}", b); }
double Mib(Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); }
}  // namespace

std::string WriteMemsimCsv(const timeline::Timeline& t) {
  std::string out = "time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes\n";
  for (const Sample& s : t.samples) {
    out += fmt::format("{:.3f},{},{},{},{},{},{}\n", s.time_us, s.iteration, PhaseName(s.phase),
                       Field(s.allocated_bytes), Field(s.reserved_bytes), Field(s.active_bytes),
                       Field(s.device_bytes));
  }
  return out;
}

std::string WriteMegatronLog(const timeline::Timeline& t) {
  std::string out;
  Bytes max_alloc = 0, max_res = 0;
  for (size_t i = 0; i < t.samples.size(); ++i) {
    const Sample& s = t.samples[i];
    max_alloc = std::max(max_alloc, s.allocated_bytes);
    max_res = std::max(max_res, s.reserved_bytes);
    const bool last_of_iteration = i + 1 == t.samples.size() || t.samples[i + 1].iteration != s.iteration;
    if (!last_of_iteration || s.iteration < 1) continue;
    out += fmt::format(" iteration {:>8}/      10 | consumed samples: {:>12} |\n", s.iteration,
                       s.iteration * 64);
    out += fmt::format(
        "[Rank 0] (after {} iterations) memory (MB) | allocated: {:.2f} | max allocated: {:.2f} | "
        "reserved: {:.2f} | max reserved: {:.2f}\n",
        s.iteration, Mib(s.allocated_bytes), Mib(max_alloc), Mib(s.reserved_bytes), Mib(max_res));
  }
  return out;
}

namespace {
// Wall clock "2025/07/02 14:03:MM:SS.mmm" from a time in us after 14:00:00.000.
std::string Clock(double time_us, char date_sep) {
  const int64_t ms = std::llround(time_us / 1000.0);
  const int64_t sec = ms / 1000, minute = sec / 60;
  return fmt::format("2025{}07{}02 14:{:02}:{:02}.{:03}", date_sep, date_sep, minute, sec % 60,
                     ms % 1000);
}
}  // namespace

std::string WriteNvidiaSmiCsv(const timeline::Timeline& t) {
  std::string out = "timestamp, index, memory.used [MiB], memory.total [MiB]\n";
  for (const Sample& s : t.samples) {
    // nvidia-smi prints whole MiB: round to nearest.
    out += fmt::format("{}, 0, {} MiB, 81559 MiB\n", Clock(s.time_us, '/'),
                       std::llround(Mib(s.device_bytes)));
    out += fmt::format("{}, 1, 1024 MiB, 81559 MiB\n", Clock(s.time_us, '/'));
  }
  return out;
}

std::string WriteNpuSmi(const timeline::Timeline& t) {
  std::string out;
  for (const Sample& s : t.samples) {
    out += Clock(s.time_us, '-') + "\n";
    out += "+---------------------------+---------------+----------------------------------------------------+\n";
    out += "| npu-smi 99.0.0                   Version: 99.0.0                                               |\n";
    out += "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|\n";
    out += "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |\n";
    out += "+===========================+===============+====================================================+\n";
    out += "| 0     910X                | OK            | 211.4       47                0    / 0             |\n";
    out += fmt::format("| 0                         | 0000:A1:00.0  | 63          0    / 0          {:>5}/ 65536         |\n",
                       std::llround(Mib(s.device_bytes)));
    out += "+===========================+===============+====================================================+\n";
  }
  return out;
}

namespace {
// Start and end (the next iteration's first sample, or the last sample) of each iteration.
std::vector<std::pair<double, double>> IterationSpans(const Timeline& t, int* first) {
  std::vector<std::pair<double, double>> spans;
  *first = -1;
  for (size_t i = 0; i < t.samples.size(); ++i) {
    const int k = t.samples[i].iteration;
    if (k < 1) continue;
    if (*first < 0) *first = k;
    if (static_cast<int>(spans.size()) <= k - *first) spans.push_back({t.samples[i].time_us, 0});
    spans.back().second = i + 1 < t.samples.size() ? t.samples[i + 1].time_us : t.samples[i].time_us;
  }
  return spans;
}
}  // namespace

std::string WriteChromeTrace(const timeline::Timeline& t) {
  const double offset_us = 5000000.0;  // ts of the first sample
  std::vector<std::string> events;
  int first = 0;
  const auto spans = IterationSpans(t, &first);
  for (size_t k = 0; k < spans.size(); ++k) {
    events.push_back(fmt::format(
        "{{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#{}\", \"pid\": 1, "
        "\"tid\": 1, \"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{}}}}",
        first + static_cast<int>(k) - 1, offset_us + spans[k].first, spans[k].second - spans[k].first));
  }
  // Phase annotations: each run of one phase within an iteration.
  for (size_t i = 0; i < t.samples.size();) {
    size_t j = i;
    while (j < t.samples.size() && t.samples[j].phase == t.samples[i].phase &&
           t.samples[j].iteration == t.samples[i].iteration) {
      ++j;
    }
    const Phase p = t.samples[i].phase;
    if (p == Phase::kForward || p == Phase::kBackward || p == Phase::kOptimizerStep) {
      const double end = j < t.samples.size() ? t.samples[j].time_us : t.samples[j - 1].time_us;
      events.push_back(fmt::format(
          "{{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"{}\", \"pid\": 1, \"tid\": 1, "
          "\"ts\": {:.3f}, \"dur\": {:.3f}}}",
          PhaseName(p), offset_us + t.samples[i].time_us, end - t.samples[i].time_us));
    }
    i = j;
  }
  for (auto it = t.samples.rbegin(); it != t.samples.rend(); ++it) {
    events.push_back(fmt::format(
        "{{\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"s\": \"t\", \"name\": \"[memory]\", "
        "\"pid\": 1, \"tid\": 1, \"ts\": {:.3f}, \"args\": {{\"Device Type\": 1, \"Device Id\": 0, "
        "\"Addr\": 1, \"Bytes\": 0, \"Total Allocated\": {}, \"Total Reserved\": {}}}}}",
        offset_us + it->time_us, it->allocated_bytes, it->reserved_bytes));
  }
  std::string out =
      "{\"schemaVersion\": 1, \"displayTimeUnit\": \"ms\", \"baseTimeNanoseconds\": "
      "1751328000000000000,\n \"traceEvents\": [\n";
  for (size_t i = 0; i < events.size(); ++i) out += (i ? ",\n  " : "  ") + events[i];
  return out + "\n], \"traceName\": \"rt.json\"}\n";
}

std::string WriteSnapshot(const timeline::Timeline& t) {
  std::vector<std::string> entries;
  std::vector<std::pair<int64_t, Bytes>> live;  // (addr, size) stack
  int64_t next_addr = 1 << 20;
  std::vector<Bytes> segments;
  Bytes allocated = 0, reserved = 0;
  auto entry = [&](const char* action, int64_t addr, Bytes size, double time_us) {
    entries.push_back(fmt::format(
        "{{\"action\": \"{}\", \"addr\": {}, \"size\": {}, \"stream\": 0, \"time_us\": {}}}", action, addr,
        size, 1751400000000000 + std::llround(time_us)));
  };
  for (const Sample& s : t.samples) {
    if (s.reserved_bytes > reserved) {
      segments.push_back(s.reserved_bytes - reserved);
      entry("segment_alloc", next_addr, s.reserved_bytes - reserved, s.time_us);
      next_addr += s.reserved_bytes - reserved;
      reserved = s.reserved_bytes;
    }
    while (reserved > s.reserved_bytes && !segments.empty()) {  // release whole segments
      entry("segment_free", 0, segments.back(), s.time_us);
      reserved -= segments.back();
      segments.pop_back();
    }
    Bytes want = s.allocated_bytes;
    while (allocated > want) {  // free the newest blocks, re-allocate any overshoot
      auto [addr, size] = live.back();
      live.pop_back();
      entry("free_requested", addr, size, s.time_us);
      entry("free_completed", addr, size, s.time_us);
      allocated -= size;
    }
    if (want > allocated) {
      live.push_back({next_addr, want - allocated});
      entry("alloc", next_addr, want - allocated, s.time_us);
      next_addr += want - allocated;
      allocated = want;
    }
  }
  std::string blocks;
  for (size_t i = 0; i < live.size(); ++i) {
    blocks += fmt::format("{}{{\"address\": {}, \"size\": {}, \"requested_size\": {}, \"state\": "
                          "\"active_allocated\"}}",
                          i ? ", " : "", live[i].first, live[i].second, live[i].second);
  }
  std::string segs;
  for (size_t i = 0; i < segments.size(); ++i) {
    segs += fmt::format("{}{{\"device\": 0, \"address\": {}, \"total_size\": {}, \"blocks\": [{}]}}",
                        i ? ", " : "", i, segments[i], i == 0 ? blocks : "");
  }
  std::string out = "{\"segments\": [" + segs + "],\n \"device_traces\": [[\n";
  for (size_t i = 0; i < entries.size(); ++i) out += (i ? ",\n  " : "  ") + entries[i];
  return out + "\n]]}\n";
}

namespace {
constexpr int64_t kEpochUs = 1751500000000000;
std::string EpochUs(double time_us) {
  const int64_t ns = std::llround(time_us * 1000.0);
  return fmt::format("{}.{:03}", kEpochUs + ns / 1000, ns % 1000);
}
}  // namespace

void WriteAscendFolder(const timeline::Timeline& t, const std::string& dir, bool operator_memory) {
  std::filesystem::remove_all(dir);
  const std::string out_dir = dir + "/ASCEND_PROFILER_OUTPUT";
  std::filesystem::create_directories(out_dir);
  if (operator_memory) {
    std::string ops =
        "Name,Size(KB),Allocation Time(us),Release Time(us),Active Release Time(us),Duration(us),"
        "Active Duration(us),Allocation Total Allocated(MB),Allocation Total Reserved(MB),"
        "Allocation Total Active(MB),Release Total Allocated(MB),Release Total Reserved(MB),"
        "Release Total Active(MB),Stream Ptr,Device Type\r\n";
    ops += "cann::SimAddN_ws,256,1751500000000000.500,,,,,1.0,2.0,,,,,,NPU:0\r\n";
    for (auto it = t.samples.rbegin(); it != t.samples.rend(); ++it) {
      ops += fmt::format("aten::empty_strided,4.0,{}\t,,,,,{},{},{},,,,187650000012345,NPU:0\r\n",
                         EpochUs(it->time_us), Mib(it->allocated_bytes), Mib(it->reserved_bytes),
                         Mib(it->active_bytes));
    }
    WriteFile(out_dir + "/operator_memory.csv", ops);
  }
  std::string csv =
      "Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),Stream "
      "Ptr,Device Type\r\n";
  for (const Sample& s : t.samples) {
    if (s.device_bytes >= 0) {
      csv += fmt::format("APP,{},,{},,,NPU:0\r\n", EpochUs(s.time_us), Mib(s.device_bytes));
    }
  }
  for (auto it = t.samples.rbegin(); it != t.samples.rend(); ++it) {
    csv += fmt::format("PTA,{}\t,{},{},{},187650000012345,NPU:0\r\n", EpochUs(it->time_us),
                       Mib(it->allocated_bytes), Mib(it->reserved_bytes), Mib(it->active_bytes));
  }
  if (!operator_memory) WriteFile(out_dir + "/memory_record.csv", csv);
  std::string trace = "[\n";
  int first = 0;
  const auto spans = IterationSpans(t, &first);
  for (size_t k = 0; k < spans.size(); ++k) {
    trace += fmt::format(
        "{}{{\"ph\": \"X\", \"name\": \"ProfilerStep#{}\", \"pid\": 1, \"tid\": 1, \"ts\": \"{}\", "
        "\"dur\": {:.3f}, \"args\": {{}}}}\n",
        k ? "," : "", first + static_cast<int>(k) - 1, EpochUs(spans[k].first),
        spans[k].second - spans[k].first);
  }
  WriteFile(out_dir + "/trace_view.json", trace + "]\n");
}

std::string WriteNpuMem(const timeline::Timeline& t) {
  std::string out = "Device_id,event,ddr(KB),hbm(KB),memory(KB),timestamp(us)\n";
  for (const Sample& s : t.samples) {
    const double kib = static_cast<double>(s.device_bytes) / 1024.0;
    out += fmt::format("0,APP,0,{},{},{}\n", kib / 2, kib / 2, EpochUs(s.time_us));
    out += fmt::format("0,Device,0,{},{},{}\n", kib, kib, EpochUs(s.time_us));
  }
  return out;
}

}  // namespace memsim::testing
