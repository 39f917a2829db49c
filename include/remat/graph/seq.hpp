// Seq<L...>: layers one after another, a flat type list folded with fold expressions (never
// nested, so a deep model stays shallow for the compiler). Widths are checked at compile time; a
// mismatch names both neighbours and both widths. A layer that fuses an epilogue followed by a
// point-wise layer runs the pair as one (Linear then GELU: the activation in the product's pass).
#pragma once

#include "walk.hpp"

#include <array>
#include <cstddef>
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
  static constexpr bool ok = LeftOut == RightIn;  // whether the widths agree (when it compiles, they do)
};

// Fails to compile with both layers and both images (channels, height, width) in the
// instantiation the compiler prints: neighbouring image layers whose widths agree but whose
// images do not (16 channels of 32 x 32 into 64 channels of 16 x 16).
template <class Left, std::size_t LeftChannels, std::size_t LeftHeight, std::size_t LeftWidth, class Right,
          std::size_t RightChannels, std::size_t RightHeight, std::size_t RightWidth>
struct image_mismatch {
  // Whether the images agree (when it compiles, they do).
  static constexpr bool ok = LeftChannels == RightChannels && LeftHeight == RightHeight && LeftWidth == RightWidth;
  static_assert(ok,
                "remat: image mismatch between neighbouring layers: the first layer named in image_mismatch<First, "
                "its output channels, height, width, Second, its input channels, height, width> writes images the "
                "second does not read");
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
    if constexpr (W::outs[j] != W::ins[I]) {
      return width_mismatch<nth<j, L...>, W::outs[j], nth<I, L...>, W::ins[I]>::ok;
    } else {
      constexpr image_shape a = image_out_v<nth<j, L...>>, b = image_in_v<nth<I, L...>>;
      if constexpr (a.known() && b.known())
        return image_mismatch<nth<j, L...>, a.channels, a.height, a.width, nth<I, L...>, b.channels, b.height,
                              b.width>::ok;
      else
        return true;
    }
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

}  // namespace detail

template <class... L>
struct Seq {
  static_assert(sizeof...(L) > 0, "remat::Seq<>: a sequence needs at least one layer");
  static_assert((layer_contract<L>::ok && ...), "remat::Seq: every element must be a layer (see layer_contract above)");
  // Its layers, in order (what walks over the graph visit).
  using children = type_list<L...>;
  // The same container around other layers (what a policy that rewrites the graph builds).
  template <class... C>
  using rebuild = Seq<C...>;
  // The widths of the chain (where any_width layers take their neighbour's).
  using widths = detail::seq_widths<L...>;
  // Whether each layer's output width is the next one's input width.
  static constexpr bool widths_ok = detail::check_all<L...>(std::index_sequence_for<L...>{});
  static_assert(widths_ok, "remat::Seq: layer widths do not match (see width_mismatch above)");
  // The first layer's input width.
  static constexpr std::size_t in_width = widths::in_width;
  // The last layer's output width (or the last fixed one before it).
  static constexpr std::size_t out_width = widths::out_width;
  // Where each layer's parameters start in the chain's, and their total.
  static constexpr std::array<std::size_t, sizeof...(L) + 1> offsets = detail::param_offsets<L...>();
  // All its layers' parameters.
  static constexpr std::size_t param_count = offsets[sizeof...(L)];
  // The number of layers.
  static constexpr std::size_t size = sizeof...(L);
  // (Each layer that cannot take a hollow input asks for its input itself.)
  static constexpr bool handles_hollow = true;

