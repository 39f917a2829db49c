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
}  // namespace REMAT_NAMESPACE
