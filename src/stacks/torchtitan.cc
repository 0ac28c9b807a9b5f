// The "torchtitan" stack (config/stack.h): torchtitan's trainer (torchtitan/train.py
// Trainer.train_step: zero_grad, forward and backward of each micro-batch, clip_grad_norm_,
// optimizer.step) over PyTorch FSDP2 (workload/fsdp2.cc) when the shard degree is above one, at
// torchtitan commit 31a17bfdb70bab6f62a13d21816a5339b911d6e3. Its training block holds the
// Megatron-named keys plain PyTorch reads (config/training.h BlockReader::kPlainPyTorch:
// data_parallel_size = [parallelism] data_parallel_shard_degree, precision =
// [training] mixed_precision_param, torch_dtype = [training] dtype) and two of its own:
// reshard_after_forward and mixed_precision_reduce. docs/config.md, 'torchtitan'.
// Element sizes (torchtitan/models/llama3/infra/parallelize.py apply_fsdp and
// torchtitan/distributed/utils.py maybe_enable_amp): under FSDP the weights stay in torch_dtype
// (fp32), fully_shard's MixedPrecisionPolicy gathers them in param_dtype and autocast is off;
// on one device (no fully_shard) torch.autocast runs the model in param_dtype over fp32 weights,
// as plain PyTorch does.
#include <fmt/format.h>

#include "config/reader.h"
#include "config/training.h"
#include "stacks/stacks.h"
#include "workload/data_parallel.h"
#include "workload/model.h"

namespace memsim::stacks {
namespace {

using config::internal::BlockReader;

bool Sharded(const config::TrainingConfig& c) { return c.data_parallel_size > 1; }

class TorchtitanStack final : public PyTorchLoopStack {
 public:
  std::string_view Name() const override { return "torchtitan"; }
  const config::StackTraits& Traits() const override {
    static const config::StackTraits traits{
        .label = "torchtitan", .plain_pytorch_step = true, .adam_label = "AdamW"};
    return traits;
  }

  void ReadBeforeModel(config::internal::ObjectReader& t,
                       const config::internal::Document& /*config*/, config::Setup* /*s*/,
                       config::internal::HfTrainerExtras* /*extras*/) const override {
    config::internal::CheckMegatronNamedKeys(t, Name(), BlockReader::kPlainPyTorch,
                                             {"reshard_after_forward", "mixed_precision_reduce"});
  }
  void ReadAfterModel(config::internal::ObjectReader& t, config::internal::LocatedModel* model,
                      config::Setup* s) const override;

  void SetElementSizes(const config::TrainingConfig& c, workload::ModelDims* d) const override {
    PyTorchLoopStack::SetElementSizes(c, d);
    if (!Sharded(c)) return;
    // fully_shard gathers param_dtype copies; its fp32 shards are the optimizer's weights.
    d->param_bytes = d->act_bytes;
    d->grad_bytes = d->act_bytes;
    d->wide_bytes = d->act_bytes;
    d->weight_cast = false;
    d->mixed = d->act_bytes != 4;
  }
  config::DataParallelWrapper Wrapper(const config::TrainingConfig& c) const override {
    if (!Sharded(c)) return config::SingleDevice{config::PyTorchOf(c).zero_grad_set_to_none};
    const auto& titan = std::get<config::TorchtitanOptions>(c.stack);
    return config::TorchFsdp2{titan.reduce_dtype, titan.reshard_after_forward, 0,
                              titan.zero_grad_set_to_none};
  }
  std::unique_ptr<workload::DataParallel> NewDataParallel(
      const config::Setup& setup, int /*rank*/, const workload::ModelDims& d,
      const workload::RankParams& params) const override {
    const config::DataParallelWrapper w = Wrapper(setup.training);
    if (const auto* fsdp = std::get_if<config::TorchFsdp2>(&w)) {
      return workload::NewTorchFsdp2(d, params, *fsdp);
    }
    return workload::NewSingleDevice(d, params, std::get<config::SingleDevice>(w));
  }
};

void TorchtitanStack::ReadAfterModel(config::internal::ObjectReader& t,
                                     config::internal::LocatedModel* model,
                                     config::Setup* s) const {
  config::internal::ReadMegatronNamedBlock(t, model, Name(), BlockReader::kPlainPyTorch, s);
  config::TorchtitanOptions titan;
  static_cast<config::PyTorchOptions&>(titan) = config::PyTorchOf(s->training);
  titan.reshard_after_forward = t.Bool("reshard_after_forward").value_or(true);
  if (std::optional<std::string> r = t.Choice("mixed_precision_reduce", {"float32", "bfloat16"})) {
    titan.reduce_dtype = *r == "bfloat16" ? config::Precision::kBf16 : config::Precision::kFp32;
  }
  s->training.stack = titan;
  if (!Sharded(s->training)) {
    for (const char* key : {"reshard_after_forward", "mixed_precision_reduce"}) {
      if (!t.Has(key)) continue;
      s->warnings.push_back(
          fmt::format("{}: not used on one device (torchtitan applies fully_shard only when "
                      "data_parallel_shard_degree > 1)",
                      t.At(key)));
    }
  }
}

}  // namespace

std::unique_ptr<const config::Stack> NewTorchtitanStack() {
  return std::make_unique<TorchtitanStack>();
}

}  // namespace memsim::stacks
