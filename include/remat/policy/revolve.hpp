// Revolve<C, Repeat<N, B>>: at most C block inputs kept at once, and the binomial schedule
// (policy/revolve_schedule.hpp): the fewest block forwards run again that C slots allow, planned
// at compile time. Blocks run in Repeat's own loops, so each block's gradients are reported as
// final when its backward is done.
#pragma once

#include "revolve_schedule.hpp"
#include "wraps.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>

namespace REMAT_NAMESPACE {

// Fails to compile, naming C, when C is 0.
template <std::size_t C>
struct revolve_needs_a_slot {
  static constexpr bool ok = C >= 1;  // (true: the assertion passed)
  static_assert(ok, "remat::Revolve<C, Repeat<N, B>>: C (the block inputs kept at once) must be at least 1");
};

// Fails to compile, naming the type given, when Revolve wraps anything but a Repeat.
template <class Given>
struct revolve_needs_a_repeat {
  static constexpr bool ok = sizeof(Given*) == 0;  // always false, once instantiated
  static_assert(ok, "remat::Revolve<C, S>: S must be a Repeat<N, Block> (a chain of identical blocks); "
                    "revolve_needs_a_repeat<S> names the type given");
};

namespace detail {

// Runs actions [from, to) of a revolve schedule over a chain of blocks B. Slots are the pass
// state's kept tensors and numbers (the schedule is last in, first out): a block input and the
// dropout offset it was made at. `again` is the backward's recomputation (null in the forward).
// Revolve runs its compile-time schedule; the budget policy (policy/budget.hpp) runs one too.
template <class B, class St>
constexpr void revolve_run(St& s, typename St::param_ptr p, typename St::grad_ptr g, typename St::act_type& current,
                           typename St::act_type& dy, revolve::action const* schedule, std::size_t from, std::size_t to,
                           typename St::recomputation* again) {
  for (std::size_t i = from; i < to; ++i) {
    revolve::action const a = schedule[i];
    switch (a.what) {
      case revolve::op::store:
        s.save(current);
        s.save_counter(s.rng_offset());
        break;
      case revolve::op::advance: {
        auto const none = s.keep_nothing();
        current = forward_blocks<B>(s, p, std::move(current), a.first, a.last);
        if (again) s.count_recomputed(a.last - a.first);
        break;
      }
      case revolve::op::taped:
        current = forward_blocks<B>(s, p, std::move(current), a.first, a.first + 1);
        if (again) s.count_recomputed(1);
        break;
      case revolve::op::reverse:
        current.reset();  // the block's output: the gradient arrives instead
        dy = backward_blocks<B>(s, p, g, std::move(dy), a.first, a.first + 1);
        break;
      case revolve::op::restore:
        current = s.peek();
        again->restart_at(s.peek_counter());
        break;
      case revolve::op::drop:
        s.restore().reset();
        (void)s.restore_counter();
        break;
    }
  }
}

}  // namespace detail

template <std::size_t C, class S>
struct Revolve {
  static_assert(not_a_segment<Revolve, S>::ok);
  static_assert(revolve_needs_a_repeat<S>::ok);
};

// (See the top of this header.)
template <std::size_t C, std::size_t N, class B>
struct Revolve<C, Repeat<N, B>> : wraps<Repeat<N, B>> {
  static_assert(revolve_needs_a_slot<C>::ok);
  static constexpr std::size_t slots = C;  // block inputs kept at once
  // (With C = 0 the assertion above has failed; the schedule is then built for one slot, so that a
  // compiler going on after the error, as clang does, does not evaluate a search with no slot.)
  static constexpr std::size_t built_for = C < 1 ? 1 : C;
  // The binomial schedule of N blocks with C slots: the forward's actions, then the backward's.
  static constexpr auto const& schedule = revolve::schedule<N, built_for>;
  // Where the forward's actions end in schedule.
  static constexpr std::size_t forward_end = revolve::forward_end<N, built_for>;
  // Block forwards the backward runs again: revolve::cost(N, C), the fewest possible with C slots.
  static constexpr std::uint64_t recomputed_forwards = revolve::recomputed_forwards<N, built_for>;

  // The schedule's forward actions: all N blocks, keeping at most C block inputs.
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    if (!s.keeps()) return Repeat<N, B>::forward(s, p, std::move(x));
    typename St::act_type unused;
    detail::revolve_run<B>(s, p, typename St::grad_ptr{}, x, unused, schedule.data(), 0, forward_end, nullptr);
    return x;
  }

  // The schedule's backward actions: each block's backward, last first, after advancing from the
  // nearest kept input (recomputed_forwards block forwards in all).
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    typename St::act_type current;
    auto again = s.recompute_from(s.rng_offset());
    detail::revolve_run<B>(s, p, g, current, dy, schedule.data(), forward_end, schedule.size(), &again);
    return dy;
  }

};

}  // namespace REMAT_NAMESPACE
