// Transformers: causal self-attention and GPT models against central differences, hand-computed
// values and causality; every storage policy bit for bit against the stored model with dropout on;
// the activation plan against the allocator's measured peak; bad input.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/gradients.hpp"
#include "support/lm_training.hpp"
#include "support/reference_attention.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t V = 13, L = 16, W = 16, H = 4, N = 3;
using Block = GPTBlock<W, H, 0.1>;    // its core the blocked one, which keeps no probabilities
using Kept = StoredAttention<Block>;  // with AttentionCore, which keeps them
template <class S>
using RecomputeStored = RecomputeAttention<StoredAttention<S>>;  // Megatron-LM's selective recompute
template <class Middle, std::size_t Positions = L>
using LM = Seq<Embedding<V, W>, PositionEmbedding<Positions, W>, Dropout<0.1>, Middle, LayerNorm<W>, Linear<W, V>>;

tensor<std::int32_t> token_batch(std::size_t batch, std::size_t seq, std::size_t salt = 0) {
  return lm_training::token_batch(V, batch, seq, salt);
}

}  // namespace

TEST_CASE("attention: gradients of the core, the attention layer and GPT models against central differences",
          "[transformer][gradients]") {
  require_gradients<AttentionCore<8, 2>>({.batch = 2, .sequence = 5}, 10);
  require_gradients<AttentionCore<8, 2, 0.25>>({.batch = 2, .sequence = 5}, 10);
  require_gradients<AttentionCore<6, 3>>({.batch = 1, .sequence = 1}, 10);
  require_gradients<CausalSelfAttention<8, 2>>({.batch = 2, .sequence = 3}, 10);
  // A sequence model reading features (rows grouped by set_sequence_length).
  require_gradients<Seq<Linear<5, 8>, GPTBlock<8, 2, 0.2>, Linear<8, 3>>>({.batch = 2, .sequence = 4}, 10);
  // Whole language models with dropout, stored and under policies.
  require_gradients<GPT<11, 6, 8, 2, 2, 0.1>>({.batch = 2, .sequence = 5}, 10);
  require_gradients<GPT<11, 6, 8, 2, 2, 0.1, Checkpointed>>({.batch = 2, .sequence = 6}, 10);
  require_gradients<GPT<11, 6, 8, 2, 2, 0.1, StoredAttention>>({.batch = 2, .sequence = 5}, 10);
  require_gradients<GPT<11, 6, 8, 2, 2, 0.1, RecomputeStored>>({.batch = 2, .sequence = 5}, 10);
  require_gradients<GPT<11, 6, 8, 2, 2, 0.1, Selective>>({.batch = 2, .sequence = 5}, 10);
}

