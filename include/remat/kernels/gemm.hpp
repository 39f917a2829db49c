// Matrix products: C = alpha * op(A) * op(B) + beta * C, row-major, accumulated in fp32 (fp64 for
// double). Host: CBLAS (OpenBLAS) for float and double. 16-bit inputs (bfloat16, half) accumulate
// in fp32 and write C in the 16-bit type (rounded once) or in fp32; on the host a bf16 product
// goes to oneDNN's matmul (AMX / AVX-512 BF16) when remat was built with it, and otherwise, like
// every half product, converts its inputs to fp32 for the BLAS. CUDA: cuBLASLt on the current
// stream, with the same signature (16-bit products on tensor cores, accumulating in fp32).
#pragma once

#include "../device.hpp"
#include "../error.hpp"
#include "../memory/allocator.hpp"
#include "../numeric/compute.hpp"
#include "detail/cublaslt.hpp"
#include "product_operands.hpp"
#include "profile.hpp"
#include "rows.hpp"

// OpenBLAS's cblas.h declares a global `bfloat16` (a uint16_t) that would make `bfloat16` ambiguous
// after `using namespace remat`; it is renamed while the header is read.
#define bfloat16 remat_openblas_bfloat16
#include <cblas.h>
#undef bfloat16

// oneDNN serves host C++ only: nvcc's front end fails on its headers, and CUDA code has cuBLASLt.
#if defined(REMAT_HAS_ONEDNN) && !defined(__CUDACC__)
#define REMAT_GEMM_ONEDNN 1
#include "detail/onednn.hpp"
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

namespace detail {

inline CBLAS_TRANSPOSE cblas_trans(trans t) { return t == trans::no ? CblasNoTrans : CblasTrans; }

}  // namespace detail

// How a product of 16-bit inputs runs on the host: oneDNN's bf16 matmul, or conversion to fp32 and
// the BLAS. `automatic` takes oneDNN for bfloat16 when remat has it (4-5x the fp32 BLAS on a
// processor with AMX, see bench/gemm16.cpp) and conversion otherwise (oneDNN 2.6 has no half
// matmul on the CPU, and its bf16 one needs AVX-512: has_onednn_bf16). Tests and benchmarks set it
// to compare the paths.
enum class gemm16_path { automatic, onednn, convert };

// The process-wide setting for 16-bit products (set_gemm16_path changes it).
inline std::atomic<gemm16_path>& gemm16_setting() {
  static std::atomic<gemm16_path> p{gemm16_path::automatic};
  return p;
}
inline void set_gemm16_path(gemm16_path p) { gemm16_setting().store(p); }  // for every later product

// Whether remat was built with oneDNN (libdnnl-dev found; host C++ only).
inline constexpr bool has_onednn =
#if defined(REMAT_GEMM_ONEDNN)
    true;
#else
    false;
#endif

// How an fp32 product runs on the host: OpenBLAS's sgemm, or oneDNN's f32 matmul. `automatic` takes
// oneDNN when remat has it: it was faster on every shape of a step measured
// (bench_gemm_paths, bench/results/gemm-paths-host.md: 1.06-1.25x OpenBLAS on a Zen 4 EPYC), except
// the smallest: a product of at most small_product multiply-adds (a surrogate called on one row)
// takes OpenBLAS, whose call costs about a microsecond where oneDNN's costs six (bench_inference,
// 2 threads, Zen 4: 9 us against 30 us for four products of one row). On a processor without
// AVX-512, a product of fewer than plain_layout_rows rows with neither operand transposed (a
// layer's input gradient, dy W) takes OpenBLAS too: oneDNN 2.6's AVX2 code ran it at half its
// rate for the transposed layouts inside a step (Zen 3, 128 and 256 rows by 1024 x 1024: 8.7 ms a
// call against 4.8 for x W^T; from 512 rows on the same), and the MLP's batch-256 fp32 step went
// from 0.65 to 0.50 s (bench_policies, medians of 5 interleaved rounds). The batched products
// (attention's per-head ones, one per thread) stay on OpenBLAS.
enum class gemm32_path { automatic, openblas, onednn };

// The process-wide setting for fp32 products (set_gemm32_path changes it).
inline std::atomic<gemm32_path>& gemm32_setting() {
  static std::atomic<gemm32_path> p{gemm32_path::automatic};
  return p;
}

