// Embedding<Vocab, W>: integer ids in, rows of a learned table out (PyTorch init: N(0, 1)). It is
// the first layer of a model that reads token ids; the ids of the pass are in pass_state.
#pragma once

#include "../kernels/rows.hpp"
#include "common.hpp"

namespace REMAT_NAMESPACE {

namespace detail {

// A learned Rows x W table named "weight", initialised N(0, 1) as nn.Embedding.
template <std::size_t Rows, std::size_t W>
struct learned_table {
  static constexpr std::size_t param_count = Rows * W;
  static std::vector<param_desc> params() { return {{"weight", 0, {Rows, W}}}; }
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    init::normal(p, param_count, global_offset, seed, 1.0);
  }
};

}  // namespace detail

template <std::size_t Vocab, std::size_t W>
struct Embedding : detail::learned_table<Vocab, W> {
  static_assert(Vocab > 0 && W > 0, "remat::Embedding<Vocab, W>: sizes must be positive");
  static constexpr std::size_t vocabulary = Vocab;
  static constexpr std::size_t in_width = 1;  // one id per row
  static constexpr std::size_t out_width = W;

  // The ids of the pass are in the pass state; the layer before (there is none) passes nothing.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type) {
    std::size_t const rows = s.id_count;
    typename S::act_type y = s.make(rows, W);
    if constexpr (S::computes) {
      using T = typename S::value_type;
      T* out = y->data();
      std::int32_t const* ids = s.ids;
      kernels::for_each_index(typename S::device{}, rows, rows * W, [=] REMAT_LAMBDA(std::size_t r) {
        T const* src = p + std::size_t(ids[r]) * W;
        for (std::size_t i = 0; i < W; ++i) out[r * W + i] = src[i];
      });
    }
    return y;
  }

  // Scatter-add of dy into the rows of the table that the ids picked (serial over rows: two rows
  // may pick the same id, and the order of the sums is then fixed). Ids have no gradient.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    if constexpr (S::computes) {
      using T = typename S::value_type;
      using G = typename S::grad_type;
      using V = compute_type_t<G>;
      std::size_t const rows = s.id_count;
      std::int32_t const* ids = s.ids;
      T const* d = dy->data();
      kernels::for_each_index(typename S::device{}, W, rows * W, [=] REMAT_LAMBDA(std::size_t i) {
        for (std::size_t r = 0; r < rows; ++r) {
          G& gi = g[std::size_t(ids[r]) * W + i];
          gi = from_compute<G>(to_compute<V>(gi) + to_compute<V>(d[r * W + i]));
        }
      });
    }
    return {};
  }
};

// PositionEmbedding<MaxLen, W>: adds a learned row per position to a sequence batch, y[r] = x[r] +
// table[r % seq] (GPT's wpe; init N(0, 1) as nn.Embedding). Sequences longer than MaxLen are an
// error, caught by the model before anything runs.
template <std::size_t MaxLen, std::size_t W>
struct PositionEmbedding : detail::learned_table<MaxLen, W> {
  static_assert(MaxLen > 0 && W > 0, "remat::PositionEmbedding<MaxLen, W>: sizes must be positive");
  static constexpr std::size_t max_sequence = MaxLen;
  static constexpr bool sequence_layer = true;
  static constexpr std::size_t in_width = W;
  static constexpr std::size_t out_width = W;

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    std::size_t const rows = x->rows(), seq = s.seq_len;
    typename S::act_type y;
    if (!s.training && x.use_count() == 1)  // inference: in place
      y = x;
    else
      y = s.make(rows, W);
    if constexpr (S::computes) {
      using T = typename S::value_type;
      using V = compute_type_t<T>;
      T const* in = x->data();
      T* out = y->data();
      kernels::for_each_index(typename S::device{}, rows, rows * W, [=] REMAT_LAMBDA(std::size_t r) {
        T const* pos = p + (r % seq) * W;
        for (std::size_t i = 0; i < W; ++i)
          out[r * W + i] = from_compute<T>(to_compute<V>(in[r * W + i]) + to_compute<V>(pos[i]));
      });
    }
    return y;
  }

  // The table's gradient sums dy over the sequences of the batch, in order; dx = dy.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    if constexpr (S::computes) {
      using T = typename S::value_type;
      using G = typename S::grad_type;
      using V = compute_type_t<G>;
      std::size_t const seq = s.seq_len, batch = dy->rows() / seq;
      T const* d = dy->data();
      static_assert(std::is_same_v<V, G>, "gradients are fp32 or fp64");
      kernels::for_each_index(typename S::device{}, seq, seq * batch * W, [=] REMAT_LAMBDA(std::size_t t) {
        for (std::size_t b = 0; b < batch; ++b)
          for (std::size_t i = 0; i < W; ++i) g[t * W + i] += to_compute<V>(d[(b * seq + t) * W + i]);
      });
    }
    return dy;
  }
};

template <class L>
inline constexpr bool is_embedding_v = false;
template <std::size_t V, std::size_t W>
inline constexpr bool is_embedding_v<Embedding<V, W>> = true;

}  // namespace REMAT_NAMESPACE
