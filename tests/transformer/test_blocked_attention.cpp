// BlockedAttentionCore: attention in memory linear in the sequence. Its gradients against central
// differences (sequences of one panel and of several, dropout on and off), its values against
// AttentionCore's (the function it replaces) and a plain double-precision attention, causality,
// every storage policy (Offloaded included) bit for bit against the stored model, the plan against
// the measured peak, and the plan's linear growth.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/gradients.hpp"
#include "support/lm_training.hpp"
#include "support/reference_attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t V = 11, L = 160, W = 16, H = 4, N = 2;
template <class Core>
using Attn = Seq<Linear<6, 3 * W>, Core, Linear<W, 5>>;
template <class Middle>
using LM = Seq<Embedding<V, W>, PositionEmbedding<L, W>, Dropout<0.1>, Middle, LayerNorm<W>, Linear<W, V>>;
using Block = GPTBlock<W, H, 0.1>;  // (its core the blocked one)
static_assert(std::is_same_v<BlockedAttention<Block>, Block> && !std::is_same_v<StoredAttention<Block>, Block> &&
              std::is_same_v<BlockedAttention<StoredAttention<Block>>, Block>);

template <class T>
tensor<T> features(std::size_t rows, std::size_t cols, double f) {
  tensor<T> x{index_t(rows), index_t(cols)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(float(std::sin(f * double(i) + 0.3) * 1.5));
  return x;
}

template <class T>
std::vector<double> as_doubles(tensor_view<T const> v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = double(v[i]);
  return out;
}

// max |a - b| / max(|b|) over two vectors.
double relative_difference(std::vector<double> const& a, std::vector<double> const& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("blocked attention: gradients against central differences", "[transformer][blocked][gradients]") {
  static_assert(BlockedAttentionCore<4, 1>::panel_rows < 130, "the sequences below must span several panels");
  require_gradients<BlockedAttentionCore<8, 2>>({.batch = 2, .sequence = 5}, 10);
  require_gradients<BlockedAttentionCore<8, 2, 0.25>>({.batch = 2, .sequence = 5}, 10);
  require_gradients<BlockedAttentionCore<6, 3>>({.batch = 1, .sequence = 1}, 10);
  // Inputs in every panel (and the partial last one), with and without dropout.
  require_gradients<BlockedAttentionCore<4, 1>>({.batch = 2, .max_checks_per_tensor = 600, .sequence = 150}, 600);
  require_gradients<BlockedAttentionCore<4, 2, 0.25>>({.batch = 1, .max_checks_per_tensor = 400, .sequence = 130},
                                                      380);
  require_gradients<GPT<11, 6, 8, 2, 2, 0.1>>({.batch = 2, .sequence = 6}, 10);  // (GPTBlock's core)
}

TEST_CASE("blocked attention: the forward against a plain double-precision attention",
          "[transformer][blocked]") {
  constexpr std::size_t w = 8, h = 2, seq = 200, batch = 2;
  model<BlockedAttentionCore<w, h>> m;
  m.set_sequence_length(seq);
  tensor<float> qkv = features<float>(batch * seq, 3 * w, 0.37);
  tensor<float> y = m.forward(qkv);
  std::vector<double> const want = reference_causal_attention(qkv.data(), batch, seq, w, h);
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(y[i]) - want[i]));
  INFO("largest difference from double: " << worst);
  CHECK(worst < 1e-5);
}

