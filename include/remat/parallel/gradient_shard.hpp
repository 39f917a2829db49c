// ZeRO-2 (options::shard_gradients): a rank keeps the gradients of its shard only. At each of
// backward's reports it waits for the buckets started at earlier ones and gives back the memory of
// their gradients it does not own (memory/backed_buffer.hpp: host pages, or on the GPU granules the
// gradient buffer moves into), and before backward writes the next span (down to the plan's next
// report) it takes that span's memory back. The most a pass holds is planned from the model's plan
// walk and measured at every report.
#pragma once

#include "../memory/backed_buffer.hpp"
#include "../pass/gradient_sync.hpp"
#include "../plan/activation.hpp"
#include "buckets.hpp"
#include "state.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

template <class Model, class Transport>
class gradient_shard {
 public:
  explicit gradient_shard(dp_state<Model, Transport>& s) : s_(s) {}

  // The buffer's pages, and the plan of the most a pass holds at once: backward's reports (where
  // its gradients become final: the model's plan walk) replayed through the wrapper's rules.
  void plan(gradient_buckets<Model, Transport> const& buckets) {
    bool const sharded = s_.opts.shard_gradients;
    grads_.place(s_.gradient_base(), n, sharded);
    // (the GPU: the gradient buffer moves into the granules, which come and go as host pages do)
    if constexpr (on_gpu)
      if (sharded) s_.model.relocate_gradients(static_cast<T*>(grads_.device_data()));
    plan_peak(buckets);
  }

  // This rank's reduced gradients go to `k` from now on (null: they stay in the buffer, its
  // shard's pages held): OffloadedAdamW's gradients on the host. Attached, the shard's gradients
  // come down as their reductions end and its pages are given back as the others' are; detached,
  // the shard is filled with the sink's sum first.
  void set_sink(REMAT_NAMESPACE::detail::gradient_sink* k, gradient_buckets<Model, Transport> const& buckets) {
    param_range const s = s_.shard();
    if (!k && sink_ && s.size()) {
      grads_.commit(s.begin, s.end);
      sink_->fill(0, s.size());
    }
    sink_ = k;
    if (k) release_from(0);
    plan_peak(buckets);
  }
  REMAT_NAMESPACE::detail::gradient_sink* sink() const { return sink_; }

  // The most a pass holds at once, by the plan.
  void plan_peak(gradient_buckets<Model, Transport> const& buckets) {
    page_span const& span = grads_.span;
    if (!s_.opts.shard_gradients || n == 0 || span.page == 0) return;
    reports_.reports = REMAT_NAMESPACE::detail::gradient_reports<typename Model::net, typename Model::precision>();
    reports_.reports.push_back(0);  // (the model's own, after backward)
    bool const sunk = sink_ != nullptr;  // (then the shard's pages go as the others' do)
    param_range const s = s_.shard();
    planned_peak_ = REMAT_NAMESPACE::detail::sharded_gradient_peak(
        reports_.reports, buckets.all(), n, [&](std::size_t touched, std::size_t released) {
          return REMAT_NAMESPACE::detail::held_gradient_pages(span, s, sunk, touched, released);
        });
  }

  // What dist::data_parallel::gradient_pages() reports.
  gradient_memory memory() const {
    gradient_memory g{grads_.span.whole, planned_peak_, last_peak_, grads_.resident()};
    if (!s_.opts.shard_gradients) g.planned_peak = g.whole;
    return g;
  }
  backed_buffer<typename Model::device>& buffer() { return grads_; }

