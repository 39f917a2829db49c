// The CUDA runtime as remat uses it: every call's status checked and turned into a
// remat::cuda_error that names the call, the stream remat's work goes to on this thread, and the
// cuBLASLt handle. Compiled by nvcc only (REMAT_HAS_CUDA); a host-only build sees nothing here.
//
// Streams: every kernel, copy and product remat issues from a thread goes to that thread's current
// stream, so one pass is ordered without any host synchronisation. A model owns one stream and
// makes it current while it runs (cuda_stream_scope); outside a model the current stream is the
// legacy default stream. The model's stream is a blocking stream, so the caller's own work on the
// default stream stays ordered with it.
#pragma once

#include "../config.hpp"
#include "../error.hpp"

#if REMAT_HAS_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

namespace REMAT_NAMESPACE {
namespace detail {

inline void cuda_check(cudaError_t status, char const* call) {
  if (status != cudaSuccess)
    raise<cuda_error>(call, " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

inline void cublas_check(cublasStatus_t status, char const* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    raise<cuda_error>(call, " failed: ", cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status), ")");
}

}  // namespace detail
}  // namespace REMAT_NAMESPACE

#define REMAT_CUDA_CHECK(call) ::REMAT_NAMESPACE::detail::cuda_check((call), #call)
#define REMAT_CUBLAS_CHECK(call) ::REMAT_NAMESPACE::detail::cublas_check((call), #call)

namespace REMAT_NAMESPACE {
namespace detail {

inline cudaStream_t& current_stream_slot() {
  thread_local cudaStream_t s = nullptr;  // the legacy default stream
  return s;
}

}  // namespace detail

// The stream remat's work on this thread goes to.
inline cudaStream_t current_cuda_stream() { return detail::current_stream_slot(); }

// Makes `s` the current stream for the scope; the previous one comes back at its end.
class cuda_stream_scope {
 public:
  explicit cuda_stream_scope(cudaStream_t s) : previous_(detail::current_stream_slot()) {
    detail::current_stream_slot() = s;
  }
  ~cuda_stream_scope() { detail::current_stream_slot() = previous_; }
  cuda_stream_scope(cuda_stream_scope const&) = delete;
  cuda_stream_scope& operator=(cuda_stream_scope const&) = delete;

 private:
  cudaStream_t previous_;
};

// An owned stream (blocking: ordered with the legacy default stream), made on first use so that a
// model can be declared before the device is touched.
class owned_cuda_stream {
 public:
  owned_cuda_stream() = default;
  // cudaStreamDefault (ordered with the legacy default stream) or cudaStreamNonBlocking.
  explicit owned_cuda_stream(unsigned flags) : flags_(flags) {}
  owned_cuda_stream(owned_cuda_stream const&) = delete;
  owned_cuda_stream& operator=(owned_cuda_stream const&) = delete;
  owned_cuda_stream(owned_cuda_stream&& o) noexcept : s_(o.s_), flags_(o.flags_) { o.s_ = nullptr; }
  owned_cuda_stream& operator=(owned_cuda_stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = o.s_;
      flags_ = o.flags_;
      o.s_ = nullptr;
    }
    return *this;
  }
  ~owned_cuda_stream() { reset(); }
  cudaStream_t get() {
    if (!s_) REMAT_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, flags_));
    return s_;
  }
  // Waits for everything issued to the stream.
  void synchronize() {
    if (s_) REMAT_CUDA_CHECK(cudaStreamSynchronize(s_));
  }

 private:
  void reset() noexcept {
    if (s_) (void)cudaStreamDestroy(s_);  // (a destructor may run after the context is gone)
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
  unsigned flags_ = cudaStreamDefault;
};

// Waits for the current stream: the one host synchronisation a step needs (reading a result).
inline void synchronize_current_stream() { REMAT_CUDA_CHECK(cudaStreamSynchronize(current_cuda_stream())); }

namespace detail {

// One cuBLASLt handle per thread (a handle may be shared, but its heuristics cache is not worth
// the lock).
struct cublaslt_handle {
  cublasLtHandle_t h = nullptr;
  cublaslt_handle() { REMAT_CUBLAS_CHECK(cublasLtCreate(&h)); }
  ~cublaslt_handle() {
    if (h) (void)cublasLtDestroy(h);
  }
  cublaslt_handle(cublaslt_handle const&) = delete;
  cublaslt_handle& operator=(cublaslt_handle const&) = delete;
  static cublasLtHandle_t get() {
    thread_local cublaslt_handle handle;
    return handle.h;
  }
};

// Whether p is memory the device can use directly: device memory, managed memory, or host memory
// mapped for the device (pinned). Plain pageable host memory is not.
inline bool device_accessible(void const* p) {
  cudaPointerAttributes a{};
  cudaError_t const status = cudaPointerGetAttributes(&a, p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ||
         (a.type == cudaMemoryTypeHost && a.devicePointer != nullptr);
}

}  // namespace detail
}  // namespace REMAT_NAMESPACE
#endif
