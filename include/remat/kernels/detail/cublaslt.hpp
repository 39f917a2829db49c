// Row-major products through cuBLASLt (column-major): C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T, so B is cuBLASLt's first operand. One plan per shape, type and pointer
// alignment (descriptors and the chosen algorithm), made once per thread; the algorithm's
// workspace comes from the allocator's workspace for the call. A batch whose matrices are not
// evenly spaced (attention's heads inside sequences) runs as one pointer-array product where
// cuBLASLt has an algorithm for it (lt_matmul_pointers). fp32 runs in strict fp32 (no TF32,
// as PyTorch's default); bf16 and half run on tensor cores with fp32 accumulation; double in fp64.
#pragma once

#include "../../config.hpp"

#if REMAT_HAS_CUDA
#include "../../cuda/runtime.hpp"
#include "../../error.hpp"
#include "../../memory/allocator.hpp"
#include "../../numeric/small_float.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {
namespace detail {

template <class T>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  else if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
  else {
    static_assert(std::is_same_v<T, half>, "cuBLASLt: element types are float, double, bfloat16 and half");
    return CUDA_R_16F;
  }
}

// The largest power of two (at most 256) that divides every address a product touches.
inline std::uint32_t alignment_of(void const* p, std::int64_t batch_stride_bytes) {
  std::uint64_t v = std::uint64_t(reinterpret_cast<std::uintptr_t>(p)) | std::uint64_t(batch_stride_bytes) | 256u;
  return std::uint32_t(v & (~v + 1));
}

// Products of at most this many multiply-adds (m n k, per matrix of a batch) are small: see
// lt_small_split_k.
inline constexpr std::int64_t lt_small_product = std::int64_t(1) << 22;
// Whether a small product may split its sum over k (cuBLASLt's split-K, with a reduction
// kernel after it); off (the default), it runs as one dot product per element. For every product
// after the setting changes (kernels::set_small_product_split_k). Off because cuBLASLt's first
// choice for a 16 x 256 x 256 fp32 product split k 132 ways and took 37 us (H100, 2026-11-26).
inline std::atomic<bool>& lt_small_split_k() {
  static std::atomic<bool> on{false};
  return on;
}

struct lt_key {
  cudaDataType_t ab, c;
  bool ta, tb;
  std::int64_t m, n, k, lda, ldb, ldc;
  std::int32_t batch;
  std::int64_t sa, sb, sc;  // batch strides in elements
  std::uint32_t align_a, align_b, align_c;
  bool whole_k = false;   // no split-K (see lt_small_split_k)
  bool pointers = false;  // a pointer-array batch (sa, sb and sc unused)
  auto tie() const {
    return std::tie(ab, c, ta, tb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, align_a, align_b, align_c, whole_k,
                    pointers);
  }
  bool operator<(lt_key const& o) const { return tie() < o.tie(); }
};

struct lt_plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;  // B, A, C as cuBLASLt sees them
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
  lt_plan() = default;
  lt_plan(lt_plan const&) = delete;
  lt_plan& operator=(lt_plan const&) = delete;
  ~lt_plan() {
    if (op) (void)cublasLtMatmulDescDestroy(op);
    if (first) (void)cublasLtMatrixLayoutDestroy(first);
    if (second) (void)cublasLtMatrixLayoutDestroy(second);
    if (out) (void)cublasLtMatrixLayoutDestroy(out);
  }
};

// The most workspace an algorithm may ask for (what NVIDIA recommends for Hopper).
inline constexpr std::size_t lt_workspace_limit = std::size_t(32) << 20;

// A matrix layout; false where cuBLASLt does not take a pointer-array batch (then `layout` is
// still made, and destroyed with its plan).
inline bool lt_layout(cublasLtMatrixLayout_t& layout, cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                      std::int64_t ld, std::int32_t batch, std::int64_t stride, bool pointers) {
  REMAT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, std::uint64_t(rows), std::uint64_t(cols), ld));
  if (batch > 1 || pointers) {
    REMAT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    if (pointers) {
      std::uint32_t const mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
      return cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode) ==
             CUBLAS_STATUS_SUCCESS;
    }
    REMAT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                        sizeof stride));
  }
  return true;
}

