// Launch scripts, training logs and the flag table (config/launch_script.h, megatron_args.h,
// megatron_flags.h; issue 14). The fixtures under data/launch/ are written for these tests with
// the constructs of the published MindSpeed-LLM and Megatron-LM launch scripts.
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <catch2/catch.hpp>

#include "config/launch_script.h"
#include "config/megatron_args.h"
#include "config/megatron_flags.h"
#include "config/test_util.h"
#include "core/error.h"
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
  CHECK(Args(l) == std::vector<std::string>{"--v=1", "--w"});
  CHECK(l.nproc_per_node == 8);
  CHECK(l.warnings == std::vector<std::string>{
                          "t.sh:1: $(cat f) not evaluated (memsim runs no command); taken as empty",
                          "t.sh:2: $Y is not set in the script (a value from the environment); "
                          "taken as empty",
                          "t.sh:2: 'if' condition not evaluated; the first branch taken",
                          "t.sh:7: 'for' loop not evaluated; skipped",
                          "t.sh:8: $HOME is not set in the script (a value from the "
                          "environment); taken as empty"});
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
    if (f.flag_class == FlagClass::kNotModelled || f.flag_class == FlagClass::kUnsupported) {
      CHECK(!f.why.empty());
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
  // Arguments expanded from a group carry the line of the training command (line 90).
  const std::string at = Data("launch/mindspeed_llama2_7b.sh") + ":90: ";
  CHECK(s.warnings == std::vector<std::string>{
      at + "--use-fused-rmsnorm: not modelled (MindSpeed's fused RMSNorm kernel: it changes one "
           "norm's temporaries)",
      at + "--use-fused-swiglu: not modelled (MindSpeed's fused SwiGLU kernel: it changes one "
           "MLP's temporaries)"});
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
        }) == 1);
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

TEST_CASE("an unknown flag warns and runs; an unsupported one exits unless allowed") {
  const std::vector<std::string> base = {"--num-layers", "2", "--hidden-size", "64",
                                         "--num-attention-heads", "4", "--seq-length", "128"};
  std::vector<std::string> words = base;
  words.insert(words.end(), {"--vocab-size", "1000", "--no-such-flag"});
  const Setup s = LoadSetupFromMegatron(ReadCommandLineArguments(words), OnDevice("h100-80g"), {});
  CHECK(s.warnings == std::vector<std::string>{
      "--megatron-args --no-such-flag: unknown flag (in none of the pinned Megatron-LM, "
      "MindSpeed, MindSpeed-LLM parsers); ignored",
      "--megatron-args: the world size is not given (no --nproc_per_node / --nnodes, "
      "GPUS_PER_NODE, NPUS_PER_NODE or NNODES); data_parallel_size 1 taken"});
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

}  // namespace
}  // namespace memsim::config
