// Row-wise building blocks: run f(i) for every index on the device's threads, and column sums
// (the gradient of a bias broadcast over rows), accumulated in the compute type. A kernel written
// once for both devices takes `device_tag D` and passes `[=] REMAT_LAMBDA(std::size_t i) {...}` to
// for_each_index: OpenMP threads on the host, one GPU thread per index on CUDA. A kernel that has
// GPU kernels of its own returns after them for cuda and passes host{} to the for_each_index of
// its host loop, so that nvcc compiles no device copy of that loop that nothing would launch.
#pragma once

#include "../device.hpp"
#include "../memory/allocator.hpp"
#include "../numeric/compute.hpp"
#include "detail/thrust.hpp"
#include "profile.hpp"

#if REMAT_HAS_CUDA
#include <thrust/for_each.h>
#endif

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

template <class D>
concept device_tag = is_device_v<D>;

// How many columns one task of a column-wise sum owns: a cache-friendly block on the host, one
// column per thread on the GPU (neighbouring threads then read neighbouring addresses).
template <class D>
inline constexpr std::size_t column_block = std::is_same_v<D, host> ? 64 : 1;

namespace detail {
// Iterations are independent (threads run them in any order), which ivdep tells the vectoriser, so
// it need not prove that the body's pointers do not overlap.
// f is copied first: a local copy's captures are values the compiler can keep in registers, while
// captures read through a reference might be overwritten by the body's stores as far as it knows,
// which stops the body's loops from vectorising (a causal softmax row went 2.6x faster).
template <class F>
REMAT_HOST_CLONES void host_for_each(std::size_t first, std::size_t last, F const& f) {
  F const body = f;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
  for (std::size_t i = first; i < last; ++i) body(i);
}

// The sum of f(c) for c in [0, n) within one row (a row kernel's body): 16 lanes, lane l taking
// c = l, l + 16, ... over whole groups of 16 and the tail in order, then the lanes added in order.
// The order of every addition depends on n alone, and the loop vectorises (a plain running sum is
// a chain the compiler may not reorder). f may write as it goes (it is called once per c).
template <class V, class F>
REMAT_HOST_DEVICE V row_sum(std::size_t n, F&& f) {
  constexpr std::size_t lanes = 16;
  V lane[lanes];
  for (std::size_t l = 0; l < lanes; ++l) lane[l] = V(0);
  std::size_t c = 0;
  for (; c + lanes <= n; c += lanes)
    for (std::size_t l = 0; l < lanes; ++l) lane[l] += f(c + l);
  for (std::size_t l = 0; c < n; ++c, ++l) lane[l] += f(c);
  V s = lane[0];
  for (std::size_t l = 1; l < lanes; ++l) s += lane[l];
  return s;
}

// Two values of one column, for row_sum_pair.
template <class V>
struct value_pair {
  V a;  // the first value
  V b;  // the second value
};

// The two sums row_sum would give of f(c).a and of f(c).b, in one loop over the row (f called once
// per c): the same lanes and order, so the same bits as two calls of row_sum.
template <class V, class F>
REMAT_HOST_DEVICE value_pair<V> row_sum_pair(std::size_t n, F&& f) {
  constexpr std::size_t lanes = 16;
  V la[lanes], lb[lanes];
  for (std::size_t l = 0; l < lanes; ++l) la[l] = lb[l] = V(0);
  std::size_t c = 0;
  for (; c + lanes <= n; c += lanes)
    for (std::size_t l = 0; l < lanes; ++l) {
      value_pair<V> const v = f(c + l);
      la[l] += v.a;
      lb[l] += v.b;
    }
  for (std::size_t l = 0; c < n; ++c, ++l) {
    value_pair<V> const v = f(c);
    la[l] += v.a;
    lb[l] += v.b;
  }
  value_pair<V> s{la[0], lb[0]};
  for (std::size_t l = 1; l < lanes; ++l) {
    s.a += la[l];
    s.b += lb[l];
  }
  return s;
}

// b where b > a, else a, without a branch for float (GCC keeps a floating-point `?:` as a branch
// under -ftrapping-math, which stops vectorisation).
template <class V>
REMAT_HOST_DEVICE V larger(V a, V b) {
  if constexpr (std::is_same_v<V, float>) {
    std::uint32_t const m = 0u - std::uint32_t(b > a);
    return std::bit_cast<float>((std::bit_cast<std::uint32_t>(b) & m) | (std::bit_cast<std::uint32_t>(a) & ~m));
  } else {
    return b > a ? b : a;
  }
}

// The largest f(c) for c in [0, n), n >= 1, in 16 lanes as row_sum (a NaN is skipped unless f(0)
// is one). With GCC on the host, float's lanes are one vector (GCC's vector extension) updated by
// a vector `b > a ? b : a`, the same comparison and choice as `larger` lane by lane, so the same
// value: GCC leaves the lanes of `larger`'s bit choice scalar, and the causal softmax row spent
// more time in its maximum than in its exponentials (1.9 against 0.8 ms for 64 x 256 rows; 0.5 ms
// as one vector). nvcc's and clang's host passes keep the lanes as an array.
template <class V, class F>
REMAT_HOST_DEVICE V row_max(std::size_t n, F&& f) {
  constexpr std::size_t lanes = 16;
  V const first = f(0);
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
  using lane_vector = std::conditional_t<std::is_same_v<V, float>, float __attribute__((vector_size(64))), V[lanes]>;
#else
  using lane_vector = V[lanes];
#endif
  lane_vector lane;
  for (std::size_t l = 0; l < lanes; ++l) lane[l] = first;
  std::size_t c = 0;
  for (; c + lanes <= n; c += lanes) {
    if constexpr (std::is_array_v<lane_vector>) {
      for (std::size_t l = 0; l < lanes; ++l) lane[l] = larger(lane[l], f(c + l));
    } else {
      lane_vector x;
      for (std::size_t l = 0; l < lanes; ++l) x[l] = f(c + l);
      lane = x > lane ? x : lane;
    }
  }
  for (std::size_t l = 0; c < n; ++c, ++l) lane[l] = larger(V(lane[l]), f(c));
  V m = lane[0];
  for (std::size_t l = 1; l < lanes; ++l) m = larger(m, V(lane[l]));
  return m;
}
}  // namespace detail

