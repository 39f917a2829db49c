// The gradients of a model trained alone, kept in host memory as backward makes them
// (OffloadedAdamW's offload_options::gradients, ZeRO-Offload's placement of the gradients): the
// optimizer plugs this into the model as its gradient_sync. The model's gradient buffer moves into
// memory whose pages come and go (memory/backed_buffer.hpp: host pages, or on the GPU granules of
// virtual memory): before backward writes a span (down to the plan's next report) its pages are
// taken; at the report the span, final now, goes down into the host's sum through the optimizer's
// page-locked slots (memory/transfer_ring.hpp) and its pages are given back. The device holds the
// pages of one span at a time (plan: detail::offloaded_gradient_peak), the host one fp32 value per
// parameter.
//
// Bit for bit the gradients a model computes alone: a pass that adds onto a sum (accumulation)
// finds the span's sum on the device before backward writes it (copied up from the host), so the
// device adds exactly as it would have; the span that comes down replaces the host's. A pass that
// fails leaves the sum as it was: zero stays zero, and a sum is restored from a second host copy
// taken before the pass when the model's failure backup is on (model::set_failure_backup).
#pragma once

#include "../error.hpp"
#include "../kernels/evaluate.hpp"
#include "../memory/backed_buffer.hpp"
#include "../memory/transfer_ring.hpp"
#include "../pass/gradient_sync.hpp"
#include "../plan/activation.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <type_traits>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {
namespace detail {

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

template <class Model>
class gradient_offload final : public gradient_sync {
  using T = typename Model::value_type;
  using D = typename Model::device;
  using C = typename Model::compute_type;
  static constexpr bool on_gpu = !std::is_same_v<D, host>;
  static constexpr std::size_t n = Model::parameter_count > 0 ? Model::parameter_count : 1;  // (stored)

 public:
  using ring_type = transfer_ring<D, T, C>;

  // Moves m's gradient buffer into pages of its own and its values into a host sum from `a`;
  // the spans come down through `ring` (the optimizer's) on `channel`. Plugs itself in last.
  gradient_offload(Model& m, memory::caching_allocator<host>& a, ring_type& ring, offload_channel<D> channel)
      : m_(m), alloc_(a), ring_(ring), channel_(channel) {
    if constexpr (!on_gpu)
      if (!REMAT_HOST_PAGES)
        raise<argument_error>("OffloadedAdamW: offload_options::gradients gives back memory pages through Linux's "
                              "madvise; this system has none");
    sum_ = tensor<T, host>(index_t(n), 1, memory::tag::gradients, a);
    if constexpr (on_gpu) {
      pages_.place(static_cast<T const*>(nullptr), n, true);
      base_ = static_cast<T*>(pages_.device_data());
    } else {
      own_.allocate(n * sizeof(T), host_span(static_cast<T const*>(nullptr), 0, false).page,
                    "OffloadedAdamW's gradient buffer");
      base_ = own_.data;
      pages_.place(static_cast<T const*>(base_), n, true);
    }
    reports_ = gradient_reports<typename Model::net, typename Model::precision>();
    reports_.push_back(0);  // (the model's own, after backward)
    planned_ = offloaded_gradient_peak(reports_, n, sizeof(T), pages_.span.page);
    // (nothing below fails but the copies: the model's gradients become the host's sum)
    m.relocate_gradients(base_);
    m.allocator().release_cached();  // (the buffer it leaves goes back to the device)
    if constexpr (on_gpu)
      memory::system<D>::copy_to_host(sum_.data(), base_, n * sizeof(T));
    else
      copy(sum_.data(), base_, n);
    pages_.give_back(base_, 0, n);
    m.link().set_gradient_sync(this);
  }
  gradient_offload(gradient_offload const&) = delete;
  gradient_offload& operator=(gradient_offload const&) = delete;
  // Gives the model its gradients back: a buffer of its allocator, holding the sum.
  ~gradient_offload() {
    if (m_.link().gradient_sync() == this) m_.link().set_gradient_sync(nullptr);
    try {
      m_.relocate_gradients(nullptr);
      T* const g = m_.gradients().data();
      if (zero_)
        m_.zero_grad();
      else if constexpr (on_gpu)
        memory::system<D>::copy_from_host(g, sum_.data(), n * sizeof(T));
      else
        copy(g, sum_.data(), n);
    } catch (...) {  // (the model keeps pages it can still read: they are leaked, not unmapped)
      pages_.abandon_granules();
      own_.leak();
    }
  }

