// The cross-field rules (config/rules.h) called directly on a Setup built in code: they read the
// Setup, name the field through the Origin, and leave the Setup as it was.
#include <catch2/catch.hpp>

#include "config/derive.h"
#include "config/rules.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// A small llama: hidden 256, 32 heads of 8, 8 key/value heads, FFN 688 (gated), 2 layers, vocab
// 32001; TP 1, one micro-batch of 512 tokens.
Setup Small() {
  Setup s;
  s.model.hidden_size = 256;
  s.model.num_attention_heads = 32;
  s.model.num_key_value_heads = 8;
  s.model.head_dim = 8;
  s.model.intermediate_size = 688;
  s.model.num_hidden_layers = 2;
  s.model.vocab_size = 32001;
  s.model.max_position_embeddings = 4096;
  s.training.seq_length = 512;
  s.training.global_batch_size = 1;
  return s;
}

Origin OriginOf(const std::string& file) {
  Origin o;
  o.training = Source{file, {}};
  o.model["num_attention_heads"] = "model.json: /num_attention_heads";
  return o;
}

std::string ErrorOf(void (*check)(const Setup&, const Origin&), const Setup& s, const Origin& o) {
  try {
    check(s, o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("rules name the field where it was written and do not change the Setup", "[config]") {
  Setup s = Small();
  s.model_path = "model.json";
  s.training.tensor_model_parallel_size = 3;
  const Setup before = s;
  // The heads came from the model file: its key first, then the training config's.
  CHECK(ErrorOf(CheckWritten, s, OriginOf("c.json")) ==
        "model.json: /num_attention_heads: 32 heads are not divisible by "
        "tensor_model_parallel_size 3 (training config c.json: "
        "/training/tensor_model_parallel_size)");
  CHECK(s == before);
  s.training.tensor_model_parallel_size = 1;
  s.training.global_batch_size = 3;
  s.training.micro_batch_size = 2;
  CHECK(ErrorOf(CheckWritten, s, OriginOf("c.json")) ==
        "c.json: /training/global_batch_size: 3 is not divisible by micro_batch_size × "
        "data_parallel_size = 2 × 1");
}

TEST_CASE("derived values, computed once, then checked", "[config]") {
  Setup s = Small();
  s.training.global_batch_size = 8;
  s.training.micro_batch_size = 2;
  s.training.sequence_parallel = true;
  const Origin o = OriginOf("c.json");
  CheckWritten(s, o);
  Derive(&s, o);
  CHECK(s.training.num_micro_batches == 4);  // 8 / (2 × 1)
  CHECK_FALSE(s.training.sequence_parallel);  // TP 1
  CHECK(s.training.accumulate_allreduce_grads_in_fp32);  // bf16 with Megatron
  CHECK(s.model.padded_vocab_size == 32128);  // 32001 up to a multiple of 128 × TP 1: 251 × 128
  CHECK(s.notes == std::vector<std::string>{
                       "c.json: /training/accumulate_allreduce_grads_in_fp32: set to true for "
                       "bf16, as Megatron does",
                       "c.json: /training/sequence_parallel: switched off because "
                       "tensor_model_parallel_size is 1, as Megatron does"});
  CHECK_NOTHROW(CheckDerived(s, o));
  // The size limits' parameter estimate, by hand: q = 32 × 8 = 256, kv = 8 × 8 = 64;
  // per layer 256 × (256 + 128) + 256 × 256 + 3 × 256 × 688 + 4 × 256 = 693248;
  // embedding and output layer 2 × 32128 × 256 = 16449536; total 2 × 693248 + 16449536.
  const RankParameters p = EstimateRankParameters(s);
  CHECK(p.layers_per_stage == 2);
  CHECK(p.per_layer == 693248);
  CHECK(p.embedding == 16449536);
  CHECK(p.total == 17836032);
  // framework "pytorch": no padding, no fp32 accumulation flag.
  Setup t = Small();
  t.training.framework = "pytorch";
  t.training.stack.emplace<config::PyTorchOptions>();
  Derive(&t, o);
  CHECK(t.model.padded_vocab_size == 32001);
  CHECK_FALSE(t.training.accumulate_allreduce_grads_in_fp32);
  CHECK(t.notes.empty());
}

}  // namespace
}  // namespace memsim::config::internal