// f(i) for i in [0, n); `work` is the number of elements touched in all, to decide on threads.
// Host: a plain loop in static chunks per OpenMP thread, compiled for AVX2 and AVX-512 beside the
// baseline (REMAT_HOST_CLONES), so a body that vectorises does (the optimizers, row kernels).
template <class F>
void for_each_index(host, std::size_t n, std::size_t work, F const& f) {
  if (n == 0) return;
  profile::timed<host> const timing(profile::work::rows);
  detail::host_split(n, work, [&](std::size_t first, std::size_t last) { detail::host_for_each(first, last, f); });
}

#if REMAT_HAS_CUDA
template <class F>
void for_each_index(cuda, std::size_t n, std::size_t, F const& f) {
  if (n == 0) return;
  profile::timed<cuda> const timing(profile::work::rows);
  detail::index_iterator first(0);
  thrust::for_each(detail::cuda_policy(), first, first + n, f);
}
#endif

// out[c] = beta * out[c] + sum_r x[r, c] for a row-major rows x cols matrix. Each column's sum
// runs over rows in order, so the result does not depend on the thread count.
template <class T, class Out>
void column_sums(host, T const* x, std::size_t rows, std::size_t cols, Out* out, bool accumulate) {
  profile::timed<host> const timing(profile::work::reduction);
  using V = compute_type_t<T>;
  constexpr std::size_t block = 64;  // columns per task: contiguous in each row
  std::size_t const blocks = (cols + block - 1) / block;
  for_each_index(host{}, blocks, rows * cols, [=] REMAT_HOST_LAMBDA(std::size_t b) {
    std::size_t const c0 = b * block, c1 = std::min(cols, c0 + block);
    V acc[block];
    for (std::size_t c = c0; c < c1; ++c) acc[c - c0] = accumulate ? to_compute<V>(out[c]) : V(0);
    for (std::size_t r = 0; r < rows; ++r) {
      T const* row = x + r * cols;
      for (std::size_t c = c0; c < c1; ++c) acc[c - c0] += to_compute<V>(row[c]);
    }
    for (std::size_t c = c0; c < c1; ++c) out[c] = from_compute<Out>(acc[c - c0]);
  });
}