// The plan of a product; for a pointer-array batch null where cuBLASLt has no algorithm for it
// (a strided product without one raises).
inline std::unique_ptr<lt_plan> make_lt_plan(lt_key const& key) {
  auto plan = std::make_unique<lt_plan>();
  bool const fp64 = key.ab == CUDA_R_64F;
  REMAT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, fp64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                              fp64 ? CUDA_R_64F : CUDA_R_32F));
  cublasOperation_t const op_first = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  REMAT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
  REMAT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
  // Column-major: C^T (n x m) = op(B^T) (n x k) * op(A^T) (k x m).
  bool const taken =
      lt_layout(plan->first, key.ab, key.tb ? key.k : key.n, key.tb ? key.n : key.k, key.ldb, key.batch, key.sb,
                key.pointers) &
      lt_layout(plan->second, key.ab, key.ta ? key.m : key.k, key.ta ? key.k : key.m, key.lda, key.batch, key.sa,
                key.pointers) &
      lt_layout(plan->out, key.c, key.n, key.m, key.ldc, key.batch, key.sc, key.pointers);
  if (!taken) return nullptr;

  cublasLtMatmulPreference_t pref = nullptr;
  REMAT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct pref_guard {
    cublasLtMatmulPreference_t p;
    ~pref_guard() { (void)cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  std::size_t const limit = lt_workspace_limit;
  REMAT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit, sizeof limit));
  REMAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                          &key.align_b, sizeof key.align_b));
  REMAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                          &key.align_a, sizeof key.align_a));
  REMAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                          &key.align_c, sizeof key.align_c));
  REMAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                          &key.align_c, sizeof key.align_c));
  if (key.whole_k) {
    std::uint32_t const none = CUBLASLT_REDUCTION_SCHEME_NONE;
    REMAT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t const asked = cublasLtMatmulAlgoGetHeuristic(REMAT_NAMESPACE::detail::cublaslt_handle::get(), plan->op,
                                                              plan->first, plan->second, plan->out, plan->out, pref, 1,
                                                              &result, &found);
  if (key.pointers && (asked != CUBLAS_STATUS_SUCCESS || found == 0)) return nullptr;
  REMAT_CUBLAS_CHECK(asked);
  if (found == 0)
    REMAT_NAMESPACE::detail::raise<cuda_error>("cublasLtMatmulAlgoGetHeuristic found no algorithm for a ", key.m,
                                               " x ", key.n, " x ", key.k, " product (batch ", key.batch, ")");
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  return plan;
}

// This thread's plan for `key`, made at its first use (null: a pointer-array batch cuBLASLt does
// not run, remembered as such).
inline std::unique_ptr<lt_plan>& lt_plan_for(lt_key const& key) {
  thread_local std::map<lt_key, std::unique_ptr<lt_plan>> plans;
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_lt_plan(key)).first;
  return it->second;
}

// Runs a planned product on the current stream; a, b and c are the matrices, or for a
// pointer-array batch the device arrays of their addresses. Returns cuBLASLt's status.
inline cublasStatus_t lt_run(lt_plan const& plan, void const* alpha, void const* a, void const* b, void const* beta,
                             void* c) {
  // Every product that wants workspace takes a block of the same size, lt_workspace_limit: the
  // scratch allocator caches blocks by size, so one block serves all shapes (a product of a new
  // shape asks the system for nothing), as cuBLAS's own per-handle workspace does.
  std::optional<memory::scratch_buffer<cuda>> workspace;
  if (plan.workspace) workspace.emplace(lt_workspace_limit);
  return cublasLtMatmul(REMAT_NAMESPACE::detail::cublaslt_handle::get(), plan.op, alpha, b, plan.first, a, plan.second,
                        beta, c, plan.out, c, plan.out, &plan.algo, workspace ? workspace->get() : nullptr,
                        plan.workspace, current_cuda_stream());
}

