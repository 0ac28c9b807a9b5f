#include "workload/module_harness.h"

#include <algorithm>

#include <fmt/format.h>

#include <string_view>
#include <utility>

#include "core/check.h"
#include "workload/recompute.h"

namespace memsim::workload::testing {
namespace {

constexpr std::string_view kHarnessOp = "harness.";

std::string SiteName(GradSite site, int layer) {
  return site == GradSite::kHead        ? "head"
         : site == GradSite::kEmbedding ? "embedding"
                                        : "layer" + std::to_string(layer);
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const SeenTensor& t) {
  return os << t.label << " " << t.size_bytes << " B";
}

Bytes TotalBytes(const SeenTensors& tensors) {
  Bytes sum = 0;
  for (const SeenTensor& t : tensors) sum += t.size_bytes;
  return sum;
}

// ---------------------------------------------------------------------------------------------
void RecordingWrapper::Setup(Emitter& /*em*/, const std::vector<TensorId>& param_ids) {
  hooks_.push_back(fmt::format("Setup {}", param_ids.size()));
}
void RecordingWrapper::TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) {
  grads_.push_back({param, em.SizeOf(grad)});
  em.Free(grad);
}
void RecordingWrapper::BeforeForward(Emitter& /*em*/, GradSite site, int layer) {
  hooks_.push_back("BeforeForward " + SiteName(site, layer));
}
void RecordingWrapper::AfterForward(Emitter& /*em*/, GradSite site, int layer) {
  hooks_.push_back("AfterForward " + SiteName(site, layer));
}
void RecordingWrapper::BeforeBackward(Emitter& /*em*/, GradSite site, int layer) {
  hooks_.push_back("BeforeBackward " + SiteName(site, layer));
}
void RecordingWrapper::AfterBackward(Emitter& /*em*/, GradSite site, int layer) {
  hooks_.push_back("AfterBackward " + SiteName(site, layer));
}
void RecordingWrapper::EndOfBackward(Emitter& /*em*/) { hooks_.push_back("EndOfBackward"); }
void RecordingWrapper::AfterLastBackward(Emitter& /*em*/, int chunk) {
  hooks_.push_back(fmt::format("AfterLastBackward {}", chunk));
}
void RecordingWrapper::FinishGradSync(Emitter& /*em*/) { hooks_.push_back("FinishGradSync"); }
void RecordingWrapper::ZeroGrad(Emitter& /*em*/) { hooks_.push_back("ZeroGrad"); }
void RecordingWrapper::AfterOptimizerStep(Emitter& /*em*/) {
  hooks_.push_back("AfterOptimizerStep");
}

// ---------------------------------------------------------------------------------------------
// The Emitter's sink: keeps every op and the life of every tensor.
class ModuleHarness::Ledger final : public OpSink {
 public:
  struct Entry {
    SeenTensor tensor;
    Category category = Category::kOther;
    Phase phase = Phase::kInit;
    bool harness = false;  // made by the harness, not by the module
    bool alive = true;
    std::size_t made_in = 0;                 // index in ops_ of the op that allocated it
    std::size_t freed_in = kNotFreed;        // index in ops_ of the op whose end freed it
  };
  static constexpr std::size_t kNotFreed = static_cast<std::size_t>(-1);

  void OnOp(Op&& op) override {
    const bool harness = op.name.rfind(kHarnessOp, 0) == 0;
    for (const TensorAlloc& a : op.allocs) {
      index_[a.id] = entries_.size();
      entries_.push_back({{a.label, a.size_bytes}, a.category, op.phase, harness, true,
                          ops_.size(), kNotFreed});
    }
    for (TensorId id : op.frees) {
      const auto it = index_.find(id);
      if (it == index_.end()) {
        problems_.push_back(fmt::format("op {} frees tensor {}, never allocated", op.name, id));
      } else if (!entries_[it->second].alive) {
        problems_.push_back(
            fmt::format("op {} frees {} again", op.name, entries_[it->second].tensor.label));
      } else {
        entries_[it->second].alive = false;
        entries_[it->second].freed_in = ops_.size();
      }
    }
    ops_.push_back(std::move(op));
  }

  // Module tensors matching `keep`, in allocation order.
  template <typename Pred>
  SeenTensors Select(Pred keep) const {
    SeenTensors out;
    for (const Entry& e : entries_) {
      if (!e.harness && keep(e)) out.push_back(e.tensor);
    }
    return out;
  }
  const Entry& At(TensorId id) const { return entries_.at(index_.at(id)); }

