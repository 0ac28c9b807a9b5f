// The "hf-trainer" stack (config/stack.h): the Hugging Face Trainer (transformers/trainer.py
// _inner_training_loop: forward, loss.backward, optimizer.step every gradient_accumulation_steps
// micro-batches, the evaluation pass every eval_steps) over Transformers' own modelling code, with
// PEFT's LoRA / QLoRA. Its training block holds TrainingArguments names (config/hf_trainer.h);
// the loop, wrappers and element sizes are plain PyTorch's (PyTorchLoopStack), plus autocast's
// wide tensors of encoder models; with `deepspeed` (a ZeRO-1 / ZeRO-2 ds_config) DeepSpeed's
// engine and ZeRO optimizer (workload/deepspeed_zero.cc) replace DDP and the plain step.
#include "config/hf_trainer.h"
#include "config/reader.h"
#include "stacks/stacks.h"
#include "workload/data_parallel.h"
#include "workload/facts.h"
#include "workload/hf_peft.h"
#include "workload/model.h"

namespace memsim::stacks {
namespace {

class HfTrainerStack final : public PyTorchLoopStack {
 public:
  std::string_view Name() const override { return "hf-trainer"; }
  const config::StackTraits& Traits() const override {
    static const config::StackTraits traits{.label = "HF Trainer",
                                            .transformers_modelling = true,
                                            .training_arguments_keys = true,
                                            .encoder_models = true,
                                            .plain_pytorch_step = true,
                                            .adam_label = "AdamW"};
    return traits;
  }
  // The whole block: its keys do not depend on the model (the model file is taken as it is).
  void ReadBeforeModel(config::internal::ObjectReader& t, const config::internal::Document& config,
                       config::Setup* s, config::internal::HfTrainerExtras* extras) const override {
    s->training = config::internal::ReadHfTrainer(t, config, &s->notes, &s->warnings, extras);
  }
  // reduce_bucket_size and the stage-3 sizes "auto" need the model's hidden_size (config/hf_trainer.h).
  void ReadAfterModel(config::internal::ObjectReader& t, config::internal::LocatedModel* model,
                      config::Setup* s) const override {
    config::HfTrainerOptions& hf = *s->training.hf_trainer();
    if (hf.deepspeed) {
      config::internal::ResolveDeepSpeedAuto(model->model.hidden_size, t.At("deepspeed"),
                                             &*hf.deepspeed, &s->notes);
    }
  }

  // Under DeepSpeed (engine.py _configure_distributed_model) the engine casts the module to
  // the ds_config's bf16 / fp16 (else it keeps torch_dtype) and accelerate runs no autocast
  // (Accelerator.__init__ sets native_amp only outside DistributedType.DEEPSPEED): parameters,
  // gradients and activations in one dtype; the ZeRO optimizer keeps fp32 main weights (mixed).
  void SetElementSizes(const config::TrainingConfig& c, workload::ModelDims* d) const override {
    PyTorchLoopStack::SetElementSizes(c, d);
    if (config::HfTrainerOf(c).deepspeed) {
      d->param_bytes = c.precision != config::Precision::kFp32 ? 2 : d->param_bytes;
      d->act_bytes = d->param_bytes;
      d->grad_bytes = d->param_bytes;
      d->wide_bytes = d->param_bytes;
      d->weight_cast = false;
      d->cast_inputs = false;
      d->mixed = true;
      return;
    }
    if (d->weight_cast) {
      d->wide_bytes = d->param_bytes;
      d->cast_inputs = true;
    }
    // peft prepare_model_for_kbit_training's fp32 norms / embedding make the decoder's residual
    // stream fp32 under 16-bit autocast (workload/hf_peft.h KbitWideResidual).
    if (workload::KbitWideResidual(c)) {
      d->wide_bytes = 4;
      d->cast_inputs = true;
    }
  }
  // DeepSpeed ZeRO-1 / ZeRO-2 when the block names a ds_config, else plain PyTorch's.
  config::DataParallelWrapper Wrapper(const config::TrainingConfig& c) const override {
    if (const auto& ds = config::HfTrainerOf(c).deepspeed) return *ds;
    return PyTorchLoopStack::Wrapper(c);
  }
  std::unique_ptr<workload::DataParallel> NewDataParallel(
      const config::Setup& setup, int rank, const workload::ModelDims& d,
      const workload::RankParams& params) const override {
    if (const auto& ds = config::HfTrainerOf(setup.training).deepspeed) {
      return workload::NewDeepSpeedZero(d, params, *ds);
    }
    return PyTorchLoopStack::NewDataParallel(setup, rank, d, params);
  }

  void SetFacts(const config::Setup& setup, const workload::ModelDims& /*d*/,
                workload::FrameworkFacts* f) const override {
    f->hf = true;
    f->softmax_saves_input = config::HfTrainerOf(setup.training).softmax_saves_input;
    f->hf_loss_shift_copy = config::HfTrainerOf(setup.training).loss_shift_copy;
    // Trainer gradient_checkpointing: gradient_checkpointing_enable sets the decoder model's
    // gradient_checkpointing, which turns use_cache off in training (facts.h hf_kv_cache).
    f->hf_kv_cache = setup.training.recompute_granularity == config::RecomputeGranularity::kNone;
    f->zero_grad_after_step = true;  // Trainer._inner_training_loop (facts.h)
    f->hf_native_amp = setup.training.precision != config::Precision::kFp32 &&
                       !config::HfTrainerOf(setup.training).deepspeed;
  }
};

}  // namespace

std::unique_ptr<const config::Stack> NewHfTrainerStack() {
  return std::make_unique<HfTrainerStack>();
}

}  // namespace memsim::stacks
