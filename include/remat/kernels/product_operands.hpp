// The operands of a matrix product, named and checked: which of A, B and C each is (part of its
// type), its rows, columns, row stride and whether it is read transposed, where matrix i of a
// batch lies, alpha and beta, and the checks every product makes before it reads anything.
// Shared by the host's and the GPU's products (kernels/gemm.hpp).
#pragma once

#include "../config.hpp"
#include "../error.hpp"

#include <climits>
#include <cstddef>
#include <cstdint>

namespace REMAT_NAMESPACE {
namespace kernels {

// Whether a product reads an operand as stored (no) or transposed (yes).
enum class trans : bool { no = false, yes = true };

// Where matrix i of a batch starts: base + (i / group) * outer + (i % group) * inner, with
// `group` matrices per outer step (the heads of one sequence in attention).
struct batch_stride {
  index_t outer = 0;  // elements between groups
  index_t inner = 0;  // elements between the matrices of a group
  // Where matrix i starts, in elements from the operand's data.
  constexpr index_t at(std::size_t i, std::size_t group) const {
    return index_t(i / group) * outer + index_t(i % group) * inner;
  }
};

// The operands of C = alpha * op(A) * op(B) + beta * C, named: a row-major matrix stored `rows` x
// `cols` with row stride `ld` (its leading dimension), whether the product reads it transposed,
// and in a batch where matrix i starts. Which operand it is (A, B or C) is part of its type, so a
// product given its operands in the wrong places does not compile; the shapes of op(A), op(B) and
// C are checked against each other before anything is read.
enum class operand_role { a, b, c };

// One operand of a product (see operand_role): made by lhs(), rhs() and result().
template <class T, operand_role Role>
struct operand {
  T* data = nullptr;  // the first matrix's first element
  index_t rows = 0;  // the rows as stored
  index_t cols = 0;  // the columns as stored
  index_t ld = 0;  // the row stride, in elements (at least cols)
  trans op = trans::no;  // whether the product reads it transposed
  batch_stride stride{};  // where matrix i of a batch starts

