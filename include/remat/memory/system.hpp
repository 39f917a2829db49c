// Where the allocator gets memory from: aligned operator new on the host, cudaMalloc on the GPU
// (plain device memory, never managed memory). Also how much the device has.
#pragma once

#include "../device.hpp"
#include "../error.hpp"

#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#if REMAT_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace REMAT_NAMESPACE {

#if REMAT_HAS_CUDA
namespace detail {
inline void cuda_check(cudaError_t status, char const* call) {
  if (status != cudaSuccess)
    raise<cuda_error>(call, " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}
}  // namespace detail
#define REMAT_CUDA_CHECK(call) ::REMAT_NAMESPACE::detail::cuda_check((call), #call)
#endif

namespace memory {

template <class Device>
struct system;

template <>
struct system<host> {
  // Cache-line and vector friendly; also what BLAS kernels like.
  static constexpr std::size_t alignment = 64;
  // nullptr when the system has no memory left.
  static void* allocate(std::size_t bytes) noexcept {
    return ::operator new(bytes, std::align_val_t{alignment}, std::nothrow);
  }
  static void deallocate(void* p) noexcept { ::operator delete(p, std::align_val_t{alignment}); }
  static std::size_t capacity() noexcept { return std::numeric_limits<std::size_t>::max(); }
  static void copy_to_host(void* dst, void const* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  static void copy_from_host(void* dst, void const* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
};

#if REMAT_HAS_CUDA
template <>
struct system<cuda> {
  static constexpr std::size_t alignment = 256;
  static void* allocate(std::size_t bytes) noexcept {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error so the caller can recover
      return nullptr;
    }
    return p;
  }
  static void deallocate(void* p) noexcept { (void)cudaFree(p); }
  static std::size_t capacity() {
    std::size_t free_bytes = 0, total = 0;
    REMAT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return total;
  }
  static void copy_to_host(void* dst, void const* src, std::size_t bytes) {
    REMAT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  static void copy_from_host(void* dst, void const* src, std::size_t bytes) {
    REMAT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
};
#endif

}  // namespace memory
}  // namespace REMAT_NAMESPACE
