// CheckpointSequential<K, S>: S (a Seq or a Repeat) cut into K runs as equal as possible (the
// first ones one longer), each checkpointed: PyTorch's checkpoint_sequential. Names and layout
// stay those of S.
#pragma once

#include "checkpointed.hpp"

#include <cstddef>
#include <utility>

namespace REMAT_NAMESPACE {

// Fails to compile, naming K and the number of layers or blocks, unless 1 <= K <= Layers.
template <std::size_t K, std::size_t Layers>
struct too_many_segments {
  static constexpr bool ok = K >= 1 && K <= Layers;  // (true: the assertion passed)
  static_assert(ok, "remat::CheckpointSequential<K, S>: K must be between 1 and the number of layers (or blocks) "
                    "of S; too_many_segments<K, layers of S> names both");
};

namespace detail {

// The segment j of n items cut into k runs as equal as possible (the first n % k one longer).
constexpr std::size_t segment_begin(std::size_t n, std::size_t k, std::size_t j) {
  return j * (n / k) + (j < n % k ? j : n % k);
}

template <std::size_t Begin, class Seq, class I>
struct seq_slice_impl;
template <std::size_t Begin, class... L, std::size_t... I>
struct seq_slice_impl<Begin, Seq<L...>, std::index_sequence<I...>> {
  using type = Seq<nth<Begin + I, L...>...>;
};
template <class S, std::size_t Begin, std::size_t End>
using seq_slice = typename seq_slice_impl<Begin, S, std::make_index_sequence<End - Begin>>::type;

template <std::size_t K, class S, class J>
struct checkpointed_runs_impl;
template <std::size_t K, class... L, std::size_t... J>
struct checkpointed_runs_impl<K, Seq<L...>, std::index_sequence<J...>> {
  static constexpr std::size_t n = sizeof...(L);
  using type = Seq<Checkpointed<seq_slice<Seq<L...>, segment_begin(n, K, J), segment_begin(n, K, J + 1)>>...>;
};

}  // namespace detail

template <std::size_t K, class S>
struct CheckpointSequential {
  static_assert(not_a_segment<CheckpointSequential, S>::ok);
  static_assert(sizeof(S*) == 0, "remat::CheckpointSequential<K, S>: S must be a Seq<...> or a Repeat<N, Block>");
};

// A Seq cut into K runs of layers, each checkpointed.
template <std::size_t K, class... L>
struct CheckpointSequential<K, Seq<L...>> : wraps<Seq<L...>> {
  static_assert(too_many_segments<K, sizeof...(L)>::ok);
  // Seq<Checkpointed<Seq<first run>>, ...>: what runs (its parameters laid out as S's).
  using runs = typename detail::checkpointed_runs_impl<K, Seq<L...>, std::make_index_sequence<K>>::type;
  static_assert(runs::param_count == Seq<L...>::param_count);

  // The runs' forwards, each keeping only its input.
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    return runs::forward(s, p, std::move(x));
  }
  // The runs' backwards, last first, each recomputing its forward first.
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    return runs::backward(s, p, g, std::move(dy));
  }
};

// A Repeat cut into K runs of blocks, each checkpointed; the blocks run in Repeat's own loops.
template <std::size_t K, std::size_t N, class B>
struct CheckpointSequential<K, Repeat<N, B>> : wraps<Repeat<N, B>> {
  static_assert(too_many_segments<K, N>::ok);

  // The runs of blocks, each keeping only its input.
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return Repeat<N, B>::forward(s, p, std::move(x));
    for (std::size_t j = 0; j < K; ++j)
      x = detail::checkpoint_forward(s, std::move(x), [&](typename St::act_type in) {
        return detail::forward_blocks<B>(s, p, std::move(in), first(j), first(j + 1));
      });
    return x;
  }

  // The runs' backwards, last first, each recomputing its blocks' forwards first.
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    for (std::size_t j = K; j-- > 0;) {
      detail::checkpoint_recompute(s, [&](typename St::act_type in) {
        return detail::forward_blocks<B>(s, p, std::move(in), first(j), first(j + 1));
      });
      s.count_recomputed(first(j + 1) - first(j));
      dy = detail::backward_blocks<B>(s, p, g, std::move(dy), first(j), first(j + 1));
    }
    return dy;
  }

 private:
  static constexpr std::size_t first(std::size_t j) { return detail::segment_begin(N, K, j); }
};

}  // namespace REMAT_NAMESPACE
