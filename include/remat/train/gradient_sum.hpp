// What keeps a model's gradients in host memory (train/gradient_offload.hpp) is made of: the sum
// on the host, with its copy for a pass that fails and zero_grad's zero written only when read
// (host_gradient_sum), and the copies of a span of the device's gradients into it through the
// optimizer's page-locked slots, started at one point and waited for at another (span_copier).
#pragma once

#include "../kernels/evaluate.hpp"
#include "../memory/backed_buffer.hpp"
#include "../memory/transfer_ring.hpp"
#include "../tensor/tensor.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <type_traits>
#include <utility>

namespace REMAT_NAMESPACE {
namespace detail {

// count values from `from` to `to`, host memory both, on the host's threads.
template <class T>
void copy_on_host(T* to, T const* from, std::size_t count) {
  if (count)
    evaluate(tensor_view<T, host>(to, index_t(count), 1), expr::to_expr(tensor_view<T const, host>(from, index_t(count), 1)));
}

// Where the spans' copies down run: on the host, nowhere (the "device" is host memory, read in
// place); on the GPU, a stream of their own, ordered after the backward that made each span, so
// that a span comes down while the device computes the next.
template <class Device>
struct copy_lane {
  template <class Ring>
  void follow_compute(Ring&) {}
  void synchronize() {}
};
#if REMAT_HAS_CUDA
template <>
struct copy_lane<cuda> {
  copy_lane() { REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&made, cudaEventDisableTiming)); }
  copy_lane(copy_lane const&) = delete;
  copy_lane& operator=(copy_lane const&) = delete;
  ~copy_lane() {
    try {
      stream.synchronize();
    } catch (...) {  // (a destructor may run after the context is gone)
    }
    if (made) (void)cudaEventDestroy(made);
  }
  // The ring's next copies down wait for what the current stream has been given so far.
  template <class Ring>
  void follow_compute(Ring& ring) {
    REMAT_CUDA_CHECK(cudaEventRecord(made, current_cuda_stream()));
    REMAT_CUDA_CHECK(cudaStreamWaitEvent(stream.get(), made, 0));
    ring.set_down_stream(stream.get());
  }
  void synchronize() { stream.synchronize(); }
  owned_cuda_stream stream{cudaStreamNonBlocking};
  cudaEvent_t made = nullptr;
};
#endif

// One span of the device's gradients at a time coming down into host memory through `ring`'s
// slots: start() issues its first chunks after the compute issued so far (on the GPU, on a stream
// of its own); finish() copies each chunk on as it lands while the next come down, and returns
// once all of it is on the host.
template <class Device, class T, class C>
class span_copier {
 public:
  using ring_type = transfer_ring<Device, T, C>;
  span_copier(ring_type& ring, offload_channel<Device> channel) : ring_(ring), channel_(channel) {}

  bool busy() const { return count_ > 0; }
  // count values from `src` (the device's) are bound for `dst` (the host's).
  void start(T const* src, T* dst, std::size_t count) {
    src_ = src;
    dst_ = dst;
    count_ = count;
    if (!count) return;
    ring_.begin(channel_);
    lane_.follow_compute(ring_);
    for (std::size_t c = 0; c < std::min(chunks(), ring_.slots()); ++c) issue(c);
  }
  // Waits for the span started last, a chunk at a time; the time waited is added to `waited`.
  void finish(std::chrono::steady_clock::duration& waited) {
    if (!count_) return;
    auto const t0 = std::chrono::steady_clock::now();
    std::size_t const chunk = chunk_size(), all = chunks();
    for (std::size_t c = 0; c < all; ++c) {
      ring_.wait_down(c);
      copy_on_host(dst_ + c * chunk, slot_[c % 2], std::min(chunk, count_ - c * chunk));
      if (c + ring_.slots() < all) issue(c + ring_.slots());
    }
    waited += std::chrono::steady_clock::now() - t0;
    count_ = 0;
  }
  // Waits for the copies in flight without using what they bring (a pass that failed).
  void abandon() {
    lane_.synchronize();
    count_ = 0;
  }

