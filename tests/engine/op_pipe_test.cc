// OpPipe (engine/op_pipe.h): the target gets exactly the ops the generator sent, in order, on
// the pipe's thread; an exception of the target reaches the generator; spent ops come back.
#include "engine/op_pipe.h"

#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace memsim::engine {
namespace {

// Records each op's name; throws at op `fail_at` (-1: never). Hands back every op it got,
// cleared, as a spent one.
class Recording final : public workload::OpSink {
 public:
  explicit Recording(int fail_at = -1) : fail_at_(fail_at) {}
  void OnOp(workload::Op&& op) override {
    if (static_cast<int>(names.size()) == fail_at_) throw std::runtime_error("op " + op.name);
    names.push_back(op.name);
    op.Clear();
    spent_.push_back(std::move(op));
  }
  workload::Op TakeSpareOp() override {
    if (spent_.empty()) return {};
    workload::Op op = std::move(spent_.back());
    spent_.pop_back();
    return op;
  }
  std::vector<std::string> names;

 private:
  int fail_at_;
  std::vector<workload::Op> spent_;
};

workload::Op Named(workload::OpSink& sink, int i) {
  workload::Op op = sink.TakeSpareOp();
  REQUIRE(op == workload::Op{});  // spent ops come back cleared
  op.name = "op" + std::to_string(i);
  return op;
}

TEST_CASE("OpPipe: the target gets every op in order", "[engine][threads]") {
  // Not a multiple of the batch: the last, partial batch goes at Drain.
  for (int n : {0, 1, 127, 128, 129, 5000}) {
    Recording target;
    {
      OpPipe pipe(target);
      for (int i = 0; i < n; ++i) pipe.OnOp(Named(pipe, i));
      pipe.Drain();
      REQUIRE(static_cast<int>(target.names.size()) == n);  // all fed once Drain returns
    }
    for (int i = 0; i < n; ++i) CHECK(target.names[static_cast<size_t>(i)] == "op" + std::to_string(i));
  }
}

TEST_CASE("OpPipe: the target's exception reaches the generator; no later op is fed",
          "[engine][threads]") {
  Recording target(/*fail_at=*/300);
  bool thrown = false;
  try {
    OpPipe pipe(target);
    try {
      for (int i = 0; i < 5000; ++i) pipe.OnOp(Named(pipe, i));
    } catch (...) {
      pipe.Drain();
      throw;
    }
    pipe.Drain();
  } catch (const std::runtime_error& e) {
    thrown = true;
    CHECK(std::string(e.what()) == "op op300");
  }
  CHECK(thrown);
  CHECK(target.names.size() == 300);
}

TEST_CASE("OpPipe: a generator's exception leaves the ops before it fed", "[engine][threads]") {
  Recording target;
  try {
    OpPipe pipe(target);
    try {
      for (int i = 0; i < 1000; ++i) {
        if (i == 700) throw std::invalid_argument("generator");
        pipe.OnOp(Named(pipe, i));
      }
    } catch (...) {
      pipe.Drain();
      throw;
    }
  } catch (const std::invalid_argument&) {
  }
  CHECK(target.names.size() == 700);
}

}  // namespace
}  // namespace memsim::engine
