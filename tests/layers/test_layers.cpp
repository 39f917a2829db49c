// Every layer's backward against central differences in double precision through the public
// gradient checker, plus values checked by hand.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/gradients.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace remat;

namespace {

// A user-defined activation in three lines.
struct softsign_fn {
  template <class X>
  static auto apply(X x) {
    return x / (abs(x) + 1.0);
  }
};
using Softsign = Pointwise<softsign_fn>;
}  // namespace

TEST_CASE("gradients: Linear with and without bias", "[layers][grad]") {
  require_gradients<Seq<Linear<5, 3>>>();
  require_gradients<Seq<Linear<4, 7, false>>>();
}

TEST_CASE("gradients: Linear fused with the point-wise layer after it", "[layers][grad]") {
  require_gradients<Seq<Linear<4, 6>, GELU>>();
  require_gradients<Seq<Linear<4, 6, false>, SiLU>>();
  require_gradients<Seq<Linear<4, 6>, Tanh, Linear<6, 2>, Sigmoid>>();
}

TEST_CASE("gradients: every point-wise layer, and one a user wrote", "[layers][grad]") {
  require_gradients<Seq<ReLU>>();
  require_gradients<Seq<GELU>>();
  require_gradients<Seq<GELUTanh>>();
  require_gradients<Seq<SiLU>>();
  require_gradients<Seq<Tanh>>();
  require_gradients<Seq<Sigmoid>>();
  require_gradients<Seq<Softsign>>();
}

TEST_CASE("gradients: LayerNorm and RMSNorm", "[layers][grad]") {
  require_gradients<Seq<LayerNorm<6>>>();
  require_gradients<Seq<RMSNorm<6>>>();
  require_gradients<Seq<Linear<3, 8>, LayerNorm<8>, Linear<8, 2>>>({.batch = 4});
  // 70 rows: the host's backward takes them in chunks of 32, the last one short.
  require_gradients<Seq<Linear<3, 8>, LayerNorm<8>, Linear<8, 2>>>({.batch = 70});
  require_gradients<Seq<Linear<3, 8>, RMSNorm<8>, Linear<8, 2>>>({.batch = 70});
}

TEST_CASE("gradients: Dropout, with its mask replayed", "[layers][grad]") {
  require_gradients<Seq<Linear<6, 10>, Dropout<0.3>, Linear<10, 3>>>({.batch = 5});
}

TEST_CASE("gradients: Embedding", "[layers][grad]") {
  require_gradients<Seq<Embedding<11, 4>, Linear<4, 3>>>({.batch = 6});
}

TEST_CASE("gradients: Residual and Repeat", "[layers][grad][graph]") {
  using Block = Residual<Seq<LayerNorm<6>, Linear<6, 12>, GELU, Linear<12, 6>>>;
  require_gradients<Seq<Block>>();
  require_gradients<Seq<Linear<3, 6>, Repeat<3, Block>, Linear<6, 2>>>();
  require_gradients<Seq<Residual<Seq<ReLU>>>>();
}

TEST_CASE("gradients: a whole model", "[layers][grad][graph]") {
  using Block = Residual<Seq<LayerNorm<8>, Linear<8, 16>, GELU, Dropout<0.1>, Linear<16, 8>>>;
  using Net = Seq<Linear<5, 8>, ReLU, Repeat<2, Block>, RMSNorm<8>, Linear<8, 3>>;
  require_gradients<Net>({.batch = 4});
}

