// Internal to config/: a torchtitan job config -- the TOML that `torchtitan/train.py
// --job.config_file FILE` reads (torchtitan/config/job_config.py JobConfig, at torchtitan commit
// 31a17bfdb70bab6f62a13d21816a5339b911d6e3) -- translated into a memsim training config of
// framework "torchtitan" (stacks/torchtitan.cc), then loaded as one (load_internal.h). The model
// is [model] name + flavor, resolved to shapes from torchtitan's model args (Llama3Flavors). Each
// key is read, or known to leave device memory alone, or a warning naming it and the direction
// memsim errs without it, or an UnsupportedError with the reason (Float8, context and pipeline
// parallelism, tensor parallelism, HSDP, CPU offload). Every value carries the file's line:
// "<file>:<line>: [section] key". toml++ is included by torchtitan_toml.cc only.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "config/documents.h"
#include "config/load.h"

namespace memsim::config::internal {

// True iff `config` is a TOML file: named *.toml, or its first statement is a [table] header.
bool IsToml(const Document& config);

// Loads a torchtitan job config into a Setup. REQUIRES: IsToml(config). `options.device` is
// required (the TOML names no device); `options.model_path` replaces the [model] flavor. Errors
// as LoadSetup's; the Setup's `recipe` lines say what was read and assumed.
Setup LoadTorchtitanToml(const Document& config, const LoadOptions& options);

// One flavor of torchtitan's llama3 model args (torchtitan/models/llama3/__init__.py llama3_args
// at the commit above; TransformerModelArgs defaults: vocab_size 128256, norm_eps 1e-5,
// n_kv_heads None = n_heads, ffn_dim_multiplier None, multiple_of 256).
struct TorchtitanFlavor {
  std::string_view name;
  int dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  double ffn_dim_multiplier = 0;  // 0: None
  int multiple_of = 256;
  double rope_theta = 10000;
};
const std::vector<TorchtitanFlavor>& Llama3Flavors();

// The SwiGLU hidden size of torchtitan's FeedForward (torchtitan/models/llama3/model/model.py
// FeedForward.__init__, called with hidden_dim 4·dim): int(2·4·dim / 3), times
// ffn_dim_multiplier (truncated) when given, rounded up to a multiple of multiple_of.
std::int64_t TorchtitanFfnHidden(const TorchtitanFlavor& f);

}  // namespace memsim::config::internal
