// The timing loop bench_inference and its libtorch twin share (a plain header: the libtorch one
// is built without remat): `rounds` rounds of calls for at least `seconds` each (and at least 5
// calls), the median of the rounds' time per call, and the calls made.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace bench_timing {

struct result {
  double seconds_per_call;  // the median over the rounds
  std::size_t calls;        // in all the rounds
};

template <class F>
result per_call(F&& call, int rounds, double seconds) {
  std::vector<double> per_round;
  std::size_t calls = 0;
  for (int r = 0; r < rounds; ++r) {
    std::size_t n = 0;
    auto const t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds || n < 5) {
      call();
      ++n;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    per_round.push_back(elapsed / double(n));
    calls += n;
  }
  std::sort(per_round.begin(), per_round.end());
  return {per_round[per_round.size() / 2], calls};
}

}  // namespace bench_timing