// The path fp32 products take now; asking for oneDNN without it is an argument_error.
inline gemm32_path gemm32_path_now() {
  gemm32_path const p = gemm32_setting().load();
  if (p == gemm32_path::automatic) return has_onednn ? gemm32_path::onednn : gemm32_path::openblas;
  return p;
}
// The multiply-adds at or below which `automatic` takes OpenBLAS (see gemm32_path).
inline constexpr std::int64_t small_product = std::int64_t(1) << 18;
// The rows below which `automatic` takes OpenBLAS for a product with neither operand transposed
// where oneDNN has no AVX-512 code (see gemm32_path).
inline constexpr index_t plain_layout_rows = 512;
// Sets the path of every later fp32 product; oneDNN without it is an argument_error (nothing changes).
inline void set_gemm32_path(gemm32_path p) {
  if (p == gemm32_path::onednn && !has_onednn)
    REMAT_NAMESPACE::detail::raise<argument_error>(
        "gemm: the oneDNN fp32 path was asked for, but remat was built without oneDNN (libdnnl-dev)");
  gemm32_setting().store(p);
}

// Whether bf16 products can take oneDNN here: remat was built with it, and it has a bf16 matmul
// for this processor (oneDNN 2.6 needs AVX-512; asked once, at the first call).
inline bool has_onednn_bf16() {
#if defined(REMAT_GEMM_ONEDNN)
  return detail::onednn_bf16_matmul_here();
#else
  return false;
#endif
}

// The path an m x n x k fp32 product op(A) op(B) takes now.
inline gemm32_path gemm32_path_for(index_t m, index_t n, index_t k, trans ta, trans tb) {
  if (gemm32_setting().load() == gemm32_path::automatic) {
    if (std::int64_t(m) * n * k <= small_product) return gemm32_path::openblas;
    // (without AVX-512, oneDNN's bf16 probe fails where its fp32 code is AVX2's)
    if (has_onednn && ta == trans::no && tb == trans::no && m < plain_layout_rows && !has_onednn_bf16())
      return gemm32_path::openblas;
  }
  return gemm32_path_now();
}

// The path a product of T inputs takes now.
template <class T>
gemm16_path gemm16_path_for() {
  gemm16_path const p = gemm16_setting().load();
  bool const onednn_ok = std::is_same_v<T, bfloat16> && has_onednn_bf16();
  if (p == gemm16_path::onednn && !onednn_ok)
    REMAT_NAMESPACE::detail::raise<argument_error>(
        "gemm: the oneDNN path was asked for, but ",
        !has_onednn                      ? "remat was built without oneDNN (libdnnl-dev)"
        : !std::is_same_v<T, bfloat16>   ? "it has no half matmul on the CPU"
                                         : "its bf16 matmul needs a processor with AVX-512, which this one lacks");
  if (p == gemm16_path::automatic) return onednn_ok ? gemm16_path::onednn : gemm16_path::convert;
  return p;
}

namespace detail {

template <class F>
void for_rows(index_t rows, [[maybe_unused]] index_t cols, F const& f) {  // (cols: the OpenMP threshold)
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
#endif
  for (index_t r = 0; r < rows; ++r) f(r);
}

// The bytes a converting product takes from the scratch allocator: what it needs, or the most any
// asked for before (one cached block for every shape and batch: memory::growing_size).
inline std::size_t convert_scratch_bytes(std::size_t need) {
  static memory::growing_size most;
  return most(need);
}

// A stored rows x cols matrix with row stride ld, converted to a dense fp32 one.
template <class T>
void widen(T const* src, index_t rows, index_t cols, index_t ld, float* dst) {
  for_rows(rows, cols, [=](index_t r) {
    for (index_t c = 0; c < cols; ++c) dst[r * cols + c] = to_compute<float>(src[r * ld + c]);
  });
}


}  // namespace detail

// The element types a product takes: A and B have one type; C has it too, or is fp32 when A and
// B are 16-bit (a weight gradient accumulating in the fp32 master gradients).
template <class T, class Out>
concept gemm_types = ((std::is_same_v<T, float> || std::is_same_v<T, double>) && std::is_same_v<Out, T>) ||
                     (is_small_float_v<T> && (std::is_same_v<Out, T> || std::is_same_v<Out, float>));

