#include "core/parallel.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

namespace memsim {
namespace {

TEST_CASE("RunInOrder: merges every item in order, whatever the threads", "[core][parallel]") {
  for (int threads : {0, 1, 2, 3, 8, 64}) {
    for (int n : {0, 1, 2, 7, 40}) {
      INFO("threads " << threads << ", n " << n);
      std::vector<long> results(static_cast<size_t>(n), 0);
      std::vector<int> merged;
      RunInOrder(
          n, threads,
          [&](int i) {
            // Uneven work, so that later items often finish first.
            long sum = 0;
            for (long k = 0; k < (n - i) * 20000L; ++k) sum += k % 7;
            results[static_cast<size_t>(i)] = sum + i;
          },
          [&](int i) {
            REQUIRE(results[static_cast<size_t>(i)] > 0);  // work(i) has returned
            merged.push_back(i);
          });
      std::vector<int> expected(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
      CHECK(merged == expected);
    }
  }
}

TEST_CASE("RunInOrder: at most `threads` items started and not yet merged", "[core][parallel]") {
  for (int threads : {1, 2, 3}) {
    std::atomic<int> started{0};
    std::atomic<int> merged{0};
    std::atomic<int> most{0};
    RunInOrder(
        30, threads,
        [&](int) {
          const int waiting = ++started - merged.load();
          int seen = most.load();
          while (waiting > seen && !most.compare_exchange_weak(seen, waiting)) {
          }
        },
        [&](int) { ++merged; });
    CHECK(merged.load() == 30);
    CHECK(most.load() <= threads);
  }
}

TEST_CASE("RunInOrder: the lowest failing item's exception, after the items before it",
          "[core][parallel]") {
  for (int threads : {1, 2, 4}) {
    INFO("threads " << threads);
    std::vector<int> merged;
    std::atomic<int> worked_after{0};
    try {
      RunInOrder(
          20, threads,
          [&](int i) {
            if (i == 5 || i == 7) throw std::runtime_error("item " + std::to_string(i));
            if (i >= 5 + threads) ++worked_after;  // never started: 0..4 merged, window `threads`
          },
          [&](int i) { merged.push_back(i); });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "item 5");
    }
    CHECK(merged == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(worked_after.load() == 0);
  }
}

TEST_CASE("RunInOrder: an exception of merge stops the run", "[core][parallel]") {
  for (int threads : {1, 3}) {
    std::vector<int> merged;
    CHECK_THROWS_WITH(RunInOrder(
                          10, threads, [](int) {},
                          [&](int i) {
                            if (i == 2) throw std::runtime_error("merge 2");
                            merged.push_back(i);
                          }),
                      "merge 2");
    CHECK(merged == std::vector<int>{0, 1});
  }
}

TEST_CASE("AvailableCpus is at least one", "[core][parallel]") { CHECK(AvailableCpus() >= 1); }

}  // namespace
}  // namespace memsim
