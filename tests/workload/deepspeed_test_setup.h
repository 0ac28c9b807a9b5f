// The small job of the DeepSpeed ZeRO tests (deepspeed_zero_test.cc, deepspeed_zero3_test.cc).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/load.h"

namespace memsim::workload::testing {

// A Llama of h 64, ffn 128, 2 layers, 4 heads, vocab 256, untied, no biases, under the Trainer
// with a ds_config whose zero_optimization is `zero`: 4 processes, micro-batch 1, gradient
// accumulation 2, bf16, 2 steps, no gradient checkpointing. The files are written under a
// temporary folder named by `tag` and the process id, as `name`.json and `name`.ds.json.
inline config::Setup SmallLlamaUnderDeepSpeed(const std::string& tag, const std::string& name,
                                              const std::string& zero) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / (name + ".ds.json"))
      << "{\"bf16\": {\"enabled\": \"auto\"}, \"zero_optimization\": " + zero + "}";
  const std::string path = (dir / (name + ".json")).string();
  std::ofstream(path)
      << "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": "
         "128, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"num_hidden_layers\": 2, "
         "\"vocab_size\": 256, \"max_position_embeddings\": 64}, \"device\": \"a100-80g\", "
         "\"training\": {\"framework\": \"hf-trainer\", \"world_size\": 4, "
         "\"per_device_train_batch_size\": 1, \"gradient_accumulation_steps\": 2, "
         "\"max_seq_length\": 32, \"bf16\": true, \"torch_dtype\": \"bfloat16\", "
         "\"max_steps\": 2, \"deepspeed\": \"" + name + ".ds.json\"}}";
  return config::LoadSetup(path, {});
}

}  // namespace memsim::workload::testing
