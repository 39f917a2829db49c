// The point-wise operations: op functors, the builders that simplify 0 and 1 away, the operators,
// and the named functions (exp, tanh, relu, gelu, silu, ...). Composite functions such as gelu are
// written as expressions of primitives, so their derivatives come from the primitives' rules.
#pragma once

#include "../numeric/math.hpp"
#include "node.hpp"

#include <type_traits>

namespace REMAT_NAMESPACE {
namespace expr {

// ---------------------------------------------------------------- operands
template <class T>
concept tensor_like = !expression<T> && requires(std::remove_cvref_t<T> const& t) {
  typename std::remove_cvref_t<T>::device_type;
  typename std::remove_cvref_t<T>::value_type;
  t.data();
  t.size();
  t.cols();
};

template <class T>
concept scalar_like = std::is_arithmetic_v<std::remove_cvref_t<T>>;

template <class T>
concept operand = expression<T> || tensor_like<T> || scalar_like<T>;

template <class A, class B>
concept operands = operand<A> && operand<B> && !(scalar_like<A> && scalar_like<B>);

// A tensor or view as a constant (non-variable) terminal.
template <class X>
auto to_expr(X const& x) {
  if constexpr (expression<X>)
    return x;
  else if constexpr (scalar_like<X>)
    return constant{{}, static_cast<double>(x)};
  else {
    using T = typename X::value_type;
    using D = typename X::device_type;
    return ref<T, D, no_id>{{}, x.data(), x.size(), x.cols()};
  }
}

// A tensor or view as the variable Id: grad(e, leaf<Id>(x)) differentiates with respect to it.
template <int Id, tensor_like X>
auto leaf(X const& x) {
  static_assert(Id >= 0, "remat::leaf<Id>: variable ids are non-negative");
  using T = typename X::value_type;
  using D = typename X::device_type;
  return ref<T, D, Id>{{}, x.data(), x.size(), x.cols()};
}

// A row vector (width elements) repeated over `rows` rows, e.g. a bias; variable Id or no_id.
template <int Id = no_id, tensor_like X>
auto broadcast_rows(X const& v, std::size_t rows) {
  using T = typename X::value_type;
  using D = typename X::device_type;
  return row_broadcast<T, D, Id>{{}, v.data(), v.size(), v.size() * rows};
}

// The expression to_expr makes of an X (a tensor, a scalar or an expression).
template <class X>
using expr_t = decltype(to_expr(std::declval<X const&>()));

// ---------------------------------------------------------------- op functors
// (Each computes in the type V it is given: float, or double; see node.hpp.)

// a + b.
struct add_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V a, V b) const { return a + b; }  // a + b
};
// a - b.
struct sub_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V a, V b) const { return a - b; }  // a - b
};
// a * b.
struct mul_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V a, V b) const { return a * b; }  // a * b
};
// a / b.
struct div_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V a, V b) const { return a / b; }  // a / b
};
// -x.
struct neg_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return -x; }  // -x
};
// e^x (math::exp: the same bits on the host and the GPU).
struct exp_op {
  static constexpr std::size_t cost = 16;  // (a polynomial or a libm call: see op_cost)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::exp(x); }  // e^x
};
// The natural logarithm.
struct log_op {
  static constexpr std::size_t cost = 16;  // (a polynomial or a libm call: see op_cost)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::log(x); }  // ln x
};
// The square root.
struct sqrt_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::sqrt(x); }  // sqrt x
};
// 1 / sqrt(x).
struct rsqrt_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::rsqrt(x); }  // 1 / sqrt x
};
// The hyperbolic tangent.
struct tanh_op {
  static constexpr std::size_t cost = 24;  // (two polynomials and an exp: see op_cost)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::tanh(x); }  // tanh x
};
// The logistic function 1 / (1 + e^-x).
struct sigmoid_op {
  static constexpr std::size_t cost = 16;  // (a polynomial or a libm call: see op_cost)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return V(1) / (V(1) + math::exp(-x)); }  // sigmoid x
};
// The error function.
struct erf_op {
  static constexpr std::size_t cost = 32;  // (two polynomials and an exp: see op_cost)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::erf(x); }  // erf x
};
// GELU, x Phi(x) with Phi the standard normal distribution (PyTorch's approximate='none'), as one
// op: its derivative is an op of its own that shares Phi's exp with the density's, where the
// composite 0.5 x (1 + erf(x / sqrt 2)) would evaluate erf and then exp again.
struct gelu_op {
  static constexpr std::size_t cost = 24;  // (a rational function and an exp: see op_cost)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::gelu(x); }  // x Phi(x)
};
// GELU's derivative Phi(x) + x phi(x).
struct gelu_grad_op {
  static constexpr std::size_t cost = 24;  // (as gelu_op's)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::gelu_grad(x); }  // Phi(x) + x phi(x)
};
// The standard normal density phi(x) = e^(-x^2/2) / sqrt(2 pi).
struct normal_pdf_op {
  static constexpr std::size_t cost = 16;  // (an exp: see op_cost)
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::normal_pdf(x); }  // phi(x)
};
// |x|; its derivative is sign(x).
struct abs_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::abs(x); }  // |x|
};
// sign(x): -1, 0 or 1 (the derivative of abs, 0 at 0 as in PyTorch).
struct sign_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return V(x > V(0)) - V(x < V(0)); }  // sign x
};
// relu(x) = max(x, 0); its derivative is step(x) = [x > 0] (0 at the kink, as in PyTorch).
struct relu_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return x > V(0) ? x : V(0); }  // max(x, 0)
};
// step(x) = [x > 0]: relu's derivative.
struct step_op {
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return x > V(0) ? V(1) : V(0); }  // [x > 0]
};
// max(x, c) with a constant; its derivative is [x >= c] (PyTorch's clamp).
struct max_op {
  double c;  // the lower bound
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return x < V(c) ? V(c) : x; }  // max(x, c)
};
// min(x, c) with a constant; its derivative is [x <= c] (PyTorch's clamp).
struct min_op {
  double c;  // the upper bound
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return x > V(c) ? V(c) : x; }  // min(x, c)
};
// [x >= c]: max's derivative.
struct ge_op {
  double c;  // the bound
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return x >= V(c) ? V(1) : V(0); }  // [x >= c]
};
// [x <= c]: min's derivative.
struct le_op {
  double c;  // the bound
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return x <= V(c) ? V(1) : V(0); }  // [x <= c]
};
// pow(x, p) with a constant exponent.
struct pow_op {
  static constexpr std::size_t cost = 32;  // (a polynomial or a libm call: see op_cost)
  double p;  // the exponent
  template <class V> REMAT_HOST_DEVICE V operator()(V x) const { return math::pow(x, V(p)); }  // x^p
};

