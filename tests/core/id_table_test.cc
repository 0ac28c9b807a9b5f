#include "core/id_table.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

namespace memsim {
namespace {

TEST_CASE("IdTable: insert, find, erase", "[core]") {
  IdTable<int> t;
  CHECK(t.empty());
  CHECK(t.Find(7) == nullptr);
  CHECK_FALSE(t.Erase(7));
  CHECK(t.Insert(7, 70));
  CHECK_FALSE(t.Insert(7, 71));  // present: unchanged
  REQUIRE(t.Find(7) != nullptr);
  CHECK(*t.Find(7) == 70);
  CHECK(t.size() == 1);
  CHECK(t.Erase(7));
  CHECK(t.Find(7) == nullptr);
  CHECK(t.empty());
}

// A seeded mix of inserts and erases of ids that come and go like tensor ids (a sliding window
// over increasing ids, plus long-lived ones), checked against std::map after every operation:
// backward-shift deletion must keep every remaining id reachable across growth.
TEST_CASE("IdTable: agrees with std::map over a seeded run", "[core]") {
  const std::uint64_t seed = GENERATE(1u, 2u, 3u);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull;
  auto next = [&state] {  // xorshift64
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  IdTable<std::uint64_t> t;
  std::map<std::uint64_t, std::uint64_t> ref;
  std::uint64_t next_id = 1;
  for (int step = 0; step < 20000; ++step) {
    const std::uint64_t r = next() % 10;
    if (r < 5 || ref.empty()) {
      const std::uint64_t id = next_id++;
      CHECK(t.Insert(id, id * 3));
      ref.emplace(id, id * 3);
    } else {
      // Erase a live id: usually a recent one, sometimes any.
      auto it = r < 9 ? std::prev(ref.end()) : ref.lower_bound(next() % next_id);
      if (it == ref.end()) it = ref.begin();
      CHECK(t.Erase(it->first));
      ref.erase(it);
    }
    REQUIRE(t.size() == ref.size());
  }
  for (std::uint64_t id = 1; id < next_id; ++id) {
    auto it = ref.find(id);
    const std::uint64_t* v = t.Find(id);
    REQUIRE((v != nullptr) == (it != ref.end()));
    if (v != nullptr) CHECK(*v == it->second);
  }
  std::vector<std::uint64_t> seen;
  t.ForEach([&seen](std::uint64_t id, std::uint64_t) { seen.push_back(id); });
  CHECK(seen.size() == ref.size());
}

}  // namespace
}  // namespace memsim
