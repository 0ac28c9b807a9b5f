// Launch scripts, training logs and the flag table (config/launch_script.h, megatron_args.h,
// megatron_flags.h; issue 14). The fixtures under data/launch/ are written for these tests with
// the constructs of the published MindSpeed-LLM and Megatron-LM launch scripts.
#include "config/megatron_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "config/launch_script.h"
#include "config/megatron_flags.h"
#include "config/test_util.h"
#include "core/error.h"
#include "engine/stages.h"
#include "workload/build.h"

namespace memsim::config {
namespace {

using testing::Data;

// The arguments as "flag=v1 v2" strings, in order.
std::vector<std::string> Args(const MegatronLaunch& l) {
  std::vector<std::string> out;
  for (const LaunchArgument& a : l.arguments) {
    std::string s = a.name;
    for (size_t i = 0; i < a.values.size(); ++i) s += (i == 0 ? "=" : " ") + a.values[i];
    out.push_back(s);
  }
  return out;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

LoadOptions OnDevice(const std::string& device, const std::string& model = "") {
  LoadOptions o;
  o.device = device;
  o.model_path = model;
  return o;
}

TEST_CASE("a script's variables, defaults, arithmetic, quotes and continuations") {
  const MegatronLaunch l = ReadLaunchScript("t.sh", R"(# comment
export A=2
B=${UNSET_VAR:-3}   # trailing comment
C=$((A * (B + 1)))
S="--num-layers $C \
   --hidden-size 64"
python pretrain_gpt.py $S --seq-length ${A}0 '--x y' --z=5 \
  --list a b | tee log
)");
  CHECK(Args(l) == std::vector<std::string>{"--num-layers=8", "--hidden-size=64",
                                            "--seq-length=20", "--x y", "--z=5", "--list=a b"});
  CHECK(l.launch_line == 7);
  // Each argument on the line it is written on: the string group's lines 5 and 6, then the
  // training command's lines 7 and 8.
  CHECK(l.arguments[0].line == 5);
  CHECK(l.arguments[1].line == 6);
  CHECK(l.arguments[2].line == 7);
  CHECK(l.arguments[5].line == 8);
  CHECK(l.warnings.empty());
  CHECK(l.notes == std::vector<std::string>{
                       "t.sh:3: $UNSET_VAR not set in the script, its default '3' taken"});
}

TEST_CASE("bash arrays and torchrun's world size") {
  const MegatronLaunch l = ReadLaunchScript("t.sh", R"(N=4
D=(--nproc_per_node $N --nnodes 2)
M=(
  --a 1   # inside an array
  "--b 2"
)
M+=(--c)
torchrun ${D[@]} train.py "${M[@]}" ${M[@]}
)");
  CHECK(Args(l) == std::vector<std::string>{"--a=1", "--b 2", "--c", "--a=1", "--b=2", "--c"});
  std::vector<int> lines;
  for (const LaunchArgument& a : l.arguments) lines.push_back(a.line);
  CHECK(lines == std::vector<int>{4, 5, 7, 4, 5, 7});  // where each is written in M
  CHECK(l.nproc_per_node == 4);
  CHECK(l.nnodes == 2);
}

TEST_CASE("what a script does that memsim cannot evaluate is a warning naming the line") {
  const MegatronLaunch l = ReadLaunchScript("t.sh", R"(X=$(cat f)
if [ -n "$Y" ]; then
  V=1
else
  V=2
fi
for i in 1 2; do V=3; done
python -m torch.distributed.run --nproc-per-node=8 pretrain_gpt.py --v $V --w $HOME
)");
  // [ -n "" ] is false: the else branch runs (the condition is evaluated on the values).
  CHECK(Args(l) == std::vector<std::string>{"--v=2", "--w"});
  CHECK(l.nproc_per_node == 8);
  CHECK(l.warnings == std::vector<std::string>{
                          "t.sh:1: $(cat f) not evaluated (memsim runs no command); taken as empty",
                          "t.sh:2: $Y is not set in the script (a value from the environment); "
                          "taken as empty",
                          "t.sh:7: 'for' loop not evaluated; skipped",
                          "t.sh:8: $HOME is not set in the script (a value from the "
                          "environment); taken as empty"});
}

TEST_CASE("backquotes close, and $((...)) missing an operand is a warning") {
  // A '`' opened a nesting that the next '`' deepened: "unterminated '`'" for `hostname`.
  // Inside double quotes it is one field (empty: no command is run), as bash passes it.
  const MegatronLaunch l = ReadLaunchScript("t.sh", "A=`date`\npython pretrain_gpt.py --x `hostname` "
                                                    "--y \"`id -u`\" --z $((2+)) --w $((3*(1+1)))\n");
  CHECK(Args(l) == std::vector<std::string>{"--x", "--y=", "--z=0", "--w=6"});
  CHECK(l.warnings ==
        std::vector<std::string>{
            "t.sh:1: `...` not evaluated (memsim runs no command); taken as empty",
            "t.sh:2: `...` not evaluated (memsim runs no command); taken as empty",
            "t.sh:2: $((2+)) not evaluated (an operand is missing); taken as 0"});
}

TEST_CASE("a --megatron-args file that cannot be read says why") {
  // It said only "cannot read the file".
  const std::string dir = std::filesystem::temp_directory_path().string();
  CHECK(ErrorOf([&] { ReadMegatronArgsFile(dir); }) ==
        dir + ": cannot read the file: a directory, not a file");
  CHECK(ErrorOf([&] { ReadMegatronArgsFile(dir + "/no-such-launch-script.sh"); }) ==
        dir + "/no-such-launch-script.sh: cannot read the file: No such file or directory");
}

TEST_CASE("an error about a value the script could not evaluate repeats why") {
  // The warnings of a launch are printed only when it loads; an error about the value taken
  // (0, empty) now says where it came from.
  const std::string args = " --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                           "--max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1000";
  const MegatronLaunch at_line =
      ReadLaunchScript("t.sh", "python pretrain_gpt.py --num-layers $((1<<70))" + args + "\n");
  CHECK(ErrorOf([&] { LoadSetupFromMegatron(at_line, OnDevice("h100-80g", "llama2-7b"), {}); }) ==
        "t.sh:1: --num-layers: expected a positive integer, got 0 (on that line: $((1<<70)) not "
        "evaluated; taken as 0)");
  const MegatronLaunch model =
      ReadLaunchScript("t.sh", "N=$((2+))\npython pretrain_gpt.py --num-layers $N" + args + "\n");
  const std::string e = ErrorOf([&] { LoadSetupFromMegatron(model, OnDevice("h100-80g"), {}); });
  CHECK(e.ends_with(" (t.sh:1: $((2+)) not evaluated (an operand is missing); taken as 0)"));
}

TEST_CASE("a script without a training command, or with an open quote, is one message") {
  CHECK(ErrorOf([] { ReadLaunchScript("t.sh", "echo hi\n"); }) ==
        "t.sh: no training command found (expected a line running torchrun, python -m "
        "torch.distributed.run, msrun or python with a pretrain_*.py script)");
  CHECK(ErrorOf([] { ReadLaunchScript("t.sh", "A=1\nB=\"x\ny\n"); }) ==
        "t.sh:2: unterminated double quote");
}

TEST_CASE("every extracted flag is classified exactly once") {
  std::ifstream in(std::string(MEMSIM_SOURCE_DIR) + "/tools/megatron_flags/flags.txt");
  REQUIRE(in);
  std::map<std::string, int> listed;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    listed[line.substr(line.find(' ') + 1)] = 0;
  }
  REQUIRE(listed.size() > 1000);
  std::vector<std::string> modelled;
  for (const FlagInfo& f : AllFlags()) {
    INFO(f.flag);
    REQUIRE(listed.count(std::string(f.flag)) == 1);
    ++listed[std::string(f.flag)];
    if (f.flag_class == FlagClass::kModelled) modelled.emplace_back(f.flag);
    // A flag that is not read carries its reason and which way memsim errs without it
    // (tools/megatron_flags/reviewed.txt; ctest megatron_flags.table_current checks the rest).
    if (f.flag_class == FlagClass::kNotModelled || f.flag_class == FlagClass::kUnsupported) {
      CHECK(!f.why.empty());
      CHECK(f.error != FlagError::kNone);
    } else {
      CHECK(f.error == FlagError::kNone);
    }
  }
  for (const auto& [flag, count] : listed) {
    INFO(flag);
    CHECK(count == 1);
  }
  CHECK(modelled == ModelledMegatronFlags());
}

TEST_CASE("the MindSpeed-LLM Llama-2-7B script, field by field") {
  const MegatronLaunch l = ReadMegatronArgsFile(Data("launch/mindspeed_llama2_7b.sh"));
  CHECK(l.warnings.empty());
  const Setup s = LoadSetupFromMegatron(l, OnDevice("ascend-910b-64g", "llama2-7b"), {});
  const TrainingConfig& t = s.training;
  CHECK(t.tensor_model_parallel_size == 2);
  CHECK(t.pipeline_model_parallel_size == 2);
  CHECK(t.data_parallel_size == 2);
  CHECK(t.sequence_parallel);
  CHECK(t.seq_length == 4096);
  CHECK(t.micro_batch_size == 1);
  CHECK(t.global_batch_size == 64);
  CHECK(t.num_micro_batches == 32);
  CHECK(t.precision == Precision::kBf16);
  CHECK(t.accumulate_allreduce_grads_in_fp32);
  CHECK(t.use_distributed_optimizer);
  CHECK(t.overlap_grad_reduce);
  CHECK(t.use_flash_attn);
  CHECK_FALSE(t.gradient_accumulation_fusion);
  CHECK(t.train_iters == 2000);  // no limit: a long run is simulated to its steady state
  CHECK(t.weight_decay == 0.1);
  CHECK(s.model.num_hidden_layers == 32);
  CHECK(s.model.intermediate_size == 11008);
  CHECK(s.model.vocab_size == 32000);
  CHECK(s.model.padded_vocab_size == 32000);  // --make-vocab-size-divisible-by 1
  CHECK_FALSE(s.model.add_bias_linear);
  CHECK_FALSE(s.model.tie_word_embeddings);
  CHECK(s.model.normalization == Normalization::kRMSNorm);
  // --use-fused-rmsnorm and --use-fused-swiglu (lines 55, 71) are memory-neutral: the fused
  // kernels save what memsim's norm and SwiGLU save (tools/megatron_flags/reviewed.txt).
  CHECK(s.warnings.empty());
}

TEST_CASE("a launch script with CRLF line ends reads as with LF ones, with a warning") {
  // Saved on Windows, every line ends in "\r\n": a '\' before "\r\n" continued nothing, so
  // the training command stopped at "pretrain_gpt.py" and the model's flags were lost ("the
  // model is not in the arguments").
  std::ifstream in(Data("launch/mindspeed_llama2_7b.sh"), std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::string crlf;
  for (const char c : text.str()) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  const MegatronLaunch lf = ReadLaunchScript("s.sh", text.str());
  const MegatronLaunch l = ReadLaunchScript("s.sh", crlf);
  CHECK(l.arguments == lf.arguments);
  CHECK(l.launch_line == lf.launch_line);
  CHECK(l.nproc_per_node == lf.nproc_per_node);
  CHECK(l.exports == lf.exports);
  CHECK(l.warnings == std::vector<std::string>{
                          "s.sh:1: CRLF line ends (a file saved on Windows: bash keeps each '\\r' "
                          "in its line, so a '\\' before it continues nothing); read as LF line "
                          "ends"});
  // A '\r' not before a line end stays as written.
  const MegatronLaunch one = ReadLaunchScript("t.sh", "python pretrain_gpt.py --x 'a\rb'\n");
  CHECK(Args(one) == std::vector<std::string>{"--x=a\rb"});
  CHECK(one.warnings.empty());
}

TEST_CASE("the NVIDIA Llama-3-8B H200 recipe, field by field") {
  const MegatronLaunch l = ReadMegatronArgsFile(Data("launch/nvidia_llama3_8b_h200.sh"));
  const Setup s = LoadSetupFromMegatron(l, OnDevice("h200-141g"), {});
  const TrainingConfig& t = s.training;
  CHECK(t.tensor_model_parallel_size == 1);
  CHECK(t.context_parallel_size == 1);
  CHECK(t.data_parallel_size == 8);
  CHECK_FALSE(t.sequence_parallel);  // switched off at TP 1
  CHECK(t.seq_length == 8192);
  CHECK(t.global_batch_size == 128);
  CHECK(t.num_micro_batches == 16);
  CHECK(t.use_flash_attn);  // --attention-backend fused: no s x s scores
  CHECK(t.grad_reduce_in_bf16);
  CHECK_FALSE(t.accumulate_allreduce_grads_in_fp32);
  CHECK(t.empty_unused_memory_level == 1);
  // --train-samples 1953125000 / global batch 128 = 15258789 (rounded down); no limit now.
  CHECK(t.train_iters == 15258789);
  CHECK(s.model.num_hidden_layers == 32);
  CHECK(s.model.num_key_value_heads == 8);
  CHECK(s.model.head_dim == 128);
  CHECK(s.model.intermediate_size == 14336);
  CHECK(s.model.vocab_size == 128256);
  CHECK(s.model.gated_mlp);
  CHECK(s.model.position_embedding_type == PositionEmbedding::kRope);
  CHECK_FALSE(s.model.tie_word_embeddings);
  CHECK(s.model.normalization == Normalization::kLayerNorm);  // the script passes none
  const auto& w = s.warnings;
  CHECK(std::count_if(w.begin(), w.end(), [](const std::string& x) {
          return x.find("'if' condition not evaluated") != std::string::npos;
        }) == 0);  // [[ "MOCK" == "MOCK" ]] is evaluated: the mock-data branch
  CHECK(std::count_if(w.begin(), w.end(), [](const std::string& x) {
          return x.find("--load: a resumed run") != std::string::npos;
        }) == 1);
}

TEST_CASE("Megatron's --grad-reduce-in-bf16 halves the gradient buffer") {
  const MegatronLaunch l = ReadMegatronArgsFile(Data("launch/nvidia_llama3_8b_h200.sh"));
  const Setup bf16_grads = LoadSetupFromMegatron(l, OnDevice("h200-141g"), {});
  LoadOptions fp32 = OnDevice("h200-141g");
  fp32.overrides = {"training.grad_reduce_in_bf16=false"};
  const Setup fp32_grads = LoadSetupFromMegatron(l, fp32, {});
  const workload::StaticSizes a = workload::ComputeStaticSizes(bf16_grads, 0);
  const workload::StaticSizes b = workload::ComputeStaticSizes(fp32_grads, 0);
  CHECK(2 * a.gradient_bytes == b.gradient_bytes);
}

TEST_CASE("the NVIDIA Llama-3-8B H200 recipe fits, fused attention peaks as flash") {
  // --attention-backend fused (cuDNN) keeps no s x s scores, like flash: the two configs are one
  // Setup, so the fused peak is within 5% of flash (here: equal), and it fits the H200's
  // usable memory with no out-of-memory event. Two iterations: the second holds the optimizer
  // state created by the first step, so it is the steady state's peak.
  const MegatronLaunch l = ReadMegatronArgsFile(Data("launch/nvidia_llama3_8b_h200.sh"));
  LoadOptions o = OnDevice("h200-141g");
  o.iterations = 2;
  const Setup fused = LoadSetupFromMegatron(l, o, {});
  LoadOptions flash_options = o;
  flash_options.overrides = {"training.use_flash_attn=true"};
  const Setup flash = LoadSetupFromMegatron(l, flash_options, {});
  CHECK(fused.training == flash.training);
  engine::RunOptions run_options;
  run_options.keep_timeline = false;
  const engine::RunResult run = engine::RunAllStages(fused, run_options);
  CHECK_FALSE(run.first_oom.has_value());
  CHECK(run.Reported().peak_device_bytes <= fused.device.total_memory_bytes);
  const engine::RunResult run_flash = engine::RunAllStages(flash, run_options);
  const double a = static_cast<double>(run.Reported().peak_device_bytes);
  const double b = static_cast<double>(run_flash.Reported().peak_device_bytes);
  CHECK(std::abs(a - b) <= 0.05 * b);
}

// An endless file (/dev/zero) is refused at its first bytes, binary, instead of filling memory
// (core/read_file.h; the size bound itself is tested in tests/core/read_file_test.cc).
TEST_CASE("an endless --megatron-args file is refused") {
  CHECK_THROWS_WITH(ReadMegatronArgsFile("/dev/zero"),
                    "/dev/zero: binary data (a NUL byte at byte 0), not a --megatron-args file");
}

TEST_CASE("a wrong value names the script, its line and the flag") {
  const MegatronLaunch l = ReadLaunchScript(
      "bad.sh", "torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 2 --hidden-size 64 \\\n"
                "  --num-attention-heads 4 --seq-length 128 --vocab-size 1000 \\\n"
                "  --tensor-model-parallel-size x\n");
  CHECK(ErrorOf([&] { LoadSetupFromMegatron(l, OnDevice("h100-80g"), {}); }) ==
        "bad.sh:3: --tensor-model-parallel-size: expected an integer, got 'x'");
  const MegatronLaunch l3 = ReadLaunchScript(
      "bad.sh", "torchrun --nproc_per_node 3 pretrain_gpt.py --num-layers 2 --hidden-size 96 \\\n"
                "  --num-attention-heads 4 --seq-length 128 --vocab-size 1000 \\\n"
                "  --tensor-model-parallel-size 3\n");
  CHECK(ErrorOf([&] { LoadSetupFromMegatron(l3, OnDevice("h100-80g"), {}); }) ==
        "bad.sh:2: --num-attention-heads: 4 heads are not divisible by "
        "tensor_model_parallel_size 3");
}

TEST_CASE("an unknown flag warns and runs, an unsupported one exits unless allowed") {
  const std::vector<std::string> base = {"--num-layers", "2", "--hidden-size", "64",
                                         "--num-attention-heads", "4", "--seq-length", "128"};
  std::vector<std::string> words = base;
  words.insert(words.end(), {"--vocab-size", "1000", "--no-such-flag"});
  const Setup s = LoadSetupFromMegatron(ReadCommandLineArguments(words), OnDevice("h100-80g"), {});
  CHECK(s.warnings == std::vector<std::string>{
      "--megatron-args --no-such-flag: unknown flag (in none of the pinned Megatron-LM, "
      "MindSpeed, MindSpeed-LLM parsers); ignored",
      "--megatron-args: the world size is not given (no --nproc_per_node / --nnodes, "
      "GPUS_PER_NODE, NPUS_PER_NODE or NNODES); data_parallel_size 1 taken (torchrun's "
      "--nproc_per_node N among the arguments or --set training.data_parallel_size=N gives it)"});
  // --set gives the world size the arguments cannot: no warning then.
  LoadOptions dp8 = OnDevice("h100-80g");
  dp8.overrides = {"training.data_parallel_size=8"};
  const Setup s8 = LoadSetupFromMegatron(ReadCommandLineArguments(words), dp8, {});
  CHECK(s8.training.data_parallel_size == 8);
  CHECK(s8.warnings.size() == 1);
  words = base;
  words.insert(words.end(), {"--vocab-size", "1000", "--fp8-recipe", "delayed"});
  const MegatronLaunch fp8 = ReadCommandLineArguments(words);
  CHECK(ErrorOf([&] { LoadSetupFromMegatron(fp8, OnDevice("h100-80g"), {}); }) ==
        "unsupported: --megatron-args --fp8-recipe: low-precision (FP8/FP4) training; "
        "--allow-unsupported runs without it");
  CHECK_NOTHROW(LoadSetupFromMegatron(fp8, OnDevice("h100-80g"), {true}));
}

TEST_CASE("a missing vocabulary asks for --model or --set model.vocab_size") {
  const std::vector<std::string> words = {"--num-layers", "2", "--hidden-size", "64",
                                          "--num-attention-heads", "4", "--seq-length", "128"};
  const MegatronLaunch l = ReadCommandLineArguments(words);
  CHECK(ErrorOf([&] { LoadSetupFromMegatron(l, OnDevice("h100-80g"), {}); }) ==
        "--megatron-args: the vocabulary size is not in the arguments (the script leaves it to "
        "the tokenizer); give --model NAME|FILE or --set model.vocab_size=N");
  LoadOptions o = OnDevice("h100-80g");
  o.overrides = {"model.vocab_size=1000"};
  CHECK(LoadSetupFromMegatron(l, o, {}).model.vocab_size == 1000);
}

TEST_CASE("a training log's arguments block") {
  const MegatronLaunch l = ReadArgumentsLog("train.log", R"(some output
------------------------ arguments ------------------------
  attention_backend ............................... AttnBackend.flash
  bf16 ............................................ True
  data_parallel_size .............................. 4
  global_batch_size ............................... 32
  group_query_attention ........................... False
  hidden_size ..................................... 256
  micro_batch_size ................................ 2
  num_attention_heads ............................. 8
  num_layers ...................................... 4
  num_query_groups ................................ 1
  recompute_modules ............................... ['core_attn', 'mlp']
  seq_length ...................................... 512
  use_flash_attn .................................. False
  vocab_size ...................................... 5000
-------------------- end of arguments ---------------------
)");
  const Setup s = LoadSetupFromMegatron(l, OnDevice("h100-80g"), {});
  CHECK(s.training.data_parallel_size == 4);
  CHECK(s.training.num_micro_batches == 4);
  CHECK(s.training.use_flash_attn);
  CHECK(s.training.recompute_modules == std::vector<std::string>{"core_attn", "mlp"});
  CHECK(s.model.num_key_value_heads == 8);
  CHECK(s.model.vocab_size == 5000);
}

// Counts the warnings that contain `text`.
long Warned(const Setup& s, const std::string& text) {
  return std::count_if(s.warnings.begin(), s.warnings.end(),
                       [&](const std::string& w) { return w.find(text) != std::string::npos; });
}

TEST_CASE("a Megatron-LM GPT example in fp16, unedited", "[config]") {
  const std::string path = Data("launch/megatron_gpt_fp16.sh");
  const MegatronLaunch l = ReadMegatronArgsFile(path);
  // The GPT-2 BPE vocabulary comes from --vocab-file: 50257 tokens, given with --set.
  LoadOptions o = OnDevice("h100-80g");
  o.overrides = {"model.vocab_size=50257"};
  const Setup s = LoadSetupFromMegatron(l, o, {});
  const TrainingConfig& t = s.training;
  // torchrun --nproc_per_node 8 --nnodes 2: 16 ranks / (TP 4 × PP 2) = DP 2.
  CHECK(t.tensor_model_parallel_size == 4);
  CHECK(t.pipeline_model_parallel_size == 2);
  CHECK(t.data_parallel_size == 2);
  CHECK_FALSE(t.sequence_parallel);
  CHECK(t.seq_length == 2048);
  CHECK(t.micro_batch_size == 1);
  CHECK(t.global_batch_size == 256);
  CHECK(t.num_micro_batches == 128);  // 256 / (1 × 2)
  CHECK(t.precision == Precision::kFp16);
  CHECK(t.skipped_iterations == 0);
  CHECK(t.use_flash_attn);  // --attention-backend auto
  CHECK_FALSE(t.use_distributed_optimizer);
  CHECK(t.train_iters == 500000);  // no limit: a long run is simulated to its steady state
  CHECK(t.weight_decay == 0.1);
  CHECK(s.model.num_hidden_layers == 40);
  CHECK(s.model.hidden_size == 5120);
  CHECK(s.model.num_attention_heads == 40);
  CHECK(s.model.num_key_value_heads == 40);      // no --group-query-attention
  CHECK(s.model.intermediate_size == 4 * 5120);  // Megatron's default ffn_hidden_size 4h
  CHECK(s.model.vocab_size == 50257);
  // _vocab_size_with_padding: a multiple of 128 × TP 4 = 512: ceil(50257 / 512) = 99 → 50688.
  CHECK(s.model.padded_vocab_size == 50688);
  CHECK(s.model.tie_word_embeddings);
  CHECK(s.model.normalization == Normalization::kLayerNorm);
  // The five script arguments ($1..$5, lines 17-21), the 500000 iterations (line 42 of the
  // TRAINING_ARGS array), the unknown checkpoint (line 73 of EVAL_AND_LOGGING_ARGS).
  for (int line = 17; line <= 21; ++line) {
    CHECK(Warned(s, fmt::format("{}:{}: ${} is a script argument", path, line, line - 16)) == 1);
  }
  CHECK(Warned(s, "--train-iters") == 0);  // taken as it is (docs/config.md, 'Long runs')
  CHECK(Warned(s, path + ":73: --load: a resumed run") == 1);
}

TEST_CASE("a MindSpeed-LLM Qwen3-14B-shaped dense recipe, unedited", "[config]") {
  const std::string path = Data("launch/mindspeed_qwen3_14b.sh");
  const MegatronLaunch l = ReadMegatronArgsFile(path);
  const Setup s = LoadSetupFromMegatron(l, OnDevice("ascend-910b-64g"), {});
  const TrainingConfig& t = s.training;
  // NPUS_PER_NODE 8 × NNODES 2 = 16 ranks / (TP 4 × PP 2 × CP 1) = DP 2.
  CHECK(t.tensor_model_parallel_size == 4);
  CHECK(t.pipeline_model_parallel_size == 2);
  CHECK(t.context_parallel_size == 1);
  CHECK(t.data_parallel_size == 2);
  CHECK(t.sequence_parallel);
  CHECK(t.seq_length == 4096);
  CHECK(t.global_batch_size == 64);
  CHECK(t.num_micro_batches == 32);  // 64 / (1 × 2)
  CHECK(t.precision == Precision::kBf16);
  CHECK(t.accumulate_allreduce_grads_in_fp32);  // Megatron's bf16 default
  CHECK(t.use_distributed_optimizer);
  CHECK(t.overlap_grad_reduce);
  CHECK(t.overlap_param_gather);
  CHECK(t.use_flash_attn);
  CHECK(t.transformer_impl == "local");
  CHECK_FALSE(t.gradient_accumulation_fusion);
  CHECK(t.train_iters == 1000);
  CHECK(s.model.num_hidden_layers == 40);
  CHECK(s.model.hidden_size == 5120);
  CHECK(s.model.num_attention_heads == 40);
  CHECK(s.model.num_key_value_heads == 8);
  CHECK(s.model.head_dim == 128);
  CHECK(s.model.intermediate_size == 17408);
  CHECK(s.model.qk_layernorm);
  CHECK(s.model.gated_mlp);
  CHECK_FALSE(s.model.add_bias_linear);
  CHECK_FALSE(s.model.tie_word_embeddings);
  CHECK(s.model.normalization == Normalization::kRMSNorm);
  CHECK(s.model.position_embedding_type == PositionEmbedding::kRope);
  CHECK(s.model.vocab_size == 151936);
  CHECK(s.model.padded_vocab_size == 151936);  // --padded-vocab-size
  // --train-iters (TRAIN_ARGS, line 60) is taken as it is; --no-load-optim: the checkpoint
  // brings weights only. Neither warns.
  CHECK(Warned(s, "--train-iters") == 0);
  CHECK(Warned(s, "--load") == 0);
}

TEST_CASE("a MindSpeed-LLM script with --reuse-fp32-param and --swap-attention, unedited",
          "[config]") {
  const std::string path = Data("launch/mindspeed_reuse_swap.sh");
  const MegatronLaunch l = ReadMegatronArgsFile(path);
  const Setup s = LoadSetupFromMegatron(l, OnDevice("ascend-910b-64g"), {});
  const TrainingConfig& t = s.training;
  // --nproc_per_node=8 --nnodes=1 (values joined by '='): 8 ranks / TP 8 = DP 1.
  CHECK(t.tensor_model_parallel_size == 8);
  CHECK(t.pipeline_model_parallel_size == 1);
  CHECK(t.data_parallel_size == 1);
  CHECK(t.sequence_parallel);
  CHECK(t.seq_length == 4096);  // ${SEQ:-4096}
  CHECK(t.micro_batch_size == 2);
  CHECK(t.num_micro_batches == 128);  // 256 / (2 × 1)
  CHECK(t.use_distributed_optimizer);
  CHECK(t.use_flash_attn);
  CHECK(t.train_iters == 3);
  CHECK(s.model.num_hidden_layers == 40);
  CHECK(s.model.intermediate_size == 13824);
  CHECK(s.model.vocab_size == 32000);
  CHECK(s.model.padded_vocab_size == 32000);
  // MindSpeed's memory features: --reuse-fp32-param (line 19) and
  // --recompute-activation-function (line 21) are read into the training block; --swap-attention
  // (line 20) warns, saying what it changes and which way memsim's estimate errs; the fused
  // kernels (22-23) are memory-neutral; `source` (line 7) is not followed.
  CHECK(t.reuse_fp32_param);
  CHECK(t.recompute_activation_function);
  CHECK(t.recompute_activation_function_num_layers == -1);  // None: every layer
  const std::string high = "; memsim errs high (predicts more than the run uses)";
  CHECK(s.warnings ==
        std::vector<std::string>{
            path + ":7: 'source' not followed (memsim reads only this file)",
            path + ":20: --swap-attention: not modelled (MindSpeed moves the attention block's "
                   "saved activations to host memory in forward and prefetches them back in "
                   "backward (mindspeed/core/memory/swap_attention/): memsim keeps them on the "
                   "device)" + high});
}

TEST_CASE("MindSpeed's memory flags are refused where MindSpeed refuses them", "[config]") {
  const auto load = [](std::vector<std::string> extra) {
    std::vector<std::string> words = {"--num-layers", "2", "--hidden-size",
                                      "64", "--num-attention-heads", "4", "--seq-length", "32",
                                      "--max-position-embeddings", "32", "--micro-batch-size",
                                      "1", "--global-batch-size", "1", "--vocab-size", "256",
                                      "--use-distributed-optimizer"};
    words.insert(words.end(), extra.begin(), extra.end());
    return LoadSetupFromMegatron(ReadCommandLineArguments(words), OnDevice("ascend-910b-64g"), {});
  };
  // --recompute-activation-function-num-layers N: an int read as it is (activation_function.py).
  const Setup s = load({"--bf16", "--recompute-activation-function",
                        "--recompute-activation-function-num-layers", "1"});
  CHECK(s.training.recompute_activation_function_num_layers == 1);
  // reuse_fp32_param.py ReuseFP32Param.validate_args: dependency_check(args, 'bf16').
  CHECK_THROWS_WITH(load({"--fp16", "--reuse-fp32-param"}),
                    Catch::Contains("--reuse-fp32-param: true needs precision \"bf16\""));
}

TEST_CASE("the precision-aware optimizer's flags, from a script and from a log", "[config]") {
  const std::vector<std::string> words = {"--nproc_per_node",
                                          "2",
                                          "pretrain_gpt.py",
                                          "--num-layers",
                                          "2",
                                          "--hidden-size",
                                          "64",
                                          "--num-attention-heads",
                                          "4",
                                          "--seq-length",
                                          "128",
                                          "--vocab-size",
                                          "1000",
                                          "--bf16",
                                          "--use-distributed-optimizer",
                                          "--use-precision-aware-optimizer",
                                          "--exp-avg-dtype",
                                          "bf16",
                                          "--exp-avg-sq-dtype",
                                          "fp8",
                                          "--main-params-dtype",
                                          "fp16"};
  const MegatronLaunch l =
      ReadCommandLineArguments(std::vector<std::string>(words.begin() + 3, words.end()));
  const Setup s = LoadSetupFromMegatron(l, OnDevice("h100-80g"), {});
  CHECK(s.training.use_precision_aware_optimizer);
  CHECK(s.training.exp_avg_dtype == StateDtype::kBf16);
  CHECK(s.training.exp_avg_sq_dtype == StateDtype::kFp8);
  CHECK(s.training.main_params_dtype == Precision::kFp16);
  // validate_args prints the dtypes mapped to torch's (fp8 is torch.uint8).
  const Setup g = LoadSetupFromMegatron(ReadArgumentsLog("train.log", R"(
------------------------ arguments ------------------------
  bf16 ............................................ True
  exp_avg_dtype ................................... torch.uint8
  exp_avg_sq_dtype ................................ torch.bfloat16
  hidden_size ..................................... 64
  main_params_dtype ............................... torch.float32
  num_attention_heads ............................. 4
  num_layers ...................................... 2
  seq_length ...................................... 128
  use_distributed_optimizer ....................... True
  use_precision_aware_optimizer ................... True
  vocab_size ...................................... 1000
-------------------- end of arguments ---------------------
)"),
                                        OnDevice("h100-80g"), {});
  CHECK(g.training.exp_avg_dtype == StateDtype::kFp8);
  CHECK(g.training.exp_avg_sq_dtype == StateDtype::kBf16);
  CHECK(g.training.main_params_dtype == Precision::kFp32);
}

}  // namespace
}  // namespace memsim::config

namespace memsim::config {
namespace {

const std::vector<std::string> kSmall = {"--num-layers", "2", "--hidden-size", "64",
                                         "--num-attention-heads", "4", "--seq-length", "128",
                                         "--vocab-size", "1000", "--tensor-model-parallel-size",
                                         "2"};

std::vector<std::string> With(std::vector<std::string> words,
                              const std::vector<std::string>& more) {
  words.insert(words.end(), more.begin(), more.end());
  return words;
}

TEST_CASE("the arguments after -- give the world size as torchrun's options do") {
  // tryout6 #14: torchrun's --nproc_per_node 8 --nnodes 2 among the arguments: world 16, and
  // data_parallel_size = 16 / (TP 2 × PP 1 × CP 1) = 8, with no warning.
  const MegatronLaunch l =
      ReadCommandLineArguments(With({"--nproc_per_node", "8", "--nnodes=2"}, kSmall));
  CHECK(l.nproc_per_node == 8);
  CHECK(l.nnodes == 2);
  const Setup s = LoadSetupFromMegatron(l, OnDevice("h100-80g"), {});
  CHECK(s.training.data_parallel_size == 8);
  CHECK(s.warnings.empty());
  // The dashed spelling (torchrun accepts both) and an elastic range (its minimum, 4, taken):
  // world 4 / TP 2 = DP 2.
  const MegatronLaunch elastic = ReadCommandLineArguments(With(kSmall, {"--nproc-per-node", "4:8"}));
  CHECK(LoadSetupFromMegatron(elastic, OnDevice("h100-80g"), {}).training.data_parallel_size == 2);
  CHECK(elastic.warnings == std::vector<std::string>{
                                "--megatron-args --nproc_per_node 4:8: an elastic range; its "
                                "minimum taken"});
  CHECK(ErrorOf([&] { ReadCommandLineArguments(With(kSmall, {"--nnodes", "two"})); }) ==
        "--megatron-args --nnodes: expected a positive number of nodes, got 'two'");
  CHECK(ErrorOf([&] { ReadCommandLineArguments(With(kSmall, {"--nproc_per_node"})); }) ==
        "--megatron-args --nproc_per_node: expected a value");
}

TEST_CASE("a whole torchrun command after -- is read as a one-line launch script") {
  // torchrun --nproc_per_node 4 pretrain_gpt.py ...: world 4 / TP 2 = DP 2; the arguments are
  // the words after the .py, labelled as command-line arguments (line 0).
  const MegatronLaunch l = ReadCommandLineArguments(
      With({"torchrun", "--nproc_per_node", "4", "pretrain_gpt.py"}, kSmall));
  CHECK(l.kind == MegatronLaunch::Kind::kCommandLine);
  CHECK(l.nproc_per_node == 4);
  CHECK(Args(l).front() == "--num-layers=2");
  CHECK(l.arguments.front().line == 0);
  CHECK(LoadSetupFromMegatron(l, OnDevice("h100-80g"), {}).training.data_parallel_size == 2);
  // Launcher options then the script, without the launcher's name; a quote in a word stays.
  const MegatronLaunch bare = ReadCommandLineArguments(
      With({"--nnodes", "2", "pretrain_gpt.py", "--data-path", "it's"}, kSmall));
  CHECK(bare.nnodes == 2);
  CHECK(Args(bare)[0] == "--data-path=it's");
}

TEST_CASE("a script's --hccl-group-buffer, --tp-comm-overlap and --log-params-norm reach the setup") {
  // MindSpeed's --hccl-group-buffer "dp_cp:100;cp2:50": MiB per Megatron process group; memsim
  // makes no communicator for "cp2", which is named in a warning rather than dropped.
  const MegatronLaunch l = ReadCommandLineArguments(
      With({"torchrun", "--nproc_per_node", "4", "pretrain_gpt.py", "--tp-comm-overlap",
            "--log-params-norm", "--hccl-group-buffer", "dp_cp:100;cp2:50"},
           kSmall));
  const Setup s = LoadSetupFromMegatron(l, OnDevice("ascend-910b-64g"), {});
  CHECK(s.training.tp_comm_overlap);
  CHECK(s.training.log_params_norm);
  CHECK(s.training.env.hccl_group_buffer.at("dp_cp") == Bytes{100} << 20);
  CHECK(std::any_of(s.warnings.begin(), s.warnings.end(), [](const std::string& w) {
    return w.find("--hccl-group-buffer: group \"cp2\" not modelled") != std::string::npos;
  }));
}

TEST_CASE("a model built from the arguments is named by its launch and its config reproduces") {
  const MegatronLaunch l = ReadCommandLineArguments(
      With(kSmall, {"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type",
                    "rope", "--seq-length", "4096", "--max-position-embeddings", "4096"}));
  const Setup s = LoadSetupFromMegatron(l, OnDevice("h100-80g"), {});
  // Megatron's GPT defaults (GELU, LayerNorm, learned positions, biases, tied embeddings)
  // changed by --swiglu, --normalization RMSNorm and --position-embedding-type rope.
  CHECK(ModelName(s) == "-- ARGS (Megatron arguments; SwiGLU, RMSNorm, RoPE)");
  // tryout6 #15: the reproducing config, read back as a JSON training config, is the same
  // setup (the model object built from the arguments, seq 4096 within its positions).
  const std::string path = testing::WriteTemp("megatron-reproduce.json", s.reproducing_config);
  const Setup again = LoadSetup(path, {});
  CHECK(again.model == s.model);
  CHECK(again.training == s.training);
  CHECK(again.device == s.device);
  CHECK(again.allocator == s.allocator);
}

TEST_CASE("MindSpeed's --use-fused-moe-token-permute-and-unpermute is --moe-permute-fusion",
          "[config]") {
  // FusedMoEPermuteFeature.validate_args (MindSpeed 028de58,
  // mindspeed/features_manager/fusions/fused_moe_permute.py) sets moe_permute_fusion when the
  // MindSpeed flag is given: the same fused permutation, no warning.
  const std::vector<std::string> words = {
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
      "128", "--vocab-size", "1000", "--num-experts", "4", "--moe-router-topk", "2",
      "--moe-token-dispatcher-type", "alltoall", "--use-fused-moe-token-permute-and-unpermute"};
  const Setup s = LoadSetupFromMegatron(ReadCommandLineArguments(words), OnDevice("h100-80g"), {});
  CHECK(s.training.moe_permute_fusion);
  CHECK(s.not_modelled.empty());
}

}  // namespace
}  // namespace memsim::config
