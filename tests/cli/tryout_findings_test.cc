// A new user's tryout (2026-12-02): options that swallowed the next option as their file name,
// launch-script exports, near-miss keys and --capacity beyond the device. Each row runs the built
// binary: bad input exits 2 with a message naming the flag, a doubtful one warns.
#include <catch2/catch.hpp>
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"

namespace memsim {
namespace {

using testing::RunMemsim;
using testing::ScratchDir;

const std::string kSource = std::string(MEMSIM_SOURCE_DIR) + "/";

TEST_CASE("tryout: a file option followed by another option is a missing file name",
          "[cli][tryout]") {
  ScratchDir dir("tryout-dash");
  struct Row {
    std::string args;
    std::string message;  // after "memsim: "
  };
  const std::string profile = kSource + "tests/profile/data/memsim.csv";
  const Row rows[] = {
      {"run --json --no-chart", "--json: expected a file name, got the option '--no-chart'"},
      {"run --csv --html r.html", "--csv: expected a file name, got the option '--html'"},
      {"run --model --no-chart", "--model: expected a file name, got the option '--no-chart'"},
      {"run --set --no-chart", "--set: expected KEY=VALUE, got the option '--no-chart'"},
      {"explain --device --verbose", "--device: expected a file name, got the option '--verbose'"},
      {"compare --profile --no-chart", "--profile: expected a file name, got the option"},
      {"compare --profile " + profile + " --json --no-chart",
       "--json: expected a file name, got the option '--no-chart'"},
      {"check " + kSource + "configs/default.json --junit --json x.json",
       "--junit: expected a file name, got the option '--json'"},
      {"check " + kSource + "configs/default.json --baseline --update-baseline",
       "--baseline: expected a file name, got the option '--update-baseline'"},
      {"replay --json x.json --csv --backend", "--csv: expected a file name, got the option"},
      {"validate --set --verbose", "--set: expected KEY=VALUE, got the option '--verbose'"},
      {"run --set training.micro_batch_size 2",
       "--set: expected KEY=VALUE, got 'training.micro_batch_size' without '='"},
  };
  for (const Row& row : rows) {
    INFO(row.args);
    const auto r = RunMemsim(dir, row.args);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(row.message) != std::string::npos);
    CHECK(std::filesystem::is_empty(dir.path()));  // no file named after the option
  }
  // "-" is standard output, still accepted.
  const auto r = RunMemsim(dir, "run --iterations 1 --no-chart --json -");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\"schema_version\"") != std::string::npos);
}

// A small Megatron launch (2 layers, h 256) on 8 NPUs, with the exports under test before it.
std::string LaunchScript(const std::string& exports) {
  return "#!/bin/bash\n" + exports +
         "NPUS_PER_NODE=8\n"
         "torchrun --nproc_per_node $NPUS_PER_NODE pretrain_gpt.py --num-layers 2 --hidden-size 256 "
         "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--micro-batch-size 1 --global-batch-size 8 --train-iters 2 --bf16\n";
}

