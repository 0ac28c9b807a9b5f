// framework "hf-trainer" (config/hf_trainer.h): TrainingArguments names into a plain PyTorch
// loop, the errors that name the right key, and the encoder model types (bert, roberta).
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/iterations.h"
#include "config/load.h"
#include "config/stack.h"
#include "test_util.h"
#include "workload/build.h"

namespace memsim::config {
namespace {

using testing::ErrorOf;
using testing::IsUnsupported;

std::string Write(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("memsim_hf_trainer_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

// A small llama inline on an a100-80g with the given training members.
std::string Config(const std::string& name, const std::string& training) {
  return Write(name,
               "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, "
               "\"intermediate_size\": 688, \"num_attention_heads\": 32, "
               "\"num_key_value_heads\": 8, \"num_hidden_layers\": 2, \"vocab_size\": 32001}, "
               "\"device\": \"a100-80g\", \"training\": {\"framework\": \"hf-trainer\", " +
                   training + "}}");
}

// A llama3-8b LoRA config on an rtx-4090-24g whose adapter_config holds r 8 and `fields`.
std::string LlamaAdapter(const std::string& name, const std::string& fields) {
  return Write(name, "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", \"training\": "
                     "{\"framework\": \"hf-trainer\", \"max_seq_length\": 512, \"adapter_config\": "
                     "{\"r\": 8, " + fields + "}}}");
}

const std::string kBase = "\"max_seq_length\": 512, \"per_device_train_batch_size\": 2";

// The Trainer's block of the config at `path` (setup.h HfTrainerOptions).
HfTrainerOptions LoadedTrainer(const std::string& path) {
  return HfTrainerOf(LoadSetup(path, {}).training);
}

TEST_CASE("hf-trainer: TrainingArguments names into the plain PyTorch loop", "[config][hf]") {
  const Setup s = LoadSetup(Config("hf1.json", kBase + ", \"gradient_accumulation_steps\": 4, "
                                                       "\"bf16\": true, \"gradient_checkpointing\""
                                                       ": true, \"max_steps\": 3"),
                            {});
  CHECK(StackOf(s.training).Traits().plain_pytorch_step);
  CHECK(s.training.framework == "hf-trainer");
  CHECK(s.training.micro_batch_size == 2);
  CHECK(s.training.seq_length == 512);
  // per_device_train_batch_size × gradient_accumulation_steps = 2 × 4 on one process.
  CHECK(s.training.global_batch_size == 8);
  CHECK(s.training.num_micro_batches == 4);
  CHECK(s.training.train_iters == 3);
  CHECK(s.training.precision == Precision::kBf16);     // autocast dtype
  CHECK(s.training.pytorch()->torch_dtype == Precision::kFp32);  // from_pretrained's default
  CHECK(s.training.recompute_granularity == RecomputeGranularity::kFull);
  CHECK(s.training.recompute_num_layers == 1);         // one checkpoint per decoder layer
  // optim default adamw_torch: torch.optim.AdamW, foreach on CUDA, decoupled decay.
  CHECK(s.training.optimizer == OptimizerKind::kAdam);
  CHECK(s.training.optimizer_impl == OptimizerImpl::kForeach);
  CHECK_FALSE(s.training.pytorch()->adam_coupled_weight_decay);
  CHECK(s.training.use_flash_attn);                    // attn_implementation sdpa
  CHECK(s.model.padded_vocab_size == 32001);           // no Megatron padding
}

TEST_CASE("hf-trainer: optim names", "[config][hf]") {
  auto load = [](const std::string& name, const std::string& optim) {
    return LoadSetup(Config(name, kBase + ", \"optim\": \"" + optim + "\""), {}).training;
  };
  CHECK(load("o1.json", "adamw_torch_fused").optimizer_impl == OptimizerImpl::kFused);
  const TrainingConfig sgd = load("o2.json", "sgd");
  CHECK(sgd.optimizer == OptimizerKind::kSgd);
  CHECK(sgd.sgd_momentum == 0.0);  // Trainer passes lr only: torch.optim.SGD momentum 0
  // Trainer.get_optimizer_cls_and_kwargs: transformers' Adafactor, one parameter at a time.
  const TrainingConfig ada = load("o3.json", "adafactor");
  CHECK(ada.optimizer == OptimizerKind::kAdafactor);
  CHECK(ada.optimizer_impl == OptimizerImpl::kFused);
  CHECK(IsUnsupported(Config("o4.json", kBase + ", \"optim\": \"adamw_apex_fused\"")));
}

// Trainer.get_optimizer_cls_and_kwargs (transformers v4.48.1): "paged" in the name -> is_paged,
// "8bit" -> optim_bits 8 (else 32); "adam" -> bitsandbytes AdamW (two states), "lion" / "rmsprop"
// -> Lion / RMSprop (one state).
TEST_CASE("hf-trainer: bitsandbytes optim names", "[config][hf]") {
  struct Row {
    const char* optim;
    int bits;
    bool paged;
    int states;
  };
  const Row rows[] = {
      {"adamw_bnb_8bit", 8, false, 2},   {"adamw_8bit", 8, false, 2},
      {"paged_adamw_8bit", 8, true, 2},  {"paged_adamw_32bit", 32, true, 2},
      {"lion_8bit", 8, false, 1},        {"lion_32bit", 32, false, 1},
      {"paged_lion_8bit", 8, true, 1},   {"paged_lion_32bit", 32, true, 1},
      {"rmsprop_bnb", 32, false, 1},     {"rmsprop_bnb_8bit", 8, false, 1},
      {"rmsprop_bnb_32bit", 32, false, 1},
  };
  int i = 0;
  for (const Row& r : rows) {
    INFO(r.optim);
    const TrainingConfig t = LoadSetup(
        Config("b" + std::to_string(i++) + ".json", kBase + ", \"optim\": \"" + r.optim + "\""),
        {}).training;
    const BnbOptimizer& b = HfTrainerOf(t).bnb_optimizer;
    CHECK(b.optim_bits == r.bits);
    CHECK(b.is_paged == r.paged);
    CHECK(b.states == r.states);
    CHECK(t.optimizer_impl == OptimizerImpl::kFused);  // in-place kernels, no foreach lists
  }
  CHECK(HfTrainerOf(LoadSetup(Config("b_torch.json", kBase), {}).training).bnb_optimizer.optim_bits ==
        0);
}

TEST_CASE("hf-trainer: torch_version decides zero_grad and softmax's saved input", "[config][hf]") {
  auto load = [](const std::string& name, const std::string& version) {
    return HfTrainerOf(
        LoadSetup(Config(name, kBase + ", \"torch_version\": \"" + version + "\""), {}).training);
  };
  // nn.Module.zero_grad(set_to_none) defaults to True from 2.0; _softmax's autograd formula
  // passes the input's dtype instead of the input from 1.11 (pytorch/pytorch#66018), so 1.10
  // and earlier save softmax's input.
  const HfTrainerOptions v110 = load("v1.json", "1.10");
  CHECK_FALSE(v110.zero_grad_set_to_none);
  CHECK(v110.softmax_saves_input);
  const HfTrainerOptions v111 = load("v2.json", "1.11");
  CHECK_FALSE(v111.zero_grad_set_to_none);
  CHECK_FALSE(v111.softmax_saves_input);
  const HfTrainerOptions v25 = load("v3.json", "2.5");
  CHECK(v25.zero_grad_set_to_none);
  CHECK_FALSE(v25.softmax_saves_input);
  const HfTrainerOptions absent = HfTrainerOf(LoadSetup(Config("v4.json", kBase), {}).training);
  CHECK(absent.zero_grad_set_to_none);
  CHECK_FALSE(absent.softmax_saves_input);
  CHECK(ErrorOf(Config("v5.json", kBase + ", \"torch_version\": \"2\""))
            .find("/training/torch_version: expected a version such as \"2.5\", got \"2\"") !=
        std::string::npos);
}

TEST_CASE("hf-trainer: transformers_version decides the loss's shifted-logits copy",
          "[config][hf]") {
  auto load = [](const std::string& name, const std::string& version) {
    return HfTrainerOf(
        LoadSetup(Config(name, kBase + ", \"transformers_version\": \"" + version + "\""), {})
            .training);
  };
  // ForCausalLMLoss copies `logits[..., :-1, :]` up to v4.48.x; 4.49 pads the labels instead
  // (huggingface/transformers#35646). A patch number is allowed.
  CHECK(load("t1.json", "4.36").loss_shift_copy);
  CHECK(load("t2.json", "4.48.1").loss_shift_copy);
  CHECK_FALSE(load("t3.json", "4.49").loss_shift_copy);
  CHECK_FALSE(load("t4.json", "5.0").loss_shift_copy);
  CHECK_FALSE(HfTrainerOf(LoadSetup(Config("t5.json", kBase), {}).training).loss_shift_copy);
  CHECK(ErrorOf(Config("t6.json", kBase + ", \"transformers_version\": \"latest\""))
            .find("/training/transformers_version: expected a version such as \"4.48\", got "
                  "\"latest\"") != std::string::npos);
}

TEST_CASE("hf-trainer: a key of another framework names the right one", "[config][hf]") {
  CHECK(ErrorOf(Config("f1.json", kBase + ", \"micro_batch_size\": 2")) ==
        Config("f1.json", kBase + ", \"micro_batch_size\": 2") +
            ": /training/micro_batch_size: not a framework \"hf-trainer\" key (it is a Megatron / "
            "\"pytorch\" training key); write per_device_train_batch_size");
  CHECK(ErrorOf(Config("f2.json", kBase + ", \"recompute_granularity\": \"full\""))
            .find("write gradient_checkpointing") != std::string::npos);
  CHECK(ErrorOf(Config("f3.json", "\"per_device_train_batch_size\": 2"))
            .find("/training/max_seq_length: missing key") != std::string::npos);
  CHECK(ErrorOf(Config("f4.json", kBase + ", \"fp16\": true, \"bf16\": true"))
            .find("/training/bf16: fp16 and bf16 are both true") != std::string::npos);
  CHECK(IsUnsupported(Config("f6.json", kBase + ", \"deepspeed\": {\"zero_optimization\": {\"stage\": 0}}")));
  const std::string view = Config("f7.json", kBase + ", \"gradient_as_bucket_view\": true");
  CHECK(ErrorOf(view) == view +
                             ": /training/gradient_as_bucket_view: not a framework \"hf-trainer\" "
                             "key (it is a Megatron / \"pytorch\" training key); write nothing "
                             "(the Trainer leaves DistributedDataParallel's gradient_as_bucket_view "
                             "at False: accelerate's DistributedDataParallelKwargs default)");
  CHECK(ErrorOf(Config("f8.json", kBase + ", \"bucket_cap_mb\": 50"))
            .find("write ddp_bucket_cap_mb") != std::string::npos);
}

TEST_CASE("hf-trainer: world_size > 1 is PyTorch DistributedDataParallel", "[config][hf][ddp]") {
  // Trainer._wrap_model: find_unused_parameters = not model.is_gradient_checkpointing;
  // ddp_bucket_cap_mb passed when set; gradient_as_bucket_view never passed (False).
  Setup s = LoadSetup(Config("w1.json", kBase + ", \"world_size\": 8, "
                                              "\"gradient_accumulation_steps\": 4, "
                                              "\"gradient_checkpointing\": true"),
                      {});
  CHECK(s.training.data_parallel_size == 8);
  // per_device_train_batch_size × gradient_accumulation_steps × world_size = 2 × 4 × 8.
  CHECK(s.training.global_batch_size == 64);
  CHECK(s.training.num_micro_batches == 4);
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{TorchDdp{true, 0, false, false}});
  s = LoadSetup(Config("w2.json", kBase + ", \"world_size\": 2, \"ddp_bucket_cap_mb\": 100"), {});
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{TorchDdp{true, 100, true, false}});
  // 25 is accelerate's default: to_kwargs drops it, DDP keeps its 1 MiB first bucket.
  s = LoadSetup(Config("w3.json", kBase + ", \"world_size\": 2, \"ddp_bucket_cap_mb\": 25, "
                                          "\"ddp_find_unused_parameters\": false"),
                {});
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{TorchDdp{true, 0, false, false}});
  // One process: no wrapper, the DDP keys noted.
  s = LoadSetup(Config("w4.json", kBase + ", \"ddp_bucket_cap_mb\": 100"), {});
  CHECK(DataParallelOf(s.training) == DataParallelWrapper{SingleDevice{true}});
}

// bert-large-uncased with BertForSequenceClassification and 2 labels (the hf-bert-* validation
// cases' model). model.num_parameters(), from modeling_bert.py's modules:
//   embeddings: word 30522·1024 = 31,254,528 + position 512·1024 = 524,288 + token type 2·1024
//     = 2,048 + LayerNorm 2·1024 = 2,048 -> 31,782,912
//   per layer: query, key, value, attention output dense 4·(1024² + 1024) = 4,198,400;
//     2 LayerNorms 4·1024 = 4,096; intermediate 1024·4096 + 4096 = 4,198,400; output
//     4096·1024 + 1024 = 4,195,328 -> 12,596,224; 24 layers -> 302,309,376
//   pooler 1024² + 1024 = 1,049,600; classifier 2·1024 + 2 = 2,050
//   total 31,782,912 + 302,309,376 + 1,049,600 + 2,050 = 335,143,938
TEST_CASE("hf-trainer: BERT-large classification parameter count", "[config][hf]") {
  const std::string model = Write(
      "bert.json",
      "{\"architectures\": [\"BertForSequenceClassification\"], \"model_type\": \"bert\", "
      "\"hidden_size\": 1024, \"intermediate_size\": 4096, \"num_attention_heads\": 16, "
      "\"num_hidden_layers\": 24, \"vocab_size\": 30522, \"max_position_embeddings\": 512, "
      "\"type_vocab_size\": 2, \"hidden_act\": \"gelu\"}");
  const Setup s = LoadSetup(Write("b1.json", "{\"model\": \"bert.json\", \"device\": "
                                             "\"v100-16g\", \"training\": {\"framework\": "
                                             "\"hf-trainer\", " + kBase + "}}"),
                            {});
  CHECK(s.model.sequence_classification);
  CHECK(s.model.num_labels == 2);
  CHECK(workload::ComputeStaticSizes(s, 0).parameter_count == 335143938);
  (void)model;
  // Under framework megatron an encoder is refused.
  CHECK(IsUnsupported(Write("b2.json", "{\"model\": \"bert.json\", \"device\": \"v100-16g\", "
                                       "\"training\": {\"seq_length\": 512}}")));
}

TEST_CASE("hf-trainer: unknown model_type names the closest known ones", "[config][hf]") {
  const std::string path = Write(
      "u1.json", "{\"model\": {\"model_type\": \"bart\"}, \"device\": \"v100-16g\", "
                 "\"training\": {\"framework\": \"hf-trainer\", " + kBase + "}}");
  CHECK(ErrorOf(path).find("unknown model_type \"bart\"") != std::string::npos);
  CHECK(ErrorOf(path).find("did you mean 'bert'?") != std::string::npos);
}

// Meta-Llama-3-8B (the shipped models/llama3-8b.json) with a LoRA adapter.
// model.num_parameters() of LlamaForCausalLM, from modeling_llama.py's modules:
//   embed_tokens 128256·4096 = 525,336,576; lm_head the same (untied)
//   per layer: q_proj 4096·4096 = 16,777,216; k_proj, v_proj 1024·4096 = 4,194,304 each;
//     o_proj 16,777,216; gate_proj, up_proj, down_proj 14336·4096 = 58,720,256 each; two
//     RMSNorms 2·4096 = 8,192 -> 218,112,000; 32 layers -> 6,979,584,000
//   final norm 4,096
//   total 525,336,576 · 2 + 6,979,584,000 + 4,096 = 8,030,261,248
// LoRA r = 8 on q_proj, v_proj (peft tuners/lora/layer.py update_layer: lora_A [r, in],
// lora_B [out, r]): per layer q 8·4096 + 4096·8 = 65,536, v 8·4096 + 1024·8 = 40,960;
// 32 × (65,536 + 40,960) = 3,407,872 trainable = 32 × 8 × ((4096 + 4096) + (4096 + 1024)), and
// print_trainable_parameters' "all params" 8,030,261,248 + 3,407,872 = 8,033,669,120.
std::string Llama8b(const std::string& name, const std::string& extra) {
  return Write(name, "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", \"training\": "
                     "{\"framework\": \"hf-trainer\", \"max_seq_length\": 512, "
                     "\"per_device_train_batch_size\": 1, \"bf16\": true, \"torch_dtype\": "
                     "\"bfloat16\", \"adapter_config\": {\"peft_type\": \"LORA\", \"r\": 8, "
                     "\"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"]}" +
                         extra + "}}");
}

