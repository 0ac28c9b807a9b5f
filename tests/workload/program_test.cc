#include "workload/program.h"

#include <catch2/catch.hpp>

namespace memsim::workload {
namespace {

// Op::Clear must leave an op equal to a default one whatever was set, since the engine hands
// cleared ops back to the generator (OpSink::TakeSpareOp). Every field is set here.
TEST_CASE("Op::Clear resets every field", "[workload]") {
  Op op;
  op.name = "a long enough op name to live on the heap";
  op.iteration = 3;
  op.phase = Phase::kBackward;
  op.micro_batch = 5;
  op.layer = 7;
  op.stream = kCommStream;
  op.duration_us = 12.5;
  op.allocs.push_back({1, 4096, Category::kActivations, "layer0.x"});
  op.frees.push_back(2);
  op.record_streams.emplace_back(1, kCommStream);
  op.collective_group = "dp";
  op.collective_ranks = 8;
  op.synchronize = true;
  op.empty_cache = true;
  op.managed_bytes = 1 << 20;
  REQUIRE_FALSE(op == Op{});
  op.Clear();
  CHECK(op == Op{});
}

}  // namespace
}  // namespace memsim::workload
