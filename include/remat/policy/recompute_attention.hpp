// The attention core of a model, chosen after the model is written (each a rewrite of S that walks
// it through every composite and policy, including policies defined outside the library):
//
// BlockedAttention<S>: S with every AttentionCore<W, H, P> replaced by BlockedAttentionCore<W, H, P>
// (layers/attention.hpp): the same function in memory linear in the sequence length. (GPTBlock's
// core is already the blocked one.)
//
// StoredAttention<S>: the other way round, every BlockedAttentionCore replaced by AttentionCore,
// which keeps the batch x heads x seq x seq probabilities and so multiplies Q K^T once fewer in
// backward: a little faster where the sequence is short and memory is plentiful.
//
// RecomputeAttention<S>: S with every attention core that keeps its probabilities (AttentionCore,
// a layer declaring `attention_core`) checkpointed: the forward keeps the projections' outputs and
// drops the seq x seq probabilities, which backward recomputes (Megatron-LM's selective recompute
// of attention). A BlockedAttentionCore keeps no probabilities and is left as it is, so over a
// GPTBlock this changes nothing; RecomputeAttention<StoredAttention<S>> is Megatron's scheme.
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
struct swap_attention_core {  // AttentionCore <-> BlockedAttentionCore; any other layer unchanged
  using blocked = L;
  using stored = L;
};
template <std::size_t W, std::size_t H, rate_param P>
struct swap_attention_core<AttentionCore<W, H, P>> {
  using blocked = BlockedAttentionCore<W, H, P>;
  using stored = AttentionCore<W, H, P>;
};
template <std::size_t W, std::size_t H, rate_param P>
struct swap_attention_core<BlockedAttentionCore<W, H, P>> : swap_attention_core<AttentionCore<W, H, P>> {};
template <class L>
using blocked_attention_core = typename swap_attention_core<L>::blocked;
template <class L>
using stored_attention_core = typename swap_attention_core<L>::stored;
}  // namespace detail

// S with every AttentionCore replaced by a BlockedAttentionCore (see the top of this header).
template <class S>
using BlockedAttention = rewrite_t<S, detail::blocked_attention_core>;

// S with every BlockedAttentionCore replaced by an AttentionCore (see the top of this header).
template <class S>
using StoredAttention = rewrite_t<S, detail::stored_attention_core>;

}  // namespace REMAT_NAMESPACE