TEST_CASE("hf-trainer: LoRA parameter counts (print_trainable_parameters)", "[config][hf]") {
  const Setup s = LoadSetup(Llama8b("l1.json", ""), {});
  CHECK(s.training.hf_trainer()->lora_r == 8);
  const workload::StaticSizes z = workload::ComputeStaticSizes(s, 0);
  CHECK(z.parameter_count == 8033669120);
  CHECK(z.trainable_parameter_count == 3407872);
  // Adapters in fp32 (get_peft_model autocast_adapter_dtype=True on a bf16 model): grads
  // 3,407,872 · 4 = 13,631,488 B, AdamW state twice that; the frozen base has neither.
  CHECK(z.gradient_bytes == 13631488);
  CHECK(z.optimizer_state_bytes == 2 * 13631488);
  // Weights: bf16 base 8,030,261,248 · 2 = 16,060,522,496 + fp32 adapters 13,631,488.
  CHECK(z.parameter_bytes == 16060522496 + 13631488);
}

// QLoRA: the decoder layers' linear weights in 4-bit NF4 with double quantisation
// (bitsandbytes functional.py quantize_4bit, blocksize 64; compress_statistics quantises the
// fp32 absmax per 256 blocks). Per layer the linear weights hold 218,112,000 - 8,192 =
// 218,103,808 values: packed 109,051,904 B; 3,407,872 blocks -> uint8 absmax 3,407,872 B;
// 13,312 second-level blocks -> fp32 absmax 53,248 B; 112,513,024 B a layer, 32 layers
// 3,600,416,768 B. The rest, 525,336,576 · 2 + 32 · 8,192 + 4,096 = 1,050,939,392 values, is
// what peft's prepare_model_for_kbit_training casts to fp32 (on by default with 4-bit weights):
// 4,203,757,568 B; without it bf16, 2,101,878,784 B. The adapters 13,631,488 B.
// TRL's peft_module_casting_to_bf16 (kbit_modules_recast embed_tokens, lm_head) leaves the norms
// fp32, (32 · 8,192 + 4,096) · 4 = 1,064,960 B, and the two embeddings bf16,
// 2 · 525,336,576 · 2 = 2,101,346,304 B: 2,102,411,264 B.
std::string Qlora8b(const std::string& name, const std::string& extra) {
  return Llama8b(name, ", \"quantization_config\": {\"load_in_4bit\": true, "
                       "\"bnb_4bit_quant_type\": \"nf4\", \"bnb_4bit_use_double_quant\": true, "
                       "\"bnb_4bit_compute_dtype\": \"bfloat16\"}" + extra);
}

