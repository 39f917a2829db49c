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

// Calls call() 20 times, or fewer (2 at least) when they take over a second together: the first
// uses of a shape (a product's primitive, a page's first touch) out of the timed rounds.
template <class F>
void warm_up(F&& call) {
  auto const t0 = std::chrono::steady_clock::now();
  for (int w = 0; w < 20; ++w) {
    call();
    if (w >= 1 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > 1.0) break;
  }
}

// How many calls the heap count after the timing makes: 100, or fewer (1 at least) when they
// would take over a second (a call of the convolutional surrogate at batch 4096 takes seconds).
inline int count_calls(double seconds_per_call) {
  return seconds_per_call * 100 <= 1.0 ? 100 : std::max(1, int(1.0 / seconds_per_call));
}

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
