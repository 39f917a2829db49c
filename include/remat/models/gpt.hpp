// Ready-made transformer models as types.
//
//   CausalSelfAttention<W, H, P>   Seq<Linear<W, 3W>, BlockedAttentionCore<W, H, P>, Linear<W, W>>
//   GPTBlock<W, H, P>              the pre-norm block of GPT-2:
//                                    x + Dropout(Attn(LayerNorm(x))), then
//                                    x + Dropout(Linear(GELU(Linear(LayerNorm(x)))))
//   GPT<Vocab, MaxLen, W, H, N, P, Policy>
//                                  token and position embeddings, N blocks (Repeat, optionally under
//                                  a policy), a final LayerNorm and the language-model head
//
// The attention core is BlockedAttentionCore: it keeps two numbers per position and head, never the
// batch x heads x seq x seq probabilities (as PyTorch's scaled_dot_product_attention keeps none),
// and costs one more product Q K^T in backward. StoredAttention<S> (policy/recompute_attention.hpp)
// swaps in AttentionCore, which keeps them; RecomputeAttention<StoredAttention<S>> then recomputes
// them, Megatron-LM's selective recompute.
//
// A sequence model reads token ids batch x seq (or, reading features, rows grouped by
// model::set_sequence_length); SoftmaxCrossEntropy then takes one label per position.
#pragma once

#include "../graph/graph.hpp"
#include "../layers/attention.hpp"
#include "../layers/dropout.hpp"
#include "../layers/embedding.hpp"
#include "../layers/linear.hpp"
#include "../layers/norm.hpp"
#include "../layers/pointwise.hpp"
#include "../policy/recompute_attention.hpp"

namespace REMAT_NAMESPACE {

// Causal multi-head self-attention of width W with H heads and attention dropout P (see above).
template <std::size_t W, std::size_t H, rate_param P = 0.0>
using CausalSelfAttention = Seq<Linear<W, 3 * W>, BlockedAttentionCore<W, H, P>, Linear<W, W>>;

// GPT-2's pre-norm transformer block of width W with H heads and dropout P (see above).
template <std::size_t W, std::size_t H, rate_param P = 0.0>
using GPTBlock =
    Seq<Residual<Seq<LayerNorm<W>, Linear<W, 3 * W>, BlockedAttentionCore<W, H, P>, Linear<W, W>, Dropout<P>>>,
        Residual<Seq<LayerNorm<W>, Linear<W, 4 * W>, GELU, Linear<4 * W, W>, Dropout<P>>>>;

// The blocks of a GPT under no policy (everything stored). (Not `Stored`: user code with
// `using namespace remat` often names its own stored model that.)
template <class Blocks>
using NoPolicy = Blocks;

// A GPT language model; Policy is applied to Repeat<N, GPTBlock> (NoPolicy, or for example
// `remat::Checkpointed`, or a template alias over Revolve/Selective/StoredAttention).
template <std::size_t Vocab, std::size_t MaxLen, std::size_t W, std::size_t H, std::size_t N, rate_param P = 0.0,
          template <class> class Policy = NoPolicy>
using GPT = Seq<Embedding<Vocab, W>, PositionEmbedding<MaxLen, W>, Dropout<P>, Policy<Repeat<N, GPTBlock<W, H, P>>>,
                LayerNorm<W>, Linear<W, Vocab>>;

}  // namespace REMAT_NAMESPACE