TEST_CASE("hf-trainer: QLoRA 4-bit weights and their quantisation state", "[config][hf]") {
  const Setup s = LoadSetup(Qlora8b("q1.json", ""), {});
  CHECK(s.training.hf_trainer()->load_in_4bit);
  CHECK(s.training.hf_trainer()->kbit_prepared);
  const workload::StaticSizes z = workload::ComputeStaticSizes(s, 0);
  CHECK(z.parameter_count == 8033669120);  // PEFT counts a 4-bit weight's full numel
  CHECK(z.trainable_parameter_count == 3407872);
  CHECK(z.parameter_bytes == 3600416768 + 4203757568 + 13631488);
  const Setup off =
      LoadSetup(Qlora8b("q1b.json", ", \"prepare_model_for_kbit_training\": false"), {});
  CHECK_FALSE(off.training.hf_trainer()->kbit_prepared);
  CHECK(workload::ComputeStaticSizes(off, 0).parameter_bytes == 3600416768 + 2101878784 + 13631488);
  const Setup trl = LoadSetup(
      Qlora8b("q1c.json", ", \"kbit_modules_recast\": [\"embed_tokens\", \"lm_head\"]"), {});
  CHECK(workload::ComputeStaticSizes(trl, 0).parameter_bytes == 3600416768 + 2102411264 + 13631488);
}

TEST_CASE("hf-trainer: prepare_model_for_kbit_training keys, their errors and warnings",
          "[config][hf]") {
  CHECK(ErrorOf(Qlora8b("q1d.json", ", \"kbit_modules_recast\": [\"norms\"]"))
            .find("/training/kbit_modules_recast: \"norms\": expected \"norm\", \"embed_tokens\" "
                  "or \"lm_head\"") != std::string::npos);
  // Without quantised weights peft would cast the whole model: not modelled, a warning.
  const Setup plain = LoadSetup(Llama8b("q1e.json", ", \"prepare_model_for_kbit_training\": true"), {});
  CHECK_FALSE(plain.training.hf_trainer()->kbit_prepared);
  bool warned = false;
  for (const std::string& w : plain.warnings) {
    warned = warned || w.find("/training/prepare_model_for_kbit_training: without load_in_4bit") !=
                           std::string::npos;
  }
  CHECK(warned);
  // Another framework's block refuses the keys, naming them.
  CHECK(ErrorOf(Write("q1f.json", "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", "
                                  "\"training\": {\"framework\": \"pytorch\", \"seq_length\": 512, "
                                  "\"kbit_modules_recast\": [\"norm\"]}}"))
            .find("/training/kbit_modules_recast: a framework \"hf-trainer\" key") != std::string::npos);
}

// LLM.int8 (load_in_8bit): the same linears in int8 with fp32 row scales (Int8Params: CB and
// SCB). Per layer 218,103,808 int8 values and rows q 4096 + k 1024 + v 1024 + o 4096 + gate
// 14336 + up 14336 + down 4096 = 43,008, SCB 172,032 B: 218,275,840 B a layer, 32 layers
// 6,984,826,880 B; the rest as under QLoRA (fp32 after prepare_model_for_kbit_training,
// 4,203,757,568 B).
// bnb_4bit_quant_storage bfloat16 packs the same values into bf16 elements: the same bytes.
// llm_int8_skip_modules ["lm_head", "mlp"] keeps gate/up/down_proj out of bitsandbytes, which
// prepare_model_for_kbit_training then casts to fp32: per layer 3 · 58,720,256 · 4 =
// 704,643,072 B, and the attention's 41,943,040 values in NF4 with double quantisation:
// 20,971,520 packed + 655,360 uint8 absmax + 2,560 · 4 = 21,637,120 B.
TEST_CASE("hf-trainer: 8-bit weights, the 4-bit storage dtype and the modules kept in 16 bits",
          "[config][hf]") {
  const Setup s8 = LoadSetup(
      Llama8b("q8.json", ", \"quantization_config\": {\"load_in_8bit\": true}"), {});
  CHECK(s8.training.hf_trainer()->load_in_8bit);
  CHECK(workload::ComputeStaticSizes(s8, 0).parameter_bytes ==
        6984826880 + 4203757568 + 13631488);
  const std::string nf4 = "\"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"nf4\", "
                          "\"bnb_4bit_use_double_quant\": true";
  const Setup bf = LoadSetup(
      Llama8b("q9.json", ", \"quantization_config\": {" + nf4 +
                             ", \"bnb_4bit_quant_storage\": \"bfloat16\"}"),
      {});
  CHECK(bf.training.hf_trainer()->bnb_4bit_quant_storage_bytes == 2);
  CHECK(workload::ComputeStaticSizes(bf, 0).parameter_bytes == 3600416768 + 4203757568 + 13631488);
  const Setup skip = LoadSetup(
      Llama8b("q10.json", ", \"quantization_config\": {" + nf4 +
                              ", \"llm_int8_skip_modules\": [\"lm_head\", \"mlp\"]}"),
      {});
  CHECK(workload::ComputeStaticSizes(skip, 0).parameter_bytes ==
        32 * (Bytes{704643072} + 21637120) + 4203757568 + 13631488);
  CHECK(ErrorOf(Llama8b("q11.json", ", \"quantization_config\": {\"load_in_8bit\": true, "
                                    "\"load_in_4bit\": true}"))
            .find("/training/quantization_config/load_in_8bit: true with load_in_4bit true") !=
        std::string::npos);
  CHECK(IsUnsupported(Llama8b("q12.json", ", \"quantization_config\": {\"load_in_8bit\": true, "
                                          "\"llm_int8_has_fp16_weight\": true}")));
}

TEST_CASE("hf-trainer: adapter_config errors", "[config][hf]") {
  const std::string bad = Write(
      "a1.json", "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"max_seq_length\": 512, \"adapter_config\": "
                 "{\"r\": 8, \"target_modules\": [\"q_prj\"]}}}");
  CHECK(ErrorOf(bad).find("/training/adapter_config/target_modules: 'q_prj' is not a linear of a "
                          "llama-family decoder layer") != std::string::npos);
  CHECK(ErrorOf(bad).find("did you mean 'q_proj'?") != std::string::npos);
  CHECK(IsUnsupported(Write(
      "a2.json", "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"max_seq_length\": 512, \"adapter_config\": "
                 "{\"r\": 8, \"target_modules\": \"all-linear\", \"use_dora\": true}}}")));
}

// PEFT's save_pretrained writes a folder holding adapter_config.json (peft/config.py
// PeftConfigMixin.from_pretrained reads os.path.join(path, CONFIG_NAME)): the folder is read as
// that file; a folder without it, or a path that is not there, says why it cannot be read.
TEST_CASE("hf-trainer: adapter_config naming a folder reads its adapter_config.json",
          "[config][hf]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("memsim_hf_trainer_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "saved_adapter");
  std::filesystem::create_directories(dir / "empty_adapter");
  Write("saved_adapter/adapter_config.json",
        "{\"peft_type\": \"LORA\", \"r\": 8, \"target_modules\": [\"q_proj\"]}");
  const auto config = [](const std::string& name, const std::string& ref) {
    return Write(name, "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", \"training\": "
                       "{\"framework\": \"hf-trainer\", \"max_seq_length\": 512, "
                       "\"adapter_config\": \"" + ref + "\"}}");
  };
  CHECK(HfTrainerOf(LoadSetup(config("ad1.json", "saved_adapter"), {}).training).lora_r == 8);
  const std::string empty = config("ad2.json", "empty_adapter");
  CHECK(ErrorOf(empty) == empty + ": /training/adapter_config: cannot read the "
                                  "adapter_config.json: '" + (dir / "empty_adapter").string() +
                                  "' is a directory and its adapter_config.json cannot be read: "
                                  "No such file or directory");
  const std::string missing = config("ad3.json", "no_such_adapter.json");
  CHECK(ErrorOf(missing) == missing + ": /training/adapter_config: cannot read the "
                                      "adapter_config.json '" +
                                      (dir / "no_such_adapter.json").string() +
                                      "': No such file or directory");
}

// The whole run builds and simulates (no check of the numbers here; see the decoder-layer test).
TEST_CASE("hf-trainer: a LoRA run builds", "[config][hf]") {
  const Setup s = LoadSetup(Llama8b("r1.json", ", \"max_steps\": 2, \"gradient_checkpointing\": true"), {});
  CHECK_NOTHROW(workload::Build(s, 0));
}

