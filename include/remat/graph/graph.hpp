// Composition: Seq<L...> (a flat type list, folded, never nested), Residual<S> (y = x + S(x)) and
// Repeat<N, Block> (one block type, N parameter sets, run in a loop: no N-deep instantiation).
// Widths are checked at compile time; a mismatch names both neighbours and both widths.
#pragma once

#include "../layers/common.hpp"
#include "../layers/embedding.hpp"
#include "../layers/linear.hpp"
#include "../layers/pointwise.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <utility>

namespace REMAT_NAMESPACE {

// Fails to compile with both layers and both widths in the instantiation that the compiler prints.
template <class Left, std::size_t LeftOut, class Right, std::size_t RightIn>
struct width_mismatch {
  static_assert(LeftOut == RightIn,
                "remat: width mismatch between neighbouring layers: the output width of the first layer named in "
                "width_mismatch<First, its output width, Second, its input width> differs from the second's input");
  static constexpr bool ok = LeftOut == RightIn;
};

template <class Block, std::size_t In, std::size_t Out>
struct residual_width_mismatch {
  static_assert(In == Out, "remat::Residual<S>: S must keep the width (in residual_width_mismatch<S, in, out>)");
  static constexpr bool ok = In == Out;
};

namespace detail {

template <class... L>
struct seq_widths {
  static constexpr std::size_t n = sizeof...(L);
  static constexpr std::array<std::size_t, n> ins{L::in_width...};
  static constexpr std::array<std::size_t, n> outs{L::out_width...};

  // For each layer: the index of the nearest earlier layer that fixed the width (n if none).
  static constexpr std::array<std::size_t, n> setter = [] {
    std::array<std::size_t, n> s{};
    std::size_t last = n;
    for (std::size_t i = 0; i < n; ++i) {
      s[i] = last;
      if (outs[i] != any_width) last = i;
    }
    return s;
  }();
  static constexpr std::size_t in_width = [] {
    for (std::size_t i = 0; i < n; ++i) {
      if (ins[i] != any_width) return ins[i];
      if (outs[i] != any_width) return any_width;
    }
    return any_width;
  }();
  static constexpr std::size_t out_width = [] {
    for (std::size_t i = n; i-- > 0;)
      if (outs[i] != any_width) return outs[i];
    return in_width;
  }();
};

template <std::size_t I, class... L>
using nth = std::tuple_element_t<I, std::tuple<L...>>;

// Checks layer I against the layer that set its input width; instantiates width_mismatch (and so
// fails, naming both) when they disagree.
template <std::size_t I, class... L>
constexpr bool check_neighbour() {
  using W = seq_widths<L...>;
  constexpr std::size_t j = W::setter[I];
  if constexpr (j != W::n && W::ins[I] != any_width) {
    return width_mismatch<nth<j, L...>, W::outs[j], nth<I, L...>, W::ins[I]>::ok;
  } else {
    return true;
  }
}

template <class... L, std::size_t... I>
constexpr bool check_all(std::index_sequence<I...>) {
  return (check_neighbour<I, L...>() && ...);
}

template <class... L>
constexpr std::array<std::size_t, sizeof...(L) + 1> param_offsets() {
  std::array<std::size_t, sizeof...(L)> counts{L::param_count...};
  std::array<std::size_t, sizeof...(L) + 1> off{};
  for (std::size_t i = 0; i < sizeof...(L); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

template <class L>
inline constexpr bool is_linear_v = false;
template <std::size_t In, std::size_t Out, bool B>
inline constexpr bool is_linear_v<Linear<In, Out, B>> = true;

// A name for each parameter tensor, PyTorch-style: "0.weight", "2.1.0.bias".
template <class L, class F>
void visit_params(std::string const& prefix, std::size_t offset, F&& f) {
  if constexpr (requires { L::template visit<F>; })
    L::visit(prefix, offset, f);
  else
    for (param_desc const& p : L::params()) f(prefix + p.name, offset + p.offset, p.shape);
}

// The first layer that a model's input reaches, through any nesting.
template <class L>
struct first_layer {
  using type = L;
};
template <class L>
  requires requires { typename L::first; }
struct first_layer<L> {
  using type = typename first_layer<typename L::first>::type;
};

}  // namespace detail

// Whether a graph reads token ids (its first layer is an Embedding) rather than features.
template <class Net>
inline constexpr bool reads_ids_v = is_embedding_v<typename detail::first_layer<Net>::type>;

template <class... L>
struct Seq {
  static_assert(sizeof...(L) > 0, "remat::Seq<>: a sequence needs at least one layer");
  using widths = detail::seq_widths<L...>;
  static constexpr bool widths_ok = detail::check_all<L...>(std::index_sequence_for<L...>{});
  static_assert(widths_ok, "remat::Seq: layer widths do not match (see width_mismatch above)");
  static constexpr std::size_t in_width = widths::in_width;
  static constexpr std::size_t out_width = widths::out_width;
  static constexpr std::array<std::size_t, sizeof...(L) + 1> offsets = detail::param_offsets<L...>();
  static constexpr std::size_t param_count = offsets[sizeof...(L)];
  static constexpr std::size_t size = sizeof...(L);
  using first = detail::nth<0, L...>;
  static constexpr bool handles_hollow = true;

  template <class F>
  static void visit(std::string const& prefix, std::size_t offset, F& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (detail::visit_params<detail::nth<I, L...>>(prefix + std::to_string(I) + ".", offset + offsets[I], f), ...);
    }(std::index_sequence_for<L...>{});
  }

  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (detail::nth<I, L...>::init(p + offsets[I], global_offset + offsets[I], seed), ...);
    }(std::index_sequence_for<L...>{});
  }