TEST_CASE("tryout: a launch script's exports memsim models reach the setup, others warn",
          "[cli][tryout]") {
  ScratchDir dir("tryout-env");
  dir.Write("train.sh", LaunchScript("export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True\n"
                                     "HCCL_BUFFSIZE=50\n"
                                     "export HCCL_BUFFSIZE\n"
                                     "export TORCH_NCCL_AVOID_RECORD_STREAMS=1\n"
                                     "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                                     "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128\n"));
  auto r = RunMemsim(dir, "run --megatron-args train.sh --device ascend-910b-64g "
                          "--set model.vocab_size=1000 --no-chart --json out.json");
  REQUIRE(r.exit_code == 0);
  const std::string json = testing::ReadAll(dir.path() / "out.json");
  // The allocator options of PYTORCH_NPU_ALLOC_CONF (torch_npu reads it on an NPU device).
  CHECK(json.find("\"expandable_segments\": true") != std::string::npos);
  // HCCL_BUFFSIZE=50 (MiB), exported after it was set: a send and a receive buffer of 50 MiB per
  // communicator (device/communicators.h HcclCommunicatorBytes) instead of the default 200 MiB,
  // so each communicator of the run (Megatron's world group at init and the data-parallel ones,
  // core/comm_group.h) holds 2 x (200 - 50) MiB = 300 MiB less outside the allocator.
  dir.Write("default.sh", LaunchScript("export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True\n"));
  REQUIRE(RunMemsim(dir, "run --megatron-args default.sh --device ascend-910b-64g "
                         "--set model.vocab_size=1000 --no-chart --json default.json")
              .exit_code == 0);
  const auto json_of = [&](const char* file) {
    return nlohmann::json::parse(testing::ReadAll(dir.path() / file));
  };
  const long long communicators = json_of("out.json")["num_communicators"].get<long long>();
  REQUIRE(communicators >= 1);
  REQUIRE(json_of("default.json")["num_communicators"] == communicators);
  CHECK(json_of("default.json")["device_outside_allocator_bytes"].get<long long>() -
            json_of("out.json")["device_outside_allocator_bytes"].get<long long>() ==
        communicators * (300LL << 20));
  CHECK(r.err.find("train.sh:5: export TORCH_NCCL_AVOID_RECORD_STREAMS: not modelled") !=
        std::string::npos);
  CHECK(r.err.find("train.sh:7: export PYTORCH_CUDA_ALLOC_CONF: ignored (the npu allocator") !=
        std::string::npos);
  CHECK(r.err.find("CUDA_DEVICE_MAX_CONNECTIONS") == std::string::npos);  // no memory effect
  // A bad value is named by its export line.
  dir.Write("bad.sh", LaunchScript("export HCCL_BUFFSIZE=lots\n"));
  r = RunMemsim(dir, "run --megatron-args bad.sh --device ascend-910b-64g --set model.vocab_size=1000");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("bad.sh:2: export HCCL_BUFFSIZE") != std::string::npos);
  // --set allocator.<key> wins over the script's allocator options.
  r = RunMemsim(dir, "run --megatron-args train.sh --device ascend-910b-64g --set model.vocab_size=1000 "
                     "--set allocator.expandable_segments=false --no-chart");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("train.sh:2: export PYTORCH_NPU_ALLOC_CONF: not used (--set allocator.<key> "
                   "given)") != std::string::npos);
}

TEST_CASE("tryout: a near miss of a known key warns with did-you-mean", "[cli][tryout]") {
  ScratchDir dir("tryout-typo");
  dir.Write("m.json", R"({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
    "num_hidden_layers": 2, "intermediate_sise": 1024, "vocab_size": 1000,
    "max_position_embeddings": 4096, "some_unrelated_field": 1})");
  auto r = RunMemsim(dir, "validate --model m.json");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("m.json: /intermediate_sise: not a key memsim reads, ignored (did you mean "
                   "'intermediate_size'?") != std::string::npos);
  CHECK(r.err.find("some_unrelated_field") == std::string::npos);  // a note, for --verbose only
  dir.Write("adapter.json", R"({"peft_type": "LORA", "r": 8, "lora_alpa": 16,
    "target_modules": ["q_proj"]})");
  const std::string lora = kSource + "configs/llama3-8b-lora-rtx4090.json";
  r = RunMemsim(dir, "validate " + lora + " --set training.adapter_config=" +
                         (dir.path() / "adapter.json").string());
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("lora_alpa (did you mean 'lora_alpha'?)") != std::string::npos);
  dir.Write("args.json", R"({"per_device_train_bach_size": 4, "max_steps": 1})");
  dir.Write("hf.json", R"({"model": "llama3-8b", "device": "l40s-48g", "training": {
    "framework": "hf-trainer", "training_args": "args.json", "max_seq_length": 256,
    "torch_dtype": "bfloat16"}})");
  r = RunMemsim(dir, "validate hf.json");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("per_device_train_bach_size (did you mean 'per_device_train_batch_size'?)") !=
        std::string::npos);
}

