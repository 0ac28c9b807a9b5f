// ModuleHarness: runs one workload module (modules/*.h: attention, MLP, MoE, embedding, a
// Transformers decoder module) forward and backward on its own, without a Program of a whole
// rank, and keeps a ledger of every tensor the module allocates and frees, so that a test can
// assert what the module makes, what it saves for backward (alive after forward) and that its
// backward frees it all, by label and bytes.
//
// What it models: the context a StageRunner gives a module (stage_runner.h): iteration 1,
// micro-batch 0, the forward's autocast region closed at its end, backward on the autograd
// thread. What it does not: the layer around the module (its input comes from the harness, its
// output and input grad are released by the harness), pipeline exchanges, the optimizer.
//
// Ownership: the harness owns the Setup copy, the ModelDims, the Emitter (writing to the
// harness's own OpSink, the ledger), the Kernels, the ModuleContext and the RecordingWrapper that
// stands in for the data-parallel wrapper (the Kernels' GradSink). All of them are built in one
// place, the constructor, from a config::Setup through workload::ComputeDims. Tensors the harness
// makes itself (a module's input, the gradient of its output) are allocated in ops named
// "harness.*" and are not the module's: the queries below leave them out.
// Sizes in bytes.
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "config/setup.h"
#include "workload/data_parallel.h"
#include "workload/emitter.h"
#include "workload/kernels.h"
#include "workload/model.h"
#include "workload/modules/module.h"
#include "workload/program.h"

namespace memsim::workload::testing {

// One tensor as the ledger saw it: its label and request size.
struct SeenTensor {
  std::string label;
  Bytes size_bytes = 0;
  bool operator==(const SeenTensor&) const = default;
};
std::ostream& operator<<(std::ostream& os, const SeenTensor& t);
using SeenTensors = std::vector<SeenTensor>;
Bytes TotalBytes(const SeenTensors& tensors);

// The data-parallel wrapper stand-in: records every gradient handed to autograd and frees it
// (as Megatron's DDP does once it is accumulated into main_grad), and every hook call, by name.
// Holds no buffers and shards nothing.
class RecordingWrapper final : public DataParallel {
 public:
  void Setup(Emitter& em, const std::vector<TensorId>& param_ids) override;
  std::vector<ShardSlice> OptimizerSlices() const override { return {}; }
  bool ShardsOptimizer() const override { return false; }
  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override;
  void BeforeForward(Emitter& em, GradSite site, int layer) override;
  void AfterForward(Emitter& em, GradSite site, int layer) override;
  void BeforeBackward(Emitter& em, GradSite site, int layer) override;
  void AfterBackward(Emitter& em, GradSite site, int layer) override;
  void EndOfBackward(Emitter& em) override;
  void AfterLastBackward(Emitter& em, int chunk) override;
  void FinishGradSync(Emitter& em) override;
  void ZeroGrad(Emitter& em) override;
  void AfterOptimizerStep(Emitter& em) override;
  WrapperSizes StaticSizes() const override { return {}; }

  // The gradients taken, in order: the parameter's name and the gradient's bytes.
  const SeenTensors& grads() const { return grads_; }
  // The hook calls, in order ("BeforeBackward layer0", "Setup 15", ...).
  const std::vector<std::string>& hooks() const { return hooks_; }

 private:
  SeenTensors grads_;
  std::vector<std::string> hooks_;
};

class ModuleHarness {
 public:
  static constexpr int kAnyLayer = -2;  // AliveDuring: an op of any layer (-1: of none)

  // Builds the dims, emitter, kernels and context of `setup` (the one place that does).
  // Selective recompute follows setup.training as Build does (recompute.h SelectiveModules).
  explicit ModuleHarness(const config::Setup& setup);
  ~ModuleHarness();
  ModuleHarness(const ModuleHarness&) = delete;
  ModuleHarness& operator=(const ModuleHarness&) = delete;

  const config::Setup& setup() const { return setup_; }
  const ModelDims& dims() const { return dims_; }
  const FrameworkFacts& facts() const { return facts_; }
  ModuleContext& ctx() { return ctx_; }
  Emitter& em() { return em_; }
  Kernels& kernels() { return kernels_; }
  RecordingWrapper& wrapper() { return wrapper_; }

  // --- One layer module (module.h) -------------------------------------------------------
  // Forward of `module` as layer `layer` on a fresh input x, the residual stream
  // [s/σ, b, h] in wide_bytes, then the end of the forward step's autocast region.
  void Forward(LayerModule& module, int layer = 0, const ForwardMode& mode = {});
  // Its backward on a fresh gradient of the output (the output's size), freeing x and dy as a
  // layer's backward does (free_x, free_dy); then the harness releases the output and the
  // returned input gradient, so that only what the module leaked or keeps for the run (the
  // Kernels' workspaces) stays alive. REQUIRES: a Forward with grad before.
  void Backward();
  // The module's tensors alive after Forward, less its output and the workspaces: what it
  // saved for backward, in allocation order.
  SeenTensors Saved() const;

  // --- Any part (the embedding, a stage runner) ------------------------------------------
  // Runs `body` in `phase` (kForward or kBackward, iteration 1, micro-batch 0; backward on
  // the autograd thread), then closes the forward's autocast region and the last open op, so
  // the ledger has seen everything `body` emitted.
  void Run(Phase phase, const std::function<void(ModuleContext&)>& body);
  // Closes the emitter's open op, so the ledger has seen everything emitted so far (for parts
  // that set their own context, such as a training loop).
  void Close();
  // A tensor the harness makes (an input to a part, an output gradient), in an op of its own.
  TensorId MakeTensor(Bytes size_bytes, const std::string& label,
                      Category category = Category::kActivations);
  // Frees tensors as the part's caller would (its output, its returned grad), in an op of its
  // own.
  void Release(std::initializer_list<TensorId> ids);

  // --- The ledger ------------------------------------------------------------------------
  // Module tensors allocated and not freed, in allocation order; of one category, or all.
  SeenTensors Alive() const;
  SeenTensors Alive(Category category) const;
  // Module tensors allocated in ops of `phase`, freed or not, in allocation order.
  SeenTensors Allocated(Phase phase) const;
  // Alive tensors outside the workspace category: after Backward, what the module leaked.
  SeenTensors Leaked() const;
  // The op whose end freed the first module tensor labelled `label`; "" while it is alive or
  // when there is none.
  std::string FreedIn(const std::string& label) const;
  // Module tensors (workspaces left out) alive while the first op named `op` runs: allocated at
  // its start or before, not freed by an op that closed before it; in allocation order. Empty
  // when no op has that name.
  SeenTensors AliveDuring(const std::string& op) const;
  // The same for the first op named `op` of layer `layer`.
  SeenTensors AliveDuring(const std::string& op, int layer) const;
  // Frees of a tensor never allocated or already freed, one line each; empty when sound.
  const std::vector<std::string>& problems() const;
  // Every op the emitter closed, in issue order.
  const std::vector<Op>& ops() const;

 private:
  class Ledger;
  TensorId FreshHidden(const std::string& label);

  const config::Setup setup_;
  const ModelDims dims_;
  const FrameworkFacts facts_;
  std::unique_ptr<Ledger> ledger_;  // the Emitter's sink
  Emitter em_;
  RecordingWrapper wrapper_;
  Kernels kernels_;
  ModuleContext ctx_;
  // The layer module run by Forward, for Backward.
  LayerModule* module_ = nullptr;
  int layer_ = 0;
  TensorId x_ = 0, y_ = 0;
  std::unique_ptr<ModuleSaved> saved_;
};

}  // namespace memsim::workload::testing