// ---------------------------------------------------------------- builders (simplifying)
// Whether E is a negation (neg of a negation gives back its operand).
template <class E>
inline constexpr bool is_neg_v = false;
// (a neg_op node is a negation)
template <class A>
inline constexpr bool is_neg_v<unary<neg_op, A>> = true;

// The node op(a).
template <class Op, expression A>
auto make_unary(Op op, A const& a) {
  return unary<Op, A>(op, a);
}

// a + b, with 0 + b = b and a + 0 = a.
template <expression A, expression B>
auto add(A const& a, B const& b) {
  if constexpr (std::is_same_v<A, zero_t>)
    return b;
  else if constexpr (std::is_same_v<B, zero_t>)
    return a;
  else
    return binary<add_op, A, B>(a, b);
}

// -a, with -0 = 0 and -(-a) = a.
template <expression A>
auto neg(A const& a) {
  if constexpr (std::is_same_v<A, zero_t>)
    return a;
  else if constexpr (is_neg_v<A>)
    return a.a;
  else
    return unary<neg_op, A>(neg_op{}, a);
}

// a - b, with a - 0 = a and 0 - b = -b.
template <expression A, expression B>
auto sub(A const& a, B const& b) {
  if constexpr (std::is_same_v<B, zero_t>)
    return a;
  else if constexpr (std::is_same_v<A, zero_t>)
    return neg(b);
  else
    return binary<sub_op, A, B>(a, b);
}

// a * b, with 0 * b = a * 0 = 0, 1 * b = b and a * 1 = a.
template <expression A, expression B>
auto mul(A const& a, B const& b) {
  if constexpr (std::is_same_v<A, zero_t> || std::is_same_v<B, zero_t>)
    return zero_t{};
  else if constexpr (std::is_same_v<A, one_t>)
    return b;
  else if constexpr (std::is_same_v<B, one_t>)
    return a;
  else
    return binary<mul_op, A, B>(a, b);
}

