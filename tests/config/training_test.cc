// The training block's reader (config/training.h): framework "pytorch" (plain PyTorch on one
// device, no wrapper) and its keys, recompute_modules, and the notes that say what memsim assumes.
// Messages asserted verbatim.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/load.h"
#include "test_util.h"

namespace memsim::config {
namespace {

using testing::ErrorOf;
using testing::IsUnsupported;

// A small llama inline (hidden 256, 32 heads, 8 key/value heads, 2 layers, vocab 32001) on an
// a100-80g, with the given training members; written to a fresh temporary file.
std::string Config(const std::string& name, const std::string& training) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("memsim_training_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, "
                         "\"intermediate_size\": 688, \"num_attention_heads\": 32, "
                         "\"num_key_value_heads\": 8, \"num_hidden_layers\": 2, \"vocab_size\": "
                         "32001}, \"device\": \"a100-80g\", \"training\": {"
                      << training << "}}";
  return path;
}

const std::string kPytorch =
    "\"framework\": \"pytorch\", \"seq_length\": 512, \"micro_batch_size\": 2, "
    "\"global_batch_size\": 8";

bool HasNote(const Setup& s, const std::string& text) {
  return std::any_of(s.notes.begin(), s.notes.end(),
                     [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

bool HasWarning(const Setup& s, const std::string& text) {
  return std::any_of(s.warnings.begin(), s.warnings.end(),
                     [&](const std::string& w) { return w.find(text) != std::string::npos; });
}

TEST_CASE("framework pytorch: one device, its defaults and what it assumes", "[config]") {
  const std::string path = Config("pt1.json", kPytorch);
  const Setup s = LoadSetup(path, {});
  CHECK(s.training.framework == "pytorch");
  // global_batch_size / micro_batch_size = 8 / 2 = 4 gradient accumulation steps (DP is 1).
  CHECK(s.training.num_micro_batches == 4);
  // No Megatron padding: a Hugging Face model keeps config.vocab_size rows (Megatron would pad
  // 32001 to a multiple of 128: 251 × 128 = 32128).
  CHECK(s.model.padded_vocab_size == 32001);
  CHECK(s.training.pytorch()->torch_dtype == Precision::kFp32);
  CHECK(s.training.pytorch()->zero_grad_set_to_none);
  CHECK(s.training.precision == Precision::kBf16);
  CHECK_FALSE(s.training.accumulate_allreduce_grads_in_fp32);  // Megatron forces it, not torch
  CHECK_FALSE(s.training.gradient_accumulation_fusion);
  CHECK(s.training.optimizer_impl == OptimizerImpl::kForeach);
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{SingleDevice{true}});
  CHECK(HasNote(s, path + ": /training/gradient_accumulation_fusion: taken as false with "
                          "framework \"pytorch\" (Megatron's fused weight-gradient accumulation; "
                          "autograd produces each weight gradient)"));
  CHECK(HasNote(s, path + ": /training/optimizer_impl: absent, 'foreach' taken (torch.optim's "
                          "default on the device)"));
  CHECK(HasNote(s, path + ": /training/precision: absent, bf16 taken (memsim's default): "
                          "torch.autocast to bfloat16 over the weights; \"fp32\" for no autocast"));
  // Not stated versions are only noted where Megatron's fused accumulation would use them.
  CHECK_FALSE(HasNote(s, "transformer_engine_version"));
}

TEST_CASE("framework pytorch: torch_dtype, zero_grad_set_to_none, precision", "[config]") {
  Setup s = LoadSetup(Config("pt2.json", kPytorch + ", \"torch_dtype\": \"bfloat16\", "
                                                    "\"zero_grad_set_to_none\": false, "
                                                    "\"precision\": \"fp32\", "
                                                    "\"gradient_accumulation_fusion\": false"),
                      {});
  CHECK(s.training.pytorch()->torch_dtype == Precision::kBf16);
  CHECK_FALSE(s.training.pytorch()->zero_grad_set_to_none);
  CHECK(s.training.precision == Precision::kFp32);  // no autocast: pure bf16 weights
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{SingleDevice{false}});
  CHECK_FALSE(HasNote(s, "gradient_accumulation_fusion"));
  CHECK_FALSE(HasNote(s, "/training/precision"));
  s = LoadSetup(Config("pt3.json", kPytorch + ", \"torch_dtype\": \"float16\", \"fp16\": true, "
                                              "\"optimizer\": \"sgd\", \"optimizer_impl\": "
                                              "\"fused\", \"gradient_accumulation_steps\": 4"),
                {});
  CHECK(s.training.pytorch()->torch_dtype == Precision::kFp16);
  CHECK(s.training.precision == Precision::kFp16);
  CHECK(s.training.optimizer_impl == OptimizerImpl::kFused);
  CHECK(HasNote(s,
                "/training/sgd_momentum: absent, 0.9 taken (Megatron's default; "
                "torch.optim.SGD's own default is 0, without a momentum buffer)"));
  std::string path = Config("pt4.json", kPytorch + ", \"torch_dtype\": \"floa32\"");
  CHECK(ErrorOf(path) == path +
                             ": /training/torch_dtype: expected one of 'float32', 'bfloat16', "
                             "'float16', got \"floa32\" (did you mean 'float32'?)");
  path = Config("pt5.json", kPytorch + ", \"gradient_accumulation_steps\": 3");
  CHECK(ErrorOf(path) == path +
                             ": /training/gradient_accumulation_steps: 3 disagrees with "
                             "global_batch_size / (micro_batch_size × data_parallel_size) = 4");
}

TEST_CASE("framework pytorch: every parallel size but data parallel must be 1", "[config]") {
  const std::string key =
      GENERATE(as<std::string>{}, "tensor_model_parallel_size", "pipeline_model_parallel_size",
               "context_parallel_size");
  const std::string path = Config("pt_" + key + ".json", kPytorch + ", \"" + key + "\": 2");
  CHECK(ErrorOf(path) == path + ": /training/" + key +
                             ": framework \"pytorch\" runs data parallel only (one device, or "
                             "DistributedDataParallel); expected 1, got 2");
  CHECK_NOTHROW(LoadSetup(Config("pt1_" + key + ".json", kPytorch + ", \"" + key + "\": 1"), {}));
}

TEST_CASE("framework pytorch: data_parallel_size > 1 is DistributedDataParallel", "[config][ddp]") {
  Setup s = LoadSetup(Config("pt_ddp.json", kPytorch + ", \"data_parallel_size\": 2, "
                                                       "\"bucket_cap_mb\": 50, "
                                                       "\"gradient_as_bucket_view\": true"),
                      {});
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{TorchDdp{true, 50, false, true}});
  // The DDP arguments are not Megatron's.
  const std::string path = Config("mg_ddp.json", "\"seq_length\": 128, \"bucket_cap_mb\": 50");
  CHECK(ErrorOf(path) == path + ": /training/bucket_cap_mb: a framework \"pytorch\" key (PyTorch "
                                "DistributedDataParallel's argument); Megatron-core DDP lays out "
                                "its buckets by itself (overlap_grad_reduce, "
                                "use_distributed_optimizer)");
}

TEST_CASE("framework pytorch: expert parallel sizes must be 1", "[config]") {
  const std::string path = Config("pt_ep.json", kPytorch + ", \"expert_model_parallel_size\": 2");
  CHECK(ErrorOf(path) == path + ": /training/expert_model_parallel_size: framework \"pytorch\" "
                                "runs data parallel only (one device, or DistributedDataParallel); "
                                "expected 1, got 2");
}

TEST_CASE("framework pytorch: Megatron-only switches are errors naming the key", "[config]") {
  const std::string tail =
      "; framework \"pytorch\" is plain PyTorch: one device, or DistributedDataParallel over "
      "data_parallel_size devices";
  using Row = std::tuple<std::string, std::string>;
  const auto [key, feature] = GENERATE(table<std::string, std::string>({
      Row{"use_distributed_optimizer", "Megatron's distributed optimizer"},
      Row{"use_megatron_fsdp", "Megatron-FSDP"},
      Row{"sequence_parallel", "sequence parallelism"},
      Row{"overlap_grad_reduce", "the wrapper's overlapped gradient reduction"},
      Row{"overlap_param_gather", "the distributed optimizer's overlapped parameter all-gather"},
      Row{"accumulate_allreduce_grads_in_fp32", "Megatron DDP's fp32 gradient buffers"},
  }));
  const std::string path = Config("pt_" + key + ".json", kPytorch + ", \"" + key + "\": true");
  CHECK(ErrorOf(path) == path + ": /training/" + key + ": true needs framework \"megatron\" (" +
                             feature + ")" + tail);
  // false says nothing Megatron-only.
  CHECK_NOTHROW(
      LoadSetup(Config("ptf_" + key + ".json", kPytorch + ", \"" + key + "\": false"), {}));
}

TEST_CASE("framework pytorch: virtual pipeline, ZeRO and sharding keys", "[config]") {
  const std::string tail =
      "; framework \"pytorch\" is plain PyTorch: one device, or DistributedDataParallel over "
      "data_parallel_size devices";
  std::string path =
      Config("pt_vpp.json", kPytorch + ", \"num_layers_per_virtual_pipeline_stage\": 1");
  CHECK(ErrorOf(path) == path +
                             ": /training/num_layers_per_virtual_pipeline_stage: needs "
                             "framework \"megatron\" (interleaved pipeline schedule)" +
                             tail);
  path = Config("pt_vst.json", kPytorch + ", \"num_virtual_stages_per_pipeline_rank\": 2");
  CHECK(ErrorOf(path) == path +
                             ": /training/num_virtual_stages_per_pipeline_rank: needs "
                             "framework \"megatron\" (interleaved pipeline schedule)" +
                             tail);
  path = Config("pt_zero.json", kPytorch + ", \"zero_stage\": 1");
  CHECK(ErrorOf(path) == path +
                             ": /training/zero_stage: 1 needs framework \"megatron\" (ZeRO-1 "
                             "is Megatron's distributed optimizer)" +
                             tail);
  path = Config("pt_shard.json", kPytorch + ", \"data_parallel_sharding_strategy\": \"optim\"");
  CHECK(ErrorOf(path) == path +
                             ": /training/data_parallel_sharding_strategy: \"optim\" needs "
                             "framework \"megatron\" (Megatron-FSDP)" +
                             tail);
  CHECK_NOTHROW(LoadSetup(Config("pt_zero0.json", kPytorch + ", \"zero_stage\": 0"), {}));
}

TEST_CASE("framework megatron: torch_dtype and zero_grad_set_to_none are warned as unused",
          "[config]") {
  const std::string path = Config("mg1.json",
                                  "\"seq_length\": 512, \"torch_dtype\": \"bfloat16\", "
                                  "\"zero_grad_set_to_none\": false");
  const Setup s = LoadSetup(path, {});
  CHECK(s.training.framework == "megatron");
  // Always printed (Setup::warnings), not only under --verbose: a forgotten `framework` would
  // otherwise silently simulate Megatron.
  CHECK(HasWarning(s, path + ": /training/torch_dtype: not used with framework \"megatron\" (it "
                             "applies to framework \"pytorch\")"));
  CHECK(HasWarning(s, path + ": /training/zero_grad_set_to_none: not used with framework "
                             "\"megatron\" (it applies to framework \"pytorch\")"));
  // Megatron pads the vocabulary: 32001 to a multiple of 128 × TP 1 is 251 × 128 = 32128.
  CHECK(s.model.padded_vocab_size == 32128);
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{MegatronDdp{false}});
  // A wrong value is still an error.
  const std::string bad = Config("mg2.json", "\"seq_length\": 512, \"zero_grad_set_to_none\": 1");
  CHECK(ErrorOf(bad) == bad + ": /training/zero_grad_set_to_none: expected true or false, got 1");
}

TEST_CASE("the data-parallel wrapper of each Megatron setup", "[config]") {
  const std::string base =
      "\"seq_length\": 512, \"data_parallel_size\": 4, \"global_batch_size\": 4";
  Setup s = LoadSetup(Config("w1.json", base + ", \"use_distributed_optimizer\": true"), {});
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{MegatronDdp{true}});
  s = LoadSetup(Config("w2.json", base + ", \"use_megatron_fsdp\": true, "
                                         "\"data_parallel_sharding_strategy\": \"optim\""),
                {});
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{MegatronFsdp{FsdpSharding::kOptim}});
}

