// The cross-field rules of a Setup (rules.h), each with its source: Megatron's, or memsim's own
// limits (estimates, docs/config.md "Limits").
#include "config/rules.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "config/iterations.h"
#include "config/mla.h"
#include "config/moe.h"
#include "config/stack.h"
#include "core/error.h"

namespace memsim::config::internal {
namespace {

// Simulation-size limits (estimates, chosen so that every accepted setup simulates in about a
// minute at most). Each micro-batch is a forward and a backward pass of every layer of a stage;
// `memsim run` streams each stage's ops into the engine as they are generated
// (workload::BuildInto), so memory does not grow with micro-batches or iterations and only time
// does, with the layer passes of all stages. Measured (`memsim run` of configs/default.json,
// Release build, 2 shared cores under load, docs/performance.md 'Scale (issue 17)'): about 37
// microseconds of CPU per layer pass (global_batch_size 65536: 16384 micro-batches × 4
// iterations × 32 layers = 2^21 passes in 78 s), so 2^21 passes stay near 80 s (the issue's
// benchmark of 16384 micro-batches of the default is accepted). The micro-batch limit only keeps
// m within what 2^21 passes allow for a small model (8 layers × 4 iterations × 2^16).
// kMaxMicroBatches, kMaxLayerPasses and kMaxTokensPerMicroBatch: rules.h.
constexpr std::int64_t kMaxPaddedVocab = std::int64_t{1} << 27;

// memsim's bound on the bytes of one rank: any one tensor, and the weights, gradients and
// optimizer state of one pipeline stage, at most 2^50 bytes (1 PiB), far below the 2^60-byte
// request that PyTorch's allocator refuses and int64 overflow in sums.
constexpr double kMaxRankBytes = 1125899906842624.0;  // 2^50
// Bytes of weight, gradient and optimizer state per parameter, an upper bound: Megatron mixed
// precision with Adam keeps 2 (bf16 weight) + 4 (fp32 main grad) + 12 (fp32 main weight, exp_avg,
// exp_avg_sq) = 18 (Rajbhandari et al. 2020, ZeRO, section 3.1, counts 16 without the fp32 grad);
// rounded up to 20 for biases and buffers.
constexpr double kStateBytesPerParameter = 20;

// When a value from the model file conflicts with a training setting, the message names the
// model file's field and, after it, the training config's (the file alone does not say which
// config referenced it): " (training config <where>)", or "" when the field was not written in
// the model file.
std::string AlsoTraining(const Setup& s, const Origin& origin, const char* field,
                         const char* training_key) {
  auto it = origin.model.find(field);
  const bool in_model_file = !s.model_path.empty() && it != origin.model.end() &&
                             it->second.starts_with(s.model_path + ": ");
  return in_model_file ? fmt::format(" (training config {})", origin.Training(training_key))
                       : std::string();
}

// When a training value conflicts with the model's `field`, the message names the training key
// and, after it, where the model's field was written: ": <field> at <where>", or "" when it was
// not written (a default).
std::string AlsoModel(const Origin& origin, const char* field) {
  auto it = origin.model.find(field);
  return it == origin.model.end() ? std::string() : fmt::format(": {} at {}", field, it->second);
}

// How to ask for the flash / memory-efficient attention kernels under the key set in use.
std::string FlashAttentionHint(const Origin& origin) {
  const std::string key = origin.TrainingKey("use_flash_attn");
  return key == "use_flash_attn" ? ", or set use_flash_attn"
                                 : fmt::format(", or set {} to \"sdpa\" or \"flash_attention_2\"", key);
}

// --decoder-first/last-pipeline-num-layers (transformer_config.py __post_init__ at
// core_v0.13.0, 'Uneven PP'): each given count positive, the layers left divisible by the middle
// stages. memsim also refuses what Megatron would build as another model or not at all: PP 1, a
// stage without layers, counts not adding up to num_layers when there is no middle stage; and,
// unsupported, the interleaved schedule with an uneven split.
void CheckUnevenPipeline(const Setup& s, const Origin& origin) {
  const TrainingConfig& c = s.training;
  const int first = c.decoder_first_pipeline_num_layers, last = c.decoder_last_pipeline_num_layers;
  const std::string at = origin.Training(first > 0 ? "decoder_first_pipeline_num_layers"
                                                   : "decoder_last_pipeline_num_layers");
  const int pp = c.pipeline_model_parallel_size;
  if (pp < 2) Fail(at, "needs pipeline_model_parallel_size > 1");
  if (c.num_layers_per_virtual_pipeline_stage > 0 ||
      origin.virtual_stages_per_pipeline_rank.value_or(1) > 1) {
    throw UnsupportedError(fmt::format("{}: an uneven pipeline split with the interleaved "
                                       "schedule",
                                       at));
  }
  const int layers = s.model.num_hidden_layers;
  const int middle_stages = pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  const int middle_layers = layers - first - last;
  if (middle_layers < 0 || (middle_stages == 0 && middle_layers != 0)) {
    Fail(at, fmt::format("first {} + last {} layers do not fit the model's {} layers over {} "
                         "pipeline stages",
                         first, last, layers, pp));
  }
  if (middle_stages > 0 && (middle_layers % middle_stages != 0 || middle_layers == 0)) {
    Fail(at, fmt::format("the {} layers left are not divisible over the {} middle pipeline "
                         "stages (each must get at least one)",
                         middle_layers, middle_stages));
  }
}

// Megatron core: divide(num_attention_heads, TP) and divide(num_query_groups, TP) in
// attention.py (ensure_divisibility); the MLP's ColumnParallelLinear (fc1) and RowParallelLinear
// (fc2) in tensor_parallel/layers.py take divide(ffn_hidden_size, TP) columns / rows per rank;
// megatron/training/arguments.py: num_layers % pipeline_model_parallel_size == 0.
void CheckShape(const Setup& s, const Origin& origin) {
  const ModelConfig& m = s.model;
  const int tp = s.training.tensor_model_parallel_size;
  const int pp = s.training.pipeline_model_parallel_size;
  if (m.num_attention_heads % tp != 0) {
    Fail(origin.Model("num_attention_heads"),
         fmt::format("{} heads are not divisible by tensor_model_parallel_size {}{}",
                     m.num_attention_heads, tp,
                     AlsoTraining(s, origin, "num_attention_heads", "tensor_model_parallel_size")));
  }
  if (m.num_key_value_heads > m.num_attention_heads ||
      m.num_attention_heads % m.num_key_value_heads != 0) {
    Fail(origin.Model("num_key_value_heads"),
         fmt::format("{} key/value heads do not divide the {} attention heads",
                     m.num_key_value_heads, m.num_attention_heads));
  }
  if (m.num_key_value_heads % tp != 0) {
    Fail(origin.Model("num_key_value_heads"),
         fmt::format("{} key/value heads are not divisible by tensor_model_parallel_size {}{}",
                     m.num_key_value_heads, tp,
                     AlsoTraining(s, origin, "num_key_value_heads", "tensor_model_parallel_size")));
  }
  if (m.intermediate_size % tp != 0) {
    Fail(origin.Model("intermediate_size"),
         fmt::format("FFN hidden size {} is not divisible by tensor_model_parallel_size {}{}",
                     m.intermediate_size, tp,
                     AlsoTraining(s, origin, "intermediate_size", "tensor_model_parallel_size")));
  }
  if (UnevenPipeline(s.training)) {
    CheckUnevenPipeline(s, origin);
  } else if (m.num_hidden_layers % pp != 0) {
    Fail(origin.Model("num_hidden_layers"),
         fmt::format("{} layers are not divisible by pipeline_model_parallel_size {}{}",
                     m.num_hidden_layers, pp,
                     AlsoTraining(s, origin, "num_hidden_layers", "pipeline_model_parallel_size")));
  }
}

// The interleaved schedule, as written: num_virtual_stages_per_pipeline_rank must divide the
// layers per stage; either key asks for interleaving (more than one chunk) only with PP > 1;
// megatron/training/arguments.py: (num_layers // PP) % num_layers_per_virtual_pipeline_stage == 0.
void CheckVirtualStages(const Setup& s, const Origin& origin) {
  const TrainingConfig& c = s.training;
  if (UnevenPipeline(c)) return;  // CheckUnevenPipeline refuses interleaving with it
  const int pp = c.pipeline_model_parallel_size;
  const int layers_per_stage = s.model.num_hidden_layers / pp;
  const std::optional<int> vstages = origin.virtual_stages_per_pipeline_rank;
  if (vstages && layers_per_stage % *vstages != 0) {
    Fail(origin.Training("num_virtual_stages_per_pipeline_rank"),
         fmt::format("{} layers per pipeline stage are not divisible into {} virtual stages",
                     layers_per_stage, *vstages));
  }
  const bool interleaved = vstages ? *vstages > 1 : c.num_layers_per_virtual_pipeline_stage > 0;
  if (!interleaved) return;
  const std::string at = origin.Training(vstages ? "num_virtual_stages_per_pipeline_rank"
                                                 : "num_layers_per_virtual_pipeline_stage");
  if (pp < 2) Fail(at, "needs pipeline_model_parallel_size > 1 (interleaved schedule)");
  if (!vstages && layers_per_stage % c.num_layers_per_virtual_pipeline_stage != 0) {
    Fail(at, fmt::format("{} layers per pipeline stage ({} layers / pipeline_model_parallel_size "
                         "{}) are not divisible by {}",
                         layers_per_stage, s.model.num_hidden_layers, pp,
                         c.num_layers_per_virtual_pipeline_stage));
  }
}

// Megatron microbatches.py (megatron/core/num_microbatches_calculator.py): the global batch
// divisible by micro batch × DP; memsim's limit on the tokens of one micro-batch.
void CheckBatch(const Setup& s, const Origin& origin) {
  const TrainingConfig& c = s.training;
  const std::int64_t per_step = std::int64_t{c.micro_batch_size} * c.data_parallel_size;
  if (c.global_batch_size % per_step != 0) {
    Fail(origin.Training("global_batch_size"),
         fmt::format("{} is not divisible by {} × {} = {} × {}", c.global_batch_size,
                     origin.TrainingKey("micro_batch_size"),
                     origin.TrainingKey("data_parallel_size"), c.micro_batch_size,
                     c.data_parallel_size));
  }
  const std::int64_t tokens = std::int64_t{c.seq_length} * c.micro_batch_size;
  if (tokens > kMaxTokensPerMicroBatch) {
    Fail(origin.Training("micro_batch_size"),
         fmt::format("{} × {} = {} tokens exceeds memsim's limit of {}",
                     origin.TrainingKey("seq_length"), origin.TrainingKey("micro_batch_size"),
                     tokens, kMaxTokensPerMicroBatch));
  }
}

// The sequence's divisibility and length rules, after sequence_parallel has been derived.
void CheckSequence(const Setup& s, const Origin& origin) {
  const ModelConfig& m = s.model;
  const TrainingConfig& c = s.training;
  const int tp = c.tensor_model_parallel_size;
  if (c.sequence_parallel && c.seq_length % tp != 0) {
    Fail(origin.Training("seq_length"),
         fmt::format("{} is not divisible by tensor_model_parallel_size {} (needed by "
                     "sequence_parallel)",
                     c.seq_length, tp));
  }
  if (c.context_parallel_size > 1 && c.seq_length % (2 * c.context_parallel_size) != 0) {
    // Megatron: with context parallelism each rank takes 2 chunks of the sequence.
    Fail(origin.Training("seq_length"),
         fmt::format("{} is not divisible by 2 × context_parallel_size = {}", c.seq_length,
                     2 * c.context_parallel_size));
  }
  if (m.position_embedding_type == PositionEmbedding::kLearnedAbsolute &&
      c.seq_length > m.max_position_embeddings) {
    Fail(origin.Training("seq_length"),
         fmt::format("{} exceeds max_position_embeddings {} (learned absolute position "
                     "embeddings{})",
                     c.seq_length, m.max_position_embeddings,
                     AlsoModel(origin, "max_position_embeddings")));
  }
  const std::vector<int> stages = StageLayerCounts(m, c);
  const int layers_per_stage = *std::max_element(stages.begin(), stages.end());
  if (c.recompute_granularity == RecomputeGranularity::kFull &&
      c.recompute_num_layers > layers_per_stage) {
    Fail(origin.Training("recompute_num_layers"),
         fmt::format("{} exceeds the {} layers per pipeline stage", c.recompute_num_layers,
                     layers_per_stage));
  }
}

// Simulation size: simulated iterations × micro-batches × layers of all stages (see
// kMaxLayerPasses). A long run simulates at most MaxSimulatedIterations (config/iterations.h).
void CheckLayerPasses(const Setup& s, const Origin& origin) {
  const TrainingConfig& c = s.training;
  const int layers = s.model.num_hidden_layers;
  const int iters = MaxSimulatedIterations(s);
  const std::int64_t passes = std::int64_t{iters} * c.num_micro_batches * layers;
  const std::string iters_key = origin.TrainingKey("train_iters");
  const std::string what = iters < c.train_iters ? "simulated iterations" : iters_key;
  if (passes > kMaxLayerPasses) {
    Fail(origin.Training("train_iters"),
         fmt::format("{} × micro-batches per iteration × num_hidden_layers = {} × {} × {} "
                     "= {} layer passes exceed memsim's limit of {}; reduce {}, "
                     "{} (micro-batches) or num_hidden_layers",
                     what, iters, c.num_micro_batches, layers, passes, kMaxLayerPasses,
                     iters_key, origin.TrainingKey("global_batch_size")));
  }
  // hf-trainer evaluation (iterations.h FirstEvaluationStep): eval_batches forward passes of
  // every layer after each step k <= iters that is a multiple of eval_steps, from the first.
  const int first = FirstEvaluationStep(c);
  if (first == 0 || first > iters) return;
  const HfTrainerOptions& h = HfTrainerOf(c);
  const std::int64_t evaluations = (iters - first) / h.eval_steps + 1;
  const std::int64_t eval_passes = evaluations * h.eval_batches * layers;
  if (passes + eval_passes > kMaxLayerPasses) {
    Fail(origin.Training("eval_batches"),
         fmt::format("evaluations × eval_batches × num_hidden_layers = {} × {} × {} = {} "
                     "forward passes, with the {} layer passes of training, exceed memsim's "
                     "limit of {}; reduce eval_batches or raise {}",
                     evaluations, h.eval_batches, layers, eval_passes, passes,
                     kMaxLayerPasses, origin.TrainingKey("eval_steps")));
  }
}

// Weights, gradients and optimizer state of the largest pipeline stage within kMaxRankBytes.
void CheckRankParameters(const Setup& s, const Origin& origin, const RankParameters& p) {
  // Plain PyTorch runs on one device: no model parallelism to suggest.
  const char* more = !StackOf(s.training).Traits().model_parallel
                         ? ""
                         : ", or raise tensor_model_parallel_size or pipeline_model_parallel_size";
  if (p.total * kStateBytesPerParameter > kMaxRankBytes) {
    Fail(origin.Model("hidden_size"),
         fmt::format("model too large for memsim: about {:.3g} parameters per rank ({} layers per "
                     "stage × {:.3g} + {:.3g} embedding), {:.3g} bytes of weights, gradients and "
                     "optimizer state at {} bytes each, over memsim's limit of 2^50 bytes (1 PiB); "
                     "reduce hidden_size, intermediate_size, num_hidden_layers or vocab_size{}",
                     p.total, p.layers_per_stage, p.per_layer, p.embedding,
                     p.total * kStateBytesPerParameter, kStateBytesPerParameter, more));
  }
}

// Megatron-FSDP pads every bucket to a multiple of d·cp × the lcm of its weights' row widths
// (h, q/TP, ffn/TP; workload/model.h LayoutGradBuffers). Odd widths make that multiple huge.
void CheckFsdpPadding(const Setup& s, const Origin& origin, const RankParameters& p) {
  const ModelConfig& m = s.model;
  const TrainingConfig& c = s.training;
  if (!c.use_megatron_fsdp || c.fsdp_sharding == FsdpSharding::kNoShard) return;
  const int tp = c.tensor_model_parallel_size;
  const std::int64_t widths[] = {m.hidden_size,
                                 std::int64_t{m.num_attention_heads} / tp * m.head_dim,
                                 std::int64_t{m.intermediate_size} / tp};
  double factor = 1;  // the lcm, in double once it passes 2^50 (then only its size matters)
  std::int64_t lcm = 1;
  for (std::int64_t w : widths) {
    if (w <= 0 || factor > kMaxRankBytes) continue;
    const std::int64_t step = w / std::gcd(lcm, w);
    factor = static_cast<double>(lcm) * static_cast<double>(step);
    if (factor <= kMaxRankBytes) lcm *= step;
  }
  const double buckets =
      c.overlap_grad_reduce ? 1 + std::floor(p.total / 4e7) : 1;  // bucket_size >= 4e7
  const double pad = factor * c.data_parallel_size * c.context_parallel_size * buckets;
  if ((p.total + pad) * kStateBytesPerParameter > kMaxRankBytes) {
    Fail(origin.Training("data_parallel_size"),
         fmt::format("model too large for memsim: Megatron-FSDP pads each of {:.3g} bucket(s) to a "
                     "multiple of data_parallel_size × context_parallel_size × lcm(hidden_size, "
                     "heads/TP × head_dim, ffn/TP) = {:.3g} elements, over memsim's limit of "
                     "2^50 bytes (1 PiB) with the weights, gradients and optimizer state; reduce "
                     "data_parallel_size or use widths with common factors",
                     buckets, factor * c.data_parallel_size * c.context_parallel_size));
  }
}

// The model's widths in double (products of them can pass int64): TP, hidden, FFN, the query
// and key/value projection widths, and 2 for a gated MLP.
struct Widths {
  double tp, h, ffn, q, kv, gamma;
};
Widths WidthsOf(const Setup& s) {
  const ModelConfig& m = s.model;
  return {static_cast<double>(s.training.tensor_model_parallel_size),
          static_cast<double>(m.hidden_size),
          static_cast<double>(m.intermediate_size),
          static_cast<double>(m.num_attention_heads) * m.head_dim,
          static_cast<double>(m.num_key_value_heads) * m.head_dim,
          m.gated_mlp ? 2.0 : 1.0};
}

// Largest activation of one micro-batch, at 4 bytes an element (fp32, the widest): attention
// scores b × heads/TP × (seq/CP) × seq without flash attention, logits T × V/TP, the MLP's
// T × γ ffn/TP, the QKV output T × (q + 2 kv)/TP, T = seq/CP × b tokens.
void CheckActivation(const Setup& s, const Origin& origin) {
  const ModelConfig& m = s.model;
  const TrainingConfig& c = s.training;
  const Widths w = WidthsOf(s);
  const double tp = w.tp, h = w.h, ffn = w.ffn, q = w.q, kv = w.kv, gamma = w.gamma;
  const double tokens =
      static_cast<double>(c.seq_length) / c.context_parallel_size * c.micro_batch_size;
  double largest = std::max({tokens * static_cast<double>(m.padded_vocab_size) / tp,
                             tokens * gamma * ffn / tp, tokens * (q + 2 * kv) / tp, tokens * h});
  if (!c.use_flash_attn) {
    largest = std::max(largest,
                       tokens * (static_cast<double>(m.num_attention_heads) / tp) * c.seq_length);
  }
  if (largest * 4 > kMaxRankBytes) {
    Fail(origin.Training("seq_length"),
         fmt::format("model too large for memsim: one activation of a micro-batch would take "
                     "about {:.3g} bytes, over memsim's limit of 2^50 bytes (1 PiB); reduce "
                     "{}, {} or the model's width{}",
                     largest * 4, origin.TrainingKey("seq_length"),
                     origin.TrainingKey("micro_batch_size"),
                     c.use_flash_attn ? "" : FlashAttentionHint(origin)));
  }
}

}  // namespace

RankParameters EstimateRankParameters(const Setup& s) {
  const ModelConfig& m = s.model;
  const TrainingConfig& c = s.training;
  const Widths w = WidthsOf(s);
  const double tp = w.tp, h = w.h, ffn = w.ffn, q = w.q, kv = w.kv, gamma = w.gamma;
  RankParameters p;
  const std::vector<int> stages = StageLayerCounts(m, c);
  p.layers_per_stage = *std::max_element(stages.begin(), stages.end());
  p.per_layer = (h * (q + 2 * kv) + q * h + (gamma + 1) * h * ffn + 4 * h) / tp;
  p.embedding = 2 * static_cast<double>(m.padded_vocab_size) * h / tp +
                (m.position_embedding_type == PositionEmbedding::kLearnedAbsolute
                     ? static_cast<double>(m.max_position_embeddings) * h
                     : 0);
  p.total = p.layers_per_stage * p.per_layer + p.embedding;
  return p;
}

void CheckWritten(const Setup& s, const Origin& origin) {
  CheckShape(s, origin);
  CheckVirtualStages(s, origin);
  CheckBatch(s, origin);
  CheckMoe(s, origin);
  CheckMla(s, origin);
}

void CheckDerived(const Setup& s, const Origin& origin) {
  const TrainingConfig& c = s.training;
  if (c.num_micro_batches > kMaxMicroBatches) {
    Fail(origin.Training("global_batch_size"),
         fmt::format("{} micro-batches per iteration exceed memsim's limit of {}",
                     c.num_micro_batches, kMaxMicroBatches));
  }
  CheckSequence(s, origin);
  if (s.model.padded_vocab_size > kMaxPaddedVocab) {
    // Megatron _vocab_size_with_padding: a multiple of make_vocab_size_divisible_by × TP.
    Fail(origin.Training("make_vocab_size_divisible_by"),
         fmt::format("padding vocab_size {} to a multiple of {} × tensor_model_parallel_size {} "
                     "gives {}, over memsim's limit of {}",
                     s.model.vocab_size, s.model.make_vocab_size_divisible_by,
                     c.tensor_model_parallel_size, s.model.padded_vocab_size, kMaxPaddedVocab));
  }
  CheckLayerPasses(s, origin);
  const RankParameters p = EstimateRankParameters(s);
  CheckRankParameters(s, origin, p);
  CheckFsdpPadding(s, origin, p);
  CheckActivation(s, origin);
  if (origin.gradient_accumulation_steps &&
      *origin.gradient_accumulation_steps != c.num_micro_batches) {
    Fail(
        origin.Training("gradient_accumulation_steps"),
        fmt::format("{} disagrees with global_batch_size / ({} × {}) = {}",
                    *origin.gradient_accumulation_steps, origin.TrainingKey("micro_batch_size"),
                    origin.TrainingKey("data_parallel_size"), c.num_micro_batches));
  }
}

}  // namespace memsim::config::internal