TEST_CASE("tryout: --capacity above the device's memory warns with both sizes", "[cli][tryout]") {
  ScratchDir dir("tryout-capacity");
  // 80GB = 80e9 B = 74.51 GiB; the default config's ascend-910b-64g holds 64 GiB.
  const auto r = RunMemsim(dir, "run --iterations 1 --no-chart --capacity 80GB");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("warning: --capacity: 74.51 GiB exceeds the total memory of device "
                   "'ascend-910b-64g' (64.00 GiB") != std::string::npos);
  const auto ok = RunMemsim(dir, "run --iterations 1 --no-chart --capacity 60GiB");
  CHECK(ok.err.find("--capacity") == std::string::npos);
}

TEST_CASE("tryout: the LoRA header counts the adapters in the total and says what trains",
          "[cli][tryout]") {
  ScratchDir dir("tryout-lora");
  const auto r = RunMemsim(dir, "run " + kSource + "configs/llama3-8b-lora-rtx4090.json --no-chart");
  REQUIRE(r.exit_code == 0);
  // Llama-3-8B: 8030261248. LoRA r=8 on q_proj (4096 -> 4096) and v_proj (4096 -> 1024):
  // A is r x in, B is out x r: 8*4096 + 4096*8 + 8*4096 + 1024*8 = 106496 per layer, x 32 layers
  // = 3407872; total 8033669120, trainable 3407872 / 8033669120 = 0.0424%.
  CHECK(r.out.find("parameters: 8033669120 (8.03 B) total, 8033669120 (8.03 B) on this rank; "
                   "trainable 3407872 (3.4 M), 0.0424%") != std::string::npos);
}

TEST_CASE("tryout: compare with --format auto refuses a pipe, saying why", "[cli][tryout]") {
  ScratchDir dir("tryout-pipe");
  const std::string profile = kSource + "tests/profile/data/memsim.csv";
  auto r = RunMemsim(dir, "compare --simulated " + profile + " --profile /dev/stdin --no-chart < /dev/null");
  // /dev/null is a character device, as a pipe is not a regular file.
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("/dev/stdin: not a regular file") != std::string::npos);
  CHECK(r.err.find("--format") != std::string::npos);
  r = RunMemsim(dir, "compare --simulated " + profile + " --profile /dev/stdin --format memsim-csv "
                     "--no-chart < " + profile);
  CHECK(r.exit_code == 0);
}

TEST_CASE("tryout: a profile 1024x below the simulation gets a note on its scale",
          "[cli][tryout]") {
  ScratchDir dir("tryout-scale");
  // Two iterations in bytes (1, 3, 2 GiB allocated; 2, 4 GiB reserved), and the same samples
  // in KiB where bytes are expected: every value 1024x too small.
  const std::string header = "time_us,iteration,phase,allocated_bytes,reserved_bytes\n";
  std::string bytes = header, kib = header;
  const long long gib = 1LL << 30;
  const std::vector<std::vector<long long>> rows = {{0, 0, 1, 2}, {1000, 1, 3, 4}, {2000, 1, 2, 4},
                                                    {3000, 2, 3, 4}, {4000, 2, 2, 4}};
  for (const auto& v : rows) {
    const char* phase = v[1] == 0 ? "init" : v[0] % 2000 == 0 ? "backward" : "forward";
    bytes += fmt::format("{},{},{},{},{}\n", v[0], v[1], phase, v[2] * gib, v[3] * gib);
    kib += fmt::format("{},{},{},{},{}\n", v[0], v[1], phase, v[2] * gib / 1024, v[3] * gib / 1024);
  }
  const std::string sim = dir.Write("sim.csv", bytes).string();
  dir.Write("kib.csv", kib);
  const auto r = RunMemsim(dir, "compare --simulated " + sim + " --profile kib.csv --no-chart --width 1000");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("is 1024x smaller than the simulated one") != std::string::npos);
  CHECK(r.out.find("another unit") != std::string::npos);
  const auto same = RunMemsim(dir, "compare --simulated " + sim + " --profile sim.csv --no-chart");
  CHECK(same.exit_code == 0);
  CHECK(same.out.find("another unit") == std::string::npos);
}

