// The model: deterministic initialisation with PyTorch's schemes, inference that saves nothing,
// and bad input refused with a clear error before anything (model or optimizer) changes.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

using namespace remat;

namespace {
using Net = Seq<Linear<6, 32>, GELU, Residual<Seq<LayerNorm<32>, Linear<32, 32>, ReLU>>, Linear<32, 4>>;

template <class V>
bool same_bits(V const& a, V const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
}
}  // namespace

TEST_CASE("model: initialisation is a function of the seed", "[graph][model]") {
  model<Net> a{seed{42}}, b{seed{42}}, c{seed{43}};
  CHECK(same_bits(tensor_to_host(a.parameters()), tensor_to_host(b.parameters())));
  CHECK_FALSE(same_bits(tensor_to_host(a.parameters()), tensor_to_host(c.parameters())));
  CHECK(a.parameters().size() == 6 * 32 + 32 + 2 * 32 + 32 * 32 + 32 + 32 * 4 + 4);
}

TEST_CASE("model: PyTorch's default initialisation schemes", "[graph][model]") {
  using M = model<Seq<Linear<64, 256>, LayerNorm<256>>>;
  STATIC_REQUIRE(M::parameter_count == 64 * 256 + 256 + 512);
  M m{seed{7}};
  auto p = tensor_to_host(m.parameters());
  double const bound = 1.0 / 8.0;  // 1 / sqrt(64)
  double sum = 0, sq = 0;
  for (std::size_t i = 0; i < 64 * 256; ++i) {
    REQUIRE(std::fabs(p[i]) <= bound);
    sum += p[i];
    sq += double(p[i]) * p[i];
  }
  double const n = 64 * 256;
  CHECK(std::fabs(sum / n) < 0.003);
  CHECK(sq / n == Approx(bound * bound / 3).epsilon(0.03));  // U(-b, b) has variance b^2 / 3
  for (std::size_t i = 64 * 256; i < 64 * 256 + 256; ++i) REQUIRE(std::fabs(p[i]) <= bound);  // bias
  for (std::size_t i = 0; i < 256; ++i) {
    REQUIRE(p[64 * 256 + 256 + i] == 1.0f);        // LayerNorm weight
    REQUIRE(p[64 * 256 + 256 + 256 + i] == 0.0f);  // LayerNorm bias
  }
  model<Seq<Embedding<50, 40>>> e{seed{7}};
  auto const q = tensor_to_host(e.parameters());
  double es = 0, eq = 0;
  for (float v : q) es += v, eq += double(v) * v;
  CHECK(std::fabs(es / 2000) < 0.07);
  CHECK(eq / 2000 == Approx(1.0).epsilon(0.08));  // N(0, 1)
}

TEST_CASE("model: inference keeps nothing for backward", "[graph][model][memory]") {
  memory::caching_allocator<host> alloc;
  model<Net> m{seed{1}, alloc};
  tensor<float> x(64, 6, memory::tag::workspace, alloc);
  evaluate(x, to_expr(0.5));
  alloc.reset_peak();
  auto const base = alloc.stats(memory::tag::activations).in_use;
  tensor<float> y = m.forward(x);
  auto const s = alloc.stats(memory::tag::activations);
  CHECK(s.in_use - base == 64 * 4 * 4);  // only the output remains (1024 bytes, a multiple of 256)
  // The peak is inside the residual block: its input (kept for the add), LayerNorm's output and
  // the fused Linear + ReLU output (computed in place): three 64 x 32 tensors. A training pass
  // would keep every layer's input on top.
  CHECK(s.peak - base == 3 * alloc.rounded(64 * 32 * 4));
}