  // Layer I is run together with layer I + 1 when it is a Linear followed by a point-wise layer.
  template <std::size_t I>
  static constexpr bool fused_with_next() {
    if constexpr (I + 1 < sizeof...(L))
      return detail::is_linear_v<detail::nth<I, L...>> && is_pointwise_v<detail::nth<I + 1, L...>>;
    else
      return false;
  }
  template <std::size_t I>
  static constexpr bool fused_with_previous() {
    if constexpr (I > 0)
      return fused_with_next<I - 1>();
    else
      return false;
  }

  template <std::size_t I, class S>
  static constexpr void forward_one(S& s, typename S::param_ptr p, typename S::act_type& x) {
    using Layer = detail::nth<I, L...>;
    if constexpr (!handles_hollow_v<Layer>) s.need_input();
    if constexpr (is_embedding_v<Layer>) static_assert(I == 0, "remat::Embedding must be the first layer of the model");
    if constexpr (fused_with_previous<I>()) {
      // ran with the Linear before it
    } else if constexpr (fused_with_next<I>()) {
      x = Layer::template forward<typename detail::nth<I + 1, L...>::function>(s, p + offsets[I], std::move(x));
    } else {
      x = Layer::forward(s, p + offsets[I], std::move(x));
    }
  }

  template <std::size_t I, class S>
  static constexpr void backward_one(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                     typename S::act_type& dy) {
    using Layer = detail::nth<I, L...>;
    if constexpr (fused_with_previous<I>()) {
    } else if constexpr (fused_with_next<I>()) {
      dy = Layer::template backward<typename detail::nth<I + 1, L...>::function>(s, p + offsets[I], g + offsets[I],
                                                                                 std::move(dy));
    } else {
      dy = Layer::backward(s, p + offsets[I], g + offsets[I], std::move(dy));
    }
    if constexpr (Layer::param_count > 0) s.grads_ready(g + offsets[I]);
  }

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (forward_one<I>(s, p, x), ...); }(std::index_sequence_for<L...>{});
    return x;
  }

  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_one<sizeof...(L) - 1 - I>(s, p, g, dy), ...);
    }(std::index_sequence_for<L...>{});
    return dy;
  }
};

template <class S>
struct Residual {
  using first = S;
  static constexpr bool handles_hollow = true;
  static constexpr bool widths_ok = residual_width_mismatch<S, S::in_width, S::out_width>::ok;
  static_assert(widths_ok, "remat::Residual: see residual_width_mismatch above");
  static constexpr std::size_t in_width = S::in_width;
  static constexpr std::size_t out_width = S::in_width;
  static constexpr std::size_t param_count = S::param_count;

