// The point-wise part of causal attention, row by row: the masked, scaled softmax of the scores and
// its backward. Scores and their gradients are in the compute type (fp32 when activations are
// 16-bit); the probabilities are stored in the activation type. Row r of the (count * seq) x seq
// matrices is position r % seq of its sequence: it attends to columns 0..r % seq, and the rest of
// the row is zero. A task per row on the host, a warp per row on the GPU. Then the same rows
// between the products around them, a tile of positions at a time (causal_attention_forward and
// _backward: on the host a sequence-head at a time, in its thread's cache), and the query panels
// of BlockedAttentionCore.
#pragma once

#include "../numeric/math.hpp"
#include "detail/cuda_rows.hpp"
#include "gemm.hpp"
#include "random.hpp"
#include "rows.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

// Rows [0, count * rb) of a tile of causal attention's count seq x seq matrices (scores,
// probabilities or their gradients): row t is position r0 + t % rb of matrix t / rb. The whole
// matrices are the tile r0 = 0, rb = seq. `tiled`: the scores (or their gradient) are a tile of
// their own, row t at t * seq, rather than rows of the matrices.
struct causal_rows {
  std::size_t seq;     // positions in a sequence (the matrices are seq x seq)
  std::size_t r0;      // the tile's first position
  std::size_t rb;      // the tile's positions
  bool tiled = false;  // the scores are a tile of their own (else rows of the matrices)
  // The position of row t: it sees keys [0, position].
  REMAT_HOST_DEVICE std::size_t position(std::size_t t) const { return r0 + t % rb; }
  // Row t's row in the matrices.
  REMAT_HOST_DEVICE std::size_t row(std::size_t t) const { return t / rb * seq + position(t); }
  // Row t's row among the scores.
  REMAT_HOST_DEVICE std::size_t score_row(std::size_t t) const { return tiled ? t : row(t); }
};

