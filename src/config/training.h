// Internal to config/: the reader of memsim's training config block ("training", docs/config.md
// "Training config") into a TrainingConfig. Keys are Megatron-LM's argument names, underscored;
// framework "pytorch" (plain PyTorch on one device, no wrapper) adds torch_dtype and
// zero_grad_set_to_none and refuses what only Megatron does. Checks each key's form and the rules
// between keys of the block that Megatron's argument parsing enforces, and notes what it defaults
// or does not use. Rules that involve the model, and derived values, are rules.h and derive.h.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/parts.h"
#include "config/reader.h"
#include "config/setup.h"
#include "config/stack.h"

namespace memsim::config::internal {

// Which stack reads the Megatron-named block (src/stacks/): Megatron-core itself, or plain
// PyTorch, which runs data parallel only, adds torch_dtype, zero_grad_set_to_none and
// DistributedDataParallel's keys, and refuses what only Megatron does.
enum class BlockReader { kMegatron, kPlainPyTorch };

// The stack the block's "framework" names ("megatron" when absent). Throws UnsupportedError for a
// name no stack is registered under, listing the registered ones.
const Stack& StackOfBlock(ObjectReader& t);

// Throws UnsupportedError for the features memsim recognises and does not model (ZeRO-2/3
// outside Megatron-FSDP, Megatron-FSDP's optim_grads_params, CUDA graphs, FP8, a resume with
// optimizer state). Run first, so that a config for another stack says "unsupported" rather
// than naming its first unknown key.
void RejectUnsupported(ObjectReader& t, BlockReader reader);

// Before the model is read, for a stack that reads the Megatron-named block: RejectUnsupported,
// then keys of another stack's set (hf_trainer.h RejectHfTrainerKeys), Megatron launch-script
// arguments memsim does not read (said as --megatron-args says them) and unknown keys, each an
// error naming the key. `stack_keys`: the stack's own keys beside the Megatron-named ones (it
// reads them itself).
void CheckMegatronNamedKeys(ObjectReader& t, std::string_view framework, BlockReader reader,
                            const std::vector<std::string>& stack_keys = {});

// The keys the training block may hold, besides MegatronArchitectureKeys() (parts.h).
const std::vector<std::string>& TrainingKeys();

// skipped_iterations (TrainingConfig::skipped_iterations): the fp16 loss scaler's skipped steps,
// read after c.precision; an error naming it with another precision. Also read by hf-trainer.
void ReadSkippedIterations(ObjectReader& t, TrainingConfig& c);

// After the model is read, for a stack that reads the Megatron-named block: the block's
// architecture keys applied to `model` (parts.h ApplyMegatronArchitecture), then the block read
// into s->training (ReadTraining) with s's notes and warnings.
void ReadMegatronNamedBlock(ObjectReader& t, LocatedModel* model, std::string_view framework,
                            BlockReader reader, Setup* s);

// Reads the training block for the stack named `framework`; appends to `notes` what was
// defaulted, adjusted or not used. REQUIRES: CheckMegatronNamedKeys(t, framework, reader) passed.
// `notes` collects what --verbose prints (defaults taken, accepted keys); `warnings` what is
// always printed: keys given that do not act in this configuration.
TrainingConfig ReadTraining(ObjectReader& t, std::string_view framework, BlockReader reader,
                            std::vector<std::string>* notes, std::vector<std::string>* warnings);

}  // namespace memsim::config::internal