TEST_CASE("recompute_modules: Megatron's names, shared_experts and MLA ones unsupported",
          "[config]") {
  const std::string selective = "\"seq_length\": 512, \"recompute_granularity\": \"selective\"";
  Setup s = LoadSetup(
      Config("r1.json",
             selective + ", \"recompute_modules\": [\"core_attn\", \"mlp\", \"layernorm\"]"),
      {});
  CHECK(s.training.recompute_modules == std::vector<std::string>{"core_attn", "mlp", "layernorm"});
  s = LoadSetup(Config("r2.json", selective), {});
  CHECK(s.training.recompute_modules ==
        std::vector<std::string>{"core_attn"});  // Megatron's default
  const std::string names =
      "'core_attn', 'moe_act', 'layernorm', 'mlp', 'moe' (Megatron's 'mla_up_proj', "
      "'shared_experts', 'mhc', 'gdn', 'gdn_norm_out' are not modelled)";
  std::string path =
      Config("r3.json", selective + ", \"recompute_modules\": [\"core_attn\", \"mlpp\"]");
  CHECK(ErrorOf(path) == path + ": /training/recompute_modules/1: expected one of " + names +
                             ", got \"mlpp\" (did you mean 'mlp'?)");
  path = Config("r4.json", selective + ", \"recompute_modules\": [3]");
  CHECK(ErrorOf(path) ==
        path + ": /training/recompute_modules/0: expected one of " + names + ", got 3");
  s = LoadSetup(Config("r5.json", selective + ", \"recompute_modules\": [\"moe\", \"moe_act\"]"),
                {});
  CHECK(s.training.recompute_modules == std::vector<std::string>{"moe", "moe_act"});
  path = Config("r6.json", selective + ", \"recompute_modules\": [\"mla_up_proj\"]");
  CHECK(ErrorOf(path) == "unsupported: " + path +
                             ": /training/recompute_modules/0: recompute module 'mla_up_proj' "
                             "(multi-latent attention's up projection, not modelled)");
  for (const char* moe : {"shared_experts", "mhc", "gdn", "gdn_norm_out"}) {
    CHECK(IsUnsupported(Config(std::string("r7_") + moe + ".json",
                               selective + ", \"recompute_modules\": [\"" + moe + "\"]")));
  }
  // Without selective recompute the list is read, and a warning says it is not used.
  path = Config("r8.json", "\"seq_length\": 512, \"recompute_modules\": [\"mlp\"]");
  s = LoadSetup(path, {});
  CHECK(HasWarning(s, path + ": /training/recompute_modules: not used: the modules apply to "
                             "recompute_granularity \"selective\""));
}

