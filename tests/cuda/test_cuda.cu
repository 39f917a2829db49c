// The CUDA backend against the host backend and against independent truth. Every kernel and
// model here runs on remat::cuda; the reference is the same computation on remat::host (whose
// own tests check it against finite differences and hand-computed values), double-precision
// products computed here, and central differences of an fp64 model on the GPU. Bit-for-bit checks
// are the design's promises: storage policies and recomputation on one device.
//
// Built by nvcc in CI (no GPU there); run on a GPU with `ctest -L cuda`. Without a device the
// runner exits with 77, which ctest reports as skipped.
#include <remat/cuda/granules.hpp>
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

using namespace remat;
using kernels::trans;
using gpu = remat::cuda;  // (libcu++ owns the namespace ::cuda)
using bf16 = remat::bfloat16;
using f16 = remat::half;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(d(rng));
  return v;
}

template <class T, class D = gpu>
tensor<T, D> make(index_t rows, index_t cols, std::vector<T> const& values) {
  tensor<T, D> t(rows, cols);
  t.copy_from(values);
  return t;
}

template <class T>
double as_double(T x) {
  return double(to_compute<compute_type_t<T>>(x));
}

// |a - b| <= tol * (1 + |b|), element by element.
template <class A, class B>
void require_close(std::vector<A> const& a, std::vector<B> const& b, double tol, char const* what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const x = as_double(a[i]), y = as_double(b[i]);
    INFO(what << " [" << i << "]: cuda " << x << ", reference " << y);
    REQUIRE(std::fabs(x - y) <= tol * (1.0 + std::fabs(y)));
  }
}

template <class T>
std::vector<double> to_doubles(std::vector<T> const& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = as_double(v[i]);
  return out;
}

template <class T>
bool bitwise_equal(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---------------------------------------------------------------- products

// C = alpha op(A) op(B) + beta C on the GPU against the same sum in double on the host.
template <class T, class Out>
void check_gemm(index_t m, index_t n, index_t k, trans ta, trans tb, float beta, unsigned seed) {
  index_t const ar = ta == trans::no ? m : k, ac = ta == trans::no ? k : m;
  index_t const br = tb == trans::no ? k : n, bc = tb == trans::no ? n : k;
  auto const av = random_values<T>(std::size_t(ar * ac), seed), bv = random_values<T>(std::size_t(br * bc), seed + 1);
  auto const cv = random_values<Out>(std::size_t(m * n), seed + 2);
  // (k = 0 leaves A or B empty: a tensor has at least one element, so the operands are views of
  // that shape over one.)
  auto const storage = [](auto v) {
    if (v.empty()) v.resize(1);
    return make<typename decltype(v)::value_type>(1, index_t(v.size()), v);
  };
  auto a = storage(av), b = storage(bv);
  auto c = make<Out>(m, n, cv);
  kernels::gemm(tensor_view<T, gpu>(a.data(), std::size_t(ar), std::size_t(ac)), ta,
                tensor_view<T, gpu>(b.data(), std::size_t(br), std::size_t(bc)), tb, c.view(), compute_type_t<T>(0.75),
                compute_type_t<T>(beta));
  auto const got = c.to_vector();
  double const unit = std::is_same_v<T, double> ? DBL_EPSILON : FLT_EPSILON;
  double const out_eps = std::is_same_v<Out, bf16> ? 0x1p-8 : std::is_same_v<Out, f16> ? 0x1p-11 : 0.0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (index_t p = 0; p < k; ++p) {
        double const x = as_double(ta == trans::no ? av[std::size_t(i * k + p)] : av[std::size_t(p * m + i)]);
        double const y = as_double(tb == trans::no ? bv[std::size_t(p * n + j)] : bv[std::size_t(j * k + p)]);
        ref += x * y;
        mag += std::fabs(x * y);
      }
      double const old = as_double(cv[std::size_t(i * n + j)]);
      double const want = 0.75 * ref + double(beta) * old;
      double const tol = double(k + 2) * unit * (mag + std::fabs(old)) + out_eps * std::fabs(want) + 1e-30;
      INFO("m n k " << m << " " << n << " " << k << ", transposes " << int(ta) << int(tb) << ", beta " << beta);
      REQUIRE(std::fabs(as_double(got[std::size_t(i * n + j)]) - want) <= tol);
    }
}

template <class T, class Out>
void check_gemm_shapes() {
  unsigned seed = 1;
  for (trans ta : {trans::no, trans::yes})
    for (trans tb : {trans::no, trans::yes})
      for (auto [m, n, k] : {std::array<index_t, 3>{1, 1, 1}, {3, 5, 7}, {17, 9, 33}, {64, 48, 96}, {5, 3, 0}})
        for (float beta : {0.0f, 0.5f}) check_gemm<T, Out>(m, n, k, ta, tb, beta, seed++);
}

}  // namespace

TEST_CASE("cuda gemm: cuBLASLt against a double-precision sum, every type and transpose", "[cuda][gemm]") {
  check_gemm_shapes<float, float>();
  check_gemm_shapes<double, double>();
  check_gemm_shapes<bf16, bf16>();
  check_gemm_shapes<bf16, float>();
  check_gemm_shapes<f16, f16>();
  check_gemm_shapes<f16, float>();
}

TEST_CASE("cuda gemm: a product at an odd offset (2-byte aligned operands) still runs", "[cuda][gemm]") {
  // Parameters of a layer start anywhere in the model's flat buffer.
  auto const av = random_values<bf16>(1 + 6 * 10, 3), bv = random_values<bf16>(1 + 10 * 4, 4);
  auto a = make<bf16>(1 + 6 * 10, 1, av), b = make<bf16>(1 + 10 * 4, 1, bv);
  tensor<float, gpu> c(6, 4);
  kernels::gemm(gpu{}, kernels::lhs(a.data() + 1, 6, 10), kernels::rhs(b.data() + 1, 10, 4), kernels::result(c.data(), 6, 4));
  auto const got = c.to_vector();
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) {
      double ref = 0;
      for (int p = 0; p < 10; ++p) ref += as_double(av[std::size_t(1 + i * 10 + p)]) * as_double(bv[std::size_t(1 + p * 4 + j)]);
      REQUIRE(std::fabs(double(got[std::size_t(i * 4 + j)]) - ref) <= 12 * FLT_EPSILON * 10);
    }
}

// Up to 3 sequences x `group` heads of (4 x 5) * (5 x 4)^T products, the heads interleaved in each
// row: 3 group and 3 group - 1 products are unevenly spaced (one pointer-array product, or strided
// batches: one per head for 2 heads, one per sequence for 3), `group` products run as one strided
// batch. Each way equals the host's and gives the same bits run to run.
template <class T, class Out>
void check_attention_layout(double tol) {
  for (std::size_t group : {2, 3}) {
    index_t const m = 4, n = 4, k = 5, ld = index_t(group) * k;
    auto const av = random_values<T>(std::size_t(3 * m * ld), 7), bv = random_values<T>(std::size_t(3 * n * ld), 8);
    kernels::batch_stride const s_in{m * ld, k}, s_out{index_t(group) * m * n, m * n};
    for (std::size_t count : {3 * group, 3 * group - 1, group}) {
      auto ah = make<T, host>(3 * m, ld, av), bh = make<T, host>(3 * n, ld, bv);
      tensor<Out, host> ch(index_t(count) * m, n);
      kernels::gemm_batched(host{}, {count, group}, kernels::lhs(ah.data(), m, k, ld).batched(s_in),
                            kernels::rhs(bh.data(), n, k, ld).transposed().batched(s_in),
                            kernels::result(ch.data(), m, n).batched(s_out));
      auto a = make<T>(3 * m, ld, av), b = make<T>(3 * n, ld, bv);
      for (bool pointers : {true, false}) {
        INFO(count << " products, " << group << " heads, pointer arrays " << (pointers ? "on" : "off"));
        kernels::set_pointer_array_batches(pointers);
        std::uint64_t const before = kernels::detail::lt_pointer_products().load();
        std::vector<Out> runs[2];
        for (auto& run : runs) {
          tensor<Out, gpu> c(index_t(count) * m, n);
          kernels::gemm_batched(gpu{}, {count, group}, kernels::lhs(a.data(), m, k, ld).batched(s_in),
                                kernels::rhs(b.data(), n, k, ld).transposed().batched(s_in),
                                kernels::result(c.data(), m, n).batched(s_out));
          run = c.to_vector();
        }
        require_close(runs[0], ch.to_vector(), tol, "batched product");
        CHECK(bitwise_equal(runs[0], runs[1]));
        std::uint64_t const ran = kernels::detail::lt_pointer_products().load() - before;
        if (!pointers || count == group) CHECK(ran == 0);  // (strided batches only)
        else if (ran == 0) WARN("cuBLASLt took no pointer-array product for " << count << " products of " << group
                                 << " heads: the strided batches ran (the fallback)");
      }
    }
  }
  kernels::set_pointer_array_batches(true);  // (the default)
}

TEST_CASE("cuda gemm_batched: the attention layout (heads inside sequences) equals the host's", "[cuda][gemm]") {
  check_attention_layout<float, float>(1e-5);
  check_attention_layout<bf16, float>(1e-5);  // (the scores: fp32 sums of bf16 products, both sides)
  check_attention_layout<bf16, bf16>(1e-2);   // (those sums rounded to bf16: an ulp apart at most)
}

TEST_CASE("cuda gemm: small products with split-K off or on follow the host's", "[cuda][gemm]") {
  // A surrogate's batch of 16 through a 256-wide layer (the product cuBLASLt splits over k), and
  // a tall one.
  for (auto [m, n, k] : {std::array<index_t, 3>{16, 256, 256}, {1, 256, 5}, {300, 64, 1024}}) {
    auto const av = random_values<float>(std::size_t(m * k), 3), bv = random_values<float>(std::size_t(k * n), 4);
    auto ah = make<float, host>(m, k, av), bh = make<float, host>(k, n, bv);
    tensor<float, host> ch(m, n);
    kernels::gemm(ah.view(), kernels::trans::no, bh.view(), kernels::trans::no, ch.view());
    for (bool split : {false, true}) {
      INFO(m << " x " << n << " x " << k << (split ? ", split-K allowed" : ", split-K off"));
      kernels::set_small_product_split_k(split);
      auto a = make<float>(m, k, av), b = make<float>(k, n, bv);
      tensor<float, gpu> c(m, n);
      kernels::gemm(a.view(), kernels::trans::no, b.view(), kernels::trans::no, c.view());
      require_close(c.to_vector(), ch.to_vector(), 1e-5, "small product");
      tensor<float, gpu> again(m, n);
      kernels::gemm(a.view(), kernels::trans::no, b.view(), kernels::trans::no, again.view());
      CHECK(bitwise_equal(c.to_vector(), again.to_vector()));
    }
  }
  kernels::set_small_product_split_k(false);  // (the default)
}

