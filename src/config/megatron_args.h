// LoadSetupFromMegatron: a Setup from a Megatron-LM / MindSpeed-LLM launch (launch_script.h)
// instead of a JSON training config. The arguments become the training block of an equivalent
// config, each value named by where it was written ("train.sh:31: --num-layers"), so that the
// usual reader and rules (load.h) check them and their messages name the script, its line and the
// flag. Every flag is classified (megatron_flags.h); the model comes from the arguments
// (Megatron's defaults are GPT-2's: LayerNorm, GELU MLP, biases, learned positions, tied
// embeddings) or from --model, which the arguments override. The device is --device.
#pragma once

#include "config/launch_script.h"
#include "config/load.h"
#include "config/setup.h"

namespace memsim::config {

struct MegatronOptions {
  // Run even when a flag is unsupported; the flag is then ignored, with a warning.
  bool allow_unsupported = false;
};

// REQUIRES nothing; bad input is InputError (UnsupportedError for an unsupported flag without
// allow_unsupported). Setup::warnings holds the reader's warnings and one per flag not modelled.
Setup LoadSetupFromMegatron(const MegatronLaunch& launch, const LoadOptions& options,
                            const MegatronOptions& megatron);

// The flags the translator reads, sorted (the table's kModelled rows must be these).
std::vector<std::string> ModelledMegatronFlags();

}  // namespace memsim::config