TEST_CASE("attention: sequences of several causal tiles (the products skip the masked triangle)",
          "[transformer][gradients]") {
  static_assert(AttentionCore<4, 1>::causal_tile < 130, "the sequences below must span several tiles");
  // Central differences on inputs in every tile (and the partial last one), with and without dropout.
  require_gradients<AttentionCore<4, 1>>({.batch = 2, .max_checks_per_tensor = 600, .sequence = 150}, 600);
  require_gradients<AttentionCore<4, 2, 0.25>>({.batch = 1, .max_checks_per_tensor = 400, .sequence = 130}, 380);
  SECTION("the forward against a plain double-precision attention") {
    constexpr std::size_t w = 8, h = 2, seq = 200, batch = 2;
    model<AttentionCore<w, h>> m;
    m.set_sequence_length(seq);
    tensor<float> qkv(index_t(batch * seq), index_t(3 * w));
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(std::sin(0.37 * double(i)) * 1.5);
    tensor<float> y = m.forward(qkv);
    std::vector<double> const want = reference_causal_attention(qkv.data(), batch, seq, w, h);
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(y[i]) - want[i]));
    INFO("largest difference from double: " << worst);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("attention: hand-computed values", "[transformer]") {
  SECTION("a sequence of one attends to itself: the output is its value, exactly") {
    model<AttentionCore<4, 2>> m;
    m.set_sequence_length(1);
    tensor<float> qkv(3, 12);
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(std::sin(0.3 * double(i)) * 4);
    tensor<float> y = m.forward(qkv);
    for (std::size_t r = 0; r < 3; ++r)
      for (std::size_t c = 0; c < 4; ++c) CHECK(y[r * 4 + c] == qkv[r * 12 + 8 + c]);
  }
  SECTION("two positions, one head of width 2: softmax of the scaled scores by hand") {
    model<AttentionCore<2, 1>, host, fp64> m;
    m.set_sequence_length(2);
    // row t: q_t (2), k_t (2), v_t (2)
    tensor<double> qkv(2, 6);
    double const in[12] = {0.5, -1.0, 2.0, 0.25, 3.0, -2.0,  // position 0
                           1.5, 0.5, -0.5, 1.0, 7.0, 5.0};   // position 1
    for (std::size_t i = 0; i < 12; ++i) qkv[i] = in[i];
    tensor<double> y = m.forward(qkv);
    CHECK(y[0] == 3.0);
    CHECK(y[1] == -2.0);
    // position 1: s_j = q_1 . k_j / sqrt(2), j = 0, 1
    double const s0 = (1.5 * 2.0 + 0.5 * 0.25) / std::sqrt(2.0), s1 = (1.5 * -0.5 + 0.5 * 1.0) / std::sqrt(2.0);
    double const p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1 - p0;
    CHECK(y[2] == Approx(p0 * 3.0 + p1 * 7.0).epsilon(1e-14));
    CHECK(y[3] == Approx(p0 * -2.0 + p1 * 5.0).epsilon(1e-14));
  }
  SECTION("causal: changing a token changes no earlier position's logits; positions matter") {
    model<LM<Repeat<N, Block>>> m(seed{3});
    tensor<std::int32_t> a = token_batch(2, 9), b = token_batch(2, 9);
    b[6] = (b[6] + 1) % std::int32_t(V);  // sequence 0, position 6
    tensor<float> ya = m.forward(a), yb = m.forward(b);
    for (std::size_t t = 0; t < 9; ++t)
      for (std::size_t c = 0; c < V; ++c) {
        if (t < 6) CHECK(ya[t * V + c] == yb[t * V + c]);
      }
    bool later_changed = false;
    for (std::size_t t = 6; t < 9; ++t)
      for (std::size_t c = 0; c < V; ++c) later_changed |= ya[t * V + c] != yb[t * V + c];
    CHECK(later_changed);
    for (std::size_t i = 9 * V; i < ya.size(); ++i) CHECK(ya[i] == yb[i]);  // the other sequence
    // The same token at two positions gives two different outputs.
    tensor<std::int32_t> same(1, 2);
    same[0] = same[1] = 4;
    tensor<float> ys = m.forward(same);
    bool differ = false;
    for (std::size_t c = 0; c < V; ++c) differ |= ys[c] != ys[V + c];
    CHECK(differ);
  }
}

namespace {
// 3 steps of 3 sequences of 10 positions
constexpr lm_training::runs<V> lm{3, 3, 10};
}  // namespace

TEST_CASE("transformer policies: every policy trains a GPT bit for bit like the stored one, dropout on",
          "[transformer][policies]") {
  lm_training::run_result const stored = lm.train<LM<Repeat<N, Block>>>();
  REQUIRE(stored.losses[2] < stored.losses[0]);
  SECTION("Checkpointed per block and around the chain") {
    lm.require_same_training<LM<Repeat<N, Checkpointed<Block>>>>(stored, N);
    lm.require_same_training<LM<Checkpointed<Repeat<N, Block>>>>(stored, N);
  }
  SECTION("Revolve and CheckpointSequential") {
    lm.require_same_training<LM<Revolve<1, Repeat<N, Block>>>>(stored, revolve::cost(N, 1));
    lm.require_same_training<LM<Revolve<2, Repeat<N, Block>>>>(stored, revolve::cost(N, 2));
    lm.require_same_training<LM<CheckpointSequential<2, Repeat<N, Block>>>>(stored, N);
    lm.require_same_training<LM<CheckpointSequential<2, Repeat<N, Block>, last_run::stored>>>(stored, 1);  // (runs 1 + 2)
  }
  SECTION("Selective, and the core that keeps its probabilities recomputed") {
    lm.require_same_training<LM<Repeat<N, Selective<Block>>>>(stored, N);
    lm.require_same_training<LM<Selective<Repeat<N, Block>>>>(stored, N);
    // RecomputeAttention leaves the blocked core alone: nothing to recompute, the same model.
    static_assert(std::is_same_v<RecomputeAttention<Repeat<N, Block>>, Repeat<N, Block>>);
    lm_training::run_result const kept = lm.train<LM<Repeat<N, Kept>>>();
    lm.require_same_training<LM<RecomputeAttention<Repeat<N, Kept>>>>(kept, N);
    lm.require_same_training<LM<RecomputeStored<Repeat<N, Block>>>>(kept, N);
    lm.require_same_training<LM<Repeat<N, Selective<Kept>>>>(kept, N);
    lm.require_same_training<LM<Revolve<2, Repeat<N, RecomputeAttention<Kept>>>>>(kept, revolve::cost(N, 2) + N);
    // (the rewrite rebuilds CheckpointSequential around the cores, its last run still stored)
    lm.require_same_training<LM<RecomputeAttention<CheckpointSequential<2, Repeat<N, Kept>, last_run::stored>>>>(
        kept, 1 + N);
  }
  SECTION("in bf16 too") {
    lm_training::run_result const stored16 = lm.train<LM<Repeat<N, Block>>, mixed<bfloat16>>();
    lm.require_same_training<LM<Repeat<N, Checkpointed<Block>>>, mixed<bfloat16>>(stored16, N);
    lm.require_same_training<LM<Repeat<N, Selective<Block>>>, mixed<bfloat16>>(stored16, N);
    lm_training::run_result const kept16 = lm.train<LM<Repeat<N, Kept>>, mixed<bfloat16>>();
    lm.require_same_training<LM<RecomputeAttention<Repeat<N, Kept>>>, mixed<bfloat16>>(kept16, N);
  }
}

