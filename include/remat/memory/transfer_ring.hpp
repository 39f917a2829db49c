// The page-locked buffers an offloaded optimizer's step streams a GPU model's values through, a
// chunk at a time (train/offloaded_adamw.hpp): the gradients come down into one slot while the
// host updates the chunk in the other, and the new compute weights go up from a slot of their own
// while the host updates the next chunk. Two slots of each kind at most, whatever the model's
// size: the host holds no whole copy of the gradients or of the compute weights, and only these
// buffers are page-locked.
//
// For a host model the "device" is host memory: a chunk is read and written where it is, and the
// ring holds nothing.
#pragma once

#include "../cuda/runtime.hpp"
#include "../device.hpp"
#include "offload.hpp"

#include <algorithm>
#include <array>
#include <cstddef>

namespace REMAT_NAMESPACE {
namespace detail {

// Chunks of `chunk` values of a range of n (0: all at once). G: a gradient; C: a compute weight.
template <class Device, class G, class C>
class transfer_ring {
 public:
  transfer_ring() = default;
  transfer_ring(memory::caching_allocator<memory::offload_space_t<Device>>&, std::size_t n, std::size_t chunk, bool)
      : len_(chunk && chunk < n ? chunk : n) {}
  std::size_t chunk() const { return len_; }  // the values of a chunk (the last may hold fewer)
  std::size_t slots() const { return 1; }     // chunks in flight at once (here: read in place)
  void begin(offload_channel<Device> const&) {}
  // Chunk k's gradients, from `src` on the device: where the host reads them.
  G const* down(std::size_t, G const* src, std::size_t) { return src; }
  void wait_down(std::size_t) {}
  // Where the host writes chunk k's compute weights, bound for `dst` on the device.
  C* up_buffer(std::size_t, C* dst) { return dst; }
  void up(std::size_t, C*, std::size_t) {}
  // Makes the compute wait for the copies up (on the GPU; nothing here).
  void end() {}

 private:
  std::size_t len_ = 0;
};

#if REMAT_HAS_CUDA
template <class G, class C>
class transfer_ring<cuda, G, C> {
 public:
  transfer_ring() = default;
  // Two slots of `chunk` values each (one when a chunk holds all n) for the gradients and, with
  // `compute`, for the compute weights, from `a` (tags gradients and optimizer_state).
  transfer_ring(memory::caching_allocator<memory::pinned_host>& a, std::size_t n, std::size_t chunk, bool compute)
      : len_(chunk && chunk < n ? chunk : n), slots_(len_ < n ? 2 : 1) {
    if (n == 0) return;
    for (std::size_t s = 0; s < slots_; ++s) {
      g_[s] = memory::held_block<memory::pinned_host>(a, len_ * sizeof(G), memory::tag::gradients);
      if (compute) c_[s] = memory::held_block<memory::pinned_host>(a, len_ * sizeof(C), memory::tag::optimizer_state);
      REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&down_[s], cudaEventDisableTiming));
      REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&up_[s], cudaEventDisableTiming));
    }
  }
  transfer_ring(transfer_ring&& o) noexcept { swap(o); }
  transfer_ring& operator=(transfer_ring&& o) noexcept {
    transfer_ring moved(std::move(o));
    swap(moved);
    return *this;
  }
  transfer_ring(transfer_ring const&) = delete;
  transfer_ring& operator=(transfer_ring const&) = delete;
  // (copies still reading or writing the slots finish before the slots go)
  ~transfer_ring() {
    for (std::size_t s = 0; s < 2; ++s) {
      if (down_[s]) (void)cudaEventSynchronize(down_[s]), (void)cudaEventDestroy(down_[s]);
      if (up_[s]) (void)cudaEventSynchronize(up_[s]), (void)cudaEventDestroy(up_[s]);
    }
  }

  std::size_t chunk() const { return len_; }
  std::size_t slots() const { return slots_; }  // chunks in flight at once
  // A step's copies begin: down on the compute stream (after the backward that made the
  // gradients), up on the channel's side stream once the compute issued so far is done.
  void begin(offload_channel<cuda> const& c) {
    compute_ = from_ = current_cuda_stream();
    side_ = c.side ? c.side : compute_;
    if (side_ == compute_) return;
    cudaEvent_t issued = nullptr;
    REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
    cudaError_t const recorded = cudaEventRecord(issued, compute_);
    cudaError_t const waited = recorded == cudaSuccess ? cudaStreamWaitEvent(side_, issued, 0) : recorded;
    (void)cudaEventDestroy(issued);
    REMAT_CUDA_CHECK(waited);
  }
  // Issues chunk k's copy down from `src` (count values) into its slot; the slot's last reader,
  // chunk k - 2's update, ran on the host before this call.
  G const* down(std::size_t k, G const* src, std::size_t count) {
    std::size_t const s = k % slots_;
    G* const to = static_cast<G*>(g_[s].get());
    REMAT_CUDA_CHECK(cudaMemcpyAsync(to, src, count * sizeof(G), cudaMemcpyDeviceToHost, from_));
    REMAT_CUDA_CHECK(cudaEventRecord(down_[s], from_));
    return to;
  }
  void wait_down(std::size_t k) { REMAT_CUDA_CHECK(cudaEventSynchronize(down_[k % slots_])); }
  // The copies down go on stream s from here on (until the next begin), which the caller has
  // ordered after the compute that made the values.
  void set_down_stream(cudaStream_t s) { from_ = s; }
  // Chunk k's slot for the compute weights, once its last copy up (chunk k - 2's) has left it.
  C* up_buffer(std::size_t k, C*) {
    std::size_t const s = k % slots_;
    if (up_used_[s]) REMAT_CUDA_CHECK(cudaEventSynchronize(up_[s]));
    up_used_[s] = false;
    return static_cast<C*>(c_[s].get());
  }
  void up(std::size_t k, C* dst, std::size_t count) {
    std::size_t const s = k % slots_;
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, c_[s].get(), count * sizeof(C), cudaMemcpyHostToDevice, side_));
    REMAT_CUDA_CHECK(cudaEventRecord(up_[s], side_));
    up_used_[s] = true;
    last_ = s;
    any_up_ = true;
  }
  // The compute stream waits for the last copy up (the next forward reads the weights).
  void end() {
    if (any_up_ && side_ != compute_) REMAT_CUDA_CHECK(cudaStreamWaitEvent(compute_, up_[last_], 0));
    any_up_ = false;
  }

 private:
  void swap(transfer_ring& o) noexcept {
    std::swap(len_, o.len_);
    std::swap(slots_, o.slots_);
    std::swap(g_, o.g_);
    std::swap(c_, o.c_);
    std::swap(down_, o.down_);
    std::swap(up_, o.up_);
    std::swap(up_used_, o.up_used_);
    std::swap(compute_, o.compute_);
    std::swap(side_, o.side_);
    std::swap(from_, o.from_);
  }

  std::size_t len_ = 0, slots_ = 1;
  std::array<memory::held_block<memory::pinned_host>, 2> g_{}, c_{};
  std::array<cudaEvent_t, 2> down_{}, up_{};
  std::array<bool, 2> up_used_{};
  cudaStream_t compute_ = nullptr, side_ = nullptr, from_ = nullptr;
  std::size_t last_ = 0;
  bool any_up_ = false;
};
#endif

}  // namespace detail
}  // namespace REMAT_NAMESPACE
