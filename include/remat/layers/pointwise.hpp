// Pointwise<F>: y = F(x) element by element, where F::apply builds an expression; the backward
// dy * F'(x) is derived from it at compile time. A new activation is a few lines:
//
//   struct my_act { template <class X> static auto apply(X x) { return x * tanh(x); } };
//   using MyAct = remat::Pointwise<my_act>;
//
// Backward reads x, kept by forward; or y when F says its derivative reads the same there
// (derivative_from_output: ReLU), which saves a tensor where the next layer keeps y anyway.
#pragma once

#include "../expr/expr.hpp"
#include "layer.hpp"

namespace REMAT_NAMESPACE {

template <class F>
struct Pointwise {
  using pointwise_function = F;
  // F declares `static constexpr bool derivative_from_output = true` when F'(F(x)) = F'(x).
  static constexpr bool derivative_from_output = requires { requires F::derivative_from_output; };  // a fusing layer before it (Linear) may apply F in its own pass
  static constexpr std::size_t in_width = any_width;
  static constexpr std::size_t out_width = any_width;
  static constexpr std::size_t param_count = 0;

  static std::vector<param_desc> params() { return {}; }
  template <class T>
  static void init(T*, std::size_t, std::uint64_t) {}

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    // In inference nobody needs x afterwards, so F runs in place when x is ours alone.
    // (No conditional operator on handles here: GCC 12 miscounts them in constant evaluation.)
    typename S::act_type y;
    if (!s.training() && x.use_count() == 1)
      y = x;
    else
      y = s.make(x->rows(), x->cols());
    if constexpr (S::computes) evaluate(*y, F::apply(to_expr(*x)));
    // A function whose derivative reads the same at its output (ReLU: y > 0 exactly where x > 0)
    // keeps y, which the next layer usually keeps too (a convolution's or product's input), so
    // the pair holds one tensor where it would hold two.
    if constexpr (derivative_from_output)
      s.save(y);
    else
      s.save(std::move(x));
    return y;
  }

  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    typename S::act_type x = s.restore();
    typename S::act_type dx = s.reuse_or_make(dy, dy->cols());
    if constexpr (S::computes) {
      auto X = leaf<0>(*x);
      evaluate(*dx, grad(F::apply(X), X, *dy));
    }
    return dx;
  }
};

namespace fn {
struct relu {
  static constexpr bool derivative_from_output = true;  // relu'(relu(x)) = relu'(x) = [x > 0]
  template <class X> static auto apply(X x) { return remat::relu(x); }
};
struct gelu {
  template <class X> static auto apply(X x) { return remat::gelu(x); }
};
struct gelu_tanh {
  template <class X> static auto apply(X x) { return remat::gelu_tanh(x); }
};
struct silu {
  template <class X> static auto apply(X x) { return remat::silu(x); }
};
struct tanh {
  template <class X> static auto apply(X x) { return remat::tanh(x); }
};
struct sigmoid {
  template <class X> static auto apply(X x) { return remat::sigmoid(x); }
};
}  // namespace fn

using ReLU = Pointwise<fn::relu>;
using GELU = Pointwise<fn::gelu>;
using GELUTanh = Pointwise<fn::gelu_tanh>;
using SiLU = Pointwise<fn::silu>;
using Tanh = Pointwise<fn::tanh>;
using Sigmoid = Pointwise<fn::sigmoid>;

}  // namespace REMAT_NAMESPACE