namespace {

struct step_result {
  std::vector<float> grads, dx;
  std::size_t peak = 0;
};

// One accumulate on a fixed batch of 64 rows, with or without the input gradient, in a fresh
// allocator; the activation peak it measured.
template <class NetT, class Precision = fp32>
step_result accumulate_once(bool input_gradient) {
  memory::caching_allocator<host> alloc;
  model<NetT, host, Precision> m{seed{9}, alloc};
  tensor<float> x(64, index_t(NetT::in_width)), t(64, index_t(NetT::out_width)), dx(64, index_t(NetT::in_width));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.11 * double(i)));
  alloc.reset_peak();
  m.template accumulate<MSE>(x, t, 1.0, input_gradient ? &dx : nullptr);
  step_result r;
  r.peak = alloc.stats(memory::tag::activations).peak;
  r.grads = tensor_to_host(m.gradients());
  if (input_gradient) r.dx = dx.to_vector();
  return r;
}

template <class NetT, class Precision = fp32>
void require_input_gradient_optional() {
  step_result const with = accumulate_once<NetT, Precision>(true), without = accumulate_once<NetT, Precision>(false);
  CHECK(same_bits(with.grads, without.grads));  // the parameters' gradients do not depend on it
  CHECK(std::any_of(with.dx.begin(), with.dx.end(), [](float v) { return v != 0.0f; }));
  auto const planned_with = activation_plan<NetT, Precision>(64, NetT::in_width, 1, input_gradient::wanted);
  auto const planned_without = activation_plan<NetT, Precision>(64);
  CHECK(with.peak == planned_with.peak_bytes);
  CHECK(without.peak == planned_without.peak_bytes);
  CHECK(planned_without.peak_bytes <= planned_with.peak_bytes);
}

}  // namespace

TEST_CASE("model: the layer that takes the input computes no input gradient unless one is asked for",
          "[graph][model][memory]") {
  // The first Linear's dx = dy W (64 x 512 here) is neither multiplied nor allocated. By hand:
  // with it, the peak is that buffer and the gradient it is made from (64 x 16); without it, the
  // peak is at the second Linear's backward: the first one's kept pre-activation and output (its
  // input is the caller's, read in place), the loss gradient (64 x 4) and the second's dx.
  using Wide = Seq<Linear<512, 16>, GELU, Linear<16, 4>>;
  require_input_gradient_optional<Wide>();
  constexpr auto with = activation_plan<Wide>(64, 512, 1, input_gradient::wanted), without = activation_plan<Wide>(64);
  static_assert(with.peak_bytes == 64 * 512 * 4 + 64 * 16 * 4);
  static_assert(without.peak_bytes == 3 * 64 * 16 * 4 + 64 * 4 * 4);
  // A first block whose norm reads the input: LayerNorm (and RMSNorm) compute their parameters'
  // gradients only, and the residual passes the hollow gradient on without adding.
  require_input_gradient_optional<Seq<Residual<Seq<LayerNorm<24>, Linear<24, 24>, GELU, Linear<24, 24>>>, Linear<24, 3>>>();
  require_input_gradient_optional<Seq<Residual<Seq<RMSNorm<24>, Linear<24, 24>>>, Linear<24, 3>>>();
  require_input_gradient_optional<Net>();
  // Under policies (their kept input is the pass's input), and in mixed precision (the input is
  // converted: the converted tensor is the pass's input).
  require_input_gradient_optional<Seq<Checkpointed<Seq<Linear<40, 16>, GELU, Dropout<0.2>, Linear<16, 16>>>, Linear<16, 3>>>();
  require_input_gradient_optional<Seq<Selective<Seq<Linear<40, 16>, GELU, Linear<16, 16>>>, Linear<16, 3>>>();
  require_input_gradient_optional<Revolve<2, Repeat<4, Residual<Seq<LayerNorm<8>, Linear<8, 8>, Tanh>>>>>();
  require_input_gradient_optional<Seq<Linear<40, 16>, GELU, Linear<16, 3>>, mixed<bfloat16>>();
  // A hollow input gradient never reaches the caller: a point-wise first layer still gives one.
  require_input_gradient_optional<Seq<Tanh, Linear<8, 8>, Linear<8, 3>>>();
}

