// StageRunner (stage_runner.h) on the module harness: one micro-batch through a one-stage model
// (testing::TinyLlama: embedding, 2 dense layers, output layer and loss), with the harness's
// recording wrapper in place of the data-parallel wrapper.
#include "workload/stage_runner.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "workload/module_harness.h"
#include "workload/modules/attention.h"
#include "workload/modules/mlp.h"
#include "workload/pipeline.h"
#include "workload/test_setups.h"

namespace memsim::workload::stage_runner_test {

using testing::ModuleHarness;
using testing::SeenTensors;

// The runner and the parts it drives, over one harness.
struct OneStage {
  explicit OneStage(const config::Setup& setup)
      : h(setup),
        layer(DecoderLayer::ForSetup(h.setup())),
        exchange(h.em(), h.dims()),
        runner(h.ctx(), h.setup().training, /*rank=*/0, layer, h.wrapper(), exchange) {}
  ModuleHarness h;
  DecoderLayer layer;
  PipelineExchange exchange;
  StageRunner runner;
};

SeenTensors WithPrefix(const SeenTensors& all, const std::string& prefix) {
  SeenTensors out;
  for (const testing::SeenTensor& t : all) {
    if (t.label.rfind(prefix, 0) == 0) out.push_back(t);
  }
  return out;
}

TEST_CASE(
    "a micro-batch's forward and backward run the wrapper's hooks site by site and leave "
    "only the reporting loss",
    "[workload][stage_runner]") {
  OneStage st(testing::TinyLlama());
  const ScheduleStep backward_next{/*forward=*/false, 0, 0};
  st.h.Run(Phase::kForward, [&](ModuleContext&) { st.runner.Forward(0, 0, &backward_next); });
  CHECK_FALSE(st.runner.Idle());
  st.h.Run(Phase::kBackward, [&](ModuleContext&) { st.runner.Backward(0, 0, nullptr); });
  CHECK(st.runner.Idle());
  // stage_runner.cc: forward from the embedding through the layers to the head, backward from
  // the head to the embedding, then the end of backward_step.
  const std::vector<std::string> expected = {
      "BeforeForward embedding", "AfterForward embedding", "BeforeForward layer0",
      "AfterForward layer0",     "BeforeForward layer1",   "AfterForward layer1",
      "BeforeForward head",      "AfterForward head",      "BeforeBackward head",
      "AfterBackward head",      "BeforeBackward layer1",  "AfterBackward layer1",
      "BeforeBackward layer0",   "AfterBackward layer0",   "BeforeBackward embedding",
      "AfterBackward embedding", "EndOfBackward"};
  CHECK(st.h.wrapper().hooks() == expected);
  // The loss the training loop reports is the only tensor left to it.
  const std::vector<TensorId> losses = st.runner.TakeReportLosses();
  REQUIRE(losses.size() == 1);
  st.h.Release({losses[0]});
  CHECK(st.h.Leaked().empty());
  CHECK(st.h.problems().empty());
}

TEST_CASE(
    "a layer inside the stage saves what its attention and MLP modules save alone, plus "
    "their outputs",
    "[workload][stage_runner]") {
  const config::Setup s = testing::TinyLlama();
  // Each module alone, on its own harness.
  ModuleHarness alone_attention(s), alone_mlp(s);
  AttentionModule attention;
  MlpModule mlp;
  alone_attention.Forward(attention);
  alone_mlp.Forward(mlp);
  // In the layer, the attention's output (attn.residual) is the MLP's input, kept for the
  // residual path, and the MLP's output (mlp.residual) is layer 1's input: [s, b, h] each,
  // 2·T·h = 2·32·64 bytes.
  SeenTensors expected = alone_attention.Saved();
  expected.push_back({"layer0.attn.residual", 2 * 32 * 64});
  for (const testing::SeenTensor& t : alone_mlp.Saved()) expected.push_back(t);
  expected.push_back({"layer0.mlp.residual", 2 * 32 * 64});

  OneStage st(s);
  const ScheduleStep backward_next{false, 0, 0};
  st.h.Run(Phase::kForward, [&](ModuleContext&) { st.runner.Forward(0, 0, &backward_next); });
  CHECK(WithPrefix(st.h.Alive(), "layer0.") == expected);
}

}  // namespace memsim::workload::stage_runner_test
