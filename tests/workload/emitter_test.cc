// Emitter (emitter.h): the only writer of a Program. Its contract: allocations at an op's start,
// frees at its end, the context stamped on every op, shared ownership by reference counts, ops
// handed to a sink as they close.
#include "workload/emitter.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "workload/module_harness.h"
#include "workload/test_setups.h"

namespace memsim::workload::emitter_test {

TEST_CASE(
    "an op allocates at its start and frees at its end, stamped with the context and the "
    "name prefix",
    "[workload][emitter]") {
  Emitter em(testing::TinyLlama(), /*pipeline_rank=*/0, /*num_iterations=*/1);
  em.SetContext(1, Phase::kForward, 0);
  em.Begin("a", /*layer=*/3);
  const TensorId x = em.Alloc(100, Category::kActivations, "x");
  const TensorId y = em.Alloc(50, Category::kTemporaries, "y");
  em.Free(y);
  em.Free(0);  // "none": ignored
  em.SetPrefix("recompute.");
  em.Begin("b");
  em.Free(x);
  const Program p = em.Finish();
  REQUIRE(p.ops.size() == 2);
  CHECK(p.ops[0].name == "a");
  CHECK(p.ops[0].layer == 3);
  CHECK(p.ops[0].iteration == 1);
  CHECK(p.ops[0].phase == Phase::kForward);
  CHECK(p.ops[0].micro_batch == 0);
  CHECK(p.ops[0].allocs == std::vector<TensorAlloc>{{x, 100, Category::kActivations, "x"},
                                                    {y, 50, Category::kTemporaries, "y"}});
  CHECK(p.ops[0].frees == std::vector<TensorId>{y});
  CHECK(p.ops[1].name == "recompute.b");
  CHECK(p.ops[1].frees == std::vector<TensorId>{x});
  // Tensor ids start at 1 (0 means none).
  CHECK(x == 1);
}

TEST_CASE("a referenced tensor is freed by its last holder's Unref, in the op then open",
          "[workload][emitter]") {
  testing::ModuleHarness h(testing::TinyLlama());
  Emitter& em = h.em();
  h.Run(Phase::kForward, [&](ModuleContext&) {
    em.Begin("make");
    const TensorId t = em.Alloc(64, Category::kActivations, "shared");
    em.Ref(t);
    em.Ref(t);
    CHECK(em.Refs(t) == 2);
    em.Begin("first_holder_done");
    em.Unref(t);
    CHECK(em.Refs(t) == 1);
    em.Begin("second_holder_done");
    em.Unref(t);
    CHECK(em.ReferencedTensors() == 0);
  });
  CHECK(h.Leaked().empty());
  // The free is in the second holder's op, not the first's.
  const std::vector<Op>& ops = h.ops();
  const auto op = [&](const std::string& name) {
    return *std::find_if(ops.begin(), ops.end(), [&](const Op& o) { return o.name == name; });
  };
  CHECK(op("first_holder_done").frees.empty());
  CHECK(op("second_holder_done").frees.size() == 1);
}

TEST_CASE("a collective names its group and size, a group of one rank makes none",
          "[workload][emitter]") {
  Emitter em(testing::TinyLlama(), 0, 1);
  em.Begin("single");
  em.Collective(CommGroup::kDp, 1, 1e6, Coll::kAllReduce);
  em.Begin("pair");
  em.Collective(CommGroup::kTp, 2, 1e6, Coll::kAllReduce);
  const Program p = em.Finish();
  CHECK(p.ops[0].collective_group.empty());
  CHECK(p.ops[1].collective_group == "tp");
  CHECK(p.ops[1].collective_ranks == 2);
  // 10 us plus 1 MB · 2(n-1)/n over 100 GB/s = 10 us more (emitter.h's estimate).
  CHECK(p.ops[1].duration_us == Approx(20.0));
}

}  // namespace memsim::workload::emitter_test
