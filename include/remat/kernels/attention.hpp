// The point-wise part of causal attention, row by row: the masked, scaled softmax of the scores and
// its backward. Scores and their gradients are in the compute type (fp32 when activations are
// 16-bit); the probabilities are stored in the activation type. Row r of the (count * seq) x seq
// matrices is position r % seq of its sequence: it attends to columns 0..r % seq, and the rest of
// the row is zero. A task per row on the host, a warp per row on the GPU.
#pragma once

#include "../expr/math.hpp"
#include "detail/cuda_rows.hpp"
#include "rows.hpp"

#include <cstddef>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

#if REMAT_HAS_CUDA
namespace detail {

// The GPU's rows: a warp per row, its lanes striding the row; the host's formulas.
template <class V, class T>
__global__ void __launch_bounds__(row_threads)
    causal_softmax_rows(V const* scores, T* probs, std::size_t rows, std::size_t seq, V scale) {
  unsigned const lane = threadIdx.x % 32;
  for (std::size_t r = first_warp_row(); r < rows; r += warp_row_stride()) {
    std::size_t const last = r % seq;
    V const* z = scores + r * seq;
    T* p = probs + r * seq;
    V m = z[0] * scale;
    for (std::size_t c = lane; c <= last; c += 32) m = z[c] * scale > m ? z[c] * scale : m;
    m = warp_reduce(m, max_op{});
    V s = 0;
    for (std::size_t c = lane; c <= last; c += 32) s += expr::math::exp(z[c] * scale - m);
    V const inv = V(1) / warp_reduce(s, plus_op{});
    for (std::size_t c = lane; c < seq; c += 32)  // (each lane rewrites only what it read)
      p[c] = from_compute<T>(c <= last ? expr::math::exp(z[c] * scale - m) * inv : V(0));
  }
}

template <class V, class T, class Out, class Mask>
__global__ void __launch_bounds__(row_threads)
    causal_softmax_backward_rows(T const* probs, V const* dpd, Out* dscores, std::size_t rows, std::size_t seq,
                                 V scale, Mask mask) {
  unsigned const lane = threadIdx.x % 32;
  for (std::size_t r = first_warp_row(); r < rows; r += warp_row_stride()) {
    std::size_t const last = r % seq, base = r * seq;
    T const* p = probs + base;
    V const* g = dpd + base;
    Out* d = dscores + base;
    V dot = 0;
    for (std::size_t c = lane; c <= last; c += 32) dot += g[c] * mask(base + c) * to_compute<V>(p[c]);
    dot = warp_reduce(dot, plus_op{});
    for (std::size_t c = lane; c < seq; c += 32)
      d[c] = from_compute<Out>(c <= last ? scale * to_compute<V>(p[c]) * (g[c] * mask(base + c) - dot) : V(0));
  }
}

}  // namespace detail
#endif

// probs = softmax(scale * scores) over the causal part of each row. probs may alias scores when
// they have one type.
template <class V, class T, device_tag D>
void causal_softmax(D, V const* scores, T* probs, std::size_t count, std::size_t seq, V scale) {
  std::size_t const rows = count * seq;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_warp_rows(detail::causal_softmax_rows<V, T>, rows, scores, probs, rows, seq, scale);
    return;
  }
#endif
  // A row's maximum and sum in 16 lanes (detail::row_max, row_sum): they vectorise, and their order
  // depends on the row's length alone.
  for_each_index(D{}, rows, rows * seq, [=] REMAT_LAMBDA(std::size_t r) {
    std::size_t const n = r % seq + 1;  // the columns this position sees
    V const* z = scores + r * seq;
    T* p = probs + r * seq;
    V const k = scale;
    V const m = detail::row_max<V>(n, [&](std::size_t c) { return z[c] * k; });
    if constexpr (std::is_same_v<T, V>) {  // one exp per element: kept in the output, then scaled
      // (a plain loop: it vectorises as a point-wise pass does)
      for (std::size_t c = 0; c < n; ++c) p[c] = expr::math::exp(z[c] * k - m);
      V const sum = detail::row_sum<V>(n, [&](std::size_t c) { return p[c]; });
      V const inv = V(1) / sum;
      for (std::size_t c = 0; c < n; ++c) p[c] *= inv;
    } else {  // (a 16-bit output cannot hold the unscaled values exactly: exp again)
      V const sum = detail::row_sum<V>(n, [&](std::size_t c) { return expr::math::exp(z[c] * k - m); });
      V const inv = V(1) / sum;
      for (std::size_t c = 0; c < n; ++c) p[c] = from_compute<T>(expr::math::exp(z[c] * k - m) * inv);
    }
    for (std::size_t c = n; c < seq; ++c) p[c] = from_compute<T>(V(0));
  });
}

// Masks for causal_softmax_backward (functors, not lambdas: they travel into GPU kernels).
template <class V>
struct no_mask {
  REMAT_HOST_DEVICE V operator()(std::size_t) const { return V(1); }
};
template <class V, class M>
struct mask_values {
  M m;
  REMAT_HOST_DEVICE V operator()(std::size_t i) const { return m.template eval<V>(i); }
};

// The gradient of the scores: dscores = scale * P o (dP - sum_c dP o P) with dP = dpd o mask,
// where dpd is the gradient of the probabilities after dropout and mask(i) the dropout factor of
// element i (0 or 1/(1-p); 1 without dropout). dscores may alias dpd when they have one type.
template <class V, class T, class Out, class Mask, device_tag D>
void causal_softmax_backward(D, T const* probs, V const* dpd, Out* dscores, std::size_t count, std::size_t seq,
                             V scale, Mask const& mask) {
  std::size_t const rows = count * seq;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_warp_rows(detail::causal_softmax_backward_rows<V, T, Out, Mask>, rows, probs, dpd, dscores, rows,
                             seq, scale, mask);
    return;
  }
#endif
  for_each_index(D{}, rows, rows * seq, [=] REMAT_LAMBDA(std::size_t r) {
    std::size_t const last = r % seq;
    std::size_t const base = r * seq;
    T const* p = probs + base;
    V const* g = dpd + base;
    Out* d = dscores + base;
    V const dot =
        detail::row_sum<V>(last + 1, [&](std::size_t c) { return g[c] * mask(base + c) * to_compute<V>(p[c]); });
    for (std::size_t c = 0; c <= last; ++c)
      d[c] = from_compute<Out>(scale * to_compute<V>(p[c]) * (g[c] * mask(base + c) - dot));
    for (std::size_t c = last + 1; c < seq; ++c) d[c] = from_compute<Out>(V(0));
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
