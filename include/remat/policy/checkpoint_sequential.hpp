// CheckpointSequential<K, S>: S (a Seq or a Repeat) cut into K runs as equal as possible (the
// first ones one longer), each checkpointed. CheckpointSequential<K, S, last_run::stored> is
// PyTorch's checkpoint_sequential: K - 1 checkpointed runs of N / K layers (or blocks) each, and
// the rest in a last run that keeps its activations. The backward starts with that run, so running
// it again right after the forward would only save memory while the layers after S run forward
// and back (a language model's head and loss). Names and layout stay those of S.
#pragma once

#include "checkpointed.hpp"

#include <cstddef>
#include <type_traits>
#include <utility>

namespace REMAT_NAMESPACE {

// Fails to compile, naming K and the number of layers or blocks, unless 1 <= K <= Layers.
template <std::size_t K, std::size_t Layers>
struct too_many_segments {
  static constexpr bool ok = K >= 1 && K <= Layers;  // (true: the assertion passed)
  static_assert(ok, "remat::CheckpointSequential<K, S>: K must be between 1 and the number of layers (or blocks) "
                    "of S; too_many_segments<K, layers of S> names both");
};

// What CheckpointSequential does with its last run: checkpoint it as the others (the least
// memory), or keep its activations (PyTorch's checkpoint_sequential: one run's forward less).
enum class last_run {
  checkpointed,  // every run keeps its input only and runs again in the backward
  stored         // the last run keeps what its backward needs and never runs again
};

namespace detail {

// Where run j of n items cut into k runs begins (run k: n). Every run checkpointed: as equal as
// possible, the first n % k one longer. The last one stored: PyTorch's cut, n / k items to each
// checkpointed run and the rest (n / k + n % k) to the stored one, which never runs again.
constexpr std::size_t run_begin(last_run last, std::size_t n, std::size_t k, std::size_t j) {
  if (last == last_run::stored) return j == k ? n : j * (n / k);
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

// Run J of K over S's layers: checkpointed, or as it is when it is the last and Last says stored.
template <std::size_t K, last_run Last, class S, std::size_t J, std::size_t n = S::size>
using sequential_run = std::conditional_t<Last == last_run::stored && J + 1 == K,
                                          seq_slice<S, run_begin(Last, n, K, J), run_begin(Last, n, K, J + 1)>,
                                          Checkpointed<seq_slice<S, run_begin(Last, n, K, J), run_begin(Last, n, K, J + 1)>>>;

template <std::size_t K, last_run Last, class S, class J>
struct checkpointed_runs_impl;
template <std::size_t K, last_run Last, class... L, std::size_t... J>
struct checkpointed_runs_impl<K, Last, Seq<L...>, std::index_sequence<J...>> {
  using type = Seq<sequential_run<K, Last, Seq<L...>, J>...>;
};

}  // namespace detail

template <std::size_t K, class S, last_run Last = last_run::checkpointed>
struct CheckpointSequential {
  static_assert(not_a_segment<CheckpointSequential, S>::ok);
  static_assert(sizeof(S*) == 0, "remat::CheckpointSequential<K, S>: S must be a Seq<...> or a Repeat<N, Block>");
};

// A Seq cut into K runs of layers, each checkpointed (the last one stored when Last says so).
template <std::size_t K, class... L, last_run Last>
struct CheckpointSequential<K, Seq<L...>, Last> : wraps<Seq<L...>> {
  static_assert(too_many_segments<K, sizeof...(L)>::ok);
  // Seq<Checkpointed<Seq<first run>>, ...>: what runs (its parameters laid out as S's).
  using runs = typename detail::checkpointed_runs_impl<K, Last, Seq<L...>, std::make_index_sequence<K>>::type;
  static_assert(runs::param_count == Seq<L...>::param_count);
  // The same policy around other children (what graph rewrites such as RecomputeAttention use).
  template <class... C>
  using rebuild = CheckpointSequential<K, C..., Last>;

  // The runs' forwards, each keeping only its input (a stored last one what its backward needs).
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    return runs::forward(s, p, std::move(x));
  }
  // The runs' backwards, last first, each recomputing its forward first (but a stored last one).
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    return runs::backward(s, p, g, std::move(dy));
  }
};

// A Repeat cut into K runs of blocks, each checkpointed (the last one stored when Last says so);
// the blocks run in Repeat's own loops.
template <std::size_t K, std::size_t N, class B, last_run Last>
struct CheckpointSequential<K, Repeat<N, B>, Last> : wraps<Repeat<N, B>> {
  static_assert(too_many_segments<K, N>::ok);
  // The same policy around other children (what graph rewrites such as RecomputeAttention use).
  template <class... C>
  using rebuild = CheckpointSequential<K, C..., Last>;

  // The runs of blocks, each keeping only its input (a stored last one what its backward needs).
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return Repeat<N, B>::forward(s, p, std::move(x));
    for (std::size_t j = 0; j < checkpointed; ++j)
      x = detail::checkpoint_forward(s, std::move(x), [&](typename St::act_type in) {
        return detail::forward_blocks<B>(s, p, std::move(in), first(j), first(j + 1));
      });
    if (checkpointed < K) x = detail::forward_blocks<B>(s, p, std::move(x), first(K - 1), N);
    return x;
  }

  // The runs' backwards, last first, each recomputing its blocks' forwards first (but a stored
  // last one).
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    if (checkpointed < K) dy = detail::backward_blocks<B>(s, p, g, std::move(dy), first(K - 1), N);
    for (std::size_t j = checkpointed; j-- > 0;) {
      detail::checkpoint_recompute(s, [&](typename St::act_type in) {
        return detail::forward_blocks<B>(s, p, std::move(in), first(j), first(j + 1));
      });
      s.count_recomputed(first(j + 1) - first(j));
      dy = detail::backward_blocks<B>(s, p, g, std::move(dy), first(j), first(j + 1));
    }
    return dy;
  }

 private:
  static constexpr std::size_t checkpointed = Last == last_run::stored ? K - 1 : K;  // runs that run again
  static constexpr std::size_t first(std::size_t j) { return detail::run_begin(Last, N, K, j); }
};

}  // namespace REMAT_NAMESPACE
