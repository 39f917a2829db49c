// ZeRO-2 (options::shard_gradients): a rank keeps the gradients of its shard only. At each of
// backward's reports it waits for the buckets started at earlier ones and gives back the memory of
// their gradients it does not own (memory/backed_buffer.hpp: host pages, or on the GPU granules the
// gradient buffer moves into), and before backward writes the next span (down to the plan's next
// report) it takes that span's memory back. The most a pass holds is planned from the model's plan
// walk and measured at every report.
#pragma once

#include "../memory/backed_buffer.hpp"
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
    page_span const& span = grads_.span;
    if (!sharded || n == 0 || span.page == 0) return;
    reports_ = REMAT_NAMESPACE::detail::gradient_reports<typename Model::net, typename Model::precision>();
    reports_.push_back(0);  // (the model's own, after backward)
    auto const page = std::uintptr_t(span.page);
    std::uintptr_t const last = span.first + span.whole;
    param_range const s = s_.shard();
    // A page is given back when it lies wholly in the buffer, holds nothing of this rank's
    // shard, and lies wholly below `touched` (not written yet in this pass) or wholly at or above
    // `released` (reduced).
    auto const held = [&](std::size_t touched, std::size_t released) {
      std::size_t count = 0;
      for (std::uintptr_t p = span.first; p < last; p += page) {
        bool const inside = p >= span.begin && p + page <= span.end;
        bool const shard_free = s.size() == 0 || p + page <= span.at(s.begin) || p >= span.at(s.end);
        bool const given = inside && shard_free && (p + page <= span.at(touched) || p >= span.at(released));
        count += !given;
      }
      return count * span.page;
    };
    std::size_t released = n, low = n, next = 0, peak = 0;
    bool in_flight = false;
    for (std::size_t r : reports_) {
      peak = std::max(peak, held(r, released));
      if (in_flight) released = low;
      in_flight = false;
      while (next < buckets.all().size() && buckets.all()[next].begin >= r) {
        low = buckets.all()[next++].begin;
        in_flight = true;
      }
    }
    planned_peak_ = peak;
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
    report_ = 0;
    grads_.commit(s_.overlap && !reports_.empty() ? reports_.front() : 0, n);
  }
  // Backward reports: the pages held now are the most since the last report (backward only adds);
  // then the buckets started at earlier reports are waited for and their pages given back.
  void before_launch(std::size_t in_flight_low) {
    if (!s_.opts.shard_gradients) return;
    pass_peak_ = std::max(pass_peak_, grads_.resident());
    if (s_.transport->busy()) s_.transport->join("the gradients' reduction");
    release_from(in_flight_low);
  }
  // Backward reported gradients final from `offset` on: the pages of the span it writes next
  // (down to the plan's next report) are held. A report the plan did not foresee holds all below.
  void after_launch(std::size_t offset) {
    if (!s_.opts.shard_gradients) return;
    std::size_t next = 0;
    if (report_ < reports_.size() && reports_[report_] == offset) {
      ++report_;
      next = report_ < reports_.size() ? std::min(reports_[report_], offset) : 0;
    } else {
      report_ = reports_.size();  // (off the plan: everything below is held from now on)
    }
    grads_.commit(next, offset);
  }
  // The pass succeeded: every pass ends reduced, and this rank keeps its shard's gradients.
  void pass_succeeded() {
    if (!s_.opts.shard_gradients) return;
    s_.transport->join("the gradients' reduction");
    release_from(0);
    last_peak_ = pass_peak_;
  }
  // Zeroes this rank's shard of the gradients and gives back the pages of the rest; false when
  // the rank keeps them all (the model zeroes them).
  bool clear() {
    if (!s_.opts.shard_gradients) return false;
    release_from(0);
    param_range const s = s_.shard();
    if (s.size()) zero_device_bytes<typename Model::device>(s_.gradient_base() + s.begin, s.size() * sizeof(T));
    return true;
  }

 private:
  using T = typename Model::value_type;
  static constexpr std::size_t n = Model::parameter_count;
  static constexpr bool on_gpu = dp_state<Model, Transport>::on_gpu;

  // Gives back what this rank does not own from parameter `from` to the end (reductions done).
  void release_from(std::size_t from) const {
    param_range const s = s_.shard();
    T* const base = s_.gradient_base();
    if (s.size() == 0) return grads_.give_back(base, from, n);
    grads_.give_back(base, from, std::max(from, s.begin));
    grads_.give_back(base, std::max(from, s.end), n);
  }

  dp_state<Model, Transport>& s_;
  backed_buffer<typename Model::device> grads_;  // the gradient buffer's memory
  std::vector<std::size_t> reports_;             // the offsets of backward's reports, by the plan
  std::size_t report_ = 0;                       // the next of them in the running pass
  std::size_t planned_peak_ = 0;
  std::size_t pass_peak_ = 0;  // measured in the running pass
  std::size_t last_peak_ = 0;  // measured in the last pass that succeeded
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
