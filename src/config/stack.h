// Stack: one training stack (the framework and its training loop: Megatron-core, plain PyTorch,
// the Hugging Face Trainer, ...) as a plug-in registered by name, the name being the value of
// the training block's "framework" key. A stack owns, in one file under src/stacks/:
//   - reading and checking its training keys (the two Read* steps below),
//   - the values it derives from them (Derive) and its facts for the workload (element sizes,
//     the framework code's version rules: SetElementSizes, SetFacts),
//   - its data-parallel wrapper and training-loop factories and its optimizer's param groups,
//   - what the report says of it (Traits::label).
// Every other layer asks the registry (StackOf) instead of comparing the stack's name.
// docs/architecture.md, "How to add a stack", walks through adding one.
//
// Layering: this header is in config/ so that the config readers can dispatch by stack; the
// workload types it names are only declared here. Implementations live in src/stacks/, above
// config/ and workload/, and may use both. The built-in stacks are in the registry from its first
// use (BuiltinStacks, src/stacks/builtin.cc); others (a test's) are added by RegisterStack, which
// is not locked: register before simulations start threads. A stack allocates nothing itself:
// its memory is what the parts it hands out (wrapper, loop) and the modules allocate.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/setup.h"

namespace memsim::workload {
struct ModelDims;
struct FrameworkFacts;
struct ParamTensor;
struct RankParams;
struct GradBuffer;
struct LoopParts;
class DataParallel;
class TrainingLoop;
}  // namespace memsim::workload

namespace memsim::config {

namespace internal {
class ObjectReader;
struct Document;
struct LocatedModel;
struct HfTrainerExtras;
struct Origin;
}  // namespace internal

// What other layers may ask of a stack without running it: plain facts, declared once here.
struct StackTraits {
  // The report's name of the stack ("Megatron-core", "plain PyTorch", "HF Trainer").
  std::string_view label;
  // The model's modelling code: Megatron-core's modules, or Hugging Face Transformers' (its own
  // decoder layer, [b, s, h] activations, eager attention; workload/modules/hf_decoder.h).
  bool transformers_modelling = false;
  // The training block holds Hugging Face TrainingArguments names (max_steps counts steps, the
  // model file is taken as it is), not Megatron-LM argument names (train_iters; the block's
  // architecture keys override the model file).
  bool training_arguments_keys = false;
  // Megatron's _vocab_size_with_padding pads the embedding rows (setup.h PaddedVocabSize); a
  // Hugging Face model keeps config.vocab_size rows.
  bool pads_vocab = false;
  // Megatron-core's mixture-of-experts layers (moe.h); else a MoE model is refused.
  bool mixture_of_experts = false;
  // Megatron-core's MLASelfAttention (workload/modules/mla.h); else an MLA model is refused.
  bool multi_latent_attention = false;
  // Encoder models (BERT) through Transformers' modelling code (modules/hf_encoder.h).
  bool encoder_models = false;
  // Megatron's GPT dataset and get_batch (the dataloader's causal mask on CUDA devices).
  bool megatron_get_batch = false;
  // Tensor and pipeline parallelism exist (a model too large for a rank can be split further).
  bool model_parallel = false;
  // A plain PyTorch step: the weights keep the dtype they were loaded in (torch_dtype),
  // torch.autocast runs the model in `precision`, and a torch.optim optimizer updates the weights
  // themselves, its state in their dtype (no fp32 main copies). The report names torch_dtype and
  // zero_grad_set_to_none.
  bool plain_pytorch_step = false;
  // The run report's optimizer name when the training block names Adam ("AdamW" for
  // torch.optim.AdamW, the Trainer's and plain loops' default; "" = memsim's "Adam").
  std::string_view adam_label;
};

class Stack {
 public:
  virtual ~Stack() = default;

  // The value of the training block's "framework" key that selects this stack.
  virtual std::string_view Name() const = 0;
  virtual const StackTraits& Traits() const = 0;

  // ---- reading (config/load.cc calls these in this order) ----
  // Before the model is read: checks the block's keys (unsupported features, unknown and
  // foreign keys) and may read the whole block into s->training (a key set that does not
  // depend on the model). Throws InputError / UnsupportedError naming the key.
  virtual void ReadBeforeModel(internal::ObjectReader& t, const internal::Document& config,
                               Setup* s, internal::HfTrainerExtras* extras) const = 0;
  // After the model is read: applies the block's architecture keys to it and reads the rest.
  virtual void ReadAfterModel(internal::ObjectReader& t, internal::LocatedModel* model,
                              Setup* s) const = 0;
  // Values the stack's framework derives from the others (its argument validation), after the
  // Setup is checked; a note for each value changed. Default: none.
  virtual void Derive(Setup* /*s*/, const internal::Origin& /*origin*/) const {}

  // ---- the workload (workload/model.h, data_parallel.h, training_loop.h) ----
  // Element sizes (act_bytes, param_bytes, grad_bytes, mixed, weight_cast) of `c`.
  virtual void SetElementSizes(const TrainingConfig& c, workload::ModelDims* d) const = 0;
  // The stack's own facts (its code's version rules) on top of the common ones ComputeFacts
  // set (workload/facts.h). Default: none.
  virtual void SetFacts(const Setup& /*setup*/, const workload::ModelDims& /*d*/,
                        workload::FrameworkFacts* /*f*/) const {}
  // The wrapper of `setup.training` for pipeline rank `rank` (DataParallelOf below);
  // `params` outlives it.
  virtual std::unique_ptr<workload::DataParallel> NewDataParallel(
      const Setup& setup, int rank, const workload::ModelDims& d,
      const workload::RankParams& params) const = 0;
  // The contiguous buffer layout of the wrapper (model.h GradBuffer); none for a wrapper that
  // keeps no such buffers.
  virtual std::vector<workload::GradBuffer> LayoutGradBuffers(
      const Setup& setup, int rank, const workload::ModelDims& d,
      const std::vector<workload::ParamTensor>& params) const = 0;
  // The optimizer's param groups over `params` (indices; frozen parameters excluded).
  virtual std::vector<std::vector<int>> ParamGroups(
      const std::vector<workload::ParamTensor>& params) const = 0;
  virtual std::unique_ptr<workload::TrainingLoop> NewTrainingLoop(
      const workload::LoopParts& parts) const = 0;
  // The data-parallel wrapper `c` describes (a value, for tests and the report).
  virtual DataParallelWrapper Wrapper(const TrainingConfig& c) const = 0;
};

// Adds `stack` under its Name(). REQUIRES: no stack of that name is registered yet; no
// simulation is running.
void RegisterStack(std::unique_ptr<const Stack> stack);
// Removes the stack RegisterStack added under `name` (a test's, at its end). REQUIRES: `name` is
// registered and not a built-in; no simulation is running.
void UnregisterStack(std::string_view name);
// The stack registered under `name`, or nullptr.
const Stack* FindStack(std::string_view name);
// The stack of a loaded TrainingConfig. REQUIRES: c.framework is registered (LoadSetup
// checks it).
const Stack& StackOf(const TrainingConfig& c);
// The registered names, in registration order (built-ins first).
std::vector<std::string> StackNames();
// `"megatron", "pytorch" and "hf-trainer"`: the names quoted for messages.
std::string QuotedStackNames();

// memsim's own stacks, in the order messages list them (src/stacks/builtin.cc: one line a
// stack); the registry starts with them on first use.
std::vector<std::unique_ptr<const Stack>> BuiltinStacks();

}  // namespace memsim::config