TEST_CASE("transformer: bf16 gradients follow fp32's", "[transformer][precision]") {
  using Net = LM<Repeat<N, GPTBlock<W, H>>>;
  model<Net> m32(seed{9});
  model<Net, host, mixed<bfloat16>> m16(seed{9});
  tensor<std::int32_t> ids = token_batch(4, 12), next = token_batch(4, 12, 1);
  double const l32 = m32.accumulate<SoftmaxCrossEntropy>(ids, next);
  double const l16 = m16.accumulate<SoftmaxCrossEntropy>(ids, next);
  CHECK(std::fabs(l16 - l32) < 0.02 * l32);
  double diff = 0, norm = 0;
  auto g32 = m32.gradients();
  auto g16 = m16.gradients();
  for (std::size_t i = 0; i < g32.size(); ++i) {
    diff += (double(g16[i]) - double(g32[i])) * (double(g16[i]) - double(g32[i]));
    norm += double(g32[i]) * double(g32[i]);
  }
  double const rel = std::sqrt(diff / norm);
  INFO("relative gradient error " << rel);
  CHECK(rel < 16 * 0x1p-8);
}

namespace {

// (fp32 and bf16 at each shape)
template <class Net>
void require_plan_matches_everywhere() {
  lm_training::require_plan_matches<Net, V>({{1, 1}, {2, 5}, {3, 16}, {5, 7}});
}

}  // namespace

TEST_CASE("transformer plan: the activation plan equals the measured peak", "[transformer][plan]") {
  require_plan_matches_everywhere<LM<Repeat<N, Block>>>();
  require_plan_matches_everywhere<LM<Repeat<N, Checkpointed<Block>>>>();
  require_plan_matches_everywhere<LM<Revolve<2, Repeat<N, Block>>>>();
  require_plan_matches_everywhere<LM<Repeat<N, Kept>>>();
  require_plan_matches_everywhere<LM<RecomputeAttention<Repeat<N, Kept>>>>();
  require_plan_matches_everywhere<LM<Repeat<N, Selective<Block>>>>();
  require_plan_matches_everywhere<GPT<V, L, W, H, 2, 0.0, Checkpointed>>();
}