  // Calls f on each parameter tensor with PyTorch-style names ("2.weight"), layer by layer.
  template <class F>
  static void visit(std::string const& prefix, std::size_t offset, F& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (detail::visit_params<detail::nth<I, L...>>(prefix + std::to_string(I) + ".", offset + offsets[I], f), ...);
    }(std::index_sequence_for<L...>{});
  }

  // Initialises each layer's parameters (as a function of the seed and the global offset).
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (detail::nth<I, L...>::init(p + offsets[I], global_offset + offsets[I], seed), ...);
    }(std::index_sequence_for<L...>{});
  }

  // Layer I is run together with layer I + 1 when it fuses an epilogue and that one is point-wise.
  template <std::size_t I>
  static constexpr bool fused_with_next() {
    if constexpr (I + 1 < sizeof...(L))
      return fuses_epilogue_v<detail::nth<I, L...>> && is_pointwise_v<detail::nth<I + 1, L...>>;
    else
      return false;
  }
  // Whether layer I ran within layer I - 1's pass (a point-wise layer after a fusing one).
  template <std::size_t I>
  static constexpr bool fused_with_previous() {
    if constexpr (I > 0)
      return fused_with_next<I - 1>();
    else
      return false;
  }

  // The last layer that is not an identity (Dropout<0>): the one whose output leaves the chain.
  static constexpr std::size_t last_computing() {
    constexpr bool identity[] = {is_identity_v<L>...};
    std::size_t i = sizeof...(L) - 1;
    while (i > 0 && identity[i]) --i;
    return i;
  }
  // Whether a Residual around this chain adds its shortcut in the last layer's output pass.
  static constexpr bool residual_in_last() {
    constexpr std::size_t k = last_computing();
    if constexpr (fused_with_previous<k>())
      return false;
    else
      return adds_residual_v<detail::nth<k, L...>>;
  }
  // Whether a Residual around this chain adds the shortcut's gradient in the first layer's dx pass.
  static constexpr bool residual_gradient_in_first() {
    return !fused_with_next<0>() && adds_residual_gradient_v<detail::nth<0, L...>>;
  }

  // Layer I's forward; with a residual r, layer last_computing() adds it in its output pass.
  template <std::size_t I, class S>
  static constexpr void forward_one(S& s, typename S::param_ptr p, typename S::act_type& x,
                                    typename S::act_type const* r = nullptr) {
    using Layer = detail::nth<I, L...>;
    static_assert(layer_pass_contract<Layer, S>::ok);
    if constexpr (!handles_hollow_v<Layer>) s.need_input();
    if constexpr (layer_reads_ids_v<Layer>)
      static_assert(I == 0, "remat: a layer that reads token ids (an Embedding) must be the first layer of the model");
    auto const frame = detail::trace_layer<Layer>(s, I, false);
    auto const gathered = detail::gather_frame<Layer>(s, p + offsets[I]);
    if constexpr (fused_with_previous<I>()) {
      // ran with the layer before it
    } else if constexpr (residual_in_last() && I == last_computing()) {
      if (r)
        x = Layer::forward_onto(s, gathered.at(p + offsets[I]), std::move(x), *r);
      else
        x = Layer::forward(s, gathered.at(p + offsets[I]), std::move(x));
    } else if constexpr (fused_with_next<I>()) {
      using F = typename detail::nth<I + 1, L...>::pointwise_function;
      x = Layer::template forward<F>(s, gathered.at(p + offsets[I]), std::move(x));
    } else {
      x = Layer::forward(s, gathered.at(p + offsets[I]), std::move(x));
    }
  }

  // Layer I's backward (nothing when it ran fused with the layer before it); with a residual
  // gradient r, layer 0 adds it in its dx pass.
  template <std::size_t I, class S>
  static constexpr void backward_one(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                     typename S::act_type& dy, typename S::act_type const* r = nullptr) {
    using Layer = detail::nth<I, L...>;
    auto const frame = detail::trace_layer<Layer>(s, I, true);
    auto const gathered = detail::gather_frame<Layer>(s, p + offsets[I]);
    if constexpr (fused_with_previous<I>()) {
    } else if constexpr (residual_gradient_in_first() && I == 0) {
      if (r)
        dy = Layer::backward_onto(s, gathered.at(p + offsets[I]), g + offsets[I], std::move(dy), *r);
      else
        dy = Layer::backward(s, gathered.at(p + offsets[I]), g + offsets[I], std::move(dy));
    } else if constexpr (fused_with_next<I>()) {
      using F = typename detail::nth<I + 1, L...>::pointwise_function;
      dy = Layer::template backward<F>(s, gathered.at(p + offsets[I]), g + offsets[I], std::move(dy));
    } else {
      dy = Layer::backward(s, gathered.at(p + offsets[I]), g + offsets[I], std::move(dy));
    }
    if constexpr (Layer::param_count > 0) s.grads_ready(g + offsets[I]);
  }

  // Runs the layers' forwards in order.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (forward_one<I>(s, p, x), ...); }(std::index_sequence_for<L...>{});
    return x;
  }

  // forward, with layer last_computing() adding r to its output (Residual, when residual_in_last()).
  template <class S>
  static constexpr typename S::act_type forward_onto(S& s, typename S::param_ptr p, typename S::act_type x,
                                                     typename S::act_type const& r) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (forward_one<I>(s, p, x, &r), ...);
    }(std::index_sequence_for<L...>{});
    return x;
  }

  // backward, with layer 0 adding r to its input's gradient (Residual, when residual_gradient_in_first()).
  template <class S>
  static constexpr typename S::act_type backward_onto(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                      typename S::act_type dy, typename S::act_type const& r) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_one<sizeof...(L) - 1 - I>(s, p, g, dy, &r), ...);
    }(std::index_sequence_for<L...>{});
    return dy;
  }

  // Runs the layers' backwards in reverse order, each with its part of the parameters and gradients.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_one<sizeof...(L) - 1 - I>(s, p, g, dy), ...);
    }(std::index_sequence_for<L...>{});
    return dy;
  }
};

}  // namespace REMAT_NAMESPACE
