// Reductions of f(i) over i in [0, n): sums and maxima of fused expressions without writing the
// expression out. Host: Thrust transform_reduce per fixed-size chunk, chunks on OpenMP threads;
// CUDA: CUB's device reduction on the current stream, its temporary storage in the allocator's
// workspace; the result is read back (the host waits for it).
#pragma once

#include "../device.hpp"
#include "../memory/allocator.hpp"
#include "detail/thrust.hpp"

#if REMAT_HAS_CUDA
#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/transform_iterator.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace REMAT_NAMESPACE {
namespace kernels {

struct plus_op {
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    return a + b;
  }
};

// The larger of two values; NaN wins, so a NaN anywhere makes the maximum NaN.
struct max_op {
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? b : a;
  }
};

// `init` must be the identity of `op` (0 for a sum, -inf for a maximum): each chunk starts from it.
// The host splits [0, n) into fixed chunks of parallel_threshold elements, reduces each with
// Thrust's serial system (on as many OpenMP threads as there are) and folds the partial results
// in order, so the result depends on n alone, not on the thread count, and no temporary storage is
// allocated behind the allocator's back.
template <class Acc, class F, class Op>
Acc transform_reduce(host, std::size_t n, F const& f, Acc init, Op op) {
  constexpr std::size_t chunk = detail::parallel_threshold;
  detail::index_iterator const first(0);
  if (n <= chunk) return thrust::transform_reduce(thrust::cpp::par, first, first + n, f, init, op);
  std::int64_t const chunks = std::int64_t((n + chunk - 1) / chunk);
  std::vector<Acc> partial(std::size_t(chunks), init);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::size_t const lo = std::size_t(c) * chunk, hi = std::min(n, lo + chunk);
    partial[std::size_t(c)] = thrust::transform_reduce(thrust::cpp::par, first + lo, first + hi, f, init, op);
  }
  Acc result = init;
  for (Acc const& p : partial) result = op(result, p);
  return result;
}

#if REMAT_HAS_CUDA
template <class Acc, class F, class Op>
Acc transform_reduce(cuda, std::size_t n, F const& f, Acc init, Op op) {
  if (n == 0) return init;
  auto const first = thrust::make_transform_iterator(detail::index_iterator(0), f);
  cudaStream_t const stream = current_cuda_stream();
  std::size_t temp_bytes = 0;
  REMAT_CUDA_CHECK(cub::DeviceReduce::Reduce(nullptr, temp_bytes, first, static_cast<Acc*>(nullptr), n, op, init,
                                             stream));
  std::size_t const result_offset = (temp_bytes + alignof(Acc) - 1) / alignof(Acc) * alignof(Acc);
  memory::scratch_buffer<cuda> scratch(result_offset + sizeof(Acc));
  Acc* result = reinterpret_cast<Acc*>(scratch.as<unsigned char>() + result_offset);
  REMAT_CUDA_CHECK(cub::DeviceReduce::Reduce(scratch.get(), temp_bytes, first, result, n, op, init, stream));
  Acc out = init;
  REMAT_CUDA_CHECK(cudaMemcpyAsync(&out, result, sizeof(Acc), cudaMemcpyDeviceToHost, stream));
  synchronize_current_stream();
  return out;
}
#endif

struct min_op {
  template <class T>
  REMAT_HOST_DEVICE T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};

// The first i in [0, n) with v[i] outside [lo, hi), or n when there is none: the check of token
// ids and class labels, on the device that holds them.
template <class D>
std::size_t first_out_of_range(D, std::int32_t const* v, std::size_t n, std::int64_t lo, std::int64_t hi) {
  auto const outside = [=] REMAT_LAMBDA(std::size_t i) -> std::size_t {
    return (std::int64_t(v[i]) < lo || std::int64_t(v[i]) >= hi) ? i : n;
  };
  return transform_reduce(D{}, n, outside, n, min_op{});
}

// One element of device memory, read on the host.
template <class D, class T>
T read_element(D, T const* p) {
  T out{};
  memory::system<D>::copy_to_host(&out, p, sizeof(T));
  return out;
}

}  // namespace kernels

// Device memory where a GPU model expects it; host memory is refused with what was found.
template <class D>
void require_device_memory(void const* p, char const* what) {
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>)
    if (p && !detail::device_accessible(p))
      detail::raise<argument_error>(what, ": expected memory on the cuda device, found host memory (copy it with "
                                          "tensor::copy_from or tensor_from_host first)");
#endif
  (void)p, (void)what;
}

}  // namespace REMAT_NAMESPACE
