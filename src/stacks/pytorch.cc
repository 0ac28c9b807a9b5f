// The "pytorch" stack (config/stack.h): a plain PyTorch training loop (optimizer.zero_grad,
// forward and backward of each micro-batch, a torch.optim step) on one device or under
// torch.nn.parallel.DistributedDataParallel, over a model in its own dtype with torch.autocast.
// Reads the Megatron-named training block with plain PyTorch's rules (config/training.h
// BlockReader::kPlainPyTorch). PyTorchLoopStack is the part "hf-trainer" shares.
#include "config/reader.h"
#include "config/training.h"
#include "stacks/stacks.h"
#include "workload/data_parallel.h"
#include "workload/model.h"
#include "workload/training_loop.h"

namespace memsim::stacks {

void PyTorchLoopStack::SetElementSizes(const config::TrainingConfig& tc,
                                       workload::ModelDims* d) const {
  auto bytes = [](config::Precision p) -> Bytes { return p == config::Precision::kFp32 ? 4 : 2; };
  // precision fp32 = no autocast: everything runs in the weights' dtype.
  const bool autocast = tc.precision != config::Precision::kFp32;
  const config::PyTorchOptions& torch = config::PyTorchOf(tc);
  d->param_bytes = bytes(torch.torch_dtype);
  d->act_bytes = autocast ? bytes(tc.precision) : d->param_bytes;
  d->weight_cast = autocast && tc.precision != torch.torch_dtype;
  d->grad_bytes = d->param_bytes;
  d->mixed = false;
  d->wide_bytes = d->act_bytes;
}

config::DataParallelWrapper PyTorchLoopStack::Wrapper(const config::TrainingConfig& c) const {
  const config::PyTorchOptions& torch = config::PyTorchOf(c);
  if (c.data_parallel_size > 1) {
    return config::TorchDdp{torch.zero_grad_set_to_none, torch.ddp_bucket_cap_mb,
                            torch.ddp_find_unused_parameters, torch.ddp_gradient_as_bucket_view};
  }
  return config::SingleDevice{torch.zero_grad_set_to_none};
}

std::unique_ptr<workload::DataParallel> PyTorchLoopStack::NewDataParallel(
    const config::Setup& setup, int /*rank*/, const workload::ModelDims& d,
    const workload::RankParams& params) const {
  const config::DataParallelWrapper w = Wrapper(setup.training);
  if (const auto* ddp = std::get_if<config::TorchDdp>(&w)) {
    return workload::NewTorchDdp(d, params, *ddp);
  }
  return workload::NewSingleDevice(d, params, std::get<config::SingleDevice>(w));
}

std::vector<workload::GradBuffer> PyTorchLoopStack::LayoutGradBuffers(
    const config::Setup& /*setup*/, int /*rank*/, const workload::ModelDims& /*d*/,
    const std::vector<workload::ParamTensor>& /*params*/) const {
  return {};
}

std::vector<std::vector<int>> PyTorchLoopStack::ParamGroups(
    const std::vector<workload::ParamTensor>& params) const {
  std::vector<std::vector<int>> groups(1);
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    if (!params[i].frozen) groups[0].push_back(i);
  }
  return groups;
}

std::unique_ptr<workload::TrainingLoop> PyTorchLoopStack::NewTrainingLoop(
    const workload::LoopParts& parts) const {
  return workload::NewPyTorchLoop(parts);
}

namespace {

// The block's Megatron architecture keys apply to the model as under "megatron".
class PyTorchStack final
    : public MegatronNamedBlockStack<config::internal::BlockReader::kPlainPyTorch,
                                     PyTorchLoopStack> {
 public:
  std::string_view Name() const override { return "pytorch"; }
  const config::StackTraits& Traits() const override {
    static const config::StackTraits traits{.label = "plain PyTorch",
                                            .encoder_models = true,
                                            .plain_pytorch_step = true,
                                            .adam_label = "AdamW"};
    return traits;
  }
};

}  // namespace

std::unique_ptr<const config::Stack> NewPyTorchStack() { return std::make_unique<PyTorchStack>(); }

}  // namespace memsim::stacks
