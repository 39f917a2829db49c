// Mixed precision: 16-bit matrix products against a double reference on every path; gradients of
// mixed<bfloat16> and mixed<half> models against the fp32 model within what the 16-bit types
// imply; underflow without a loss scale and none with one; a skipped step on overflow that leaves
// everything bit for bit as it was; the dynamic scale's schedule; gradient accumulation with a
// scale; storage policies bit for bit in mixed precision.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace remat;
using kernels::trans;
using bf16 = remat::bfloat16;
using f16 = remat::half;

namespace {

// ---------------------------------------------------------------- products

template <class T, class Out>
void check_gemm16(index_t m, index_t n, index_t k, trans ta, trans tb, float beta, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  index_t const ar = ta == trans::no ? m : k, ac = ta == trans::no ? k : m;
  index_t const br = tb == trans::no ? k : n, bc = tb == trans::no ? n : k;
  tensor<T> a(ar, ac), b(br, bc);
  tensor<Out> c(m, n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(d(rng));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(d(rng));
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = Out(d(rng));
  auto const c0 = c.to_vector();
  kernels::gemm(a.view(), ta, b.view(), tb, c.view(), 1.0f, beta);
  // The products of 16-bit inputs are exact in fp32; the sums round in fp32 (k terms), and a
  // 16-bit C rounds once more at the end.
  double const out_eps = std::is_same_v<Out, float> ? 0.0 : (std::is_same_v<Out, bf16> ? 0x1p-8 : 0x1p-11);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (index_t p = 0; p < k; ++p) {
        double const x = double(ta == trans::no ? a(i, p) : a(p, i));
        double const y = double(tb == trans::no ? b(p, j) : b(j, p));
        ref += x * y;
        mag += std::fabs(x * y);
      }
      double const c_old = double(c0[std::size_t(i * n + j)]);
      double const want = ref + double(beta) * c_old;
      double const tol = double(k + 2) * FLT_EPSILON * (mag + std::fabs(c_old)) + out_eps * std::fabs(want) + 1e-30;
      INFO("m n k = " << m << " " << n << " " << k << ", transposes " << int(ta) << int(tb) << ", beta " << beta);
      REQUIRE(std::fabs(double(c(i, j)) - want) <= tol);
    }
}

template <class T, class Out>
void check_gemm16_shapes() {
  unsigned seed = 1;
  for (auto [m, n, k] : {std::tuple<index_t, index_t, index_t>{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 96, 128}})
    for (trans ta : {trans::no, trans::yes})
      for (trans tb : {trans::no, trans::yes})
        for (float beta : {0.0f, 1.0f}) check_gemm16<T, Out>(m, n, k, ta, tb, beta, seed++);
}

struct path_guard {
  explicit path_guard(kernels::gemm16_path p) { kernels::set_gemm16_path(p); }
  ~path_guard() { kernels::set_gemm16_path(kernels::gemm16_path::automatic); }
};

// ---------------------------------------------------------------- models

constexpr std::size_t W = 32;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 64>, GELU, Linear<64, W>>>;
using Net = Seq<Linear<16, W>, Repeat<2, Block>, LayerNorm<W>, Linear<W, 8>>;
using DropBlock = Residual<Seq<LayerNorm<W>, Linear<W, 64>, GELU, Dropout<0.2>, Linear<64, W>, Dropout<0.1>>>;
template <class Middle>
using PNet = Seq<Linear<16, W>, Middle, Linear<W, 8>>;

tensor<float> inputs(std::size_t rows, std::size_t cols, double f = 0.37) {
  tensor<float> x{index_t(rows), index_t(cols)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(f * double(i) + 0.1));
  return x;
}

double rel_error(std::vector<float> const& a, std::vector<float> const& ref, double scale_a = 1.0) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const e = double(a[i]) / scale_a - double(ref[i]);
    num += e * e;
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / den);
}

template <class P, class NetT = Net>
std::vector<float> gradients_of(tensor<float> const& x, tensor<float> const& t, double* loss = nullptr) {
  model<NetT, host, P> m(seed{3});
  double const l = m.template accumulate<MSE>(x, t);
  if (loss) *loss = l;
  return tensor_to_host(m.gradients());
}

