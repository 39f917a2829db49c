// AttentionCore<W, H, P>: the parameter-free middle of causal multi-head self-attention. Its input
// is the QKV projection of a sequence batch, (batch * seq) x 3W with the columns [q | k | v] and
// head h in columns h * W/H .. (h + 1) * W/H of each (as nanoGPT's c_attn); its output is
// (batch * seq) x W, the heads side by side, ready for the output projection. Per sequence and
// head: S = Q K^T / sqrt(W/H) with future positions masked, P = softmax(S) in the compute type
// (fp32), dropout P on P, Y = dropout(P) V. The products are batched GEMMs through kernels::gemm,
// in tiles of `causal_tile` positions that skip the masked triangle: row tile i of the scores (and
// of their gradient) is computed against keys 0 .. end of tile i only, and the products that read
// the probabilities or their gradient sum over the unmasked columns only (the masked entries are
// zeros, so the result is the full product's up to the order of the sums). For a sequence of
// n tiles that is (n + 1) / (2n) of the full products' FLOPs; the softmax reads and writes only
// the causal part of each row (and zeros the rest). Without dropout the scores, their softmax and
// Y go a tile at a time (kernels::causal_attention_forward), and so do dP, the softmax's backward
// and dQ (kernels::causal_attention_backward): in 16-bit the fp32 scores then take one tile of each
// sequence-head, not a whole seq x seq square.
//
// It keeps its input and P (batch x H x seq x seq: the sequence-length-squared buffer); the dropout
// mask is regenerated from its offset. Wrapped in Checkpointed (see RecomputeAttention in
// policy/recompute_attention.hpp) it keeps only its input, and backward recomputes S, P and the mask:
// Megatron-LM's selective recompute of the attention core.
#pragma once

#include "../kernels/attention.hpp"
#include "../kernels/gemm.hpp"
#include "dropout.hpp"

#include <cmath>
#include <utility>

namespace REMAT_NAMESPACE {

namespace detail {

// What AttentionCore and BlockedAttentionCore share: the function (q, k and v of each position
// in, the heads' outputs side by side out, causal, scaled by 1 / sqrt(head_width), dropout P on
// the attention weights in training), no parameters, where the per-head matrices lie, the scale
// in the compute type, the dropout mask of a pass's stream, and buffers of rows in the compute
// type beside the same in the activation type.
template <std::size_t W, std::size_t H, rate_param P>
struct attention_function : no_parameters {
  static_assert(W > 0 && H > 0 && W % H == 0,
                "remat::AttentionCore<W, H> (or BlockedAttentionCore): the width W must be a positive multiple of "
                "the head count H");
  static_assert(P >= 0.0 && P < 1.0,
                "remat::AttentionCore<W, H, P> (or BlockedAttentionCore): the dropout probability P must be in [0, 1)");
  static constexpr std::size_t in_width = 3 * W;    // q, k and v of each position, W each
  static constexpr std::size_t out_width = W;       // the heads' outputs, side by side
  static constexpr std::size_t heads = H;           // attention heads
  static constexpr std::size_t head_width = W / H;  // features per head
  static constexpr double dropout = P;              // on the attention weights, in training
  static constexpr bool sequence_layer = true;  // rows are positions of sequences (s.sequence_length())

