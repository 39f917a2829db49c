// Reductions of f(i) over i in [0, n): sums and maxima of fused expressions without writing the
// expression out. Host: Thrust transform_reduce on the OpenMP (or serial) system; CUDA: Thrust's
// CUDA system, which runs CUB's device reduction.
#pragma once

#include "../device.hpp"
#include "detail/thrust.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {

struct plus_op {
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    return a + b;
  }
};

// The larger of two values; NaN wins, so a NaN anywhere makes the maximum NaN.
struct max_op {
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? b : a;
  }
};

template <class Acc, class F, class Op>
Acc transform_reduce(host, std::size_t n, F const& f, Acc init, Op op) {
  detail::index_iterator first(0);
  return detail::with_host_policy(
      n, [&](auto const& policy) { return thrust::transform_reduce(policy, first, first + n, f, init, op); });
}

#if REMAT_HAS_CUDA
template <class Acc, class F, class Op>
Acc transform_reduce(cuda, std::size_t n, F const& f, Acc init, Op op) {
  detail::index_iterator first(0);
  return thrust::transform_reduce(thrust::cuda::par, first, first + n, f, init, op);
}
#endif

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