template <class T>
std::vector<std::uint16_t> bits_of(tensor_view<T const> v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i].bits();
  return out;
}

struct run_result {
  std::vector<double> losses;
  std::vector<float> params, grads;
};

template <class NetT, class P>
run_result train(int steps = 3) {
  model<NetT, host, P> m(seed{7});
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> x = inputs(24, 16), t = inputs(24, 8, 0.11);
  run_result r;
  for (int k = 0; k < steps; ++k) {
    r.losses.push_back(m.template train_step<MSE>(x, t, opt));
    REQUIRE_FALSE(opt.last_step_skipped());
  }
  r.params = tensor_to_host(m.parameters());
  r.grads = tensor_to_host(m.gradients());
  return r;
}

bool same_bits(run_result const& a, run_result const& b) {
  return a.losses == b.losses && std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4) == 0 &&
         std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * 4) == 0;
}

}  // namespace

TEST_CASE("mixed: bf16 and half products accumulate in fp32 on every host path", "[mixed][gemm]") {
  SECTION("bf16 through oneDNN, where it has a bf16 matmul for this processor") {
    // oneDNN 2.6's bf16 matmul needs AVX-512 (F, BW, VL, DQ); elsewhere (an AVX2 processor) the
    // automatic path converts, and asking for oneDNN is an error that changes nothing.
#if defined(__x86_64__) && defined(__GNUC__)
    bool const avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    CHECK(kernels::has_onednn_bf16() == (kernels::has_onednn && avx512));
#endif
    if (!kernels::has_onednn_bf16()) {
      CHECK(kernels::gemm16_path_for<bf16>() == kernels::gemm16_path::convert);
      path_guard g(kernels::gemm16_path::onednn);
      tensor<bf16> a(2, 2), b(2, 2), c(2, 2);
      evaluate(a, expr::to_expr(1.0)), evaluate(b, expr::to_expr(1.0)), evaluate(c, expr::to_expr(3.0));
      REQUIRE_THROWS_AS(kernels::gemm(a.view(), trans::no, b.view(), trans::no, c.view()), argument_error);
      CHECK(float(c.data()[0]) == 3.0f);
      if (kernels::has_onednn)
        CHECK_THROWS_WITH(kernels::gemm(a.view(), trans::no, b.view(), trans::no, c.view()),
                          Catch::Contains("AVX-512"));
    } else {
      CHECK(kernels::gemm16_path_for<bf16>() == kernels::gemm16_path::onednn);
      path_guard g(kernels::gemm16_path::onednn);
      check_gemm16_shapes<bf16, bf16>();
      check_gemm16_shapes<bf16, float>();
    }
  }
  SECTION("bf16 converted to fp32") {
    path_guard g(kernels::gemm16_path::convert);
    check_gemm16_shapes<bf16, bf16>();
    check_gemm16_shapes<bf16, float>();
  }
  SECTION("half converted to fp32") {
    check_gemm16_shapes<f16, f16>();
    check_gemm16_shapes<f16, float>();
  }
  SECTION("asking for a path that does not exist is an error") {
    path_guard g(kernels::gemm16_path::onednn);
    tensor<f16> a(2, 2), b(2, 2), c(2, 2);
    REQUIRE_THROWS_AS(kernels::gemm(a.view(), trans::no, b.view(), trans::no, c.view()), argument_error);
  }
}