  template <class F>
  static void visit(std::string const& prefix, std::size_t offset, F& f) {
    detail::visit_params<S>(prefix, offset, f);
  }
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    S::init(p, global_offset, seed);
  }

  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    typename St::act_type y = S::forward(s, p, x);
    if (St::is_hollow(y)) return y;  // a selective recomputation that needs no values past here
    if (y == x || y.use_count() > 1) {  // S was the identity, or its output is kept: add out of place
      typename St::act_type sum = s.make(x->rows(), x->cols());
      if constexpr (St::computes) evaluate(*sum, *y + *x);
      return sum;
    }
    if constexpr (St::computes) evaluate(*y, *y + *x);
    return y;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    typename St::act_type dx = S::backward(s, p, g, dy);  // dy stays shared here, so S does not overwrite it
    if (dx == dy) {
      dx = s.make(dy->rows(), dy->cols());
      if constexpr (St::computes) evaluate(*dx, *dy + *dy);
    } else {
      if constexpr (St::computes) evaluate(*dx, *dx + *dy);
    }
    return dx;
  }
};

template <std::size_t N, class Block>
struct Repeat {
  static_assert(N >= 1, "remat::Repeat<N, Block>: N must be at least 1");
  static_assert(Block::in_width == Block::out_width || Block::out_width == any_width,
                "remat::Repeat<N, Block>: the block must keep its width to be chained");
  static constexpr std::size_t count = N;
  using block = Block;
  using first = Block;
  static constexpr bool handles_hollow = true;
  static constexpr std::size_t in_width = Block::in_width;
  static constexpr std::size_t out_width = Block::out_width;
  static constexpr std::size_t param_count = N * Block::param_count;

  template <class F>
  static void visit(std::string const& prefix, std::size_t offset, F& f) {
    for (std::size_t k = 0; k < N; ++k)
      detail::visit_params<Block>(prefix + std::to_string(k) + ".", offset + k * Block::param_count, f);
  }
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    for (std::size_t k = 0; k < N; ++k)
      Block::init(p + k * Block::param_count, global_offset + k * Block::param_count, seed);
  }

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    for (std::size_t k = 0; k < N; ++k) {
      if constexpr (!handles_hollow_v<Block>) s.need_input();
      x = Block::forward(s, p + k * Block::param_count, std::move(x));
    }
    return x;
  }
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    for (std::size_t k = N; k-- > 0;) {
      dy = Block::backward(s, p + k * Block::param_count, g + k * Block::param_count, std::move(dy));
      if constexpr (Block::param_count > 0) s.grads_ready(g + k * Block::param_count);
    }
    return dy;
  }
};

namespace detail {

// The segments directly inside a composite (a Seq's layers, a Residual's or a policy's segment, a
// Repeat's block); none for a layer.
template <class L>
struct children {
  using type = std::tuple<>;
};
template <class... L>
struct children<Seq<L...>> {
  using type = std::tuple<L...>;
};
template <class S>
struct children<Residual<S>> {
  using type = std::tuple<S>;
};
template <std::size_t N, class B>
struct children<Repeat<N, B>> {
  using type = std::tuple<B>;
};
template <class L>
  requires requires { typename L::segment; }
struct children<L> {
  using type = std::tuple<typename L::segment>;
};

// Whether any layer of L reads rows as positions of sequences (attention, positions).
template <class L>
constexpr bool uses_sequences() {
  if constexpr (requires { requires L::sequence_layer; })
    return true;
  else
    return []<class... C>(std::tuple<C...>*) { return (uses_sequences<C>() || ... || false); }(
        static_cast<typename children<L>::type*>(nullptr));
}

// The longest sequence every layer of L accepts (a positional table's length), or SIZE_MAX.
template <class L>
constexpr std::size_t max_sequence() {
  std::size_t m = std::size_t(-1);
  if constexpr (requires { L::max_sequence; }) m = L::max_sequence;
  std::size_t const inner = []<class... C>(std::tuple<C...>*) {
    std::size_t r = std::size_t(-1);
    ((r = std::min(r, max_sequence<C>())), ...);
    return r;
  }(static_cast<typename children<L>::type*>(nullptr));
  return std::min(m, inner);
}

}  // namespace detail

// Whether a graph is a sequence model: its rows are positions of sequences of a length fixed per
// pass (token ids batch x seq; see model).
template <class Net>
inline constexpr bool is_sequence_model_v = detail::uses_sequences<Net>();

}  // namespace REMAT_NAMESPACE