namespace {

// One training pass of the same model with either core: loss, parameter gradients, input gradient.
struct pass_result {
  double loss;
  std::vector<double> grads, dx;
};

template <class Core, class P>
pass_result attention_pass(std::size_t batch, std::size_t seq) {
  using M = model<Attn<Core>, host, P>;
  M m(seed{3});
  m.set_sequence_length(seq);
  using T = typename M::value_type;
  tensor<T> x = features<T>(batch * seq, 6, 0.71);
  tensor<T> target = features<T>(batch * seq, 5, 1.3);
  tensor<T> dx{index_t(batch * seq), 6};
  pass_result r;
  r.loss = m.template accumulate<MSE>(x, target, 1.0, &dx);
  r.grads = as_doubles<T>(m.gradients());
  r.dx = as_doubles<T>(dx.view());
  return r;
}

template <std::size_t Heads, double Drop, class P>
void require_same_as_attention_core(std::size_t batch, std::size_t seq, double tolerance) {
  INFO("heads " << Heads << ", dropout " << Drop << ", precision " << P::name << ", batch " << batch << ", seq "
                << seq);
  pass_result const a = attention_pass<AttentionCore<W, Heads, Drop>, P>(batch, seq);
  pass_result const b = attention_pass<BlockedAttentionCore<W, Heads, Drop>, P>(batch, seq);
  CHECK(std::fabs(a.loss - b.loss) <= tolerance * std::fabs(a.loss));
  double const dg = relative_difference(b.grads, a.grads), dx = relative_difference(b.dx, a.dx);
  INFO("parameter gradients differ by " << dg << ", input gradients by " << dx << " (relative to the largest)");
  CHECK(dg <= tolerance);
  CHECK(dx <= tolerance);
}

}  // namespace

TEST_CASE("blocked attention: the same training pass as AttentionCore, dropout on and off",
          "[transformer][blocked]") {
  // fp32: the two differ in the softmax's roundings only (exp(s - lse) against exp(s - max) / sum).
  for (std::size_t seq : {1, 7, 64, 150}) {
    require_same_as_attention_core<4, 0.0, fp32>(3, seq, 2e-6);
    require_same_as_attention_core<2, 0.3, fp32>(2, seq, 2e-6);
  }
  // bf16 activations: the probabilities are rounded to bf16 from different fp32 values now and
  // then, one bf16 unit (2^-8) of a probability.
  require_same_as_attention_core<4, 0.0, mixed<bfloat16>>(2, 150, 0x1p-7);
  require_same_as_attention_core<2, 0.3, mixed<bfloat16>>(2, 130, 0x1p-7);
}

TEST_CASE("blocked attention: the host's two schedules give the same bits", "[transformer][blocked]") {
  // One sequence-head per thread when there are at least as many as threads; otherwise each
  // product batched over all of them. One sequence of one head on 2 threads takes the second, on 1
  // thread the first.
  auto pass = [](int threads) {
    int const before = omp_get_max_threads();
    omp_set_num_threads(threads);
    pass_result const r = attention_pass<BlockedAttentionCore<W, 1, 0.3>, fp32>(1, 150);
    omp_set_num_threads(before);
    return r;
  };
  pass_result const one = pass(1), two = pass(2);
  CHECK(one.loss == two.loss);
  CHECK(one.grads == two.grads);
  CHECK(one.dx == two.dx);
}

TEST_CASE("blocked attention: causal, position by position", "[transformer][blocked]") {
  constexpr std::size_t w = 8, seq = 140;
  model<BlockedAttentionCore<w, 2>> m;
  m.set_sequence_length(seq);
  tensor<float> qkv = features<float>(seq, 3 * w, 0.53);
  tensor<float> const before = m.forward(qkv);
  for (std::size_t t : {0, 63, 64, 100, 139}) {
    tensor<float> changed = features<float>(seq, 3 * w, 0.53);
    for (std::size_t c = 0; c < 3 * w; ++c) changed[t * 3 * w + c] += 0.75f;
    tensor<float> const after = m.forward(changed);
    INFO("position " << t << " changed");
    // Every earlier position's output is bit for bit the same; position t's changes.
    CHECK(std::memcmp(before.data(), after.data(), t * w * sizeof(float)) == 0);
    bool moved = false;
    for (std::size_t c = 0; c < w; ++c) moved = moved || before[t * w + c] != after[t * w + c];
    CHECK(moved);
  }
}

namespace {
// Sequences of 150 positions: three panels, the last partial; 2 steps of 2 of them.
constexpr lm_training::runs<V> lm{2, 2, 150};
}  // namespace

