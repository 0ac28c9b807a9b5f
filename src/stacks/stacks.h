// Internal to src/stacks/: the constructors of memsim's own stacks (config/stack.h), one file
// each, and the pieces the two PyTorch-loop stacks share. builtin.cc lists them.
#pragma once

#include <memory>
#include <vector>

#include "config/reader.h"
#include "config/stack.h"
#include "config/training.h"

namespace memsim::stacks {

// Megatron-core (megatron.cc): Megatron-LM's train_step over its DDP, distributed optimizer or
// Megatron-FSDP.
std::unique_ptr<const config::Stack> NewMegatronStack();
// Plain PyTorch on one device or under DistributedDataParallel (pytorch.cc).
std::unique_ptr<const config::Stack> NewPyTorchStack();
// The Hugging Face Trainer with PEFT (hf_trainer.cc).
std::unique_ptr<const config::Stack> NewHfTrainerStack();
// torchtitan's trainer over PyTorch FSDP2 (torchtitan.cc).
std::unique_ptr<const config::Stack> NewTorchtitanStack();

// The reading of a stack whose training block holds Megatron-LM's argument names
// (config/training.h), under `kReader`'s rules: the keys checked before the model is read, the
// architecture keys and the block after. Base is config::Stack or a shared stack base.
template <config::internal::BlockReader kReader, class Base = config::Stack>
class MegatronNamedBlockStack : public Base {
 public:
  void ReadBeforeModel(config::internal::ObjectReader& t,
                       const config::internal::Document& /*config*/, config::Setup* /*s*/,
                       config::internal::HfTrainerExtras* /*extras*/) const override {
    config::internal::CheckMegatronNamedKeys(t, this->Name(), kReader);
  }
  void ReadAfterModel(config::internal::ObjectReader& t, config::internal::LocatedModel* model,
                      config::Setup* s) const override {
    config::internal::ReadMegatronNamedBlock(t, model, this->Name(), kReader, s);
  }
};

// What a plain PyTorch loop's stacks share (pytorch.cc): the base for "pytorch" and
// "hf-trainer", which differ in how they read the block and in the modelling code.
class PyTorchLoopStack : public config::Stack {
 public:
  // Parameters and their .grad in torch_dtype, activations in the autocast dtype (precision;
  // fp32 = no autocast, everything in the weights' dtype), no main parameters.
  void SetElementSizes(const config::TrainingConfig& c, workload::ModelDims* d) const override;
  // SingleDevice on one device, TorchDdp over data_parallel_size > 1.
  config::DataParallelWrapper Wrapper(const config::TrainingConfig& c) const override;
  std::unique_ptr<workload::DataParallel> NewDataParallel(
      const config::Setup& setup, int rank, const workload::ModelDims& d,
      const workload::RankParams& params) const override;
  // None: DDP's buckets are flat tensors of their own (torch_ddp.h), not one buffer.
  std::vector<workload::GradBuffer> LayoutGradBuffers(
      const config::Setup& setup, int rank, const workload::ModelDims& d,
      const std::vector<workload::ParamTensor>& params) const override;
  // torch.optim over model.parameters(): one group of the parameters with requires_grad
  // (Trainer.create_optimizer skips frozen ones).
  std::vector<std::vector<int>> ParamGroups(
      const std::vector<workload::ParamTensor>& params) const override;
  std::unique_ptr<workload::TrainingLoop> NewTrainingLoop(
      const workload::LoopParts& parts) const override;
};

}  // namespace memsim::stacks