namespace detail {

// Row-major C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C on checked arguments: the
// BLAS call (or oneDNN's, or the converting path) in its own positional terms.
template <class T, class Out>
void host_gemm(trans ta, trans tb, index_t m, index_t n, index_t k, compute_type_t<T> alpha, T const* a, index_t lda,
               T const* b, index_t ldb, compute_type_t<T> beta, Out* c, index_t ldc, bool batched = false) {
  int const M = int(m), N = int(n), K = int(k);
  if (M == 0 || N == 0) return;
  // (BLAS wants every leading dimension >= 1, also for k = 0's empty operands, which it never reads.)
  auto const at_least_1 = [](index_t ld) { return ld > 0 ? ld : index_t(1); };
  lda = at_least_1(lda), ldb = at_least_1(ldb);
  int const LDA = blas_int(lda, "lda"), LDB = blas_int(ldb, "ldb"), LDC = blas_int(ldc, "ldc");
  if constexpr (std::is_same_v<T, float>) {
#if defined(REMAT_GEMM_ONEDNN)
    if (!batched && K > 0 && gemm32_path_for(m, n, k, ta, tb) == gemm32_path::onednn) {
      try {
        onednn_matmul({m, n, k, lda, ldb, ldc, ta == trans::yes, tb == trans::yes, true, alpha, beta, true}, a, b, c);
      } catch (dnnl::error const& e) {
        REMAT_NAMESPACE::detail::raise<error>("gemm: oneDNN matmul ", m, " x ", n, " x ", k, " failed: ", e.what());
      }
      return;
    }
#endif
    (void)batched;
    cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, a, LDA, b, LDB, beta, c, LDC);
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, a, LDA, b, LDB, beta, c, LDC);
  } else {
    constexpr bool out32 = std::is_same_v<Out, float>;
#if defined(REMAT_GEMM_ONEDNN)
    if constexpr (std::is_same_v<T, bfloat16>) {
      if (gemm16_path_for<T>() == gemm16_path::onednn) {
        if (K == 0) {  // oneDNN wants k > 0: C = beta * C
          for (index_t i = 0; i < m; ++i)
            for (index_t j = 0; j < n; ++j)
              c[i * ldc + j] = beta == 0.0f ? Out(0.0f) : from_compute<Out>(beta * to_compute<float>(c[i * ldc + j]));
          return;
        }
        try {
          onednn_matmul({m, n, k, lda, ldb, ldc, ta == trans::yes, tb == trans::yes, out32, alpha, beta}, a, b, c);
        } catch (dnnl::error const& e) {
          REMAT_NAMESPACE::detail::raise<error>("gemm: oneDNN matmul ", m, " x ", n, " x ", k, " failed: ", e.what());
        }
        return;
      }
    }
#endif
    (void)gemm16_path_for<T>();  // (checks that a forced oneDNN path is possible)
    // Convert: A and B to dense fp32, the BLAS, then C rounded once to the 16-bit type; the three
    // fp32 copies in one scratch block of convert_scratch_bytes.
    index_t const ar = ta == trans::no ? m : k, ac = ta == trans::no ? k : m;
    index_t const br = tb == trans::no ? k : n, bc = tb == trans::no ? n : k;
    auto const lines = [](index_t floats) { return (std::size_t(floats) + 15) / 16 * 16; };  // (64-byte steps)
    std::size_t const na = lines(ar * ac), nb = lines(br * bc), nc = out32 ? 0 : lines(m * n);
    memory::scratch_buffer<host> scratch(convert_scratch_bytes((na + nb + nc) * sizeof(float)));
    float* const fa = scratch.as<float>();
    float* const fb = fa + na;
    widen(a, ar, ac, lda, fa);
    widen(b, br, bc, ldb, fb);
    if constexpr (out32) {
      cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, fa, std::max(1, int(ac)), fb,
                  std::max(1, int(bc)), beta, c, LDC);
    } else {
      float* const fc = fb + nb;
      if (beta != 0.0f) widen(c, m, n, ldc, fc);
      cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, fa, std::max(1, int(ac)), fb,
                  std::max(1, int(bc)), beta, fc, N);
      float const* src = fc;
      for_rows(m, n, [=](index_t r) {
        for (index_t j = 0; j < n; ++j) c[r * ldc + j] = from_compute<Out>(src[r * n + j]);
      });
    }
  }
}

}  // namespace detail

