// What every storage policy shares: remat::wraps<S>, the base that forwards S's widths,
// parameters, names and initialisation unchanged (so a checkpointed model reads a stored model's
// file), and the compile-time errors a policy gives for a wrong argument.
//
// A storage policy of your own is a type derived from wraps<S> with forward and backward written
// against the pass-state vocabulary (pass/vocabulary.hpp); written `P<S>` or `P<N, S>`, every walk
// over the graph (RecomputeAttention, the plan) goes through it without anything else declared.
#pragma once

#include "../graph/graph.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace REMAT_NAMESPACE {

// Whether L may be wrapped in a storage policy: any layer (a Seq, Residual, Repeat, or one layer).
template <class L>
inline constexpr bool is_segment_v = layer<L>;

// Fails to compile, naming the type a policy was given, when it is not a layer or segment.
template <class Policy, class Given>
struct not_a_segment {
  static constexpr bool ok = is_segment_v<Given>;  // (true: the assertion passed)
  static_assert(ok, "remat: a storage policy wraps a layer or a segment (Seq, Residual, Repeat, a layer); "
                    "not_a_segment<Policy, Given> names the type given instead");
};

// The base of a storage policy around segment S: S's widths, parameters (count, names, shapes,
// initialisation) and hollow-input trait, unchanged; the policy adds forward and backward.
template <class S>
struct wraps : detail::parameters_of<S> {
  using segment = S;  // the segment wrapped (what walks over the graph descend into)
  static constexpr bool handles_hollow = handles_hollow_v<S>;  // S's
  static constexpr std::size_t in_width = S::in_width;         // S's
  static constexpr std::size_t out_width = S::out_width;       // S's

 protected:
  // A policy's forward: S's own when the pass keeps nothing (inference, or inside another
  // policy's forward or recomputation); otherwise keep(x), the policy's way of running S.
  template <class St, class Keep>
  static constexpr typename St::act_type forward_keeping(St& s, typename St::param_ptr p, typename St::act_type x,
                                                         Keep&& keep) {
    static_assert(layer_pass_contract<S, St>::ok);
    if (!s.keeps()) return S::forward(s, p, std::move(x));
    return keep(std::move(x));
  }
  // S's forward as a function of its input: what a policy runs, and runs again.
  template <class St>
  static constexpr auto run_of(St& s, typename St::param_ptr p) {
    return [&s, p](typename St::act_type in) { return S::forward(s, p, std::move(in)); };
  }
  // A policy's backward once it has run S's forward again: the recomputation counted, S's backward.
  template <class St>
  static constexpr typename St::act_type backward_recomputed(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                             typename St::act_type dy);
};

namespace detail {

// Block forwards in one run of S (what a policy's recomputation counts).
template <class S>
constexpr std::uint64_t blocks_in() {
  if constexpr (requires { S::count; typename S::block; })
    return S::count;
  else if constexpr (requires { typename S::segment; })
    return blocks_in<typename S::segment>();
  else
    return 1;
}

}  // namespace detail

template <class S>
template <class St>
constexpr typename St::act_type wraps<S>::backward_recomputed(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                             typename St::act_type dy) {
  s.count_recomputed(detail::blocks_in<S>());
  return S::backward(s, p, g, std::move(dy));
}

}  // namespace REMAT_NAMESPACE
