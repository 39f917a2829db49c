// Compile-time reverse mode. grad(e, x, seed) walks e's type from the root, multiplying the seed
// by each node's local derivative on the way to every occurrence of the variable x, and returns
// the sum as a new expression, which evaluates in one fused pass like any other. Local
// derivatives are themselves expressions of the node's operand, so nothing is written by hand
// for composites such as gelu or silu.
#pragma once

#include "ops.hpp"

namespace REMAT_NAMESPACE {
namespace expr {

// d op(a) / da for each unary op, as an expression of a (one overload per op).

// d e^a / da = e^a.
template <class A> auto derivative(exp_op, A const& a) { return make_unary(exp_op{}, a); }
// d ln a / da = 1 / a.
template <class A> auto derivative(log_op, A const& a) { return div(one_t{}, a); }
// d sqrt a / da = 0.5 / sqrt a.
template <class A> auto derivative(sqrt_op, A const& a) { return div(constant{{}, 0.5}, make_unary(sqrt_op{}, a)); }
// d a^-1/2 / da = -0.5 a^-1/2 / a.
template <class A> auto derivative(rsqrt_op, A const& a) {
  return mul(constant{{}, -0.5}, div(make_unary(rsqrt_op{}, a), a));
}
// d tanh a / da = 1 - tanh^2 a.
template <class A> auto derivative(tanh_op, A const& a) {
  auto t = make_unary(tanh_op{}, a);
  return sub(one_t{}, mul(t, t));
}
// d sigmoid a / da = sigmoid a (1 - sigmoid a).
template <class A> auto derivative(sigmoid_op, A const& a) {
  auto s = make_unary(sigmoid_op{}, a);
  return mul(s, sub(one_t{}, s));
}
// d erf a / da = 2 / sqrt(pi) e^(-a^2).
template <class A> auto derivative(erf_op, A const& a) {
  return mul(constant{{}, two_sqrtpi}, make_unary(exp_op{}, neg(mul(a, a))));
}
// d gelu a / da = Phi(a) + a phi(a), one op.
template <class A> auto derivative(gelu_op, A const& a) { return make_unary(gelu_grad_op{}, a); }
// d (Phi(a) + a phi(a)) / da = phi(a) (2 - a^2).
template <class A> auto derivative(gelu_grad_op, A const& a) {
  return mul(make_unary(normal_pdf_op{}, a), sub(constant{{}, 2.0}, mul(a, a)));
}
// d phi(a) / da = -a phi(a).
template <class A> auto derivative(normal_pdf_op, A const& a) { return neg(mul(a, make_unary(normal_pdf_op{}, a))); }
// d |a| / da = sign a (0 at 0).
template <class A> auto derivative(abs_op, A const& a) { return make_unary(sign_op{}, a); }
// d relu a / da = [a > 0].
template <class A> auto derivative(relu_op, A const& a) { return make_unary(step_op{}, a); }
// d max(a, c) / da = [a >= c].
template <class A> auto derivative(max_op op, A const& a) { return make_unary(ge_op{op.c}, a); }
// d min(a, c) / da = [a <= c].
template <class A> auto derivative(min_op op, A const& a) { return make_unary(le_op{op.c}, a); }
// d a^p / da = p a^(p-1).
template <class A> auto derivative(pow_op op, A const& a) {
  return mul(constant{{}, op.p}, make_unary(pow_op{op.p - 1.0}, a));
}
// Piecewise-constant ops (sign, step, [a >= c], [a <= c]) have derivative 0 (almost everywhere).
template <class A> auto derivative(sign_op, A const&) { return zero_t{}; }
// (0: step is piecewise constant)
template <class A> auto derivative(step_op, A const&) { return zero_t{}; }
// (0: [a >= c] is piecewise constant)
template <class A> auto derivative(ge_op, A const&) { return zero_t{}; }
// (0: [a <= c] is piecewise constant)
template <class A> auto derivative(le_op, A const&) { return zero_t{}; }

// Whether E is a unary node.
template <class E>
inline constexpr bool is_unary_v = false;
// (a unary node)
template <class Op, class A>
inline constexpr bool is_unary_v<unary<Op, A>> = true;

// Whether E is a binary node of Op.
template <class E, class Op>
inline constexpr bool is_binary_v = false;
// (a binary node of Op)
template <class Op, class A, class B>
inline constexpr bool is_binary_v<binary<Op, A, B>, Op> = true;

// The adjoint of variable Id in e, given the adjoint `s` of e itself.
template <int Id, expression E, expression S>
auto backprop(E const& e, S const& s) {
  if constexpr (!contains_v<E, Id>)
    return zero_t{};
  else if constexpr (is_terminal_v<E>)
    return s;
  else if constexpr (is_unary_v<E>) {
    if constexpr (std::is_same_v<std::remove_cv_t<decltype(e.op)>, neg_op>)
      return backprop<Id>(e.a, neg(s));
    else
      return backprop<Id>(e.a, mul(s, derivative(e.op, e.a)));
  } else if constexpr (is_binary_v<E, add_op>)
    return add(backprop<Id>(e.a, s), backprop<Id>(e.b, s));
  else if constexpr (is_binary_v<E, sub_op>)
    return add(backprop<Id>(e.a, s), backprop<Id>(e.b, neg(s)));
  else if constexpr (is_binary_v<E, mul_op>)
    return add(backprop<Id>(e.a, mul(s, e.b)), backprop<Id>(e.b, mul(s, e.a)));
  else {
    static_assert(is_binary_v<E, div_op>, "remat::grad: no derivative rule for this expression node");
    // d(a/b)/db = -(a/b)/b
    return add(backprop<Id>(e.a, div(s, e.b)), backprop<Id>(e.b, neg(div(mul(s, e), e.b))));
  }
}

// d e / d x, element by element, as an expression.
template <expression E, expression X>
auto grad(E const& e, X const&) {
  static_assert(X::id != no_id, "remat::grad: differentiate with respect to a variable made by remat::leaf<Id>(tensor)");
  return backprop<X::id>(e, one_t{});
}

// seed * d e / d x: the backward pass of y = e given dL/dy = seed.
template <expression E, expression X, class S>
  requires operand<S>
auto grad(E const& e, X const&, S const& seed) {
  static_assert(X::id != no_id, "remat::grad: differentiate with respect to a variable made by remat::leaf<Id>(tensor)");
  return backprop<X::id>(e, to_expr(seed));
}

}  // namespace expr
}  // namespace REMAT_NAMESPACE