#if REMAT_HAS_CUDA
namespace detail {

// The GPU's rows: a warp per row, its lanes striding the row; the host's formulas.
template <class V, class T>
__global__ void __launch_bounds__(row_threads)
    causal_softmax_rows(V const* scores, T* probs, std::size_t rows, causal_rows g, V scale) {
  unsigned const lane = threadIdx.x % 32;
  std::size_t const seq = g.seq;
  for (std::size_t r = first_warp_row(); r < rows; r += warp_row_stride()) {
    std::size_t const last = g.position(r);
    V const* z = scores + g.score_row(r) * seq;
    T* p = probs + g.row(r) * seq;
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
    causal_softmax_backward_rows(T const* probs, V const* dpd, Out* dscores, std::size_t rows, causal_rows rg,
                                 V scale, Mask mask) {
  unsigned const lane = threadIdx.x % 32;
  std::size_t const seq = rg.seq;
  for (std::size_t r = first_warp_row(); r < rows; r += warp_row_stride()) {
    std::size_t const last = rg.position(r), base = rg.row(r) * seq;
    T const* p = probs + base;
    V const* g = dpd + rg.score_row(r) * seq;
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

namespace detail {

// One row of causal_softmax on the host: p[0, n) = softmax(k * z[0, n)), p[n, seq) = 0, the
// exponentials kept in w (z itself, or p when it holds the compute type) and then scaled, one exp
// per element. The row's maximum and sum in 16 lanes (row_max, row_sum): they vectorise, and their
// order depends on n alone.
template <class V, class T>
REMAT_HOST_DEVICE void causal_softmax_row(V const* z, V* w, T* p, std::size_t n, std::size_t seq, V k) {
  V const m = row_max<V>(n, [&](std::size_t c) { return z[c] * k; });
  for (std::size_t c = 0; c < n; ++c) w[c] = math::exp(z[c] * k - m);  // (a plain loop: it vectorises)
  V const inv = V(1) / row_sum<V>(n, [&](std::size_t c) { return w[c]; });
  for (std::size_t c = 0; c < n; ++c) p[c] = from_compute<T>(w[c] * inv);
  for (std::size_t c = n; c < seq; ++c) p[c] = from_compute<T>(V(0));
}

// One row of causal_softmax_backward on the host: d = scale * p o (g o f - dot) over [0, n), with
// f(c) the dropout mask of the row's element c and dot the row's sum of g o f o p, and zeros over
// [n, seq).
template <class V, class T, class Out, class F>
REMAT_HOST_DEVICE void causal_softmax_backward_row(T const* p, V const* g, Out* d, std::size_t n, std::size_t seq,
                                                   V scale, F const& f) {
  V const dot = row_sum<V>(n, [&](std::size_t c) { return g[c] * f(c) * to_compute<V>(p[c]); });
  for (std::size_t c = 0; c < n; ++c) d[c] = from_compute<Out>(scale * to_compute<V>(p[c]) * (g[c] * f(c) - dot));
  for (std::size_t c = n; c < seq; ++c) d[c] = from_compute<Out>(V(0));
}

}  // namespace detail

// probs = softmax(scale * scores) over the causal part of each row. probs may alias scores when
// they have one type; otherwise the scores are overwritten (on the host they hold the
// exponentials after).
template <class V, class T, device_tag D>
void causal_softmax(D, V* scores, T* probs, std::size_t count, std::size_t seq, V scale) {
  std::size_t const rows = count * seq;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_warp_rows(detail::causal_softmax_rows<V, T>, rows, static_cast<V const*>(scores), probs, rows,
                             causal_rows{seq, 0, seq}, scale);
    return;
  }
#endif
  for_each_index(host{}, rows, rows * seq, [=] REMAT_LAMBDA(std::size_t r) {
    V* const z = scores + r * seq;
    T* const p = probs + r * seq;
    V* w = z;
    if constexpr (std::is_same_v<T, V>) w = p;
    detail::causal_softmax_row<V, T>(z, w, p, r % seq + 1, seq, scale);
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
  // Elements first .. first + n - 1 into out, on the host: a mask that draws from a Philox stream
  // (stream() and value(u): a dropout mask) makes each block once for its four elements.
  void values(std::size_t first, std::size_t n, V* out) const {
    if constexpr (requires { m.stream(); }) {
      uniform_stream s = m.stream();
      s.offset += first;
      detail::host_transform_uniform(out, 0, n, s, value_fn{m});
    } else {
      for (std::size_t c = 0; c < n; ++c) out[c] = (*this)(first + c);
    }
  }

 private:
  struct value_fn {
    M m;
    V operator()(std::size_t, float u) const { return m.template value<V>(u); }
  };
};

namespace detail {

// The longest row whose mask a host row pass draws at once (the values on its thread's stack).
inline constexpr std::size_t row_mask_length = 2048;

// body(f), f(c) the mask of the row's element c (element first + c of the mask), on the host: from
// the row's values drawn at once where the mask can (mask_values of a dropout mask, rows of at
// most row_mask_length), else element by element (and always without dropout: no_mask's 1).
template <class V, class Mask, class Body>
REMAT_HOST_DEVICE void with_row_mask(Mask const& mask, std::size_t first, std::size_t n, Body const& body) {
#if !REMAT_DEVICE_CODE
  if constexpr (requires(V* out) { mask.values(first, n, out); }) {
    if (n <= row_mask_length) {
      V f[row_mask_length];
      mask.values(first, n, f);
      body([&] REMAT_HOST_LAMBDA(std::size_t c) { return f[c]; });
      return;
    }
  }
#endif
  body([&] REMAT_HOST_LAMBDA(std::size_t c) { return mask(first + c); });
}

}  // namespace detail

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
                             causal_rows{seq, 0, seq}, scale, mask);
    return;
  }
#endif
  for_each_index(host{}, rows, rows * seq, [=] REMAT_LAMBDA(std::size_t r) {
    std::size_t const base = r * seq, n = r % seq + 1;
    detail::with_row_mask<V>(mask, base, n, [&] REMAT_HOST_LAMBDA(auto const& f) {
      detail::causal_softmax_backward_row<V, T, Out>(probs + base, dpd + base, dscores + base, n, seq, scale, f);
    });
  });
}

// --- Causal attention, tile by tile --------------------------------------------------------------
// Where AttentionCore's per-head matrices lie: q, k and v (seq x head width blocks of the input,
// matrix i at its stride's at(i, group)), the output y (or their gradients: dy, and dqkv's blocks
// as q's), and the tiles of `tile` positions its products go by: row tile [r0, r0 + rb) of the
// scores is computed against keys [0, r0 + rb) only.
template <class T>
struct attention_blocks {
  batch n;                       // the sequence-heads, `group` heads to a sequence
  index_t tile;                  // positions per tile
  lhs_operand<T> q;              // seq x head width, matrix i at q.stride.at(i, n.group)
  rhs_operand<T> k;              // as q (read transposed by the scores' product)
  rhs_operand<T> v;              // as q
  result_operand<T> y;           // the output (forward) or the gradient of q (backward)
  // The positions of a sequence.
  index_t seq() const { return q.rows; }
  // The features of a head.
  index_t width() const { return q.cols; }
};

namespace detail {

// f(r0, rb) for each tile of a sequence (the last may be shorter).
template <class F>
void for_attention_tiles(index_t seq, index_t tile, F const& f) {
  for (index_t r0 = 0; r0 < seq; r0 += tile) f(r0, seq - r0 < tile ? seq - r0 : tile);
}

// Where the scores (or their gradient) of row tile [r0, r0 + rb) go, against keys [0, r0 + rb):
// rows of the count seq x seq results themselves when they have the compute type (in place), else
// a tile of their own in `scores` (rb rows of seq a matrix, matrix i's at i * rb * seq).
template <class V, class T>
result_operand<V> score_tile(V* scores, T* results, batch n, index_t seq, index_t r0, index_t rb) {
  if constexpr (std::is_same_v<T, V>)
    return result_operand<V>{results, seq, seq, seq, trans::no, {index_t(n.group) * seq * seq, seq * seq}}.window(
        r0, 0, rb, r0 + rb);
  else
    return {scores, rb, r0 + rb, seq, trans::no, {index_t(n.group) * rb * seq, rb * seq}};
}

// Where causal_rows' score_row 0 is: the tile's (scores), or the results' first row (in place).
template <class V, class T>
V const* score_base(V const* scores, T const* results) {
  if constexpr (std::is_same_v<T, V>)
    return results;
  else
    return scores;
}

}  // namespace detail

// The rows of seq values in the compute type that causal_attention_forward and _backward want as
// `scores` for `count` sequence-heads of seq positions in tiles of `tile` (when the results are not
// in the compute type themselves): a tile's scores of each.
constexpr std::size_t attention_scores_rows(std::size_t count, std::size_t seq, std::size_t tile) {
  return count * (tile < seq ? tile : seq);
}

namespace detail {

// The three steps of each tile that causal_attention_forward and _backward share: z = Q F^T into
// the tile's scores (against the keys the tile sees), rows(z) into `results` (count * seq x seq),
// y = results S over the causal columns. rows(z, row, n, seq) makes row `row` of the results from
// its scores z (n of them, the rest zeros) on the host; rows.launch(rows, base, g) does a tile's
// rows (causal_rows g, their scores from base) on the GPU.
template <class T, class V, class Rows, device_tag D>
void attention_tile_steps(D, attention_blocks<T> const& b, rhs_operand<T> f, rhs_operand<T> sv, V* scores, T* results,
                          Rows const& rows) {
  std::size_t const count = b.n.count, seq = std::size_t(b.seq());
  index_t const hw = b.width(), s = b.seq();
  if constexpr (!std::is_same_v<D, host>) {
#if REMAT_HAS_CUDA
    lhs_operand<T> const r{results, s, s, s, trans::no, {index_t(b.n.group) * s * s, s * s}};
    for_attention_tiles(s, b.tile, [&](index_t r0, index_t rb) {
      gemm_batched(D{}, b.n, b.q.window(r0, 0, rb, hw), f.window(0, 0, r0 + rb, hw).transposed(),
                   score_tile(scores, results, b.n, s, r0, rb));
      rows.launch(count * std::size_t(rb), score_base(scores, results),
                  causal_rows{seq, std::size_t(r0), std::size_t(rb), !std::is_same_v<T, V>});
      gemm_batched(D{}, b.n, r.window(r0, 0, rb, r0 + rb), sv.window(0, 0, r0 + rb, hw), b.y.window(r0, 0, rb, hw));
    });
#endif
  } else {
    // Timed as products, less the row passes' share, which each thread measures when profiling.
    profile::timed<host> timing(profile::work::product);
    bool const split = timing.counting();
    std::atomic<std::int64_t> rows_ns{0}, all_ns{0};
    host_split_throwing(count, count * seq * seq * std::size_t(hw), [&](std::size_t first, std::size_t last) {
      V* const own = std::is_same_v<T, V> ? nullptr : scores + first * std::size_t(b.tile) * seq;  // (first: its own)
      auto const ns = [split] { return split ? std::chrono::steady_clock::now().time_since_epoch().count() : 0; };
      std::int64_t in_rows = 0, start = ns();
      for (std::size_t i = first; i < last; ++i)
        for_attention_tiles(s, b.tile, [&](index_t r0, index_t rb) {
          result_operand<V> const z = score_tile(own, results, b.n, s, r0, rb);
          V* const zi = z.data + z.stride.at(std::is_same_v<T, V> ? i : 0, b.n.group);
          host_gemm<T, V>(trans::no, trans::yes, rb, r0 + rb, hw, V(1),
                          b.q.data + b.q.stride.at(i, b.n.group) + r0 * b.q.ld, b.q.ld,
                          f.data + f.stride.at(i, b.n.group), f.ld, V(0), zi, s, true);
          std::size_t const row0 = i * seq + std::size_t(r0);
          std::int64_t const t0 = ns();
          host_for_each(0, std::size_t(rb), [=] REMAT_HOST_LAMBDA(std::size_t r) {  // (rows copied: see host_for_each)
            rows(zi + r * seq, row0 + r, std::size_t(r0) + r + 1, seq);
          });
          in_rows += ns() - t0;
          host_gemm<T, T>(trans::no, trans::no, rb, hw, r0 + rb, V(1), results + row0 * seq, s,
                          sv.data + sv.stride.at(i, b.n.group), sv.ld, V(0),
                          b.y.data + b.y.stride.at(i, b.n.group) + r0 * b.y.ld, b.y.ld, true);
        });
      rows_ns += in_rows;
      all_ns += ns() - start;
    });
    if (split && all_ns.load() > 0) timing.split(profile::work::rows, double(rows_ns.load()) / double(all_ns.load()));
  }
}

// The forward's rows: probs = causal softmax of the scores.
template <class V, class T>
struct attention_softmax_rows {
  T* probs;
  V scale;
  REMAT_HOST_DEVICE void operator()(V* z, std::size_t row, std::size_t n, std::size_t seq) const {
    T* const p = probs + row * seq;
    V* w = z;
    if constexpr (std::is_same_v<T, V>) w = p;
    causal_softmax_row<V, T>(z, w, p, n, seq, scale);
  }
#if REMAT_HAS_CUDA
  void launch(std::size_t rows, V const* z, causal_rows g) const {
    launch_warp_rows(causal_softmax_rows<V, T>, rows, z, probs, rows, g, scale);
  }
#endif
};

// The backward's rows: dscores = the causal softmax's backward of dpd (the scores here).
template <class V, class T, class Mask>
struct attention_softmax_backward_rows {
  T const* probs;
  T* dscores;
  V scale;
  Mask const& mask;
  REMAT_HOST_DEVICE void operator()(V const* g, std::size_t row, std::size_t n, std::size_t seq) const {
    std::size_t const base = row * seq;
    with_row_mask<V>(mask, base, n, [&] REMAT_HOST_LAMBDA(auto const& f) {
      causal_softmax_backward_row<V, T, T>(probs + base, g, dscores + base, n, seq, scale, f);
    });
  }
#if REMAT_HAS_CUDA
  void launch(std::size_t rows, V const* g, causal_rows c) const {
    launch_warp_rows(causal_softmax_backward_rows<V, T, T, Mask>, rows, static_cast<T const*>(probs), g, dscores, rows,
                     c, scale, mask);
  }
#endif
};

}  // namespace detail

// Causal attention's forward without dropout, tile by tile: probs = softmax(scale * Q K^T) over
// the causal part of each row (count * seq x seq, as causal_softmax's) and y = probs V. `scores`:
// see attention_scores_rows (unused when probs has the compute type: the scores are made in
// place). On the host a thread takes a sequence-head at a time and makes each tile's scores,
// their softmax and its rows of y one after the other while they are in its cache, in its own
// tile of scores; on the GPU each step is a batched product or a row pass over every
// sequence-head's tile. The same products (shapes, layouts, order of sums) and rows as
// causal_softmax between batched products, so the same bits.
template <class T, class V, device_tag D>
void causal_attention_forward(D, attention_blocks<T> const& b, V* scores, T* probs, V scale) {
  detail::attention_tile_steps(D{}, b, b.k, b.v, scores, probs, detail::attention_softmax_rows<V, T>{probs, scale});
}

// Causal attention's backward from dY to dQ, tile by tile: dpd = dY V^T over the causal part of
// each row (the gradient of the probabilities after dropout), dscores = causal_softmax_backward
// of it (mask: the dropout's, as there) and dQ = dscores K. b.q holds dY (in the output's
// blocks), b.k and b.v K and V, b.y dQ. `scores` as causal_attention_forward's (dpd goes into
// dscores in place when it has the compute type). dK and dV, which sum over later tiles, are the
// caller's products. The host and the GPU go as in causal_attention_forward; the same bits as
// the batched products around causal_softmax_backward.
template <class T, class V, class Mask, device_tag D>
void causal_attention_backward(D, attention_blocks<T> const& b, V* scores, T const* probs, T* dscores, V scale,
                               Mask const& mask) {
  detail::attention_tile_steps(D{}, b, b.v, b.k, scores, dscores,
                               detail::attention_softmax_backward_rows<V, T, Mask>{probs, dscores, scale, mask});
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

namespace detail {

// Row t of a panel (matrix t / rb, row t % rb): its position `last` (it sees keys 0 .. last), where
// it starts in the panel buffers, its row among the statistics and its dropout stream's offset.
struct panel_row {
  std::size_t last, at, row, stream;
  REMAT_HOST_DEVICE static panel_row of(panel_geometry const& g, std::size_t t) {
    std::size_t const m = t / g.rb, r = t % g.rb, last = g.r0 + r, row = (g.first + m) * g.seq + last;
    return {last, m * g.panel_stride + r * g.ld, row, row * g.seq};
  }
};

}  // namespace detail

#if REMAT_HAS_CUDA
namespace detail {

// The panels' rows on the GPU: a warp per row, its lanes striding the row (as causal_softmax_rows),
// where one thread per row would read its row alone, 32 rows to a warp's every load. Each lane
// rewrites only the elements it read, so probs may alias scores (and dropped scores, dscores dpd);
// the probabilities are recomputed from the statistics in the same expression in both kernels, so
// backward sees the forward's bits.
template <class V, class T, class Mask>
__global__ void __launch_bounds__(row_threads)
    panel_softmax_rows(panel_geometry g, V const* scores, T* probs, V* stats, V scale, Mask mask) {
  unsigned const lane = threadIdx.x % 32;
  std::size_t const rows = g.count * g.rb, keys = g.keys();
  for (std::size_t t = first_warp_row(); t < rows; t += warp_row_stride()) {
    auto const [last, at, row, stream] = panel_row::of(g, t);
    V const* z = scores + at;
    T* p = probs + at;
    V mx = z[0] * scale;
    for (std::size_t c = lane; c <= last; c += 32) mx = z[c] * scale > mx ? z[c] * scale : mx;
    mx = warp_reduce(mx, max_op{});
    V s = 0;
    for (std::size_t c = lane; c <= last; c += 32) s += math::exp(z[c] * scale - mx);
    V const inv = V(1) / warp_reduce(s, plus_op{});
    if (lane == 0) {
      stats[2 * row] = mx;
      stats[2 * row + 1] = inv;
    }
    for (std::size_t c = lane; c < keys; c += 32)
      p[c] = c <= last ? from_compute<T>(to_compute<V>(from_compute<T>(math::exp(z[c] * scale - mx) * inv)) *
                                         mask(stream + c))
                       : from_compute<T>(V(0));
  }
}

template <class V, class T, class Mask>
__global__ void __launch_bounds__(row_threads)
    panel_softmax_backward_rows(panel_geometry g, V const* scores, V const* dpd, V const* stats, T* dropped,
                                T* dscores, V scale, Mask mask) {
  unsigned const lane = threadIdx.x % 32;
  std::size_t const rows = g.count * g.rb, keys = g.keys();
  for (std::size_t t = first_warp_row(); t < rows; t += warp_row_stride()) {
    auto const [last, at, row, stream] = panel_row::of(g, t);
    V const* z = scores + at;
    V const* d = dpd + at;
    T* pd = dropped + at;
    T* ds = dscores + at;
    V const mx = stats[2 * row], inv = stats[2 * row + 1];
    V dot = 0;
    for (std::size_t c = lane; c <= last; c += 32) dot += d[c] * mask(stream + c) * (math::exp(z[c] * scale - mx) * inv);
    dot = warp_reduce(dot, plus_op{});
    for (std::size_t c = lane; c < keys; c += 32) {
      V p = 0, f = 0, dc = 0;
      if (c <= last) {  // (both read before either is written: they may alias the results)
        p = math::exp(z[c] * scale - mx) * inv;
        f = mask(stream + c);
        dc = d[c];
      }
      ds[c] = from_compute<T>(c <= last ? scale * p * (dc * f - dot) : V(0));
      pd[c] = from_compute<T>(c <= last ? to_compute<V>(from_compute<T>(p)) * f : V(0));
    }
  }
}

}  // namespace detail
#endif

// Forward: each row's softmax statistics, its maximum m of scale * z and inv = 1 / sum exp(scale *
// z - m) (at stats[2 * ((first + m) * seq + position)], then + 1), and probs = exp(scale * z - m) * inv after
// dropout (mask; rounded to T once, and once more after the mask, as AttentionCore's stored
// probabilities are; in fp32 the values are AttentionCore's causal_softmax's, bit for bit).
// The scores are overwritten; probs may alias them when they have one type.
template <class V, class T, class Mask, device_tag D>
void panel_softmax(D, panel_geometry g, V* scores, T* probs, V* stats, V scale, Mask mask) {
  std::size_t const rows = g.count * g.rb;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_warp_rows(detail::panel_softmax_rows<V, T, Mask>, rows, g, static_cast<V const*>(scores), probs,
                             stats, scale, mask);
    return;
  }
#endif
  for_each_index(host{}, rows, rows * g.keys(), [=] REMAT_LAMBDA(std::size_t t) {
    auto const [last, at, row, stream] = detail::panel_row::of(g, t);
    std::size_t const n = last + 1, keys = g.keys();
    V* z = scores + at;
    T* p = probs + at;
    V const k = scale;
    V const mx = detail::row_max<V>(n, [&](std::size_t c) { return z[c] * k; });
    for (std::size_t c = 0; c < n; ++c) z[c] = math::exp(z[c] * k - mx);
    V const inv = V(1) / detail::row_sum<V>(n, [&](std::size_t c) { return z[c]; });
    stats[2 * row] = mx;
    stats[2 * row + 1] = inv;
    detail::with_row_mask<V>(mask, stream, n, [&] REMAT_HOST_LAMBDA(auto const& f) {
      for (std::size_t c = 0; c < n; ++c) p[c] = from_compute<T>(to_compute<V>(from_compute<T>(z[c] * inv)) * f(c));
    });
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
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_warp_rows(detail::panel_softmax_backward_rows<V, T, Mask>, rows, g, static_cast<V const*>(scores),
                             dpd, stats, dropped, dscores, scale, mask);
    return;
  }
#endif
  for_each_index(host{}, rows, rows * g.keys(), [=] REMAT_LAMBDA(std::size_t t) {
    auto const [last, at, row, stream] = detail::panel_row::of(g, t);
    std::size_t const n = last + 1, keys = g.keys();
    V* z = scores + at;
    V const* d = dpd + at;
    T* pd = dropped + at;
    T* ds = dscores + at;
    V const k = scale, mx = stats[2 * row], inv = stats[2 * row + 1];
    for (std::size_t c = 0; c < n; ++c) z[c] = math::exp(z[c] * k - mx) * inv;
    detail::with_row_mask<V>(mask, stream, n, [&] REMAT_HOST_LAMBDA(auto const& f) {
      V const dot = detail::row_sum<V>(n, [&](std::size_t c) { return d[c] * f(c) * z[c]; });
      for (std::size_t c = 0; c < n; ++c) {
        V const p = z[c], fc = f(c);
        ds[c] = from_compute<T>(k * p * (d[c] * fc - dot));  // (read before pd, which may alias z)
        pd[c] = from_compute<T>(to_compute<V>(from_compute<T>(p)) * fc);
      }
    });
    for (std::size_t c = n; c < keys; ++c) {
      ds[c] = from_compute<T>(V(0));
      pd[c] = from_compute<T>(V(0));
    }
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
