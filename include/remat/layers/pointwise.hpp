// Pointwise<F>: y = F(x) element by element, where F::apply builds an expression; the backward
// dy * F'(x) is derived from it at compile time. A new activation is a few lines:
//
//   struct my_act { template <class X> static auto apply(X x) { return x * tanh(x); } };
//   using MyAct = remat::Pointwise<my_act>;
//
// Backward reads x, kept by forward; or y when F says its derivative reads the same there
// (derivative_from_output: ReLU), which saves a tensor where the next layer keeps y anyway.
#pragma once

#include "../kernels/evaluate.hpp"
#include "layer.hpp"

namespace REMAT_NAMESPACE {

template <class F>
struct Pointwise : detail::no_parameters {
  using pointwise_function = F;  // a fusing layer before it (Linear) may apply F in its own pass
  // F declares `static constexpr bool derivative_from_output = true` when F'(F(x)) = F'(x).
  static constexpr bool derivative_from_output = requires { requires F::derivative_from_output; };
  static constexpr std::size_t in_width = any_width;   // any width: it takes its input's
  static constexpr std::size_t out_width = any_width;  // its input's width

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

  // dx = F'(x) * dy, F' derived from F::apply at compile time (from y when F says so).
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
// max(x, 0).
struct relu {
  static constexpr bool derivative_from_output = true;  // relu'(relu(x)) = relu'(x) = [x > 0]
  // The expression of F(x).
  template <class X> static auto apply(X x) { return remat::relu(x); }
};
// x * Phi(x), with the error function (PyTorch's GELU, approximate='none').
struct gelu {
  // The expression of F(x).
  template <class X> static auto apply(X x) { return remat::gelu(x); }
};
// GELU's tanh approximation (approximate='tanh', GPT-2's).
struct gelu_tanh {
  // The expression of F(x).
  template <class X> static auto apply(X x) { return remat::gelu_tanh(x); }
};
// x * sigmoid(x) (SiLU, swish).
struct silu {
  // The expression of F(x).
  template <class X> static auto apply(X x) { return remat::silu(x); }
};
// tanh(x).
struct tanh {
  // The expression of F(x).
  template <class X> static auto apply(X x) { return remat::tanh(x); }
};
// 1 / (1 + exp(-x)).
struct sigmoid {
  // The expression of F(x).
  template <class X> static auto apply(X x) { return remat::sigmoid(x); }
};
}  // namespace fn

using ReLU = Pointwise<fn::relu>;            // torch.nn.ReLU
using GELU = Pointwise<fn::gelu>;            // torch.nn.GELU()
using GELUTanh = Pointwise<fn::gelu_tanh>;   // torch.nn.GELU(approximate='tanh')
using SiLU = Pointwise<fn::silu>;            // torch.nn.SiLU
using Tanh = Pointwise<fn::tanh>;            // torch.nn.Tanh
using Sigmoid = Pointwise<fn::sigmoid>;      // torch.nn.Sigmoid

}  // namespace REMAT_NAMESPACE