namespace {
// A hand-written layer (the same interface the built-in ones have): y = Factor x, with a backward
// that is wrong on purpose: dx = dy, changed by Wrong::apply.
template <int Factor, class Wrong>
struct hand_written {
  static constexpr std::size_t in_width = any_width, out_width = any_width, param_count = 0;
  static std::vector<param_desc> params() { return {}; }
  template <class T>
  static void init(T*, std::size_t, std::uint64_t) {}
  template <class T, class D>
  static act<T, D> forward(pass_state<T, D>& s, T const*, act<T, D> x) {
    act<T, D> y = s.make(x->rows(), x->cols());
    evaluate(*y, *x * double(Factor));
    return y;
  }
  template <class T, class D>
  static act<T, D> backward(pass_state<T, D>&, T const*, T*, act<T, D> dy) {
    Wrong::apply(*dy);
    return dy;
  }
};
struct as_is {  // (dx = dy: wrong for y = 2x)
  template <class A>
  static void apply(A&) {}
};
struct nan_at_five {  // (element 5 NaN: a backward that goes wrong on some elements only)
  template <class A>
  static void apply(A& dy) {
    if (dy.size() > 5) dy.data()[5] = std::numeric_limits<typename A::value_type>::quiet_NaN();
  }
};
using wrong_double = hand_written<2, as_is>;
}  // namespace

TEST_CASE("the gradient checker catches a wrong backward", "[layers][grad]") {
  auto const r = check_gradients<Seq<Linear<3, 3>, wrong_double>>();
  INFO(r.summary());
  CHECK_FALSE(r.passed);
  CHECK(r.max_error > 0.1);
  CHECK(r.worst.find("input") != std::string::npos);
}

TEST_CASE("the gradient checker catches a NaN derivative after finite ones", "[layers][grad]") {
  // (input[0] .. input[4] agree; a NaN compares false with every error, so a check that kept the
  // largest by `>` alone passed with it)
  auto const r = check_gradients<Seq<hand_written<1, nan_at_five>>>();
  INFO(r.summary());
  CHECK(r.checked >= 6);
  CHECK_FALSE(r.passed);
  CHECK(std::isnan(r.max_error));
  CHECK(r.worst.find("input[5]") != std::string::npos);
}

TEST_CASE("the gradient checker refuses options out of range, naming them", "[layers][grad][errors]") {
  using Net = Seq<Linear<3, 2>>;
  double const inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  auto const refused = [](auto run, char const* name) {
    INFO(name);
    REQUIRE_THROWS_AS(run(), argument_error);
    CHECK_THROWS_WITH(run(), Catch::Contains(std::string("expected ") + name));
  };
  refused([] { return check_gradients<Net>({.batch = 0}); }, "batch");
  for (double step : {0.0, -1e-6, nan, inf})
    refused([step] { return check_gradients<Net>({.step = step}); }, "step");
  for (double tolerance : {-1e-9, nan, inf})  // (infinity: a check that cannot fail)
    refused([tolerance] { return check_gradients<Net>({.tolerance = tolerance}); }, "tolerance");
  refused([] { return check_gradients<Net>({.max_checks_per_tensor = 0}); }, "max_checks_per_tensor");
  refused([] { return check_gradients<AttentionCore<4, 1>>({.batch = 1, .sequence = 0}); }, "sequence");
  using Ids = Seq<Embedding<11, 4>, Linear<4, 3>>;
  refused([] { return check_gradients<Ids>({.vocabulary = 12}); }, "vocabulary");
  // The ends of each range are taken.
  CHECK(check_gradients<Net>({.tolerance = 0}).checked > 0);
  CHECK(check_gradients<Net>({.max_checks_per_tensor = 1}).passed);
  CHECK(check_gradients<Ids>({.vocabulary = 11}).passed);
  CHECK(check_gradients<AttentionCore<4, 1>>({.batch = 1, .sequence = 1}).passed);
}

TEST_CASE("Linear computes x W^T + b", "[layers]") {
  using M = model<Seq<Linear<2, 2>>>;
  M m;
  auto p = m.parameters();
  float const w[] = {1, 2, 3, 4, 10, 20};  // W = [[1, 2], [3, 4]], b = [10, 20]
  for (std::size_t i = 0; i < 6; ++i) p[i] = w[i];
  tensor<float> x(1, 2);
  x[0] = 1;
  x[1] = -1;
  auto y = m.forward(x);
  CHECK(y[0] == 1 - 2 + 10);
  CHECK(y[1] == 3 - 4 + 20);
}

