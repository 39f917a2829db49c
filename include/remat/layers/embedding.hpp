// Embedding<Vocab, W>: integer ids in, rows of a learned table out (PyTorch init: N(0, 1)). It is
// the first layer of a model that reads token ids; the ids of the pass are in the pass state.
#pragma once

#include "../kernels/embedding.hpp"
#include "layer.hpp"

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
  static constexpr std::size_t vocabulary = Vocab;  // ids are in [0, Vocab)
  static constexpr bool reads_ids = true;           // the model's input is token ids
  static constexpr std::size_t in_width = 1;  // one id per row
  static constexpr std::size_t out_width = W;       // the id's row of the table

  // The ids of the pass are in the pass state; the layer before (there is none) passes nothing.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type) {
    token_ids const ids = s.ids();
    typename S::act_type y = s.make(ids.count, W);
    if constexpr (S::computes) kernels::gather_rows(typename S::device{}, p, ids.data, ids.count, W, y->data());
    return y;
  }

  // Scatter-add of dy into the rows of the table that the ids picked, each row's sum in batch order
  // (two rows may pick the same id; the order is then fixed). Ids have no gradient.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    if constexpr (S::computes)
      kernels::scatter_add_rows(typename S::device{}, s.ids().data, s.ids().count, W, Vocab, dy->data(), g);
    return {};
  }
};

// PositionEmbedding<MaxLen, W>: adds a learned row per position to a sequence batch, y[r] = x[r] +
// table[r % seq] (GPT's wpe; init N(0, 1) as nn.Embedding). Sequences longer than MaxLen are an
// error, caught by the model before anything runs.
template <std::size_t MaxLen, std::size_t W>
struct PositionEmbedding : detail::learned_table<MaxLen, W> {
  static_assert(MaxLen > 0 && W > 0, "remat::PositionEmbedding<MaxLen, W>: sizes must be positive");
  static constexpr std::size_t max_sequence = MaxLen;  // the longest sequence it takes
  static constexpr bool sequence_layer = true;         // its rows are positions of sequences
  static constexpr std::size_t in_width = W;           // features per position in
  static constexpr std::size_t out_width = W;          // the same, with the position's row added

  // y = x + the table's row of each row's position in its sequence (in place in inference).
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    std::size_t const rows = x->rows(), seq = s.sequence_length();
    typename S::act_type y;
    if (!s.training() && x.use_count() == 1)  // inference: in place
      y = x;
    else
      y = s.make(rows, W);
    if constexpr (S::computes) kernels::add_positions(typename S::device{}, x->data(), p, rows, seq, W, y->data());
    return y;
  }

  // The table's gradient sums dy over the sequences of the batch, in order; dx = dy.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    if constexpr (S::computes)
      kernels::add_positions_backward(typename S::device{}, dy->data(), dy->rows(), s.sequence_length(), W, g);
    return dy;
  }
};

}  // namespace REMAT_NAMESPACE