TEST_CASE("overlap_param_gather says what memsim assumes", "[config]") {
  const std::string path =
      Config("o1.json",
             "\"seq_length\": 512, \"data_parallel_size\": 2, \"global_batch_size\": 2, "
             "\"use_distributed_optimizer\": true, \"overlap_param_gather\": true");
  const Setup s = LoadSetup(path, {});
  CHECK(s.training.overlap_param_gather);
  CHECK(HasNote(s, path + ": /training/overlap_param_gather: true, but memsim emits the "
                          "distributed optimizer's parameter all-gather at the end of the step, "
                          "as without overlap (overlapping it with the next forward is not "
                          "modelled)"));
  // Megatron-FSDP without sharding has no parameter all-gather at all.
  const std::string fsdp =
      Config("o2.json",
             "\"seq_length\": 512, \"data_parallel_size\": 2, \"global_batch_size\": 2, "
             "\"use_megatron_fsdp\": true, \"overlap_param_gather\": true");
  CHECK(HasNote(LoadSetup(fsdp, {}), fsdp + ": /training/overlap_param_gather: true, no effect: "
                                            "Megatron-FSDP \"no_shard\" shards no parameters, so "
                                            "there is no all-gather to overlap"));
}

TEST_CASE("skipped_iterations: fp16 only, default 0", "[config]") {
  const std::string fp16 = "\"seq_length\": 512, \"precision\": \"fp16\"";
  CHECK(LoadSetup(Config("s0.json", fp16), {}).training.skipped_iterations == 0);
  CHECK(LoadSetup(Config("s1.json", fp16 + ", \"skipped_iterations\": 3"), {})
            .training.skipped_iterations == 3);
  // Pure PyTorch: torch.amp.GradScaler skips the same way.
  CHECK(LoadSetup(Config("s2.json", kPytorch + ", \"precision\": \"fp16\", "
                                               "\"skipped_iterations\": 2"),
                  {})
            .training.skipped_iterations == 2);
  std::string path = Config("s3.json", "\"seq_length\": 512, \"skipped_iterations\": 1");
  CHECK(ErrorOf(path) == path +
                             ": /training/skipped_iterations: 1 needs precision \"fp16\" "
                             "(only the fp16 loss scaler skips steps)");
  path = Config("s4.json", fp16 + ", \"skipped_iterations\": -1");
  CHECK(ErrorOf(path).find(path + ": /training/skipped_iterations: ") == 0);
}