// Runs one (possibly strided-batched) product on the current stream. alpha and beta point to
// float (double for fp64 products).
inline void lt_matmul(lt_key const& key, void const* alpha, void const* a, void const* b, void const* beta, void* c) {
  REMAT_NAMESPACE::detail::cublas_check(lt_run(*lt_plan_for(key), alpha, a, b, beta, c), "cublasLtMatmul");
}

// Whether a batch of unevenly spaced matrices may run as one pointer-array product (on, the
// default) or runs as strided batches, one per head or per sequence (kernels::set_pointer_array_batches).
inline std::atomic<bool>& lt_pointer_batches() {
  static std::atomic<bool> on{true};
  return on;
}

// How many pointer-array products this process has run (what a test or a benchmark reports:
// whether cuBLASLt took them on this GPU).
inline std::atomic<std::uint64_t>& lt_pointer_products() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}

// Matrix i of an operand in a pointer-array batch: base + (i / group) * outer + (i % group) * inner,
// in bytes.
struct lt_spaced {
  char const* base;
  std::int64_t outer, inner;
};

// The three operands' address arrays, A's at arrays[0 .. count), B's after it, then C's.
template <int = 0>
__global__ void lt_fill_pointers(std::int32_t count, std::int32_t group, lt_spaced a, lt_spaced b, lt_spaced c,
                                 void const** arrays) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const o = i / group, r = i % group;
    arrays[i] = a.base + o * a.outer + r * a.inner;
    arrays[count + i] = b.base + o * b.outer + r * b.inner;
    arrays[2 * count + i] = c.base + o * c.outer + r * c.inner;
  }
}

// key.batch products of key's shape (key.pointers) whose operands are spaced as a, b and c say,
// as one pointer-array product: two launches (the address arrays, then the product) where the
// strided batches take one per head or per sequence. False, with no product run, where
// pointer-array batches are off or cuBLASLt has no algorithm for this one, or refuses to run the
// one it chose (then the plan is forgotten, and this shape takes the strided batches from then on).
inline bool lt_matmul_pointers(lt_key const& key, std::int32_t group, lt_spaced a, lt_spaced b, lt_spaced c,
                               void const* alpha, void const* beta) {
  if (!lt_pointer_batches().load(std::memory_order_relaxed)) return false;
  std::unique_ptr<lt_plan>& plan = lt_plan_for(key);
  if (!plan) return false;
  static memory::growing_size sizes;
  std::size_t const count = std::size_t(key.batch);
  memory::scratch_buffer<cuda> const arrays(sizes(3 * count * sizeof(void*)));
  void const** p = arrays.as<void const*>();
  unsigned const grid = unsigned(std::min<std::size_t>((count + 255) / 256, 1024));
  lt_fill_pointers<<<grid, 256, 0, current_cuda_stream()>>>(key.batch, group, a, b, c, p);
  REMAT_CUDA_CHECK(cudaGetLastError());
  cublasStatus_t const ran =
      lt_run(*plan, alpha, p, p + count, beta, const_cast<void*>(static_cast<void const*>(p + 2 * count)));
  if (ran == CUBLAS_STATUS_NOT_SUPPORTED || ran == CUBLAS_STATUS_INVALID_VALUE) {
    plan.reset();
    return false;
  }
  REMAT_NAMESPACE::detail::cublas_check(ran, "cublasLtMatmul (a pointer-array batch)");
  lt_pointer_products().fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Takes the products' workspace block once, so that the scratch allocator holds it before the
// first product that wants it (see lt_matmul).
inline void lt_hold_workspace() { memory::scratch_buffer<cuda> const held(lt_workspace_limit); }

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
#endif
