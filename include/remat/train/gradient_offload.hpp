// The gradients in host memory (OffloadedAdamW's offload_options::gradients, ZeRO-Offload's
// placement of them), for a model trained alone (gradient_offload: the optimizer plugs it into the
// model as its gradient_sync) and for a rank of a ZeRO-2 or ZeRO-3 data-parallel wrapper
// (shard_sink: the wrapper sends the rank's reduced shard to it).
//
// Alone: the model's gradient buffer moves into memory whose pages come and go
// (memory/backed_buffer.hpp: host pages, or on the GPU granules of virtual memory). Before
// backward writes a span (down to the plan's next report) its pages are taken; at the report the
// span, final now, starts down into the host's sum through the optimizer's page-locked slots (on
// the GPU on a stream of its own, while backward goes on), and the span before it is waited for
// and its pages given back. The device holds the pages of two spans at most (plan:
// detail::offloaded_gradient_peak), the host one value per parameter (train/gradient_sum.hpp).
//
// Bit for bit the gradients a model computes alone: a pass that adds onto a sum (accumulation)
// finds the span's sum on the device before backward writes it (copied up from the host), so the
// device adds exactly as it would have; the span that comes down replaces the host's. A pass that
// fails leaves the sum as it was: zero stays zero, and a sum is restored from a second host copy
// taken before the pass when the model's failure backup is on (model::set_failure_backup).
#pragma once

#include "../error.hpp"
#include "../memory/backed_buffer.hpp"
#include "../pass/gradient_sync.hpp"
#include "../plan/activation.hpp"
#include "gradient_sum.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace detail {

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
      : m_(m), sum_((check_pages(), n), a), copies_(ring, channel) {
    if constexpr (on_gpu) {
      pages_.place(static_cast<T const*>(nullptr), n, true);
      base_ = static_cast<T*>(pages_.device_data());
    } else {
      own_.allocate(n * sizeof(T), host_span(static_cast<T const*>(nullptr), 0, false).page,
                    "OffloadedAdamW's gradient buffer");
      base_ = own_.data;
      pages_.place(static_cast<T const*>(base_), n, true);
    }
    reports_.reports = gradient_reports<typename Model::net, typename Model::precision>();
    reports_.reports.push_back(0);  // (the model's own, after backward)
    planned_ = offloaded_gradient_peak(reports_.reports, n, sizeof(T), pages_.span.page);
    // (nothing below fails but the copies: the model's gradients become the host's sum)
    m.relocate_gradients(base_);  // (the buffer it leaves goes back to the device)
    sum_.take_from(base_, n);
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
      if (sum_.zero())
        m_.zero_grad();
      else
        sum_.give_to(m_.gradients().data(), n);
    } catch (...) {  // (the model keeps pages it can still read: they are leaked, not unmapped)
      pages_.abandon_granules();
      own_.leak();
    }
  }

  // The host's sum of the gradients (zero after zero_grad, until a pass).
  tensor<T, host>& sum() { return sum_.read(); }
  // The device's gradient pages: held now, held at most in the last pass that succeeded, and the
  // plan's most (bytes).
  std::size_t resident() const { return pages_.resident(); }
  std::size_t last_peak() const { return last_peak_; }
  std::size_t planned_peak() const { return planned_; }
  std::size_t page() const { return pages_.span.page; }
  // How long the last pass that succeeded waited at backward's reports for the spans' copies
  // down (seconds of the host's clock).
  double last_copy_wait() const { return last_wait_; }

  void check_pass() const override {}
  // The pages of backward's first span are taken (and hold the sum when the pass adds onto one).
  void pass_starting() override {
    sum_.begin_pass(m_.failure_backup());
    reports_.restart();
    prev_ = pending_ = n;
    pass_peak_ = 0;
    pass_wait_ = {};
    take(reports_.first(), n);
  }
  // The span from `offset` to the last report is final: its copy down into the host's sum starts
  // (on the GPU: on a stream of its own, while the device goes on with backward), and the span
  // before it, whose copy started at the last report, is waited for and its pages given back; the
  // next span's pages are taken. The last report (0) waits for every copy.
  void gradients_ready(std::size_t offset) override {
    pass_peak_ = std::max(pass_peak_, pages_.resident());
    if (offset < prev_) {
      finish_copy();
      pending_ = prev_;
      prev_ = offset;
      copies_.start(base_ + prev_, sum_.data() + prev_, pending_ - prev_);
    }
    std::size_t const next = reports_.next_after(offset);
    if (offset == 0)
      finish_copy();
    else
      take(next, offset);
  }
  // A pass that failed leaves the sum as it was (zero, or restored from the copy); one that
  // succeeded leaves it in the host's sum.
  void pass_ended(std::exception_ptr failed) override {
    if (!failed) {
      last_peak_ = pass_peak_;
      last_wait_ = std::chrono::duration<double>(pass_wait_).count();
      sum_.end_pass(false);
      return;
    }
    copies_.abandon();  // (no copy reads the pages any more)
    prev_ = pending_ = 0;
    pages_.give_back(base_, 0, n);
    sum_.end_pass(true);
    std::rethrow_exception(failed);
  }
  void zeroing_gradients() override {}
  // zero_grad: the device holds nothing; the host's sum reads zero (written when read).
  bool clear_gradients() override {
    pages_.give_back(base_, 0, n);
    sum_.clear();
    return true;
  }
  param_range kept_gradients(std::size_t) const override { return {0, 0}; }  // (the device keeps none)
  param_range shard() const override { return {0, Model::parameter_count}; }
  bool gradients_elsewhere() const override { return true; }
  void finish() override {}
  double agree_squares(double local) override { return local; }
  void after_update(bool) override {}

 private:
  static int check_pages() {
    if constexpr (!on_gpu)
      if (!REMAT_HOST_PAGES)
        raise<argument_error>("OffloadedAdamW: offload_options::gradients gives back memory pages through Linux's "
                              "madvise; this system has none");
    return 0;
  }
  // The pages of [lo, hi) are taken before backward writes them; a pass adding onto a sum finds it
  // there.
  void take(std::size_t lo, std::size_t hi) {
    if (lo >= hi) return;
    pages_.commit(lo, hi);
    sum_.fill(base_ + lo, lo, hi);
  }
  // The span in flight, [prev_, pending_), is waited for and its pages are given back.
  void finish_copy() {
    if (pending_ <= prev_) return;
    copies_.finish(pass_wait_);
    std::size_t const page_elements = pages_.span.page / sizeof(T);
    std::size_t const top = page_elements ? std::min(n, (pending_ + page_elements - 1) / page_elements * page_elements) : n;
    pages_.give_back(base_, prev_, top);
    pending_ = prev_;
  }

  Model& m_;
  page_buffer<D, T> own_;  // (the host: the buffer's pages, mapped apart from any allocator)
  backed_buffer<D> pages_;
  T* base_ = nullptr;
  host_gradient_sum<T, D> sum_;
  span_copier<D, T, C> copies_;
  report_cursor reports_;
  std::size_t prev_ = n;     // [prev_, n) is final in the running pass
  std::size_t pending_ = n;  // [prev_, pending_) is coming down (none when equal)
  std::chrono::steady_clock::duration pass_wait_{};
  double last_wait_ = 0;
  std::size_t planned_ = 0, pass_peak_ = 0, last_peak_ = 0;
};

