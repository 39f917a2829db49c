// Test helpers: reproducible random values of any element type, and bit-for-bit comparison.
#pragma once

#include <cstring>
#include <random>
#include <vector>

// n values uniform in [lo, hi), drawn in float from a generator seeded with `salt`, converted to T.
template <class T>
std::vector<T> random_values(std::size_t n, unsigned salt, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 g(salt);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = T(u(g));
  return v;
}

// The same length and the same bytes.
template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