TEST_CASE("mixed: gradients agree with the fp32 model within what bf16 and half imply", "[mixed]") {
  tensor<float> const x = inputs(64, 16), t = inputs(64, 8, 0.23);
  double l32 = 0, lb = 0, lh = 0;
  auto const g32 = gradients_of<fp32>(x, t, &l32);
  auto const gb = gradients_of<mixed<bf16>>(x, t, &lb);
  auto const gh = gradients_of<mixed<f16, StaticLossScale<256>>>(x, t, &lh);
  // bf16 keeps 8 significant bits (unit roundoff 2^-9), half 11 (2^-12); a few layers of rounded
  // activations and gradients compound to a few units: allow 16 units of each.
  double const eb = rel_error(gb, g32), eh = rel_error(gh, g32, 256.0);
  INFO("relative gradient error: bf16 " << eb << ", half " << eh);
  CHECK(eb < 16 * 0x1p-9);
  CHECK(eh < 16 * 0x1p-12);
  CHECK(eh < eb);  // half's extra bits show
  CHECK(std::fabs(lb - l32) < 16 * 0x1p-9 * l32);
  CHECK(std::fabs(lh - l32) < 16 * 0x1p-12 * l32);

  SECTION("and with token ids, an embedding and cross-entropy") {
    using Lm = Seq<Embedding<11, W>, Block, LayerNorm<W>, Linear<W, 6>>;
    tensor<std::int32_t> ids(40, 1), labels(40, 1);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = std::int32_t((i * 7) % 11);
      labels[i] = std::int32_t((i * 5) % 6);
    }
    model<Lm> m32(seed{5});
    model<Lm, host, mixed<bf16>> mb(seed{5});
    double const a = m32.accumulate<SoftmaxCrossEntropy>(ids, labels);
    double const b = mb.accumulate<SoftmaxCrossEntropy>(ids, labels);
    CHECK(std::fabs(a - b) < 16 * 0x1p-9 * a);
    CHECK(rel_error(tensor_to_host(mb.gradients()), tensor_to_host(m32.gradients())) < 16 * 0x1p-9);
  }
}

TEST_CASE("mixed: half gradients underflow without a loss scale and not with one", "[mixed][scale]") {
  // A loss term weighted 1e-5 on a model whose error is about 1: the output gradients are about
  // 2 * 1e-5 / 4096 = 5e-9, under half of half's smallest subnormal (6e-8), so they round to 0.
  using One = Seq<Linear<64, 64>>;
  tensor<float> const x = inputs(64, 64);
  tensor<float> t = inputs(64, 64, 0.19);
  double const weight = 1e-5;
  auto grads = [&](auto& m) {
    m.template accumulate<MSE>(x, t, weight);
    return tensor_to_host(m.gradients());
  };
  model<One> m32(seed{9});
  auto const ref = grads(m32);
  auto zeros = [](std::vector<float> const& g) {
    std::size_t z = 0;
    for (float v : g) z += v == 0.0f;
    return double(z) / double(g.size());
  };
  REQUIRE(zeros(ref) == 0.0);

  model<One, host, mixed<f16>> unscaled(seed{9});
  double const lost = zeros(grads(unscaled));
  INFO("fraction of half gradients that underflow to zero without scaling: " << lost);
  CHECK(lost >= 0.6);
  WARN("half gradients lost to underflow without a loss scale: " << lost * 100 << "%");

  model<One, host, mixed<f16, StaticLossScale<1024>>> fixed(seed{9});
  auto const gs = grads(fixed);
  CHECK(zeros(gs) == 0.0);
  CHECK(rel_error(gs, ref, 1024.0) < 0.05);  // and right, not merely non-zero

  model<One, host, mixed<f16, DynamicLossScale>> dynamic(seed{9});
  REQUIRE(dynamic.scaler().scale() == 65536.0);
  auto const gd = grads(dynamic);
  CHECK(zeros(gd) == 0.0);
  CHECK(rel_error(gd, ref, 65536.0) < 16 * 0x1p-12);
}