TEST_CASE("tryout: a script under --model keeps Megatron's dropout defaults", "[cli][tryout]") {
  ScratchDir dir("tryout-dropout");
  dir.Write("train.sh", LaunchScript(""));
  dir.Write("m.json", R"({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
    "num_hidden_layers": 2, "intermediate_size": 1024, "vocab_size": 1000,
    "max_position_embeddings": 4096})");
  const auto r = RunMemsim(dir, "run --megatron-args train.sh --device ascend-910b-64g --model m.json "
                                "--no-chart --verbose");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("train.sh: --hidden-dropout not given: Megatron's default 0.1 taken") !=
        std::string::npos);
}

TEST_CASE("tryout: explain says the allocator released the cache, not empty_cache()",
          "[cli][tryout]") {
  ScratchDir dir("tryout-explain");
  // Llama-3-8B at TP1 DP8, seq 8192 on an H100: iteration 1's forward fills the card, a
  // cudaMalloc fails, and the allocator frees its cached segments and retries (the config sets
  // no empty_unused_memory_level, so nothing calls empty_cache()).
  const auto r = RunMemsim(dir, "explain --model llama3-8b --device h100-80g --width 1000 "
                                "--set training.tensor_model_parallel_size=1 "
                                "--set training.data_parallel_size=8 --set training.seq_length=8192 "
                                "--set training.global_batch_size=64");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("released by the caching allocator itself: a cudaMalloc failed, so it freed "
                   "every cached unused segment and retried") != std::string::npos);
  CHECK(r.out.find("empty_cache()\n") == std::string::npos);
  CHECK(r.out.find("released by torch.cuda.empty_cache()") == std::string::npos);
  // tryout6 #22: the peak holds mb7 while the per-layer breakdown is counted on mb0; the
  // sentence says so instead of naming both as if one.
  CHECK(r.out.find("of one micro-batch (mb7); each micro-batch's forward (counted on mb0) ") !=
        std::string::npos);
}

TEST_CASE("tryout: check with several configs says how to name a new baseline directory",
          "[cli][tryout]") {
  ScratchDir dir("tryout-baseline");
  const std::string configs = kSource + "configs/default.json " + kSource + "configs/default.json";
  const auto r = RunMemsim(dir, "check " + configs + " --baseline bl --update-baseline");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--baseline bl: with several configs, name a directory of <config stem>.json "
                   "reports (it does not exist; a trailing / names one that --update-baseline "
                   "creates: --baseline bl/)") != std::string::npos);
}

TEST_CASE("tryout: --set model.<key> on a model file points to the training key",
          "[cli][tryout]") {
  ScratchDir dir("tryout-setmodel");
  auto r = RunMemsim(dir, "validate --set model.vocab_size=1000");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--set model.vocab_size=1000: expected a key training.<name> or "
                   "allocator.<name> (a model file is not edited by --set; write "
                   "training.vocab_size, which overrides it)") != std::string::npos);
  r = RunMemsim(dir, "validate --set model.intermediate_size=1000");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("in Megatron's names: num_layers, hidden_size, ffn_hidden_size") !=
        std::string::npos);  // hf-trainer takes the model file as it is.
  r = RunMemsim(dir, "validate " + kSource + "configs/qwen2.5-7b-ddp8-h200.json --set model.vocab_size=1000");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("(a model file is not edited by --set; give --model FILE with an edited copy)") !=
        std::string::npos);
}

TEST_CASE("tryout: a copied shipped config whose model path breaks names the shipped model",
          "[cli][tryout]") {
  ScratchDir dir("tryout-copy");
  dir.Write("copy.json", testing::ReadAll(kSource + "configs/llama3-8b-h100-tp1-dp8-selective.json"));
  const auto r = RunMemsim(dir, "validate copy.json");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("/model: cannot read model file") != std::string::npos);
  CHECK(r.err.find("; the shipped model of that name is \"llama3-8b\"") != std::string::npos);
}

// The numbers of a `run --json` report: its per-iteration rows, stages and static sizes.
nlohmann::json Numbers(const std::string& report) {
  const nlohmann::json j = nlohmann::json::parse(report);
  return {{"iterations", j["iterations"]}, {"stages", j["stages"]}, {"static", j["static"]},
          {"oom", j["oom"]}};
}