// Any other product: operands in the wrong places, or element types with no product. The real
// overloads are more specialised, so this one is chosen only when none of them fits, and its
// assertion names the operands' types (in the compiler's instantiation note) on every compiler.
template <class Device, class A, class B, class R>
void gemm(Device, A, B, R, scale = {}) {
  static_assert(sizeof(A) == 0,
                "remat::kernels::gemm: the operands of a product are not in their places, or have no product: "
                "expected gemm(device, lhs(A), rhs(B), result(C)) with A and B of one element type (the "
                "compiler's note on this instantiation names the operands given)");
}

// Row-major C = alpha * op(A) * op(B) + beta * C, with op(A) m x k, op(B) k x n and C m x n.
template <class T, class Out>
  requires gemm_types<T, Out>
void gemm(host, lhs_operand<T> a, rhs_operand<T> b, result_operand<Out> c, scale s = {}) {
  profile::timed<host> const timing(profile::work::product);
  auto const [m, n, k] = detail::check_product(a, b, c);
  if (m == 0 || n == 0) return;
  detail::host_gemm(a.op, b.op, m, n, k, compute_type_t<T>(s.alpha), a.data, a.ld, b.data, b.ld,
                    compute_type_t<T>(s.beta), c.data, c.ld);
}

// `count` products C_i = alpha * op(A_i) * op(B_i) + beta * C_i of one shape. On the host the
// products run in parallel, each on one thread (the BLAS runs single-threaded inside a parallel
// region), so every C_i is the same whatever the thread count.
template <class T, class Out>
  requires gemm_types<T, Out>
void gemm_batched(host, batch n, lhs_operand<T> a, rhs_operand<T> b, result_operand<Out> c, scale s = {}) {
  profile::timed<host> const timing(profile::work::product);
  if (n.count == 0) return;
  if (n.group == 0) REMAT_NAMESPACE::detail::raise<argument_error>("gemm_batched: group must be at least 1");
  auto const [m, cols, k] = detail::check_product(a, b, c);
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) (void)gemm16_path_for<T>();
  if (m == 0 || cols == 0) return;
  // (the checks above are the ones each product would make; inside the loop only a product's
  // scratch may fail to allocate, thrown again after the threads are done)
  compute_type_t<T> const alpha(s.alpha), beta(s.beta);
  detail::host_split_throwing(n.count, n.count * std::size_t(m * cols) * std::size_t(k > 0 ? k : 1) / 8,
                              [=](std::size_t first, std::size_t last) {
                                for (std::size_t i = first; i < last; ++i)
                                  detail::host_gemm(a.op, b.op, m, cols, k, alpha, a.data + a.stride.at(i, n.group),
                                                    a.ld, b.data + b.stride.at(i, n.group), b.ld, beta,
                                                    c.data + c.stride.at(i, n.group), c.ld, true);
                              });
}

