// The training block's "data" (config/sample_data.h): sample lengths from a file, a fixed
// length, a uniform range or a histogram; the collator's padding and packing; the sampler's
// TrainingArguments; and the errors naming file and JSON pointer (or file and line).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/iterations.h"
#include "config/load.h"
#include "test_util.h"

namespace memsim::config {
namespace {

using testing::ErrorOf;

std::string Write(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("memsim_sample_data_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

// A small llama under the Trainer with `extra` training members.
std::string Config(const std::string& name, const std::string& extra) {
  return Write(name,
               "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, "
               "\"intermediate_size\": 688, \"num_attention_heads\": 32, "
               "\"num_key_value_heads\": 8, \"num_hidden_layers\": 2, \"vocab_size\": 32001}, "
               "\"device\": \"a100-80g\", \"training\": {\"framework\": \"hf-trainer\", "
               "\"max_seq_length\": 512, \"per_device_train_batch_size\": 2, \"max_steps\": 50" +
                   extra + "}}");
}

using Lengths = std::vector<std::pair<int, std::int64_t>>;

TEST_CASE("data lengths: a file of one length a line, comments and blank lines skipped",
          "[config][sample_data]") {
  Write("lengths.txt", "# source: a test\n\n12\n 7 \n12\r\n");
  const Setup s = LoadSetup(Config("f.json", ", \"data\": {\"lengths\": \"lengths.txt\"}"), {});
  CHECK(s.training.data.lengths == Lengths{{7, 1}, {12, 2}});
  CHECK(s.training.data.padding == SampleData::Padding::kLongest);
  CHECK(s.training.data.seed == 42);  // TrainingArguments.seed's default
  CHECK(s.training.data.Varies());
  // Every step is simulated (no steady state is looked for).
  CHECK(MaxSimulatedIterations(s) == 50);
}

TEST_CASE("data lengths: fixed, uniform and histogram forms", "[config][sample_data]") {
  CHECK(LoadSetup(Config("x.json", ", \"data\": {\"lengths\": {\"fixed\": 300}}"), {})
            .training.data.lengths == Lengths{{300, 1}});
  CHECK(LoadSetup(Config("u.json", ", \"data\": {\"lengths\": {\"uniform\": [3, 5]}}"), {})
            .training.data.lengths == Lengths{{3, 1}, {4, 1}, {5, 1}});
  const Setup h = LoadSetup(
      Config("h.json", ", \"data\": {\"lengths\": {\"histogram\": [[90, 2], [40, 1], [90, 1]]}, "
                       "\"pad_to_multiple_of\": 8}, \"group_by_length\": true, \"data_seed\": 7, "
                       "\"seed\": 1"),
      {});
  CHECK(h.training.data.lengths == Lengths{{40, 1}, {90, 3}});
  CHECK(h.training.data.pad_to_multiple_of == 8);
  CHECK(h.training.data.group_by_length);
  CHECK(h.training.data.seed == 7);  // data_seed before seed (Trainer._get_train_sampler)
}

TEST_CASE("data padding max_length or packing: fixed shapes, steady state as before",
          "[config][sample_data]") {
  const Setup m = LoadSetup(Config("m.json", ", \"data\": {\"lengths\": {\"fixed\": 30}, "
                                             "\"padding\": \"max_length\"}"),
                            {});
  CHECK_FALSE(m.training.data.Varies());
  CHECK(MaxSimulatedIterations(m) < 50);
  const Setup p = LoadSetup(Config("p.json", ", \"data\": {\"lengths\": {\"fixed\": 30}, "
                                             "\"packing\": true}"),
                            {});
  CHECK_FALSE(p.training.data.Varies());
  const Setup none = LoadSetup(Config("n.json", ""), {});
  CHECK(none.training.data.lengths.empty());
}

TEST_CASE("data: bad values name the file and the JSON pointer or line", "[config][sample_data]") {
  const std::string bad_type = ErrorOf(Config("e1.json", ", \"data\": {\"lengths\": 5}"));
  CHECK(bad_type.find("e1.json: /training/data/lengths: expected a lengths file") != std::string::npos);
  const std::string uniform = ErrorOf(Config("e2.json", ", \"data\": {\"lengths\": {\"uniform\": [9, 3]}}"));
  CHECK(uniform.find("/training/data/lengths/uniform/1: expected the longest length") != std::string::npos);
  const std::string hist = ErrorOf(Config("e3.json", ", \"data\": {\"lengths\": {\"histogram\": [[5, 0]]}}"));
  CHECK(hist.find("/training/data/lengths/histogram/0/1: expected a sample count") != std::string::npos);
  const std::string padding = ErrorOf(Config("e4.json", ", \"data\": {\"padding\": \"longst\"}"));
  CHECK(padding.find("/training/data/padding") != std::string::npos);
  const std::string unknown = ErrorOf(Config("e5.json", ", \"data\": {\"pad_multiple\": 8}"));
  CHECK(unknown.find("/training/data/pad_multiple") != std::string::npos);
  Write("bad.txt", "12\n\n1x\n");
  const std::string line = ErrorOf(Config("e6.json", ", \"data\": {\"lengths\": \"bad.txt\"}"));
  CHECK(line.find("bad.txt:3: expected a sample length") != std::string::npos);
  const std::string missing = ErrorOf(Config("e7.json", ", \"data\": {\"lengths\": \"none.txt\"}"));
  CHECK(missing.find("/training/data/lengths: cannot read the sample lengths file") != std::string::npos);
  Write("empty.txt", "# nothing\n");
  CHECK(ErrorOf(Config("e8.json", ", \"data\": {\"lengths\": \"empty.txt\"}")).find("no sample lengths") !=
        std::string::npos);
}

}  // namespace
}  // namespace memsim::config
