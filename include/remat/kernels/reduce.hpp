// Reductions of f(i) over i in [0, n): sums and maxima of fused expressions without writing the
// expression out. Host: Thrust transform_reduce per fixed-size chunk, chunks on OpenMP threads;
// CUDA: Thrust's CUDA system, which runs CUB's device reduction.
#pragma once

#include "../device.hpp"
#include "detail/thrust.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

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

// `init` must be the identity of `op` (0 for a sum, -inf for a maximum): each chunk starts from it.
// The host splits [0, n) into fixed chunks of parallel_threshold elements, reduces each with
// Thrust's serial system (on as many OpenMP threads as there are) and folds the partial results
// in order, so the result depends on n alone, not on the thread count, and no temporary storage is
// allocated behind the allocator's back.
template <class Acc, class F, class Op>
Acc transform_reduce(host, std::size_t n, F const& f, Acc init, Op op) {
  constexpr std::size_t chunk = detail::parallel_threshold;
  detail::index_iterator const first(0);
  if (n <= chunk) return thrust::transform_reduce(thrust::cpp::par, first, first + n, f, init, op);
  std::int64_t const chunks = std::int64_t((n + chunk - 1) / chunk);
  std::vector<Acc> partial(std::size_t(chunks), init);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::size_t const lo = std::size_t(c) * chunk, hi = std::min(n, lo + chunk);
    partial[std::size_t(c)] = thrust::transform_reduce(thrust::cpp::par, first + lo, first + hi, f, init, op);
  }
  Acc result = init;
  for (Acc const& p : partial) result = op(result, p);
  return result;
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
