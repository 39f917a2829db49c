// RecomputeAttention<S>: S with every attention core (a layer declaring `attention_core`)
// checkpointed: the forward keeps the projections' outputs and drops the seq x seq
// probabilities, which backward recomputes (Megatron-LM's selective recompute of attention). It
// walks S through every composite and policy, including policies defined outside the library.
#pragma once

#include "checkpointed.hpp"

#include <type_traits>

namespace REMAT_NAMESPACE {

namespace detail {
template <class L>
using checkpoint_attention_core = std::conditional_t<is_attention_core_v<L>, Checkpointed<L>, L>;
}  // namespace detail

template <class S>
using RecomputeAttention = rewrite_t<S, detail::checkpoint_attention_core>;

}  // namespace REMAT_NAMESPACE