 private:
  std::size_t chunk_size() const { return std::max<std::size_t>(ring_.chunk(), 1); }
  std::size_t chunks() const { return (count_ + chunk_size() - 1) / chunk_size(); }
  void issue(std::size_t c) {
    std::size_t const chunk = chunk_size(), at = c * chunk;
    slot_[c % 2] = ring_.down(c, src_ + at, std::min(chunk, count_ - at));
  }

  ring_type& ring_;
  offload_channel<Device> channel_;
  copy_lane<Device> lane_;
  T const* src_ = nullptr;
  T* dst_ = nullptr;
  std::size_t count_ = 0;
  T const* slot_[2] = {nullptr, nullptr};  // where the chunks in flight land (the ring's, or in place)
};

// The sum of a model's gradients (or of a rank's shard of them) in host memory: zero after
// zero_grad, written with zeros only when read; before a pass that adds onto it, copied aside
// when the model's failure backup is on (model::set_failure_backup), so that a pass that fails
// leaves it as it was.
template <class T, class Device>
class host_gradient_sum {
 public:
  host_gradient_sum(std::size_t count, memory::caching_allocator<host>& a)
      : alloc_(a), sum_(index_t(std::max<std::size_t>(count, 1)), 1, memory::tag::gradients, a) {}

  // The sum (zeros written now when zero_grad left it zero).
  tensor<T, host>& read() {
    if (zero_ && !zeroed_) {
      evaluate(sum_, expr::to_expr(0.0));
      zeroed_ = true;
    }
    return sum_;
  }
  // Where a span's copy down lands (what it holds is replaced).
  T* data() { return sum_.data(); }
  // A pass starts; `backup`: the model's failure backup is on.
  void begin_pass(bool backup) {
    backed_ = !zero_ && backup;
    if (backed_) {
      if (!backup_.data()) backup_ = tensor<T, host>(index_t(sum_.size()), 1, memory::tag::gradients, alloc_);
      copy_on_host(backup_.data(), sum_.data(), sum_.size());
    }
    was_zero_ = zero_;
    restored_ = false;
  }
  // The pass ended: what it left is the sum, or (failed) the sum is as before it.
  void end_pass(bool failed) {
    if (!failed) {
      zero_ = zeroed_ = false;
      return;
    }
    if (was_zero_) {
      zero_ = true;
    } else if (backed_) {
      std::swap(sum_, backup_);
      restored_ = true;
    }
  }
  // zero_grad, or a failed pass's undoing (which keeps the sum end_pass restored).
  void clear() {
    if (!std::exchange(restored_, false)) {
      zero_ = true;
      zeroed_ = false;
    }
  }
  bool zero() const { return zero_; }
  // Before backward adds onto [lo, hi) at `device` (the device's): the sum goes there (nothing
  // when it is zero: the device's pages are).
  void fill(T* device, std::size_t lo, std::size_t hi) const {
    if (zero_ || lo >= hi) return;
    if constexpr (!std::is_same_v<Device, host>)
      memory::system<Device>::copy_from_host(device, sum_.data() + lo, (hi - lo) * sizeof(T));
    else
      copy_on_host(device, sum_.data() + lo, hi - lo);
  }
  // The sum becomes count values at `device` (the device's), now.
  void take_from(T const* device, std::size_t count) {
    if constexpr (!std::is_same_v<Device, host>)
      memory::system<Device>::copy_to_host(sum_.data(), device, count * sizeof(T));
    else
      copy_on_host(sum_.data(), device, count);
    zero_ = false;
  }
  // The sum goes to count values at `device` (zeros when it is zero), now.
  void give_to(T* device, std::size_t count) const {
    if (zero_) return detail::zero_device_bytes<Device>(device, count * sizeof(T));
    if constexpr (!std::is_same_v<Device, host>)
      memory::system<Device>::copy_from_host(device, sum_.data(), count * sizeof(T));
    else
      copy_on_host(device, sum_.data(), count);
  }

 private:
  memory::caching_allocator<host>& alloc_;
  tensor<T, host> sum_, backup_;
  bool zero_ = false;      // the sum is zero (zero_grad), whatever sum_ holds
  bool zeroed_ = false;    // sum_ has been written with zeros since
  bool was_zero_ = false;  // zero_ as the running pass started
  bool backed_ = false;    // the running pass took a copy of the sum
  bool restored_ = false;  // a failed pass restored the sum (the clear that follows keeps it)
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
