// The forward pass's fork-join pool: every index visited exactly once, shares contiguous, reusable many times.
#include <doctest/doctest.h>

#include <atomic>
#include <vector>

#include "thread_pool.hpp"

TEST_CASE("thread_pool: parallel_for covers [0, n) exactly once, repeatedly") {
  for (int threads : {1, 2, 3, 5}) {
    llama::thread_pool pool(threads);
    CHECK(pool.size() == threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000}}) {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          CHECK(b < e);  // empty shares are not called
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        int bad = 0;
        for (auto& h : hits) bad += h.load() != 1;
        REQUIRE(bad == 0);
      }
    }
  }
}