  // The host's sum of the gradients (zero after zero_grad, until a pass).
  tensor<T, host>& sum() {
    if (zero_ && !zeroed_) {
      evaluate(sum_, expr::to_expr(0.0));
      zeroed_ = true;
    }
    return sum_;
  }
  // The device's gradient pages: held now, held at most in the last pass that succeeded, and the
  // plan's most (bytes).
  std::size_t resident() const { return pages_.resident(); }
  std::size_t last_peak() const { return last_peak_; }
  std::size_t planned_peak() const { return planned_; }
  std::size_t page() const { return pages_.span.page; }

  void check_pass() const override {}
  // The pages of backward's first span are taken (and hold the sum when the pass adds onto one).
  void pass_starting() override {
    backed_ = !zero_ && m_.failure_backup();
    if (backed_) {  // (the sum, as before the pass, for a pass that fails)
      if (!backup_.data()) backup_ = tensor<T, host>(index_t(n), 1, memory::tag::gradients, alloc_);
      copy(backup_.data(), sum_.data(), n);
    }
    was_zero_ = zero_;
    restored_ = false;
    report_ = 0;
    prev_ = pending_ = n;
    pass_peak_ = 0;
    pass_wait_ = {};
    take(reports_.front(), n);
  }
  // The span from `offset` to the last report is final: its copy down into the host's sum starts
  // (on the GPU: on a stream of its own, while the device goes on with backward), and the span
  // before it, whose copy started at the last report, is waited for and its pages given back; the
  // next span's pages are taken. The last report (0) waits for every copy.
  void gradients_ready(std::size_t offset) override {
    pass_peak_ = std::max(pass_peak_, pages_.resident());
    if (offset < prev_) {
      finish_copy();
      start_copy(offset, prev_);
    }
    std::size_t next = 0;
    if (report_ < reports_.size() && reports_[report_] == offset) {
      ++report_;
      next = report_ < reports_.size() ? std::min(reports_[report_], offset) : 0;
    } else {
      report_ = reports_.size();  // (off the plan: everything below is taken from now on)
    }
    if (offset == 0)
      finish_copy();
    else
      take(next, offset);
  }
  // How long the last pass that succeeded waited at backward's reports for the spans' copies
  // down (seconds of the host's clock).
  double last_copy_wait() const { return last_wait_; }
  // A pass that failed leaves the sum as it was (zero, or restored from the copy); one that
  // succeeded leaves it in the host's sum.
  void pass_ended(std::exception_ptr failed) override {
    if (!failed) {
      last_peak_ = pass_peak_;
      last_wait_ = std::chrono::duration<double>(pass_wait_).count();
      zero_ = zeroed_ = false;
      return;
    }
    lane_.synchronize();  // (no copy reads the pages any more)
    prev_ = pending_ = 0;
    pages_.give_back(base_, 0, n);
    if (was_zero_) {
      zero_ = true;
    } else if (backed_) {
      std::swap(sum_, backup_);
      restored_ = true;
    }
    std::rethrow_exception(failed);
  }
  void zeroing_gradients() override {}
  // zero_grad: the device holds nothing; the host's sum reads zero (written when read).
  bool clear_gradients() override {
    pages_.give_back(base_, 0, n);
    if (!std::exchange(restored_, false)) {
      zero_ = true;
      zeroed_ = false;
    }
    return true;
  }
  param_range kept_gradients(std::size_t) const override { return {0, 0}; }  // (the device keeps none)
  param_range shard() const override { return {0, Model::parameter_count}; }
  bool gradients_elsewhere() const override { return true; }
  void finish() override {}
  double agree_squares(double local) override { return local; }
  void after_update(bool) override {}

