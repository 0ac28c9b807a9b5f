// The "hf-trainer" stack (config/stack.h): the Hugging Face Trainer (transformers/trainer.py
// _inner_training_loop: forward, loss.backward, optimizer.step every gradient_accumulation_steps
// micro-batches, the evaluation pass every eval_steps) over Transformers' own modelling code, with
// PEFT's LoRA / QLoRA. Its training block holds TrainingArguments names (config/hf_trainer.h);
// the loop, wrappers and element sizes are plain PyTorch's (PyTorchLoopStack), plus autocast's
// wide tensors of encoder models.
#include "config/hf_trainer.h"
#include "config/reader.h"
#include "stacks/stacks.h"
#include "workload/facts.h"
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
  void ReadAfterModel(config::internal::ObjectReader& /*t*/,
                      config::internal::LocatedModel* /*model*/,
                      config::Setup* /*s*/) const override {}

  // Plain PyTorch's, and Transformers BERT / RoBERTa under autocast over wider weights keep
  // autocast's fp32 tensors (model.h ModelDims::wide_bytes, cast_inputs).
  void SetElementSizes(const config::TrainingConfig& c, workload::ModelDims* d) const override {
    PyTorchLoopStack::SetElementSizes(c, d);
    if (d->weight_cast) {
      d->wide_bytes = d->param_bytes;
      d->cast_inputs = true;
    }
  }
  void SetFacts(const config::Setup& setup, const workload::ModelDims& /*d*/,
                workload::FrameworkFacts* f) const override {
    f->hf = true;
    f->softmax_saves_input = config::HfTrainerOf(setup.training).softmax_saves_input;
    f->zero_grad_after_step = true;  // Trainer._inner_training_loop (facts.h)
    f->hf_native_amp = setup.training.precision != config::Precision::kFp32;
  }
};

}  // namespace

std::unique_ptr<const config::Stack> NewHfTrainerStack() {
  return std::make_unique<HfTrainerStack>();
}

}  // namespace memsim::stacks
