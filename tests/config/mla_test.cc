// Multi-latent attention and DeepSeek files (config/mla.h), and the uneven pipeline split
// (setup.h StageLayerCounts, rules.cc CheckUnevenPipeline): what the loader reads, derives and
// refuses.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/launch_script.h"
#include "config/load.h"
#include "config/megatron_args.h"
#include "config/test_util.h"
#include "core/error.h"

namespace memsim::config {
namespace {

using testing::ErrorOf;
using testing::IsUnsupported;
using testing::WriteTemp;

// A config on an H100 with fused attention (MLA needs it; Megatron's --use-flash-attn).
std::string Config(const std::string& name, const std::string& model, const std::string& training) {
  return WriteTemp(name, "{\"model\": " + model + ", \"device\": \"h100-80g\", \"training\": {" +
                             "\"use_flash_attn\": true, " + training + "}}");
}

bool Has(const std::vector<std::string>& lines, const std::string& part) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(part) != std::string::npos; });
}

TEST_CASE("a deepseek_v3 file gives multi-latent attention and DeepSeek's MoE layout",
          "[config][mla]") {
  // models/deepseek-v3.json, the published DeepSeek-V3 config.json.
  const Setup s = LoadSetup(Config("v3.json", "\"deepseek-v3\"", "\"seq_length\": 4096, "
                                                                   "\"pipeline_model_parallel_size\": 61, "
                                                                   "\"expert_model_parallel_size\": 8, "
                                                                   "\"data_parallel_size\": 8"),
                            {});
  const ModelConfig& m = s.model;
  CHECK(m.multi_latent_attention);
  CHECK(m.q_lora_rank == 1536);
  CHECK(m.kv_lora_rank == 512);
  CHECK(m.qk_head_dim == 128);
  CHECK(m.qk_pos_emb_head_dim == 64);
  CHECK(m.v_head_dim == 128);
  CHECK(m.head_dim == 128);  // the output projection takes heads × v_head_dim
  CHECK(m.num_key_value_heads == 128);
  CHECK(m.qk_layernorm);  // q_a_layernorm, kv_a_layernorm
  CHECK(m.num_experts == 256);
  CHECK(m.moe_router_topk == 8);
  CHECK(m.moe_ffn_hidden_size == 2048);
  // n_shared_experts 1 × moe_intermediate_size 2048.
  CHECK(m.moe_shared_expert_intermediate_size == 2048);
  // first_k_dense_replace 3, moe_layer_freq 1: layers 0-2 dense, 3-60 MoE.
  REQUIRE(m.moe_layer_pattern.size() == 61);
  CHECK(std::count(m.moe_layer_pattern.begin(), m.moe_layer_pattern.end(), true) == 58);
  CHECK_FALSE(m.moe_layer_pattern[2]);
  CHECK(m.moe_layer_pattern[3]);
  // The sigmoid, group-limited router is warned about; the MTP layer count is noted.
  CHECK(Has(s.warnings, "/scoring_func"));
  CHECK(Has(s.notes, "/num_nextn_predict_layers: ignored"));
}

TEST_CASE("DeepSeek-V2-Lite's null q_lora_rank gives one query projection, V2 needs the top-k",
          "[config][mla]") {
  const std::string lite =
      "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 2048, \"num_attention_heads\": 16, "
      "\"num_hidden_layers\": 27, \"q_lora_rank\": null, \"n_routed_experts\": 64, "
      "\"num_experts_per_tok\": 6, \"first_k_dense_replace\": 1, \"vocab_size\": 102400}";
  const Setup s = LoadSetup(Config("lite.json", lite, "\"seq_length\": 4096"), {});
  CHECK(s.model.multi_latent_attention);
  CHECK(s.model.q_lora_rank == 0);
  CHECK(s.model.kv_lora_rank == 512);
  // DeepseekV2Config: n_shared_experts 2, moe_intermediate_size 1407.
  CHECK(s.model.moe_shared_expert_intermediate_size == 2 * 1407);
  CHECK_FALSE(s.model.moe_layer_pattern[0]);
  CHECK(s.model.moe_layer_pattern[1]);
  const std::string no_topk = Config(
      "v2.json", "{\"model_type\": \"deepseek_v2\", \"n_routed_experts\": 64}", "\"seq_length\": 4096");
  CHECK(ErrorOf(no_topk) == no_topk +
                                ": /model/num_experts_per_tok: missing key (DeepseekV2Config has "
                                "no default for it)");
}

