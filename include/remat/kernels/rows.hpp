// Row-wise building blocks: run f(i) for every index on the device's threads, and column sums
// (the gradient of a bias broadcast over rows), accumulated in the compute type.
#pragma once

#include "../device.hpp"
#include "../numeric/compute.hpp"
#include "detail/thrust.hpp"

#include <thrust/for_each.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace REMAT_NAMESPACE {
namespace kernels {

// f(i) for i in [0, n); `work` is the number of elements touched in all, to decide on threads.
template <class F>
void for_each_index(host, std::size_t n, std::size_t work, F const& f) {
  if (n == 0) return;
  detail::index_iterator first(0);
  detail::with_host_policy(work, [&](auto const& policy) { thrust::for_each(policy, first, first + n, f); });
}

// out[c] = beta * out[c] + sum_r x[r, c] for a row-major rows x cols matrix. Each column's sum
// runs over rows in order, so the result does not depend on the thread count.
template <class T, class Out>
void column_sums(host, T const* x, std::size_t rows, std::size_t cols, Out* out, bool accumulate) {
  using V = compute_type_t<T>;
  constexpr std::size_t block = 64;  // columns per task: contiguous in each row
  std::size_t const blocks = (cols + block - 1) / block;
  for_each_index(host{}, blocks, rows * cols, [=](std::size_t b) {
    std::size_t const c0 = b * block, c1 = std::min(cols, c0 + block);
    V acc[block];
    for (std::size_t c = c0; c < c1; ++c) acc[c - c0] = accumulate ? to_compute<V>(out[c]) : V(0);
    for (std::size_t r = 0; r < rows; ++r) {
      T const* row = x + r * cols;
      for (std::size_t c = c0; c < c1; ++c) acc[c - c0] += to_compute<V>(row[c]);
    }
    for (std::size_t c = c0; c < c1; ++c) out[c] = from_compute<Out>(acc[c - c0]);
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
