// Row kernels on the GPU: one thread block per row, its threads striding the row (neighbouring
// threads read neighbouring addresses), sums combined by CUB's block reduction; or, for shorter
// rows (attention's), one warp per row combined by shuffles. What the norms, the losses and the
// attention softmax use on CUDA instead of one thread per row. Compiled by nvcc only.
//
// The order of every sum depends on the shape alone (the block size is fixed), so results are
// reproducible run to run; it is not the host's order, so the two devices agree to rounding.
#pragma once

#include "../../config.hpp"

#if REMAT_HAS_CUDA
#include "../../cuda/runtime.hpp"
#include "../reduce.hpp"

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {
namespace detail {

inline constexpr int row_threads = 256;

// op folded over every thread's v, returned to all of them. Ends synchronised, so it can be
// called again at once.
template <class V, class Op>
__device__ V block_reduce(V v, Op op) {
  using reduce = cub::BlockReduce<V, row_threads>;
  __shared__ typename reduce::TempStorage storage;
  __shared__ V total;
  V const s = reduce(storage).Reduce(v, op);
  if (threadIdx.x == 0) total = s;
  __syncthreads();
  V const out = total;
  __syncthreads();
  return out;
}

template <class V>
__device__ V block_sum(V v) {
  return block_reduce(v, plus_op{});
}

// The prologue of every row kernel: each block takes rows blockIdx.x, + gridDim.x, ... (f(r) for
// each), and its threads stride a row's elements (for_block_row: f(i); block_row_sum, block_row_max: the sum or
// the maximum of f(i) over the row, returned to every thread; each thread adds its elements in
// order, so the result depends on the shape alone).
template <class F>
__device__ void for_block_rows(std::size_t rows, F const& f) {
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) f(r);
}
template <class F>
__device__ void for_block_row(std::size_t n, F const& f) {
  for (std::size_t i = threadIdx.x; i < n; i += row_threads) f(i);
}
template <class V, class F>
__device__ V block_row_sum(std::size_t n, F const& f) {
  V s = 0;
  for_block_row(n, [&](std::size_t i) { s += f(i); });
  return block_sum(s);
}
template <class V, class F>
__device__ V block_row_max(std::size_t n, V init, F const& f) {
  V m = init;
  for_block_row(n, [&](std::size_t i) {
    V const v = f(i);
    m = v > m ? v : m;
  });
  return block_reduce(m, max_op{});
}

// op folded over the 32 lanes of a warp, returned to every lane. A butterfly: at each level a
// lane and its partner combine the same two values (op commutes), so every lane ends with the same
// bits, and the order depends on nothing but the lane count.
template <class V, class Op>
__device__ V warp_reduce(V v, Op op) {
  for (int k = 16; k > 0; k /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, k));
  return v;
}

// Rows handled by one warp each: row_threads / 32 rows per block (for rows of up to a few thousand
// elements, where a block per row would leave most of its threads idle).
inline constexpr int warp_rows_per_block = row_threads / 32;

// The row of this warp in the first round, and the stride to its next row.
__device__ inline std::size_t first_warp_row() { return std::size_t(blockIdx.x) * warp_rows_per_block + threadIdx.x / 32; }
__device__ inline std::size_t warp_row_stride() { return std::size_t(gridDim.x) * warp_rows_per_block; }

// Runs kernel(args...) with one block of row_threads per row on the current stream (a grid-stride
// loop over rows past the grid's limit); checks the launch.
template <class... P, class... A>
void launch_rows(void (*kernel)(P...), std::size_t rows, A... args) {
  if (rows == 0) return;
  profile::timed<cuda> const timing(profile::work::rows);
  unsigned const grid = unsigned(std::min<std::size_t>(rows, std::size_t(1) << 30));
  kernel<<<grid, row_threads, 0, current_cuda_stream()>>>(args...);
  REMAT_CUDA_CHECK(cudaGetLastError());
}

// Runs kernel(args...) with one warp per row (a grid-stride loop over rows past the grid's limit).
template <class... P, class... A>
void launch_warp_rows(void (*kernel)(P...), std::size_t rows, A... args) {
  if (rows == 0) return;
  profile::timed<cuda> const timing(profile::work::rows);
  std::size_t const blocks = (rows + warp_rows_per_block - 1) / warp_rows_per_block;
  unsigned const grid = unsigned(std::min<std::size_t>(blocks, std::size_t(1) << 30));
  kernel<<<grid, row_threads, 0, current_cuda_stream()>>>(args...);
  REMAT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
#endif
