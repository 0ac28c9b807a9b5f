// A training stack added from outside src/ (config/stack.h; docs/architecture.md, "How to add a
// stack"): the test registers "toy", a stack that reads plain PyTorch's block, keeps every
// tensor in fp32, runs on one device without a wrapper and takes no optimizer step (a forward
// and backward loop), then loads a config that names it and runs it through LoadSetup, Build and
// the engine. Nothing of the toy is in src/.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "config/load.h"
#include "config/stack.h"
#include "config/test_util.h"
#include "core/error.h"
#include "engine/stages.h"
#include "workload/build.h"
#include "workload/data_parallel.h"
#include "workload/model.h"
#include "workload/training_loop.h"

namespace memsim {
namespace {

// How often the toy's factories were asked for their parts.
struct ToyCalls {
  int data_parallel = 0;
  int training_loop = 0;
};
ToyCalls toy_calls;

// The toy's loop: the model at init, then each iteration the schedule's forward and backward
// steps, then the logged losses dropped; no zero_grad and no optimizer step.
class ToyLoop final : public workload::TrainingLoop {
 public:
  explicit ToyLoop(const workload::LoopParts& parts) : TrainingLoop(parts) {}
  void Init() override {
    p_.em.SetContext(0, Phase::kInit, -1);
    p_.dp.Setup(p_.em, BuildModel());
  }
  void Iteration(int k) override {
    p_.em.SetContext(k, Phase::kForward, -1);
    RunSchedule();
    p_.em.Begin("toy.losses_dropped");
    for (workload::TensorId id : p_.runner.TakeReportLosses()) p_.em.Free(id);
  }
};

class ToyStack final : public config::Stack {
 public:
  std::string_view Name() const override { return "toy"; }
  const config::StackTraits& Traits() const override {
    static const config::StackTraits traits{.label = "toy", .adam_label = ""};
    return traits;
  }
  // Plain PyTorch's block, named "toy".
  void ReadBeforeModel(config::internal::ObjectReader& t, const config::internal::Document& config,
                       config::Setup* s, config::internal::HfTrainerExtras* extras) const override {
    Pytorch().ReadBeforeModel(t, config, s, extras);
  }
  void ReadAfterModel(config::internal::ObjectReader& t, config::internal::LocatedModel* model,
                      config::Setup* s) const override {
    Pytorch().ReadAfterModel(t, model, s);
    s->training.framework = std::string(Name());
  }
  void SetElementSizes(const config::TrainingConfig& /*c*/,
                       workload::ModelDims* d) const override {
    d->act_bytes = d->param_bytes = d->grad_bytes = d->wide_bytes = 4;
    d->mixed = false;
  }
  config::DataParallelWrapper Wrapper(const config::TrainingConfig& /*c*/) const override {
    return config::SingleDevice{true};
  }
  std::unique_ptr<workload::DataParallel> NewDataParallel(
      const config::Setup& /*setup*/, int /*rank*/, const workload::ModelDims& d,
      const workload::RankParams& params) const override {
    ++toy_calls.data_parallel;
    return workload::NewSingleDevice(d, params, config::SingleDevice{true});
  }
  std::vector<workload::GradBuffer> LayoutGradBuffers(
      const config::Setup& /*setup*/, int /*rank*/, const workload::ModelDims& /*d*/,
      const std::vector<workload::ParamTensor>& /*params*/) const override {
    return {};
  }
  std::vector<std::vector<int>> ParamGroups(
      const std::vector<workload::ParamTensor>& params) const override {
    std::vector<std::vector<int>> groups(1);
    for (int i = 0; i < static_cast<int>(params.size()); ++i) groups[0].push_back(i);
    return groups;
  }
  std::unique_ptr<workload::TrainingLoop> NewTrainingLoop(
      const workload::LoopParts& parts) const override {
    ++toy_calls.training_loop;
    return std::make_unique<ToyLoop>(parts);
  }

 private:
  static const config::Stack& Pytorch() { return *config::FindStack("pytorch"); }
};

// Registers the toy for one test and removes it after, so that other tests in the same process
// see the built-in stacks only.
struct ScopedToyStack {
  ScopedToyStack() {
    config::RegisterStack(std::make_unique<ToyStack>());
    toy_calls = {};
  }
  ~ScopedToyStack() { config::UnregisterStack("toy"); }
};

// A small llama inline (hidden 64, 4 heads of 16, FFN 128 gated, 2 layers, vocab 256, untied)
// on an a100-80g, two iterations of one micro-batch of 32 tokens.
std::string ToyConfig() {
  return config::testing::WriteTemp(
      "toy.json",
      R"({"model": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
          "vocab_size": 256},
          "device": "a100-80g",
          "training": {"framework": "toy", "seq_length": 32, "micro_batch_size": 1,
                       "global_batch_size": 1, "train_iters": 2}})");
}

TEST_CASE("a stack's name is unknown until it is registered", "[stacks]") {
  try {
    config::LoadSetup(ToyConfig(), {});
    FAIL("no error");
  } catch (const UnsupportedError& e) {
    CHECK(std::string(e.what()).find("/training/framework: framework 'toy' (memsim models "
                                     "\"megatron\", \"pytorch\", \"hf-trainer\" and \"torchtitan\")") !=
          std::string::npos);
  }
}

TEST_CASE("a stack registered from outside src/ runs end to end", "[stacks]") {
  ScopedToyStack toy;
  CHECK(config::QuotedStackNames() ==
        "\"megatron\", \"pytorch\", \"hf-trainer\", \"torchtitan\" and \"toy\"");
  const config::Setup s = config::LoadSetup(ToyConfig(), {});
  CHECK(s.training.framework == "toy");
  CHECK(&config::StackOf(s.training) == config::FindStack("toy"));
  // The toy pads no vocabulary (StackTraits::pads_vocab false): 256 rows.
  CHECK(s.model.padded_vocab_size == 256);

  // The model at init, every parameter in the toy's fp32. Megatron-core's GPT layer (TE spec,
  // RMSNorm, no biases) holds per layer the fused norm weight [h] and QKV [(q + 2·kv), h], the
  // projection [h, q], the MLP's norm [h], fc1 [2·ffn, h] and fc2 [h, ffn]:
  // 64 + 192·64 + 64·64 + 64 + 256·64 + 64·128 = 41088 elements; two layers 82176, plus the
  // embedding and the output layer [V, h] = 16384 each and the final norm 64: 115008 elements,
  // 4 B each = 460032 B.
  const workload::Program p = workload::Build(s, 0);
  Bytes parameter_bytes = 0;
  bool backward = false;
  bool optimizer_state = false;
  for (const workload::Op& op : p.ops) {
    backward = backward || (op.iteration == 2 && op.phase == Phase::kBackward);
    for (const workload::TensorAlloc& a : op.allocs) {
      if (op.iteration == 0 && a.category == Category::kParameters) parameter_bytes += a.size_bytes;
      optimizer_state = optimizer_state || a.category == Category::kOptimizerStates;
    }
  }
  CHECK(parameter_bytes == 460032);
  CHECK(backward);              // the toy's loop ran the schedule in iteration 2
  CHECK_FALSE(optimizer_state);  // and took no step
  CHECK(toy_calls.data_parallel == 1);
  CHECK(toy_calls.training_loop == 1);

  // Through the engine: init and the two iterations, the parameters alive from init on.
  const engine::RunResult run = engine::RunAllStages(s, engine::RunOptions{});
  REQUIRE(run.Reported().spans.size() == 3);
  CHECK(run.Reported().spans[0].end_allocated_bytes >= 460032);
}

}  // namespace
}  // namespace memsim
