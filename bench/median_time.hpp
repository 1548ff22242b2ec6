// The timing the scale benches share: the median wall time of `rounds` calls, in milliseconds.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace fairkv_bench {

template <class F>
double median_ms(int rounds, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace fairkv_bench
