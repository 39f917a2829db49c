// Every op's compile-time derivative against central differences in double precision, at random
// points and at the hard places: near kinks (closer than any sane step, farther than ours) and in
// saturation, where a derivative that is correct but tiny must not come out as 0 or NaN.
#include <remat/expr/expr.hpp>
#include <remat/kernels/evaluate.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

using namespace remat;

namespace {

std::vector<double> uniform(double lo, double hi, int n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

tensor<double> column(std::vector<double> const& v) {
  tensor<double> t(index_t(v.size()), 1);
  t.copy_from(v);
  return t;
}

// d f / d x by the expression grad, checked against central differences at every point.
template <class F>
void check_unary(char const* name, F f, std::vector<double> const& xs) {
  std::size_t const n = xs.size();
  tensor<double> x = column(xs), g(index_t(n), 1), fx(index_t(n), 1), fp(index_t(n), 1), fm(index_t(n), 1);
  tensor<double> xp(index_t(n), 1), xm(index_t(n), 1), hs(index_t(n), 1);
  for (std::size_t i = 0; i < n; ++i) {
    hs[i] = 1e-6 * std::max(1e-2, std::fabs(xs[i]));
    xp[i] = xs[i] + hs[i];
    xm[i] = xs[i] - hs[i];
  }
  auto X = leaf<0>(x);
  evaluate(g, grad(f(X), X));
  evaluate(fx, f(X));
  evaluate(fp, f(to_expr(xp)));
  evaluate(fm, f(to_expr(xm)));
  for (std::size_t i = 0; i < n; ++i) {
    double const h = (xp[i] - xm[i]) / 2;  // the step actually taken
    double const fd = (fp[i] - fm[i]) / (2 * h);
    // Truncation is O(h^2); rounding in f(x +- h) is ~eps |f| / h.
    double const tol = 1e-7 * std::fabs(fd) + 4 * DBL_EPSILON * (std::fabs(fx[i]) + 1) / h;
    INFO(name << " at x = " << xs[i] << ": grad " << g[i] << ", central difference " << fd);
    REQUIRE(std::isfinite(g[i]));
    REQUIRE(std::fabs(g[i] - fd) <= tol);
  }
}

// Both partial derivatives of a function of two variables.
template <class F>
void check_binary(char const* name, F f, std::vector<double> const& xs, std::vector<double> const& ys) {
  std::size_t const n = xs.size();
  tensor<double> x = column(xs), y = column(ys), gx(index_t(n), 1), gy(index_t(n), 1), fx(index_t(n), 1);
  auto X = leaf<0>(x);
  auto Y = leaf<1>(y);
  evaluate(gx, grad(f(X, Y), X));
  evaluate(gy, grad(f(X, Y), Y));
  evaluate(fx, f(X, Y));
  for (std::size_t i = 0; i < n; ++i) {
    double const hx = 1e-6 * std::max(1e-2, std::fabs(xs[i])), hy = 1e-6 * std::max(1e-2, std::fabs(ys[i]));
    auto value = [&](double a, double b) {
      tensor<double> ta = column({a}), tb = column({b}), out(1, 1);
      evaluate(out, f(to_expr(ta), to_expr(tb)));
      return out[0];
    };
    double const fdx = (value(xs[i] + hx, ys[i]) - value(xs[i] - hx, ys[i])) / (2 * hx);
    double const fdy = (value(xs[i], ys[i] + hy) - value(xs[i], ys[i] - hy)) / (2 * hy);
    double const round = 4 * DBL_EPSILON * (std::fabs(fx[i]) + 1);
    INFO(name << " at (" << xs[i] << ", " << ys[i] << "): grad (" << gx[i] << ", " << gy[i] << "), differences ("
              << fdx << ", " << fdy << ")");
    REQUIRE(std::fabs(gx[i] - fdx) <= 1e-7 * std::fabs(fdx) + round / hx);
    REQUIRE(std::fabs(gy[i] - fdy) <= 1e-7 * std::fabs(fdy) + round / hy);
  }
}

std::vector<double> with(std::vector<double> v, std::initializer_list<double> extra) {
  v.insert(v.end(), extra);
  return v;
}

}  // namespace

TEST_CASE("derivatives: arithmetic", "[expr][grad]") {
  auto xs = uniform(-4, 4, 200, 1), ys = with(uniform(0.3, 4, 197, 2), {-0.5, -2.0, -3.5});
  check_binary("x + y", [](auto x, auto y) { return x + y; }, xs, ys);
  check_binary("x - y", [](auto x, auto y) { return x - y; }, xs, ys);
  check_binary("x * y", [](auto x, auto y) { return x * y; }, xs, ys);
  check_binary("x / y", [](auto x, auto y) { return x / y; }, xs, ys);
  check_binary("-x * y - y", [](auto x, auto y) { return -x * y - y; }, xs, ys);
  check_binary("2.5 - x / 3 + 1 / y", [](auto x, auto y) { return 2.5 - x / 3.0 + 1.0 / y; }, xs, ys);
  check_unary("x * x * x", [](auto x) { return x * x * x; }, xs);
}

TEST_CASE("derivatives: exp, log, sqrt, rsqrt, pow", "[expr][grad]") {
  auto pos = with(uniform(0.05, 6, 200, 3), {1e-3, 50.0, 400.0});
  check_unary("exp", [](auto x) { return exp(x); }, with(uniform(-5, 5, 200, 4), {-30.0, 30.0}));
  check_unary("log", [](auto x) { return log(x); }, pos);
  check_unary("sqrt", [](auto x) { return sqrt(x); }, pos);
  check_unary("rsqrt", [](auto x) { return rsqrt(x); }, pos);
  check_unary("pow 2.5", [](auto x) { return pow(x, 2.5); }, pos);
  check_unary("pow -1.5", [](auto x) { return pow(x, -1.5); }, pos);
  check_unary("pow 3 (negative x)", [](auto x) { return pow(x, 3.0); }, uniform(-3, 3, 100, 5));
}

TEST_CASE("derivatives: saturating functions, in and out of saturation", "[expr][grad]") {
  auto xs = with(uniform(-5, 5, 200, 6), {-40.0, -20.0, -10.0, 10.0, 20.0, 40.0});
  check_unary("tanh", [](auto x) { return tanh(x); }, xs);
  check_unary("sigmoid", [](auto x) { return sigmoid(x); }, xs);
  check_unary("erf", [](auto x) { return erf(x); }, with(uniform(-3, 3, 200, 7), {-5.0, 5.0}));
  check_unary("gelu", [](auto x) { return gelu(x); }, xs);
  // GELU's derivative and the density are ops of their own; theirs in turn (a second derivative)
  check_unary("gelu's derivative", [](auto x) { return expr::make_unary(expr::gelu_grad_op{}, to_expr(x)); }, xs);
  check_unary("the normal density", [](auto x) { return expr::make_unary(expr::normal_pdf_op{}, to_expr(x)); }, xs);
  check_unary("gelu_tanh", [](auto x) { return gelu_tanh(x); }, xs);
  check_unary("silu", [](auto x) { return silu(x); }, xs);
}

TEST_CASE("derivatives: kinks (abs, relu, max, min) just either side", "[expr][grad]") {
  auto xs = with(uniform(-3, 3, 200, 8), {-1e-3, 1e-3, -1e-5, 1e-5});
  check_unary("abs", [](auto x) { return abs(x); }, xs);
  check_unary("relu", [](auto x) { return relu(x); }, xs);
  auto near_c = with(uniform(-3, 3, 200, 9), {0.5 - 1e-4, 0.5 + 1e-4});
  check_unary("max(x, 0.5)", [](auto x) { return max(x, 0.5); }, near_c);
  check_unary("min(x, 0.5)", [](auto x) { return min(x, 0.5); }, near_c);
  check_unary("max(-1, x)", [](auto x) { return max(-1.0, x); }, xs);
}

TEST_CASE("derivatives: at a kink the one-sided convention is PyTorch's", "[expr][grad]") {
  tensor<double> x = column({0.0, 0.5, -1.0});
  tensor<double> g(3, 1);
  auto X = leaf<0>(x);
  evaluate(g, grad(relu(X), X));
  CHECK(g[0] == 0.0);  // relu'(0) = 0
  evaluate(g, grad(abs(X), X));
  CHECK(g[0] == 0.0);  // abs'(0) = 0
  evaluate(g, grad(max(X, 0.5), X));
  CHECK(g[1] == 1.0);  // clamp passes the gradient at the bound
  evaluate(g, grad(min(X, -1.0), X));
  CHECK(g[2] == 1.0);
}

TEST_CASE("derivatives: compositions and repeated variables", "[expr][grad]") {
  auto xs = uniform(-2, 2, 150, 10), ys = uniform(0.5, 2, 150, 11);
  check_binary("tanh(x*y) + log(abs(x)+1)/y",
               [](auto x, auto y) { return tanh(x * y) + log(abs(x) + 1.0) / y; }, xs, ys);
  check_binary("gelu(x*y + x) * sigmoid(y - x)",
               [](auto x, auto y) { return gelu(x * y + x) * sigmoid(y - x); }, xs, ys);
  check_binary("sqrt(x*x + y) * exp(-y) - silu(x)/y",
               [](auto x, auto y) { return sqrt(x * x + y) * exp(-y) - silu(x) / y; }, xs, ys);
  check_unary("rsqrt(x*x + 1) * erf(x)", [](auto x) { return rsqrt(x * x + 1.0) * erf(x); }, xs);
}

TEST_CASE("derivatives: the seeded form is the backward pass dy * f'(x)", "[expr][grad]") {
  auto xs = uniform(-3, 3, 100, 12), dys = uniform(-2, 2, 100, 13);
  tensor<double> x = column(xs), dy = column(dys), g(100, 1), gs(100, 1);
  auto X = leaf<0>(x);
  evaluate(g, grad(silu(X), X));
  evaluate(gs, grad(silu(X), X, dy));
  for (std::size_t i = 0; i < 100; ++i) CHECK(gs[i] == Approx(dys[i] * g[i]).epsilon(1e-13));
}

TEST_CASE("derivatives: piecewise-constant ops and other variables differentiate to zero", "[expr][grad]") {
  tensor<double> x = column({-1.0, 0.5, 2.0}), y = column({3.0, 4.0, 5.0}), g(3, 1);
  auto X = leaf<0>(x);
  auto Y = leaf<1>(y);
  using G1 = decltype(grad(step(X) + sign(X), X));
  using G2 = decltype(grad(exp(Y) * 2.0, X));
  STATIC_REQUIRE(std::is_same_v<G1, expr::zero_t>);  // known at compile time
  STATIC_REQUIRE(std::is_same_v<G2, expr::zero_t>);
  g[0] = 7.0;
  evaluate(g, grad(exp(Y) * 2.0, X));
  CHECK(g[0] == 0.0);
  CHECK(g[2] == 0.0);
}

TEST_CASE("forward values match the standard library in double", "[expr]") {
  auto xs = uniform(-4, 4, 300, 14);
  tensor<double> x = column(xs), out(300, 1);
  auto check = [&](char const* name, auto e, auto ref) {
    evaluate(out, e);
    for (std::size_t i = 0; i < 300; ++i) {
      INFO(name << " at " << xs[i]);
      REQUIRE(out[i] == Approx(ref(xs[i])).epsilon(1e-11).margin(1e-300));
    }
  };
  check("gelu", gelu(x), [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); });
  check("gelu's derivative", expr::make_unary(expr::gelu_grad_op{}, to_expr(x)), [](double v) {
    return 0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI);
  });
  check("gelu_tanh", gelu_tanh(x), [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  });
  check("silu", silu(x), [](double v) { return v / (1 + std::exp(-v)); });
  check("sigmoid", sigmoid(x), [](double v) { return 1 / (1 + std::exp(-v)); });
  check("relu", relu(x), [](double v) { return v > 0 ? v : 0.0; });
  check("min", min(x, 1.0), [](double v) { return std::min(v, 1.0); });
  check("max", max(x, 1.0), [](double v) { return std::max(v, 1.0); });
  check("abs", abs(x), [](double v) { return std::fabs(v); });
  check("pow", pow(abs(x), 1.7), [](double v) { return std::pow(std::fabs(v), 1.7); });
  check("rsqrt", rsqrt(abs(x) + 1.0), [](double v) { return 1 / std::sqrt(std::fabs(v) + 1); });
}
