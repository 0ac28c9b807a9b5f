// TrainingLoop (training_loop.h) on the module harness: Megatron-LM's train_step over a
// one-stage model (testing::TinyLlama), with the harness's recording wrapper, which shards
// nothing and gives the optimizer no slices (so no optimizer state is made).
#include "workload/training_loop.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "workload/module_harness.h"
#include "workload/schedule.h"
#include "workload/test_setups.h"

namespace memsim::workload::training_loop_test {

using testing::ModuleHarness;
using testing::SeenTensors;

TEST_CASE(
    "the Megatron loop builds every parameter once at init, then runs zero_grad, the "
    "schedule, the grad sync and the step, leaving only the parameters",
    "[workload][training_loop]") {
  ModuleHarness h(testing::TinyLlama());
  const config::Setup& s = h.setup();
  DecoderLayer layer = DecoderLayer::ForSetup(s);
  RankParams params;
  params.params = StageParams(s, 0, layer);
  params.groups = ParamGroups(params.params);
  PipelineExchange exchange(h.em(), h.dims());
  StageRunner runner(h.ctx(), s.training, 0, layer, h.wrapper(), exchange);
  const std::vector<ScheduleStep> steps = PipelineSchedule(1, 0, h.dims().m, 1);
  const LoopParts parts{s, h.dims(), h.facts(), params, h.em(), h.wrapper(), runner, exchange, steps};
  const std::unique_ptr<TrainingLoop> loop = NewMegatronLoop(parts);

  loop->Init();
  h.Close();
  // TinyLlama's parameters (h 64, ffn 128 gated, vocab 256, untied, RMSNorm, no biases):
  // embedding 256·64 = 16,384; per layer ln1 64, qkv 192·64 = 12,288, proj 64·64 = 4,096,
  // ln2 64, fc1 256·64 = 16,384, fc2 64·128 = 8,192: 41,088, ×2 = 82,176; final norm 64; output
  // 256·64 = 16,384. 115,008 elements in 15 tensors, bf16: 230,016 bytes.
  const SeenTensors built = h.Alive(Category::kParameters);
  CHECK(built.size() == 15);
  CHECK(testing::TotalBytes(built) == 2 * 115'008);
  CHECK(h.wrapper().hooks() == std::vector<std::string>{"Setup 15"});

  loop->Iteration(1);
  h.Close();
  const std::vector<std::string>& hooks = h.wrapper().hooks();
  REQUIRE(hooks.size() > 4);
  CHECK(hooks[1] == "ZeroGrad");
  // After the schedule's one micro-batch: the chunk's last backward, finalize_model_grads'
  // grad sync, the step.
  CHECK(std::vector<std::string>(hooks.end() - 3, hooks.end()) ==
        std::vector<std::string>{"AfterLastBackward 0", "FinishGradSync", "AfterOptimizerStep"});
  CHECK(h.Alive(Category::kParameters) == built);
  // Besides the parameters, only the optimizer's scalar made at init: under bf16, Megatron's
  // MixedPrecisionOptimizer keeps _scale_one, a [1] fp32 tensor (4 bytes; optimizer.cc Init).
  SeenTensors kept = built;
  kept.push_back({"optimizer.scale_one", 4});
  CHECK(h.Leaked() == kept);
  CHECK(h.problems().empty());
}

}  // namespace memsim::workload::training_loop_test