// A TrainingArguments JSON as trainer.args.to_json_string() prints it (a few of its fields, one
// this memsim does not know) and an adapter_config.json, both referenced by path.
TEST_CASE("hf-trainer keys in a megatron / pytorch block name the key to write", "[config][hf]") {
  const auto block = [](const std::string& name, const std::string& training) {
    return Write(name, "{\"model\": \"llama3.2-1b\", \"device\": \"a100-80g\", \"training\": "
                       "{\"seq_length\": 512, " + training + "}}");
  };
  const std::string batch = block("r1.json", "\"framework\": \"pytorch\", "
                                             "\"per_device_train_batch_size\": 2");
  CHECK(ErrorOf(batch) == batch + ": /training/per_device_train_batch_size: a framework "
                                  "\"hf-trainer\" key (TrainingArguments or memsim's own), not "
                                  "one of framework \"pytorch\"; write micro_batch_size");
  const std::string ddp = block("r2.json", "\"framework\": \"pytorch\", \"ddp_bucket_cap_mb\": 50");
  CHECK(ErrorOf(ddp) == ddp + ": /training/ddp_bucket_cap_mb: a framework \"hf-trainer\" key "
                              "(TrainingArguments or memsim's own), not one of framework "
                              "\"pytorch\"; write bucket_cap_mb (framework \"pytorch\")");
  // No framework: Megatron's block.
  const std::string eval = block("r3.json", "\"eval_strategy\": \"steps\"");
  CHECK(ErrorOf(eval) == eval + ": /training/eval_strategy: a framework \"hf-trainer\" key "
                                "(TrainingArguments or memsim's own), not one of framework "
                                "\"megatron\"; the evaluation pass is modelled with framework "
                                "\"hf-trainer\" only");
  const std::string lora = block("r4.json", "\"adapter_config\": {\"r\": 8}");
  CHECK(ErrorOf(lora).ends_with("/training/adapter_config: a framework \"hf-trainer\" key "
                                "(TrainingArguments or memsim's own), not one of framework "
                                "\"megatron\"; LoRA / QLoRA are modelled with framework "
                                "\"hf-trainer\" only"));
}

TEST_CASE("hf-trainer: training_args and adapter_config files", "[config][hf]") {
  Write("args.json", "{\"output_dir\": \"out\", \"per_device_train_batch_size\": 4, "
                     "\"gradient_accumulation_steps\": 2, \"bf16\": true, \"optim\": "
                     "\"adamw_torch_fused\", \"max_steps\": 5, \"learning_rate\": 2e-05, "
                     "\"some_future_field\": 1}");
  Write("adapter.json", "{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 32, "
                        "\"target_modules\": [\"q_proj\", \"k_proj\"], \"task_type\": "
                        "\"CAUSAL_LM\", \"base_model_name_or_path\": \"x\"}");
  const std::string path = Write(
      "t1.json", "{\"model\": \"llama3-8b\", \"device\": \"l40s-48g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"training_args\": \"args.json\", "
                 "\"max_seq_length\": 256, \"torch_dtype\": \"bfloat16\", "
                 "\"adapter_config\": \"adapter.json\"}}");
  const Setup s = LoadSetup(path, {});
  CHECK(s.training.micro_batch_size == 4);
  CHECK(s.training.num_micro_batches == 2);
  CHECK(s.training.train_iters == 5);
  CHECK(s.training.optimizer_impl == OptimizerImpl::kFused);
  CHECK(s.training.hf_trainer()->lora_r == 16);
  CHECK(std::any_of(s.warnings.begin(), s.warnings.end(), [](const std::string& w) {
    return w.find("args.json: TrainingArguments fields memsim does not know, ignored: "
                  "some_future_field") != std::string::npos;
  }));
  // A TrainingArguments field inline next to training_args is refused (the file holds them).
  const std::string both = Write(
      "t2.json", "{\"model\": \"llama3-8b\", \"device\": \"l40s-48g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"training_args\": \"args.json\", "
                 "\"max_seq_length\": 256, \"fp16\": true}}");
  CHECK(ErrorOf(both) == both + ": /training/fp16: a TrainingArguments field: with training_args "
                                "it is read from args.json (set it there)");
  // LoRA r = 16 on q_proj and k_proj: 32 × 16 × ((4096 + 4096) + (4096 + 1024)) = 6,815,744.
  CHECK(workload::ComputeStaticSizes(s, 0).trainable_parameter_count == 6815744);
}

// tryout8 #2: a whole trainer.args.to_json_string() holds dozens of fields memsim does not read,
// nearly all at their TrainingArguments default (transformers/training_args.py). Those at an
// unset value are a --verbose note; the ones that change memory warn each when set; the
// torch.compile switches are unsupported like torch_compile itself; adafactor true contradicting
// optim is an error (TrainingArguments.__post_init__ turns it into optim "adafactor").
TEST_CASE("hf-trainer: a full to_json_string() warns only about fields set that matter",
          "[config][hf]") {
  const auto config = [](const std::string& name, const std::string& args_fields) {
    Write(name + "-args.json", "{\"output_dir\": \"out\", \"per_device_train_batch_size\": 1, "
                               "\"max_steps\": 2, \"bf16\": true" + args_fields + "}");
    return Write(name + ".json",
                 "{\"model\": \"llama3-8b\", \"device\": \"l40s-48g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"training_args\": \"" + name +
                     "-args.json\", \"max_seq_length\": 256, \"torch_dtype\": \"bfloat16\"}}");
  };
  const auto any = [](const std::vector<std::string>& lines, const std::string& text) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  };
  // Defaults as to_json_string() writes them, and one field memsim does not know.
  const Setup quiet = LoadSetup(
      config("u1", ", \"torch_empty_cache_steps\": null, \"auto_find_batch_size\": false, "
                   "\"use_liger_kernel\": false, \"half_precision_backend\": \"auto\", "
                   "\"hub_token\": \"<HUB_TOKEN>\", \"fsdp_config\": {\"xla\": false}, "
                   "\"torch_compile\": false, \"torch_compile_backend\": null, "
                   "\"accelerator_config\": {\"split_batches\": false}, "
                   "\"per_gpu_train_batch_size\": null, \"adafactor\": false, "
                   "\"some_future_field\": null, \"another_future_field\": 3"),
      {});
  std::string joined;
  for (const std::string& w : quiet.warnings) joined += w + "\n";
  INFO(joined);
  CHECK(quiet.warnings.size() == 1);
  CHECK(any(quiet.warnings, "TrainingArguments fields memsim does not know, ignored: "
                            "another_future_field"));
  CHECK(any(quiet.notes, "at an unset value (null, false or empty), ignored: "
                         "per_gpu_train_batch_size, some_future_field"));
  // Set: a warning each, naming the value and what it changes.
  const Setup loud = LoadSetup(
      config("u2", ", \"torch_empty_cache_steps\": 1, \"auto_find_batch_size\": true, "
                   "\"half_precision_backend\": \"apex\", "
                   "\"accelerator_config\": {\"split_batches\": true}"),
      {});
  CHECK(any(loud.warnings, "u2-args.json: /torch_empty_cache_steps: 1: not modelled "
                           "(Trainer.training_step calls torch.cuda.empty_cache()"));
  CHECK(any(loud.warnings, "/auto_find_batch_size: true: not modelled"));
  CHECK(any(loud.warnings, "/half_precision_backend: \"apex\": not modelled"));
  CHECK(any(loud.warnings, "/accelerator_config/split_batches: true: not modelled"));
  CHECK(IsUnsupported(config("u3", ", \"torch_compile_backend\": \"inductor\"")));
  CHECK(ErrorOf(config("u4", ", \"adafactor\": true")).find(
            "u4-args.json: /adafactor: true makes the Trainer use optim \"adafactor\"") !=
        std::string::npos);
  CHECK_NOTHROW(LoadSetup(config("u5", ", \"adafactor\": true, \"optim\": \"adafactor\""), {}));
}

