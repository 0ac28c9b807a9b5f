#include "profile/writers.h"

#include <cmath>
#include <cstdio>
#include <fstream>

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
  const std::string path = std::string(MEMSIM_SOURCE_DIR) + "/build/test_tmp_" + name;
  std::remove(path.c_str());
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

}  // namespace memsim::testing
