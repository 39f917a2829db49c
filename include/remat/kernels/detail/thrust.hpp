// The one place Thrust is configured, and the host's thread split. Thrust runs the CUDA kernels
// only: host kernels are plain loops split across OpenMP threads (host_split below), which the
// compiler can vectorise. Without nvcc Thrust's device system is the serial CPP system, so a
// Thrust header included elsewhere never reaches for the CUDA runtime.
#pragma once

#include "../../config.hpp"

#if !REMAT_HAS_CUDA && !defined(THRUST_DEVICE_SYSTEM)
// Thrust's device system without nvcc: the serial CPP system.
#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#endif

#if defined(_OPENMP)
#include <omp.h>
#endif
#if REMAT_HAS_CUDA
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/transform.h>

#include "../../cuda/runtime.hpp"
#endif

#include <atomic>
#include <cstddef>
#include <exception>

namespace REMAT_NAMESPACE {
namespace kernels {
namespace detail {

// Below this many elements a pass runs on the calling thread: waking a thread team costs more
// than the work. Fixed, so that a reduction's order (and so its rounding) depends only on the
// size and the thread count.
inline constexpr std::size_t parallel_threshold = 32768;

// Runs run(first, last) over [0, n) items of `work` elements in all: split across the OpenMP
// threads in static chunks when that pays, on the calling thread otherwise.
template <class Run>
void host_split(std::size_t n, std::size_t work, Run const& run) {
#if defined(_OPENMP)
  if (work >= parallel_threshold && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      std::size_t const t = std::size_t(omp_get_thread_num()), threads = std::size_t(omp_get_num_threads());
      run(n * t / threads, n * (t + 1) / threads);
    }
    return;
  }
#else
  (void)work;
#endif
  run(0, n);
}

// host_split for a `run` that may throw (a product's scratch may fail to allocate): an exception
// may not leave an OpenMP thread, so the first one leaves its chunk and is thrown again here once
// every thread is done (the other chunks run to their end).
template <class Run>
void host_split_throwing(std::size_t n, std::size_t work, Run const& run) {
  std::exception_ptr failed;
  std::atomic<bool> taken{false};
  host_split(n, work, [&](std::size_t first, std::size_t last) {
    try {
      run(first, last);
    } catch (...) {
      if (!taken.exchange(true)) failed = std::current_exception();
    }
  });
  if (failed) std::rethrow_exception(failed);
}

// The threads a host kernel started here would run on (1 inside a parallel region: nested regions
// run serially).
inline std::size_t host_threads() {
#if defined(_OPENMP)
  return omp_in_parallel() ? 1 : std::size_t(omp_get_max_threads());
#else
  return 1;
#endif
}

#if REMAT_HAS_CUDA
// Kernels go to the current stream without a host synchronisation afterwards.
inline auto cuda_policy() { return thrust::cuda::par_nosync.on(current_cuda_stream()); }

using index_iterator = thrust::counting_iterator<std::size_t>;
#endif


}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