  const std::vector<std::string>& problems() const { return problems_; }
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<Entry> entries_;             // by allocation order
  std::map<TensorId, std::size_t> index_;  // tensor id -> entries_ index
  std::vector<std::string> problems_;
  std::vector<Op> ops_;
};

// The one place that builds ModelDims, FrameworkFacts, Kernels and ModuleContext from a Setup: the composition
// root does the same for a whole rank (build.cc Generate).
ModuleHarness::ModuleHarness(const config::Setup& setup)
    : setup_(setup),
      dims_(ComputeDims(setup_)),
      facts_(ComputeFacts(setup_, dims_)),
      ledger_(std::make_unique<Ledger>()),
      em_(setup_, /*pipeline_rank=*/0, /*num_iterations=*/1, ledger_.get()),
      kernels_(em_, dims_, facts_, wrapper_),
      ctx_{setup_.model, dims_,   facts_,
           em_,          kernels_, SelectiveModules(setup_.training, facts_.te),
           nullptr} {}

ModuleHarness::~ModuleHarness() = default;

TensorId ModuleHarness::MakeTensor(Bytes size_bytes, const std::string& label, Category category) {
  em_.Begin(std::string(kHarnessOp) + "make");
  return em_.Alloc(size_bytes, category, label);
}

void ModuleHarness::Release(std::initializer_list<TensorId> ids) {
  em_.Begin(std::string(kHarnessOp) + "release");
  for (TensorId id : ids) em_.Free(id);
  Close();
}

TensorId ModuleHarness::FreshHidden(const std::string& label) {
  // The residual stream between modules: [s/σ, b, h] in wide_bytes (residual.h BiasDropoutAdd).
  return MakeTensor(dims_.wide_bytes * dims_.T * dims_.h / dims_.sigma, label);
}

void ModuleHarness::Run(Phase phase, const std::function<void(ModuleContext&)>& body) {
  MEMSIM_CHECK(phase == Phase::kForward || phase == Phase::kBackward);
  em_.SetContext(/*iteration=*/1, phase, /*micro_batch=*/0);
  // StageRunner::Backward: backward_step's autograd run is on the autograd engine's thread.
  kernels_.SetAutogradThread(phase == Phase::kBackward);
  body(ctx_);
  kernels_.SetAutogradThread(false);
  // StageRunner::Forward: the forward step's autocast region ends with it.
  if (phase == Phase::kForward) kernels_.EndAutocastRegion();
  Close();
}

void ModuleHarness::Close() { em_.Begin(std::string(kHarnessOp) + "closed"); }

void ModuleHarness::Forward(LayerModule& module, int layer, const ForwardMode& mode) {
  module_ = &module;
  layer_ = layer;
  saved_.reset();
  x_ = FreshHidden("harness.input");
  Run(Phase::kForward,
      [&](ModuleContext& ctx) { y_ = module.Forward(ctx, layer, x_, mode, &saved_); });
}

void ModuleHarness::Backward() {
  MEMSIM_CHECK(module_ != nullptr && saved_ != nullptr);
  const TensorId dy = MakeTensor(em_.SizeOf(y_), "harness.output_grad");
  TensorId dx = 0;
  Run(Phase::kBackward, [&](ModuleContext& ctx) {
    dx = module_->Backward(ctx, layer_, *saved_, x_, /*free_x=*/true, dy, /*free_dy=*/true);
  });
  Release({y_, dx});
  y_ = 0;
  saved_.reset();
  module_ = nullptr;
}

SeenTensors ModuleHarness::Saved() const {
  const Ledger::Entry* out = y_ != 0 ? &ledger_->At(y_) : nullptr;
  return ledger_->Select([out](const Ledger::Entry& e) {
    return e.alive && e.category != Category::kWorkspace && &e != out;
  });
}

SeenTensors ModuleHarness::Alive() const {
  return ledger_->Select([](const Ledger::Entry& e) { return e.alive; });
}

SeenTensors ModuleHarness::Alive(Category category) const {
  return ledger_->Select(
      [category](const Ledger::Entry& e) { return e.alive && e.category == category; });
}

SeenTensors ModuleHarness::Allocated(Phase phase) const {
  return ledger_->Select([phase](const Ledger::Entry& e) { return e.phase == phase; });
}

SeenTensors ModuleHarness::Leaked() const {
  return ledger_->Select(
      [](const Ledger::Entry& e) { return e.alive && e.category != Category::kWorkspace; });
}

std::string ModuleHarness::FreedIn(const std::string& label) const {
  std::string op;
  ledger_->Select([&](const Ledger::Entry& e) {
    if (op.empty() && e.tensor.label == label && !e.alive) op = ledger_->ops()[e.freed_in].name;
    return false;
  });
  return op;
}

SeenTensors ModuleHarness::AliveDuring(const std::string& op) const {
  return AliveDuring(op, kAnyLayer);
}

SeenTensors ModuleHarness::AliveDuring(const std::string& op, int layer) const {
  const std::vector<Op>& ops = ledger_->ops();
  const auto it = std::find_if(ops.begin(), ops.end(), [&](const Op& o) {
    return o.name == op && (layer == kAnyLayer || o.layer == layer);
  });
  if (it == ops.end()) return {};
  const auto k = static_cast<std::size_t>(it - ops.begin());
  return ledger_->Select([k](const Ledger::Entry& e) {
    return e.category != Category::kWorkspace && e.made_in <= k &&
           (e.freed_in == Ledger::kNotFreed || e.freed_in >= k);
  });
}

const std::vector<std::string>& ModuleHarness::problems() const { return ledger_->problems(); }
const std::vector<Op>& ModuleHarness::ops() const { return ledger_->ops(); }

}  // namespace memsim::workload::testing
