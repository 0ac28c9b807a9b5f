// LoadSetup: turns a training config file (docs/config.md), its model file (Hugging Face
// config.json form) and a device preset into one validated Setup. Every field is checked here,
// once; the rest of memsim trusts the Setup. Errors are InputError with one message
// "<file>: <JSON pointer>: <what was expected>" (or "--set KEY=VALUE: ..." / "--device X: ..."
// for command-line values); input memsim recognises but does not model is UnsupportedError
// ("unsupported: ..."). Does not simulate anything. Reads files; no other side effects.
// Inside config/: documents.h finds the files, parts.h and training.h read them, rules.h checks
// the result and derive.h computes the values that follow.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/setup.h"
#include "core/units.h"

namespace memsim::config {

struct LoadOptions {
  // --model FILE|NAME: replaces the config's "model": a path (contains '/' or ends ".json",
  // relative to the working directory) or a shipped model name ("llama2-7b", embedded).
  std::string model_path;
  // --device NAME|FILE: a preset name (embedded set) or a path (contains '/' or ends ".json").
  std::string device;
  // --set KEY=VALUE, applied in order: KEY is "training.<key>" or "allocator.<key>"; VALUE is
  // JSON (2, true, "x", null) or, when not valid JSON, a plain string; True/False as booleans.
  std::vector<std::string> overrides;
  // --iterations N (> 0): sets training.train_iters after the overrides; messages name it.
  int iterations = 0;
  // With an empty config_path: load the embedded configs/default.json (true), or fail (false).
  bool use_embedded_default = true;
  // --capacity: replaces the device's usable_memory_bytes (and so the allocator capacity).
  std::optional<Bytes> capacity_bytes;
};

// Loads and validates. REQUIRES nothing; every problem is reported as InputError.
// Cross-field rules (each Megatron's, see docs/config.md; rules.h): heads and query groups
// divisible by TP; layers divisible by PP and, with num_layers_per_virtual_pipeline_stage, layers
// per stage divisible by it; global_batch_size divisible by micro_batch_size ×
// data_parallel_size. Derived (derive.h): sequence_parallel at TP 1 is switched off with a note
// (Megatron arguments.py does the same, with a warning); bf16 forces
// accumulate_allreduce_grads_in_fp32 with framework "megatron" (Megatron arguments.py);
// num_micro_batches; padded_vocab_size. framework "pytorch" is one rank: every parallel size 1 and
// no Megatron-only switch (an error naming the key).
// Setup::reproducing_config is the config as read with the options applied, the model and
// device inline unless shipped (docs/interfaces.md 'JSON report', input_config).
Setup LoadSetup(const std::string& config_path, const LoadOptions& options);

// The Setup of `base`'s reproducing_config (a training config that reproduces it, model and
// device inline or by shipped name) with `overrides` (--set KEY=VALUE, as LoadOptions::overrides)
// applied, read as LoadSetup reads a file: every rule checked, every value derived again, and the
// result's own reproducing_config written. `label` names the text in messages ("plan tp=2 pp=1").
// Used by `memsim plan` to try layouts of one config (plan/plan.h). Errors as LoadSetup's.
// REQUIRES: base.reproducing_config is not empty (every loader writes it).
Setup LoadVariant(const Setup& base, const std::vector<std::string>& overrides,
                  const std::string& label);

// Loads one device preset by name (embedded set) or path (read from disk). Errors name the
// argument ("h100: unknown device preset ...") or the preset file and its JSON pointer.
DevicePreset LoadDevicePreset(const std::string& name_or_path);

// A short name of the model for one-line summaries: Setup::model_label when set ("train.sh
// (Megatron arguments)"), else the model file's stem ("llama2-7b"), or "<model_type> (inline)".
std::string ModelName(const Setup& setup);

}  // namespace memsim::config