TEST_CASE("LayerNorm output has zero mean and unit variance per row", "[layers]") {
  model<Seq<LayerNorm<16>>, host, fp64> m;
  tensor<double> x(3, 16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(double(i)) * 5 + double(i % 3);
  auto y = m.forward(x);
  for (std::size_t r = 0; r < 3; ++r) {
    double s = 0, q = 0;
    for (std::size_t c = 0; c < 16; ++c) s += y(r, c);
    for (std::size_t c = 0; c < 16; ++c) q += (y(r, c) - s / 16) * (y(r, c) - s / 16);
    CHECK(std::fabs(s / 16) < 1e-12);
    CHECK(q / 16 == Approx(1.0).epsilon(1e-4));  // eps = 1e-5 in the denominator
  }
}

TEST_CASE("Dropout: the expected fraction is dropped, survivors are scaled, inference is the identity",
          "[layers]") {
  using M = model<Seq<Dropout<0.25>>, host, fp64>;
  M m;
  tensor<double> x(1000, 10), r(1000, 10);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0, r[i] = 1.0;
  tensor<double> dx(1000, 10);
  m.accumulate<detail::projection_loss>(x, r, 1.0, &dx);  // dx = mask
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < dx.size(); ++i) {
    if (dx[i] == 0) ++zeros;
    else REQUIRE(dx[i] == Approx(1.0 / 0.75));
  }
  CHECK(double(zeros) / 10000.0 == Approx(0.25).margin(0.02));
  auto y = m.forward(x);
  for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(y[i] == 1.0);
}

TEST_CASE("philox4x32-10 matches the published known-answer vectors", "[layers][rng]") {
  auto r = philox::generate({{0, 0, 0, 0}}, 0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  r = philox::generate({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(r.v[0] == 0x408f276du);
  CHECK(r.v[1] == 0x41c83b0eu);
  CHECK(r.v[2] == 0xa20bc7c6u);
  CHECK(r.v[3] == 0x6d5451fdu);
  r = philox::generate({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(r.v[0] == 0xd16cfe09u);
  CHECK(r.v[1] == 0x94fdccebu);
  CHECK(r.v[2] == 0x5001e420u);
  CHECK(r.v[3] == 0x24126ea1u);
}

TEST_CASE("init: each value a function of the seed and its position, however the work is split", "[layers][init]") {
  // 100,003 values (past the size the host splits across threads), from parameter 12,345 on: the
  // same bits as the definition computed here one value at a time, as one call or as two, and on
  // one thread or on all of them.
  std::size_t const n = 100003, offset = 12345;
  std::uint64_t const seed = 99;
  std::vector<float> u(n), g(n), u2(n), g2(n);
  init::uniform(u.data(), n, offset, seed, 0.25);
  init::normal(g.data(), n, offset, seed, 0.02);
  for (std::size_t i = 0; i < n; i += 997) {
    double const x = double(philox::uniform(seed, init::init_stream, offset + i));
    REQUIRE(u[i] == float((2.0 * x - 1.0) * 0.25));
    double const u1 = double(philox::uniform(seed, init::init_stream + 1, 2 * (offset + i))) + 0x1p-25;
    double const v = double(philox::uniform(seed, init::init_stream + 1, 2 * (offset + i) + 1));
    REQUIRE(g[i] == float(0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * v)));
  }
  init::uniform(u2.data(), 40000, offset, seed, 0.25);
  init::uniform(u2.data() + 40000, n - 40000, offset + 40000, seed, 0.25);
  CHECK(u2 == u);
#if defined(_OPENMP)
  int const threads = omp_get_max_threads();
  omp_set_num_threads(1);
  init::normal(g2.data(), n, offset, seed, 0.02);
  omp_set_num_threads(threads);
  CHECK(g2 == g);
#endif
}
