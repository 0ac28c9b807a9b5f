// The seams of the workload generator (data_parallel.h, modules/module.h), exercised with small
// fakes: a data-parallel wrapper that records its hook calls in order, and a transformer layer
// made of one fake module. The coming stacks (ZeRO, FSDP2) are tested the same way.
#include <algorithm>
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

// Records every hook call; frees gradients as DDP does. A forward hook called in the backward
// phase (full recompute's re-forward) is recorded as "Reforward" / "Reforwarded".
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
  void BeforeForward(Emitter& em, GradSite site, int layer) override {
    log_->push_back((Recomputing(em) ? "Reforward " : "Forward ") + Site(site, layer));
  }
  void AfterForward(Emitter& em, GradSite site, int layer) override {
    log_->push_back((Recomputing(em) ? "Reforwarded " : "Forwarded ") + Site(site, layer));
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
  static bool Recomputing(const Emitter& em) { return em.phase() == Phase::kBackward; }
  static std::string Site(GradSite site, int layer) {
    return site == GradSite::kHead        ? "head"
           : site == GradSite::kEmbedding ? "embedding"
                                          : "layer" + std::to_string(layer);
  }
  std::vector<std::string>* log_;
};

// The hook calls of one iteration of Tiny() (one micro-batch, no pipeline) with a
// RecordingWrapper; `reforward`: what full recompute adds between the head's backward and the
// layers' (a run over both layers is re-run as a whole before its backward).
std::vector<std::string> TinyHookOrder(const std::vector<std::string>& reforward) {
  // Parameters: embedding 1, 2 layers x 6 (ln1, qkv, proj, ln2, fc1, fc2), final norm, output.
  std::vector<std::string> order = {
      "Setup 15", "ZeroGrad",
      // Forward from the embedding through the layers to the head.
      "Forward embedding", "Forwarded embedding", "Forward layer0", "Forwarded layer0",
      "Forward layer1", "Forwarded layer1", "Forward head", "Forwarded head",
      // Backward runs from the loss to the embedding; each site's grads between its hooks.
      "Before head", "Grad output_layer.weight", "Grad final_norm.weight", "After head"};
  order.insert(order.end(), reforward.begin(), reforward.end());
  order.insert(order.end(), {
      "Before layer1", "Grad layer1.mlp.fc2.weight", "Grad layer1.mlp.fc1.weight",
      "Grad layer1.ln2.weight", "Grad layer1.attn.proj.weight", "Grad layer1.attn.qkv.weight",
      "Grad layer1.ln1.weight", "After layer1", "Before layer0", "Grad layer0.mlp.fc2.weight",
      "Grad layer0.mlp.fc1.weight", "Grad layer0.ln2.weight", "Grad layer0.attn.proj.weight",
      "Grad layer0.attn.qkv.weight", "Grad layer0.ln1.weight", "After layer0", "Before embedding",
      "Grad embedding.word_embeddings.weight", "After embedding", "EndOfBackward",
      "AfterLastBackward 0", "FinishGradSync", "AfterOptimizerStep"});
  return order;
}

// A wrapper that records its hook calls into `log`.
BuildParts Recording(std::vector<std::string>* log) {
  BuildParts parts;
  parts.data_parallel = [log](const ModelDims&, const RankParams&) {
    return std::make_unique<RecordingWrapper>(log);
  };
  return parts;
}

TEST_CASE("the data-parallel wrapper's hooks run where Megatron's wrapper acts, in order",
          "[workload][seams]") {
  std::vector<std::string> log;
  // The fused-wgrad dummies of TE layers go to no hook (TE caches them); fusion off, every
  // weight grad reaches the wrapper.
  config::Setup s = Tiny();
  s.training.gradient_accumulation_fusion = false;
  BuildWith(s, 0, Recording(&log));
  CHECK(log == TinyHookOrder({}));
}

TEST_CASE("full recompute's re-forward calls the wrapper's forward hooks around each re-run layer",
          "[workload][seams]") {
  // torch.utils.checkpoint re-runs the checkpointed layers as modules in backward, so their
  // forward pre / post hooks (where FSDP or ZeRO-3 gather and release parameters) fire again:
  // one run of both layers (uniform, recompute_num_layers 2) is re-run layer by layer, in
  // forward order, after the head's backward and before layer 1's backward hooks. The first
  // forward (under no_grad) calls the hooks as without recompute.
  std::vector<std::string> log;
  config::Setup s = Tiny();
  s.training.gradient_accumulation_fusion = false;
  s.training.recompute_granularity = config::RecomputeGranularity::kFull;
  s.training.recompute_method = config::RecomputeMethod::kUniform;
  s.training.recompute_num_layers = 2;
  BuildWith(s, 0, Recording(&log));
  CHECK(log == TinyHookOrder({"Reforward layer0", "Reforwarded layer0", "Reforward layer1",
                              "Reforwarded layer1"}));

  // recompute_num_layers 1: two runs of one layer, each re-run just before its own backward,
  // the last layer's first.
  log.clear();
  s.training.recompute_num_layers = 1;
  BuildWith(s, 0, Recording(&log));
  const auto at = [&log](const std::string& entry) {
    return std::find(log.begin(), log.end(), entry) - log.begin();
  };
  CHECK(at("After head") + 1 == at("Reforward layer1"));
  CHECK(at("Reforward layer1") + 1 == at("Reforwarded layer1"));
  CHECK(at("Reforwarded layer1") + 1 == at("Before layer1"));
  CHECK(at("After layer1") + 1 == at("Reforward layer0"));
  CHECK(at("Reforward layer0") + 1 == at("Reforwarded layer0"));
  CHECK(at("Reforwarded layer0") + 1 == at("Before layer0"));
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
