// One pass writing out[i] = f(i) for i in [0, n): the kernel every fused point-wise expression
// becomes. Host: a Thrust transform on the OpenMP (or serial) system; CUDA: on the CUDA system.
#pragma once

#include "../device.hpp"
#include "detail/thrust.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {

template <class Out, class F>
void transform(host, std::size_t n, Out* out, F const& f) {
  if (n == 0) return;
  detail::index_iterator first(0);
  detail::with_host_policy(n, [&](auto const& policy) { thrust::transform(policy, first, first + n, out, f); });
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