// run --json, then its input_config run from another directory: the same numbers.
void CheckReproduces(const std::string& args, const std::string& script = "") {
  ScratchDir dir("tryout-reproduce");
  if (!script.empty()) dir.Write("train.sh", script);
  const auto first = RunMemsim(dir, args + " --no-chart --json r.json");
  REQUIRE(first.exit_code == 0);
  const nlohmann::json report = nlohmann::json::parse(testing::ReadAll(dir.path() / "r.json"));
  REQUIRE(report.contains("input_config"));
  ScratchDir other("tryout-reproduce-elsewhere");
  other.Write("c.json", report["input_config"].dump());
  const auto again = RunMemsim(other, "run c.json --no-chart --json r.json");
  REQUIRE(again.exit_code == 0);
  CHECK(Numbers(testing::ReadAll(other.path() / "r.json")) ==
        Numbers(testing::ReadAll(dir.path() / "r.json")));
}

TEST_CASE("tryout: run --json's input_config reproduces the run", "[cli][tryout]") {
  // tryout6 #15. A launch script's model (SwiGLU, RMSNorm, RoPE from its flags), with an
  // export read into the allocator options.
  std::string script = LaunchScript("export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True\n");
  script.replace(script.find("--bf16"), 6,
                 "--bf16 --swiglu --normalization RMSNorm --position-embedding-type rope "
                 "--disable-bias-linear --untie-embeddings-and-output-weights");
  CheckReproduces("run --megatron-args train.sh --device ascend-910b-64g --set model.vocab_size=1000",
                  script);
  // A shipped config whose model path is relative to its folder, with --set, --iterations,
  // --device and --capacity (above the card's 24 GiB: the total is raised with it).
  CheckReproduces("run " + kSource + "configs/llama3-8b-lora-rtx4090.json --iterations 3 "
                  "--set training.max_seq_length=512 --device l40s-48g --capacity 50GiB");
  CheckReproduces("run " + kSource + "configs/qwen2.5-7b-a100-80g-tp2-selective.json "
                  "--model qwen2.5-7b --set training.micro_batch_size=2");
}

TEST_CASE("tryout: a model built from a launch script is named by the script", "[cli][tryout]") {
  ScratchDir dir("tryout-label");
  dir.Write("train.sh", LaunchScript(""));
  const auto r = RunMemsim(dir, "run --megatron-args train.sh --device ascend-910b-64g "
                                "--set model.vocab_size=1000 --no-chart");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("memsim run: train.sh (Megatron arguments) (2 layers, h 256)") !=
        std::string::npos);
  CHECK(r.out.find("(inline)") == std::string::npos);
}

TEST_CASE("tryout: check, explain and dump-program read a launch and take --set",
          "[cli][tryout]") {
  ScratchDir dir("tryout-launch-commands");
  dir.Write("train.sh", LaunchScript(""));
  const std::string launch = "--megatron-args train.sh --device ascend-910b-64g ";
  auto r = RunMemsim(dir, "check " + launch + "--set model.vocab_size=1000");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("train.sh") != std::string::npos);
  r = RunMemsim(dir, "explain " + launch + "--set model.vocab_size=1000 --width 200");
  CHECK(r.exit_code == 0);
  r = RunMemsim(dir, "dump-program " + launch + "--set model.vocab_size=1000");
  CHECK(r.exit_code == 0);
  // The arguments after --, with torchrun's world size among them: 8 processes at TP 1.
  r = RunMemsim(dir, "check --megatron-args --device h100-80g --set model.vocab_size=1000 -- "
                     "--nproc_per_node 8 --num-layers 2 --hidden-size 256 "
                     "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("world size") == std::string::npos);
  // check's --set and --device apply to each config; a bad --set is exit 2 naming it.
  r = RunMemsim(dir, "check " + kSource + "configs/default.json --device h100-80g "
                     "--set training.micro_batch_size=1");
  CHECK(r.exit_code == 0);
  r = RunMemsim(dir, "check " + kSource + "configs/default.json --set training.micro_batch_size=0");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--set training.micro_batch_size=0") != std::string::npos);
  // A launch file and a config together is refused.
  r = RunMemsim(dir, "check x.json --megatron-args train.sh --device h100-80g");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--megatron-args train.sh: give no training config too (got 'x.json')") !=
        std::string::npos);
  // validate prints the config a launch becomes; read back, it validates to the same summary.
  r = RunMemsim(dir, "validate " + launch + "--set model.vocab_size=1000 --print-config");
  CHECK(r.exit_code == 0);
  dir.Write("translated.json", r.out);
  const auto back = RunMemsim(dir, "validate translated.json");
  CHECK(back.exit_code == 0);
  // The script's 8 NPUs at TP1 PP1: DP8; global batch 8 / (micro-batch 1 × DP8) = 1.
  CHECK(back.out.find("on ascend-910b-64g, TP1 PP1 DP8, seq 128, micro-batch 1, 1 micro-batches "
                      "per iteration") != std::string::npos);
  // --help shows --set KEY=VALUE, one pair per --set.
  r = RunMemsim(dir, "check --help");
  CHECK(r.out.find("--set KEY=VALUE") != std::string::npos);
}