TEST_CASE("mixed: on overflow the step is skipped and nothing changes, bit for bit", "[mixed][scale]") {
  using P = mixed<f16, DynamicLossScale>;
  model<Net, host, P> m(seed{4});
  AdamW opt(m, {.lr = 1e-2, .clip_norm = 1.0});
  tensor<float> const x = inputs(32, 16), t = inputs(32, 8, 0.13);
  for (int i = 0; i < 2; ++i) REQUIRE(m.train_step<MSE>(x, t, opt) > 0);
  REQUIRE(opt.steps() == 2);
  REQUIRE_FALSE(opt.last_step_skipped());

  auto const params = tensor_to_host(m.parameters());
  auto const mom1 = opt.exp_avg().to_vector(), mom2 = opt.exp_avg_sq().to_vector();
  auto const copy = bits_of<f16>(m.compute_parameters());
  double const scale = m.scaler().scale();

  // Targets 1e4 away: the output gradient is 2e4 / 256 * 65536 = 5e6 in half, which overflows.
  tensor<float> far(32, 8);
  for (std::size_t i = 0; i < far.size(); ++i) far[i] = 1e4f;
  double const l = m.train_step<MSE>(x, far, opt);
  CHECK(std::isfinite(l));  // the loss is fine; its scaled gradient is not
  CHECK(opt.last_step_skipped());
  CHECK(m.scaler().skipped_steps() == 1);
  CHECK(m.scaler().scale() == scale / 2);
  CHECK(opt.steps() == 2);
  auto const params_after = tensor_to_host(m.parameters());
  CHECK(std::memcmp(params.data(), params_after.data(), params.size() * 4) == 0);
  CHECK(opt.exp_avg().to_vector() == mom1);
  CHECK(opt.exp_avg_sq().to_vector() == mom2);
  CHECK(bits_of<f16>(m.compute_parameters()) == copy);

  // Training goes on at the smaller scale.
  CHECK(m.train_step<MSE>(x, t, opt) > 0);
  CHECK_FALSE(opt.last_step_skipped());
  CHECK(opt.steps() == 3);

  SECTION("NaN in the data is an error, not a skipped step, and changes nothing") {
    tensor<float> bad = inputs(32, 16);
    bad[5] = std::nanf("");
    auto const before = tensor_to_host(m.parameters());
    auto const grads_before = tensor_to_host(m.gradients());
    REQUIRE_THROWS_AS(m.train_step<MSE>(bad, t, opt), argument_error);
    CHECK(tensor_to_host(m.parameters()) == before);
    CHECK(tensor_to_host(m.gradients()) == grads_before);
    CHECK(m.scaler().skipped_steps() == 1);
    CHECK(opt.steps() == 3);
  }
  SECTION("an input beyond half's range is an error too") {
    tensor<float> big = inputs(32, 16);
    big[3] = 70000.0f;
    REQUIRE_THROWS_WITH(m.train_step<MSE>(big, t, opt), Catch::Contains("65504"));
    CHECK(opt.steps() == 3);
  }
}

TEST_CASE("mixed: the dynamic scale follows GradScaler's schedule", "[mixed][scale]") {
  loss_scaler s = loss_scaler::of<DynamicLossScale>();
  CHECK(s.scale() == 65536.0);
  CHECK(s.options().growth_factor == 2.0);
  CHECK(s.options().backoff_factor == 0.5);
  CHECK(s.options().growth_interval == 2000);
  for (int i = 0; i < 1999; ++i) s.update(false);
  CHECK(s.scale() == 65536.0);
  s.update(false);
  CHECK(s.scale() == 131072.0);
  CHECK(s.growth_tracker() == 0);
  s.configure({.init_scale = 8.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3});
  s.update(false);
  s.update(false);
  s.update(true);  // an overflow resets the count
  CHECK(s.scale() == 2.0);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 2.0);
  s.update(false);
  CHECK(s.scale() == 8.0);
  CHECK(s.skipped_steps() == 1);
  CHECK_THROWS_AS(s.configure({.init_scale = 8.0, .growth_factor = 0.5}), argument_error);
  // An infinite scale (or growth) would overflow every step after it: refused, the state kept.
  double const inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(s.configure({.init_scale = inf}), Catch::Contains("expected a finite init_scale > 0"));
  CHECK_THROWS_AS(s.configure({.init_scale = 8.0, .growth_factor = inf}), argument_error);
  CHECK_THROWS_AS(s.configure({.init_scale = std::nan("")}), argument_error);
  CHECK(s.scale() == 8.0);
  CHECK(s.options().growth_factor == 4.0);

  loss_scaler fixed = loss_scaler::of<StaticLossScale<1024>>();
  fixed.update(true);
  CHECK(fixed.scale() == 1024.0);
  CHECK(fixed.checks());
  CHECK_FALSE(loss_scaler::of<StaticLossScale<>>().checks());
  CHECK_THROWS_AS(fixed.configure({}), argument_error);
}

