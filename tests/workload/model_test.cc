#include "workload/model.h"

#include <catch2/catch.hpp>
#include <numeric>

#include "test_setups.h"

namespace memsim::workload {
namespace {

std::int64_t Count(const std::vector<ParamTensor>& params) {
  std::int64_t n = 0;
  for (const ParamTensor& p : params) n += p.numel;
  return n;
}

TEST_CASE("llama2-7b at TP2: parameter count per rank", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.training.tensor_model_parallel_size = 2;
  // Per layer on one TP rank (h = 4096, ffn = 11008, MHA, no biases, RMSNorm):
  //   ln1, ln2 weights       2·4096                 =      8,192
  //   qkv [(h + 2h)/2, h]    6144·4096              = 25,165,824
  //   proj [h, h/2]          4096·2048              =  8,388,608
  //   fc1 [2·11008/2, h]     11008·4096             = 45,088,768
  //   fc2 [h, 11008/2]       4096·5504              = 22,544,384
  //                                           layer = 101,195,776; ×32 = 3,238,264,832
  // Vocab padded to a multiple of 128·t = 256: 32000 = 125·256 -> V = 32000, V/t = 16000.
  //   word embedding 16000·4096 = 65,536,000; untied output layer the same; final norm 4096.
  // Total 3,238,264,832 + 2·65,536,000 + 4096 = 3,369,340,928.
  const std::vector<ParamTensor> params = StageParams(s, 0);
  CHECK(Count(params) == 3'369'340'928);
  CHECK(ComputeDims(s).V == 32000);
  CHECK(params.front().name == "embedding.word_embeddings.weight");
  CHECK(params.back().name == "output_layer.weight");
}

TEST_CASE("llama2-70b at TP8 PP8: parameter count of one stage", "[workload]") {
  config::Setup s = testing::Llama2_70b();
  s.training.tensor_model_parallel_size = 8;
  s.training.pipeline_model_parallel_size = 8;
  // 80/8 = 10 layers per stage. Per layer on one TP rank (h 8192, ffn 28672, q = 8192,
  // kv = 8·128 = 1024):
  //   qkv [(8192 + 2·1024)/8, 8192] = 1280·8192  = 10,485,760
  //   proj [8192, 8192/8]            = 8192·1024  =  8,388,608
  //   fc1 [2·28672/8, 8192]          = 7168·8192  = 58,720,256
  //   fc2 [8192, 28672/8]            = 8192·3584  = 29,360,128
  //   two RMSNorm weights            = 2·8192     =     16,384
  //                                         layer = 106,971,136; ×10 = 1,069,711,360
  CHECK(Count(StageParams(s, 3)) == 1'069'711'360);
  // First stage adds the embedding: V = ceil(32000/1024)·1024 = 32768, V/t = 4096 rows of 8192
  // = 33,554,432. Last stage: final norm 8192 + output layer 33,554,432.
  CHECK(Count(StageParams(s, 0)) == 1'069'711'360 + 33'554'432);
  CHECK(Count(StageParams(s, 7)) == 1'069'711'360 + 8192 + 33'554'432);
}

TEST_CASE("tied embeddings: one tensor at p = 1, a copy on the last stage at p > 1", "[workload]") {
  config::Setup s = testing::PaperGpt();
  std::vector<ParamTensor> params = StageParams(s, 0);
  CHECK(std::count_if(params.begin(), params.end(),
                      [](const ParamTensor& p) { return p.name == "output_layer.weight"; }) == 0);
  s.training.pipeline_model_parallel_size = 2;
  params = StageParams(s, 1);
  REQUIRE(params.back().name == "output_layer.weight");
  CHECK(params.back().shared_embedding);
  CHECK(StageParams(s, 0).front().shared_embedding);
}

TEST_CASE("DDP buffer padding with the distributed optimizer", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.use_distributed_optimizer = true;
  s.training.data_parallel_size = 3;
  const std::vector<ParamTensor> params = StageParams(s, 0);
  const std::vector<GradBuffer> bufs = LayoutGradBuffers(s, 0, params);
  REQUIRE(bufs.size() == 1);
  // Without overlap_grad_reduce: one bucket, its end padded to lcm(3, 128) = 384 elements.
  REQUIRE(bufs[0].buckets.size() == 1);
  CHECK(bufs[0].numel_padded % 384 == 0);
  std::int64_t prev_end = 0;
  for (const GradBuffer::Entry& e : bufs[0].entries) {
    CHECK(e.start % 64 == 0);  // param starts padded to 64 elements
    CHECK(e.start >= prev_end);
    CHECK(e.start - prev_end < 64);
    prev_end = e.end;
  }
  // Reverse registration order: the first entry is the last registered param.
  CHECK(bufs[0].entries.front().param == static_cast<int>(params.size()) - 1);
  // DP rank 0's shard: 1/3 of the padded buffer, less the padding that falls inside it.
  const auto slices = ShardSlices(ComputeDims(s), params, bufs);
  std::int64_t owned = 0;
  for (const ShardSlice& sl : slices) owned += sl.numel;
  CHECK(owned <= bufs[0].numel_padded / 3);
  CHECK(owned > bufs[0].numel_padded / 3 - 64 * static_cast<std::int64_t>(params.size()));
}

TEST_CASE("overlap_grad_reduce buckets close at max(4e7, 1e6·d) elements on rank 0", "[workload]") {
  config::Setup s = testing::Llama2_7b();
  s.training.overlap_grad_reduce = true;
  s.training.data_parallel_size = 8;
  const std::vector<ParamTensor> params = StageParams(s, 0);
  const std::vector<GradBuffer> bufs = LayoutGradBuffers(s, 0, params);
  REQUIRE(bufs.size() == 1);
  // 6.7e9 params in buckets of >= 4e7 elements (each closes at the first param that reaches it):
  // more than one bucket, and every bucket but the last holds at least 4e7 elements.
  REQUIRE(bufs[0].buckets.size() > 1);
  for (size_t i = 0; i + 1 < bufs[0].buckets.size(); ++i) {
    CHECK(bufs[0].buckets[i].second - bufs[0].buckets[i].first >= 40'000'000);
  }
}

}  // namespace
}  // namespace memsim::workload

namespace memsim::workload {
namespace {

TEST_CASE("tied embedding with p > 1 gets its own bucket with the distributed optimizer",
          "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.training.pipeline_model_parallel_size = 2;
  s.training.data_parallel_size = 2;
  // First stage: reverse order puts the word embedding last; it closes the layers' bucket and
  // takes a bucket of its own (Megatron `_does_param_require_new_bucket`).
  s.training.use_distributed_optimizer = true;
  std::vector<GradBuffer> bufs = LayoutGradBuffers(s, 0, StageParams(s, 0));
  REQUIRE(bufs[0].buckets.size() == 2);
  CHECK(bufs[0].entries.back().bucket == 1);
  CHECK(bufs[0].entries.back().param == 0);
  // Without the distributed optimizer there is one bucket.
  s.training.use_distributed_optimizer = false;
  bufs = LayoutGradBuffers(s, 0, StageParams(s, 0));
  CHECK(bufs[0].buckets.size() == 1);
}

}  // namespace
}  // namespace memsim::workload

namespace memsim::workload {
namespace {

// The layer indices of a rank's transformer-layer parameters ("layer<i>.ln1.weight" marks each).
std::vector<int> LayersOf(const std::vector<ParamTensor>& params) {
  std::vector<int> out;
  for (const ParamTensor& p : params) {
    if (p.layer >= 0 && (out.empty() || out.back() != p.layer)) out.push_back(p.layer);
  }
  return out;
}

TEST_CASE("an uneven pipeline split builds each rank's own layers, offset by the ranks before it",
          "[workload][pipeline]") {
  config::Setup s = testing::TinyLlama();
  s.model.num_hidden_layers = 14;
  s.training.pipeline_model_parallel_size = 4;
  s.training.decoder_first_pipeline_num_layers = 3;
  s.training.decoder_last_pipeline_num_layers = 3;
  const ModelDims d = ComputeDims(s);
  // get_num_layers_to_build: 3, (14 − 3 − 3) / 2 = 4, 4, 3; get_transformer_layer_offset: the
  // layers of the ranks before.
  CHECK(d.StageLayers(0) == 3);
  CHECK(d.StageLayers(1) == 4);
  CHECK(d.StageLayers(3) == 3);
  CHECK(d.FirstLayer(0, 2) == 7);
  CHECK(d.IndexInChunk(7) == 0);
  CHECK(d.IndexInChunk(13) == 2);
  CHECK(d.ChunkLayersAt(13) == 3);
  CHECK(LayersOf(StageParams(s, 0)) == std::vector<int>{0, 1, 2});
  CHECK(LayersOf(StageParams(s, 1)) == std::vector<int>{3, 4, 5, 6});
  CHECK(LayersOf(StageParams(s, 2)) == std::vector<int>{7, 8, 9, 10});
  CHECK(LayersOf(StageParams(s, 3)) == std::vector<int>{11, 12, 13});
  // Every layer is built once: the ranks' parameters sum to the model's.
  config::Setup one = s;
  one.training.pipeline_model_parallel_size = 1;
  one.training.decoder_first_pipeline_num_layers = 0;
  one.training.decoder_last_pipeline_num_layers = 0;
  std::int64_t sum = 0;
  for (int r = 0; r < 4; ++r) sum += Count(StageParams(s, r));
  CHECK(sum == Count(StageParams(one, 0)));
}

}  // namespace
}  // namespace memsim::workload
