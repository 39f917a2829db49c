// Conv2d: values by hand; oneDNN's fp32 forward and backward against the im2col + GEMM oracle in
// double; the oracle (the double model's path) against central differences; every storage policy
// over residual convolution blocks bit for bit, with the plan equal to the measured peak and what
// the step reserves; bad input refused with nothing changed. 16-bit: the bf16 path (oneDNN's, or
// the widened one where the processor has no bf16 convolution) and the widened half path against
// the fp32 convolution of the same rounded values.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/gradients.hpp"

#include <cmath>
#include <vector>

using namespace remat;

namespace {

std::vector<double> draw(std::size_t n, std::uint64_t stream) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 2.0 * philox::uniform(11, stream, i) - 1.0;
  return v;
}

std::vector<float> to_float(std::vector<double> const& v) { return {v.begin(), v.end()}; }

double worst(std::vector<float> const& a, std::vector<double> const& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(b[i])));
  return e;
}

void require_matches_oracle(kernels::conv_shape c, bool bias) {
  INFO("batch " << c.batch << ", " << c.in_channels << " -> " << c.out_channels << " channels, " << c.height << " x "
                << c.width << ", kernel " << c.kernel << ", stride " << c.stride << ", padding " << c.padding);
  auto const x = draw(c.batch * c.in_features(), 1), w = draw(c.weight_count(), 2), b = draw(c.out_channels, 3),
             dy = draw(c.batch * c.out_features(), 4), w0 = draw(c.weight_count(), 5), b0 = draw(c.out_channels, 6);
  // The oracle in double.
  std::vector<double> y(c.batch * c.out_features()), dx(x.size()), dw = w0, db = b0;
  kernels::detail::im2col_forward(c, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
  kernels::detail::im2col_backward(c, x.data(), w.data(), dy.data(), dx.data(), dw.data(), bias ? db.data() : nullptr);
  // fp32 through the library's path (oneDNN when built with it).
  auto const xf = to_float(x), wf = to_float(w), bf = to_float(b), dyf = to_float(dy);
  std::vector<float> yf(y.size()), dxf(dx.size()), dwf = to_float(w0), dbf = to_float(b0);
  kernels::conv2d_forward(host{}, c, xf.data(), wf.data(), bias ? bf.data() : nullptr, yf.data());
  kernels::conv2d_backward(host{}, c, xf.data(), wf.data(), dyf.data(), dxf.data(), dwf.data(),
                           bias ? dbf.data() : nullptr);
  CHECK(worst(yf, y) < 1e-5);
  CHECK(worst(dxf, dx) < 1e-5);
  CHECK(worst(dwf, dw) < 1e-4);  // (sums over batch x output pixels)
  if (bias) CHECK(worst(dbf, db) < 1e-4);
  // No input gradient asked for: the weights' gradients alone.
  std::vector<float> dw2 = to_float(w0);
  kernels::conv2d_backward(host{}, c, xf.data(), wf.data(), dyf.data(), static_cast<float*>(nullptr), dw2.data(),
                           static_cast<float*>(nullptr));
  CHECK(dw2 == dwf);
}


// A 16-bit convolution against the fp32 one of the same (rounded) values: the products of 16-bit
// values are exact in fp32 and the sums run in fp32, so the fp32 outputs and the weights' fp32
// gradients agree to fp32 rounding, and the 16-bit outputs are those rounded once.
template <class T>
void require_matches_fp32(kernels::conv_shape c, bool widened) {
  INFO((widened ? "widened" : "library path") << ", batch " << c.batch << ", " << c.in_channels << " -> "
                                                << c.out_channels << " channels, " << c.height << " x " << c.width
                                                << ", kernel " << c.kernel << ", stride " << c.stride);
  auto rounded = [](std::vector<double> const& v) {
    std::vector<T> r;
    for (double e : v) r.push_back(T(float(e)));
    return r;
  };
  auto widen = [](std::vector<T> const& v) {
    std::vector<float> r;
    for (T e : v) r.push_back(float(e));
    return r;
  };
  auto const x = rounded(draw(c.batch * c.in_features(), 1)), w = rounded(draw(c.weight_count(), 2)),
             b = rounded(draw(c.out_channels, 3)), dy = rounded(draw(c.batch * c.out_features(), 4));
  auto const xf = widen(x), wf = widen(w), bf = widen(b), dyf = widen(dy);
  std::vector<float> yf(c.batch * c.out_features()), dxf(xf.size()), dwf = to_float(draw(c.weight_count(), 5)),
      dbf = to_float(draw(c.out_channels, 6));
  std::vector<float> dw = dwf, db = dbf;
  kernels::conv2d_forward(host{}, c, xf.data(), wf.data(), bf.data(), yf.data());
  kernels::conv2d_backward(host{}, c, xf.data(), wf.data(), dyf.data(), dxf.data(), dwf.data(), dbf.data());
  std::vector<T> y(yf.size()), dx(xf.size());
  if (widened) {
    kernels::detail::conv2d_forward_widened(host{}, c, x.data(), w.data(), b.data(), y.data());
    kernels::detail::conv2d_backward_widened(host{}, c, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  } else {
    kernels::conv2d_forward(host{}, c, x.data(), w.data(), b.data(), y.data());
    kernels::conv2d_backward(host{}, c, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  }
  double const unit = std::is_same_v<T, bfloat16> ? 0x1p-8 : 0x1p-11;  // (one rounding: half of this)
  auto close16 = [&](std::vector<T> const& got, std::vector<float> const& want) {
    double e = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      e = std::max(e, std::abs(double(float(got[i])) - double(want[i])) - unit * std::abs(double(want[i])));
    return e;
  };
  CHECK(close16(y, yf) < 1e-5);
  CHECK(close16(dx, dxf) < 1e-5);
  CHECK(worst(dw, {dwf.begin(), dwf.end()}) < 1e-4);
  CHECK(worst(db, {dbf.begin(), dbf.end()}) < 1e-4);
}

constexpr std::size_t C = 4, H = 8;
using Block = Residual<Seq<Conv2d<C, C, 3, H, H, 1, 1>, ReLU, Conv2d<C, C, 3, H, H, 1, 1>>>;
template <class Middle>
using Net = Seq<Conv2d<1, C, 3, H, H, 1, 1>, Middle, Linear<C * H * H, 3>>;

template <class NetT>
std::vector<float> train(std::size_t batch, memory::caching_allocator<host>& alloc) {
  model<NetT> m(seed{2}, alloc);
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> x(index_t(batch), index_t(H * H)), t(index_t(batch), 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.3 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(i % 3) - 1.0f;
  auto const plan = memory_plan<NetT, fp32, AdamW>(batch);
  for (int step = 0; step < 3; ++step) {
    alloc.reset_peak();
    m.template train_step<MSE>(x, t, opt);
    CHECK(alloc.stats()[memory::tag::activations].peak == plan.activations.peak_bytes);
    CHECK(alloc.stats().total.peak == plan.peak);
    CHECK(alloc.stats().total.reserved == plan.reserved);
    CHECK(m.last_pass().unplanned == 0);
  }
  return tensor_to_host(m.parameters());
}

}  // namespace

TEST_CASE("Conv2d: values by hand", "[layers][conv]") {
  // One 3 x 3 image 1..9, a 2 x 2 kernel of ones, bias 0.5: each output is its window's sum + 0.5.
  kernels::conv_shape const c{1, 1, 3, 3, 1, 2, 1, 0};
  std::vector<float> const x{1, 2, 3, 4, 5, 6, 7, 8, 9}, w{1, 1, 1, 1}, b{0.5f};
  std::vector<float> y(4);
  kernels::conv2d_forward(host{}, c, x.data(), w.data(), b.data(), y.data());
  CHECK(y == std::vector<float>{12.5f, 16.5f, 24.5f, 28.5f});
  // Padding 1, stride 2: windows at (-1,-1), (-1,1), (1,-1), (1,1); zeros outside.
  kernels::conv_shape const p{1, 1, 3, 3, 1, 2, 2, 1};
  REQUIRE(p.out_height() == 2);
  kernels::conv2d_forward(host{}, p, x.data(), w.data(), static_cast<float const*>(nullptr), y.data());
  CHECK(y == std::vector<float>{1, 2 + 3, 4 + 7, 5 + 6 + 8 + 9});
  // Backward with dy = 1: dx counts the windows each pixel is in; dw sums the windows; db counts
  // the outputs.
  std::vector<float> dy(4, 1.0f), dx(9), dw(4, 0.0f), db(1, 0.0f);
  kernels::conv2d_backward(host{}, c, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  CHECK(dx == std::vector<float>{1, 2, 1, 2, 4, 2, 1, 2, 1});
  CHECK(dw == std::vector<float>{1 + 2 + 4 + 5, 2 + 3 + 5 + 6, 4 + 5 + 7 + 8, 5 + 6 + 8 + 9});
  CHECK(db == std::vector<float>{4});
  // The widths a Seq checks: 3 channels of 32 x 32, kernel 3, stride 2, padding 1 -> 16 x 16.
  using L = Conv2d<3, 8, 3, 32, 32, 2, 1>;
  static_assert(L::in_width == 3 * 32 * 32 && L::out_image.height == 16 && L::out_width == 8 * 16 * 16);
  static_assert(L::param_count == 8 * 3 * 9 + 8);
}

TEST_CASE("Conv2d: the fp32 path (oneDNN) against the im2col oracle in double", "[layers][conv]") {
  require_matches_oracle({2, 3, 7, 6, 5, 3, 1, 1}, true);
  require_matches_oracle({3, 2, 9, 9, 4, 3, 2, 1}, true);
  require_matches_oracle({1, 4, 8, 8, 6, 1, 1, 0}, false);
  require_matches_oracle({2, 3, 10, 7, 2, 5, 2, 2}, true);
  require_matches_oracle({5, 16, 12, 12, 16, 3, 1, 1}, true);
  require_matches_oracle({2, 2, 6, 6, 3, 4, 3, 0}, false);  // (the right padding oneDNN needs differs)
}

TEST_CASE("Conv2d in 16 bits against fp32 on the same rounded values", "[layers][conv][mixed]") {
  for (kernels::conv_shape const c : {kernels::conv_shape{2, 3, 7, 6, 5, 3, 1, 1}, kernels::conv_shape{3, 16, 9, 9, 16, 3, 2, 1},
                                      kernels::conv_shape{4, 8, 12, 12, 8, 3, 1, 1}}) {
    require_matches_fp32<bfloat16>(c, false);
    require_matches_fp32<bfloat16>(c, true);
    require_matches_fp32<half>(c, false);
  }
}

TEST_CASE("gradients: Conv2d against central differences", "[layers][conv][grad]") {
  require_gradients<Seq<Conv2d<2, 3, 3, 5, 4, 1, 1>>>();
  require_gradients<Seq<Conv2d<3, 2, 3, 7, 7, 2, 1, false>>>();
  require_gradients<Seq<Conv2d<1, 2, 2, 4, 5, 2, 0>>>();
  // A whole model: convolutions, ReLU, a residual convolution block, a head.
  using Small = Residual<Seq<Conv2d<3, 3, 3, 4, 4, 1, 1>, GELU, Conv2d<3, 3, 3, 4, 4, 1, 1>>>;
  require_gradients<Seq<Conv2d<2, 3, 3, 6, 6, 1, 0>, ReLU, Small, Linear<48, 2>>>({.batch = 2});
}

TEST_CASE("Conv2d under every storage policy: bit for bit, and the plan is what the step uses", "[layers][conv]") {
  memory::caching_allocator<host> a;
  auto const stored = train<Net<Repeat<3, Block>>>(6, a);
  CHECK(train<Net<Repeat<3, Checkpointed<Block>>>>(6, a) == stored);
  CHECK(train<Net<Repeat<3, Selective<Block>>>>(6, a) == stored);
  CHECK(train<Net<Revolve<1, Repeat<3, Block>>>>(6, a) == stored);
  CHECK(train<Net<CheckpointSequential<2, Repeat<3, Block>>>>(6, a) == stored);
  // Checkpointing the blocks keeps less.
  static_assert(activation_plan<Net<Repeat<8, Checkpointed<Block>>>>(32).peak_bytes <
                activation_plan<Net<Repeat<8, Block>>>(32).peak_bytes);
}

TEST_CASE("Conv2d: bad input is refused and changes nothing", "[layers][conv][errors]") {
  using N = Net<Repeat<1, Block>>;
  model<N> m(seed{1});
  SGD opt(m, {.lr = 0.1});
  auto const before = tensor_to_host(m.parameters());
  tensor<float> wrong(2, index_t(H * H + 1)), t(2, 3);
  CHECK_THROWS_AS(m.train_step<MSE>(wrong, t, opt), shape_error);
  tensor<float> x(2, index_t(H * H));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.5f;
  CHECK_THROWS_AS(m.train_step<MSE>(x.row_range(0, 0), t.row_range(0, 0), opt), argument_error);
  x[3] = std::nanf("");
  CHECK_THROWS_AS(m.train_step<MSE>(x, t, opt), argument_error);
  CHECK(tensor_to_host(m.parameters()) == before);
}