#if REMAT_HAS_CUDA
namespace detail {

inline constexpr std::size_t column_chunk = 256;  // rows per partial sum of column_sums_of on the GPU

// column_sums_of's first stage: block (x, y) sums rows [y * 256, + 256) of columns [x * 32, + 32)
// into part[y * cols + column]. Its 8 warps take 32 rows each, a lane a column (neighbouring lanes
// read neighbouring addresses; a lane's 32 reads do not wait for one another), and warp 0 adds
// the 8 partial sums in order. (One thread per chunk and column, as before, summed its 256 rows
// one after another with 1/8 of the threads: the bias gradients were a sixth of a GPT step on an
// H100, 2026-11-26.)
template <class V, class F>
__global__ void __launch_bounds__(256)
    column_chunk_sums(std::size_t rows, std::size_t cols, std::size_t chunks, F f, V* part) {
  constexpr unsigned warps = 8, per_warp = 32;
  __shared__ V partial[warps][32];
  unsigned const lane = threadIdx.x % 32, w = threadIdx.x / 32;
  std::size_t const c = std::size_t(blockIdx.x) * 32 + lane;
  for (std::size_t k = blockIdx.y; k < chunks; k += gridDim.y) {
    std::size_t const r0 = k * column_chunk + w * per_warp;
    V acc = 0;
    if (c < cols) {
      if (r0 + per_warp <= rows) {
#pragma unroll
        for (unsigned j = 0; j < per_warp; ++j) acc += f(r0 + j, c);
      } else {
        for (std::size_t r = r0; r < rows; ++r) acc += f(r, c);
      }
    }
    partial[w][lane] = acc;
    __syncthreads();
    if (w == 0 && c < cols) {
      V s = partial[0][lane];
      for (unsigned j = 1; j < warps; ++j) s += partial[j][lane];
      part[k * cols + c] = s;
    }
    __syncthreads();
  }
}

}  // namespace detail

// out[c] = (accumulate ? out[c] : 0) + sum_r f(r, c) on the GPU: the rows are cut into chunks of
// 256, each summed by a block (detail::column_chunk_sums), then one thread per column adds the
// chunks in order. The order depends on the shape only. (Bias and norm parameter gradients.)
template <class Out, class F>
void column_sums_of(cuda, std::size_t rows, std::size_t cols, F const& f, Out* out, bool accumulate) {
  profile::timed<cuda> const timing(profile::work::reduction);
  using V = std::remove_cv_t<decltype(f(std::size_t{}, std::size_t{}))>;
  std::size_t const chunks = (rows + detail::column_chunk - 1) / detail::column_chunk;
  if (cols == 0) return;
  memory::scratch_buffer<cuda> partial(chunks * cols * sizeof(V));
  V* const part = partial.as<V>();
  if (chunks > 0) {
    dim3 const grid(unsigned((cols + 31) / 32), unsigned(std::min<std::size_t>(chunks, 65535)));
    detail::column_chunk_sums<V><<<grid, 256, 0, current_cuda_stream()>>>(rows, cols, chunks, f, part);
    REMAT_CUDA_CHECK(cudaGetLastError());
  }
  for_each_index(cuda{}, cols, chunks * cols, [=] REMAT_LAMBDA(std::size_t c) {
    V acc = accumulate ? to_compute<V>(out[c]) : V(0);
    for (std::size_t k = 0; k < chunks; ++k) acc += part[k * cols + c];
    out[c] = from_compute<Out>(acc);
  });
}

template <class T, class Out>
void column_sums(cuda, T const* x, std::size_t rows, std::size_t cols, Out* out, bool accumulate) {
  using V = compute_type_t<T>;
  column_sums_of(
      cuda{}, rows, cols, [=] REMAT_LAMBDA(std::size_t r, std::size_t c) { return to_compute<V>(x[r * cols + c]); },
      out, accumulate);
}
#endif

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
