// Matrix products: C = alpha * op(A) * op(B) + beta * C, row-major, accumulated in fp32 (fp64 for
// double). Host: CBLAS (OpenBLAS). The CUDA path (cuBLASLt) implements the same signature.
#pragma once

#include "../device.hpp"
#include "../error.hpp"

#include <cblas.h>

#include <climits>
#include <cstddef>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

enum class trans : bool { no = false, yes = true };

namespace detail {

inline int blas_int(index_t v, char const* what) {
  if (v < 0 || v > INT_MAX) REMAT_NAMESPACE::detail::raise<argument_error>("gemm: ", what, " must be in [0, ", INT_MAX, "], found ", v);
  return static_cast<int>(v);
}

inline void check_ld(index_t ld, index_t rows, index_t cols, trans t, char const* name) {
  // Row-major: a stored matrix is `rows` x `cols` with row stride ld >= cols.
  index_t const stored_cols = t == trans::no ? cols : rows;
  if (ld < (stored_cols > 1 ? stored_cols : 1))
    REMAT_NAMESPACE::detail::raise<argument_error>("gemm: leading dimension of ", name, " must be at least ",
                                                   stored_cols, ", found ", ld);
}

inline CBLAS_TRANSPOSE cblas_trans(trans t) { return t == trans::no ? CblasNoTrans : CblasTrans; }

}  // namespace detail

// Row-major C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C.
template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
void gemm(host, trans ta, trans tb, index_t m, index_t n, index_t k, T alpha, T const* a, index_t lda, T const* b,
          index_t ldb, T beta, T* c, index_t ldc) {
  int const M = detail::blas_int(m, "m"), N = detail::blas_int(n, "n"), K = detail::blas_int(k, "k");
  detail::check_ld(lda, m, k, ta, "A");
  detail::check_ld(ldb, k, n, tb, "B");
  detail::check_ld(ldc, m, n, trans::no, "C");
  if (M == 0 || N == 0) return;
  int const LDA = detail::blas_int(lda, "lda"), LDB = detail::blas_int(ldb, "ldb"), LDC = detail::blas_int(ldc, "ldc");
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, detail::cblas_trans(ta), detail::cblas_trans(tb), M, N, K, alpha, a, LDA, b, LDB,
                beta, c, LDC);
  else
    cblas_dgemm(CblasRowMajor, detail::cblas_trans(ta), detail::cblas_trans(tb), M, N, K, alpha, a, LDA, b, LDB,
                beta, c, LDC);
}

// The same on tensor views: C = alpha * op(A) * op(B) + beta * C, with the shapes checked.
template <class A, class B, class C>
void gemm(A const& a, trans ta, B const& b, trans tb, C const& c, typename C::value_type alpha = 1,
          typename C::value_type beta = 0) {
  using D = typename C::device_type;
  static_assert(std::is_same_v<typename A::device_type, D> && std::is_same_v<typename B::device_type, D>,
                "gemm: A, B and C must live on the same device");
  static_assert(std::is_same_v<typename A::value_type, typename C::value_type> &&
                    std::is_same_v<typename B::value_type, typename C::value_type>,
                "gemm: A, B and C must have the same element type");
  index_t const m = index_t(ta == trans::no ? a.rows() : a.cols());
  index_t const k = index_t(ta == trans::no ? a.cols() : a.rows());
  index_t const kb = index_t(tb == trans::no ? b.rows() : b.cols());
  index_t const n = index_t(tb == trans::no ? b.cols() : b.rows());
  if (k != kb)
    REMAT_NAMESPACE::detail::raise<shape_error>("gemm: op(A) is ", m, " x ", k, ", so op(B) must have ", k,
                                                " rows; found ", kb, " x ", n);
  if (index_t(c.rows()) != m || index_t(c.cols()) != n)
    REMAT_NAMESPACE::detail::raise<shape_error>("gemm: op(A) * op(B) is ", m, " x ", n, ", but C is ", c.rows(),
                                                " x ", c.cols());
  gemm(D{}, ta, tb, m, n, k, alpha, a.data(), index_t(a.cols()), b.data(), index_t(b.cols()), beta, c.data(),
       index_t(c.cols()));
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