  template <class S>
  static constexpr bool same_storage = std::is_same_v<typename S::value_type, compute_type_t<typename S::value_type>>;
  // n rows of `cols` values in the compute type, and the activation-type tensor computed from them
  // (the same tensor when the two types agree, as in fp32).
  template <class S>
  static constexpr std::pair<typename S::act_type, typename S::act_type> compute_and_result(S& s, std::size_t n,
                                                                                          std::size_t cols) {
    typename S::act_type c = s.make(n, stat_columns<typename S::value_type>(cols));
    if constexpr (same_storage<S>)
      return {c, c};
    else
      return {c, s.make(n, cols)};
  }
  template <class S>
  static compute_type_t<typename S::value_type> scale() {
    return compute_type_t<typename S::value_type>(1.0 / std::sqrt(double(head_width)));
  }
  // The dropout mask of the stream drawn at `offset`, for the softmax kernels.
  template <class S>
  static auto mask_of(S& s, std::uint64_t offset) {
    return kernels::mask_values<compute_type_t<typename S::value_type>, expr::dropout_mask>{
        Dropout<P>::mask(s.random(offset))};
  }
  // Where the per-head matrices lie, matrix i being head i % H of sequence i / H: seq x head_width
  // blocks of the (batch * seq) x 3W input or its gradient (q, k or v by the column offset added
  // to the pointer), and of the (batch * seq) x W output or its gradient.
  static constexpr kernels::matrix_layout qkv_blocks(std::size_t seq) {
    return {index_t(seq), index_t(head_width), index_t(3 * W), {index_t(seq * 3 * W), index_t(head_width)}};
  }
  static constexpr kernels::matrix_layout out_blocks(std::size_t seq) {
    return {index_t(seq), index_t(head_width), index_t(W), {index_t(seq * W), index_t(head_width)}};
  }
};

}  // namespace detail

template <std::size_t W, std::size_t H, rate_param P = 0.0>
struct AttentionCore : detail::attention_function<W, H, P> {
  using base = detail::attention_function<W, H, P>;  // what it shares with the other core
  using base::out_blocks, base::qkv_blocks, base::compute_and_result, base::head_width;
  static constexpr bool attention_core = true;  // RecomputeAttention checkpoints it
  static constexpr std::size_t causal_tile = 64;  // positions per tile of the causal products

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    using A = typename S::act_type;
    std::size_t const seq = s.sequence_length(), rows = x->rows(), count = rows / seq * H;
    s.note_work(std::uint64_t(count) * seq * (seq + 1) * (W / H));  // Q K^T and P V over the causal half
    if (!(s.training() && P > 0.0)) {  // (no dropout: the products and the softmax tile by tile)
      A y = s.make(rows, W);
      auto [scores, probs] = tile_scores_and_result(s, count, seq);
      if constexpr (S::computes)
        kernels::causal_attention_forward(
            device<S>{}, blocks(x->data(), qkv_blocks(seq), x->data(), y->data(), out_blocks(seq), count),
            score_data<S>(scores), probs->data(), base::template scale<S>());
      scores.reset();
      s.save(std::move(x));
      s.save(std::move(probs));
      return y;
    }
    // The scores, in the compute type; the probabilities overwrite them when that is the storage type.
    auto [scores, probs] = compute_and_result(s, count * seq, seq);
    if constexpr (S::computes) {
      auto const* q = x->data();
      for_row_tiles(seq, [&](index_t r0, index_t rb) {  // S = Q K^T, keys up to the tile's last row
        kernels::gemm_batched(device<S>{}, {count, H}, kernels::lhs(q, qkv_blocks(seq)).window(r0, 0, rb, hw),
                              kernels::rhs(q + W, qkv_blocks(seq)).window(0, 0, r0 + rb, hw).transposed(),
                              kernels::result(stat_data(scores->data()), square_blocks(seq)).window(r0, 0, rb, r0 + rb));
      });
      kernels::causal_softmax(device<S>{}, stat_data(scores->data()), probs->data(), count, seq, base::template scale<S>());
    }
    scores.reset();
    A dropped = probs;  // the probabilities after dropout
    if (s.training() && P > 0.0) {
      std::uint64_t const offset = s.draw(count * seq * seq);
      s.save_counter(offset);
      dropped = s.make(count * seq, seq);
      if constexpr (S::computes) expr::apply_mask(*dropped, *probs, Dropout<P>::mask(s.random(offset)));
    }
    A y = s.make(rows, W);
    if constexpr (S::computes)
      for_row_tiles(seq, [&](index_t r0, index_t rb) {  // Y = dropout(P) V over the causal columns
        kernels::gemm_batched(device<S>{}, {count, H},
                              kernels::lhs(dropped->data(), square_blocks(seq)).window(r0, 0, rb, r0 + rb),
                              kernels::rhs(x->data() + 2 * W, qkv_blocks(seq)).window(0, 0, r0 + rb, hw),
                              kernels::result(y->data(), out_blocks(seq)).window(r0, 0, rb, hw));
      });
    dropped.reset();
    s.save(std::move(x));
    s.save(std::move(probs));
    return y;
  }

  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    using A = typename S::act_type;
    A probs = s.restore(), x = s.restore();
    std::size_t const seq = s.sequence_length(), rows = x->rows(), count = rows / seq * H;
    bool const drops = P > 0.0;
    std::uint64_t const offset = drops ? s.restore_counter() : 0;
    A dx = s.make(rows, 3 * W);
    using T = typename S::value_type;
    // dV = dropout(P)^T dY
    {
      A dropped = probs;
      if (drops) {
        dropped = s.make(count * seq, seq);
        if constexpr (S::computes) expr::apply_mask(*dropped, *probs, Dropout<P>::mask(s.random(offset)));
      }
      if constexpr (S::computes)  // key tile j is seen by positions j's first .. seq - 1
        for_row_tiles(seq, [&](index_t c0, index_t cb) {
          index_t const later = index_t(seq) - c0;
          kernels::gemm_batched(device<S>{}, {count, H},
                                kernels::lhs(dropped->data(), square_blocks(seq)).window(c0, c0, later, cb).transposed(),
                                kernels::rhs(dy->data(), out_blocks(seq)).window(c0, 0, later, hw),
                                kernels::result(dx->data() + 2 * W, qkv_blocks(seq)).window(c0, 0, cb, hw));
        });
    }
    // dP (after dropout) = dY V^T in the compute type, the softmax's backward into dS, dQ = dS K
    // (the 1/sqrt(d) is in dS): tile by tile.
    auto [dpd, dscores] = tile_scores_and_result(s, count, seq);
    if constexpr (S::computes) {
      auto const b = blocks(dy->data(), out_blocks(seq), x->data(), dx->data(), qkv_blocks(seq), count);
      if (drops)
        kernels::causal_attention_backward(device<S>{}, b, score_data<S>(dpd), probs->data(), dscores->data(),
                                           base::template scale<S>(), base::mask_of(s, offset));
      else
        kernels::causal_attention_backward(device<S>{}, b, score_data<S>(dpd), probs->data(), dscores->data(),
                                           base::template scale<S>(), kernels::no_mask<compute_type_t<T>>{});
    }
    probs.reset();
    dpd.reset();
    if constexpr (S::computes) {
      T const* xd = x->data();
      // dK = dS^T Q
      for_row_tiles(seq, [&](index_t c0, index_t cb) {
        index_t const later = index_t(seq) - c0;
        kernels::gemm_batched(device<S>{}, {count, H},
                              kernels::lhs(dscores->data(), square_blocks(seq)).window(c0, c0, later, cb).transposed(),
                              kernels::rhs(xd, qkv_blocks(seq)).window(c0, 0, later, hw),
                              kernels::result(dx->data() + W, qkv_blocks(seq)).window(c0, 0, cb, hw));
      });
    }
    return dx;
  }

 private:
  template <class S>
  using device = typename S::device;
  static constexpr index_t hw = index_t(head_width);
  // The per-head matrices of kernels::causal_attention_forward (q from the input x, y the output)
  // and _backward (q: dy, in the output's blocks; y: dx, in the input's); k and v from x.
  template <class T>
  static kernels::attention_blocks<T> blocks(T const* q, kernels::matrix_layout q_blocks, T const* x, T* y,
                                             kernels::matrix_layout y_blocks, std::size_t count) {
    std::size_t const seq = std::size_t(q_blocks.rows);
    return {{count, H},
            index_t(causal_tile),
            kernels::lhs(q, q_blocks),
            kernels::rhs(x + W, qkv_blocks(seq)),
            kernels::rhs(x + 2 * W, qkv_blocks(seq)),
            kernels::result(y, y_blocks)};
  }
  // The scores those kernels want (none when the activation type is the compute type: they work
  // in the result) and the count * seq x seq result in the activation type.
  template <class S>
  static constexpr std::pair<typename S::act_type, typename S::act_type> tile_scores_and_result(S& s, std::size_t count,
                                                                                     std::size_t seq) {
    using T = typename S::value_type;
    if constexpr (base::template same_storage<S>) {
      return {typename S::act_type{}, s.make(count * seq, seq)};
    } else {
      typename S::act_type r = s.make(count * seq, seq);  // (the scores last: they go first)
      return {s.make(kernels::attention_scores_rows(count, seq, causal_tile), stat_columns<T>(seq)), r};
    }
  }
  template <class S>
  static constexpr compute_type_t<typename S::value_type>* score_data(typename S::act_type const& z) {
    if constexpr (base::template same_storage<S>)
      return nullptr;
    else
      return stat_data(z->data());
  }
  // f(first, count) for each tile of causal_tile positions of a sequence (the last may be shorter).
  template <class F>
  static void for_row_tiles(std::size_t seq, F const& f) {
    kernels::detail::for_attention_tiles(index_t(seq), index_t(causal_tile), f);  // (the kernels' tiles)
  }
  // seq x seq squares of the scores, probabilities or their gradients (batch x H x seq x seq).
  static constexpr kernels::matrix_layout square_blocks(std::size_t seq) {
    return {index_t(seq), index_t(seq), index_t(seq), {index_t(H * seq * seq), index_t(seq * seq)}};
  }
};