 private:
  static void copy(T* to, T const* from, std::size_t count) {
    if (count)
      evaluate(tensor_view<T, host>(to, index_t(count), 1), expr::to_expr(tensor_view<T const, host>(from, index_t(count), 1)));
  }
  // The pages of [lo, hi) are taken before backward writes them; a pass adding onto a sum finds it
  // there.
  void take(std::size_t lo, std::size_t hi) {
    if (lo >= hi) return;
    pages_.commit(lo, hi);
    if (zero_) return;
    if constexpr (on_gpu)
      memory::system<D>::copy_from_host(base_ + lo, sum_.data() + lo, (hi - lo) * sizeof(T));
    else
      copy(base_ + lo, sum_.data() + lo, hi - lo);
  }
  // Elements [lo, hi), final now, start down: the first chunks into the ring's slots, after the
  // compute issued so far.
  void start_copy(std::size_t lo, std::size_t hi) {
    pending_ = prev_;
    prev_ = lo;
    ring_.begin(channel_);
    lane_.follow_compute(ring_);
    std::size_t const chunks = chunks_of(hi - lo);
    for (std::size_t c = 0; c < std::min(chunks, ring_.slots()); ++c) issue(c);
  }
  // The span in flight, [prev_, pending_), replaces the host's sum a chunk at a time (the next
  // chunks come down while this one is copied), and its pages are given back.
  void finish_copy() {
    if (pending_ <= prev_) return;
    auto const t0 = std::chrono::steady_clock::now();
    std::size_t const lo = prev_, count = pending_ - prev_, chunk = chunk_size(), chunks = chunks_of(count);
    for (std::size_t c = 0; c < chunks; ++c) {
      std::size_t const at = c * chunk;
      ring_.wait_down(c);
      copy(sum_.data() + lo + at, slot_[c % 2], std::min(chunk, count - at));
      if (c + ring_.slots() < chunks) issue(c + ring_.slots());
    }
    pass_wait_ += std::chrono::steady_clock::now() - t0;
    std::size_t const page_elements = pages_.span.page / sizeof(T);
    std::size_t const top = page_elements ? std::min(n, (pending_ + page_elements - 1) / page_elements * page_elements) : n;
    pages_.give_back(base_, lo, top);
    pending_ = prev_;
  }
  std::size_t chunk_size() const { return std::max<std::size_t>(ring_.chunk(), 1); }
  std::size_t chunks_of(std::size_t count) const { return (count + chunk_size() - 1) / chunk_size(); }
  // Chunk c of the span that starts down at prev_ (of those up to the last report).
  void issue(std::size_t c) {
    std::size_t const chunk = chunk_size(), at = c * chunk, count = pending_ - prev_;
    slot_[c % 2] = ring_.down(c, base_ + prev_ + at, std::min(chunk, count - at));
  }

  Model& m_;
  memory::caching_allocator<host>& alloc_;
  ring_type& ring_;
  offload_channel<D> channel_;
  page_buffer<D, T> own_;  // (the host: the buffer's pages, mapped apart from any allocator)
  backed_buffer<D> pages_;
  T* base_ = nullptr;
  tensor<T, host> sum_, backup_;
  std::vector<std::size_t> reports_;
  std::size_t report_ = 0;
  std::size_t prev_ = n;     // [prev_, n) is final in the running pass
  std::size_t pending_ = n;  // [prev_, pending_) is coming down (none when equal)
  T const* slot_[2] = {nullptr, nullptr};  // where the chunks in flight land (the ring's, or in place)
  copy_lane<D> lane_;
  std::chrono::steady_clock::duration pass_wait_{};
  double last_wait_ = 0;
  std::size_t planned_ = 0, pass_peak_ = 0, last_peak_ = 0;
  bool zero_ = false;      // the sum is zero (zero_grad), whatever sum_ holds
  bool zeroed_ = false;    // sum_ has been written with zeros since
  bool was_zero_ = false;  // zero_ as the running pass started
  bool backed_ = false;    // the running pass took a copy of the sum
  bool restored_ = false;  // a failed pass restored the sum (the model's clear_gradients keeps it)
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
