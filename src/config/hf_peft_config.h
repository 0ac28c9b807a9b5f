// Internal to config/: the PEFT and quantisation keys of a framework "hf-trainer" block
// (docs/config.md "PEFT"): adapter_config (an adapter_config.json as PEFT saves it, by path or
// inline; peft/tuners/lora/config.py LoraConfig) and quantization_config (transformers'
// BitsAndBytesConfig names; transformers/utils/quantization_config.py).
#pragma once

#include <string>
#include <vector>

#include "config/documents.h"
#include "config/reader.h"
#include "config/setup.h"

namespace memsim::config::internal {

// Reads both keys of `own` into c.lora_* and c.load_in_4bit / bnb_4bit_use_double_quant.
// Errors: InputError for a bad value; UnsupportedError for what memsim recognises and does not
// model (DoRA, bias training, per-layer patterns, 8-bit loading, another peft_type).
void ReadPeft(ObjectReader& own, const Document& config, TrainingConfig& c,
              std::vector<std::string>* notes, std::vector<std::string>* warnings);

// The names LoRA may target in a llama-family decoder (LlamaAttention, LlamaMLP).
const std::vector<std::string>& LoraTargetNames();

}  // namespace memsim::config::internal