// The same for a rank of a ZeRO-2 or ZeRO-3 data-parallel wrapper (parallel/gradient_shard.hpp),
// which owns the buffer's pages and tells this sink, in offsets within the rank's shard, when to
// fill the shard's part of a span with the sum before backward adds onto it, and when a part is
// reduced and final: it comes down into the host's sum (through the optimizer's slots), and the
// wrapper gives its pages back.
template <class Model>
class shard_sink final : public gradient_sink {
  using T = typename Model::value_type;
  using D = typename Model::device;
  using C = typename Model::compute_type;

 public:
  using ring_type = transfer_ring<D, T, C>;

  // Over the shard r of m's gradients (their values now become the sum), from `a`.
  shard_sink(Model& m, param_range r, memory::caching_allocator<host>& a, ring_type& ring, offload_channel<D> channel)
      : m_(m), r_(r), sum_(r.size(), a), copies_(ring, channel) {
    if (r.size()) sum_.take_from(base(), r.size());
  }
  shard_sink(shard_sink const&) = delete;
  shard_sink& operator=(shard_sink const&) = delete;

  tensor<T, host>& sum() { return sum_.read(); }  // (zero after zero_grad, until a pass)
  void pass_starting() override { sum_.begin_pass(m_.failure_backup()); }
  void fill(std::size_t lo, std::size_t hi) override { sum_.fill(base() + lo, lo, hi); }
  void reduced(std::size_t lo, std::size_t hi) override {
    if (lo >= hi) return;
    copies_.start(base() + lo, sum_.data() + lo, hi - lo);
    std::chrono::steady_clock::duration waited{};
    copies_.finish(waited);
  }
  void pass_ended(bool failed) override { sum_.end_pass(failed); }
  void clear() override { sum_.clear(); }

 private:
  T* base() const { return const_cast<T*>(std::as_const(m_).gradients().data()) + r_.begin; }

  Model& m_;
  param_range r_;
  host_gradient_sum<T, D> sum_;
  span_copier<D, T, C> copies_;
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE
