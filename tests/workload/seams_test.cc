// The seams of the workload generator (data_parallel.h, modules/module.h), exercised with small
// fakes: a data-parallel wrapper that records its hook calls in order, and a transformer layer
// made of one fake module. The next stacks (MoE, Hugging Face, ZeRO, FSDP2) are tested the same
// way.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "workload/build.h"
#include "workload/data_parallel.h"
#include "workload/model.h"
#include "workload/modules/module.h"
#include "workload/test_setups.h"

namespace memsim::workload {
namespace {

config::Setup Tiny() { return testing::TinyLlama(); }

// Records every hook call; frees gradients as DDP does.
class RecordingWrapper final : public DataParallel {
 public:
  explicit RecordingWrapper(std::vector<std::string>* log) : log_(log) {}
  void Setup(Emitter& /*em*/, const std::vector<TensorId>& ids) override {
    log_->push_back("Setup " + std::to_string(ids.size()));
  }
  std::vector<ShardSlice> OptimizerSlices() const override { return {}; }
  bool ShardsOptimizer() const override { return false; }
  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override {
    log_->push_back("Grad " + param);
    em.Free(grad);
  }
  void BeforeForward(Emitter& /*em*/, GradSite site, int layer) override {
    log_->push_back("Forward " + Site(site, layer));
  }
  void AfterForward(Emitter& /*em*/, GradSite site, int layer) override {
    log_->push_back("Forwarded " + Site(site, layer));
  }
  void BeforeBackward(Emitter& /*em*/, GradSite site, int layer) override {
    log_->push_back("Before " + Site(site, layer));
  }
  void AfterBackward(Emitter& /*em*/, GradSite site, int layer) override {
    log_->push_back("After " + Site(site, layer));
  }
  void EndOfBackward(Emitter& /*em*/) override { log_->push_back("EndOfBackward"); }
  void AfterLastBackward(Emitter& /*em*/, int chunk) override {
    log_->push_back("AfterLastBackward " + std::to_string(chunk));
  }
  void FinishGradSync(Emitter& /*em*/) override { log_->push_back("FinishGradSync"); }
  void ZeroGrad(Emitter& /*em*/) override { log_->push_back("ZeroGrad"); }
  void AfterOptimizerStep(Emitter& /*em*/) override { log_->push_back("AfterOptimizerStep"); }
  WrapperSizes StaticSizes() const override { return {}; }

 private:
  static std::string Site(GradSite site, int layer) {
    return site == GradSite::kHead        ? "head"
           : site == GradSite::kEmbedding ? "embedding"
                                          : "layer" + std::to_string(layer);
  }
  std::vector<std::string>* log_;
};

TEST_CASE("the data-parallel wrapper's hooks run where Megatron's wrapper acts, in order",
          "[workload][seams]") {
  std::vector<std::string> log;
  BuildParts parts;
  parts.data_parallel = [&log](const ModelDims&, const RankParams&) {
    return std::make_unique<RecordingWrapper>(&log);
  };
  // Parameters: embedding 1, 2 layers x 6 (ln1, qkv, proj, ln2, fc1, fc2), final norm, output.
  const std::vector<std::string> expected = {
      "Setup 15", "ZeroGrad",
      // Forward from the embedding through the layers to the head.
      "Forward embedding", "Forwarded embedding", "Forward layer0", "Forwarded layer0",
      "Forward layer1", "Forwarded layer1", "Forward head", "Forwarded head",
      // Backward runs from the loss to the embedding; each site's grads between its hooks.
      "Before head", "Grad output_layer.weight", "Grad final_norm.weight", "After head",
      "Before layer1", "Grad layer1.mlp.fc2.weight", "Grad layer1.mlp.fc1.weight",
      "Grad layer1.ln2.weight", "Grad layer1.attn.proj.weight", "Grad layer1.attn.qkv.weight",
      "Grad layer1.ln1.weight", "After layer1", "Before layer0", "Grad layer0.mlp.fc2.weight",
      "Grad layer0.mlp.fc1.weight", "Grad layer0.ln2.weight", "Grad layer0.attn.proj.weight",
      "Grad layer0.attn.qkv.weight", "Grad layer0.ln1.weight", "After layer0", "Before embedding",
      "Grad embedding.word_embeddings.weight", "After embedding", "EndOfBackward",
      "AfterLastBackward 0", "FinishGradSync", "AfterOptimizerStep"};
  // The fused-wgrad dummies of TE layers go to no hook (TE caches them); fusion off, every
  // weight grad reaches the wrapper.
  config::Setup s = Tiny();
  s.training.gradient_accumulation_fusion = false;
  BuildWith(s, 0, parts);
  CHECK(log == expected);
}

// A module that saves one tensor of 1000 bytes and makes a 10-byte output and input grad.
struct FakeSaved final : ModuleSaved {
  TensorId kept = 0;
};
class FakeModule final : public LayerModule {
 public:
  void AppendParams(const config::ModelConfig&, const ModelDims&, int chunk, int layer,
                    std::vector<ParamTensor>* out) const override {
    out->push_back(MakeParam(LayerLabel(layer, "fake.weight"), 7, 1, chunk, layer, true, false));
  }
  TensorId Forward(ModuleContext& ctx, int layer, TensorId x, const ForwardMode& mode,
                   std::unique_ptr<ModuleSaved>* saved) override {
    ctx.em.Begin("fake", layer);
    auto s = std::make_unique<FakeSaved>();
    s->kept = ctx.em.Alloc(1000, Category::kActivations, LayerLabel(layer, "fake.kept"));
    const TensorId out = ctx.em.Alloc(10, Category::kActivations, LayerLabel(layer, "fake.out"));
    if (mode.nograd) ctx.em.Free(s->kept);
    if (mode.free_input) ctx.em.Free(x);
    if (!mode.nograd) *saved = std::move(s);
    return out;
  }
  TensorId Backward(ModuleContext& ctx, int layer, ModuleSaved& saved, TensorId x, bool free_x,
                    TensorId dy, bool free_dy) override {
    ctx.em.Begin("fake_bwd", layer);
    const TensorId dx = ctx.em.Alloc(10, Category::kTemporaries, LayerLabel(layer, "fake.dx"));
    ctx.k.SmallWeightGrad(7, LayerLabel(layer, "fake.wgrad"), LayerLabel(layer, "fake.weight"));
    ctx.em.Free(static_cast<FakeSaved&>(saved).kept);
    if (free_x) ctx.em.Free(x);
    if (free_dy) ctx.em.Free(dy);
    return dx;
  }
};

TEST_CASE("a layer of one fake module: what it saves is what each layer keeps",
          "[workload][seams]") {
  BuildParts parts;
  parts.layer = [] {
    std::vector<std::unique_ptr<LayerModule>> m;
    m.push_back(std::make_unique<FakeModule>());
    return DecoderLayer(std::move(m));
  };
  const Program p = BuildWith(Tiny(), 0, parts);
  // Each layer's forward keeps 1000 bytes saved plus its 10-byte output (the next layer's
  // input, freed by that layer's backward).
  CHECK(testing::LayerSavedBytes(p, 1, 0, 0) == 1000 + 10);
  CHECK(testing::LayerSavedBytes(p, 1, 0, 1) == 1000 + 10);
  // Every allocation of the iteration but the optimizer state and the cached objects is freed
  // again: no activation outlives the iteration.
  const std::map<Category, Bytes> net = testing::NetByCategory(p, 1);
  CHECK(net.count(Category::kActivations) == 0);
  CHECK(net.count(Category::kTemporaries) == 0);
  // The fake parameters are the model's layer parameters, one per layer.
  int fakes = 0;
  for (const Op& op : p.ops) {
    for (const TensorAlloc& a : op.allocs) {
      fakes +=
          a.category == Category::kParameters && a.label.find("fake.weight") != std::string::npos;
    }
  }
  CHECK(fakes == 2);
}

}  // namespace
}  // namespace memsim::workload