TEST_CASE("tryout: a long run's exports and explain replay the iterations run simulated",
          "[cli][tryout]") {
  // tryout8 #1: a launch script's `--train-iters 2000` made `run --csv/--trace/--snapshot/--html`
  // and `explain` simulate all 2000 iterations again (22.9 GB, killed by the kernel), although
  // the table showed the 4 `run` simulated. Here 5000 iterations of the tiny script: `run`
  // simulates max(kMinSimulatedIterations 4, FirstRepeatingIteration 2 + 1) = 4
  // (config/iterations.h), and the exports and explain replay those 4 (engine::SimulatedSetup).
  ScratchDir dir("tryout-long-run");
  std::string script = LaunchScript("");
  script.replace(script.find("--train-iters 2"), 15, "--train-iters 5000");
  dir.Write("train.sh", script);
  const std::string launch = "--megatron-args train.sh --device ascend-910b-64g "
                             "--set model.vocab_size=1000 ";
  auto r = RunMemsim(dir, "run " + launch + "--no-chart --csv run.csv");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("simulated 4 of 5000 iterations") != std::string::npos);
  // The CSV's second column is the iteration (docs/interfaces.md, 'CSV timeline').
  std::istringstream csv(testing::ReadAll(dir.path() / "run.csv"));
  std::string line;
  std::getline(csv, line);  // header
  int last = -1;
  while (std::getline(csv, line)) {
    const size_t comma = line.find(',');
    last = std::max(last, std::stoi(line.substr(comma + 1)));
  }
  CHECK(last == 4);
  r = RunMemsim(dir, "explain " + launch + "--width 200");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("init and 4 iterations\n  simulated 4 of 5000 iterations") != std::string::npos);
  CHECK(r.out.find("\niteration 4:") != std::string::npos);
  CHECK(r.out.find("\niteration 5:") == std::string::npos);
}


TEST_CASE("tryout: a launch with --add-qkv-bias is labelled QKV bias only", "[cli][tryout]") {
  // tryout8 #4: Qwen2.5's MindSpeed script (--disable-bias-linear --add-qkv-bias) was labelled
  // "no linear biases", though the QKV projection keeps its bias (Megatron-core SelfAttention:
  // linear_qkv bias = add_bias_linear or add_qkv_bias) and memsim counts it.
  ScratchDir dir("tryout-qkv-bias");
  std::string script = LaunchScript("");
  script.replace(script.find("--bf16"), 6, "--bf16 --disable-bias-linear --add-qkv-bias");
  dir.Write("train.sh", script);
  const auto r = RunMemsim(dir, "run --megatron-args train.sh --device ascend-910b-64g "
                                "--set model.vocab_size=1000 --no-chart --iterations 1");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("(Megatron arguments; QKV bias only)") != std::string::npos);
}

}  // namespace
}  // namespace memsim
