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
// the causal part of each row (and zeros the rest).
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

template <std::size_t W, std::size_t H, double P = 0.0>
struct AttentionCore {
  static_assert(W > 0 && H > 0 && W % H == 0,
                "remat::AttentionCore<W, H>: the width W must be a positive multiple of the head count H");
  static_assert(P >= 0.0 && P < 1.0, "remat::AttentionCore<W, H, P>: the dropout probability P must be in [0, 1)");
  static constexpr std::size_t in_width = 3 * W;
  static constexpr std::size_t out_width = W;
  static constexpr std::size_t param_count = 0;
  static constexpr std::size_t heads = H;
  static constexpr std::size_t head_width = W / H;
  static constexpr double dropout = P;
  static constexpr bool sequence_layer = true;  // rows are positions of sequences (s.sequence_length())
  static constexpr bool attention_core = true;  // RecomputeAttention checkpoints it

  static constexpr std::size_t causal_tile = 64;

  static std::vector<param_desc> params() { return {}; }
  template <class T>
  static void init(T*, std::size_t, std::uint64_t) {}

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    using A = typename S::act_type;
    std::size_t const seq = s.sequence_length(), rows = x->rows(), count = rows / seq * H;
    // The scores, in the compute type; the probabilities overwrite them when that is the storage type.
    auto [scores, probs] = compute_and_result(s, count * seq, seq);
    s.note_work(std::uint64_t(count) * seq * (seq + 1) * (W / H));  // Q K^T and P V over the causal half
    if constexpr (S::computes) {
      auto const* q = x->data();
      for_row_tiles(seq, [&](index_t r0, index_t rb) {  // S = Q K^T, keys up to the tile's last row
        kernels::gemm_batched(device<S>{}, {count, H}, kernels::lhs(q, qkv_blocks(seq)).window(r0, 0, rb, hw),
                              kernels::rhs(q + W, qkv_blocks(seq)).window(0, 0, r0 + rb, hw).transposed(),
                              kernels::result(stat_data(scores->data()), square_blocks(seq)).window(r0, 0, rb, r0 + rb));
      });
      kernels::causal_softmax(device<S>{}, stat_data(scores->data()), probs->data(), count, seq, scale<S>());
    }
    scores.reset();
    A dropped = probs;  // the probabilities after dropout
    if (s.training() && P > 0.0) {
      std::uint64_t const offset = s.draw(count * seq * seq);
      s.save_counter(offset);
      dropped = s.make(count * seq, seq);
      if constexpr (S::computes) evaluate(*dropped, *probs * Dropout<P>::mask(s.random(offset)));
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
        if constexpr (S::computes) evaluate(*dropped, *probs * Dropout<P>::mask(s.random(offset)));
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
    // dP (after dropout) = dY V^T in the compute type, then the softmax's backward into dS.
    auto [dpd, dscores] = compute_and_result(s, count * seq, seq);
    if constexpr (S::computes) {
      using V = compute_type_t<T>;
      T const* xd = x->data();
      for_row_tiles(seq, [&](index_t r0, index_t rb) {
        kernels::gemm_batched(device<S>{}, {count, H}, kernels::lhs(dy->data(), out_blocks(seq)).window(r0, 0, rb, hw),
                              kernels::rhs(xd + 2 * W, qkv_blocks(seq)).window(0, 0, r0 + rb, hw).transposed(),
                              kernels::result(stat_data(dpd->data()), square_blocks(seq)).window(r0, 0, rb, r0 + rb));
      });
      if (drops) {
        expr::dropout_mask const m = Dropout<P>::mask(s.random(offset));
        kernels::causal_softmax_backward(device<S>{}, probs->data(), stat_data(dpd->data()), dscores->data(), count,
                                         seq, scale<S>(), kernels::mask_values<V, expr::dropout_mask>{m});
      } else {
        kernels::causal_softmax_backward(device<S>{}, probs->data(), stat_data(dpd->data()), dscores->data(), count,
                                         seq, scale<S>(), kernels::no_mask<V>{});
      }
    }
    probs.reset();
    dpd.reset();
    if constexpr (S::computes) {
      T const* xd = x->data();
      // dQ = dS K, dK = dS^T Q (the 1/sqrt(d) is in dS)
      for_row_tiles(seq, [&](index_t r0, index_t rb) {
        kernels::gemm_batched(device<S>{}, {count, H},
                              kernels::lhs(dscores->data(), square_blocks(seq)).window(r0, 0, rb, r0 + rb),
                              kernels::rhs(xd + W, qkv_blocks(seq)).window(0, 0, r0 + rb, hw),
                              kernels::result(dx->data(), qkv_blocks(seq)).window(r0, 0, rb, hw));
      });
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
  // f(first, count) for each tile of causal_tile positions of a sequence (the last may be shorter).
  template <class F>
  static void for_row_tiles(std::size_t seq, F const& f) {
    for (std::size_t r0 = 0; r0 < seq; r0 += causal_tile)
      f(index_t(r0), index_t(seq - r0 < causal_tile ? seq - r0 : causal_tile));
  }
  template <class S>
  static constexpr bool same_storage = std::is_same_v<typename S::value_type, compute_type_t<typename S::value_type>>;
  // n rows of seq values in the compute type, and the activation-type tensor computed from them
  // (the same tensor when the two types agree, as in fp32).
  template <class S>
  static constexpr std::pair<typename S::act_type, typename S::act_type> compute_and_result(S& s, std::size_t n,
                                                                                          std::size_t seq) {
    typename S::act_type c = s.make(n, stat_columns<typename S::value_type>(seq));
    if constexpr (same_storage<S>)
      return {c, c};
    else
      return {c, s.make(n, seq)};
  }
  template <class S>
  static compute_type_t<typename S::value_type> scale() {
    return compute_type_t<typename S::value_type>(1.0 / std::sqrt(double(head_width)));
  }
  // Where the per-head matrices lie, matrix i being head i % H of sequence i / H: seq x head_width
  // blocks of the (batch * seq) x 3W input or its gradient (q, k or v by the column offset added
  // to the pointer); of the (batch * seq) x W output or its gradient; and seq x seq squares of the
  // scores, probabilities or their gradients (batch x H x seq x seq).
  static constexpr kernels::matrix_layout qkv_blocks(std::size_t seq) {
    return {index_t(seq), index_t(head_width), index_t(3 * W), {index_t(seq * 3 * W), index_t(head_width)}};
  }
  static constexpr kernels::matrix_layout out_blocks(std::size_t seq) {
    return {index_t(seq), index_t(head_width), index_t(W), {index_t(seq * W), index_t(head_width)}};
  }
  static constexpr kernels::matrix_layout square_blocks(std::size_t seq) {
    return {index_t(seq), index_t(seq), index_t(seq), {index_t(H * seq * seq), index_t(seq * seq)}};
  }
};

}  // namespace REMAT_NAMESPACE
