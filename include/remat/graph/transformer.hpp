// Transformer building blocks as types.
//
//   CausalSelfAttention<W, H, P>   Seq<Linear<W, 3W>, AttentionCore<W, H, P>, Linear<W, W>>
//   GPTBlock<W, H, P>              the pre-norm block of GPT-2:
//                                    x + Dropout(Attn(LayerNorm(x))), then
//                                    x + Dropout(Linear(GELU(Linear(LayerNorm(x)))))
//   GPT<Vocab, MaxLen, W, H, N, P, Policy>
//                                  token and position embeddings, N blocks (Repeat, optionally under
//                                  a policy), a final LayerNorm and the language-model head
//   RecomputeAttention<S>          S with every AttentionCore checkpointed: the forward keeps the
//                                  projections' outputs and drops the seq x seq probabilities,
//                                  which backward recomputes (Megatron-LM's selective recompute)
//
// A sequence model reads token ids batch x seq (or, reading features, rows grouped by
// model::set_sequence_length); SoftmaxCrossEntropy then takes one label per position.
#pragma once

#include "../layers/attention.hpp"
#include "../layers/dropout.hpp"
#include "../layers/embedding.hpp"
#include "../layers/linear.hpp"
#include "../layers/norm.hpp"
#include "../layers/pointwise.hpp"
#include "graph.hpp"
#include "policies.hpp"

namespace REMAT_NAMESPACE {

template <std::size_t W, std::size_t H, double P = 0.0>
using CausalSelfAttention = Seq<Linear<W, 3 * W>, AttentionCore<W, H, P>, Linear<W, W>>;

template <std::size_t W, std::size_t H, double P = 0.0>
using GPTBlock = Seq<Residual<Seq<LayerNorm<W>, Linear<W, 3 * W>, AttentionCore<W, H, P>, Linear<W, W>, Dropout<P>>>,
                     Residual<Seq<LayerNorm<W>, Linear<W, 4 * W>, GELU, Linear<4 * W, W>, Dropout<P>>>>;

// The blocks of a GPT under no policy (everything stored). (Not `Stored`: user code with
// `using namespace remat` often names its own stored model that.)
template <class Blocks>
using NoPolicy = Blocks;

namespace detail {

template <class S>
struct recompute_attention {
  using type = S;
};
template <std::size_t W, std::size_t H, double P>
struct recompute_attention<AttentionCore<W, H, P>> {
  using type = Checkpointed<AttentionCore<W, H, P>>;
};
template <class... L>
struct recompute_attention<Seq<L...>> {
  using type = Seq<typename recompute_attention<L>::type...>;
};
template <class S>
struct recompute_attention<Residual<S>> {
  using type = Residual<typename recompute_attention<S>::type>;
};
template <std::size_t N, class B>
struct recompute_attention<Repeat<N, B>> {
  using type = Repeat<N, typename recompute_attention<B>::type>;
};
template <class S>
struct recompute_attention<Checkpointed<S>> {
  using type = Checkpointed<typename recompute_attention<S>::type>;
};
template <class S>
struct recompute_attention<Selective<S>> {
  using type = Selective<typename recompute_attention<S>::type>;
};
template <class S>
struct recompute_attention<Offloaded<S>> {
  using type = Offloaded<typename recompute_attention<S>::type>;
};
template <std::size_t C, class S>
struct recompute_attention<Revolve<C, S>> {
  using type = Revolve<C, typename recompute_attention<S>::type>;
};
template <std::size_t K, class S>
struct recompute_attention<CheckpointSequential<K, S>> {
  using type = CheckpointSequential<K, typename recompute_attention<S>::type>;
};

}  // namespace detail

template <class S>
using RecomputeAttention = typename detail::recompute_attention<S>::type;

// A GPT language model; Policy is applied to Repeat<N, GPTBlock> (NoPolicy, or for example
// `remat::Checkpointed`, or a template alias over Revolve/Selective/RecomputeAttention).
template <std::size_t Vocab, std::size_t MaxLen, std::size_t W, std::size_t H, std::size_t N, double P = 0.0,
          template <class> class Policy = NoPolicy>
using GPT = Seq<Embedding<Vocab, W>, PositionEmbedding<MaxLen, W>, Dropout<P>, Policy<Repeat<N, GPTBlock<W, H, P>>>,
                LayerNorm<W>, Linear<W, Vocab>>;

}  // namespace REMAT_NAMESPACE