TEST_CASE("the precision-aware optimizer and its dtypes follow Megatron's rules", "[config]") {
  const std::string dist =
      "\"seq_length\": 512, \"data_parallel_size\": 2, \"global_batch_size\": 2, "
      "\"use_distributed_optimizer\": true";
  const Setup s = LoadSetup(
      Config("pa1.json",
             dist + ", \"use_precision_aware_optimizer\": true, \"main_params_dtype\": "
                    "\"fp16\", \"exp_avg_dtype\": \"bf16\", \"exp_avg_sq_dtype\": \"fp8\""),
      {});
  CHECK(s.training.use_precision_aware_optimizer);
  CHECK(s.training.main_params_dtype == Precision::kFp16);
  CHECK(s.training.exp_avg_dtype == StateDtype::kBf16);
  CHECK(s.training.exp_avg_sq_dtype == StateDtype::kFp8);
  // OptimizerConfig.__post_init__: the dtypes stay fp32 without it.
  std::string path = Config("pa2.json", dist + ", \"exp_avg_dtype\": \"bf16\"");
  CHECK(ErrorOf(path) == path +
                             ": /training/exp_avg_dtype: bf16 needs "
                             "use_precision_aware_optimizer true (Megatron keeps it fp32 "
                             "otherwise)");
  CHECK_NOTHROW(LoadSetup(Config("pa3.json", dist + ", \"exp_avg_dtype\": \"fp32\""), {}));
  // get_megatron_optimizer: only with the distributed optimizer.
  path = Config("pa4.json", "\"seq_length\": 512, \"use_precision_aware_optimizer\": true");
  CHECK(ErrorOf(path) == path +
                             ": /training/use_precision_aware_optimizer: true needs "
                             "use_distributed_optimizer true");
  path = Config("pa5.json", dist +
                                ", \"use_precision_aware_optimizer\": true, \"optimizer\": "
                                "\"sgd\"");
  CHECK(ErrorOf(path) == path +
                             ": /training/use_precision_aware_optimizer: true needs "
                             "optimizer \"adam\"");
  CHECK(IsUnsupported(Config("pa6.json", dist + ", \"use_precision_aware_optimizer\": true, "
                                                "\"precision\": \"fp32\"")));
}

