// Where the allocator gets memory from: aligned operator new on the host, cudaMalloc on the GPU
// (plain device memory, never managed memory). Also how much the device has.
#pragma once

#include "../cuda/runtime.hpp"
#include "../device.hpp"
#include "../error.hpp"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

namespace REMAT_NAMESPACE {
namespace memory {

template <class Device>
struct system;

// The host's memory: aligned operator new and delete, memcpy for copies.
template <>
struct system<host> {
  // Cache-line and vector friendly; also what BLAS kernels like.
  static constexpr std::size_t alignment = 64;
  // nullptr when the system has no memory left.
  static void* allocate(std::size_t bytes) noexcept {
    return ::operator new(bytes, std::align_val_t{alignment}, std::nothrow);
  }
  // Gives back what allocate returned.
  static void deallocate(void* p) noexcept { ::operator delete(p, std::align_val_t{alignment}); }
  // The memory there is (the host: no bound known; the allocator's limit is the caller's).
  static std::size_t capacity() noexcept { return std::numeric_limits<std::size_t>::max(); }
  // What an out-of-memory message adds about the device itself.
  static std::string describe() { return {}; }
  // bytes from the device's src to host memory at dst (here: memcpy).
  static void copy_to_host(void* dst, void const* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  // bytes from host memory at src to the device's dst (here: memcpy).
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
  // Copies on the current stream, after the work already issued to it; the host waits for them.
  // The device, and what cudaMemGetInfo says is free on it.
  static std::string describe() noexcept {
    try {
      int dev = 0;
      cudaDeviceProp prop{};
      std::size_t free_bytes = 0, total = 0;
      if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
          cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        return "  (the device could not be queried)\n";
      }
      char line[256];
      std::snprintf(line, sizeof line, "  device %d (%s): %.2f GiB free of %.2f GiB\n", dev, prop.name,
                    double(free_bytes) / 1073741824.0, double(total) / 1073741824.0);
      return line;
    } catch (...) {
      return {};
    }
  }
  // (cudaMemcpyDefault: a model's master weights may lie in host memory, model::master_on_host)
  static void copy_to_host(void* dst, void const* src, std::size_t bytes) {
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, current_cuda_stream()));
    synchronize_current_stream();
  }
  static void copy_from_host(void* dst, void const* src, std::size_t bytes) {
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, current_cuda_stream()));
    synchronize_current_stream();
  }
};
#endif

}  // namespace memory
}  // namespace REMAT_NAMESPACE