#if REMAT_HAS_CUDA
namespace detail {

// C = beta * C for a product with nothing to sum (k = 0), which cuBLASLt does not take.
template <class Out, class S>
void scale_matrix(index_t m, index_t n, S beta, Out* c, index_t ldc) {
  for_each_index(cuda{}, std::size_t(m * n), std::size_t(m * n), [=] REMAT_LAMBDA(std::size_t i) {
    Out& x = c[index_t(i) / n * ldc + index_t(i) % n];
    x = beta == S(0) ? Out(S(0)) : from_compute<Out>(beta * to_compute<S>(x));
  });
}

template <class T, class Out>
void cuda_gemm(std::size_t batch, trans ta, trans tb, index_t m, index_t n, index_t k, compute_type_t<T> alpha,
               T const* a, index_t lda, index_t sa, T const* b, index_t ldb, index_t sb, compute_type_t<T> beta, Out* c,
               index_t ldc, index_t sc) {
  if (k == 0) {
    for (std::size_t i = 0; i < batch; ++i) scale_matrix(m, n, beta, c + index_t(i) * sc, ldc);
    return;
  }
  if (batch > std::size_t(INT_MAX))
    REMAT_NAMESPACE::detail::raise<argument_error>("gemm_batched: at most ", INT_MAX, " products, found ", batch);
  std::int64_t const et = sizeof(T), eo = sizeof(Out);
  lt_key const key{cuda_data_type<T>(), cuda_data_type<Out>(), ta == trans::yes, tb == trans::yes, m, n, k, lda, ldb,
                   ldc, std::int32_t(batch), sa, sb, sc, alignment_of(a, batch > 1 ? sa * et : 0),
                   alignment_of(b, batch > 1 ? sb * et : 0), alignment_of(c, batch > 1 ? sc * eo : 0),
                   m * n * k <= lt_small_product && !lt_small_split_k().load()};
  lt_matmul(key, &alpha, a, b, &beta, c);
}

// A batch of unevenly spaced matrices as one pointer-array product (lt_matmul_pointers); false,
// with nothing run, where it does not run so.
template <class T, class Out>
bool cuda_gemm_pointers(batch n, lhs_operand<T> a, rhs_operand<T> b, result_operand<Out> c, index_t m, index_t cols,
                        index_t k, scale s) {
  if (k == 0 || n.count > std::size_t(INT_MAX) || n.group > std::size_t(INT_MAX)) return false;
  std::int64_t const et = sizeof(T), eo = sizeof(Out);
  auto const spaced = [](void const* p, batch_stride st, std::int64_t e) {
    return lt_spaced{static_cast<char const*>(p), st.outer * e, st.inner * e};
  };
  auto const aligned = [](void const* p, batch_stride st, std::int64_t e) {
    return alignment_of(p, (st.outer | st.inner) * e);  // (every matrix's address)
  };
  lt_key const key{cuda_data_type<T>(), cuda_data_type<Out>(), a.op == trans::yes, b.op == trans::yes, m, cols, k,
                   a.ld, b.ld, c.ld, std::int32_t(n.count), 0, 0, 0, aligned(a.data, a.stride, et),
                   aligned(b.data, b.stride, et), aligned(c.data, c.stride, eo),
                   m * cols * k <= lt_small_product && !lt_small_split_k().load(), true};
  compute_type_t<T> const alpha(s.alpha), beta(s.beta);
  return lt_matmul_pointers(key, std::int32_t(n.group), spaced(a.data, a.stride, et), spaced(b.data, b.stride, et),
                            spaced(c.data, c.stride, eo), &alpha, &beta);
}

}  // namespace detail

template <class T, class Out>
  requires gemm_types<T, Out>
void gemm(cuda, lhs_operand<T> a, rhs_operand<T> b, result_operand<Out> c, scale s = {}) {
  profile::timed<cuda> const timing(profile::work::product);
  auto const [m, n, k] = detail::check_product(a, b, c);
  if (m == 0 || n == 0) return;
  detail::cuda_gemm<T, Out>(1, a.op, b.op, m, n, k, compute_type_t<T>(s.alpha), a.data, a.ld, 0, b.data, b.ld, 0,
                            compute_type_t<T>(s.beta), c.data, c.ld, 0);
}

// On the GPU a batch is one strided-batched product when the matrices are evenly spaced;
// otherwise one pointer-array product (a kernel writes the matrices' addresses first), or, where
// cuBLASLt has no algorithm for that or set_pointer_array_batches(false) said so, strided-batched
// products along whichever of the two strides makes fewer of them: one per outer step (`group`
// products each, `inner` apart), or one per place in the group (a product per outer step, `outer`
// apart). Attention's heads inside sequences, 8 heads in a batch of 64 sequences: 2 launches, or 8.
template <class T, class Out>
  requires gemm_types<T, Out>
