// The point-wise part of causal attention, row by row: the masked, scaled softmax of the scores and
// its backward. Scores and their gradients are in the compute type (fp32 when activations are
// 16-bit); the probabilities are stored in the activation type. Row r of the (count * seq) x seq
// matrices is position r % seq of its sequence: it attends to columns 0..r % seq, and the rest of
// the row is zero. A task per row on the host, a warp per row on the GPU.
#pragma once

#include "../numeric/math.hpp"
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
    for (std::size_t c = lane; c <= last; c += 32) s += math::exp(z[c] * scale - m);
    V const inv = V(1) / warp_reduce(s, plus_op{});
    for (std::size_t c = lane; c < seq; c += 32)  // (each lane rewrites only what it read)
      p[c] = from_compute<T>(c <= last ? math::exp(z[c] * scale - m) * inv : V(0));
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
      for (std::size_t c = 0; c < n; ++c) p[c] = math::exp(z[c] * k - m);
      V const sum = detail::row_sum<V>(n, [&](std::size_t c) { return p[c]; });
      V const inv = V(1) / sum;
      for (std::size_t c = 0; c < n; ++c) p[c] *= inv;
    } else {  // (a 16-bit output cannot hold the unscaled values exactly: exp again)
      V const sum = detail::row_sum<V>(n, [&](std::size_t c) { return math::exp(z[c] * k - m); });
      V const inv = V(1) / sum;
      for (std::size_t c = 0; c < n; ++c) p[c] = from_compute<T>(math::exp(z[c] * k - m) * inv);
    }
    for (std::size_t c = n; c < seq; ++c) p[c] = from_compute<T>(V(0));
  });
}

// Masks for causal_softmax_backward (functors, not lambdas: they travel into GPU kernels).
template <class V>
struct no_mask {
  REMAT_HOST_DEVICE V operator()(std::size_t) const { return V(1); }  // 1: every element kept
};
// The mask held by an expression M (a dropout mask): element i is M's element i.
template <class V, class M>
struct mask_values {
  M m;  // the mask's expression
  REMAT_HOST_DEVICE V operator()(std::size_t i) const { return m.template eval<V>(i); }  // M's element i
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


// --- Query panels (BlockedAttentionCore) ---------------------------------------------------------
// A panel is rows r0 .. r0 + rb - 1 of every sequence-head's scores against the keys 0 .. L - 1 the
// panel's last row sees (L = r0 + rb): matrix m of `count` at m * panel_stride, row r at r * ld.
// Row r of matrix m is position r0 + r; it sees n = r0 + r + 1 keys, and columns n .. L - 1 are
// written as zeros (the products then sum over L columns). Element (m, position, key) of the
// dropout mask is element ((first + m) * seq + position) * seq + key of the stream: the one
// AttentionCore's count*seq x seq probabilities draw.
struct panel_geometry {
  std::size_t count;         // the sequence-heads (matrices)
  std::size_t seq;           // the sequence length
  std::size_t r0;            // the panel's first row (position)
  std::size_t rb;            // the panel's rows
  std::size_t panel_stride;  // elements between the matrices of the panel
  std::size_t ld;            // elements between rows
  std::size_t first = 0;  // the sequence-head of matrix 0 (the pointers given start at its panel)
  REMAT_HOST_DEVICE std::size_t keys() const { return r0 + rb; }  // L: the keys the panel's last row sees
};

// Forward: each row's softmax statistics, its maximum m of scale * z and inv = 1 / sum exp(scale *
// z - m) (at stats[2 * ((first + m) * seq + position)], then + 1), and probs = exp(scale * z - m) * inv after
// dropout (mask; rounded to T once, and once more after the mask, as AttentionCore's stored
// probabilities are; in fp32 the values are AttentionCore's causal_softmax's, bit for bit).
// The scores are overwritten; probs may alias them when they have one type.
template <class V, class T, class Mask, device_tag D>
void panel_softmax(D, panel_geometry g, V* scores, T* probs, V* stats, V scale, Mask mask) {
  std::size_t const rows = g.count * g.rb;
  for_each_index(D{}, rows, rows * g.keys(), [=] REMAT_LAMBDA(std::size_t t) {
    std::size_t const m = t / g.rb, r = t % g.rb, pos = g.r0 + r, n = pos + 1, keys = g.r0 + g.rb;
    std::size_t const at = m * g.panel_stride + r * g.ld, row = (g.first + m) * g.seq + pos, stream = row * g.seq;
    V* z = scores + at;
    T* p = probs + at;
    V const k = scale;
    V const mx = detail::row_max<V>(n, [&](std::size_t c) { return z[c] * k; });
    for (std::size_t c = 0; c < n; ++c) z[c] = math::exp(z[c] * k - mx);
    V const inv = V(1) / detail::row_sum<V>(n, [&](std::size_t c) { return z[c]; });
    stats[2 * row] = mx;
    stats[2 * row + 1] = inv;
    for (std::size_t c = 0; c < n; ++c) {
      T const pt = from_compute<T>(z[c] * inv);
      p[c] = from_compute<T>(to_compute<V>(pt) * mask(stream + c));
    }
    for (std::size_t c = n; c < keys; ++c) p[c] = from_compute<T>(V(0));
  });
}

// Backward of a panel, from its recomputed scores (overwritten with the probabilities: the
// forward's values, from its statistics), the gradient of the dropped probabilities
// dpd = dY V^T: dropped, the probabilities after dropout as the forward used them (for dV), and
// dscores = scale * P o (dP - sum_c dP o P) with dP = dpd o mask (for dQ and dK). dropped may alias
// scores and dscores dpd when they have one type.
template <class V, class T, class Mask, device_tag D>
void panel_softmax_backward(D, panel_geometry g, V* scores, V const* dpd, V const* stats, T* dropped, T* dscores,
                            V scale, Mask mask) {
  std::size_t const rows = g.count * g.rb;
  for_each_index(D{}, rows, rows * g.keys(), [=] REMAT_LAMBDA(std::size_t t) {
    std::size_t const m = t / g.rb, r = t % g.rb, pos = g.r0 + r, n = pos + 1, keys = g.r0 + g.rb;
    std::size_t const at = m * g.panel_stride + r * g.ld, row = (g.first + m) * g.seq + pos, stream = row * g.seq;
    V* z = scores + at;
    V const* d = dpd + at;
    T* pd = dropped + at;
    T* ds = dscores + at;
    V const k = scale, mx = stats[2 * row], inv = stats[2 * row + 1];
    for (std::size_t c = 0; c < n; ++c) z[c] = math::exp(z[c] * k - mx) * inv;
    V const dot = detail::row_sum<V>(n, [&](std::size_t c) { return d[c] * mask(stream + c) * z[c]; });
    for (std::size_t c = 0; c < n; ++c) {
      V const p = z[c], f = mask(stream + c);
      ds[c] = from_compute<T>(k * p * (d[c] * f - dot));  // (read before pd, which may alias z)
      pd[c] = from_compute<T>(to_compute<V>(from_compute<T>(p)) * f);
    }
    for (std::size_t c = n; c < keys; ++c) {
      ds[c] = from_compute<T>(V(0));
      pd[c] = from_compute<T>(V(0));
    }
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
