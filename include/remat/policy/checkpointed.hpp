// Checkpointed<S>: keeps S's input and the dropout offset S started at; backward runs S's forward
// again from them (same masks, same precision), then S's backward: gradients are bit for bit those
// of the stored model. The recomputation stops multiplying after the last product S's backward
// needs (for Residual<Seq<LayerNorm, Linear, GELU, Linear>>: one product of two, not the second,
// whose output only feeds the residual add). Inside a forward that keeps nothing (another
// policy's), it just runs S.
#pragma once

#include "wraps.hpp"

#include <cstdint>
#include <utility>

namespace REMAT_NAMESPACE {

namespace detail {

// A checkpointed run: `run(x)` keeping nothing, with x, the dropout offset and the number of its
// products that the backward needs recomputed kept to run it again.
template <class St, class Run>
constexpr typename St::act_type checkpoint_forward(St& s, typename St::act_type x, Run&& run) {
  std::uint64_t const offset = s.rng_offset();
  typename St::act_type y;
  typename St::product_count products;
  {
    auto const none = s.keep_nothing();
    auto const counting = s.count_products(products);
    y = run(x);
  }
  s.save(std::move(x));
  s.save_counter(offset);
  s.save_counter(products.needed);
  return y;
}

// Its backward's first half: the run again, from the kept input and offset, keeping what the
// backward needs. Its output is not read, so the products past the last needed one (a residual
// branch's last product, and the add after it) are skipped: they come back hollow.
template <class St, class Run>
constexpr void checkpoint_recompute(St& s, Run&& run) {
  std::size_t const needed = std::size_t(s.restore_counter());
  std::uint64_t const offset = s.restore_counter();
  typename St::act_type x = s.restore();
  auto again = s.recompute_from(offset);
  auto const skip = s.skip_products_from(needed);
  run(std::move(x)).reset();
}

}  // namespace detail

template <class S>
struct Checkpointed : wraps<S> {
  static_assert(not_a_segment<Checkpointed, S>::ok);

  // Runs S, keeping only S's input and its dropout offset (all of S's own when nothing is kept).
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    return Checkpointed::forward_keeping(s, p, std::move(x), [&](typename St::act_type in) {
      return detail::checkpoint_forward(s, std::move(in), Checkpointed::run_of(s, p));
    });
  }

  // Runs S's forward again from its input (same masks), up to the last product S's backward
  // needs, then S's backward.
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    detail::checkpoint_recompute(s, Checkpointed::run_of(s, p));
    return Checkpointed::backward_recomputed(s, p, g, std::move(dy));
  }
};

}  // namespace REMAT_NAMESPACE
