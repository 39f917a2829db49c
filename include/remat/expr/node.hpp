// Expression nodes: small value types held by value, so a whole expression is one object that can
// be copied into a kernel. Terminals read tensors (or are constants); inner nodes apply an op.
// Every node answers size() (elements, or any_size for constants), cols() (elements per row: a
// tensor's cols, a broadcast row's width; any_size for constants) and eval<V>(i), the i-th element
// computed in type V (float, or double when any input or the output is double). Operands must agree
// in shape (rows and cols), not only in element count: a 4 x 3 and a 3 x 4 are refused.
#pragma once

#include "../device.hpp"
#include "../error.hpp"
#include "../numeric/compute.hpp"

#include <cstddef>
#include <limits>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace expr {

struct expr_base {};

template <class T>
concept expression = std::is_base_of_v<expr_base, std::remove_cvref_t<T>>;

// The size of a node that fits any size (a constant): it takes its operand's.
inline constexpr std::size_t any_size = std::numeric_limits<std::size_t>::max();

// The id of a terminal that is a constant as far as differentiation goes.
inline constexpr int no_id = -1;

// Reads element i of a tensor. Id names it as a variable for grad(); no_id for a constant.
template <class T, class Device, int Id>
struct ref : expr_base {
  using device = Device;  // where the tensor lives
  using element = std::remove_cv_t<T>;  // the tensor's element type
  static constexpr int id = Id;  // the variable it is for grad() (no_id: a constant)
  static constexpr bool is_double = std::is_same_v<element, double>;  // whether it computes in double
  T const* data;  // the tensor's first element
  std::size_t n;  // its elements
  std::size_t n_cols;  // its elements per row (its cols)

  constexpr std::size_t size() const { return n; }  // the tensor's elements
  constexpr std::size_t cols() const { return n_cols; }  // the tensor's elements per row
  // Element i, converted to the compute type V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t i) const {
    return to_compute<V>(data[i]);
  }
};

// Reads a row vector of `width` elements as if repeated over `n / width` rows (a bias).
template <class T, class Device, int Id>
struct row_broadcast : expr_base {
  using device = Device;  // where the row lives
  using element = std::remove_cv_t<T>;  // the row's element type
  static constexpr int id = Id;  // the variable it is for grad() (no_id: a constant)
  static constexpr bool is_double = std::is_same_v<element, double>;  // whether it computes in double
  T const* data;  // the row's first element
  std::size_t width;  // the row's elements
  std::size_t n;  // the elements it reads as (rows times width)

  constexpr std::size_t size() const { return n; }  // rows times width
  constexpr std::size_t cols() const { return width; }  // the row's elements
  // Element i: the row's element i % width, converted to the compute type V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t i) const {
    return to_compute<V>(data[i % width]);
  }
};

// A run-time scalar, the same for every element.
struct constant : expr_base {
  using device = void;  // (any: a constant lives nowhere)
  static constexpr bool is_double = false;  // (a constant does not make an expression double)
  double value;  // the scalar

  constexpr std::size_t size() const { return any_size; }  // any: it takes its operand's size
  constexpr std::size_t cols() const { return any_size; }  // any: it takes its operand's shape
  // The scalar, converted to the compute type V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t) const {
    return static_cast<V>(value);
  }
};

// Compile-time 0: what differentiation produces and simplifies away.
struct zero_t : expr_base {
  using device = void;  // (any)
  static constexpr bool is_double = false;  // (does not make an expression double)
  constexpr std::size_t size() const { return any_size; }  // any: it takes its operand's size
  constexpr std::size_t cols() const { return any_size; }  // any: it takes its operand's shape
  // 0 in the compute type V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t) const {
    return V(0);
  }
};
// Compile-time 1: what differentiation produces and simplifies away.
struct one_t : expr_base {
  using device = void;  // (any)
  static constexpr bool is_double = false;  // (does not make an expression double)
  constexpr std::size_t size() const { return any_size; }  // any: it takes its operand's size
  constexpr std::size_t cols() const { return any_size; }  // any: it takes its operand's shape
  // 1 in the compute type V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t) const {
    return V(1);
  }
};