// BlockedAttentionCore<W, H, P>: AttentionCore's function (same input, output, scaling, causal
// mask and dropout stream) in memory linear in the sequence length. It never makes the
// batch x H x seq x seq probabilities: the queries go in panels of `panel_rows` positions, each
// against the keys its last position sees (the masked keys after them are skipped). For a panel,
// the scores are a batched product, one pass per row turns them into probabilities (the softmax's
// maximum and sum over the whole visible row), and the output rows are a second product; the
// panel's buffers are reused by the next panel. The forward keeps its input and two numbers per
// row and head (the row's maximum and 1 / its sum: FlashAttention keeps their log-sum-exp; these two
// give back the forward's probabilities bit for bit); backward goes over the panels again,
// recomputes each panel's scores from Q and K, its probabilities from the statistics and the
// dropout mask from its offset, and accumulates dK and dV over the panels (in fp32 when
// activations are 16-bit).
//
// Trade-off against AttentionCore: the probabilities are not kept, so backward multiplies Q K^T
// once more (7 products of a panel's size in a step where AttentionCore does 6 of a tile's), and
// the transient buffers are a few panels of panel_rows x seq per sequence-head instead of the
// seq x seq square. Where AttentionCore keeps 4 * batch * H * seq^2 bytes (64 MiB per layer at
// batch 1, 4 heads and a context of 2048), this keeps 8 * batch * H * seq. The probabilities are
// AttentionCore's (the same formulas on the same scores); the outputs and gradients differ from
// its at the roundings of sums taken in another order (dK and dV added up panel by panel).
//
// (Every sequence-head's whole visible row is in the panel, so the softmax needs no running
// rescale, as FlashAttention's key tiles do: one product per panel instead of one per key tile,
// which a CPU's BLAS runs far better than many 64 x 64 ones.)
template <std::size_t W, std::size_t H, rate_param P = 0.0>
struct BlockedAttentionCore : detail::attention_function<W, H, P> {
  using base = detail::attention_function<W, H, P>;  // what it shares with the other core
  using base::out_blocks, base::qkv_blocks, base::head_width, base::mask_of;
  static constexpr std::size_t panel_rows = 64;  // queries per panel

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    using A = typename S::act_type;
    using T = typename S::value_type;
    using V = compute_type_t<T>;
    std::size_t const seq = s.sequence_length(), rows = x->rows(), count = rows / seq * H;
    s.note_work(std::uint64_t(count) * seq * (seq + 1) * (W / H));  // Q K^T and P V over the causal half
    bool const drops = s.training() && P > 0.0;
    std::uint64_t const offset = drops ? s.draw(count * seq * seq) : 0;
    if (drops) s.save_counter(offset);
    A stats = s.make(count * seq, stat_columns<T>(2));
    A y = s.make(rows, W);
    {
      auto [scores, probs] = panels(s, count, seq);
      if constexpr (S::computes) {
        // The sequence-heads [m0, m0 + mc): their panels one after another.
        auto const run = [&](std::size_t m0, std::size_t mc) {
          T const* q = x->data() + qkv_blocks(seq).stride.at(m0, H);
          V* sc = stat_data(scores->data()) + panel_at(m0, seq);
          T* pr = probs->data() + panel_at(m0, seq);
          for_panels(mc, m0, seq, [&](kernels::panel_geometry const& g) {
            index_t const r0 = index_t(g.r0), rb = index_t(g.rb), keys = index_t(g.keys());
            kernels::gemm_batched(device<S>{}, {mc, H}, kernels::lhs(q, qkv_blocks(seq)).window(r0, 0, rb, hw),
                                  kernels::rhs(q + W, qkv_blocks(seq)).window(0, 0, keys, hw).transposed(),
                                  kernels::result(sc, panel_blocks(seq)).window(0, 0, rb, keys));
            if (drops)
              kernels::panel_softmax(device<S>{}, g, sc, pr, stat_data(stats->data()), base::template scale<S>(),
                                     base::mask_of(s, offset));
            else
              kernels::panel_softmax(device<S>{}, g, sc, pr, stat_data(stats->data()), base::template scale<S>(),
                                     kernels::no_mask<V>{});
            kernels::gemm_batched(device<S>{}, {mc, H}, kernels::lhs(pr, panel_blocks(seq)).window(0, 0, rb, keys),
                                  kernels::rhs(q + 2 * W, qkv_blocks(seq)).window(0, 0, keys, hw),
                                  kernels::result(y->data() + out_blocks(seq).stride.at(m0, H), out_blocks(seq))
                                      .window(r0, 0, rb, hw));
          });
        };
        for_sequence_heads<S>(count, seq, run);
      }
    }
    s.save(std::move(x));
    s.save(std::move(stats));
    return y;
  }

  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    using A = typename S::act_type;
    using T = typename S::value_type;
    using V = compute_type_t<T>;
    A stats = s.restore(), x = s.restore();
    std::size_t const seq = s.sequence_length(), rows = x->rows(), count = rows / seq * H;
    bool const drops = P > 0.0;
    std::uint64_t const offset = drops ? s.restore_counter() : 0;
    A dx = s.make(rows, 3 * W);
    // dK and dV add up over the panels: in dx itself, or in fp32 beside it when dx is 16-bit.
    A dkv = base::template same_storage<S> ? A{} : s.make(rows, stat_columns<T>(2 * W));
    {
      auto [scores, dropped] = panels(s, count, seq);
      auto [dpd, dscores] = panels(s, count, seq);
      if constexpr (S::computes) {
        // The sequence-heads [m0, m0 + mc): their panels from the last (which sees every key, so
        // writes dK and dV; the earlier ones add to them).
        auto const run = [&](std::size_t m0, std::size_t mc) {
          T const* xd = x->data() + qkv_blocks(seq).stride.at(m0, H);
          T* dq = dx->data() + qkv_blocks(seq).stride.at(m0, H);
          T const* g_out = dy->data() + out_blocks(seq).stride.at(m0, H);
          std::size_t const at = panel_at(m0, seq);
          V* sc = stat_data(scores->data()) + at;
          V* dp = stat_data(dpd->data()) + at;
          T* pd = dropped->data() + at;
          T* ds = dscores->data() + at;
          auto const kv_result = [&](index_t keys, index_t column) {  // rows 0 .. keys of dK (0) or dV (W)
            if constexpr (base::template same_storage<S>)
              return kernels::result(dq + W + column, qkv_blocks(seq)).window(0, 0, keys, hw);
            else
              return kernels::result(stat_data(dkv->data()) + kv_blocks(seq).stride.at(m0, H) + column,
                                     kv_blocks(seq))
                  .window(0, 0, keys, hw);
          };
          bool first = true;
          for_panels_backwards(mc, m0, seq, [&](kernels::panel_geometry const& g) {
            index_t const r0 = index_t(g.r0), rb = index_t(g.rb), keys = index_t(g.keys());
            kernels::scale const add{1.0, first ? 0.0 : 1.0};
            first = false;
            kernels::gemm_batched(device<S>{}, {mc, H}, kernels::lhs(xd, qkv_blocks(seq)).window(r0, 0, rb, hw),
                                  kernels::rhs(xd + W, qkv_blocks(seq)).window(0, 0, keys, hw).transposed(),
                                  kernels::result(sc, panel_blocks(seq)).window(0, 0, rb, keys));
            kernels::gemm_batched(device<S>{}, {mc, H}, kernels::lhs(g_out, out_blocks(seq)).window(r0, 0, rb, hw),
                                  kernels::rhs(xd + 2 * W, qkv_blocks(seq)).window(0, 0, keys, hw).transposed(),
                                  kernels::result(dp, panel_blocks(seq)).window(0, 0, rb, keys));
            if (drops)
              kernels::panel_softmax_backward(device<S>{}, g, sc, dp, stat_data(stats->data()), pd, ds, base::template scale<S>(),
                                              base::mask_of(s, offset));
            else
              kernels::panel_softmax_backward(device<S>{}, g, sc, dp, stat_data(stats->data()), pd, ds, base::template scale<S>(),
                                              kernels::no_mask<V>{});
            // dV += dropout(P)^T dY, dQ = dS K, dK += dS^T Q (the 1/sqrt(d) is in dS)
            kernels::gemm_batched(device<S>{}, {mc, H},
                                  kernels::lhs(pd, panel_blocks(seq)).window(0, 0, rb, keys).transposed(),
                                  kernels::rhs(g_out, out_blocks(seq)).window(r0, 0, rb, hw), kv_result(keys, W),
                                  add);
            kernels::gemm_batched(device<S>{}, {mc, H}, kernels::lhs(ds, panel_blocks(seq)).window(0, 0, rb, keys),
                                  kernels::rhs(xd + W, qkv_blocks(seq)).window(0, 0, keys, hw),
                                  kernels::result(dq, qkv_blocks(seq)).window(r0, 0, rb, hw));
            kernels::gemm_batched(device<S>{}, {mc, H},
                                  kernels::lhs(ds, panel_blocks(seq)).window(0, 0, rb, keys).transposed(),
                                  kernels::rhs(xd, qkv_blocks(seq)).window(r0, 0, rb, hw), kv_result(keys, 0), add);
          });
        };
        for_sequence_heads<S>(count, seq, run);
        if constexpr (!base::template same_storage<S>) {  // dK and dV rounded into dx once
          V const* from = stat_data(dkv->data());
          T* to = dx->data();
          kernels::for_each_index(device<S>{}, rows * 2 * W, rows * 2 * W, [=] REMAT_LAMBDA(std::size_t i) {
            std::size_t const r = i / (2 * W), c = i % (2 * W);
            to[r * 3 * W + W + c] = from_compute<T>(from[i]);
          });
        }
      }
    }
    return dx;
  }

 private:
  template <class S>
  using device = typename S::device;
  static constexpr index_t hw = index_t(head_width);
  template <class S>
  static constexpr bool same_storage = std::is_same_v<typename S::value_type, compute_type_t<typename S::value_type>>;
  static constexpr std::size_t panel_count(std::size_t seq) { return (seq + panel_rows - 1) / panel_rows; }
  // Rows of a panel's buffers (a sequence shorter than a panel needs only its own).
  static constexpr std::size_t panel_height(std::size_t seq) { return seq < panel_rows ? seq : panel_rows; }
  static kernels::panel_geometry geometry(std::size_t count, std::size_t first, std::size_t seq, std::size_t i) {
    std::size_t const r0 = i * panel_rows, rb = seq - r0 < panel_rows ? seq - r0 : panel_rows;
    return {count, seq, r0, rb, panel_height(seq) * seq, seq, first};
  }
  template <class F>
  static void for_panels(std::size_t count, std::size_t first, std::size_t seq, F const& f) {
    for (std::size_t i = 0; i < panel_count(seq); ++i) f(geometry(count, first, seq, i));
  }
  template <class F>
  static void for_panels_backwards(std::size_t count, std::size_t first, std::size_t seq, F const& f) {
    for (std::size_t i = panel_count(seq); i-- > 0;) f(geometry(count, first, seq, i));
  }
  // run(m0, mc) over all `count` sequence-heads: on the host, each on one thread with its panels
  // (whose buffers then stay in that core's cache from one product to the next; the products and
  // row passes inside run serially), when there are enough of them for the threads; on the GPU, and
  // otherwise, all together (each product batched over them, each row pass over all their rows).
  // A 16-bit product's scratch may fail to allocate inside a thread: the error is thrown again once
  // every thread is done (an exception may not leave an OpenMP thread).
  template <class S, class Run>
  static void for_sequence_heads(std::size_t count, std::size_t seq, Run const& run) {
    if constexpr (std::is_same_v<typename S::device, host>) {
      if (count >= kernels::detail::host_threads()) {
        kernels::detail::host_split_throwing(count, count * seq * seq * head_width,
                                             [&](std::size_t first, std::size_t last) {
                                               for (std::size_t m = first; m < last; ++m) run(m, 1);
                                             });
        return;
      }
    }
    run(0, count);
  }
  // Where sequence-head m's panel starts in the panel buffers.
  static constexpr std::size_t panel_at(std::size_t m, std::size_t seq) { return m * panel_height(seq) * seq; }
  // A panel's buffers: count panels of panel_rows x seq values in the compute type, and the same in
  // the activation type (one tensor when the two types agree).
  template <class S>
  static constexpr std::pair<typename S::act_type, typename S::act_type> panels(S& s, std::size_t count,
                                                                              std::size_t seq) {
    return base::compute_and_result(s, count * panel_height(seq), seq);
  }
  // Per-head matrices (i = sequence * H + head), beside the input's and the output's: seq x
  // head_width blocks of the fp32 dK | dV buffer; panels of panel_rows x seq (row stride seq) one
  // after another.
  static constexpr kernels::matrix_layout kv_blocks(std::size_t seq) {
    return {index_t(seq), index_t(head_width), index_t(2 * W), {index_t(seq * 2 * W), index_t(head_width)}};
  }
  static constexpr kernels::matrix_layout panel_blocks(std::size_t seq) {
    return {index_t(panel_height(seq)), index_t(seq), index_t(seq),
            {index_t(H * panel_height(seq) * seq), index_t(panel_height(seq) * seq)}};
  }
};

}  // namespace REMAT_NAMESPACE
