// No data-parallel wrapper: plain PyTorch on one device (framework "pytorch").
// - Autograd creates each parameter's gradient in the first backward that reaches it:
//   AccumulateGrad adopts the incoming gradient tensor as .grad when .grad is None (no copy;
//   torch/csrc/autograd/functions/accumulate_grad.h accumulateGrad); later micro-batches of the
//   same iteration add into it in place (`grad += new`), so their gradient tensors are
//   transient.
// - optimizer.zero_grad() at the start of each iteration: with set_to_none=True (the default
//   since PyTorch 2.0, torch/optim/optimizer.py Optimizer.zero_grad) every .grad is freed and
//   made again in the next backward; with set_to_none=False the gradients are zeroed in place
//   and kept.
// - The optimizer (torch.optim) updates whole parameters; nothing is sharded or communicated.
#include <map>

#include "workload/data_parallel.h"

namespace memsim::workload {
namespace {

class SingleDeviceWrapper final : public DataParallel {
 public:
  SingleDeviceWrapper(const ModelDims& d, const RankParams& params, bool set_to_none)
      : d_(d), params_(params), set_to_none_(set_to_none) {}

  void Setup(Emitter& /*em*/, const std::vector<TensorId>& /*param_ids*/) override {}
  std::vector<ShardSlice> OptimizerSlices() const override { return params_.Whole(); }
  bool ShardsOptimizer() const override { return false; }

  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override {
    TensorId& held = grads_[param];
    if (held == 0) {
      held = grad;  // adopted as .grad
    } else {
      em.Free(grad);  // accumulated in place into .grad
    }
  }
  void ZeroGrad(Emitter& em) override {
    if (!set_to_none_) return;
    for (auto& [param, id] : grads_) {
      em.Free(id);
      id = 0;
    }
  }

  WrapperSizes StaticSizes() const override {
    WrapperSizes s;
    for (const ParamTensor& pt : params_.params) {
      const Bytes bytes = pt.storage_bytes > 0 ? pt.storage_bytes : pt.numel * d_.param_bytes;
      s.parameter_bytes += bytes;
      // The .grad tensors after a backward; none for a frozen (PEFT) parameter; an adapter's
      // grad has the adapter's dtype.
      if (!pt.frozen) s.gradient_bytes += pt.storage_bytes > 0 ? bytes : pt.numel * d_.grad_bytes;
    }
    return s;
  }

 private:
  const ModelDims& d_;
  const RankParams& params_;
  const bool set_to_none_;
  std::map<std::string, TensorId> grads_;  // .grad of each parameter (0 = None)
};

}  // namespace

std::unique_ptr<DataParallel> NewSingleDevice(const ModelDims& d, const RankParams& params,
                                              const config::SingleDevice& single) {
  return std::make_unique<SingleDeviceWrapper>(d, params, single.zero_grad_set_to_none);
}

}  // namespace memsim::workload