void gemm_batched(cuda, batch n, lhs_operand<T> a, rhs_operand<T> b, result_operand<Out> c, scale s = {}) {
  profile::timed<cuda> const timing(profile::work::product);
  if (n.count == 0) return;
  if (n.group == 0) REMAT_NAMESPACE::detail::raise<argument_error>("gemm_batched: group must be at least 1");
  auto const [m, cols, k] = detail::check_product(a, b, c);
  if (m == 0 || cols == 0) return;
  index_t const g = index_t(n.group);
  auto const even = [g](batch_stride st) { return st.outer == g * st.inner; };
  bool const one = n.count <= n.group || (even(a.stride) && even(b.stride) && even(c.stride));
  if (!one && detail::cuda_gemm_pointers(n, a, b, c, m, cols, k, s)) return;
  std::size_t const outer_steps = (n.count + n.group - 1) / n.group;
  if (!one && outer_steps > n.group) {
    for (std::size_t j = 0; j < n.group && j < n.count; ++j) {  // matrices j, j + group, ...
      std::size_t const n_j = (n.count - j + n.group - 1) / n.group;
      detail::cuda_gemm<T, Out>(n_j, a.op, b.op, m, cols, k, compute_type_t<T>(s.alpha), a.data + a.stride.at(j, n.group),
                                a.ld, a.stride.outer, b.data + b.stride.at(j, n.group), b.ld, b.stride.outer,
                                compute_type_t<T>(s.beta), c.data + c.stride.at(j, n.group), c.ld, c.stride.outer);
    }
    return;
  }
  std::size_t const step = one ? n.count : n.group;
  for (std::size_t i = 0; i < n.count; i += step) {
    std::size_t const n_i = n.count - i < step ? n.count - i : step;
    detail::cuda_gemm<T, Out>(n_i, a.op, b.op, m, cols, k, compute_type_t<T>(s.alpha), a.data + a.stride.at(i, n.group),
                              a.ld, a.stride.inner, b.data + b.stride.at(i, n.group), b.ld, b.stride.inner,
                              compute_type_t<T>(s.beta), c.data + c.stride.at(i, n.group), c.ld, c.stride.inner);
  }
}
#endif

// Whether small GPU products (at most 2^22 multiply-adds) may split their sum over k (cuBLASLt's
// split-K). Off by default: each runs as one dot product per element, which for a few rows (a
// surrogate's batch of 16) avoids cuBLASLt's split into many slices and its reduction kernel
// (H100: the MLP surrogate's batch-16 replay 84 us with it, 36 without; larger batches the same).
inline void set_small_product_split_k([[maybe_unused]] bool on) {
#if REMAT_HAS_CUDA
  detail::lt_small_split_k().store(on);
#endif
}

// Whether a GPU batch of unevenly spaced matrices (attention's heads inside sequences) runs as one
// pointer-array product where cuBLASLt has an algorithm for it (on, the default), or as strided
// batches, one per head or per sequence. For every product after the setting changes; the two
// may differ in the last bits (other kernels), each the same run to run.
inline void set_pointer_array_batches([[maybe_unused]] bool on) {
#if REMAT_HAS_CUDA
  detail::lt_pointer_batches().store(on);
#endif
}

// Takes the products' scratch that a device holds across calls now rather than at a first use: on
// the GPU cuBLASLt's workspace block, from memory::scratch_allocator (cached there); nothing on
// the host. What model::reserve_inference calls, so no later product asks the system for memory.
template <class D>
void hold_product_workspace(D) {
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) detail::lt_hold_workspace();
#endif
}

// The same on tensor views: C = alpha * op(A) * op(B) + beta * C, with the shapes checked.
template <class A, class B, class C>
void gemm(A const& a, trans ta, B const& b, trans tb, C const& c,
          compute_type_t<std::remove_const_t<typename A::value_type>> alpha = 1,
          compute_type_t<std::remove_const_t<typename A::value_type>> beta = 0) {
  using D = typename C::device_type;
  static_assert(std::is_same_v<typename A::device_type, D> && std::is_same_v<typename B::device_type, D>,
                "gemm: A, B and C must live on the same device");
  using TA = std::remove_const_t<typename A::value_type>;
  static_assert(std::is_same_v<TA, std::remove_const_t<typename B::value_type>> &&
                    (std::is_same_v<TA, typename C::value_type> ||
                     (is_small_float_v<TA> && std::is_same_v<typename C::value_type, float>)),
                "gemm: A and B must have one element type, and C the same (or fp32 for 16-bit A and B)");
  gemm(D{}, lhs(a.data(), index_t(a.rows()), index_t(a.cols())).transposed(ta == trans::yes),
       rhs(b.data(), index_t(b.rows()), index_t(b.cols())).transposed(tb == trans::yes),
       result(c.data(), index_t(c.rows()), index_t(c.cols())), scale{double(alpha), double(beta)});
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