// ---------------------------------------------------------------- point-wise, reductions

TEST_CASE("cuda expressions: fused point-wise kernels and reductions equal the host's", "[cuda][expr]") {
  auto const xv = random_values<float>(100003, 11, -3, 3);
  auto x = make<float>(100003, 1, xv);
  auto xh = make<float, host>(100003, 1, xv);
  tensor<float, gpu> y(100003, 1);
  tensor<float, host> yh(100003, 1);
  evaluate(y, gelu(x) * 2.0 + exp(to_expr(x) * 0.5) - x);
  evaluate(yh, gelu(xh) * 2.0 + exp(to_expr(xh) * 0.5) - xh);
  require_close(y.to_vector(), yh.to_vector(), 1e-6, "gelu(x) * 2 + exp(x / 2) - x");
  CHECK(std::fabs(double(sum(y)) - double(sum(yh))) <= 1e-5 * std::fabs(double(sum(yh))));
  CHECK(double(max_of(x)) == double(max_of(xh)));
  CHECK(std::fabs(double(sum_squares(x)) - double(sum_squares(xh))) <= 1e-5 * double(sum_squares(xh)));
  // A derivative through the expression templates, on the GPU.
  auto X = leaf<0>(x);
  evaluate(y, grad(silu(X) + gelu_tanh(X) * 2.0, X, y));
  auto XH = leaf<0>(xh);
  evaluate(yh, grad(silu(XH) + gelu_tanh(XH) * 2.0, XH, yh));
  require_close(y.to_vector(), yh.to_vector(), 1e-5, "d(silu(x) + 2 gelu_tanh(x))/dx");
  // NaN reaches a maximum.
  std::vector<float> with_nan(1000, 1.0f);
  with_nan[777] = NAN;
  auto n = make<float>(1000, 1, with_nan);
  CHECK(std::isnan(double(max_of(n))));
}

TEST_CASE("cuda row passes: a bias over rows runs by rows (no division per element), bit for bit as by element",
          "[cuda][expr]") {
  // One short row, an odd width, narrow rows that share a block (85 rows of 3), more rows than the
  // grid has (its 2^16 blocks: the rows' stride loop) and a row wider than 2^16 blocks of 256
  // threads (the columns' stride loop).
  for (auto [rows, cols] : {std::array<std::size_t, 2>{1, 7}, {3, 1000}, {70001, 3}, {20000, 1000},
                            {1, (std::size_t(1) << 24) + 300}}) {
    INFO(rows << " x " << cols);
    auto const zv = random_values<bf16>(rows * cols, 21, -4, 4), rv = random_values<bf16>(rows * cols, 23);
    auto const bv = random_values<bf16>(cols, 22);
    index_t const r = index_t(rows), c = index_t(cols);
    auto z = make<bf16>(r, c, zv), res = make<bf16>(r, c, rv), b = make<bf16>(1, c, bv);
    auto zh = make<bf16, host>(r, c, zv), resh = make<bf16, host>(r, c, rv), bh = make<bf16, host>(1, c, bv);
    // The MLP's bias + GELU pass: evaluate takes transform_rows; the same expression element by
    // element (transform, each column i % cols) gives the same bits; the host's agree to rounding.
    auto const e = gelu(to_expr(z) + broadcast_rows(b, rows));
    tensor<bf16, gpu> y(r, c), by_element(r, c);
    evaluate(y, e);
    kernels::transform(gpu{}, rows * cols, by_element.data(), expr::detail::store_fn<bf16, float, decltype(e)>{e});
    auto const got = y.to_vector();
    CHECK(bitwise_equal(got, by_element.to_vector()));
    tensor<bf16, host> yh(r, c);
    evaluate(yh, gelu(to_expr(zh) + broadcast_rows(bh, rows)));
    auto const want = yh.to_vector();
    double worst = 0;  // (one check for all: require_close's message per element is slow at 2^24)
    for (std::size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(as_double(got[i]) - as_double(want[i])) / (1.0 + std::fabs(as_double(want[i]))));
    CHECK(worst <= 8e-3);  // a bf16 rounding apart at most
    // The Residual's epilogue, y = (z + b) + r and y = z + r: only roundings of sums, so the host's bits.
    for (bool with_bias : {true, false}) {
      tensor<bf16, gpu> out(r, c);
      tensor<bf16, host> outh(r, c);
      kernels::bias_residual(gpu{}, rows, cols, z.data(), with_bias ? b.data() : nullptr, res.data(), out.data());
      kernels::bias_residual(host{}, rows, cols, zh.data(), with_bias ? bh.data() : nullptr, resh.data(), outh.data());
      CHECK(bitwise_equal(out.to_vector(), outh.to_vector()));
    }
  }
}

namespace {
struct copy_uniform {
  REMAT_HOST_DEVICE float operator()(std::size_t, float u) const { return u; }
};
}  // namespace

TEST_CASE("cuda random passes: a thread a Philox block gives the host's numbers; dropout's pass the host's bits",
          "[cuda][kernels]") {
  // offsets at and inside a block and across the counter's upper word; lengths ending inside a
  // block, and more blocks than the grid's 2^16 x 256 threads (the grid-stride loop)
  std::uint64_t const seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull;
  for (std::uint64_t offset : {0ull, 1ull, 3ull, (1ull << 34) - 4101ull})
    for (std::size_t n : {std::size_t(1), std::size_t(5), std::size_t(1025), (std::size_t(1) << 26) + 3}) {
      INFO("offset " << offset << ", " << n << " elements");
      tensor<float, gpu> u(index_t(n), 1);
      std::vector<float> want(n);
      kernels::transform_uniform(gpu{}, n, u.data(), {seed, stream, offset}, copy_uniform{});
      kernels::transform_uniform(host{}, n, want.data(), {seed, stream, offset}, copy_uniform{});
      CHECK(bitwise_equal(u.to_vector(), want));
    }
  // Dropout's masked pass: the host's bits, and those of the element-by-element expression
  auto const xv = random_values<bf16>(7 * 1001, 31);
  auto x = make<bf16>(7, 1001, xv);
  auto xh = make<bf16, host>(7, 1001, xv);
  expr::dropout_mask const mask{{}, {17, 3, 4099}, 0.1f, float(1.0 / 0.9)};
  tensor<bf16, gpu> y(7, 1001), by_element(7, 1001);
  tensor<bf16, host> yh(7, 1001);
  expr::apply_mask(y, x, mask);
  evaluate(by_element, x * mask);
  expr::apply_mask(yh, xh, mask);
  auto const got = y.to_vector();
  CHECK(bitwise_equal(got, by_element.to_vector()));
  CHECK(bitwise_equal(got, yh.to_vector()));
}

TEST_CASE("cuda column sums: the bias gradient equals the host's", "[cuda][kernels]") {
  for (auto [rows, cols] : {std::array<index_t, 2>{1, 7}, {300, 33}, {1025, 130}}) {
    auto const xv = random_values<bf16>(std::size_t(rows * cols), unsigned(rows));
    auto x = make<bf16>(rows, cols, xv);
    auto xh = make<bf16, host>(rows, cols, xv);
    auto const start = random_values<float>(std::size_t(cols), 5);
    auto out = make<float>(cols, 1, start);
    auto outh = make<float, host>(cols, 1, start);
    kernels::column_sums(gpu{}, x.data(), std::size_t(rows), std::size_t(cols), out.data(), true);
    kernels::column_sums(host{}, xh.data(), std::size_t(rows), std::size_t(cols), outh.data(), true);
    require_close(out.to_vector(), outh.to_vector(), 1e-5, "column sums");
  }
}

namespace {

// LayerNorm and RMSNorm forward and backward, a block per row on the GPU against the host's
// thread per row; the GPU run twice gives the same bits; the backward with a Residual's gradient
// added in its pass (`add`) equals the rounded dx plus it, bit for bit, on both.
template <class T>
void check_norms(index_t rows, index_t w, double tol) {
  using V = compute_type_t<T>;
  std::size_t const n = std::size_t(rows * w), r = std::size_t(rows), c = std::size_t(w);
  unsigned const seed = unsigned(rows * 131 + w);
  auto const xv = random_values<T>(n, seed), dyv = random_values<T>(n, seed + 1);
  auto const gv = random_values<T>(c, seed + 2, 0.5, 1.5), bv = random_values<T>(c, seed + 3);
  auto const pg = random_values<float>(c, seed + 4), pb = random_values<float>(c, seed + 5);
  auto const av = random_values<T>(n, seed + 6);
  INFO("rows " << rows << ", width " << w);
  auto run = [&]<class D>(D) {
    auto x = make<T, D>(rows, w, xv), dy = make<T, D>(rows, w, dyv), g = make<T, D>(w, 1, gv), b = make<T, D>(w, 1, bv);
    tensor<T, D> y(rows, w), dx(rows, w), ry(rows, w), rdx(rows, w);
    tensor<V, D> mean(rows, 1), rstd(rows, 1), rrstd(rows, 1);
    auto dg = make<float, D>(w, 1, pg), db = make<float, D>(w, 1, pb), rdg = make<float, D>(w, 1, pg);
    kernels::layer_norm_forward(D{}, x.data(), g.data(), b.data(), r, c, 1e-5, y.data(), mean.data(), rstd.data());
    kernels::layer_norm_backward(D{}, x.data(), g.data(), mean.data(), rstd.data(), dy.data(), r, c, dx.data(),
                                 dg.data(), db.data());
    kernels::rms_norm_forward(D{}, x.data(), g.data(), r, c, 1e-6, ry.data(), rrstd.data());
    kernels::rms_norm_backward(D{}, x.data(), g.data(), rrstd.data(), dy.data(), r, c, rdx.data(), rdg.data());
    auto add = make<T, D>(rows, w, av);
    auto dg2 = make<float, D>(w, 1, pg), db2 = make<float, D>(w, 1, pb), rdg2 = make<float, D>(w, 1, pg);
    tensor<T, D> adx(rows, w), ardx(rows, w);
    kernels::layer_norm_backward(D{}, x.data(), g.data(), mean.data(), rstd.data(), dy.data(), r, c, adx.data(),
                                 dg2.data(), db2.data(), add.data());
    kernels::rms_norm_backward(D{}, x.data(), g.data(), rrstd.data(), dy.data(), r, c, ardx.data(), rdg2.data(),
                               add.data());
    return std::array<std::vector<double>, 10>{
        to_doubles(y.to_vector()),   to_doubles(mean.to_vector()), to_doubles(rstd.to_vector()),
        to_doubles(dx.to_vector()),  to_doubles(dg.to_vector()),   to_doubles(db.to_vector()),
        to_doubles(ry.to_vector()),  to_doubles(rdx.to_vector()),  to_doubles(adx.to_vector()),
        to_doubles(ardx.to_vector())};
  };
  auto const got = run(gpu{}), again = run(gpu{}), want = run(host{});
  char const* names[] = {"layer norm y", "mean", "rstd", "layer norm dx", "dgamma", "dbeta", "rms norm y", "rms norm dx",
                         "layer norm dx + add", "rms norm dx + add"};
  for (std::size_t k = 0; k < got.size(); ++k) {
    require_close(got[k], want[k], tol, names[k]);
    CHECK(bitwise_equal(got[k], again[k]));
  }
  // With the add: round(round(dx) + add), element by element, on each device (layer norm's dx
  // is result 3, with the add 8; RMS norm's 7 and 9).
  for (auto const* res : {&got, &want})
    for (auto [k, added] : {std::array<std::size_t, 2>{3, 8}, {7, 9}}) {
      std::vector<double> expect(n);
      for (std::size_t i = 0; i < n; ++i)
        expect[i] = double(to_compute<V>(from_compute<T>(V((*res)[k][i]) + to_compute<V>(av[i]))));
      INFO(names[added]);
      CHECK(bitwise_equal((*res)[added], expect));
    }
}

}  // namespace

