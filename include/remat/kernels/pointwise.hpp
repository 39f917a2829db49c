// One pass writing out[i] = f(i) for i in [0, n): the kernel every fused point-wise expression
// becomes. Host: a plain loop the compiler vectorises, split across OpenMP threads in static
// chunks (Thrust's OpenMP for_each hides the loop from GCC's vectoriser); CUDA: a Thrust
// transform on the CUDA system.
#pragma once

#include "../device.hpp"
#include "detail/thrust.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {

namespace detail {

template <class Out, class F>
REMAT_HOST_CLONES void host_transform(Out* out, std::size_t first, std::size_t last, F const& f) {
  for (std::size_t i = first; i < last; ++i) out[i] = f(i);
}

}  // namespace detail

template <class Out, class F>
void transform(host, std::size_t n, Out* out, F const& f) {
  if (n == 0) return;
#if defined(_OPENMP)
  if (n >= detail::parallel_threshold && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      std::size_t const t = std::size_t(omp_get_thread_num()), threads = std::size_t(omp_get_num_threads());
      detail::host_transform(out, n * t / threads, n * (t + 1) / threads, f);
    }
    return;
  }
#endif
  detail::host_transform(out, 0, n, f);
}

#if REMAT_HAS_CUDA
template <class Out, class F>
void transform(cuda, std::size_t n, Out* out, F const& f) {
  if (n == 0) return;
  detail::index_iterator first(0);
  thrust::transform(detail::cuda_policy(), first, first + n, out, f);
}
#endif

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