  // Read transposed (when `yes`).
  constexpr operand transposed(bool yes = true) const {
    operand o = *this;
    if (yes) o.op = op == trans::no ? trans::yes : trans::no;
    return o;
  }
  // The rows x cols sub-matrix starting at row r0, column c0 of every matrix (as stored, before
  // op): the same row stride and batch stride.
  constexpr operand window(index_t r0, index_t c0, index_t r, index_t c) const {
    operand o = *this;
    o.data = data + r0 * ld + c0;
    o.rows = r;
    o.cols = c;
    return o;
  }
  // Matrix i of a batch at data + s.at(i, group).
  constexpr operand batched(batch_stride s) const {
    operand o = *this;
    o.stride = s;
    return o;
  }
  constexpr index_t op_rows() const { return op == trans::no ? rows : cols; }  // the rows of op(this)
  constexpr index_t op_cols() const { return op == trans::no ? cols : rows; }  // the columns of op(this)
};

// A, the left operand (read).
template <class T>
using lhs_operand = operand<T const, operand_role::a>;
// B, the right operand (read).
template <class T>
using rhs_operand = operand<T const, operand_role::b>;
// C, the result (written, or added to when beta is not 0).
template <class T>
using result_operand = operand<T, operand_role::c>;

// A (left), B (right) and C: `rows` x `cols` at `data`, row stride `ld` (`cols` when 0).
template <class T>
constexpr lhs_operand<T> lhs(T const* data, index_t rows, index_t cols, index_t ld = 0) {
  return {data, rows, cols, ld ? ld : cols};
}
// B: `rows` x `cols` at `data`, row stride `ld` (`cols` when 0).
template <class T>
constexpr rhs_operand<T> rhs(T const* data, index_t rows, index_t cols, index_t ld = 0) {
  return {data, rows, cols, ld ? ld : cols};
}
// C: `rows` x `cols` at `data`, row stride `ld` (`cols` when 0).
template <class T>
constexpr result_operand<T> result(T* data, index_t rows, index_t cols, index_t ld = 0) {
  return {data, rows, cols, ld ? ld : cols};
}

// Where an operand's matrices lie: rows x cols with row stride ld (cols when 0), and in a batch
// matrix i at stride.at(i, group).
struct matrix_layout {
  index_t rows = 0;  // the rows as stored
  index_t cols = 0;  // the columns as stored
  index_t ld = 0;  // the row stride (cols when 0)
  batch_stride stride{};  // where matrix i of a batch starts
};
// A at data, laid out as l.
template <class T>
constexpr lhs_operand<T> lhs(T const* data, matrix_layout l) {
  return {data, l.rows, l.cols, l.ld ? l.ld : l.cols, trans::no, l.stride};
}
// B at data, laid out as l.
template <class T>
constexpr rhs_operand<T> rhs(T const* data, matrix_layout l) {
  return {data, l.rows, l.cols, l.ld ? l.ld : l.cols, trans::no, l.stride};
}
// C at data, laid out as l.
template <class T>
constexpr result_operand<T> result(T* data, matrix_layout l) {
  return {data, l.rows, l.cols, l.ld ? l.ld : l.cols, trans::no, l.stride};
}

// alpha and beta of C = alpha * op(A) * op(B) + beta * C (beta = 1: add into C).
struct scale {
  double alpha = 1;  // the product's factor
  double beta = 0;  // C's factor (0: C is overwritten, never read)
};

// `count` products of one shape: product i reads and writes its operands' matrix i.
struct batch {
  std::size_t count = 1;  // the products
  std::size_t group = 1;  // matrices per outer step of the operands' batch_stride
};

namespace detail {

inline int blas_int(index_t v, char const* what) {
  if (v < 0 || v > INT_MAX) REMAT_NAMESPACE::detail::raise<argument_error>("gemm: ", what, " must be in [0, ", INT_MAX, "], found ", v);
  return static_cast<int>(v);
}

// (An empty operand, k = 0's A and B, is never read: any stride does.)
inline void check_ld(index_t ld, index_t stored_rows, index_t stored_cols, char const* name) {
  if (stored_rows == 0 || stored_cols == 0) return;
  if (ld < stored_cols)
    REMAT_NAMESPACE::detail::raise<argument_error>("gemm: leading dimension of ", name, " must be at least ",
                                                   stored_cols, ", found ", ld);
}

struct product_shape {
  index_t m, n, k;
};

// The checks every product makes before it touches memory: sizes, shapes that agree, leading
// dimensions. Returns m, n and k (op(A) is m x k, op(B) k x n, C m x n).
template <class TA, class TB, class TC>
product_shape check_product(operand<TA, operand_role::a> const& a, operand<TB, operand_role::b> const& b,
                            operand<TC, operand_role::c> const& c) {
  index_t const m = a.op_rows(), k = a.op_cols(), kb = b.op_rows(), n = b.op_cols();
  (void)blas_int(m, "m"), (void)blas_int(n, "n"), (void)blas_int(k, "k"), (void)blas_int(kb, "k of B");
  if (k != kb)
    REMAT_NAMESPACE::detail::raise<shape_error>("gemm: op(A) is ", m, " x ", k, ", so op(B) must have ", k,
                                                " rows; found ", kb, " x ", n);
  if (c.rows != m || c.cols != n)
    REMAT_NAMESPACE::detail::raise<shape_error>("gemm: op(A) * op(B) is ", m, " x ", n, ", but C is ", c.rows,
                                                " x ", c.cols);
  check_ld(a.ld, a.rows, a.cols, "A");
  check_ld(b.ld, b.rows, b.cols, "B");
  check_ld(c.ld, c.rows, c.cols, "C");
  return {m, n, k};
}

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