TEST_CASE("cuda norms: a block per row equals the host's rows, for narrow, odd and wide rows", "[cuda][kernels]") {
  for (auto [rows, w] : {std::array<index_t, 2>{1, 7}, {37, 1000}, {300, 4096}, {513, 33}}) {
    check_norms<float>(rows, w, 2e-5);
    check_norms<bf16>(rows, w, 1e-2);
  }
}

namespace {

// The image kernels on the GPU against the host's: batch and group normalisation's statistics and
// gradients (a block per channel or group there) to rounding and the same bits run to run; every
// element pass (batch normalisation with running statistics, pooling, upsampling: a thread per
// element there) bit for bit, ties in the pooling windows included.
template <class T>
void check_image_kernels(std::size_t batch, std::size_t channels, std::size_t h, std::size_t w, double tol) {
  using V = compute_type_t<T>;
  kernels::planes const p{batch, channels, h * w};
  std::size_t const n = p.size(), groups = channels / 2;
  unsigned const seed = unsigned(batch * 1000 + channels * 10 + h);
  auto xv = random_values<T>(n, seed), dyv = random_values<T>(n, seed + 1);
  for (auto& v : xv) v = T(std::round(double(as_double(v)) * 8) / 8);  // (ties in the pooling windows)
  auto const gv = random_values<T>(channels, seed + 2, 0.5, 1.5), bv = random_values<T>(channels, seed + 3);
  auto const rm = random_values<float>(channels, seed + 4), rv = random_values<float>(channels, seed + 5, 0.5, 2);
  auto const pg = random_values<float>(channels, seed + 6), pb = random_values<float>(channels, seed + 7);
  index_t const rows = index_t(batch), cols = index_t(p.image()), c = index_t(channels);
  INFO("batch " << batch << ", channels " << channels << ", " << h << " x " << w);
  auto statistics = [&]<class D>(D) {
    auto x = make<T, D>(rows, cols, xv), dy = make<T, D>(rows, cols, dyv);
    auto g = make<T, D>(c, 1, gv), b = make<T, D>(c, 1, bv);
    tensor<T, D> y(rows, cols), dx(rows, cols), gy(rows, cols), gdx(rows, cols);
    tensor<V, D> mean(c, 1), rstd(c, 1), var(c, 1), gmean(rows * index_t(groups), 1), grstd(rows * index_t(groups), 1);
    auto dg = make<float, D>(c, 1, pg), db = make<float, D>(c, 1, pb), gdg = make<float, D>(c, 1, pg),
         gdb = make<float, D>(c, 1, pb);
    kernels::batch_norm_forward_training(D{}, p, x.data(), g.data(), b.data(), 1e-5, y.data(), mean.data(),
                                         rstd.data(), var.data());
    kernels::batch_norm_backward(D{}, p, x.data(), g.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dg.data(),
                                 db.data());
    kernels::group_norm_forward(D{}, p, groups, x.data(), g.data(), b.data(), 1e-5, gy.data(), gmean.data(),
                                grstd.data());
    kernels::group_norm_backward(D{}, p, groups, x.data(), g.data(), gmean.data(), grstd.data(), dy.data(),
                                 gdx.data(), gdg.data(), gdb.data());
    // dx in place of dy gives the same bits as dx apart.
    auto bn_alias = make<T, D>(rows, cols, dyv), gn_alias = make<T, D>(rows, cols, dyv);
    auto dg2 = make<float, D>(c, 1, pg), db2 = make<float, D>(c, 1, pb);
    kernels::batch_norm_backward(D{}, p, x.data(), g.data(), mean.data(), rstd.data(), bn_alias.data(),
                                 bn_alias.data(), dg2.data(), db2.data());
    kernels::group_norm_backward(D{}, p, groups, x.data(), g.data(), gmean.data(), grstd.data(), gn_alias.data(),
                                 gn_alias.data(), dg2.data(), db2.data());
    CHECK(bitwise_equal(bn_alias.to_vector(), dx.to_vector()));
    CHECK(bitwise_equal(gn_alias.to_vector(), gdx.to_vector()));
    return std::array<std::vector<double>, 12>{
        to_doubles(y.to_vector()),     to_doubles(mean.to_vector()),  to_doubles(rstd.to_vector()),
        to_doubles(var.to_vector()),   to_doubles(dx.to_vector()),    to_doubles(dg.to_vector()),
        to_doubles(db.to_vector()),    to_doubles(gy.to_vector()),    to_doubles(gmean.to_vector()),
        to_doubles(grstd.to_vector()), to_doubles(gdx.to_vector()),   to_doubles(gdg.to_vector())};
  };
  auto const got = statistics(gpu{}), again = statistics(gpu{}), want = statistics(host{});
  char const* names[] = {"batch norm y", "mean", "rstd", "var", "batch norm dx", "batch norm dgamma",
                         "batch norm dbeta", "group norm y", "group mean", "group rstd", "group norm dx",
                         "group norm dgamma"};
  for (std::size_t k = 0; k < got.size(); ++k) {
    require_close(got[k], want[k], tol, names[k]);
    CHECK(bitwise_equal(got[k], again[k]));
  }
  // The element passes.
  std::size_t const planes_count = batch * channels;
  auto elements = [&]<class D>(D) {
    std::vector<std::vector<T>> out;
    auto x = make<T, D>(rows, cols, xv), dy = make<T, D>(rows, cols, dyv);
    auto g = make<T, D>(c, 1, gv), b = make<T, D>(c, 1, bv);
    auto m = make<float, D>(c, 1, rm), v = make<float, D>(c, 1, rv);
    tensor<T, D> y(rows, cols);
    kernels::batch_norm_forward_inference(D{}, p, x.data(), g.data(), b.data(), m.data(), v.data(), 1e-5, y.data());
    out.push_back(y.to_vector());
    for (auto [k, stride] : {std::array<std::size_t, 2>{2, 2}, {3, 1}, {3, 2}}) {
      kernels::pool_shape const s{h, w, k, stride};
      index_t const pooled = index_t(channels * s.out_height() * s.out_width());
      tensor<T, D> py(rows, pooled), ay(rows, pooled), pdx(rows, cols), adx(rows, cols);
      auto pdy = make<T, D>(rows, pooled, std::vector<T>(dyv.begin(), dyv.begin() + std::ptrdiff_t(batch) * pooled));
      kernels::max_pool_forward(D{}, planes_count, s, x.data(), py.data());
      kernels::max_pool_backward(D{}, planes_count, s, x.data(), pdy.data(), pdx.data());
      kernels::avg_pool_forward(D{}, planes_count, s, x.data(), ay.data());
      kernels::avg_pool_backward(D{}, planes_count, s, pdy.data(), adx.data());
      for (auto* t : {&py, &pdx, &ay, &adx}) out.push_back(t->to_vector());
    }
    tensor<T, D> up(rows, cols * 4), upx(rows, cols);
    auto updy = make<T, D>(rows, cols * 4, random_values<T>(n * 4, seed + 8));
    kernels::upsample_nearest_forward(D{}, planes_count, h, w, 2, x.data(), up.data());
    kernels::upsample_nearest_backward(D{}, planes_count, h, w, 2, updy.data(), upx.data());
    out.push_back(up.to_vector());
    out.push_back(upx.to_vector());
    return out;
  };
  auto const eg = elements(gpu{}), eh = elements(host{});
  REQUIRE(eg.size() == eh.size());
  for (std::size_t k = 0; k < eg.size(); ++k) {
    INFO("element pass " << k << " (0: batch norm with running statistics; then per window max y, max dx, "
                            "average y, average dx; then upsampling y, dx)");
    CHECK(bitwise_equal(eg[k], eh[k]));
  }
}

}  // namespace

TEST_CASE("cuda image kernels: statistics a block per channel follow the host's, element passes bit for bit",
          "[cuda][kernels][conv]") {
  for (auto [batch, channels, h, w] : {std::array<std::size_t, 4>{1, 4, 8, 8}, {3, 6, 9, 7}, {16, 16, 64, 64}}) {
    check_image_kernels<float>(batch, channels, h, w, 1e-4);  // (sums of up to 65,536 values in other orders)
    check_image_kernels<bf16>(batch, channels, h, w, 2e-2);
  }
}

