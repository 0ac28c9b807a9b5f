#include "workload/format.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "test_setups.h"
#include "workload/build.h"

namespace memsim::workload {
namespace {

TEST_CASE("FormatProgram prints one op a line with labels", "[workload]") {
  config::Setup s = testing::PaperGpt();
  s.model.num_hidden_layers = 1;
  s.training.train_iters = 1;
  const Program p = Build(s, 0);
  const std::string text = FormatProgram(p);
  CHECK(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) == p.ops.size() + 1);
  CHECK(text.find("1 forward mb=0 layer=0 s0 attn.ln_qkv") != std::string::npos);
  CHECK(text.find("+layer0.attn.qkv:12582912:activations") != std::string::npos);
  CHECK(text.find(" -layer0.attn.qkv") != std::string::npos);
}

TEST_CASE("FormatProgram shows record_streams, collectives and sync flags", "[workload]") {
  Program p;
  Op a;
  a.name = "p2p.alloc_recv_forward";
  a.iteration = 1;
  a.phase = Phase::kForward;
  a.micro_batch = 0;
  a.duration_us = 2;
  a.allocs.push_back({7, 4096, Category::kCommunication, "p2p.recv_forward"});
  Op b;
  b.name = "p2p.recv_forward";
  b.iteration = 1;
  b.phase = Phase::kForward;
  b.micro_batch = 0;
  b.stream = kCommStream;
  b.duration_us = 10;
  b.record_streams.emplace_back(7, kCommStream);
  b.collective_group = "pp";
  b.synchronize = true;
  b.frees.push_back(7);
  p.ops = {a, b};
  const std::string text = FormatProgram(p);
  CHECK(text.find("1 forward mb=0 layer=- s0 p2p.alloc_recv_forward 2.0us "
                  "+p2p.recv_forward:4096:communication\n") != std::string::npos);
  CHECK(text.find("1 forward mb=0 layer=- s1 p2p.recv_forward 10.0us -p2p.recv_forward "
                  "rs=p2p.recv_forward@1 coll=pp sync\n") != std::string::npos);
}

}  // namespace
}  // namespace memsim::workload