TEST_CASE("mixed: accumulation with a loss scale unscales once, after every micro-batch", "[mixed][scale]") {
  // A power-of-two scale multiplies every gradient exactly (no overflow or underflow here), so a
  // bf16 model with StaticLossScale<1024> holds exactly 1024 times the unscaled model's gradients
  // after its micro-batches, and its optimizer (dividing once) takes the very same steps.
  using Scaled = mixed<bf16, StaticLossScale<1024>>;
  model<Net, host, mixed<bf16>> plain(seed{6});
  model<Net, host, Scaled> scaled(seed{6});
  AdamW op(plain, {.lr = 1e-2, .clip_norm = 0.5});
  AdamW os(scaled, {.lr = 1e-2, .clip_norm = 0.5});
  tensor<float> const x = inputs(48, 16), t = inputs(48, 8, 0.29);
  for (int step = 0; step < 3; ++step) {
    plain.zero_grad();
    scaled.zero_grad();
    for (std::size_t part = 0; part < 3; ++part) {
      auto xs = x.view().row_range(part * 16, 16);
      auto ts = t.view().row_range(part * 16, 16);
      double const a = plain.accumulate<MSE>(xs, ts, 1.0 / 3);
      double const b = scaled.accumulate<MSE>(xs, ts, 1.0 / 3);
      REQUIRE(a == b);
    }
    auto const gp = tensor_to_host(plain.gradients()), gs = tensor_to_host(scaled.gradients());
    bool exact = true;
    for (std::size_t i = 0; i < gp.size(); ++i) exact = exact && gs[i] == 1024.0f * gp[i];
    REQUIRE(exact);
    REQUIRE(op.step());
    REQUIRE(os.step());
    REQUIRE(os.last_grad_norm() == op.last_grad_norm());
    auto const pp = tensor_to_host(plain.parameters()), ps = tensor_to_host(scaled.parameters());
    REQUIRE(std::memcmp(pp.data(), ps.data(), pp.size() * 4) == 0);
  }

  SECTION("half with the dynamic scale: micro-batches give the whole batch's step") {
    using P = mixed<f16, DynamicLossScale>;
    model<Net, host, P> whole(seed{6}), parts(seed{6});
    SGD ow(whole, {.lr = 0.1}), opt(parts, {.lr = 0.1});
    auto const p0 = tensor_to_host(whole.parameters());
    whole.zero_grad();
    whole.accumulate<MSE>(x, t);
    parts.zero_grad();
    for (std::size_t part = 0; part < 3; ++part)
      parts.accumulate<MSE>(x.view().row_range(part * 16, 16), t.view().row_range(part * 16, 16),
                            1.0 / 3);
    CHECK(rel_error(tensor_to_host(parts.gradients()), tensor_to_host(whole.gradients())) < 4 * 0x1p-12);
    REQUIRE(ow.step());
    REQUIRE(opt.step());
    // The updates (unscaled once by the optimizer) agree as the gradients do.
    auto delta = [&](auto& m) {
      auto p = tensor_to_host(m.parameters());
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= p0[i];
      return p;
    };
    CHECK(rel_error(delta(parts), delta(whole)) < 4 * 0x1p-12);
    CHECK(rel_error(tensor_to_host(whole.gradients()), delta(whole), -whole.scaler().scale() / 0.1) < 1e-5);
  }
}

TEST_CASE("mixed: storage policies train bit for bit like the stored model", "[mixed][policies]") {
  using Stored = PNet<Repeat<4, DropBlock>>;
  auto const b = train<Stored, mixed<bf16>>();
  CHECK(same_bits(b, train<PNet<Repeat<4, Checkpointed<DropBlock>>>, mixed<bf16>>()));
  CHECK(same_bits(b, train<PNet<Revolve<2, Repeat<4, DropBlock>>>, mixed<bf16>>()));
  CHECK(same_bits(b, train<PNet<Repeat<4, Selective<DropBlock>>>, mixed<bf16>>()));
  CHECK(same_bits(b, train<PNet<CheckpointSequential<2, Repeat<4, DropBlock>>>, mixed<bf16>>()));
  using H = mixed<f16, DynamicLossScale>;
  auto const h = train<Stored, H>();
  CHECK(same_bits(h, train<PNet<Repeat<4, Checkpointed<DropBlock>>>, H>()));
  CHECK(same_bits(h, train<PNet<Revolve<1, Repeat<4, DropBlock>>>, H>()));
  CHECK(same_bits(h, train<PNet<Selective<Repeat<4, DropBlock>>>, H>()));
  // and mixed precision is not fp32 in disguise
  CHECK_FALSE(same_bits(b, train<Stored, fp32>()));
}