TEST_CASE("cuda softmax cross-entropy: a block per row equals the host's rows, for few and many classes",
          "[cuda][kernels]") {
  for (auto [rows, classes] : {std::array<index_t, 2>{1, 5}, {37, 1000}, {300, 4099}}) {
    INFO("rows " << rows << ", classes " << classes);
    std::size_t const r = std::size_t(rows), c = std::size_t(classes);
    auto const zv = random_values<float>(r * c, unsigned(rows + classes), -4, 4);
    std::vector<std::int32_t> lv(r);
    for (std::size_t i = 0; i < r; ++i) lv[i] = std::int32_t((i * 31 + 7) % c);
    auto run = [&]<class D>(D) {
      auto z = make<float, D>(rows, classes, zv);
      auto l = make<std::int32_t, D>(rows, 1, lv);
      tensor<float, D> loss(rows, 1), dz(rows, classes);
      kernels::softmax_cross_entropy(D{}, z.data(), l.data(), r, c, 0.25, loss.data(), dz.data());
      return std::pair{loss.to_vector(), dz.to_vector()};
    };
    auto const got = run(gpu{}), again = run(gpu{}), want = run(host{});
    require_close(got.first, want.first, 1e-5, "row loss");
    require_close(got.second, want.second, 1e-5, "gradient");
    CHECK(bitwise_equal(got.first, again.first));
    CHECK(bitwise_equal(got.second, again.second));
  }
}

namespace {

// A dropout-like mask for the softmax backward: 0 on every third element, 1.25 elsewhere.
struct every_third_dropped {
  REMAT_HOST_DEVICE float operator()(std::size_t i) const { return i % 3 == 0 ? 0.0f : 1.25f; }
};

// The causal softmax and its backward, a warp per row on the GPU against the host's task per row.
template <class T>
void check_causal_softmax(std::size_t count, std::size_t seq, double tol) {
  std::size_t const n = count * seq * seq;
  INFO("sequences " << count << ", length " << seq);
  auto const zv = random_values<float>(n, unsigned(count * 1000 + seq), -3, 3);
  auto const gv = random_values<float>(n, unsigned(count * 1000 + seq + 1));
  auto run = [&]<class D>(D) {
    index_t const rows = index_t(count * seq), cols = index_t(seq);
    auto z = make<float, D>(rows, cols, zv), g = make<float, D>(rows, cols, gv);
    tensor<T, D> p(rows, cols);
    tensor<float, D> dz(rows, cols), dm(rows, cols);
    kernels::causal_softmax(D{}, z.data(), p.data(), count, seq, 0.5f);
    kernels::causal_softmax_backward(D{}, p.data(), g.data(), dz.data(), count, seq, 0.5f, kernels::no_mask<float>{});
    kernels::causal_softmax_backward(D{}, p.data(), g.data(), dm.data(), count, seq, 0.5f, every_third_dropped{});
    auto zi = make<float, D>(rows, cols, zv);  // (a 16-bit softmax may overwrite its scores)
    kernels::causal_softmax(D{}, zi.data(), zi.data(), count, seq, 0.5f);  // in place (fp32)
    return std::array<std::vector<double>, 4>{to_doubles(p.to_vector()), to_doubles(dz.to_vector()),
                                              to_doubles(dm.to_vector()), to_doubles(zi.to_vector())};
  };
  auto const got = run(gpu{}), again = run(gpu{}), want = run(host{});
  char const* names[] = {"probabilities", "score gradient", "masked score gradient", "in-place probabilities"};
  for (std::size_t k = 0; k < got.size(); ++k) {
    require_close(got[k], want[k], tol, names[k]);
    CHECK(bitwise_equal(got[k], again[k]));
  }
  for (std::size_t r = 0; r < count * seq; ++r)  // the masked part of each row is exactly zero
    for (std::size_t c = r % seq + 1; c < seq; ++c) {
      REQUIRE(got[0][r * seq + c] == 0.0);
      REQUIRE(got[1][r * seq + c] == 0.0);
    }
}

// Causal attention tile by tile (kernels::causal_attention_forward and _backward): on the GPU a
// batched product or a row pass per tile over every sequence-head, in a tile of scores; on the host
// a sequence-head at a time. The probabilities, output, score gradient and dQ of both, with and
// without a dropout mask; a sequence whose last tile is short.
template <class T>
void check_attention_tiles(double tol) {
  using V = compute_type_t<T>;
  constexpr std::size_t sequences = 2, heads = 3, hw = 8, W = heads * hw, seq = 150, tile = 64;
  constexpr std::size_t count = sequences * heads;
  kernels::matrix_layout const qkv{index_t(seq), index_t(hw), index_t(3 * W), {index_t(seq * 3 * W), index_t(hw)}};
  kernels::matrix_layout const out{index_t(seq), index_t(hw), index_t(W), {index_t(seq * W), index_t(hw)}};
  auto const xv = random_values<T>(sequences * seq * 3 * W, 7, -2, 2), dyv = random_values<T>(sequences * seq * W, 8);
  auto run = [&]<class D>(D, bool masked) {
    index_t const rows = index_t(sequences * seq);
    auto x = make<T, D>(rows, index_t(3 * W), xv), dy = make<T, D>(rows, index_t(W), dyv);
    tensor<T, D> probs(index_t(count * seq), index_t(seq)), ds(index_t(count * seq), index_t(seq));
    tensor<T, D> y(rows, index_t(W)), dq(rows, index_t(3 * W));
    tensor<V, D> scores(index_t(kernels::attention_scores_rows(count, seq, tile)), index_t(seq));
    auto blocks = [&](T const* q, kernels::matrix_layout qb, T* r, kernels::matrix_layout rb) {
      return kernels::attention_blocks<T>{{count, heads},         index_t(tile),
                                          kernels::lhs(q, qb),    kernels::rhs(x.data() + W, qkv),
                                          kernels::rhs(x.data() + 2 * W, qkv), kernels::result(r, rb)};
    };
    kernels::causal_attention_forward(D{}, blocks(x.data(), qkv, y.data(), out), scores.data(), probs.data(), V(0.35f));
    auto const b = blocks(dy.data(), out, dq.data(), qkv);
    if (masked)
      kernels::causal_attention_backward(D{}, b, scores.data(), probs.data(), ds.data(), V(0.35f),
                                         every_third_dropped{});
    else
      kernels::causal_attention_backward(D{}, b, scores.data(), probs.data(), ds.data(), V(0.35f),
                                         kernels::no_mask<V>{});
    return std::array<std::vector<double>, 4>{to_doubles(probs.to_vector()), to_doubles(y.to_vector()),
                                              to_doubles(ds.to_vector()), to_doubles(dq.to_vector())};
  };
  char const* names[] = {"probabilities", "output", "score gradient", "dQ"};
  for (bool masked : {false, true}) {
    INFO("masked " << masked);
    auto const got = run(gpu{}, masked), again = run(gpu{}, masked), want = run(host{}, masked);
    for (std::size_t k = 0; k < got.size(); ++k) {
      require_close(got[k], want[k], tol, names[k]);
      CHECK(bitwise_equal(got[k], again[k]));
    }
  }
}

}  // namespace

TEST_CASE("cuda attention tile by tile equals the host's, fp32 and bf16, with and without dropout",
          "[cuda][kernels]") {
  check_attention_tiles<float>(1e-5);
  check_attention_tiles<bf16>(2e-2);
}

TEST_CASE("cuda attention softmax: a warp per row equals the host's rows, short and long sequences",
          "[cuda][kernels]") {
  for (auto [count, seq] : {std::array<std::size_t, 2>{1, 1}, {3, 5}, {8, 33}, {2, 200}, {1, 1030}}) {
    check_causal_softmax<float>(count, seq, 2e-6);
    check_causal_softmax<bf16>(count, seq, 1e-2);
  }
}

TEST_CASE("cuda embeddings: gather, scatter-add and positions equal the host's bit for bit", "[cuda][kernels]") {
  // Ids with heavy repeats (one id takes a third of the rows), for tables of 1, 7 and 50257 rows.
  for (auto [vocab, rows, w] : {std::array<std::size_t, 3>{1, 9, 3}, {7, 300, 33}, {50257, 3000, 64}}) {
    INFO("vocabulary " << vocab << ", ids " << rows << ", width " << w);
    std::vector<std::int32_t> ids(rows);
    for (std::size_t r = 0; r < rows; ++r) ids[r] = std::int32_t(r % 3 == 0 ? vocab / 2 : (r * 7919 + 11) % vocab);
    std::size_t const seq = rows % 10 == 0 ? 10 : 3;
    auto const tv = random_values<float>(vocab * w, unsigned(vocab)), dv = random_values<float>(rows * w, 3);
    auto const gv = random_values<float>(vocab * w, 4), pv = random_values<float>(seq * w, 5);
    auto run = [&]<class D>(D) {
      auto table = make<float, D>(index_t(vocab), index_t(w), tv), dy = make<float, D>(index_t(rows), index_t(w), dv);
      auto g = make<float, D>(index_t(vocab), index_t(w), gv), pos = make<float, D>(index_t(seq), index_t(w), pv);
      auto id = make<std::int32_t, D>(index_t(rows), 1, ids);
      tensor<float, D> out{index_t(rows), index_t(w)}, shifted{index_t(rows), index_t(w)};
      kernels::gather_rows(D{}, table.data(), id.data(), rows, w, out.data());
      kernels::scatter_add_rows(D{}, id.data(), rows, w, vocab, dy.data(), g.data());
      kernels::add_positions(D{}, out.data(), pos.data(), rows, seq, w, shifted.data());
      kernels::add_positions_backward(D{}, dy.data(), rows, seq, w, pos.data());
      return std::array<std::vector<float>, 4>{out.to_vector(), g.to_vector(), shifted.to_vector(), pos.to_vector()};
    };
    auto const got = run(gpu{}), want = run(host{});
    char const* names[] = {"gathered rows", "table gradient", "rows plus positions", "position gradient"};
    for (std::size_t k = 0; k < got.size(); ++k) {
      INFO(names[k]);
      CHECK(bitwise_equal(got[k], want[k]));
    }
    // and against a sum written here, in double: row vocab / 2 of the table's gradient
    std::size_t const hot = vocab / 2;
    for (std::size_t i = 0; i < w; ++i) {
      double want_hot = gv[hot * w + i];
      for (std::size_t r = 0; r < rows; ++r)
        if (std::size_t(ids[r]) == hot) want_hot += dv[r * w + i];
      REQUIRE(std::fabs(double(got[1][hot * w + i]) - want_hot) <= 1e-5 * double(rows));
    }
  }
}