namespace {
// Two models alike: one's gradients cleared by zero_grad (its passes write a layer's gradients
// over them), the other's zeros written through gradients() (no longer known to be zero: its
// passes add onto them). Two micro-batches each; the same values after each.
template <class P>
void require_written_over_equals_added() {
  model<Net, host, P> over{seed{11}}, onto{seed{11}};
  tensor<float> x(16, 6), t(16, 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.7f);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::cos(float(i) * 0.4f);
  over.zero_grad();
  auto zeros = onto.gradients();
  std::fill(zeros.data(), zeros.data() + zeros.size(), 0.0f);
  std::vector<float> first;
  for (int pass = 0; pass < 2; ++pass) {
    over.template accumulate<MSE>(x, t);
    onto.template accumulate<MSE>(x, t);
    auto const a = std::as_const(over).gradients(), b = std::as_const(onto).gradients();
    std::size_t differ = 0, nonzero = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differ += a.data()[i] != b.data()[i], nonzero += a.data()[i] != 0;
    CHECK(differ == 0);
    CHECK(nonzero > a.size() / 2);
    if (pass == 0) {
      first.assign(a.data(), a.data() + a.size());
    } else {  // the second micro-batch added onto the first (the same batch: about twice it; the
              // column sums add row by row, so not always exactly: where a bias's gradient is a sum
              // that nearly cancels, its rounding is an ulp of the terms, not of the sum, so the
              // bound has a floor of 1e-7 of the largest gradient)
      float largest = 0;
      for (float g : first) largest = std::max(largest, std::fabs(g));
      std::size_t doubled = 0, worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        float const off = std::fabs(a.data()[i] - 2 * first[i]);
        doubled += off <= 1e-5f * std::fabs(2 * first[i]) + 1e-7f * largest;
        // (the worst: furthest from twice its first value, relative to it)
        if (off * std::fabs(first[worst]) > std::fabs(a.data()[worst] - 2 * first[worst]) * std::fabs(first[i]))
          worst = i;
      }
      INFO("worst: element " << worst << ", " << a.data()[worst] << " after two passes, " << first[worst]
                             << " after one; the largest gradient " << largest);
      CHECK(doubled == a.size());
    }
  }
}
}  // namespace

TEST_CASE("model: a pass on zeroed gradients writes them over, the values of adding onto zeros",
          "[graph][model]") {
  require_written_over_equals_added<fp32>();
  require_written_over_equals_added<mixed<bfloat16>>();
}

TEST_CASE("model: the gradients a pass adds onto, which train_step zeroes (the rest it writes over)",
          "[graph][model]") {
  using R = std::vector<param_range>;
  // Net: Linear<6, 32> [0, 224), GELU, LayerNorm<32> [224, 288), Linear<32, 32> [288, 1344),
  // Linear<32, 4> [1344, 1476): the norm's only.
  CHECK(detail::gradients_added_onto<Net>(1476) == R{{224, 288}});
  // A block of LayerNorm<8> (16) and Linear<8, 8, false> (64), three times; room past them.
  using Blocks = Repeat<3, Residual<Seq<LayerNorm<8>, Linear<8, 8, false>>>>;
  CHECK(detail::gradients_added_onto<Blocks>(240) == R{{0, 16}, {80, 96}, {160, 176}});
  CHECK(detail::gradients_added_onto<Checkpointed<Blocks>>(250) == R{{0, 16}, {80, 96}, {160, 176}, {240, 250}});
  // Linears alone (adjacent, merged): nothing; a model without parameters: its one stored element.
  CHECK(detail::gradients_added_onto<Seq<Linear<3, 4>, Tanh, Linear<4, 2, false>>>(24) == R{});
  CHECK(detail::gradients_added_onto<Seq<Tanh>>(1) == R{{0, 1}});
  // An embedding and a norm add onto theirs; the head's Linear writes over its own.
  using LM = Seq<Embedding<5, 4>, LayerNorm<4>, Linear<4, 5>>;
  CHECK(detail::gradients_added_onto<LM>(53) == R{{0, 28}});
}