namespace detail {

template <class A, class B>
struct common_device {
  static_assert(std::is_same_v<A, B> || std::is_void_v<A> || std::is_void_v<B>,
                "remat expression: operands live on different devices (one on remat::host, one on remat::cuda)");
  using type = std::conditional_t<std::is_void_v<A>, B, A>;
};

// The rows of a node of n elements, cols per row (0 when it has no elements).
constexpr std::size_t rows_of(std::size_t n, std::size_t cols) { return cols == 0 ? 0 : n / cols; }

// The elements of a node of operands with n elements of cols per row (a) and (b); shape_error when
// both have a shape (neither is a constant) and the shapes differ, in rows or in cols.
inline std::size_t common_size(std::size_t a, std::size_t a_cols, std::size_t b, std::size_t b_cols) {
  if (a == any_size) return b;
  if (b == any_size || (a == b && a_cols == b_cols)) return a;
  REMAT_NAMESPACE::detail::raise<shape_error>("expression operands differ in shape: expected the right operand to be ",
                                              rows_of(a, a_cols), " x ", a_cols, " like the left one, found ",
                                              rows_of(b, b_cols), " x ", b_cols);
}

}  // namespace detail

// Op applied to every element of A (an op may hold a value: pow's exponent, min's bound).
template <class Op, class A>
struct unary : expr_base {
  using device = typename A::device;  // the operand's
  static constexpr bool is_double = A::is_double;  // whether it computes in double (as its operand)
  [[no_unique_address]] Op op;  // the function applied
  A a;  // the operand

  constexpr unary(Op o, A x) : op(o), a(x) {}  // o applied to x
  constexpr std::size_t size() const { return a.size(); }  // the operand's size
  constexpr std::size_t cols() const { return a.cols(); }  // the operand's elements per row
  // op of the operand's element i, computed in V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t i) const {
    return op(a.template eval<V>(i));
  }
};

// Op (a stateless function of two values) applied element by element to A and B.
template <class Op, class A, class B>
struct binary : expr_base {
  using op_type = Op;  // the function applied
  // The operands' device (static_assert when they differ; a constant fits either).
  using device = typename detail::common_device<typename A::device, typename B::device>::type;
  static constexpr bool is_double = A::is_double || B::is_double;  // whether either operand is double
  A a;  // the left operand
  B b;  // the right operand
  std::size_t n;  // the elements (the operands', which must agree unless one is a constant)

  // x op y; shape_error when the operands' shapes differ.
  binary(A x, B y) : a(x), b(y), n(detail::common_size(x.size(), x.cols(), y.size(), y.cols())) {}
  constexpr std::size_t size() const { return n; }  // the operands' common size
  // The operands' common elements per row (checked equal when both have a shape).
  constexpr std::size_t cols() const { return a.size() == any_size ? b.cols() : a.cols(); }
  // Op of the operands' elements i, computed in V.
  template <class V>
  REMAT_HOST_DEVICE V eval(std::size_t i) const {
    return Op{}(a.template eval<V>(i), b.template eval<V>(i));
  }
};

// Does E read the variable Id?
template <class E, int Id>
struct contains : std::false_type {};
template <class T, class D, int I, int Id>
struct contains<ref<T, D, I>, Id> : std::bool_constant<I == Id && Id != no_id> {};
template <class T, class D, int I, int Id>
struct contains<row_broadcast<T, D, I>, Id> : std::bool_constant<I == Id && Id != no_id> {};
template <class Op, class A, int Id>
struct contains<unary<Op, A>, Id> : contains<A, Id> {};
template <class Op, class A, class B, int Id>
struct contains<binary<Op, A, B>, Id> : std::bool_constant<contains<A, Id>::value || contains<B, Id>::value> {};
// Whether E reads the variable Id (contains, for any cv-ref E).
template <class E, int Id>
inline constexpr bool contains_v = contains<std::remove_cvref_t<E>, Id>::value;