// ---------------------------------------------------------------- models

namespace {

constexpr std::size_t W = 32;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 64>, GELU, Dropout<0.1>, Linear<64, W>>>;
using RmsBlock = Residual<Seq<RMSNorm<W>, Linear<W, W>, SiLU, Linear<W, W, false>>>;
template <class Middle>
using Net = Seq<Linear<12, W>, Middle, Linear<W, 5>>;
using Plain = Net<Seq<Block, RmsBlock, Block>>;
using Check = Net<Seq<Checkpointed<Block>, Checkpointed<RmsBlock>, Checkpointed<Block>>>;
using Sel = Net<Seq<Selective<Block>, RmsBlock, Selective<Block>>>;
using Off = Net<Seq<Offloaded<Block>, Offloaded<RmsBlock>, Block>>;
using OffDeep = Net<Repeat<6, Offloaded<Block>>>;  // copies overlapped with the next block's compute
static_assert(std::is_same_v<offload_allocator_t<gpu>, memory::caching_allocator<memory::pinned_host>>);
using Rev = Net<Revolve<2, Repeat<4, Block>>>;
using RepPlain = Net<Repeat<4, Block>>;

constexpr index_t batch = 48;

template <class T = float>
std::vector<T> inputs(std::size_t cols, unsigned seed = 21) {
  return random_values<T>(std::size_t(batch) * cols, seed);
}
std::vector<std::int32_t> labels(std::size_t classes, std::size_t n = std::size_t(batch)) {
  std::vector<std::int32_t> l(n);
  for (std::size_t i = 0; i < n; ++i) l[i] = std::int32_t((i * 7 + 3) % classes);
  return l;
}

// Three AdamW steps of a model on device D; returns parameters and the losses.
template <class NetT, class D, class P = fp32>
std::pair<std::vector<typename P::master>, std::vector<double>> train(int steps = 3) {
  using T = typename P::master;
  model<NetT, D, P> m(seed{5});
  AdamW opt(m, {.lr = 1e-2});
  auto x = make<T, D>(batch, 12, inputs<T>(12));
  auto y = make<std::int32_t, D>(batch, 1, labels(5));
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(m.template train_step<SoftmaxCrossEntropy>(x, y, opt));
  return {tensor_to_host(m.parameters()), losses};
}

}  // namespace

TEST_CASE("cuda models: a forward pass, gradients and AdamW steps follow the host", "[cuda][model]") {
  // Same seed, same initial parameters (made on the host, copied).
  model<Plain, gpu> g(seed{5});
  model<Plain, host> h(seed{5});
  REQUIRE(bitwise_equal(tensor_to_host(g.parameters()), tensor_to_host(h.parameters())));
  auto const xv = inputs(12);
  auto x = make<float>(batch, 12, xv);
  auto xh = make<float, host>(batch, 12, xv);
  require_close(g.forward(x).to_vector(), h.forward(xh).to_vector(), 1e-5, "forward");
  auto y = make<std::int32_t>(batch, 1, labels(5));
  auto yh = make<std::int32_t, host>(batch, 1, labels(5));
  double const lg = g.accumulate<SoftmaxCrossEntropy>(x, y), lh = h.accumulate<SoftmaxCrossEntropy>(xh, yh);
  CHECK(std::fabs(lg - lh) <= 1e-5 * std::fabs(lh));
  require_close(tensor_to_host(g.gradients()), tensor_to_host(h.gradients()), 1e-4, "gradients");
  auto [pg, lossg] = train<Plain, gpu>();
  auto [ph, lossh] = train<Plain, host>();
  require_close(lossg, lossh, 1e-4, "losses");
  require_close(pg, ph, 1e-4, "parameters after 3 AdamW steps");
}

TEST_CASE("cuda inference: forward(x, out) after reserve_inference asks for no memory and equals forward(x)",
          "[cuda][inference]") {
  memory::caching_allocator<gpu> alloc;
  model<Plain, gpu> m(seed{5}, alloc);
  m.reserve_inference(std::size_t(batch));
  CHECK(m.arena_bytes() == inference_plan<Plain>(std::size_t(batch)).bytes);
  auto x = make<float>(batch, 12, inputs(12));
  tensor<float, gpu> y(batch, index_t(Plain::out_width));
  m.forward(x, y);  // (the first call, at the maximum batch: the products' first use takes their scratch)
  std::size_t const model_before = alloc.stats().system_allocations,
                    scratch_before = memory::default_allocator<gpu>().stats().system_allocations;
  for (index_t rows = 1; rows <= batch; rows += 7) {
    m.forward(x.view().row_range(0, std::size_t(rows)), y.view().row_range(0, std::size_t(rows)));
    CHECK(m.last_forward().planned);
    CHECK(m.last_forward().unplanned == 0);
  }
  CHECK(alloc.stats().system_allocations == model_before);
  CHECK(memory::default_allocator<gpu>().stats().system_allocations == scratch_before);
  m.forward(x, y);
  CHECK(bitwise_equal(y.to_vector(), m.forward(x).to_vector()));
  tensor<float, gpu> too_many(batch + 1, 12), out(batch + 1, index_t(Plain::out_width));
  CHECK_THROWS_AS(m.forward(too_many, out), shape_error);
}

// A CUDA graph of the model's forward: captured once, replayed with the same bits as forward(x),
// for every batch up to the captured one, asking nothing of the system; captured again when a
// training pass grows the arena, and a bf16 model's recast weights read by the next replay.
template <class P>
void check_inference_graph() {
  memory::caching_allocator<gpu> alloc;
  model<Plain, gpu, P> m(seed{5}, alloc);
  AdamW opt(m, {.lr = 1e-3});
  m.reserve_inference(std::size_t(batch));
  inference_graph g(m, std::size_t(batch));
  static_assert(decltype(g)::captured);
  CHECK(g.captures() == 1);
  auto x = make<float>(batch, 12, inputs(12));
  tensor<float, gpu> y(batch, index_t(Plain::out_width));
  std::vector<float> want = m.forward(x).to_vector();
  g.run(x, y);
  CHECK(bitwise_equal(y.to_vector(), want));
  std::size_t const model_before = alloc.stats().system_allocations,
                    scratch_before = memory::default_allocator<gpu>().stats().system_allocations,
                    own = g.bytes();
  for (int i = 0; i < 200; ++i) {
    std::size_t const rows = 1 + std::size_t(i * 5) % std::size_t(batch);
    auto out = y.view().row_range(0, rows);
    g.run(x.view().row_range(0, rows), out);
    if (i % 40 == 0) {
      INFO("rows " << rows);
      std::vector<float> const got = tensor_to_host(out);
      CHECK(bitwise_equal(got, std::vector<float>(want.begin(), want.begin() + std::ptrdiff_t(got.size()))));
    }
  }
  CHECK(alloc.stats().system_allocations == model_before);
  CHECK(memory::default_allocator<gpu>().stats().system_allocations == scratch_before);
  CHECK(g.bytes() == own);
  CHECK(g.captures() == 1);
  // Zero copy: the staging tensors themselves.
  tensor_from_host(g.input(), std::span<float const>(inputs(12, 33)));
  g.replay();
  auto x2 = make<float>(batch, 12, inputs(12, 33));
  CHECK(bitwise_equal(tensor_to_host(g.output()), m.forward(x2).to_vector()));
  // Training between replays: the first step's arena is larger (captured again); the weights
  // change in place (a bf16 model's compute copy is recast before the replay).
  auto labels_ = make<std::int32_t>(batch, 1, labels(5));
  std::size_t const reserved = m.arena_bytes();
  for (int step = 0; step < 2; ++step) {
    m.template train_step<SoftmaxCrossEntropy>(x, labels_, opt);
    want = m.forward(x).to_vector();
    g.run(x, y);
    CHECK(bitwise_equal(y.to_vector(), want));
  }
  CHECK(g.captures() == 1 + std::size_t(m.arena_bytes() != reserved));
}

TEST_CASE("cuda inference graph: captured once, replayed like forward(x) bit for bit, nothing asked of the system",
          "[cuda][inference][graph]") {
  check_inference_graph<fp32>();
  check_inference_graph<mixed<bfloat16>>();
  // Refused: no reservation; more rows than reserved.
  model<Plain, gpu> m(seed{5});
  CHECK_THROWS_AS(inference_graph(m, 8), argument_error);
  m.reserve_inference(8);
  CHECK_THROWS_AS(inference_graph(m, 9), shape_error);
}

TEST_CASE("cuda models: fp64 gradients on the GPU against central differences", "[cuda][model][grad]") {
  using Small = Seq<Linear<3, 8>, LayerNorm<8>, GELU, Residual<Seq<RMSNorm<8>, Linear<8, 8>, SiLU>>, Linear<8, 4>>;
  model<Small, gpu, fp64> m(seed{3});
  index_t const rows = 5;
  auto const xv = random_values<double>(std::size_t(rows * 3), 9);
  auto x = make<double>(rows, 3, xv);
  auto y = make<std::int32_t>(rows, 1, labels(4, std::size_t(rows)));
  m.zero_grad();
  m.accumulate<SoftmaxCrossEntropy>(x, y);
  auto const grads = tensor_to_host(m.gradients());
  auto params = tensor_to_host(m.parameters());
  double const h = 1e-6;
  for (std::size_t i = 0; i < params.size(); i += 3) {
    double const p0 = params[i];
    params[i] = p0 + h;
    tensor_from_host(m.parameters(), std::span<double const>(params));
    double const up = m.loss<SoftmaxCrossEntropy>(x, y);
    params[i] = p0 - h;
    tensor_from_host(m.parameters(), std::span<double const>(params));
    double const down = m.loss<SoftmaxCrossEntropy>(x, y);
    params[i] = p0;
    double const fd = (up - down) / (2 * h);
    INFO("parameter " << i);
    REQUIRE(std::fabs(grads[i] - fd) <= 1e-6 * (1 + std::fabs(fd)));
  }
}

