// Truncated and corrupted copies of every fixture: each load either succeeds or throws one
// InputError -- never another exception, never a crash (deterministic: fixed cut points and a
// fixed byte-flip pattern).
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "profile/profile.h"
#include "profile/writers.h"

namespace memsim::profile {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Loads `text` as `format`; returns "" or the InputError message; other exceptions escape.
std::string TryLoad(const std::string& text, Format format, const std::string& name) {
  const std::string path = testing::TempPath(name);
  testing::WriteFile(path, text);
  try {
    LoadProfile(path, format);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("truncated and corrupted fixtures give InputError or load", "[profile]") {
  struct Row {
    const char* file;
    Format format;
  };
  const Row rows[] = {
      {"memsim.csv", Format::kMemsimCsv},           {"megatron.log", Format::kMegatronLog},
      {"nvidia_smi.csv", Format::kNvidiaSmi},       {"nvidia_smi_index.csv", Format::kNvidiaSmi},
      {"npu_smi.txt", Format::kNpuSmi},             {"npu_smi_310p.txt", Format::kNpuSmi},
      {"trace_new.json", Format::kTorchTrace},      {"trace_old.json.gz", Format::kTorchTrace},
      {"snapshot.json", Format::kTorchSnapshot},    {"memory_record.csv", Format::kNpuProfiler},
      {"operator_memory.csv", Format::kNpuProfiler}, {"npu_mem.csv", Format::kNpuMem},
      {"recorded.csv", Format::kMemsimCsv},
  };
  for (const Row& row : rows) {
    const std::string text = Read(testing::DataPath(row.file));
    REQUIRE(!text.empty());
    for (size_t cut = 0; cut < text.size(); cut += 1 + text.size() / 40) {
      INFO(row.file << " cut at " << cut);
      CHECK_NOTHROW(TryLoad(text.substr(0, cut), row.format, "robust_cut"));
    }
    for (size_t at = 0; at < text.size(); at += 1 + text.size() / 25) {
      for (const char c : {'\0', '"', '-', 'x', '9', '\n', ',', '|', '{', ']'}) {
        std::string bad = text;
        bad[at] = c;
        INFO(row.file << " byte " << at << " set to " << static_cast<int>(c));
        CHECK_NOTHROW(TryLoad(bad, row.format, "robust_flip"));
      }
    }
  }
}

}  // namespace
}  // namespace memsim::profile