TEST_CASE("hf-trainer: bad values name the TrainingArguments field written", "[config][hf]") {
  // memsim's limits (docs/config.md "Limits"): 2^16 = 65536 micro-batches a step, 2^26 tokens a
  // micro-batch, the global batch in an int (2^31 - 1), 2^21 layer passes.
  const std::string ga = Config("b1.json", kBase + ", \"gradient_accumulation_steps\": 100000");
  CHECK(ErrorOf(ga) == ga + ": /training/gradient_accumulation_steps: 100000 micro-batches per "
                            "step exceed memsim's limit of 65536");
  // 2 × 65536 × 65536 = 8589934592 samples: beyond an int (it wrapped before).
  const std::string world =
      Config("b2.json", kBase + ", \"gradient_accumulation_steps\": 65536, \"world_size\": 65536");
  CHECK(ErrorOf(world) ==
        world + ": /training/world_size: the global batch per_device_train_batch_size × "
                "gradient_accumulation_steps × world_size = 2 × 65536 × 65536 = 8589934592 "
                "samples exceeds memsim's limit of 2147483647");
  // per_device_train_batch_size has a limit of its own, 2^16 = 65536, as micro_batch_size has.
  const std::string batch = Config("b3.json", "\"max_seq_length\": 512, "
                                              "\"per_device_train_batch_size\": 131073");
  CHECK(ErrorOf(batch) == batch + ": /training/per_device_train_batch_size: 131073 exceeds "
                                  "memsim's limit of 65536");
  // 65536 × 1025 = 67174400 tokens, 65536 above 2^26 = 67108864. The batch is at its own limit
  // (65536 / 2^16 = 1) and the length far from its (1025 / 2^26): named at the batch.
  const std::string tokens = Config("b3b.json", "\"max_seq_length\": 1025, "
                                                "\"per_device_train_batch_size\": 65536");
  CHECK(ErrorOf(tokens) == tokens + ": /training/per_device_train_batch_size: "
                                    "per_device_train_batch_size × max_seq_length = 65536 × 1025 "
                                    "= 67174400 tokens exceed memsim's limit of 67108864 (with "
                                    "max_seq_length at " + tokens + ": /training/max_seq_length)");
  const std::string eval = kBase + ", \"max_steps\": 4, \"eval_strategy\": \"steps\", "
                                   "\"eval_steps\": 1";
  // 2^16 × 512 = 2^25 evaluation tokens pass; 2^16 + 1 is over the key's own limit.
  const std::string eval_batch =
      Config("b4.json", eval + ", \"eval_batches\": 1, \"per_device_eval_batch_size\": 65537");
  CHECK(ErrorOf(eval_batch) == eval_batch + ": /training/per_device_eval_batch_size: 65537 "
                                            "exceeds memsim's limit of 65536");
  // Evaluations after steps 1..4 of 1000000 no-grad forward passes of the 2 layers: 8000000
  // passes, with 4 steps × 1 micro-batch × 2 layers = 8 of training (it used to run for hours).
  const std::string batches = Config("b5.json", eval + ", \"eval_batches\": 1000000");
  CHECK(ErrorOf(batches) == batches + ": /training/eval_batches: evaluations × eval_batches × "
                                      "num_hidden_layers = 4 × 1000000 × 2 = 8000000 forward "
                                      "passes, with the 8 layer passes of training, exceed "
                                      "memsim's limit of 2097152; reduce eval_batches or raise "
                                      "eval_steps");
  // Both names of the strategy, disagreeing: one would be dropped silently.
  const std::string names = Config("b6.json", kBase + ", \"eval_strategy\": \"no\", "
                                                      "\"evaluation_strategy\": \"steps\"");
  CHECK(ErrorOf(names) == names + ": /training/evaluation_strategy: \"steps\" conflicts with "
                                  "eval_strategy \"no\" (evaluation_strategy is its old name; "
                                  "write one of them)");
  CHECK(LoadedTrainer(Config("b7.json", eval + ", \"evaluation_strategy\": \"steps\", "
                                               "\"eval_batches\": 1"))
            .eval_steps == 1);
  // LoRA rank: memsim's limit 2^16; unknown adapter keys are named at the adapter's object.
  const std::string rank = Config("b10.json", kBase + ", \"adapter_config\": {\"r\": 65537, "
                                                      "\"target_modules\": [\"q_proj\"]}");
  CHECK(ErrorOf(rank) == rank + ": /training/adapter_config/r: expected an integer from 1 to "
                                "65536, got 65537");
  const std::string extra = Config("b11.json", kBase + ", \"adapter_config\": {\"foo\": 1, "
                                                       "\"target_modules\": [\"q_proj\"]}");
  CHECK(LoadSetup(extra, {}).warnings ==
        std::vector<std::string>{extra + ": /training/adapter_config: adapter_config keys memsim "
                                         "does not know, ignored: foo"});
  // The fp16 report names training.skipped_iterations: the Trainer's block reads it too
  // (GradScaler.step skips the step), with fp16 only.
  CHECK(LoadSetup(Config("b8.json", kBase + ", \"fp16\": true, \"skipped_iterations\": 1"), {})
            .training.skipped_iterations == 1);
  const std::string bf16 = Config("b9.json", kBase + ", \"bf16\": true, \"skipped_iterations\": 1");
  CHECK(ErrorOf(bf16) == bf16 + ": /training/skipped_iterations: 1 needs precision \"fp16\" (only "
                                "the fp16 loss scaler skips steps)");
}

// The cross-field rules (rules.h) read the Megatron fields the block is read into; their
// messages name the key the config wrote, and where (hf_trainer.cc kAliases).
TEST_CASE("hf-trainer: limit messages name the TrainingArguments key written", "[config][hf]") {
  // 20 steps × 65536 micro-batches × 2 layers = 2621440 layer passes, above 2^21 = 2097152
  // (20 steps are all simulated: below the long-run bound, config/iterations.h).
  const std::string training = "\"max_seq_length\": 8, \"per_device_train_batch_size\": 1, "
                               "\"gradient_accumulation_steps\": 65536, \"max_steps\": 20";
  const std::string passes = Config("k1.json", training);
  CHECK(ErrorOf(passes) ==
        passes + ": /training/max_steps: max_steps × micro-batches per iteration × "
                 "num_hidden_layers = 20 × 65536 × 2 = 2621440 layer passes exceed memsim's limit "
                 "of 2097152; reduce max_steps, gradient_accumulation_steps (micro-batches) or "
                 "num_hidden_layers");
  // The same from a training_args file: named at the file's field.
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("memsim_hf_trainer_test-" + std::to_string(::getpid())))
                              .string();
  Write("k2-args.json", "{\"per_device_train_batch_size\": 1, \"gradient_accumulation_steps\": "
                        "65536, \"max_steps\": 20}");
  const std::string in_file = Write(
      "k2.json", "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, "
                 "\"intermediate_size\": 688, \"num_attention_heads\": 32, \"num_key_value_heads\": "
                 "8, \"num_hidden_layers\": 2, \"vocab_size\": 32001}, \"device\": \"a100-80g\", "
                 "\"training\": {\"framework\": \"hf-trainer\", \"training_args\": "
                 "\"k2-args.json\", \"max_seq_length\": 8}}");
  CHECK(ErrorOf(in_file).starts_with(dir + "/k2-args.json: /max_steps: max_steps × micro-batches"));
  // BERT's learned positions: 512 (models/bert-large-uncased.json max_position_embeddings).
  const std::string bert = Write(
      "k3.json", "{\"model\": \"bert-large-uncased\", \"device\": \"a100-80g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"max_seq_length\": 1024}}");
  const std::string err = ErrorOf(bert);
  CHECK(err.starts_with(bert + ": /training/max_seq_length: 1024 exceeds max_position_embeddings "
                               "512 (learned absolute position embeddings: "
                               "max_position_embeddings at "));
  CHECK(err.ends_with("bert-large-uncased.json: /max_position_embeddings)"));
  // One activation over 2^50 bytes: the logits of 64 × 2^20 = 2^26 tokens × vocab 2^26, 4 bytes
  // each: 2^54 = 1.8e+16 bytes (eager attention's scores, 2^26 × 32 heads × 2^20, are half).
  const std::string wide = Write(
      "k4.json", "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, "
                 "\"intermediate_size\": 688, \"num_attention_heads\": 32, \"num_key_value_heads\": "
                 "8, \"num_hidden_layers\": 2, \"vocab_size\": 67108864}, \"device\": \"a100-80g\", "
                 "\"training\": {\"framework\": \"hf-trainer\", \"max_seq_length\": 1048576, "
                 "\"per_device_train_batch_size\": 64, \"attn_implementation\": \"eager\"}}");
  CHECK(ErrorOf(wide) ==
        wide + ": /training/max_seq_length: model too large for memsim: one activation of a "
               "micro-batch would take about 1.8e+16 bytes, over memsim's limit of 2^50 bytes "
               "(1 PiB); reduce max_seq_length, per_device_train_batch_size or the model's width, "
               "or set attn_implementation to \"sdpa\" or \"flash_attention_2\"");
}

// --iterations N sets the steps under the block's own name: max_steps for hf-trainer.
TEST_CASE("hf-trainer: --iterations sets max_steps", "[config][hf]") {
  LoadOptions three;
  three.iterations = 3;
  CHECK(LoadSetup(Config("i1.json", kBase + ", \"max_steps\": 10"), three).training.train_iters == 3);
  // With a training_args file the command line still wins over the file's max_steps (10), as
  // --set wins over a config; a value it sets is named by its flag in messages.
  Write("i2-args.json", "{\"per_device_train_batch_size\": 1, \"max_steps\": 10}");
  const std::string with_file = Write(
      "i2.json", "{\"model\": \"llama3.2-1b\", \"device\": \"a100-80g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"training_args\": \"i2-args.json\", "
                 "\"max_seq_length\": 8}}");
  CHECK(LoadSetup(with_file, three).training.train_iters == 3);
  CHECK(LoadSetup(with_file, {}).training.train_iters == 10);
  LoadOptions set_batch;
  set_batch.overrides = {"training.per_device_train_batch_size=2"};
  CHECK(LoadSetup(with_file, set_batch).training.micro_batch_size == 2);
  set_batch.overrides = {"training.per_device_train_batch_size=0"};
  CHECK(ErrorOf(with_file, set_batch).rfind("--set training.per_device_train_batch_size=0", 0) == 0);
  // The reproducing config (run --json's input_config) writes the TrainingArguments JSON inline
  // with the command line's max_steps in it, and reads back to the same steps and batch.
  const Setup from_cli = LoadSetup(with_file, three);
  const std::string again = Write("i3.json", from_cli.reproducing_config);
  const Setup reread = LoadSetup(again, {});
  CHECK(reread.training.train_iters == 3);
  CHECK(reread.training.micro_batch_size == 1);
  CHECK(from_cli.reproducing_config.find("i2-args.json") == std::string::npos);
}

