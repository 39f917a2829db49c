// Offloaded<S>: S's saved activations in host memory from the end of S's forward to the start of
// its backward: copied there on a side stream while the rest of the forward runs, and copied back,
// one Offloaded segment ahead, while the backward of the segment after it runs (the pass state
// keeps the records: pass/vocabulary.hpp, memory/offload.hpp). The activation plan counts the
// device bytes (what stays until the copy is done, what comes back early) and, apart, the
// offloaded bytes. Values are untouched: gradients are bit for bit those of the stored model. On
// the host backend the copies are memcpy into a separate allocator and save nothing; they run so
// that the schedule is the one tested.
#pragma once

#include "wraps.hpp"

#include <utility>

namespace REMAT_NAMESPACE {

template <class S>
struct Offloaded : wraps<S> {
  static_assert(not_a_segment<Offloaded, S>::ok);

  // Runs S, then starts copying what S saved to the offload allocator.
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    return Offloaded::forward_keeping(s, p, std::move(x), [&](typename St::act_type in) {
      std::size_t const mark = s.saved_mark();
      typename St::act_type y = S::forward(s, p, std::move(in));
      s.offload_since(mark);
      return y;
    });
  }

  // Waits for S's saved activations to be back (their copy started one segment ahead), then
  // runs S's backward.
  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    s.bring_back_offloaded();
    return S::backward(s, p, g, std::move(dy));
  }
};

}  // namespace REMAT_NAMESPACE