TEST_CASE("Megatron's MLA flags build multi-latent attention from the arguments", "[config][mla]") {
  const MegatronLaunch l = ReadLaunchScript(
      "mla.sh",
      "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
      "--seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --bf16 "
      "--micro-batch-size 1 --global-batch-size 8 --use-flash-attn --qk-layernorm "
      "--multi-latent-attention --q-lora-rank 384 --kv-lora-rank 256 --qk-head-dim 64 "
      "--qk-pos-emb-head-dim 32 --v-head-dim 64\n");
  LoadOptions o;
  o.device = "h100-80g";
  const Setup s = LoadSetupFromMegatron(l, o, {});
  CHECK(s.model.multi_latent_attention);
  CHECK(s.model.q_lora_rank == 384);
  CHECK(s.model.kv_lora_rank == 256);
  CHECK(s.model.qk_head_dim == 64);
  CHECK(s.model.qk_pos_emb_head_dim == 32);
  CHECK(s.model.v_head_dim == 64);
  CHECK(s.model.head_dim == 64);
  // Without the rank flags Megatron's defaults: no q_lora_rank, kv_lora_rank 32.
  const MegatronLaunch d = ReadLaunchScript(
      "mla2.sh",
      "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
      "--seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --bf16 "
      "--micro-batch-size 1 --global-batch-size 8 --use-flash-attn --multi-latent-attention\n");
  const Setup def = LoadSetupFromMegatron(d, o, {});
  CHECK(def.model.q_lora_rank == 0);
  CHECK(def.model.kv_lora_rank == 32);
  CHECK(def.model.qk_head_dim == 128);
  CHECK(def.model.qk_pos_emb_head_dim == 64);
  CHECK(def.model.v_head_dim == 128);
}

TEST_CASE("multi-latent attention with tensor parallelism or unfused attention is unsupported",
          "[config][mla]") {
  CHECK(IsUnsupported(Config("tp.json", "\"deepseek-v3\"",
                             "\"seq_length\": 4096, \"tensor_model_parallel_size\": 2, "
                             "\"sequence_parallel\": true, \"num_layers\": 4")));
  CHECK(IsUnsupported(WriteTemp("unfused.json", "{\"model\": \"deepseek-v3\", \"device\": "
                                                "\"h100-80g\", \"training\": {\"seq_length\": "
                                                "4096, \"num_layers\": 4}}")));
}

TEST_CASE("an uneven pipeline split gives the first and last stages their counts, the middle "
          "ones the rest",
          "[config][pipeline]") {
  ModelConfig m;
  m.num_hidden_layers = 14;
  TrainingConfig c;
  c.pipeline_model_parallel_size = 4;
  CHECK_FALSE(UnevenPipeline(c));
  CHECK(StageLayerCounts(m, c) == std::vector<int>{3, 3, 3, 3});  // 14 / 4, unchecked here
  c.decoder_first_pipeline_num_layers = 3;
  c.decoder_last_pipeline_num_layers = 3;
  CHECK(UnevenPipeline(c));
  CHECK(StageLayerCounts(m, c) == std::vector<int>{3, 4, 4, 3});  // (14 − 6) / 2 in the middle
  c.decoder_last_pipeline_num_layers = 0;
  m.num_hidden_layers = 13;
  c.decoder_first_pipeline_num_layers = 4;
  CHECK(StageLayerCounts(m, c) == std::vector<int>{4, 3, 3, 3});  // (13 − 4) / 3
}

TEST_CASE("an uneven split that Megatron refuses, or with interleaving, is refused",
          "[config][pipeline]") {
  const std::string llama = "{\"model_type\": \"llama\", \"num_hidden_layers\": 14}";
  const std::string base = "\"seq_length\": 512, \"pipeline_model_parallel_size\": 4";
  const std::string ok =
      Config("u0.json", llama, base + ", \"decoder_first_pipeline_num_layers\": 3, "
                                      "\"decoder_last_pipeline_num_layers\": 3");
  CHECK(ErrorOf(ok) == "(no error)");
  // 14 − 4 = 10 layers over 3 middle-and-last stages.
  const std::string odd = Config("u1.json", llama, base + ", \"decoder_first_pipeline_num_layers\": 4");
  CHECK(ErrorOf(odd) == odd +
                            ": /training/decoder_first_pipeline_num_layers: the 10 layers left are "
                            "not divisible over the 3 middle pipeline stages (each must get at "
                            "least one)");
  const std::string even = Config("u2.json", llama, "\"seq_length\": 512, "
                                                    "\"pipeline_model_parallel_size\": 4");
  CHECK(ErrorOf(even).find("14 layers are not divisible by pipeline_model_parallel_size 4") !=
        std::string::npos);
  CHECK(IsUnsupported(Config("u3.json", "{\"model_type\": \"llama\", \"num_hidden_layers\": 16}",
                             base + ", \"decoder_first_pipeline_num_layers\": 4, "
                                    "\"num_layers_per_virtual_pipeline_stage\": 2")));
}

}  // namespace
}  // namespace memsim::config