// target_modules as PEFT reads it (peft/tuners/tuners_utils.py check_target_module_exists): a
// string other than "all-linear" is a regular expression matched with re.fullmatch against each
// module's full name (model.layers.<i>.self_attn.q_proj, ...); a list names modules by suffix.
TEST_CASE("hf-trainer: target_modules as a regular expression", "[config][hf][peft]") {
  const auto targets = LlamaAdapter;
  const auto modules = [](const std::string& path) {
    return LoadedTrainer(path).lora_target_modules;
  };
  using Names = std::vector<std::string>;
  CHECK(modules(targets("p1.json", R"("target_modules": ".*\\.self_attn\\.(q|v)_proj")")) ==
        Names{"q_proj", "v_proj"});
  CHECK(modules(targets("p2.json", R"("target_modules": ".*_proj")")) ==
        Names{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  // "all-linear" in any case is PEFT's shorthand (_maybe_include_all_linear_layers: .lower()).
  CHECK(modules(targets("p3.json", R"("target_modules": "ALL-LINEAR")")).size() == 7);
  // A full match: "q_proj" alone is no module's full name.
  const std::string none = targets("p4.json", R"("target_modules": "q_proj")");
  CHECK(ErrorOf(none) == none + ": /training/adapter_config/target_modules: matches no module of "
                                "the model (PEFT: target modules not found in the base model); "
                                "module names look like model.layers.0.self_attn.q_proj");
  const std::string invalid = targets("p5.json", R"("target_modules": "(q_proj")");
  CHECK(ErrorOf(invalid).starts_with(invalid + ": /training/adapter_config/target_modules: "
                                               "\"(q_proj\" is not a valid regular expression ("));
  // A norm is not a linear: PEFT refuses to adapt it.
  const std::string norm = targets("p6.json", R"("target_modules": ".*layernorm")");
  CHECK(ErrorOf(norm) == norm + ": /training/adapter_config/target_modules: matches "
                                "'model.layers.0.input_layernorm', which is not a linear layer "
                                "(PEFT refuses to adapt it: LoRA replaces Linear, Embedding and "
                                "Conv layers)");
  // Layers 0 and 1 of 32 only, and lm_head: recognised, not modelled.
  CHECK(IsUnsupported(targets("p7.json", R"("target_modules": "model\\.layers\\.[01]\\.self_attn\\.q_proj")")));
  CHECK(IsUnsupported(targets("p8.json", R"("target_modules": "lm_head|.*q_proj")")));
  // exclude_modules: a list by suffix, a string as a regular expression.
  CHECK(modules(targets("p9.json", R"("target_modules": "all-linear", "exclude_modules": ["down_proj", "up_proj", "gate_proj"])")) ==
        Names{"q_proj", "k_proj", "v_proj", "o_proj"});
  CHECK(modules(targets("p10.json", R"("target_modules": ".*_proj", "exclude_modules": ".*\\.mlp\\..*")")) ==
        Names{"q_proj", "k_proj", "v_proj", "o_proj"});
  const std::string all_out = targets("p11.json", R"("target_modules": ["q_proj"], "exclude_modules": ["q_proj"])");
  CHECK(ErrorOf(all_out) == all_out + ": /training/adapter_config/exclude_modules: excludes every "
                                      "module target_modules matches (with modules_to_save): "
                                      "PEFT refuses an adapter without modules");
  // exclude_modules that excludes nothing: a warning, as PEFT's.
  const std::string unused = targets("p14.json", R"("target_modules": ["q_proj"], "exclude_modules": ["x_proj"])");
  CHECK(LoadSetup(unused, {}).warnings ==
        std::vector<std::string>{unused + ": /training/adapter_config/exclude_modules: excludes no "
                                          "module of the model (module names look like "
                                          "model.layers.0.mlp.down_proj)"});
  // "all-linear" inside a list is a module name to PEFT, matching nothing.
  const std::string listed = targets("p12.json", R"("target_modules": ["all-linear"])");
  CHECK(ErrorOf(listed).starts_with(listed + ": /training/adapter_config/target_modules: "
                                             "\"all-linear\" inside a list"));
  // Absent: PEFT's default for llama (peft/utils/constants.py), with a note.
  CHECK(modules(targets("p13.json", R"("lora_alpha": 16)")) == Names{"q_proj", "v_proj"});
}

// LoraConfig fields that change the adapters in ways memsim does not model are never dropped
// silently: unsupported, an error where PEFT refuses them, or a warning naming them.
TEST_CASE("hf-trainer: adapter_config fields memsim does not model", "[config][hf][peft]") {
  const auto adapter = [](const std::string& name, const std::string& extra) {
    return Write(name, "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", \"training\": "
                       "{\"framework\": \"hf-trainer\", \"max_seq_length\": 512, \"adapter_config\": "
                       "{\"r\": 8, \"target_modules\": [\"q_proj\"], " + extra + "}}}");
  };
  CHECK(IsUnsupported(adapter("u1.json", "\"layer_replication\": [[0, 4], [2, 5]]")));
  CHECK(IsUnsupported(adapter("u2.json", "\"target_parameters\": [\"mlp.experts.down_proj\"]")));
  const std::string pattern = adapter("u3.json", "\"layers_pattern\": \"layers\"");
  CHECK(ErrorOf(pattern) == pattern + ": /training/adapter_config/layers_pattern: needs "
                                      "layers_to_transform (PEFT refuses layers_pattern alone)");
  const std::string task = adapter("u4.json", "\"task_type\": \"CAUSAL-LM\"");
  CHECK(ErrorOf(task).starts_with(task + ": /training/adapter_config/task_type: expected one of"));
  const std::string bias = adapter("u5.json", "\"lora_bias\": true");
  CHECK(LoadSetup(bias, {}).warnings ==
        std::vector<std::string>{bias + ": /training/adapter_config/lora_bias: not modelled (a "
                                        "trained bias of each lora_B, or trained rows of the "
                                        "embedding: a few MiB at most), ignored"});
  // "norm" ends the name of every layer's two norms and model.norm (PEFT's _set_trainable:
  // key.endswith(target_key)); the first three in module order are named.
  const std::string save = adapter("u6.json", "\"modules_to_save\": [\"lm_head\", \"norm\"]");
  CHECK(LoadSetup(save, {}).warnings ==
        std::vector<std::string>{save + ": /training/adapter_config/modules_to_save: 'norm' copies "
                                        "model.layers.0.input_layernorm, "
                                        "model.layers.0.post_attention_layernorm, "
                                        "model.layers.1.input_layernorm, ... (PEFT's "
                                        "_set_trainable: names ending with the entry); their "
                                        "trainable copies are not modelled (memsim copies "
                                        "lm_head, model.embed_tokens, score)"});
  CHECK(LoadSetup(adapter("u7.json", "\"lora_bias\": false, \"rank_pattern\": {}"), {})
            .warnings.empty());
  // Another JSON given as the adapter's: refused, not read as all defaults.
  const std::string model = Write(
      "u8.json", "{\"model\": \"llama3-8b\", \"device\": \"rtx-4090-24g\", \"training\": "
                 "{\"framework\": \"hf-trainer\", \"max_seq_length\": 512, \"adapter_config\": "
                 "\"" + std::string(MEMSIM_SOURCE_DIR) + "/models/llama3-8b.json\"}}");
  CHECK(ErrorOf(model) == std::string(MEMSIM_SOURCE_DIR) + "/models/llama3-8b.json: /model_type: "
                          "a model's config.json, not an adapter_config.json (PEFT's LoraConfig "
                          "fields)");
}

TEST_CASE("hf-trainer: what a training_args file may hold", "[config][hf]") {
  const auto with_args = [](const std::string& name, const std::string& args_file) {
    return Write(name, "{\"model\": \"llama3-8b\", \"device\": \"l40s-48g\", \"training\": "
                       "{\"framework\": \"hf-trainer\", \"training_args\": \"" +
                           args_file + "\", \"max_seq_length\": 256}}");
  };
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("memsim_hf_trainer_test-" + std::to_string(::getpid())))
                              .string();
  Write("a1.json", "{\"per_device_train_batch_size\": 2, \"micro_batch_size\": 2}");
  CHECK(ErrorOf(with_args("ta1.json", "a1.json")) ==
        dir + "/a1.json: /micro_batch_size: not a framework \"hf-trainer\" key (it is a Megatron "
              "/ \"pytorch\" training key); write per_device_train_batch_size");
  Write("a2.json", "{\"per_device_train_batch_size\": 2, \"max_seq_length\": 128}");
  CHECK(ErrorOf(with_args("ta2.json", "a2.json")) ==
        dir + "/a2.json: /max_seq_length: memsim's own key, not a TrainingArguments field: write "
              "it in the training block of the config");
  // A whole memsim config given as the TrainingArguments JSON.
  const std::string config = with_args("ta3.json", "a1.json");
  CHECK(ErrorOf(with_args("ta4.json", "ta3.json")) ==
        config + ": /training: a memsim training config, not a TrainingArguments JSON "
                 "(trainer.args.to_json_string())");
  // A model's config.json given as the TrainingArguments JSON.
  Write("a3.json", "{\"model_type\": \"llama\", \"hidden_size\": 4096}");
  CHECK(ErrorOf(with_args("ta6.json", "a3.json")) ==
        dir + "/a3.json: /model_type: a model's config.json, not a TrainingArguments JSON "
              "(trainer.args.to_json_string())");
  // An endless file is refused at its first bytes (binary) instead of hanging.
  CHECK(ErrorOf(with_args("ta5.json", "/dev/zero")) ==
        "/dev/zero: binary data (a NUL byte at byte 0), not a JSON file");
}

TEST_CASE("hf-trainer: the evaluation keys", "[config][hf][eval]") {
  const std::string eval = kBase + ", \"max_steps\": 10, \"eval_strategy\": \"steps\"";
  const Setup s = LoadSetup(Config("e1.json", eval + ", \"eval_steps\": 5, "
                                                     "\"per_device_eval_batch_size\": 4, "
                                                     "\"eval_accumulation_steps\": 2, "
                                                     "\"eval_batches\": 7, \"compute_metrics\": true"),
                            {});
  CHECK(s.training.hf_trainer()->eval_steps == 5);
  CHECK(s.training.hf_trainer()->eval_batch_size == 4);
  CHECK(s.training.hf_trainer()->eval_batches == 7);
  CHECK(s.training.hf_trainer()->eval_accumulation_steps == 2);
  CHECK(s.training.hf_trainer()->eval_keep_predictions);
  // TrainingArguments.__post_init__: eval_steps absent -> logging_steps (default 500); a ratio
  // below 1 of max_steps: ceil(10 · 0.25) = 3 (Trainer._inner_training_loop).
  CHECK(LoadedTrainer(Config("e2.json", eval + ", \"eval_batches\": 1")).eval_steps == 500);
  CHECK(LoadedTrainer(Config("e3.json", eval + ", \"eval_batches\": 1, \"logging_steps\": 2"))
            .eval_steps == 2);
  CHECK(LoadedTrainer(Config("e4.json", eval + ", \"eval_batches\": 1, \"eval_steps\": 0.25"))
            .eval_steps == 3);
  // evaluate() passes prediction_loss_only=True without compute_metrics; the field itself
  // turns predictions off too.
  CHECK_FALSE(
      LoadedTrainer(Config("e5.json", eval + ", \"eval_batches\": 1")).eval_keep_predictions);
  CHECK_FALSE(LoadedTrainer(Config("e6.json", eval + ", \"eval_batches\": 1, \"compute_metrics\": "
                                                     "true, \"prediction_loss_only\": true"))
                  .eval_keep_predictions);
  // The old name, and no evaluation by default.
  CHECK(LoadedTrainer(Config("e7.json", kBase + ", \"evaluation_strategy\": \"steps\", "
                                                "\"eval_steps\": 2, \"eval_batches\": 1"))
            .eval_steps == 2);
  CHECK(LoadedTrainer(Config("e8.json", kBase + ", \"eval_steps\": 2")).eval_steps == 0);
  const std::string missing = Config("e9.json", eval);
  CHECK(ErrorOf(missing) ==
        missing + ": /training/eval_batches: missing key with eval_strategy \"steps\", expected a "
                  "positive integer: the evaluation batches each process runs, "
                  "ceil(len(eval_dataset) / (per_device_eval_batch_size x world_size)) (memsim's "
                  "own key)");
  // A long run: simulated at least to the step after the first evaluation (step 10 here, the
  // first multiple of eval_steps 10 at or after eval_delay 5); the later ones are not followed.
  const Setup long_run =
      LoadSetup(Config("e11.json", kBase + ", \"max_steps\": 1000, \"eval_strategy\": "
                                           "\"steps\", \"eval_steps\": 10, \"eval_delay\": 5, "
                                           "\"eval_batches\": 1"),
                {});
  CHECK(FirstEvaluationStep(long_run.training) == 10);
  CHECK(FirstRepeatingIteration(long_run) == 11);
  CHECK(std::any_of(long_run.warnings.begin(), long_run.warnings.end(), [](const std::string& w) {
    return w.find("only the first evaluation (after step 10) is simulated") != std::string::npos;
  }));
  const Setup epoch = LoadSetup(Config("e10.json", kBase + ", \"eval_strategy\": \"epoch\""), {});
  CHECK(epoch.training.hf_trainer()->eval_steps == 0);
  CHECK(std::any_of(epoch.warnings.begin(), epoch.warnings.end(), [](const std::string& w) {
    return w.find("\"epoch\": evaluation at epoch ends is not modelled") != std::string::npos;
  }));
}

}  // namespace
}  // namespace memsim::config