namespace {
// Two models alike, one's gradients poisoned with NaN through gradients() before each train_step:
// whatever train_step leaves unzeroed its pass writes over, so both train on bit for bit.
template <class NetT, class P>
void require_train_step_ignores_stale_gradients(std::size_t in, std::size_t out) {
  model<NetT, host, P> clean{seed{5}}, poisoned{seed{5}};
  AdamW a(clean, {.lr = 1e-2}), b(poisoned, {.lr = 1e-2});
  tensor<float> x(12, in), t(12, out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.9f);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::cos(float(i) * 0.3f);
  for (int step = 0; step < 3; ++step) {
    auto g = poisoned.gradients();
    std::fill(g.data(), g.data() + g.size(), std::numeric_limits<float>::quiet_NaN());
    double const la = clean.template train_step<MSE>(x, t, a), lb = poisoned.template train_step<MSE>(x, t, b);
    CHECK(std::isfinite(la));
    CHECK(std::memcmp(&la, &lb, sizeof la) == 0);
    auto const ga = tensor_to_host(std::as_const(clean).gradients()), gb = tensor_to_host(std::as_const(poisoned).gradients());
    CHECK(same_bits(ga, gb));
    CHECK(same_bits(tensor_to_host(clean.parameters()), tensor_to_host(poisoned.parameters())));
  }
}
}  // namespace

TEST_CASE("model: train_step on stale gradients trains as on zeroed ones, bit for bit", "[graph][model]") {
  require_train_step_ignores_stale_gradients<Net, fp32>(6, 4);
  require_train_step_ignores_stale_gradients<Net, mixed<bfloat16>>(6, 4);
  using Blocks = Seq<Linear<5, 8>, Checkpointed<Repeat<3, Residual<Seq<LayerNorm<8>, Linear<8, 8, false>, GELU>>>>,
                     Linear<8, 3>>;
  require_train_step_ignores_stale_gradients<Blocks, fp32>(5, 3);
  require_train_step_ignores_stale_gradients<Blocks, mixed<bfloat16>>(5, 3);
}

TEST_CASE("model: a training step lowers the loss", "[graph][model]") {
  model<Net> m{seed{3}};
  AdamW opt(m, {.lr = 3e-3});
  tensor<float> x(32, 6);
  tensor<std::int32_t> y(32, 1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.3f);
  for (std::size_t r = 0; r < 32; ++r) y[r] = x(r, 0) > 0 ? (x(r, 1) > 0 ? 0 : 1) : (x(r, 2) > 0 ? 2 : 3);
  double const first = m.train_step<SoftmaxCrossEntropy>(x, y, opt);
  double last = first;
  for (int i = 0; i < 60; ++i) last = m.train_step<SoftmaxCrossEntropy>(x, y, opt);
  CHECK(last < 0.2 * first);
  CHECK(opt.steps() == 61);
}