TEST_CASE("cuda policies: every storage policy trains bit for bit like the stored model", "[cuda][policies]") {
  auto const plain = train<Plain, gpu>();
  auto const check = train<Check, gpu>();
  auto const sel = train<Sel, gpu>();
  auto const off = train<Off, gpu>();
  CHECK(bitwise_equal(check.first, plain.first));
  CHECK(bitwise_equal(sel.first, plain.first));
  CHECK(bitwise_equal(off.first, plain.first));
  CHECK(bitwise_equal(check.second, plain.second));
  CHECK(bitwise_equal(train<Rev, gpu>().first, train<RepPlain, gpu>().first));
  // Offloaded with the copies on the side stream: a race between copies and compute would show.
  using Rep6 = Net<Repeat<6, Block>>;
  CHECK(bitwise_equal(train<OffDeep, gpu>(5).first, train<Rep6, gpu>(5).first));
  CHECK(bitwise_equal(train<Net<Offloaded<Repeat<6, Offloaded<Block>>>>, gpu>().first, train<Rep6, gpu>().first));
  // Mixed precision too.
  using P = mixed<bf16, DynamicLossScale>;
  CHECK(bitwise_equal(train<Check, gpu, P>().first, train<Plain, gpu, P>().first));
  CHECK(bitwise_equal(train<Off, gpu, P>().first, train<Plain, gpu, P>().first));
}

TEST_CASE("cuda OffloadedAdamW: the update on the host follows AdamW on the GPU; no state on the device",
          "[cuda][optim][offload]") {
  // (chunk: OffloadedAdamW's parameters per copy up; 0, its default)
  auto run = [](auto opt_tag, memory::caching_allocator<gpu>& alloc, std::size_t chunk = 0) {
    using P = mixed<bf16, DynamicLossScale>;
    model<Plain, gpu, P> m(seed{5}, alloc);
    auto x = make<float>(batch, 12, inputs(12));
    auto y = make<std::int32_t>(batch, 1, labels(5));
    std::vector<double> losses;
    if constexpr (decltype(opt_tag)::value) {
      OffloadedAdamW opt(m, {.lr = 1e-2, .clip_norm = 1.0});
      if (chunk) {
        opt.set_chunk(chunk);
        opt.staging_allocator().reset_peak();  // (the slots of the default chunk were given back)
      } else {
        CHECK(opt.chunk() == std::size_t(8) << 20);
      }
      for (int s = 0; s < 3; ++s) losses.push_back(m.template train_step<SoftmaxCrossEntropy>(x, y, opt));
      CHECK(alloc.stats()[memory::tag::optimizer_state].in_use == 0);
      CHECK(bitwise_equal(tensor_to_host(opt.master_weights().view()), tensor_to_host(std::as_const(m).parameters())));
      // What crosses the link is page-locked: the weights' copy and the slots the gradients come
      // down through (none of it in the pageable allocator).
      cudaPointerAttributes attr{};
      REQUIRE(cudaPointerGetAttributes(&attr, opt.master_weights().data()) == cudaSuccess);
      CHECK(attr.type == cudaMemoryTypeHost);
      CHECK(opt.staging_allocator().stats()[memory::tag::gradients].in_use > 0);
      CHECK(opt.host_allocator().stats()[memory::tag::gradients].in_use == 0);
      // The plan per place: the device's tags (no optimizer state), the host's pageable part (the
      // moments) and its page-locked part (the weights' copy, the slots of the gradients and of the
      // compute copy: two of 100 values each when chunked), each equal to its allocator's peak,
      // per tag.
      step_options const planned{.offload_chunk = chunk ? chunk : std::size_t(8) << 20};
      auto const plan = memory_plan<Plain, P, OffloadedAdamW, SoftmaxCrossEntropy, gpu>(std::size_t(batch), planned);
      for (memory::tag g : memory::all_tags) {
        INFO(memory::name(g));
        CHECK(alloc.stats()[g].peak == plan[g]);
        CHECK(opt.host_allocator().stats()[g].peak == plan.host_pageable[g]);
        CHECK(opt.staging_allocator().stats()[g].peak == plan.host_page_locked[g]);
      }
      CHECK(alloc.stats().total.peak == plan.peak);
    } else {
      AdamW opt(m, {.lr = 1e-2, .clip_norm = 1.0});
      for (int s = 0; s < 3; ++s) losses.push_back(m.template train_step<SoftmaxCrossEntropy>(x, y, opt));
      CHECK(alloc.stats()[memory::tag::optimizer_state].in_use > 0);
    }
    return std::pair{tensor_to_host(std::as_const(m).parameters()), losses};
  };
  memory::caching_allocator<gpu> a1, a2, a3;
  auto const [po, lo] = run(std::true_type{}, a1);
  auto const [pa, la] = run(std::false_type{}, a2);
  // By chunks of 100 parameters, their copies up overlapping the next chunk's update: the same bits.
  auto const [pc, lc] = run(std::true_type{}, a3, 100);
  CHECK(lc == lo);
  CHECK(bitwise_equal(pc, po));
  require_close(lo, la, 1e-5, "losses");
  require_close(po, pa, 1e-5, "parameters after 3 steps");
  // The norm is AdamW's own reduction on the device, and the update the same IEEE operations
  // (no contraction on either side, correctly rounded square root and division): the same bits.
  CHECK(lo == la);
  CHECK(bitwise_equal(po, pa));
}

TEST_CASE("cuda OffloadedAdamW with the gradients on the host: the same bits; the device holds a span's granules, "
          "as planned",
          "[cuda][optim][offload][gradients]") {
  // Two micro-batches a step (the second finds the first's sum on the device before backward adds
  // onto it). Without clipping the norm is not computed, so the gradients' place changes no bit.
  using P = mixed<bf16, DynamicLossScale>;
  auto run = [](bool on_host, memory::caching_allocator<gpu>& alloc, std::size_t chunk) {
    INFO("gradients on the host " << on_host << ", chunk " << chunk);
    model<Plain, gpu, P> m(seed{5}, alloc);
    auto x = make<float>(batch, 12, inputs(12));
    auto y = make<std::int32_t>(batch, 1, labels(5));
    OffloadedAdamW opt(m, {.lr = 1e-2}, {.gradients = on_host ? gradient_place::host : gradient_place::device});
    opt.set_chunk(chunk);
    alloc.reset_peak();
    opt.staging_allocator().reset_peak();
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      m.zero_grad();
      double l = 0;
      for (int k = 0; k < 2; ++k) l += m.template accumulate<SoftmaxCrossEntropy>(x, y, 0.5);
      opt.step();
      losses.push_back(l);
    }
    if (on_host) {
      offloaded_gradient_pages const g = opt.gradient_pages();
      step_options const planned{.offload_chunk = chunk, .offload_gradients = true, .gradient_page = g.page,
                                 .offload_gradients_backup = true};
      auto const plan = memory_plan<Plain, P, OffloadedAdamW, SoftmaxCrossEntropy, gpu>(std::size_t(batch), planned);
      CHECK(g.planned_peak == plan.gradient_pages);
      CHECK(g.last_peak == plan.gradient_pages);  // (granules mapped, at every report)
      CHECK(alloc.stats()[memory::tag::gradients].peak == 0);
      for (memory::tag t : memory::all_tags) {
        INFO(memory::name(t));
        CHECK(alloc.stats()[t].peak == plan[t]);
        CHECK(opt.host_allocator().stats()[t].peak == plan.host_pageable[t]);
        CHECK(opt.staging_allocator().stats()[t].peak == plan.host_page_locked[t]);
      }
      CHECK(alloc.stats().total.peak == plan.peak);
      CHECK(bitwise_equal(tensor_to_host(std::as_const(m).gradients()),
                          std::vector<float>(Plain::param_count, 0.0f)));  // (the model's buffer holds none)
    }
    return std::pair{tensor_to_host(std::as_const(m).parameters()), losses};
  };
  memory::caching_allocator<gpu> a1, a2, a3;
  auto const [pd, ld] = run(false, a1, 100);
  auto const [ph, lh] = run(true, a2, 100);
  auto const [pw, lw] = run(true, a3, 0);  // (one slot holding all the gradients)
  CHECK(lh == ld);
  CHECK(lw == ld);
  CHECK(bitwise_equal(ph, pd));
  CHECK(bitwise_equal(pw, pd));
}

TEST_CASE("cuda precision: mixed<bf16> on the GPU follows the fp32 model", "[cuda][precision]") {
  auto const [p16, l16] = train<Plain, gpu, mixed<bf16, DynamicLossScale>>(2);
  auto const [p32, l32] = train<Plain, gpu>(2);
  require_close(l16, l32, 2e-2, "losses");
  require_close(p16, p32, 3e-2, "parameters");
}

namespace {

template <class NetT, class P = fp32>
void require_plan_matches_on_gpu(std::size_t rows) {
  INFO("batch " << rows);
  memory::caching_allocator<gpu> alloc;
  offload_allocator_t<gpu> pinned;  // Offloaded<S>'s page-locked host memory
  model<NetT, gpu, P> m(seed{11}, alloc, pinned);
  auto x = make<typename P::master>(index_t(rows), 12, random_values<typename P::master>(rows * 12, 2));
  auto y = make<std::int32_t>(index_t(rows), 1, labels(5, rows));
  auto const plan = activation_plan<NetT, P>(rows);
  for (int step = 0; step < 2; ++step) {
    REQUIRE(alloc.stats()[memory::tag::activations].in_use == 0);
    alloc.reset_peak();
    pinned.reset_peak();
    m.template accumulate<SoftmaxCrossEntropy>(x, y);
    CHECK(alloc.stats()[memory::tag::activations].peak == plan.peak_bytes);
    CHECK(m.last_pass().saved_bytes == plan.saved_bytes);
    CHECK(pinned.stats()[memory::tag::activations].peak == plan.offloaded_bytes);
    CHECK(pinned.stats().total.in_use == 0);
  }
}

}  // namespace

TEST_CASE("cuda plan: the activation plan equals the device allocator's measured peak", "[cuda][plan]") {
  for (std::size_t rows : {1, 64, 129}) {
    require_plan_matches_on_gpu<Plain>(rows);
    require_plan_matches_on_gpu<Check>(rows);
    require_plan_matches_on_gpu<Sel>(rows);
    require_plan_matches_on_gpu<Off>(rows);
    require_plan_matches_on_gpu<OffDeep>(rows);
    require_plan_matches_on_gpu<OffDeep, mixed<bf16>>(rows);
    require_plan_matches_on_gpu<Rev>(rows);
    require_plan_matches_on_gpu<Plain, mixed<bf16>>(rows);
  }
}