  // A pass starts writing gradients: the pages of backward's first span (by the plan's reports)
  // are held; all of them when the pass does not follow the plan's reports (no overlap).
  void pass_starting() {
    pass_peak_ = 0;
    if (!s_.opts.shard_gradients) return;
    reports_.restart();
    sent_ = n;
    if (sink_) sink_->pass_starting();
    take(s_.overlap ? reports_.first() : 0, n);
  }
  // Backward reports: the pages held now are the most since the last report (backward only adds);
  // then the buckets started at earlier reports are waited for and their pages given back.
  void before_launch(std::size_t in_flight_low) {
    if (!s_.opts.shard_gradients) return;
    pass_peak_ = std::max(pass_peak_, grads_.resident());
    if (s_.transport->busy()) s_.transport->join("the gradients' reduction");
    send_down(in_flight_low);
    release_from(in_flight_low);
  }
  // Backward reported gradients final from `offset` on: the pages of the span it writes next
  // (down to the plan's next report) are held. A report the plan did not foresee holds all below.
  void after_launch(std::size_t offset) {
    if (!s_.opts.shard_gradients) return;
    take(reports_.next_after(offset), offset);
  }
  // The pass succeeded: every pass ends reduced, and this rank keeps its shard's gradients.
  void pass_succeeded() {
    if (!s_.opts.shard_gradients) return;
    s_.transport->join("the gradients' reduction");
    send_down(0);
    release_from(0);
    last_peak_ = pass_peak_;
    if (sink_) sink_->pass_ended(false);
  }
  // A rank whose pass failed starts the buckets its backward did not reach: the reductions write
  // this rank's shard, whose pages (with a sink, given back until backward reaches them) are held
  // first. (The values are discarded.)
  void before_late_launch() {
    param_range const s = s_.shard();
    if (sink_ && s.size()) grads_.commit(s.begin, s.end);
  }
  // Every rank undoes a failed pass (its reductions done): the sink's sum is as before it.
  void pass_failed() {
    if (sink_) sink_->pass_ended(true);
  }
  // Zeroes this rank's shard of the gradients and gives back the pages of the rest; false when
  // the rank keeps them all (the model zeroes them).
  bool clear() {
    if (!s_.opts.shard_gradients) return false;
    release_from(0);
    if (sink_) {
      sink_->clear();
      return true;
    }
    param_range const s = s_.shard();
    if (s.size()) zero_device_bytes<typename Model::device>(s_.gradient_base() + s.begin, s.size() * sizeof(T));
    return true;
  }

 private:
  using T = typename Model::value_type;
  static constexpr std::size_t n = Model::parameter_count;
  static constexpr bool on_gpu = dp_state<Model, Transport>::on_gpu;

  // The pages of [lo, hi) are held before backward writes them, with the sink's sum in the
  // shard's part.
  void take(std::size_t lo, std::size_t hi) {
    grads_.commit(lo, hi);
    param_range const s = s_.shard();
    std::size_t const a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (sink_ && a < b) sink_->fill(a - s.begin, b - s.begin);
  }
  // The shard's gradients from `from` on are reduced (the transport joined): to the sink.
  void send_down(std::size_t from) {
    param_range const s = s_.shard();
    std::size_t const a = std::max(from, s.begin), b = std::min(sent_, s.end);
    if (sink_ && a < b) sink_->reduced(a - s.begin, b - s.begin);
    sent_ = std::min(sent_, from);
  }
  // Gives back what this rank does not own from parameter `from` to the end (reductions done),
  // and with a sink what it owns as well (come down to it).
  void release_from(std::size_t from) const {
    param_range const s = s_.shard();
    T* const base = s_.gradient_base();
    if (s.size() == 0 || sink_) return grads_.give_back(base, from, n);
    grads_.give_back(base, from, std::max(from, s.begin));
    grads_.give_back(base, std::max(from, s.end), n);
  }

  dp_state<Model, Transport>& s_;
  backed_buffer<typename Model::device> grads_;  // the gradient buffer's memory
  REMAT_NAMESPACE::detail::report_cursor reports_;  // backward's reports, by the plan, and the running pass's
  std::size_t planned_peak_ = 0;
  std::size_t pass_peak_ = 0;  // measured in the running pass
  std::size_t last_peak_ = 0;  // measured in the last pass that succeeded
  std::size_t sent_ = n;       // the shard's gradients from here on have come down to the sink
  REMAT_NAMESPACE::detail::gradient_sink* sink_ = nullptr;
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
