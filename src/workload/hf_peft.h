// PEFT on a Transformers decoder (framework "hf-trainer" with an adapter_config.json; and
// QLoRA's bitsandbytes 4-bit base weights). Two pure parts:
// - ApplyPeft rewrites the rank's parameter list as get_peft_model leaves the model
//   (peft/tuners/lora/model.py LoraModel._create_and_replace, tuners/lora/layer.py
//   LoraLayer.update_layer: lora_A = nn.Linear(in, r, bias=False), lora_B = nn.Linear(r, out,
//   bias=False) per targeted linear; _mark_only_adapters_as_trainable freezes the rest;
//   utils/other.py ModulesToSaveWrapper adds a trainable copy of each module in
//   modules_to_save). With a 16-bit base, get_peft_model(autocast_adapter_dtype=True) keeps the
//   adapters in fp32 (peft/tuners/tuners_utils.py cast_adapter_dtype).
// - PeftKernels is what the kernels (kernels.h) need at each linear: which weights are frozen
//   (no .grad), which are 4-bit (a dequantised copy made and freed per use,
//   bitsandbytes/autograd/_functions.py MatMul4Bit forward and backward:
//   F.dequantize_4bit(B, quant_state)), and the adapters hanging off each base weight.
// The Transformers decoder modules (modules/hf_decoder.h) name their weights as Transformers
// does ("layer3.self_attn.q_proj.weight"); each targeted one carries its adapter.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/setup.h"
#include "workload/model.h"

namespace memsim::workload {

struct LoraAdapter {
  std::string a_name, b_name;  // "layer3.attn.q_proj.lora_A.weight", ...
  std::int64_t in = 0, out = 0;
};

struct PeftKernels {
  std::int64_t r = 0;
  bool dropout = false;        // lora_dropout > 0: nn.Dropout on the adapter's input
  Bytes adapter_bytes = 4;     // element size of the adapters and their grads
  Bytes compute_bytes = 2;     // bnb_4bit_compute_dtype: the dequantised weight's element
  std::set<std::string> frozen;
  std::set<std::string> four_bit;
  // LLM.int8 weights (Linear8bitLt, Int8Params; Int8WeightBytes): each GEMM quantises its input
  // and dequantises its int8 product, and its backward dequantises the weight (Kernels).
  std::set<std::string> eight_bit;
  // Weight matrices prepare_model_for_kbit_training left in fp32 (hf_peft.cc KbitFp32: lm_head,
  // the embedding, linears kept in 16 bits): under 16-bit autocast each use casts a C copy.
  std::set<std::string> fp32_weights;
  bool input_fp16 = false;  // the activations are fp16 (MatMul8bitLt then makes no fp16 copies)
  // modules_to_save originals: their grads go to the trainable copy "modules_to_save.<name>".
  std::set<std::string> saved_modules;
  std::map<std::string, std::vector<LoraAdapter>> adapters;  // base weight -> its adapters
  bool Active() const { return !frozen.empty() || !four_bit.empty(); }
};

// Whether the setup asks for PEFT (an adapter, 4-bit or 8-bit weights).
bool UsesPeft(const config::TrainingConfig& tc);

// Whether prepare_model_for_kbit_training makes the decoder's residual stream fp32 under 16-bit
// autocast (ModelDims::wide_bytes 4, cast_inputs): an fp32 embedding looks up fp32 rows
// (F.embedding is no autocast op), and an fp32 norm weight makes LlamaRMSNorm's
// `self.weight * hidden_states.to(input_dtype)` fp32; the quantised linears fed that return it
// in its own dtype (bitsandbytes nn/modules.py Linear4bit.forward `out.to(inp_dtype)`,
// autograd/_functions.py MatMul8bitLt `.to(A.dtype)`), and `residual + hidden_states`
// promotes to fp32 (transformers modeling_llama.py LlamaDecoderLayer.forward). With the
// embedding recast to 16 bits (TRL) the first layer's input is still 16-bit: memsim high by
// one [b, s, h] 16-bit tensor per layer input the checkpoint saves there.
bool KbitWideResidual(const config::TrainingConfig& tc);

// The parameter list after get_peft_model (and 4-bit loading); the kernels' rules to match.
// REQUIRES: a Setup config/ validated (target modules exist for the model type).
std::vector<ParamTensor> ApplyPeft(const config::Setup& setup, const ModelDims& d,
                                   std::vector<ParamTensor> params, PeftKernels* kernels);

// Bytes of a 4-bit weight of `numel` elements with its quantisation state
// (bitsandbytes/functional.py quantize_4bit, blocksize 64: numel / 2 packed bytes; absmax fp32
// per block, or with double quantisation uint8 per block plus an fp32 absmax per 256 blocks).
// With bnb_4bit_quant_storage of `storage_bytes` a element (uint8 1, bfloat16 2, ...) the packed
// tensor is ((numel + 1) // (2 · storage_bytes), 1) of that dtype: the same bytes whenever
// numel is a multiple of 2 · storage_bytes, as every weight of the modelled models is.
Bytes FourBitBytes(std::int64_t numel, bool double_quant, Bytes storage_bytes = 1);

// Bytes of an LLM.int8 weight [rows, row_numel] (bitsandbytes/nn/modules.py Int8Params._quantize
// through functional.py int8_vectorwise_quant, bitsandbytes 0.45: the int8 CB, one byte an
// element, and its fp32 row scales SCB [rows]).
Bytes Int8WeightBytes(std::int64_t numel, std::int64_t row_numel);

}  // namespace memsim::workload