TEST_CASE("model: bad input throws a clear error and changes neither the model nor the optimizer",
          "[graph][model][errors]") {
  model<Net> m{seed{5}};
  AdamW opt(m);
  tensor<float> x(8, 6), t(8, 4);
  tensor<std::int32_t> labels(8, 1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * float(i % 5);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.0f;
  for (std::size_t i = 0; i < 8; ++i) labels[i] = std::int32_t(i % 4);
  m.train_step<SoftmaxCrossEntropy>(x, labels, opt);  // some optimizer state to protect
  auto const p0 = tensor_to_host(m.parameters()), g0 = tensor_to_host(m.gradients());
  auto const m0 = opt.exp_avg().to_vector(), v0 = opt.exp_avg_sq().to_vector();
  auto const steps0 = opt.steps();
  auto const passes0 = m.passes();

  tensor<float> narrow(8, 5);
  CHECK_THROWS_AS(m.train_step<SoftmaxCrossEntropy>(narrow, labels, opt), shape_error);
  CHECK_THROWS_WITH(m.forward(narrow), Catch::Contains("expected 6 features per row, found 5"));

  tensor<float> nan_x(8, 6);
  evaluate(nan_x, to_expr(x));
  nan_x[13] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(nan_x, labels, opt), Catch::Contains("NaN"));
  nan_x[13] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(m.train_step<MSE>(nan_x, t, opt), argument_error);

  CHECK_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(x.row_range(0, 0), labels.row_range(0, 0), opt),
                    Catch::Contains("at least one row, found 0"));

  tensor<std::int32_t> bad_labels(8, 1);
  evaluate(bad_labels, to_expr(labels));
  bad_labels[3] = 4;
  CHECK_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(x, bad_labels, opt),
                    Catch::Contains("classes in [0, 4), found 4 at label 3"));
  bad_labels[3] = -1;
  CHECK_THROWS_AS(m.train_step<SoftmaxCrossEntropy>(x, bad_labels, opt), argument_error);
  CHECK_THROWS_AS(m.train_step<SoftmaxCrossEntropy>(x, labels.row_range(0, 7), opt), shape_error);

  tensor<float> wrong_t(8, 3);
  CHECK_THROWS_WITH(m.train_step<MSE>(x, wrong_t, opt), Catch::Contains("expected 8 x 4") && Catch::Contains("found 8 x 3"));

  // Input and target both bad: the input is checked first (its device check is issued first and
  // read even when the target's check throws).
  CHECK_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(nan_x, bad_labels, opt), Catch::Contains("model input"));
  CHECK_THROWS_WITH(m.train_step<MSE>(nan_x, wrong_t, opt), Catch::Contains("model input: expected finite"));
  CHECK_THROWS_WITH(m.loss<MSE>(nan_x, wrong_t), Catch::Contains("model input: expected finite"));
  CHECK_THROWS_WITH(m.training_loss<SoftmaxCrossEntropy>(x, bad_labels), Catch::Contains("classes in [0, 4)"));

  CHECK(same_bits(tensor_to_host(m.parameters()), p0));
  CHECK(same_bits(tensor_to_host(m.gradients()), g0));
  CHECK(same_bits(opt.exp_avg().to_vector(), m0));
  CHECK(same_bits(opt.exp_avg_sq().to_vector(), v0));
  CHECK(opt.steps() == steps0);
  CHECK(m.passes() == passes0);
}

TEST_CASE("model: token ids out of the vocabulary are refused", "[graph][model][errors]") {
  model<Seq<Embedding<10, 4>, Linear<4, 2>>> m{seed{1}};
  auto const p0 = tensor_to_host(m.parameters());
  tensor<std::int32_t> ids(3, 1);
  ids[0] = 1, ids[1] = 10, ids[2] = 2;
  CHECK_THROWS_WITH(m.forward(ids), Catch::Contains("token ids in [0, 10), found 10 at element 1"));
  ids[1] = 9;
  CHECK(m.forward(ids).rows() == 3);
  CHECK(same_bits(tensor_to_host(m.parameters()), p0));
}

TEST_CASE("model: models trained on two threads at once equal each trained alone, bit for bit",
          "[graph][model][threads]") {
  // The guarantee for threads: a model (with its optimizer) is used by one thread at a time, and
  // models on different threads do not disturb each other, even on the shared default allocator.
  using Block = Residual<Seq<LayerNorm<32>, Linear<32, 64>, GELU, Dropout<0.1>, Linear<64, 32>>>;
  using Threaded = Seq<Linear<8, 32>, Repeat<3, Checkpointed<Block>>, Linear<32, 3>>;
  auto train = [](std::uint64_t s) {
    model<Threaded> m{seed{s}};
    AdamW opt(m, {.lr = 1e-2});
    tensor<float> x{64, 8};
    tensor<std::int32_t> y{64, 1};
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.1 * double(i + s)));
    for (std::size_t r = 0; r < y.size(); ++r) y[r] = std::int32_t((r + s) % 3);
    for (int step = 0; step < 20; ++step) m.train_step<SoftmaxCrossEntropy>(x, y, opt);
    return tensor_to_host(m.parameters());
  };
  std::vector<float> const a_alone = train(1), b_alone = train(2);
  REQUIRE_FALSE(same_bits(a_alone, b_alone));
  std::vector<float> a, b;
  std::thread first([&] { a = train(1); });
  std::thread second([&] { b = train(2); });
  first.join();
  second.join();
  CHECK(same_bits(a, a_alone));
  CHECK(same_bits(b, b_alone));
}