TEST_CASE("blocked attention: every policy trains bit for bit like the stored model, dropout on",
          "[transformer][blocked][policies]") {
  using Blocks = Repeat<N, Block>;
  lm_training::run_result const stored = lm.train<LM<Blocks>>();
  REQUIRE(stored.losses[1] < stored.losses[0]);
  lm.require_same_training<LM<Repeat<N, Checkpointed<Block>>>>(stored, N);
  lm.require_same_training<LM<Checkpointed<Blocks>>>(stored, N);
  lm.require_same_training<LM<Revolve<1, Blocks>>>(stored, revolve::cost(N, 1));
  lm.require_same_training<LM<CheckpointSequential<2, Blocks>>>(stored, N);
  lm.require_same_training<LM<Selective<Blocks>>>(stored, N);
  lm.require_same_training<LM<Repeat<N, Selective<Block>>>>(stored, N);
  lm.require_same_training<LM<Repeat<N, Offloaded<Block>>>>(stored, 0);
  SECTION("in bf16 too") {
    lm_training::run_result const stored16 = lm.train<LM<Blocks>, mixed<bfloat16>>();
    lm.require_same_training<LM<Repeat<N, Checkpointed<Block>>>, mixed<bfloat16>>(stored16, N);
    lm.require_same_training<LM<Selective<Blocks>>, mixed<bfloat16>>(stored16, N);
  }
}

namespace {

// (fp32 and bf16 at each shape)
template <class Net>
void require_plan_matches_everywhere() {
  lm_training::require_plan_matches<Net, V>({{1, 1}, {2, 5}, {3, 64}, {2, 150}});
}

}  // namespace

TEST_CASE("blocked attention plan: the activation plan equals the measured peak", "[transformer][blocked][plan]") {
  require_plan_matches_everywhere<LM<Repeat<N, Block>>>();
  require_plan_matches_everywhere<LM<Repeat<N, Checkpointed<Block>>>>();
  require_plan_matches_everywhere<LM<Revolve<1, Repeat<N, Block>>>>();
}

TEST_CASE("blocked attention plan: what attention keeps grows linearly with the sequence",
          "[transformer][blocked][plan]") {
  // The core alone, reading the caller's projections (batch x seq) x 3W in place: it keeps two fp32
  // numbers per position and head (the softmax's maximum and 1 / sum), so 4x the sequence keeps
  // exactly 4x the bytes (sizes chosen as multiples of the allocator's 256-byte rounding); the
  // stored core keeps the probabilities.
  constexpr std::size_t batch = 4, seq = 512, w = 64, h = 4;
  constexpr auto blocked = sequence_plan<BlockedAttentionCore<w, h>>(batch, seq);
  constexpr auto blocked4 = sequence_plan<BlockedAttentionCore<w, h>>(batch, 4 * seq);
  static_assert(blocked.saved_bytes == batch * h * seq * 2 * sizeof(float));
  static_assert(blocked4.saved_bytes == 4 * blocked.saved_bytes);
  // Its peak (the panels included) grows linearly too; the stored core's with the square.
  static_assert(blocked4.peak_bytes == 4 * blocked.peak_bytes);
  constexpr auto stored = sequence_plan<AttentionCore<w, h>>(batch, seq);
  constexpr auto stored4 = sequence_plan<AttentionCore<w, h>>(batch, 4 * seq);
  static_assert(stored.saved_bytes == batch * h * seq * seq * sizeof(float));
  static_assert(stored4.saved_bytes == 16 * stored.saved_bytes);
  // At 2048 positions: 1024x fewer bytes kept, and a peak over 20x lower.
  static_assert(stored4.saved_bytes == 2 * seq * blocked4.saved_bytes);
  static_assert(stored4.peak_bytes > 20 * blocked4.peak_bytes);
  CHECK(blocked4.peak_bytes * 21 < stored4.peak_bytes);
}