namespace {
using SmallGpt = GPT<17, 8, 16, 2, 2, 0.0>;            // (the blocked attention core)
using SmallGptKept = StoredAttention<SmallGpt>;  // (AttentionCore, which keeps the probabilities)
}  // namespace

TEMPLATE_TEST_CASE("cuda transformer: a GPT on the GPU follows the host", "[cuda][transformer]", SmallGpt,
                   SmallGptKept) {
  using G = TestType;
  std::size_t const b = 3, seq = 8;
  std::vector<std::int32_t> ids(b * seq), next(b * seq);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = std::int32_t((i * 5 + 1) % 17);
    next[i] = std::int32_t((i * 3 + 2) % 17);
  }
  model<G, gpu> g(seed{2});
  model<G, host> h(seed{2});
  auto x = make<std::int32_t>(index_t(b), index_t(seq), ids);
  auto y = make<std::int32_t>(index_t(b), index_t(seq), next);
  auto xh = make<std::int32_t, host>(index_t(b), index_t(seq), ids);
  auto yh = make<std::int32_t, host>(index_t(b), index_t(seq), next);
  double const lg = g.template accumulate<SoftmaxCrossEntropy>(x, y);
  double const lh = h.template accumulate<SoftmaxCrossEntropy>(xh, yh);
  CHECK(std::fabs(lg - lh) <= 1e-5 * lh);
  require_close(tensor_to_host(g.gradients()), tensor_to_host(h.gradients()), 1e-4, "GPT gradients");
}

TEST_CASE("cuda blocked attention: follows the host's, dropout on; plan = peak; Checkpointed bit for bit",
          "[cuda][transformer]") {
  // Sequences of 150 positions: three query panels, the last partial.
  using G = GPT<17, 160, 16, 2, 2, 0.2>;  // (GPTBlock's core is the blocked one)
  using GC = GPT<17, 160, 16, 2, 2, 0.2, Checkpointed>;
  std::size_t const b = 2, seq = 150;
  std::vector<std::int32_t> ids(b * seq), next(b * seq);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = std::int32_t((i * 5 + 1) % 17);
    next[i] = std::int32_t((i * 3 + 2) % 17);
  }
  memory::caching_allocator<gpu> alloc;
  model<G, gpu> g(seed{2}, alloc);
  model<GC, gpu> gc(seed{2});
  model<G, host> h(seed{2});
  auto x = make<std::int32_t>(index_t(b), index_t(seq), ids);
  auto y = make<std::int32_t>(index_t(b), index_t(seq), next);
  auto xh = make<std::int32_t, host>(index_t(b), index_t(seq), ids);
  auto yh = make<std::int32_t, host>(index_t(b), index_t(seq), next);
  alloc.reset_peak();
  double const lg = g.accumulate<SoftmaxCrossEntropy>(x, y), lh = h.accumulate<SoftmaxCrossEntropy>(xh, yh);
  CHECK(alloc.stats()[memory::tag::activations].peak == sequence_plan<G>(b, seq).peak_bytes);
  CHECK(std::fabs(lg - lh) <= 1e-5 * lh);
  require_close(tensor_to_host(g.gradients()), tensor_to_host(h.gradients()), 1e-4, "GPT gradients");
  double const lc = gc.accumulate<SoftmaxCrossEntropy>(x, y);
  CHECK(lc == lg);
  CHECK(bitwise_equal(tensor_to_host(gc.gradients()), tensor_to_host(g.gradients())));
  // bf16 activations compile and follow fp32 to bf16's rounding.
  model<G, gpu, mixed<bf16>> g16(seed{2});
  double const l16 = g16.accumulate<SoftmaxCrossEntropy>(x, y);
  CHECK(std::fabs(l16 - lg) <= 2e-2 * lg);
}

// ---------------------------------------------------------------- bad input

TEST_CASE("cuda errors: host memory handed to a GPU model is refused and changes nothing", "[cuda][errors]") {
  model<Plain, gpu> m(seed{5});
  auto const before = tensor_to_host(m.parameters());
  std::vector<float> host_x = inputs(12);
  tensor_view<float const, gpu> wrong(host_x.data(), std::size_t(batch), 12);
  auto y = make<std::int32_t>(batch, 1, labels(5));
  try {
    m.accumulate<SoftmaxCrossEntropy>(wrong, y);
    FAIL("expected remat::argument_error");
  } catch (argument_error const& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("host memory") != std::string::npos);
  }
  CHECK(bitwise_equal(tensor_to_host(m.parameters()), before));
}

TEST_CASE("cuda errors: labels out of range are found on the device before anything runs", "[cuda][errors]") {
  model<Plain, gpu> m(seed{5});
  AdamW opt(m);
  auto const before = tensor_to_host(m.parameters());
  auto x = make<float>(batch, 12, inputs(12));
  auto bad = labels(5);
  bad[17] = 9;
  auto y = make<std::int32_t>(batch, 1, bad);
  REQUIRE_THROWS_WITH(m.train_step<SoftmaxCrossEntropy>(x, y, opt), Catch::Contains("found 9 at label 17"));
  CHECK(bitwise_equal(tensor_to_host(m.parameters()), before));
}

TEST_CASE("cuda errors: out of device memory gives the summary and leaves model and optimizer as they were",
          "[cuda][errors]") {
  memory::caching_allocator<gpu> alloc;
  model<Plain, gpu> m(seed{5}, alloc);
  AdamW opt(m);
  auto x = make<float>(batch, 12, inputs(12));
  auto y = make<std::int32_t>(batch, 1, labels(5));
  m.train_step<SoftmaxCrossEntropy>(x, y, opt);
  auto const params = tensor_to_host(m.parameters());
  auto const moments = tensor_to_host(opt.exp_avg().view());
  // (The model holds its planned activation arena from the first step, so the next step would
  // allocate nothing: without it, the step's activations come from the allocator and meet the limit.)
  m.use_planned_arena(false);
  alloc.release_cached();
  alloc.set_limit(alloc.stats().total.in_use + 1024);
  try {
    m.train_step<SoftmaxCrossEntropy>(x, y, opt);
    FAIL("expected remat::out_of_memory");
  } catch (out_of_memory const& e) {
    std::string const what = e.what();
    INFO(what);
    CHECK(what.find("out of memory on cuda") != std::string::npos);
    CHECK(what.find("GiB free of") != std::string::npos);
  }
  CHECK(bitwise_equal(tensor_to_host(m.parameters()), params));
  CHECK(bitwise_equal(tensor_to_host(opt.exp_avg().view()), moments));
  alloc.set_limit(memory::unlimited);
  m.train_step<SoftmaxCrossEntropy>(x, y, opt);  // and training goes on
}

TEST_CASE("cuda errors: a failure injected at every allocation of a step leaves everything as it was",
          "[cuda][errors][faults]") {
  auto x = make<float>(batch, 12, inputs(12));
  auto y = make<std::int32_t>(batch, 1, labels(5));
  auto const run = [&](std::size_t k, std::size_t* requests) {
    memory::caching_allocator<gpu> alloc;
    model<Plain, gpu> m(seed{5}, alloc);
    AdamW opt(m);
    m.train_step<SoftmaxCrossEntropy>(x, y, opt);
    m.zero_grad();
    m.accumulate<SoftmaxCrossEntropy>(x, y, 0.5);  // (gradients holding a sum: restored from a copy)
    auto const params = tensor_to_host(m.parameters());
    auto const grads = tensor_to_host(m.gradients());
    auto const moments = tensor_to_host(opt.exp_avg().view());
    std::size_t const in_use = alloc.stats().total.in_use, first = alloc.stats().requests;
    alloc.fail_request(k);
    try {
      m.accumulate<SoftmaxCrossEntropy>(x, y, 0.5);
      CHECK(k == 0);
    } catch (out_of_memory const& e) {
      CHECK_THAT(e.what(), Catch::Contains("injected"));
      CHECK(bitwise_equal(tensor_to_host(m.parameters()), params));
      CHECK(bitwise_equal(tensor_to_host(m.gradients()), grads));
      CHECK(bitwise_equal(tensor_to_host(opt.exp_avg().view()), moments));
      CHECK(alloc.stats().total.in_use == in_use);
      alloc.fail_request(0);
      m.accumulate<SoftmaxCrossEntropy>(x, y, 0.5);
    }
    if (requests) *requests = alloc.stats().requests - first;
    opt.step();
    return tensor_to_host(m.parameters());
  };
  std::size_t requests = 0;
  auto const reference = run(0, &requests);
  REQUIRE(requests > 0);
  for (std::size_t k = 1; k <= requests; ++k) {
    INFO("request " << k << " of " << requests);
    CHECK(bitwise_equal(run(k, nullptr), reference));
  }
}

TEST_CASE("cuda errors: a failing CUDA call names the call", "[cuda][errors]") {
  REQUIRE_THROWS_WITH(REMAT_CUDA_CHECK(cudaSetDevice(1 << 20)), Catch::Contains("cudaSetDevice(1 << 20) failed"));
}

namespace {
// A convolutional model of every image layer: cuDNN's convolutions and the image kernels on the GPU.
using ConvBlock = Residual<Seq<Conv2d<4, 4, 3, 8, 8, 1, 1, false>, BatchNorm2d<4, 8, 8>, ReLU,
                               Conv2d<4, 4, 3, 8, 8, 1, 1>, GroupNorm<2, 4, 8, 8>>>;
template <class Middle>
using ConvNet = Seq<Conv2d<2, 4, 3, 8, 8, 1, 1>, BatchNorm2d<4, 8, 8>, ReLU, Middle, MaxPool2d<4, 8, 8>,
                    Upsample2d<4, 4, 4>, AvgPool2d<4, 8, 8, 2>, Linear<64, 3>>;

// (AdamW by default; the comparison across devices takes SGD: the first convolution's bias feeds a
// batch norm, so its true gradient is 0 and what each device computes is rounding noise, which
// AdamW's m / sqrt(v) turns into whole steps of lr with either sign.)
template <class NetT, class D, class P = fp32, bool Sgd = false>
std::pair<std::vector<float>, std::vector<float>> train_conv(int steps = 3) {
  model<NetT, D, P> m(seed{7});
  auto opt = [&] {
    if constexpr (Sgd) return SGD(m, {.lr = 1e-2});
    else return AdamW(m, {.lr = 1e-2});
  }();
  auto x = make<float, D>(6, 128, random_values<float>(6 * 128, 3));
  auto t = make<float, D>(6, 3, random_values<float>(6 * 3, 4));
  for (int s = 0; s < steps; ++s) m.template train_step<MSE>(x, t, opt);
  return {tensor_to_host(m.parameters()), tensor_to_host(m.buffers())};
}
}  // namespace

