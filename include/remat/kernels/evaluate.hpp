// Running expressions: evaluate(out, e) writes e into a tensor in one fused pass; sum, mean,
// max_of and sum_squares reduce e without writing it out. Both check sizes first and throw
// before touching any memory.
#pragma once

#include "../expr/expr.hpp"
#include "pointwise.hpp"
#include "reduce.hpp"

#include <limits>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace expr {

namespace detail {

template <class T, class V, class E>
struct store_fn {
  E e;
  REMAT_HOST_DEVICE T operator()(std::size_t i) const { return from_compute<T>(e.template eval<V>(i)); }
};

// The same through eval_at, for a pass over rows that knows each element's column.
template <class T, class V, class E>
struct store_at_fn {
  E e;
  REMAT_HOST_DEVICE T operator()(std::size_t i, std::size_t c) const { return from_compute<T>(eval_at<V>(e, i, c)); }
};

template <class V, class E>
struct load_fn {
  E e;
  REMAT_HOST_DEVICE V operator()(std::size_t i) const { return e.template eval<V>(i); }
};

template <class V, class E>
struct square_fn {
  E e;
  REMAT_HOST_DEVICE V operator()(std::size_t i) const {
    V const x = e.template eval<V>(i);
    return x * x;
  }
};

template <class E>
std::size_t reduction_size(E const& e, char const* what) {
  static_assert(!std::is_void_v<typename E::device>,
                "remat reduction: the expression reads no tensor, so it has no size or device");
  std::size_t const n = e.size();
  if (n == 0)
    REMAT_NAMESPACE::detail::raise<argument_error>(what, ": expected an expression of at least one element, found an empty one");
  return n;
}

}  // namespace detail

// out = e, element by element, in one pass. `out` is a tensor or a mutable view. e may read out
// itself (in-place update) as long as it reads element i only to write element i.
template <class Out, class E>
  requires tensor_like<Out> && operand<E>
void evaluate(Out&& out, E const& e) {
  auto x = to_expr(e);
  using X = decltype(x);
  using T = typename std::remove_cvref_t<Out>::value_type;
  using D = typename std::remove_cvref_t<Out>::device_type;
  static_assert(std::is_void_v<typename X::device> || std::is_same_v<typename X::device, D>,
                "remat::evaluate: the expression and the destination live on different devices");
  static_assert(!std::is_const_v<std::remove_pointer_t<decltype(out.data())>>,
                "remat::evaluate: the destination is read-only");
  std::size_t const n = out.size();
  if (x.size() != any_size && (x.size() != n || x.cols() != out.cols()))
    REMAT_NAMESPACE::detail::raise<shape_error>("remat::evaluate: expected an expression of ", out.rows(), " x ", out.cols(),
                                                " like the destination, found ", expr::detail::rows_of(x.size(), x.cols()),
                                                " x ", x.cols());
  using V = compute_t<X, T>;
  // A bias (a row broadcast): a pass over rows, each element's column known (no division by the
  // row's width per element, on either device).
  std::size_t const w = broadcast_width(x);
  if (w != 0 && w != any_size && n % w == 0) {
    kernels::transform_rows(D{}, n / w, w, out.data(), detail::store_at_fn<T, V, X>{x}, element_cost_v<X>);
    return;
  }
  kernels::transform(D{}, n, out.data(), detail::store_fn<T, V, X>{x}, element_cost_v<X>);
}

namespace detail {

// e's elements, each through Load<V, X> (V: e's compute type, fp32 or better), folded with op from
// init on e's device: read now, or as a kernels::pending_scalar when Later.
template <bool Later, template <class, class> class Load, class Op, class E>
auto reduce(E const& e, char const* what, Op op, double init) {
  auto x = to_expr(e);
  using X = decltype(x);
  using V = compute_t<X, float>;
  std::size_t const n = reduction_size(x, what);
  if constexpr (Later)
    return kernels::transform_reduce_pending(typename X::device{}, n, Load<V, X>{x}, V(init), op);
  else
    return kernels::transform_reduce(typename X::device{}, n, Load<V, X>{x}, V(init), op);
}

inline constexpr double minus_infinity = -std::numeric_limits<double>::infinity();

}  // namespace detail

// The sum of e's elements, accumulated in e's compute type.
template <class E>
  requires array_operand<E>
auto sum(E const& e) {
  return detail::reduce<false, detail::load_fn>(e, "remat::sum", kernels::plus_op{}, 0.0);
}

// The mean of e's elements (sum / size, in e's compute type).
template <class E>
  requires array_operand<E>
auto mean(E const& e) {
  auto const s = detail::reduce<false, detail::load_fn>(e, "remat::mean", kernels::plus_op{}, 0.0);
  return s / static_cast<decltype(s)>(to_expr(e).size());
}

// The largest element (NaN if any element is NaN).
template <class E>
  requires array_operand<E>
auto max_of(E const& e) {
  return detail::reduce<false, detail::load_fn>(e, "remat::max_of", kernels::max_op{}, detail::minus_infinity);
}

// The sum of squares (for norms and gradient clipping).
template <class E>
  requires array_operand<E>
auto sum_squares(E const& e) {
  return detail::reduce<false, detail::square_fn>(e, "remat::sum_squares", kernels::plus_op{}, 0.0);
}

// sum, sum_squares and max_of read later: a kernels::pending_scalar, whose get() waits for the
// result alone (on the GPU, not for the work issued after the reduction). What a loss returns.
template <class E>
  requires array_operand<E>
auto sum_pending(E const& e) {
  return detail::reduce<true, detail::load_fn>(e, "remat::sum_pending", kernels::plus_op{}, 0.0);
}

// sum_squares, read later (see sum_pending).
template <class E>
  requires array_operand<E>
auto sum_squares_pending(E const& e) {
  return detail::reduce<true, detail::square_fn>(e, "remat::sum_squares_pending", kernels::plus_op{}, 0.0);
}

// max_of, read later (see sum_pending).
template <class E>
  requires array_operand<E>
auto max_of_pending(E const& e) {
  return detail::reduce<true, detail::load_fn>(e, "remat::max_of_pending", kernels::max_op{}, detail::minus_infinity);
}

}  // namespace expr

// Also under remat::, beside the expression vocabulary (expr/expr.hpp).
using expr::evaluate;
using expr::max_of;
using expr::max_of_pending;
using expr::mean;
using expr::sum;
using expr::sum_pending;
using expr::sum_squares;
using expr::sum_squares_pending;

}  // namespace REMAT_NAMESPACE