// a / b, with 0 / b = 0 and a / 1 = a.
template <expression A, expression B>
auto div(A const& a, B const& b) {
  if constexpr (std::is_same_v<A, zero_t>)
    return zero_t{};
  else if constexpr (std::is_same_v<B, one_t>)
    return a;
  else
    return binary<div_op, A, B>(a, b);
}

// ---------------------------------------------------------------- operators
// (Operands: expressions, tensors and views, and scalars, at least one of them not a scalar.)

// a + b, element by element.
template <class A, class B>
  requires operands<A, B>
auto operator+(A const& a, B const& b) {
  return add(to_expr(a), to_expr(b));
}
// a - b, element by element.
template <class A, class B>
  requires operands<A, B>
auto operator-(A const& a, B const& b) {
  return sub(to_expr(a), to_expr(b));
}
// a * b, element by element.
template <class A, class B>
  requires operands<A, B>
auto operator*(A const& a, B const& b) {
  return mul(to_expr(a), to_expr(b));
}
// a / b, element by element.
template <class A, class B>
  requires operands<A, B>
auto operator/(A const& a, B const& b) {
  return div(to_expr(a), to_expr(b));
}
// -a, element by element.
template <class A>
  requires(expression<A> || tensor_like<A>)
auto operator-(A const& a) {
  return neg(to_expr(a));
}

// ---------------------------------------------------------------- named functions
template <class A>
concept array_operand = expression<A> || tensor_like<A>;

// Declares fn(a): the op applied to every element of a (exp, log, sqrt, rsqrt, tanh, sigmoid, erf,
// abs, sign, relu, step; each differentiated by grad() through its rule in grad.hpp).
#define REMAT_EXPR_UNARY(fn, op)            \
  template <array_operand A>                \
  auto fn(A const& a) {                     \
    return make_unary(op{}, to_expr(a));    \
  }
REMAT_EXPR_UNARY(exp, exp_op)
REMAT_EXPR_UNARY(log, log_op)
REMAT_EXPR_UNARY(sqrt, sqrt_op)
REMAT_EXPR_UNARY(rsqrt, rsqrt_op)
REMAT_EXPR_UNARY(tanh, tanh_op)
REMAT_EXPR_UNARY(sigmoid, sigmoid_op)
REMAT_EXPR_UNARY(erf, erf_op)
REMAT_EXPR_UNARY(abs, abs_op)
REMAT_EXPR_UNARY(sign, sign_op)
REMAT_EXPR_UNARY(relu, relu_op)
REMAT_EXPR_UNARY(step, step_op)
#undef REMAT_EXPR_UNARY

// max(a, c) of every element, with a constant c (PyTorch's clamp_min).
template <array_operand A>
auto max(A const& a, double c) {
  return make_unary(max_op{c}, to_expr(a));
}
// max(c, a) = max(a, c).
template <array_operand A>
auto max(double c, A const& a) {
  return make_unary(max_op{c}, to_expr(a));
}
// min(a, c) of every element, with a constant c (PyTorch's clamp_max).
template <array_operand A>
auto min(A const& a, double c) {
  return make_unary(min_op{c}, to_expr(a));
}
// min(c, a) = min(a, c).
template <array_operand A>
auto min(double c, A const& a) {
  return make_unary(min_op{c}, to_expr(a));
}
// a^p of every element, with a constant exponent.
template <array_operand A>
auto pow(A const& a, double p) {
  return make_unary(pow_op{p}, to_expr(a));
}

inline constexpr double sqrt2_pi = 0.79788456080286535588;     // sqrt(2 / pi)
inline constexpr double two_sqrtpi = 1.12837916709551257390;   // 2 / sqrt(pi)

// GELU, exact form: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), one op (gelu_op).
template <array_operand A>
auto gelu(A const& a) {
  return make_unary(gelu_op{}, to_expr(a));
}

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <array_operand A>
auto gelu_tanh(A const& a) {
  auto x = to_expr(a);
  return constant{{}, 0.5} * x *
         (one_t{} + tanh(constant{{}, sqrt2_pi} * (x + constant{{}, 0.044715} * x * x * x)));
}

// SiLU (swish): x * sigmoid(x).
template <array_operand A>
auto silu(A const& a) {
  auto x = to_expr(a);
  return x * sigmoid(x);
}

}  // namespace expr
}  // namespace REMAT_NAMESPACE
