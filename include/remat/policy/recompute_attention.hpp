// BlockedAttention<S>: S with every AttentionCore<W, H, P> replaced by BlockedAttentionCore<W, H, P>
// (layers/attention.hpp): the same function in memory linear in the sequence length.
//
// RecomputeAttention<S>: S with every attention core (a layer declaring `attention_core`)
// checkpointed: the forward keeps the projections' outputs and drops the seq x seq
// probabilities, which backward recomputes (Megatron-LM's selective recompute of attention). It
// walks S through every composite and policy, including policies defined outside the library.
#pragma once

#include "../layers/attention.hpp"
#include "checkpointed.hpp"

#include <type_traits>

namespace REMAT_NAMESPACE {

namespace detail {
template <class L>
using checkpoint_attention_core = std::conditional_t<is_attention_core_v<L>, Checkpointed<L>, L>;
}  // namespace detail

// S with every attention core checkpointed (see the top of this header).
template <class S>
using RecomputeAttention = rewrite_t<S, detail::checkpoint_attention_core>;

namespace detail {
template <class L>
struct to_blocked_core {
  using type = L;
};
template <std::size_t W, std::size_t H, rate_param P>
struct to_blocked_core<AttentionCore<W, H, P>> {
  using type = BlockedAttentionCore<W, H, P>;
};
template <class L>
using blocked_attention_core = typename to_blocked_core<L>::type;
}  // namespace detail

// S with every AttentionCore replaced by a BlockedAttentionCore (see the top of this header).
template <class S>
using BlockedAttention = rewrite_t<S, detail::blocked_attention_core>;

}  // namespace REMAT_NAMESPACE