namespace memsim::config {
namespace {

// The parameters memsim counts for a Hugging Face config.json (framework "hf-trainer").
std::int64_t HfParams(const std::string& name, const std::string& model_json,
                      std::vector<std::string>* warnings = nullptr) {
  const Setup s = LoadSetup(Write(name, "{\"model\": " + model_json + ", \"device\": \"a100-80g\", "
                                        "\"training\": {\"framework\": \"hf-trainer\", " + kBase + "}}"),
                            {});
  if (warnings != nullptr) *warnings = s.warnings;
  return workload::ComputeStaticSizes(s, 0).parameter_count;
}

bool Mentions(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& l : lines) {
    if (l.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("hf-trainer: parameter counts of gemma, gemma2, phi3, gpt2, gpt_neox checkpoints",
          "[config][hf]") {
  std::vector<std::string> warnings;
  // google/gemma-2b config.json: hidden 2048, intermediate 16384, 18 layers, 8 heads, 1 KV head,
  // head_dim 256, vocab 256000, tied (GemmaConfig default). modeling_gemma.py:
  //   embed_tokens 256000·2048 = 524,288,000 (lm_head tied: no parameter of its own)
  //   per layer: q_proj 2048·(8·256) = 4,194,304; k_proj, v_proj 2048·256 = 524,288 each;
  //     o_proj 4,194,304; gate/up/down_proj 3 · 2048·16384 = 100,663,296; input_layernorm and
  //     post_attention_layernorm 2·2048 -> 110,104,576; 18 layers 1,981,882,368
  //   norm 2048; total 2,506,172,416.
  CHECK(HfParams("gemma.json", R"({"model_type": "gemma", "hidden_size": 2048,
      "intermediate_size": 16384, "num_hidden_layers": 18, "num_attention_heads": 8,
      "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000,
      "max_position_embeddings": 8192, "hidden_act": "gelu"})", &warnings) == 2506172416);
  CHECK(Mentions(warnings, "GemmaRMSNorm"));
  // google/gemma-2-2b config.json: hidden 2304, intermediate 9216, 26 layers, 8 heads, 4 KV
  // heads, head_dim 256, vocab 256000, tied. modeling_gemma2.py Gemma2DecoderLayer has four
  // norms (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
  // post_feedforward_layernorm):
  //   embed_tokens 256000·2304 = 589,824,000
  //   per layer: q_proj 2304·2048 = 4,718,592; k_proj, v_proj 2304·1024 = 2,359,296 each;
  //     o_proj 4,718,592; gate/up/down 3 · 2304·9216 = 63,700,992; norms 4·2304 = 9,216
  //     -> 77,865,984; 26 layers 2,024,515,584
  //   norm 2304; total 2,614,341,888.
  CHECK(HfParams("gemma2.json", R"({"model_type": "gemma2", "hidden_size": 2304,
      "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
      "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
      "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
      "final_logit_softcapping": 30.0, "sliding_window": 4096,
      "query_pre_attn_scalar": 256})", &warnings) == 2614341888);
  CHECK(Mentions(warnings, "attn_logit_softcapping"));
  CHECK(Mentions(warnings, "final_logit_softcapping"));
  // microsoft/Phi-3-mini-4k-instruct config.json: hidden 3072, intermediate 8192, 32 layers, 32
  // heads, 32 KV heads, vocab 32064, untied. modeling_phi3.py:
  //   embed_tokens 32064·3072 = 98,500,608; lm_head the same
  //   per layer: qkv_proj 3072·(3·3072) = 28,311,552; o_proj 9,437,184; gate_up_proj
  //     3072·(2·8192) = 50,331,648; down_proj 8192·3072 = 25,165,824; two norms 6,144
  //     -> 113,252,352; 32 layers 3,624,075,264
  //   norm 3072; total 98,500,608 · 2 + 3,624,075,264 + 3,072 = 3,821,079,552.
  CHECK(HfParams("phi3.json", R"({"model_type": "phi3", "hidden_size": 3072,
      "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 4096,
      "tie_word_embeddings": false, "hidden_act": "silu"})") == 3821079552);
  // openai-community/gpt2 config.json: n_embd 768, n_layer 12, n_head 12, n_positions 1024,
  // vocab 50257, tied. modeling_gpt2.py (Conv1D c_attn, c_proj, c_fc, c_proj, all with bias):
  //   wte 50257·768 = 38,597,376; wpe 1024·768 = 786,432
  //   per layer: ln_1 2·768; c_attn 768·2304 + 2304 = 1,771,776; attn.c_proj 768·768 + 768 =
  //     590,592; ln_2 1,536; c_fc 768·3072 + 3072 = 2,362,368; mlp.c_proj 3072·768 + 768 =
  //     2,360,064 -> 7,087,872; 12 layers 85,054,464
  //   ln_f 1,536; total 124,439,808.
  CHECK(HfParams("gpt2.json", R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12,
      "n_head": 12, "n_positions": 1024, "vocab_size": 50257,
      "activation_function": "gelu_new"})") == 124439808);
  // EleutherAI/pythia-160m config.json: hidden 768, intermediate 3072, 12 layers, 12 heads,
  // vocab 50304, max_position_embeddings 2048, rotary_pct 0.25, use_parallel_residual true,
  // untied. modeling_gpt_neox.py:
  //   embed_in 50304·768 = 38,633,472; embed_out the same
  //   per layer: input_layernorm and post_attention_layernorm 2 · 2·768; query_key_value
  //     768·2304 + 2304 = 1,771,776; dense 768·768 + 768 = 590,592; dense_h_to_4h 768·3072 +
  //     3072 = 2,362,368; dense_4h_to_h 3072·768 + 768 = 2,360,064 -> 7,087,872; 12 layers
  //     85,054,464
  //   final_layer_norm 1,536; total 38,633,472 · 2 + 85,054,464 + 1,536 = 162,322,944.
  CHECK(HfParams("pythia.json", R"({"model_type": "gpt_neox", "hidden_size": 768,
      "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
      "vocab_size": 50304, "max_position_embeddings": 2048, "rotary_pct": 0.25,
      "use_parallel_residual": true, "tie_word_embeddings": false,
      "hidden_act": "gelu"})", &warnings) == 162322944);
  CHECK(Mentions(warnings, "use_parallel_residual"));
}

TEST_CASE("hf-trainer: an unknown model_type names the closest known ones", "[config][hf]") {
  const std::string path =
      Write("u2.json", "{\"model\": {\"model_type\": \"gemma3\"}, \"device\": \"v100-16g\", "
                       "\"training\": {\"framework\": \"hf-trainer\", " + kBase + "}}");
  const std::string e = ErrorOf(path);
  CHECK(e.find("unknown model_type \"gemma3\"") != std::string::npos);
  CHECK(e.find("'gemma2'") != std::string::npos);
  CHECK(e.find("'gpt_neox'") != std::string::npos);  // the known list
}


TEST_CASE("hf-trainer: a token limit error names the key and file holding the large factor",
          "[config][hf]") {
  // tryout6 #21: the batch is in a training_args file, the length in the config. 2 × 40000000 =
  // 80000000 tokens exceed 2^26 = 67108864; the length is 40000000 / 2^26 ≈ 0.6 of its own
  // limit, the batch 2 / 2^16 ≈ 0.00003 of its: the error is at the config's max_seq_length
  // and names the file holding the batch.
  const std::string args = Write("args21.json", "{\"per_device_train_batch_size\": 2}");
  const std::string path = Write(
      "t21.json", "{\"model\": \"llama3-8b\", \"device\": \"l40s-48g\", \"training\": "
                  "{\"framework\": \"hf-trainer\", \"training_args\": \"args21.json\", "
                  "\"max_seq_length\": 40000000}}");
  CHECK(ErrorOf(path) == path + ": /training/max_seq_length: per_device_train_batch_size × "
                                "max_seq_length = 2 × 40000000 = 80000000 tokens exceed memsim's "
                                "limit of 67108864 (with per_device_train_batch_size at " +
                             args + ": /per_device_train_batch_size)");
}

// modules_to_save as PEFT matches it (peft/utils/other.py _set_trainable: a trainable copy of
// every module whose name ends with the entry, as text; tuners_utils.py
// check_target_module_exists: no adapter inside re.match(rf"(^|.*\.){m}($|\..*)", name)), and
// dotted target_modules entries (key == target or key.endswith("." + target)).
TEST_CASE("hf-trainer: modules_to_save and dotted target_modules match as in PEFT",
          "[config][hf][peft]") {
  const auto adapter = LlamaAdapter;
  using Names = std::vector<std::string>;
  // "model.embed_tokens" ends model.embed_tokens, "head" ends lm_head: both copied, under
  // memsim's names.
  const Setup saved = LoadSetup(adapter("s1.json", R"("target_modules": ["q_proj"], "modules_to_save": ["model.embed_tokens", "head"])"), {});
  CHECK(saved.training.hf_trainer()->lora_modules_to_save == Names{"embed_tokens", "lm_head"});
  CHECK(saved.warnings.empty());
  // Each copy is the module's weights, trainable: llama3-8b's embedding and lm_head are each
  // 128256 × 4096 = 525,336,576 parameters (models/llama3-8b.json: vocab_size 128256,
  // hidden_size 4096, untied), on top of LoRA r 8 on q_proj: 32 × 8 × (4096 + 4096) = 2,097,152.
  CHECK(workload::ComputeStaticSizes(saved, 0).trainable_parameter_count ==
        2097152 + 2 * 525336576);
  // An entry that ends no module name: PEFT ignores it; memsim warns.
  const std::string none = adapter("s2.json", R"("target_modules": ["q_proj"], "modules_to_save": ["lm_heads"])");
  CHECK(LoadSetup(none, {}).warnings ==
        Names{none + ": /training/adapter_config/modules_to_save: 'lm_heads' ends no module name "
                     "of the model, so PEFT copies nothing for it (module names look like "
                     "lm_head, model.embed_tokens, model.layers.0.mlp)"});
  // "mlp" ends every layer's MLP: a copy of decoder-layer weights, not modelled.
  CHECK(IsUnsupported(adapter("s3.json", R"("target_modules": ["q_proj"], "modules_to_save": ["mlp"])")));
  // The exclusion is a regular expression over dotted parts: "self_attn" holds every q_proj,
  // so no module is left to adapt (PEFT: "No modules were targeted for adaptation" ...).
  // (It also copies every self_attn, which is unsupported, but the exclusion fails first.)
  const std::string held = adapter("s4.json", R"("target_modules": ["q_proj", "v_proj"], "modules_to_save": ["layers\\.[0-9]+\\.self_attn"])");
  CHECK(ErrorOf(held) == held + ": /training/adapter_config/target_modules: modules_to_save holds "
                                "every module target_modules matches: PEFT refuses an adapter "
                                "without modules");
  // Dotted target_modules: "self_attn.q_proj" is every layer's q_proj; a full name of one
  // layer's is per-layer (unsupported); a dotted entry that matches nothing is ignored.
  const auto targets = [&](const std::string& name, const std::string& list) {
    return LoadedTrainer(adapter(name, "\"target_modules\": " + list)).lora_target_modules;
  };
  CHECK(targets("s5.json", R"(["self_attn.q_proj", "mlp.down_proj", "x.y"])") ==
        Names{"q_proj", "down_proj"});
  CHECK(IsUnsupported(adapter("s6.json", R"("target_modules": ["model.layers.0.self_attn.q_proj"])")));
  const std::string mlp = adapter("s7.json", R"("target_modules": ["layers.0.mlp"])");
  CHECK(ErrorOf(mlp) == mlp + ": /training/adapter_config/target_modules: matches "
                              "'model.layers.0.mlp', which is not a linear layer (PEFT refuses to "
                              "adapt it: LoRA replaces Linear, Embedding and Conv layers)");
}

// A regular expression that would backtrack exponentially in Python's re (PEFT's matcher) is
// matched breadth-first, and one whose automaton is too large is refused: never a hang.
TEST_CASE("hf-trainer: pathological target_modules patterns finish", "[config][hf][peft]") {
  const auto adapter = LlamaAdapter;
  // Nested quantifiers that a backtracking matcher (Python's re, or std::regex's default
  // depth-first executor) explores in time exponential in the name's length when the name does
  // not end with the 'Q' they demand: more than 20 s on model.layers.31.self_attn.q_proj
  // (measured with libstdc++ 12's depth-first executor). It matches no module.
  const std::string nested = adapter("rx1.json", R"("target_modules": "(([a-z0-9_]+\\.?)+)+Q")");
  CHECK(ErrorOf(nested) == nested + ": /training/adapter_config/target_modules: matches no module "
                                    "of the model (PEFT: target modules not found in the base "
                                    "model); module names look like model.layers.0.self_attn.q_proj");
  // (a+)+ with a tail that matches every q_proj: a match, found in linear time.
  CHECK(LoadedTrainer(adapter("rx2.json", R"("target_modules": "(([a-z0-9_]+\\.?)+)+q_proj")"))
            .lora_target_modules == std::vector<std::string>{"q_proj"});
  // Counted repetitions multiply the automaton: by RegexStates' count, '.' is 1 state, {20}
  // copies an atom 21 times and a group adds 2: ((1 × 21 + 2) × 21 + 2) × 21 + 2 = 10187
  // states, above the 1024 limit.
  const std::string counted = adapter("rx3.json", R"x("target_modules": "(((.{20}){20}){20})")x");
  CHECK(ErrorOf(counted) == counted + ": /training/adapter_config/target_modules: the regular "
                                      "expression \"(((.{20}){20}){20})\" is too complex for "
                                      "memsim (about 10187 automaton states, limit 1024: counted "
                                      "repetitions such as {100} multiply); write a shorter "
                                      "pattern or a list of module names");
  // A back-reference, which the breadth-first matcher cannot run, is refused by name.
  const std::string backref = adapter("rx4.json", R"("target_modules": "(q)_proj\\1")");
  CHECK(ErrorOf(backref).find("without back-references") != std::string::npos);
}

}  // namespace
}  // namespace memsim::config
