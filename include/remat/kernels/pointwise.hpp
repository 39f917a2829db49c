// One pass writing out[i] = f(i) for i in [0, n): the kernel every fused point-wise expression
// becomes. Host: a plain loop the compiler vectorises, split across OpenMP threads in static
// chunks (Thrust's OpenMP for_each hides the loop from GCC's vectoriser); CUDA: a Thrust
// transform on the CUDA system.
#pragma once

#include "../device.hpp"
#include "detail/thrust.hpp"
#include "profile.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {

namespace detail {

template <class Out, class F>
REMAT_HOST_CLONES void host_transform(Out* out, std::size_t first, std::size_t last, F const& f) {
  F const body = f;  // (a local copy: see host_for_each)
  for (std::size_t i = first; i < last; ++i) out[i] = body(i);
}

template <class Out, class F>
REMAT_HOST_CLONES void host_transform_rows(Out* out, std::size_t first, std::size_t last, std::size_t cols,
                                           F const& f) {
  F const body = f;  // (a local copy: see host_for_each)
  for (std::size_t r = first; r < last; ++r) {
    std::size_t const base = r * cols;
    Out* const row = out + base;
    for (std::size_t c = 0; c < cols; ++c) row[c] = body(base + c, c);
  }
}

}  // namespace detail

// out[i] = f(i) for i in [0, n) (host): split across the host's threads, each part a loop the
// compiler can vectorise. `cost`: what an element costs against a plain copy's (expr's
// element_cost_v), which weighs n against detail::parallel_threshold: a pass of an erf per element
// is worth two threads at fewer elements than an add. (The elements are independent: the split
// changes no bit.)
template <class Out, class F>
void transform(host, std::size_t n, Out* out, F const& f, std::size_t cost = 1) {
  if (n == 0) return;
  profile::timed<host> const timing(profile::work::pointwise);
  detail::host_split(n, n * cost,
                     [&](std::size_t first, std::size_t last) { detail::host_transform(out, first, last, f); });
}

// out[r * cols + c] = f(r * cols + c, c) over rows x cols (host): a pass that knows each element's
// column (a row broadcast reads its element c); `cost` as transform's.
template <class Out, class F>
void transform_rows(host, std::size_t rows, std::size_t cols, Out* out, F const& f, std::size_t cost = 1) {
  if (rows == 0 || cols == 0) return;
  profile::timed<host> const timing(profile::work::pointwise);
  detail::host_split(rows, rows * cols * cost, [&](std::size_t first, std::size_t last) {
    detail::host_transform_rows(out, first, last, cols, f);
  });
}

#if REMAT_HAS_CUDA
template <class Out, class F>
void transform(cuda, std::size_t n, Out* out, F const& f, std::size_t /*cost: one thread per element anyway*/ = 1) {
  if (n == 0) return;
  profile::timed<cuda> const timing(profile::work::pointwise);
  detail::index_iterator first(0);
  thrust::transform(detail::cuda_policy(), first, first + n, out, f);
}
#endif

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
