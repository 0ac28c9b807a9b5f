// Truncated, empty, wrong-kind and corrupted input: one InputError each, naming the file, the
// line or byte offset and what was expected (messages pinned verbatim).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "profile/profile.h"
#include "profile/writers.h"

namespace memsim::profile {
namespace {

std::string LoadError(const std::string& text, Format format, const std::string& name) {
  const std::string path = testing::TempPath(name);
  testing::WriteFile(path, text);
  try {
    LoadProfile(path, format);
  } catch (const InputError& e) {
    const std::string message = e.what();
    // Strip the temp directory so the expectations read as "<file>:...".
    return message.substr(0, path.size()) == path ? "<file>" + message.substr(path.size()) : message;
  }
  return "no error";
}

TEST_CASE("empty files", "[profile]") {
  CHECK(LoadError("", Format::kMemsimCsv, "empty.csv") ==
        "<file>: empty file, expected the memsim-csv header and samples");
  CHECK(LoadError("", Format::kMegatronLog, "empty.log") ==
        "<file>: empty file, expected Megatron report_memory lines");
  CHECK(LoadError("", Format::kNvidiaSmi, "empty_smi.csv") ==
        "<file>: empty file, expected the nvidia-smi CSV header and samples");
  CHECK(LoadError("", Format::kNpuSmi, "empty_npu.txt") ==
        "<file>: empty file, expected npu-smi info output");
  CHECK(LoadError("", Format::kAuto, "empty_auto") == "<file>: empty file, expected a memory profile");
}

TEST_CASE("wrong kind of file", "[profile]") {
  const std::string megatron =
      "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0 | "
      "reserved: 4.0 | max reserved: 4.0\n";
  CHECK(LoadError(megatron, Format::kMemsimCsv, "wrong1.csv") ==
        "<file>:1: expected the memsim-csv header "
        "'time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes'");
  CHECK(LoadError("time_us,allocated_bytes\n0,1\n", Format::kMegatronLog, "wrong2.log") ==
        "<file>:2: no '(after N iterations) memory (MB) | allocated: ...' line, expected "
        "Megatron report_memory output");
  CHECK(LoadError("time_us,allocated_bytes\n0,1\n", Format::kNvidiaSmi, "wrong3.csv") ==
        "<file>:1: expected the nvidia-smi CSV header 'timestamp, memory.used [MiB], ...' (run "
        "nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv)");
  CHECK(LoadError(megatron, Format::kNpuSmi, "wrong4.txt") ==
        "<file>:1: no npu-smi device table ('| NPU   Name | Health | ...'), expected npu-smi info "
        "output");
  CHECK(LoadError("hello\nworld\n", Format::kAuto, "wrong5.txt") ==
        "<file>: cannot tell the profile format from its first bytes; expected one of "
        "torch-trace, torch-snapshot, npu-profiler, npu-mem, npu-smi, nvidia-smi, megatron-log, "
        "memsim-csv (name it with --format)");
}

TEST_CASE("corrupted values and binary data", "[profile]") {
  const std::string header =
      "time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes\n";
  CHECK(LoadError(header + "0,0,init,1,2,,\n1,1,forward,abc,2,,\n", Format::kMemsimCsv, "bad1.csv") ==
        "<file>:3: allocated_bytes: expected a non-negative integer number of bytes, got 'abc'");
  CHECK(LoadError(header + "0,0,forwrd,1,2,,\n", Format::kMemsimCsv, "bad2.csv") ==
        "<file>:2: phase: expected init, forward, backward, optimizer_step or unknown, got 'forwrd'");
  CHECK(LoadError(header + "0,0,init,1,2\n", Format::kMemsimCsv, "bad3.csv") ==
        "<file>:2: expected 7 fields as in the header, got 5");
  CHECK(LoadError(header + std::string("0,0,init,1,\0,,\n", 16), Format::kMemsimCsv, "bad4.csv") ==
        "<file>: byte 92: binary data (a NUL byte), expected text");  // 81-byte header + "0,0,init,1,"
  CHECK(LoadError("[Rank 0] (after 1 iterations) memory (MB) | allocated: x | max allocated: 2.0\n",
                  Format::kMegatronLog, "bad5.log") ==
        "<file>:1: expected 'memory (MB) | allocated: <MiB> | max allocated: <MiB> | reserved: "
        "<MiB> | max reserved: <MiB>'");
  CHECK(LoadError("timestamp, memory.used [MiB]\n2025/07/02 14:03:11.482, lots MiB\n",
                  Format::kNvidiaSmi, "bad6.csv") ==
        "<file>:2: memory.used: expected '<integer> MiB' below 2^42 MiB, got 'lots MiB'");
  CHECK(LoadError("timestamp, memory.used [MiB]\nyesterday, 5 MiB\n", Format::kNvidiaSmi, "bad7.csv") ==
        "<file>:2: timestamp: expected 'YYYY/MM/DD HH:MM:SS.mmm', got 'yesterday'");
}

TEST_CASE("truncated files", "[profile]") {
  const std::string table =
      "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|\n"
      "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |\n"
      "+===========================+===============+====================================================+\n"
      "| 0     910X                | OK            | 211.4       47                0    / 0             |\n";
  CHECK(LoadError(table, Format::kNpuSmi, "trunc1.txt") ==
        "<file>:4: truncated npu-smi table: expected the second row of the last device");
  CHECK(LoadError(table.substr(0, table.find('\n') + 1), Format::kNpuSmi, "trunc2.txt") ==
        "<file>:1: truncated npu-smi table: expected the second header row");
  CHECK(LoadError("time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes\n",
                  Format::kMemsimCsv, "trunc3.csv") ==
        "<file>:1: no samples after the header, expected at least one row");
  CHECK(LoadError("time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes\n"
                  "0,0,init,1,2",
                  Format::kMemsimCsv, "trunc4.csv") ==
        "<file>:2: expected 7 fields as in the header, got 5");
}

TEST_CASE("a missing file and a device that is not in the profile", "[profile]") {
  const std::string path = testing::TempPath("missing.csv");
  CHECK_THROWS_WITH(LoadProfile(path, Format::kMemsimCsv),
                    path + ": cannot open: No such file or directory");
  LoadProfileOptions o;
  o.device_index = 7;
  CHECK_THROWS_WITH(LoadProfile(testing::DataPath("npu_smi.txt"), Format::kNpuSmi, o),
                    testing::DataPath("npu_smi.txt") +
                        ": no samples for device 7 (devices in the file: 0-1)");
}

TEST_CASE("a memsim-csv iteration beyond 10^9 says the range", "[profile]") {
  // It read "expected an integer >= -1, got '99999999999'".
  CHECK(LoadError("time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,"
                  "device_bytes\n0,99999999999,forward,1,1,,\n",
                  Format::kMemsimCsv, "iteration.csv") ==
        "<file>:2: iteration: expected an integer from -1 to 10^9, got '99999999999'");
}

TEST_CASE("JSON profiles: a key given twice, and nesting past 64 levels", "[profile]") {
  // The snapshot importer summed both "segments" lists (reserved doubled), the Chrome trace
  // importer read the later of two keys; replay and the config reader refuse them already.
  CHECK(LoadError("{\"segments\": [{\"device\": 0, \"total_size\": 2097152}], \"segments\": [], "
                  "\"device_traces\": [[]]}",
                  Format::kTorchSnapshot, "dup_snapshot.json") ==
        "<file>: /segments: duplicate key");
  CHECK(LoadError("{\"segments\": [{\"device\": 0, \"total_size\": 1, \"total_size\": 2}]}",
                  Format::kTorchSnapshot, "dup_segment.json") ==
        "<file>: /segments/0/total_size: duplicate key");
  CHECK(LoadError("{\"traceEvents\": [{\"ph\": \"i\", \"ts\": 1, \"ts\": 2}]}",
                  Format::kTorchTrace, "dup_trace.json") ==
        "<file>: duplicate key 'ts' in one object (at /traceEvents/*)");
  // 65 levels: a snapshot nests at most 9, a Chrome trace about 5. Both stop at level 65 (they
  // read on until the end of the input before: an endless '[[[' stream).
  std::string deep = "{\"segments\": []" + std::string(", \"device_traces\": ") + std::string(70, '[');
  CHECK(LoadError(deep, Format::kTorchSnapshot, "deep_snapshot.json") ==
        "<file>: /device_traces/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/"
        "0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0: nested deeper than memsim's "
        "limit of 64 levels (a memory snapshot nests at most 9)");
  CHECK(LoadError("{\"traceEvents\": " + std::string(70, '['), Format::kTorchTrace,
                  "deep_trace.json") ==
        "<file>: nested deeper than memsim's limit of 64 levels (a Chrome trace nests about 5)");
}

TEST_CASE("a snapshot's --device-index that the snapshot never saw", "[profile]") {
  // snapshot.json holds segments of devices 0 and 1 and device_traces[0]; device 7 would load
  // as an empty profile and compare as -100%.
  LoadProfileOptions o;
  o.device_index = 7;
  CHECK_THROWS_WITH(LoadProfile(testing::DataPath("snapshot.json"), Format::kTorchSnapshot, o),
                    testing::DataPath("snapshot.json") +
                        ": no segments and no trace entries for device 7 (devices in the "
                        "snapshot: 0, 1)");
}

// Writes `text` into the FIFO `path` from a thread, once a reader has opened it; Stop() ends a
// writer still waiting (when the reader failed before opening it).
class FifoWriter {
 public:
  FifoWriter(const std::string& path, std::string text) {
    thread_ = std::thread([this, path, text = std::move(text)] {
      int fd = -1;
      while (!stop_ && (fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK)) < 0 && errno == ENXIO) {
        std::this_thread::yield();
      }
      if (fd < 0) return;
      ::fcntl(fd, F_SETFL, 0);  // blocking writes from here
      for (size_t at = 0; at < text.size();) {
        const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
        if (n <= 0) break;
        at += static_cast<size_t>(n);
      }
      ::close(fd);
    });
  }
  ~FifoWriter() {
    stop_ = true;
    thread_.join();
  }
  FifoWriter(const FifoWriter&) = delete;
  FifoWriter& operator=(const FifoWriter&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_CASE("a profile in a pipe with --format is read once, from its first byte", "[profile]") {
  // A pipe cannot be read twice: the snapshot reader peeked at two bytes for the pickle header,
  // then opened the file again and lost them ("/segments: expected a memory snapshot object");
  // the torch_npu CSV reader lost the header line it had looked at.
  const std::string fifo = testing::TempPath("profile.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::pair<const char*, Format> cases[] = {{"snapshot.json", Format::kTorchSnapshot},
                                                  {"memory_record.csv", Format::kNpuProfiler},
                                                  {"operator_memory.csv", Format::kNpuProfiler}};
  for (const auto& [name, format] : cases) {
    INFO(name);
    std::ifstream in(testing::DataPath(name), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const timeline::Timeline file = LoadProfile(testing::DataPath(name), format);
    timeline::Timeline piped;
    {
      FifoWriter writer(fifo, text.str());
      piped = LoadProfile(fifo, format);
    }
    REQUIRE(piped.samples.size() == file.samples.size());
    for (size_t i = 0; i < file.samples.size(); ++i) {
      CHECK(piped.samples[i].allocated_bytes == file.samples[i].allocated_bytes);
      CHECK(piped.samples[i].reserved_bytes == file.samples[i].reserved_bytes);
    }
  }
}

}  // namespace
}  // namespace memsim::profile
