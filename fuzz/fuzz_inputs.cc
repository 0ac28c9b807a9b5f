// libFuzzer entry point for every kind of input memsim reads (fuzz/README.md). One binary, one
// target per kind, chosen by $MEMSIM_FUZZ_TARGET (one binary links once, which keeps .ci/run
// short). Each input is written to a private temporary file and read by the same function the
// command line uses. Bad input must end in memsim::InputError (exit 2 in the CLI); any other
// exception, a MEMSIM_CHECK, a sanitizer report, a timeout or running out of memory is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include "alloc/allocator.h"
#include "config/launch_script.h"
#include "config/load.h"
#include "core/error.h"
#include "core/pickle.h"
#include "profile/profile.h"
#include "replay/trace.h"

namespace {

using memsim::profile::Format;

std::string& TempPath() {
  static std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/memsim-fuzz-" + std::to_string(getpid());
  }();
  return path;
}

// Writes the input to TempPath() + suffix (the suffix matters where a reader looks at names).
std::string WriteInput(const std::uint8_t* data, std::size_t size, const char* suffix) {
  const std::string path = TempPath() + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    std::fprintf(stderr, "memsim fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

void LoadProfileOf(Format format, const std::string& path) {
  memsim::profile::LoadProfileOptions options;
  options.max_samples = 64;  // small, so decimation runs too
  memsim::profile::LoadProfile(path, format, options);
}

void ReplayText(std::string_view text, memsim::alloc::Backend backend) {
  const memsim::replay::Trace trace = memsim::replay::ParseTrace(text, "fuzz-trace", 0);
  memsim::alloc::AllocatorOptions options = memsim::alloc::ParseAllocConf("", backend);
  options.capacity_bytes = std::int64_t{1} << 34;  // 16 GiB: the out-of-memory paths run too
  auto allocator = memsim::alloc::NewCachingAllocator(options);
  memsim::replay::Replay(trace, *allocator, /*keep_rows=*/false);
  const std::string problem = allocator->CheckInvariants();
  if (!problem.empty()) {
    std::fprintf(stderr, "memsim fuzz: allocator invariant broken: %s\n", problem.c_str());
    std::abort();
  }
}

struct Target {
  const char* name;
  const char* suffix;
  std::function<void(const std::string& path, std::string_view text)> run;
};

const Target kTargets[] = {
    {"config", ".json",
     [](const std::string& path, std::string_view) {
       memsim::config::LoadOptions load;
       load.use_embedded_default = false;
       memsim::config::LoadSetup(path, load);
     }},
    {"model", ".json",
     [](const std::string& path, std::string_view) {
       memsim::config::LoadOptions load;  // the embedded default config with this model
       load.model_path = path;
       memsim::config::LoadSetup("", load);
     }},
    {"replay-csv", ".csv",
     [](const std::string&, std::string_view text) {
       ReplayText(text, memsim::alloc::Backend::kCuda);
       ReplayText(text, memsim::alloc::Backend::kNpu);
     }},
    {"replay-snapshot", ".json",
     [](const std::string&, std::string_view text) {
       ReplayText(text, memsim::alloc::Backend::kCuda);
     }},
    {"replay-pickle", ".pickle",
     [](const std::string&, std::string_view text) {
       memsim::PickleToJson(text, "fuzz-pickle");  // the reader alone, then as a replay does
       ReplayText(text, memsim::alloc::Backend::kNpu);
     }},
    {"torch-trace", ".json", [](const std::string& p, auto) { LoadProfileOf(Format::kTorchTrace, p); }},
    {"torch-snapshot", ".json",
     [](const std::string& p, auto) { LoadProfileOf(Format::kTorchSnapshot, p); }},
    {"npu-profiler", ".csv", [](const std::string& p, auto) { LoadProfileOf(Format::kNpuProfiler, p); }},
    {"npu-mem", ".csv", [](const std::string& p, auto) { LoadProfileOf(Format::kNpuMem, p); }},
    {"npu-smi", ".txt", [](const std::string& p, auto) { LoadProfileOf(Format::kNpuSmi, p); }},
    {"nvidia-smi", ".csv", [](const std::string& p, auto) { LoadProfileOf(Format::kNvidiaSmi, p); }},
    {"megatron-log", ".log", [](const std::string& p, auto) { LoadProfileOf(Format::kMegatronLog, p); }},
    {"memsim-csv", ".csv", [](const std::string& p, auto) { LoadProfileOf(Format::kMemsimCsv, p); }},
    {"profile-auto", ".bin", [](const std::string& p, auto) { LoadProfileOf(Format::kAuto, p); }},
    // A launch script or training log given to --megatron-args: read (as `run --megatron-args`
    // reads it) with two script arguments, so that $1/$@ and functions' arguments run too.
    {"launch-script", ".sh",
     [](const std::string& p, auto) { memsim::config::ReadMegatronArgsFile(p, {"4", "bf16"}); }},
};

const Target* g_target = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("MEMSIM_FUZZ_TARGET");
  for (const Target& t : kTargets) {
    if (name != nullptr && std::strcmp(name, t.name) == 0) g_target = &t;
  }
  if (g_target == nullptr) {
    std::fprintf(stderr, "memsim fuzz: set MEMSIM_FUZZ_TARGET to one of:");
    for (const Target& t : kTargets) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = WriteInput(data, size, g_target->suffix);
  try {
    g_target->run(path, std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const memsim::InputError&) {
    // Bad input, reported: the expected outcome for most inputs.
  }
  std::remove(path.c_str());
  return 0;
}
