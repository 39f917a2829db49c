// Row kernels on the GPU: one thread block per row, its threads striding the row (neighbouring
// threads read neighbouring addresses), sums combined by CUB's block reduction. What the norms use
// on CUDA instead of one thread per row. Compiled by nvcc only.
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

// Runs kernel(args...) with one block of row_threads per row on the current stream (a grid-stride
// loop over rows past the grid's limit); checks the launch.
template <class... P, class... A>
void launch_rows(void (*kernel)(P...), std::size_t rows, A... args) {
  if (rows == 0) return;
  unsigned const grid = unsigned(std::min<std::size_t>(rows, std::size_t(1) << 30));
  kernel<<<grid, row_threads, 0, current_cuda_stream()>>>(args...);
  REMAT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
#endif
