// One pass writing out[i] = f(i) for i in [0, n): the kernel every fused point-wise expression
// becomes. Host: a plain loop the compiler vectorises, split across OpenMP threads in static
// chunks (Thrust's OpenMP for_each hides the loop from GCC's vectoriser); CUDA: a Thrust
// transform on the CUDA system (transform_rows: a kernel of its own).
#pragma once

#include "../device.hpp"
#include "detail/thrust.hpp"
#include "profile.hpp"

#include <algorithm>
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

namespace detail {

inline constexpr unsigned transform_rows_threads = 256;

// Where transform_rows_kernel's threads go: a row of `width` threads (the row's columns, at most
// a block's threads) and `rows` of them to a block (rows narrower than a block share it).
struct row_tiles {
  unsigned width;  // threads along a row (the columns, or a block's threads when wider)
  unsigned rows;   // rows a block takes at once
  static row_tiles of(std::size_t cols) {
    unsigned const w = unsigned(std::min<std::size_t>(cols, transform_rows_threads));
    return {w, transform_rows_threads / w};
  }
};

// transform_rows on the GPU: threads stride a row's columns and the rows (grid-stride loops both
// ways; a block's x blocks along a row, its y rows), so each thread knows its element's column
// without dividing the element's index by cols (a 64-bit remainder, a fifth of a bf16 bias + GELU
// pass's instructions on sm_90). The one division is of the thread's index, once.
template <class Out, class F>
__global__ void __launch_bounds__(transform_rows_threads)
    transform_rows_kernel(Out* out, std::size_t rows, std::size_t cols, row_tiles t, F f) {
  unsigned const own_row = threadIdx.x / t.width, own_col = threadIdx.x % t.width;
  if (own_row >= t.rows) return;
  std::size_t const c0 = std::size_t(blockIdx.x) * t.width + own_col, c_stride = std::size_t(gridDim.x) * t.width;
  std::size_t const r_stride = std::size_t(gridDim.y) * t.rows;
  for (std::size_t r = std::size_t(blockIdx.y) * t.rows + own_row; r < rows; r += r_stride) {
    std::size_t const base = r * cols;
    for (std::size_t c = c0; c < cols; c += c_stride) out[base + c] = f(base + c, c);
  }
}

// The grid of transform_rows_kernel: enough blocks along x for a row (at most 2^16), and along y
// for the rows up to about 2^16 blocks in all (at most 65,535: CUDA's limit).
inline dim3 transform_rows_grid(std::size_t rows, std::size_t cols, row_tiles t) {
  std::size_t const x = std::min<std::size_t>((cols + t.width - 1) / t.width, std::size_t(1) << 16);
  std::size_t const y = std::min<std::size_t>(
      {(rows + t.rows - 1) / t.rows, 65535, std::max<std::size_t>(1, (std::size_t(1) << 16) / x)});
  return dim3(unsigned(x), unsigned(y));
}

}  // namespace detail

// out[r * cols + c] = f(r * cols + c, c) over rows x cols (GPU): as the host's, each element's
// column known without a division.
template <class Out, class F>
void transform_rows(cuda, std::size_t rows, std::size_t cols, Out* out, F const& f, std::size_t /*cost*/ = 1) {
  if (rows == 0 || cols == 0) return;
  profile::timed<cuda> const timing(profile::work::pointwise);
  detail::row_tiles const t = detail::row_tiles::of(cols);
  detail::transform_rows_kernel<<<detail::transform_rows_grid(rows, cols, t), detail::transform_rows_threads, 0,
                                  current_cuda_stream()>>>(out, rows, cols, t, f);
  REMAT_CUDA_CHECK(cudaGetLastError());
}
#endif

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