// Whether E is a terminal that reads memory (ref, row_broadcast).
template <class E>
inline constexpr bool is_terminal_v = false;
// (a tensor read is a terminal)
template <class T, class D, int I>
inline constexpr bool is_terminal_v<ref<T, D, I>> = true;
// (a broadcast row is a terminal)
template <class T, class D, int I>
inline constexpr bool is_terminal_v<row_broadcast<T, D, I>> = true;

// Element i of e where i lies in column c of rows of the row broadcasts' width: a broadcast reads
// its element c directly (a host pass over rows knows c; i % width in every element would cost an
// integer division and keep the loop from vectorising); everything else reads element i.
template <class V, class E>
REMAT_HOST_DEVICE V eval_at(E const& e, std::size_t i, std::size_t c) {
  if constexpr (requires { e.width; e.data; })  // a row_broadcast
    return to_compute<V>(e.data[c]);
  else if constexpr (requires { e.op; e.a; })  // a unary node
    return e.op(eval_at<V>(e.a, i, c));
  else if constexpr (requires { e.a; e.b; })  // a binary node (its op is stateless)
    return typename E::op_type{}(eval_at<V>(e.a, i, c), eval_at<V>(e.b, i, c));
  else
    return e.template eval<V>(i);
}

// The width of e's row broadcasts: 0 if it has none, any_size if they differ.
template <class E>
std::size_t broadcast_width(E const& e) {
  if constexpr (requires { e.width; e.data; })
    return e.width;
  else if constexpr (requires { e.op; e.a; })
    return broadcast_width(e.a);
  else if constexpr (requires { e.a; e.b; }) {
    std::size_t const a = broadcast_width(e.a), b = broadcast_width(e.b);
    return a == 0 ? b : (b == 0 || a == b ? a : any_size);
  } else
    return 0;
}

// What one element of an op costs beside the loads, stores and adds a pass is made of, in their
// units: 0 for arithmetic and comparisons, an op's own `cost` where it has one (exp, log, tanh,
// sigmoid, erf, gelu, pow: a polynomial or a libm call, a few dozen instructions).
template <class Op>
inline constexpr std::size_t op_cost = [] {
  if constexpr (requires { Op::cost; })
    return std::size_t(Op::cost);
  else
    return std::size_t(0);
}();

// What one element of E costs, in the units of op_cost, 1 for the pass itself: a host pass weighs
// its elements by it in deciding whether to split across threads (a GELU makes 4,096
// elements worth two threads; a plain add is not worth them below 32,768). It decides nothing
// about bits: the elements of a point-wise pass are independent.
template <class E>
struct element_cost {
  static constexpr std::size_t value = 0;  // a terminal or a constant: its load is the pass's
};
// (an op on its operand)
template <class Op, class A>
struct element_cost<unary<Op, A>> {
  static constexpr std::size_t value = op_cost<Op> + element_cost<A>::value;  // the op's and its operand's
};
// (an op on two operands)
template <class Op, class A, class B>
struct element_cost<binary<Op, A, B>> {
  static constexpr std::size_t value = op_cost<Op> + element_cost<A>::value + element_cost<B>::value;  // the three's
};
// E's cost per element: 1 for the pass, plus its ops' (see element_cost).
template <class E>
inline constexpr std::size_t element_cost_v = 1 + element_cost<std::remove_cvref_t<E>>::value;

// The type an expression computes in when written to an Out.
template <class E, class Out>
using compute_t = std::conditional_t<E::is_double || std::is_same_v<std::remove_cv_t<Out>, double>, double, float>;

}  // namespace expr
}  // namespace REMAT_NAMESPACE
