// Internal to config/: the mixture-of-experts keys (docs/config.md "Mixture of experts").
// Hugging Face files: Mixtral (num_local_experts, num_experts_per_tok), Qwen2-MoE and Qwen3-MoE
// (num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size,
// decoder_sparse_step, mlp_only_layers, norm_topk_prob). Training block: Megatron-LM's MoE
// argument names (megatron/core/transformer/transformer_config.py) and memsim's
// moe_imbalance_factor. Errors: InputError naming the key; UnsupportedError for the flex / DeepEP
// dispatchers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/origin.h"
#include "config/parts.h"

namespace memsim::config::internal {

// model_type values read as mixture of experts.
bool IsMoeModelType(std::string_view model_type);
// Reads the MoE fields of an HF file of an MoE model_type (after ReadSizes).
void ReadHfMoe(ObjectReader& r, LocatedModel& out, std::vector<std::string>* notes);

// num_experts and the MoE architecture arguments of the training block override the model's.
void ApplyMegatronMoe(ObjectReader& t, LocatedModel* located, std::vector<std::string>* notes);
const std::vector<std::string>& MegatronMoeArchitectureKeys();

// The MoE runtime keys of the training block, with expert_model_parallel_size and
// expert_tensor_parallel_size.
void ReadMoeTraining(ObjectReader& t, TrainingConfig& c);
const std::vector<std::string>& MoeTrainingKeys();

// Expert tensor parallel size: the key, or tensor_model_parallel_size when absent (Megatron
// arguments.py: expert_tensor_parallel_size defaults to tensor_model_parallel_size).
int ExpertTensorParallelSize(const TrainingConfig& c);

// The MoE rules between keys (a CheckWritten rule, rules.h): EP divides num_experts; expert
// grid fits the stage's ranks; widths divisible; no MoE under framework "pytorch" or
// Megatron-FSDP (UnsupportedError).
void CheckMoe(const Setup& s, const Origin& origin);

}  // namespace memsim::config::internal