TEST_CASE("transformer plan: recomputing the attention core drops exactly the seq x seq probabilities, and the "
          "blocked core keeps two numbers a row and head in their place",
          "[transformer][plan]") {
  constexpr std::size_t batch = 4, seq = 16;
  constexpr auto stored = sequence_plan<LM<Repeat<N, Kept>>>(batch, seq);
  constexpr auto core = sequence_plan<LM<RecomputeAttention<Repeat<N, Kept>>>>(batch, seq);
  constexpr auto blocked = sequence_plan<LM<Repeat<N, Block>>>(batch, seq);
  constexpr std::size_t probs = batch * H * seq * seq * sizeof(float);  // a multiple of 256 bytes
  constexpr std::size_t stats = batch * H * seq * 2 * sizeof(float);    // (the row's maximum and 1 / sum)
  static_assert(stored.saved_bytes - core.saved_bytes == N * probs);
  static_assert(blocked.saved_bytes - core.saved_bytes == N * stats);
  // The probabilities grow with the square of the sequence: at 4x the length, 16x the bytes (a
  // positional table of 4x the rows, so that the model takes that length); the statistics 4x.
  constexpr auto stored64 = sequence_plan<LM<Repeat<N, Kept>, 4 * seq>>(batch, 4 * seq);
  constexpr auto core64 = sequence_plan<LM<RecomputeAttention<Repeat<N, Kept>>, 4 * seq>>(batch, 4 * seq);
  constexpr auto blocked64 = sequence_plan<LM<Repeat<N, Block>, 4 * seq>>(batch, 4 * seq);
  static_assert(stored64.saved_bytes - core64.saved_bytes == 16 * N * probs);
  static_assert(blocked64.saved_bytes - core64.saved_bytes == 4 * N * stats);
  CHECK(core.recomputed == N);
  CHECK(blocked.recomputed == 0);
}

TEST_CASE("transformer: bad input is refused with a clear error and changes nothing", "[transformer][errors]") {
  model<LM<Repeat<N, Block>>> m(seed{1});
  AdamW opt(m, {.lr = 1e-2});
  tensor<std::int32_t> ids = token_batch(2, 8), next = token_batch(2, 8, 1);
  m.train_step<SoftmaxCrossEntropy>(ids, next, opt);
  std::vector<float> const params = tensor_to_host(m.parameters()), grads = tensor_to_host(m.gradients());
  std::uint64_t const passes = m.passes();
  auto unchanged = [&] {
    CHECK(same_bits(tensor_to_host(std::as_const(m).parameters()), params));
    CHECK(same_bits(tensor_to_host(std::as_const(m).gradients()), grads));
    CHECK(m.passes() == passes);
  };
  SECTION("a token id outside the vocabulary") {
    tensor<std::int32_t> bad = token_batch(2, 8);
    bad[11] = std::int32_t(V);
    CHECK_THROWS_AS(m.train_step<SoftmaxCrossEntropy>(bad, next, opt), argument_error);
    CHECK_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(bad, next, opt),
                      Catch::Contains("token ids in [0, 13), found 13 at element 11"));
    bad[11] = -1;
    CHECK_THROWS_AS(m.forward(bad), argument_error);
    unchanged();
  }
  SECTION("a sequence longer than the positional table") {
    tensor<std::int32_t> longer = token_batch(1, L + 1), next_longer = token_batch(1, L + 1, 1);
    CHECK_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(longer, next_longer, opt),
                      Catch::Contains("at most 16 tokens (the positional table), found 17"));
    CHECK_THROWS_AS(m.forward(longer), argument_error);
    unchanged();
  }
  SECTION("an empty batch, and sequences of length zero") {
    tensor_view<std::int32_t const> none(ids.data(), 0, 8), empty(ids.data(), 2, 0), labels(next.data(), 0, 8);
    CHECK_THROWS_AS(m.train_step<SoftmaxCrossEntropy>(none, labels, opt), argument_error);
    CHECK_THROWS_WITH(m.forward(empty), Catch::Contains("at least one token, found length 0"));
    unchanged();
  }
  SECTION("labels that are not one per position") {
    tensor<std::int32_t> few = token_batch(2, 7);
    CHECK_THROWS_AS(m.train_step<SoftmaxCrossEntropy>(ids, few, opt), shape_error);
    CHECK_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(ids, few, opt), Catch::Contains("expected 16 labels"));
    unchanged();
  }
  SECTION("a sequence model reading features needs whole sequences") {
    model<Seq<Linear<5, 8>, GPTBlock<8, 2>>> f;
    tensor<float> x(6, 5), t(6, 8);
    // (values: a new tensor's memory is whatever the allocator held, NaN included)
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * float(i % 7);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.0f;
    CHECK_THROWS_WITH(f.forward(x), Catch::Contains("call set_sequence_length first"));
    f.set_sequence_length(4);
    CHECK_THROWS_AS(f.accumulate<MSE>(x, t), shape_error);
    CHECK_THROWS_AS(f.set_sequence_length(0), argument_error);
    f.set_sequence_length(3);
    CHECK(f.forward(x).rows() == 6);
  }
}
