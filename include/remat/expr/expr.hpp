// The expression vocabulary in one include (running expressions: kernels/evaluate.hpp), also exported to remat:: so that tensors and views
// find the operators by argument-dependent lookup.
#pragma once

#include "grad.hpp"
#include "ops.hpp"

namespace REMAT_NAMESPACE {

// The expression vocabulary, also under remat:: so that tensors find the operators by ADL.
using expr::abs;
using expr::broadcast_rows;
using expr::erf;
using expr::exp;
using expr::gelu;
using expr::gelu_tanh;
using expr::grad;
using expr::leaf;
using expr::log;
using expr::max;
using expr::min;
using expr::pow;
using expr::relu;
using expr::rsqrt;
using expr::sigmoid;
using expr::sign;
using expr::silu;
using expr::sqrt;
using expr::step;
using expr::tanh;
using expr::to_expr;

// Tensors and views live in remat::, so operators on them (with no expression among the operands;
// expr:: serves those) are declared here: nvcc's front end does not find operators brought in by a
// using-declaration through argument-dependent lookup.
template <class A, class B>
  requires expr::operands<A, B> && (!expr::expression<A> && !expr::expression<B>)
auto operator+(A const& a, B const& b) {
  return expr::to_expr(a) + expr::to_expr(b);
}
// a - b, element by element, as an expression (evaluated when assigned).
template <class A, class B>
  requires expr::operands<A, B> && (!expr::expression<A> && !expr::expression<B>)
auto operator-(A const& a, B const& b) {
  return expr::to_expr(a) - expr::to_expr(b);
}
// a * b, element by element, as an expression (evaluated when assigned).
template <class A, class B>
  requires expr::operands<A, B> && (!expr::expression<A> && !expr::expression<B>)
auto operator*(A const& a, B const& b) {
  return expr::to_expr(a) * expr::to_expr(b);
}
// a / b, element by element, as an expression (evaluated when assigned).
template <class A, class B>
  requires expr::operands<A, B> && (!expr::expression<A> && !expr::expression<B>)
auto operator/(A const& a, B const& b) {
  return expr::to_expr(a) / expr::to_expr(b);
}
// -a, element by element, as an expression.
template <class A>
  requires expr::tensor_like<A>
auto operator-(A const& a) {
  return -expr::to_expr(a);
}

}  // namespace REMAT_NAMESPACE
