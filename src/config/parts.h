// Internal to config/: the readers of each part of a setup (model file, Megatron architecture
// overrides, device preset, allocator block). Used by load.cc; includes nlohmann/json. The
// training block has its own reader (training.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/reader.h"
#include "config/setup.h"

namespace memsim::config::internal {

// A model with, per ModelConfig field name, the location its value came from (for messages
// about cross-field rules, e.g. "model.json: /num_attention_heads").
struct LocatedModel {
  ModelConfig model;
  std::map<std::string, std::string> where;
  // What the model file asks for that memsim does not model (LoadSetup appends them to
  // Setup::warnings).
  std::vector<std::string> warnings;
};

// Reads a Hugging Face config.json object (at `pointer` of `source`). Keys absent take the
// default of the model_type; unused keys are appended to `notes`, or to `warnings` with "did you
// mean" when one is a near miss of a key memsim reads (a typo would silently take the default).
// UnsupportedError for what memsim recognises and does not model, among them the model type t5
// (encoder-decoder), an expert
// count in a dense model_type's file, an encoder head other than *ForSequenceClassification.
LocatedModel ReadHfModel(const Source& source, const Json& object, const std::string& pointer,
                         std::vector<std::string>* notes, std::vector<std::string>* warnings);

// Applies the Megatron architecture arguments present in the training block (num_layers,
// hidden_size, ffn_hidden_size, swiglu, normalization, ...): the training config wins.
void ApplyMegatronArchitecture(ObjectReader& training, LocatedModel* located,
                               std::vector<std::string>* notes);
// The training keys ApplyMegatronArchitecture reads.
const std::vector<std::string>& MegatronArchitectureKeys();

// Reads a device preset object (docs/config.md "Device preset") at `pointer` of `source` ("" for a
// preset file, "/device" for an object inline in a training config). Byte figures are integers
// in [0, 2^50] (total and usable at least 1, usable <= total); peak_flops.* 0 (unknown) or in
// [1e9, 1e18]; memory_bandwidth_bytes_per_s 0 (unknown) or in [1e6, 1e16] (device.cc).
DevicePreset ReadDevicePreset(const Source& source, const Json& object, const std::string& pointer);

// Reads the "allocator" block for `backend` into options (capacity left unset).
alloc::AllocatorOptions ReadAllocatorBlock(const Source& source, const Json& object,
                                           const std::string& pointer, alloc::Backend backend);

}  // namespace memsim::config::internal
