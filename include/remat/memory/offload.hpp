// Where Offloaded<S> (graph/policies.hpp) puts the activations it moves off the device, and how it
// copies them there and back.
//
// - The memory: for a GPU model, page-locked host memory (cudaHostAlloc), so that the copies run
//   asynchronously beside the compute; for a host model, plain host memory. Either way it comes
//   from its own caching allocator, so the device's activation account and the offloaded bytes are
//   counted apart (and the plan predicts both).
// - The copies: for a GPU model, cudaMemcpyAsync on a side stream of the model's, ordered with the
//   compute stream by events only (the host never waits); for a host model, memcpy.
//
// On the host backend the "device" already is host memory: there Offloaded saves nothing and costs
// a copy each way. It runs the same schedule so that its plan and its bit-for-bit promise are
// tested on every machine; a host model that needs the memory should recompute (Checkpointed).
#pragma once

#include "../cuda/runtime.hpp"
#include "../device.hpp"
#include "allocator.hpp"
#include "system.hpp"

#include <cstring>
#include <utility>

namespace REMAT_NAMESPACE {
namespace memory {

#if REMAT_HAS_CUDA
// Page-locked host memory: what the GPU copies to and from without staging.
struct pinned_host {
  static constexpr char const* name = "pinned host memory";
};

template <>
struct system<pinned_host> {
  static constexpr std::size_t alignment = 256;
  static void* allocate(std::size_t bytes) noexcept {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  static void deallocate(void* p) noexcept { (void)cudaFreeHost(p); }
  static std::string describe() { return {}; }
  static void copy_to_host(void* dst, void const* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  static void copy_from_host(void* dst, void const* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
};
#endif

// The memory that Offloaded<S> moves a Device's activations to.
template <class Device>
struct offload_space {
  using type = host;  // host memory, apart from the activations' allocator
};
#if REMAT_HAS_CUDA
template <>
struct offload_space<cuda> {
  using type = pinned_host;
};
#endif
// The memory that Offloaded<S> moves a Device's activations to: host, or pinned host for cuda.
template <class Device>
using offload_space_t = typename offload_space<Device>::type;

// An allocator of offload memory for the whole program (a model makes its own for its Offloaded
// segments unless given one): small page-locked results such as a loss read after the step.
template <class Device>
caching_allocator<offload_space_t<Device>>& default_offload_allocator() {
  static caching_allocator<offload_space_t<Device>> instance;
  return instance;
}

// One block of an allocator, given back when the handle goes (movable, unlike scratch_buffer).
template <class Space>
class held_block {
 public:
  held_block() = default;
  // `bytes` bytes of `a` holding `t` (out_of_memory as allocate's).
  held_block(caching_allocator<Space>& a, std::size_t bytes, tag t)
      : alloc_(&a), p_(a.allocate(bytes, t)), bytes_(bytes) {}
  // Takes o's block; o holds none.
  held_block(held_block&& o) noexcept
      : alloc_(std::exchange(o.alloc_, nullptr)), p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  // Gives its block back and takes o's; o holds none.
  held_block& operator=(held_block&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = std::exchange(o.alloc_, nullptr);
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  ~held_block() { reset(); }
  // Gives the block back now (if it holds one).
  void reset() noexcept {
    if (alloc_ && p_) alloc_->deallocate(p_);
    alloc_ = nullptr;
    p_ = nullptr;
  }
  void* get() const { return p_; }                          // the block (null: none)
  std::size_t bytes() const { return bytes_; }              // the bytes asked for
  explicit operator bool() const { return p_ != nullptr; }  // whether it holds a block

 private:
  caching_allocator<Space>* alloc_ = nullptr;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace memory

namespace detail {

// What a pass state needs to offload: the allocator of the offloaded bytes and, on the GPU, the
// side stream the copies run on (none: the current stream, in order with the compute). Blocks go
// back to the allocator as soon as their last copy is issued, so one allocator serves one stream of
// copies at a time.
template <class Device>
struct offload_channel {
  memory::caching_allocator<memory::offload_space_t<Device>>* space = &memory::default_offload_allocator<Device>();
};
#if REMAT_HAS_CUDA
template <>
struct offload_channel<cuda> {
  memory::caching_allocator<memory::pinned_host>* space = &memory::default_offload_allocator<cuda>();
  cudaStream_t side = nullptr;
};
#endif

// A group of copies, ordered against the compute (the current stream) by events: `begin` makes
// the copies wait for the compute issued so far, `end` marks where they finish, `wait` makes the
// compute wait for that mark. On the host the copies are memcpy and there is nothing to order.
// The destructor makes the compute wait for the mark too, so that memory the copies still read or
// write is not handed to new work when a pass is abandoned midway (an exception, a forward without
// its backward).
template <class Device>
struct copy_fence {
  void begin(offload_channel<Device> const&) {}
  void end() {}
  void wait() const {}
  static void to_host(void* dst, void const* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  static void to_device(void* dst, void const* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
};
#if REMAT_HAS_CUDA
template <>
struct copy_fence<cuda> {
  copy_fence() = default;
  copy_fence(copy_fence&& o) noexcept
      : done(std::exchange(o.done, nullptr)), compute(o.compute), side(o.side), open(std::exchange(o.open, false)) {}
  copy_fence& operator=(copy_fence&& o) noexcept {
    if (this != &o) {
      release();
      done = std::exchange(o.done, nullptr);
      compute = o.compute;
      side = o.side;
      open = std::exchange(o.open, false);
    }
    return *this;
  }
  ~copy_fence() { release(); }

  void begin(offload_channel<cuda> const& c) {
    compute = current_cuda_stream();
    side = c.side ? c.side : compute;
    if (side != compute) {
      cudaEvent_t issued = nullptr;
      REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
      cudaError_t const recorded = cudaEventRecord(issued, compute);
      cudaError_t const waited = recorded == cudaSuccess ? cudaStreamWaitEvent(side, issued, 0) : recorded;
      (void)cudaEventDestroy(issued);  // (released once the wait is satisfied)
      REMAT_CUDA_CHECK(waited);
      open = true;
    }
  }
  void to_host(void* dst, void const* src, std::size_t bytes) const {
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, side));
  }
  void to_device(void* dst, void const* src, std::size_t bytes) const {
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, side));
  }
  void end() {
    if (!open) return;  // in order with the compute already
    if (!done) REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    REMAT_CUDA_CHECK(cudaEventRecord(done, side));
    open = false;
  }
  void wait() const {
    if (done) REMAT_CUDA_CHECK(cudaStreamWaitEvent(compute, done, 0));
  }

 private:
  // (Copies begun and never ended, when an error cut the group short, are waited for too.)
  void release() noexcept {
    if (open && (done || cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess))
      (void)cudaEventRecord(done, side);
    open = false;
    if (!done) return;
    (void)cudaStreamWaitEvent(compute, done, 0);
    (void)cudaEventDestroy(done);
    done = nullptr;
  }
  cudaEvent_t done = nullptr;
  cudaStream_t compute = nullptr;
  cudaStream_t side = nullptr;
  bool open = false;  // copies issued since begin, not yet marked by end
};
#endif

}  // namespace detail
}  // namespace REMAT_NAMESPACE
