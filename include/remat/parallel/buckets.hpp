// The gradients of a remat::dist::data_parallel travel in buckets of about options::bucket_bytes,
// planned from the end of the model's buffer (backward finishes the last layers first) and started
// as backward reports them final, so their reduction overlaps the rest of backward. Each bucket is
// all-reduced, or (sharded optimizer) each part of it reduced to the rank that owns it.
#pragma once

#include "../plan/rank_pages.hpp"
#include "state.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace REMAT_NAMESPACE {
namespace dist {
namespace detail {

template <class Model, class Transport>
class gradient_buckets {
 public:
  using bucket = param_range;

  explicit gradient_buckets(dp_state<Model, Transport>& s)
      : s_(s),
        buckets_(REMAT_NAMESPACE::detail::gradient_bucket_ranges(
            n, REMAT_NAMESPACE::detail::gradient_bucket_size(s.opts.bucket_bytes, sizeof(T)))) {}

  std::vector<bucket> const& all() const { return buckets_; }  // from the buffer's end
  std::size_t next() const { return next_; }                   // the next bucket to start
  bool left() const { return next_ < buckets_.size(); }        // some not started yet
  std::size_t in_flight_low() const { return in_flight_low_; }  // the first parameter of the last started
  // A pass starts: no bucket started (a failed pass's restore names where it was).
  void restart(std::size_t next = 0) { next_ = next; }
  void pass_starting() {
    next_ = 0;
    in_flight_low_ = n;
  }

  // Starts every bucket not started yet that lies at or above `offset` (final gradients).
  void launch_ready(std::size_t offset) {
    std::size_t const first = next_;
    while (next_ < buckets_.size() && buckets_[next_].begin >= offset) ++next_;
    if (next_ == first) return;
    if (offset > 0) {
      s_.step.overlapped += next_ - first;
      ++s_.step.launches;
    }
    s_.transport->follow();  // (on the GPU: once the model's stream has written these gradients)
    s_.transport->group_start();
    for (std::size_t i = first; i < next_; ++i) launch(buckets_[i]);
    s_.transport->group_end();
    in_flight_low_ = buckets_[next_ - 1].begin;
  }

 private:
  using T = typename Model::value_type;
  static constexpr std::size_t n = Model::parameter_count;

  void launch(bucket const& b) {
    T* const g = s_.model.gradients().data();
    ++s_.step.buckets;
    if (!s_.opts.shard_optimizer) {
      s_.transport->all_reduce(g + b.begin, b.end - b.begin);
      s_.step.reduced += (b.end - b.begin) * sizeof(T);
      return;
    }
    s_.shards.owners(b.begin, b.end, [&](int q, std::size_t lo, std::size_t hi) {
      s_.transport->reduce(g + lo, hi - lo, q);  // (each part to the rank whose optimizer owns it)
      s_.step.reduced += (hi - lo) * sizeof(T);
    });
  }

  dp_state<Model, Transport>& s_;
  std::vector<bucket> buckets_;
  std::size_t next_ = 0;
  std::size_t in_flight_low_ = 0;
};

}  // namespace detail
}  // namespace dist
}  // namespace REMAT_NAMESPACE