TEST_CASE("mixed: the compute copy is the master weights cast once per change", "[mixed]") {
  model<Net, host, mixed<bf16>> m(seed{8});
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> const x = inputs(16, 16), t = inputs(16, 8, 0.31);
  for (int i = 0; i < 3; ++i) m.train_step<MSE>(x, t, opt);
  // The optimizer wrote the copy in its pass: it equals a fresh cast of the master weights.
  auto const master = tensor_to_host(m.parameters());
  auto const copy = bits_of<bf16>(m.compute_parameters());
  bool equal = true;
  for (std::size_t i = 0; i < master.size(); ++i) equal = equal && bf16(master[i]).bits() == copy[i];
  CHECK(equal);
  // Writing the master weights through parameters() makes the next pass cast them again.
  tensor<float> const y0 = m.forward(x);
  auto p = m.parameters();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.0f;
  tensor<float> const y1 = m.forward(x);
  CHECK(y1.to_vector() != y0.to_vector());
  for (std::size_t i = 0; i < y1.size(); ++i) REQUIRE(y1[i] == 0.0f);
}

TEST_CASE("mixed: the loss scale is saved with the optimizer, and a run resumes bit for bit", "[mixed][scale][io]") {
  using P = mixed<f16, DynamicLossScale>;
  tensor<float> const x = inputs(32, 16), t = inputs(32, 8, 0.17);
  tensor<float> far(32, 8);
  for (std::size_t i = 0; i < far.size(); ++i) far[i] = 1e4f;
  model<Net, host, P> a(seed{12});
  AdamW oa(a, {.lr = 1e-2});
  a.scaler().configure({.init_scale = 65536.0, .growth_interval = 3});
  a.train_step<MSE>(x, t, oa);
  a.train_step<MSE>(x, far, oa);  // overflow: skipped, the scale halves
  a.train_step<MSE>(x, t, oa);
  REQUIRE(a.scaler().skipped_steps() == 1);
  REQUIRE(a.scaler().scale() == 32768.0);
  REQUIRE(a.scaler().growth_tracker() == 1);
  std::string const dir = REMAT_TEST_BINARY_DIR;
  save(a, dir + "/mixed-model.safetensors");
  save(oa, dir + "/mixed-adamw.safetensors");

  model<Net, host, P> b(seed{99});
  AdamW ob(b, {.lr = 1e-2});
  b.scaler().configure({.init_scale = 65536.0, .growth_interval = 3});
  load(b, dir + "/mixed-model.safetensors");
  load(ob, dir + "/mixed-adamw.safetensors");
  CHECK(b.scaler().scale() == 32768.0);
  CHECK(b.scaler().growth_tracker() == 1);
  CHECK(b.scaler().skipped_steps() == 1);
  CHECK(ob.steps() == oa.steps());
  for (int i = 0; i < 3; ++i) {  // the second step grows the scale in both
    a.train_step<MSE>(x, t, oa);
    b.train_step<MSE>(x, t, ob);
  }
  CHECK(a.scaler().scale() == 65536.0);
  CHECK(b.scaler().scale() == 65536.0);
  auto const pa = tensor_to_host(a.parameters()), pb = tensor_to_host(b.parameters());
  CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * 4) == 0);

  SECTION("a file for another model changes nothing") {
    using Other = Seq<Linear<16, 8>>;
    model<Other, host, P> o(seed{1});
    AdamW oo(o);
    save(oo, dir + "/other-adamw.safetensors");
    auto const m1 = ob.exp_avg().to_vector();
    double const scale = b.scaler().scale();
    REQUIRE_THROWS_AS(load(ob, dir + "/other-adamw.safetensors"), io_error);
    CHECK(ob.exp_avg().to_vector() == m1);
    CHECK(b.scaler().scale() == scale);
  }
}