#if defined(REMAT_HAS_CUDNN)
TEST_CASE("cuda convolutions: cuDNN and the image kernels follow the host; every policy bit for bit",
          "[cuda][conv]") {
  using Stored = ConvNet<Repeat<2, ConvBlock>>;
  {
    auto const [sg, bsg] = train_conv<Stored, gpu, fp32, true>();
    auto const [sh, bsh] = train_conv<Stored, host, fp32, true>();
    require_close(sg, sh, 1e-5, "parameters after 3 SGD steps");
    require_close(bsg, bsh, 1e-5, "running statistics after 3 passes");
  }
  // One pass's gradients, each against the host's to 1e-5 of the largest (the bias before the
  // batch norm is 0 up to rounding on both).
  {
    model<Stored, gpu> mg(seed{7});
    model<Stored, host> mh(seed{7});
    mg.accumulate<MSE>(make<float, gpu>(6, 128, random_values<float>(6 * 128, 3)),
                       make<float, gpu>(6, 3, random_values<float>(6 * 3, 4)));
    mh.accumulate<MSE>(make<float, host>(6, 128, random_values<float>(6 * 128, 3)),
                       make<float, host>(6, 3, random_values<float>(6 * 3, 4)));
    auto const gg = tensor_to_host(mg.gradients()), gh = tensor_to_host(mh.gradients());
    double largest = 0;
    for (float g : gh) largest = std::max(largest, double(std::fabs(g)));
    REQUIRE(largest > 0);
    for (std::size_t i = 0; i < gh.size(); ++i) {
      INFO("gradient [" << i << "]: cuda " << gg[i] << ", host " << gh[i] << ", largest " << largest);
      REQUIRE(std::fabs(double(gg[i]) - double(gh[i])) <= 1e-5 * largest);
    }
  }
  auto const [pg, bg] = train_conv<Stored, gpu>();
  for (auto const& other : {train_conv<ConvNet<Repeat<2, Checkpointed<ConvBlock>>>, gpu>(),
                            train_conv<ConvNet<Repeat<2, Selective<ConvBlock>>>, gpu>(),
                            train_conv<ConvNet<Revolve<1, Repeat<2, ConvBlock>>>, gpu>()}) {
    CHECK(bitwise_equal(other.first, pg));
    CHECK(bitwise_equal(other.second, bg));
  }
  // The plan equals the device allocator's measured peak.
  memory::caching_allocator<gpu> alloc;
  model<ConvNet<Repeat<2, Checkpointed<ConvBlock>>>, gpu> m(seed{1}, alloc);
  SGD opt(m, {.lr = 0.01});
  auto x = make<float>(5, 128, random_values<float>(5 * 128, 5));
  auto t = make<float>(5, 3, random_values<float>(5 * 3, 6));
  alloc.reset_peak();
  m.train_step<MSE>(x, t, opt);
  CHECK(alloc.stats()[memory::tag::activations].peak ==
        activation_plan<ConvNet<Repeat<2, Checkpointed<ConvBlock>>>>(5).peak_bytes);
}

// At these shapes cuDNN's heuristic ranks first backward algorithms that add with atomics (found on
// an H100, 2026-11-26): remat takes the first deterministic one, so a gradient's bits do not vary.
TEST_CASE("cuda convolutions: the gradients are the same bits run to run at the surrogate's shapes",
          "[cuda][conv]") {
  for (auto [batch, in] : {std::array<std::size_t, 2>{16, 16}, {16, 2}, {256, 16}}) {
    kernels::conv_shape const c{batch, in, 64, 64, 16, 3, 1, 1};
    index_t const rows = index_t(batch);
    auto x = make<float>(rows, index_t(c.in_features()), random_values<float>(batch * c.in_features(), 11));
    auto dy = make<float>(rows, index_t(c.out_features()), random_values<float>(batch * c.out_features(), 12));
    auto w = make<float>(index_t(c.weight_count()), 1, random_values<float>(c.weight_count(), 13));
    auto run = [&] {
      tensor<float, gpu> dx(rows, index_t(c.in_features()));
      auto dw = make<float>(index_t(c.weight_count()), 1, std::vector<float>(c.weight_count(), 0.0f));
      auto db = make<float>(16, 1, std::vector<float>(16, 0.0f));
      kernels::conv2d_backward(gpu{}, c, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
      return std::array<std::vector<float>, 3>{dx.to_vector(), dw.to_vector(), db.to_vector()};
    };
    auto const first = run();
    for (int again = 0; again < 3; ++again) {
      auto const next = run();
      INFO("batch " << batch << ", " << in << " -> 16 channels, run " << again + 2);
      CHECK(bitwise_equal(next[0], first[0]));
      CHECK(bitwise_equal(next[1], first[1]));
      CHECK(bitwise_equal(next[2], first[2]));
    }
  }
}

TEST_CASE("cuda convolutions in mixed<bfloat16>: every policy bit for bit, gradients follow the host's",
          "[cuda][conv][mixed]") {
  using B = mixed<bfloat16>;
  using Stored = ConvNet<Repeat<2, ConvBlock>>;
  auto const [pg, bg] = train_conv<Stored, gpu, B>();
  for (auto const& other : {train_conv<ConvNet<Repeat<2, Checkpointed<ConvBlock>>>, gpu, B>(),
                            train_conv<ConvNet<Repeat<2, Selective<ConvBlock>>>, gpu, B>()}) {
    CHECK(bitwise_equal(other.first, pg));
    CHECK(bitwise_equal(other.second, bg));
  }
  // One pass's gradients against the host's bf16 model (oneDNN's bf16 convolution or the widened
  // one there, cuDNN in fp32 on widened values here: the same rounded inputs, sums in other orders).
  model<Stored, gpu, B> mg(seed{7});
  model<Stored, host, B> mh(seed{7});
  auto xg = make<float, gpu>(6, 128, random_values<float>(6 * 128, 3));
  auto tg = make<float, gpu>(6, 3, random_values<float>(6 * 3, 4));
  auto xh = make<float, host>(6, 128, random_values<float>(6 * 128, 3));
  auto th = make<float, host>(6, 3, random_values<float>(6 * 3, 4));
  mg.accumulate<MSE>(xg, tg);
  mh.accumulate<MSE>(xh, th);
  require_close(tensor_to_host(mg.gradients()), tensor_to_host(mh.gradients()), 0x1p-5, "bf16 gradients, one pass");
  // The plan equals the measured peak in bf16 too.
  memory::caching_allocator<gpu> alloc;
  model<ConvNet<Repeat<2, Checkpointed<ConvBlock>>>, gpu, B> m(seed{1}, alloc);
  SGD opt(m, {.lr = 0.01});
  alloc.reset_peak();
  m.train_step<MSE>(xg, tg, opt);
  CHECK(alloc.stats()[memory::tag::activations].peak ==
        activation_plan<ConvNet<Repeat<2, Checkpointed<ConvBlock>>>, B>(6).peak_bytes);
}
#endif

// The granules data_parallel's ZeRO-2 and ZeRO-3 move a GPU model's buffers into: one process, no
// NCCL (a machine with one GPU runs no multi-rank NCCL test, so this is where given-back granules
// are exercised on a GPU at all).
TEST_CASE("cuda granules: given back they read zero, mapped again they are zeroed, and what is held is counted",
          "[cuda][granules]") {
  std::size_t const granule_floats = (std::size_t(2) << 20) / sizeof(float);
  detail::device_granules g(3 * granule_floats * sizeof(float) + 100);  // (a partial fourth granule)
  REQUIRE(g.granule() >= std::size_t(2) << 20);  // (the minimum granularity: 2 MiB on recent GPUs)
  std::size_t const per = g.granule() / sizeof(float), count = g.count();
  REQUIRE(count >= 2);
  CHECK(g.mapped_bytes() == count * g.granule());
  tensor<float, gpu> whole(tensor<float, gpu>::borrowed, static_cast<float*>(g.data()), count * per, 1);
  std::vector<float> ones(count * per, 1.0f);
  whole.copy_from(ones);
  g.release(0, 1);
  CHECK_FALSE(g.mapped(0));
  CHECK(g.mapped(1));
  CHECK(g.mapped_bytes() == (count - 1) * g.granule());
  std::vector<float> after = whole.to_vector();
  std::size_t zeros = 0, kept = 0;
  for (std::size_t i = 0; i < after.size(); ++i) (i < per ? zeros : kept) += after[i] == (i < per ? 0.0f : 1.0f);
  CHECK(zeros == per);                 // a granule given back reads as zero
  CHECK(kept == after.size() - per);   // the others keep their values
  g.release(1, count);                 // all given back: they share one zero granule
  CHECK(g.mapped_bytes() == 0);
  CHECK(whole.to_vector() == std::vector<float>(count * per, 0.0f));
  g.map(1, 2);                         // mapped again: zeroed, and writable
  CHECK(g.mapped_bytes() == g.granule());
  tensor<float, gpu> second(tensor<float, gpu>::borrowed, static_cast<float*>(g.data()) + per, per, 1);
  CHECK(second.to_vector() == std::vector<float>(per, 0.0f));
  second.copy_from(std::vector<float>(per, 2.0f));
  g.release(0, 1);                     // (re-zeroes the shared granule; granule 1 keeps its values)
  std::vector<float> last = whole.to_vector();
  CHECK(std::count(last.begin(), last.begin() + std::ptrdiff_t(per), 0.0f) == std::ptrdiff_t(per));
  CHECK(std::count(last.begin() + std::ptrdiff_t(per), last.begin() + std::ptrdiff_t(2 * per), 2.0f) ==
        std::ptrdiff_t(per));
  CHECK(std::count(last.begin() + std::ptrdiff_t(2 * per), last.end(), 0.0f) == std::ptrdiff_t((count - 2) * per));
}