TEST_CASE("framework pytorch: ZeRO-2/3 is unsupported without naming Megatron's ZeRO-1",
          "[config]") {
  const std::string path = Config("pt_zero2.json", kPytorch + ", \"zero_stage\": 2");
  CHECK(ErrorOf(path) == "unsupported: " + path +
                             ": /training/zero_stage: ZeRO stage 2 with framework \"pytorch\" "
                             "(framework \"pytorch\" is plain PyTorch: one device, or "
                             "DistributedDataParallel over data_parallel_size devices)");
}

}  // namespace
}  // namespace memsim::config

namespace memsim::config {
namespace {

const std::string kMegatron = "\"seq_length\": 512, \"global_batch_size\": 8";

TEST_CASE("training.env, tp_comm_overlap and hccl_group_buffer: read, and bad values named",
          "[config]") {
  const Setup s = LoadSetup(
      Config("env1.json", kMegatron + ", \"tp_comm_overlap\": true, \"hccl_group_buffer\": "
                                      "\"dp:200;tp:300\", \"env\": {\"NCCL_BUFFSIZE\": 16777216, "
                                      "\"NCCL_NVLS_ENABLE\": 0, \"HCCL_BUFFSIZE\": 100, "
                                      "\"CUDA_MODULE_LOADING\": \"EAGER\"}"),
      {});
  CHECK(s.training.tp_comm_overlap);
  CHECK(s.training.env.nccl_buffsize == 16 * kMiB);
  CHECK_FALSE(s.training.env.nccl_nvls_enable);
  CHECK(s.training.env.hccl_buffsize == 100 * kMiB);
  CHECK(s.training.env.cuda_module_loading_eager);
  CHECK(s.training.env.hccl_group_buffer == std::map<std::string, Bytes>{{"dp", 200 * kMiB},
                                                                         {"tp", 300 * kMiB}});
  const std::string bad_size = Config("env2.json", kMegatron + ", \"env\": {\"NCCL_BUFFSIZE\": 0}");
  CHECK(ErrorOf(bad_size).find("/training/env/NCCL_BUFFSIZE: expected bytes from 1 to 2^30, got 0") !=
        std::string::npos);
  const std::string unknown = Config("env3.json", kMegatron + ", \"env\": {\"NCCL_ALGO\": \"ring\"}");
  CHECK(ErrorOf(unknown).find("/training/env/NCCL_ALGO") != std::string::npos);
  // A group memsim makes no communicator for (MindSpeed's "cp2") is named in a warning.
  const Setup cp2 = LoadSetup(
      Config("env5.json", kMegatron + ", \"hccl_group_buffer\": \"dp_cp:100;cp2:50\""), {});
  CHECK(cp2.training.env.hccl_group_buffer.at("dp_cp") == 100 * kMiB);
  CHECK(HasWarning(cp2, "/training/hccl_group_buffer: group \"cp2\" not modelled"));
  CHECK_FALSE(HasWarning(cp2, "\"dp_cp\""));
  // Megatron's older name of the expert group ('exp', parallel_state.py before MoE parallel
  // folding) and memsim's "ep" are one group: naming it twice is an error.
  const std::string twice =
      Config("env6.json", kMegatron + ", \"hccl_group_buffer\": \"ep:100;exp:200\"");
  CHECK(ErrorOf(twice) == twice + ": /training/hccl_group_buffer: \"exp\" names group \"ep\", "
                                  "which an earlier entry sizes already");
  const std::string bad_groups = Config("env4.json", kMegatron + ", \"hccl_group_buffer\": \"dp=200\"");
  CHECK(ErrorOf(bad_groups).find("/training/hccl_group_buffer: expected \"group:MiB;group:MiB\"") !=
        std::string::npos);
}

}  // namespace
}  // namespace memsim::config
