// A fused expression (one pass, intermediates in registers) must give exactly the bits of the same
// expression evaluated one op at a time through fp32 temporaries: fusing saves memory traffic and
// never changes results. The op-by-op evaluator below walks any expression's type.
#include <remat/expr/expr.hpp>
#include <remat/kernels/evaluate.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <deque>
#include <random>
#include <vector>

using namespace remat;
using ftensor = tensor<float>;

namespace {

template <class Op, class A, class B, class A2, class B2>
auto op_like(expr::binary<Op, A, B> const&, A2 const& a, B2 const& b) {
  return expr::binary<Op, A2, B2>(a, b);
}

// Evaluates every inner node of e into its own fp32 tensor; returns a terminal reading the result.
template <class E>
auto op_by_op(E const& e, std::deque<ftensor>& temporaries) {
  if constexpr (expr::is_unary_v<E>) {
    auto a = op_by_op(e.a, temporaries);
    auto& t = temporaries.emplace_back(index_t(e.size()), 1);
    evaluate(t, expr::unary<std::remove_cv_t<decltype(e.op)>, decltype(a)>(e.op, a));
    return to_expr(t);
  } else if constexpr (requires { e.a; e.b; }) {
    auto a = op_by_op(e.a, temporaries);
    auto b = op_by_op(e.b, temporaries);
    auto& t = temporaries.emplace_back(index_t(e.size()), 1);
    evaluate(t, op_like(e, a, b));
    return to_expr(t);
  } else {
    return e;  // a terminal or a constant
  }
}

std::vector<float> random_floats(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class E>
void require_same_bits(E const& e, std::size_t n) {
  ftensor fused(index_t(n), 1), stepwise(index_t(n), 1);
  evaluate(fused, e);
  std::deque<ftensor> temporaries;
  evaluate(stepwise, op_by_op(e, temporaries));
  CHECK(temporaries.size() >= 2);  // it really went op by op
  auto const a = fused.to_vector(), b = stepwise.to_vector();
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) mismatches += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  REQUIRE(mismatches == 0);
}

}  // namespace

TEST_CASE("fusion: forward expressions equal op-by-op evaluation bit for bit in fp32", "[expr][fusion]") {
  // Above and below the size where host passes go parallel.
  for (std::size_t n : {std::size_t(1000), std::size_t(100003)}) {
    ftensor x(index_t(n), 1), y(index_t(n), 1), z(index_t(n), 1);
    x.copy_from(random_floats(n, -3, 3, 1));
    y.copy_from(random_floats(n, -3, 3, 2));
    z.copy_from(random_floats(n, 0.1f, 4, 3));
    require_same_bits(gelu(x * y + z) / (1.0 + exp(-abs(z))) - sqrt(z) * 0.5, n);
    require_same_bits(tanh(y) * sigmoid(x) + silu(z - y) * rsqrt(z), n);
    require_same_bits(gelu_tanh(x) - log(z) * pow(z, 1.5) + relu(y) - max(x, 0.25) * min(y, -0.5), n);
    require_same_bits(erf(x / z) + -(y * y) / 3.0, n);
  }
}

TEST_CASE("fusion: backward expressions from grad equal op-by-op evaluation bit for bit", "[expr][fusion]") {
  std::size_t const n = 50001;
  ftensor x(index_t(n), 1), y(index_t(n), 1), dy(index_t(n), 1);
  x.copy_from(random_floats(n, -3, 3, 4));
  y.copy_from(random_floats(n, 0.5f, 2, 5));
  dy.copy_from(random_floats(n, -1, 1, 6));
  auto X = leaf<0>(x);
  auto Y = leaf<1>(y);
  auto f = gelu(X * Y) + tanh(X) / Y - silu(Y - X) * sigmoid(X);
  require_same_bits(grad(f, X, dy), n);
  require_same_bits(grad(f, Y, dy), n);
  require_same_bits(grad(gelu_tanh(X), X, dy), n);
}

TEST_CASE("fusion: 16-bit tensors load as float, compute in float and round once on store", "[expr][fusion]") {
  std::size_t const n = 4099;
  auto xs = random_floats(n, -4, 4, 7);
  tensor<bfloat16> xb(index_t(n), 1), outb(index_t(n), 1);
  tensor<remat::half> xh(index_t(n), 1), outh(index_t(n), 1);
  ftensor xf(index_t(n), 1), outf(index_t(n), 1);
  std::vector<bfloat16> vb(n);
  std::vector<remat::half> vh(n);
  for (std::size_t i = 0; i < n; ++i) {
    vb[i] = bfloat16(xs[i]);
    vh[i] = remat::half(xs[i]);
  }
  xb.copy_from(vb);
  xh.copy_from(vh);
  for (std::size_t i = 0; i < n; ++i) xf[i] = float(vb[i]);
  evaluate(outb, gelu(xb) * 3.0 + xb);
  evaluate(outf, gelu(xf) * 3.0 + xf);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(outb[i].bits() == bfloat16(outf[i]).bits());
  for (std::size_t i = 0; i < n; ++i) xf[i] = float(vh[i]);
  evaluate(outh, silu(xh) - xh * xh);
  evaluate(outf, silu(xf) - xf * xf);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(outh[i].bits() == remat::half(outf[i]).bits());
}

TEST_CASE("fusion: a bias broadcast over rows and an in-place update", "[expr][fusion]") {
  tensor<float, host, 3> x(4), b(1);
  for (std::size_t i = 0; i < 12; ++i) x[i] = float(i);
  b[0] = 100.0f;
  b[1] = 200.0f;
  b[2] = 300.0f;
  evaluate(x, x + broadcast_rows(b, 4));  // in place: element i reads only element i
  CHECK(x(0, 0) == 100.0f);
  CHECK(x(3, 2) == 311.0f);
  CHECK(x(2, 1) == 207.0f);
  CHECK_THROWS_AS(evaluate(x, x + broadcast_rows(b, 3)), shape_error);
}
