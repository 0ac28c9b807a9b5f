// Test helpers for the allocator model: a fixture that names blocks by string id, checks the
// invariants after every operation, and runs tiny scripts such as
// "malloc a 3MiB; free a; rep 4096 malloc 512; record a 2; complete 2; empty_cache".
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "core/units.h"

namespace memsim::alloc::testing {

// "1000" -> 1000, "3MiB" -> 3 x 2^20, "2KiB" -> 2048.
inline Bytes ParseTestBytes(const std::string& s) {
  auto ends = [&](const char* suf) {
    const std::string x = suf;
    return s.size() > x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (ends("GiB")) return std::stoll(s.substr(0, s.size() - 3)) * kGiB;
  if (ends("MiB")) return std::stoll(s.substr(0, s.size() - 3)) * kMiB;
  if (ends("KiB")) return std::stoll(s.substr(0, s.size() - 3)) * kKiB;
  return std::stoll(s);
}

class AllocFixture {
 public:
  explicit AllocFixture(const AllocatorOptions& options = {})
      : alloc_(NewCachingAllocator(options)) {}

  // Returns false iff the malloc failed (out of memory).
  bool Malloc(const std::string& id, Bytes bytes, StreamId stream = 0) {
    auto h = alloc_->Malloc(bytes, stream);
    Check();
    if (h) handles_[id] = *h;
    return h.has_value();
  }
  void Free(const std::string& id) {
    REQUIRE(handles_.count(id) == 1);
    alloc_->Free(handles_[id]);
    handles_.erase(id);
    Check();
  }
  void Record(const std::string& id, StreamId stream) {
    REQUIRE(handles_.count(id) == 1);
    alloc_->RecordStream(handles_[id], stream);
    Check();
  }
  void Complete(StreamId stream) {
    alloc_->CompleteStream(stream);
    Check();
  }
  void EmptyCache() {
    alloc_->EmptyCache();
    Check();
  }
  void Run(const std::string& script) {
    std::stringstream all(script);
    std::string stmt;
    while (std::getline(all, stmt, ';')) {
      std::stringstream in(stmt);
      std::string op;
      if (!(in >> op)) continue;
      int reps = 1;
      if (op == "rep") {
        in >> reps >> op;
      }
      std::string a, b, c;
      in >> a >> b >> c;
      for (int i = 0; i < reps; ++i) {
        if (op == "malloc" && reps > 1) {
          Malloc("rep" + std::to_string(counter_++), ParseTestBytes(a), b.empty() ? 0 : std::stoi(b));
        } else if (op == "malloc") {
          Malloc(a, ParseTestBytes(b), c.empty() ? 0 : std::stoi(c));
        } else if (op == "free") {
          Free(a);
        } else if (op == "record") {
          Record(a, std::stoi(b));
        } else if (op == "complete") {
          Complete(std::stoi(a));
        } else if (op == "empty_cache") {
          EmptyCache();
        } else {
          FAIL("bad test script op " << op);
        }
      }
    }
  }
  const AllocatorStats& S() const { return alloc_->Stats(); }
  Bytes Allocated() const { return S().allocated_bytes.current; }
  Bytes Reserved() const { return S().reserved_bytes.current; }
  Bytes Active() const { return S().active_bytes.current; }
  Bytes Requested() const { return S().requested_bytes.current; }
  Bytes Segments() const { return S().segment.current; }
  Allocator& A() { return *alloc_; }

 private:
  void Check() {
    const std::string problem = alloc_->CheckInvariants();
    INFO(problem);
    REQUIRE(problem.empty());
  }
  std::unique_ptr<Allocator> alloc_;
  std::map<std::string, BlockHandle> handles_;
  int counter_ = 0;
};

}  // namespace memsim::alloc::testing
