// BatchNorm2d, GroupNorm, MaxPool2d, AvgPool2d, Upsample2d: values by hand, gradients against
// central differences (each layer and a whole model), BatchNorm's running statistics updated once
// per training pass under every storage policy (against the statistics computed here in double),
// inference by the running statistics, the running state saved and loaded, the plan equal to the
// measured peak, and bad input refused with nothing changed. Mixed precision: every policy bit for
// bit with the plan equal to the peak, and training that follows fp32's.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/gradients.hpp"
#include "support/plan_models.hpp"

#include <cmath>
#include <cstdio>
#include <vector>

using namespace remat;

namespace {

float wave(std::size_t i, double k) { return float(std::sin(k * double(i)) + 0.25 * std::cos(3.1 * k * double(i))); }

constexpr std::size_t C = 4, H = 8;
// A residual block of two convolutions, each followed by batch normalisation.
using Block = plan_models::ConvBlock<C, H>;
template <class Middle>
using Net = Seq<Conv2d<1, C, 3, H, H, 1, 1>, BatchNorm2d<C, H, H>, ReLU, Middle, AvgPool2d<C, H, H>,
                Linear<C * H * H / 4, 3>>;

struct trained {
  std::vector<float> params, buffers;
};

template <class NetT, class P = fp32>
trained train(std::size_t batch, memory::caching_allocator<host>& alloc, int steps = 3,
              std::vector<double>* losses = nullptr) {
  model<NetT, host, P> m(seed{2}, alloc);
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> x(index_t(batch), index_t(H * H)), t(index_t(batch), 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = wave(i, 0.3);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(i % 3) - 1.0f;
  auto const plan = memory_plan<NetT, P, AdamW>(batch);
  INFO(P::name << ", batch " << batch);
  for (int step = 0; step < steps; ++step) {
    alloc.reset_peak();
    double const loss = m.template train_step<MSE>(x, t, opt);
    if (losses) losses->push_back(loss);
    CHECK(alloc.stats()[memory::tag::activations].peak == plan.activations.peak_bytes);
    CHECK(alloc.stats()[memory::tag::parameters].peak == plan.parameters());
    CHECK(alloc.stats().total.peak == plan.peak);
    CHECK(alloc.stats().total.reserved == plan.reserved);
    CHECK(m.last_pass().unplanned == 0);
  }
  return {tensor_to_host(m.parameters()), tensor_to_host(m.buffers())};
}

}  // namespace

TEST_CASE("image layers: values by hand", "[layers][image]") {
  // Max and average pooling, 2 x 2 windows of a 4 x 4 plane 1..16.
  std::vector<float> x(16), y(4), dx(16);
  for (std::size_t i = 0; i < 16; ++i) x[i] = float(i + 1);
  kernels::pool_shape const s{4, 4, 2, 2};
  kernels::max_pool_forward(host{}, 1, s, x.data(), y.data());
  CHECK(y == std::vector<float>{6, 8, 14, 16});
  kernels::avg_pool_forward(host{}, 1, s, x.data(), y.data());
  CHECK(y == std::vector<float>{3.5f, 5.5f, 11.5f, 13.5f});
  std::vector<float> const dy{1, 2, 3, 4};
  kernels::max_pool_backward(host{}, 1, s, x.data(), dy.data(), dx.data());
  CHECK(dx == std::vector<float>{0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4});
  kernels::avg_pool_backward(host{}, 1, s, dy.data(), dx.data());
  CHECK(dx == std::vector<float>{.25f, .25f, .5f, .5f, .25f, .25f, .5f, .5f, .75f, .75f, 1, 1, .75f, .75f, 1, 1});
  // Overlapping windows (kernel 3, stride 1): the centre's gradient sums every window it wins.
  std::vector<float> const peak{0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<float> ones(4, 1.0f);
  kernels::max_pool_backward(host{}, 1, kernels::pool_shape{4, 4, 3, 1}, peak.data(), ones.data(), dx.data());
  CHECK(dx[4] == 2.0f);  // windows at (0,0) and (1,0) hold it; the others' first largest is 0 at their corner
  // Nearest upsampling of a 2 x 2 plane by 2, and its adjoint.
  std::vector<float> const small{1, 2, 3, 4};
  std::vector<float> up(16), back(4);
  kernels::upsample_nearest_forward(host{}, 1, 2, 2, 2, small.data(), up.data());
  CHECK(up == std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  kernels::upsample_nearest_backward(host{}, 1, 2, 2, 2, x.data(), back.data());
  CHECK(back == std::vector<float>{1 + 2 + 5 + 6, 3 + 4 + 7 + 8, 9 + 10 + 13 + 14, 11 + 12 + 15 + 16});
  // Batch normalisation of one channel holding 1, 2, 3, 4 over two images of 1 x 2: mean 2.5,
  // biased variance 1.25.
  std::vector<float> const b{1, 2, 3, 4}, gamma{2}, beta{1};
  std::vector<float> bn(4), mean(1), rstd(1), var(1);
  kernels::batch_norm_forward_training(host{}, kernels::planes{2, 1, 2}, b.data(), gamma.data(), beta.data(), 0.0, bn.data(),
                                       mean.data(), rstd.data(), var.data());
  CHECK(mean[0] == 2.5f);
  CHECK(var[0] == 1.25f);
  float const r = 1.0f / std::sqrt(1.25f);
  for (std::size_t i = 0; i < 4; ++i) CHECK(bn[i] == Approx((b[i] - 2.5f) * r * 2 + 1).margin(1e-6));
  // Group normalisation: 2 groups of 2 channels of one value each in one image.
  std::vector<float> const gx{1, 3, 10, 20}, g1(4, 1.0f), g0(4, 0.0f);
  std::vector<float> gy(4), gm(2), gr(2);
  kernels::group_norm_forward(host{}, kernels::planes{1, 4, 1}, 2, gx.data(), g1.data(), g0.data(), 0.0, gy.data(), gm.data(),
                              gr.data());
  CHECK(gm == std::vector<float>{2, 15});
  CHECK(gy[0] == Approx(-1));
  CHECK(gy[1] == Approx(1));
  CHECK(gy[2] == Approx(-1));
  CHECK(gy[3] == Approx(1));
  // The widths and images a Seq checks.
  static_assert(MaxPool2d<3, 9, 9, 3, 2>::out_image.height == 4 && AvgPool2d<3, 8, 8>::out_width == 3 * 16);
  static_assert(Upsample2d<2, 4, 5>::out_image.width == 10 && image_in_v<Block> == image_shape{C, H, H});
  static_assert(image_out_v<Net<Block>>.channels == 0);  // (its head is a Linear)
  static_assert(buffer_count_v<Net<Repeat<3, Block>>> == 2 * C + 3 * 2 * 2 * C);
}

TEST_CASE("gradients: the image layers against central differences", "[layers][image][grad]") {
  require_gradients<Seq<BatchNorm2d<3, 3, 2>>>({.batch = 2});
  require_gradients<Seq<GroupNorm<2, 4, 3, 3>>>();
  require_gradients<Seq<GroupNorm<1, 3, 2, 2>>>();
  require_gradients<Seq<MaxPool2d<2, 5, 5, 3, 2>>>();
  require_gradients<Seq<AvgPool2d<2, 6, 4, 2>>>();
  require_gradients<Seq<Upsample2d<2, 3, 2, 2>>>();
  // A small U-Net level (down, convolve, up, added back) between batch-normalised convolutions.
  using Level = Residual<Seq<AvgPool2d<3, 4, 4>, Conv2d<3, 3, 3, 2, 2, 1, 1>, GELU, Upsample2d<3, 2, 2>>>;
  require_gradients<Seq<Conv2d<2, 3, 3, 4, 4, 1, 1>, BatchNorm2d<3, 4, 4>, ReLU, Level, GroupNorm<3, 3, 4, 4>,
                        MaxPool2d<3, 4, 4>, Linear<12, 2>>>({.batch = 2});
}

TEST_CASE("BatchNorm2d: running statistics updated once per pass under every storage policy",
          "[layers][image][policies]") {
  memory::caching_allocator<host> a;
  auto const stored = train<Net<Repeat<3, Block>>>(6, a);
  for (auto const& other : {train<Net<Repeat<3, Checkpointed<Block>>>>(6, a),
                            train<Net<Repeat<3, Selective<Block>>>>(6, a),
                            train<Net<Revolve<1, Repeat<3, Block>>>>(6, a),
                            train<Net<CheckpointSequential<2, Repeat<3, Block>>>>(6, a),
                            train<Checkpointed<Net<Repeat<3, Block>>>>(6, a)}) {
    CHECK(other.params == stored.params);
    CHECK(other.buffers == stored.buffers);
  }
  // The running statistics moved (a policy that never took them would leave zeros and ones).
  CHECK(stored.buffers[0] != 0.0f);
  CHECK(stored.buffers[C] != 1.0f);
}

TEST_CASE("image layers in mixed precision: every policy bit for bit, plan = peak, and close to fp32",
          "[layers][image][mixed][policies]") {
  memory::caching_allocator<host> a;
  using B = mixed<bfloat16>;
  using Hf = mixed<half, DynamicLossScale>;
  auto const stored = train<Net<Repeat<3, Block>>, B>(6, a, 4);
  for (auto const& other : {train<Net<Repeat<3, Checkpointed<Block>>>, B>(6, a, 4),
                            train<Net<Repeat<3, Selective<Block>>>, B>(6, a, 4),
                            train<Net<Revolve<1, Repeat<3, Block>>>, B>(6, a, 4)}) {
    CHECK(other.params == stored.params);
    CHECK(other.buffers == stored.buffers);
  }
  auto const stored_half = train<Net<Repeat<3, Block>>, Hf>(6, a, 4);
  auto const ckpt_half = train<Net<Repeat<3, Checkpointed<Block>>>, Hf>(6, a, 4);
  CHECK(ckpt_half.params == stored_half.params);
  CHECK(ckpt_half.buffers == stored_half.buffers);

  // One step from the same weights follows fp32's: the loss, the gradients and the running
  // statistics (fp32, from 16-bit activations) within what 8 (bf16) and 11 (half) bits of
  // rounding in every activation allow. (Later steps are not compared: AdamW's update, g / sqrt(v),
  // turns a rounding difference in a tiny gradient into a full step.)
  using N = Net<Repeat<3, Block>>;
  std::vector<double> l32, l16, lh;
  memory::caching_allocator<host> a32, a16, ah;  // (fresh: each checks what its step reserves)
  auto const one32 = train<N>(6, a32, 1, &l32), one16 = train<N, B>(6, a16, 1, &l16),
             oneh = train<N, Hf>(6, ah, 1, &lh);
  INFO("first loss: fp32 " << l32[0] << ", bf16 " << l16[0] << ", half " << lh[0]);
  CHECK(std::abs(l16[0] - l32[0]) < 0x1p-6 * l32[0]);
  CHECK(std::abs(lh[0] - l32[0]) < 0x1p-9 * l32[0]);
  auto scaled = [](std::vector<float> v, double k) {
    for (float& e : v) e = float(double(e) * k);
    return v;
  };
  auto relative = [](std::vector<float> const& got, std::vector<float> const& want) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      num += (double(got[i]) - double(want[i])) * (double(got[i]) - double(want[i]));
      den += double(want[i]) * double(want[i]);
    }
    return std::sqrt(num / den);
  };
  CHECK(relative(one16.buffers, one32.buffers) < 0x1p-8);
  CHECK(relative(oneh.buffers, one32.buffers) < 0x1p-11);
  CHECK(one16.buffers != one32.buffers);  // (equal would mean fp32 ran)
  tensor<float> x(6, index_t(H * H)), t(6, 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = wave(i, 0.3);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(i % 3) - 1.0f;
  model<N> m32(seed{2});
  model<N, host, B> m16(seed{2});
  model<N, host, mixed<half, StaticLossScale<256>>> mh(seed{2});
  m32.accumulate<MSE>(x, t);
  m16.accumulate<MSE>(x, t);
  mh.accumulate<MSE>(x, t);
  double const e16 = relative(tensor_to_host(m16.gradients()), tensor_to_host(m32.gradients())),
               eh = relative(scaled(tensor_to_host(mh.gradients()), 1.0 / 256), tensor_to_host(m32.gradients()));
  INFO("gradients' relative error: bf16 " << e16 << ", half " << eh);
  // (Measured: 0.044 and 0.0013, the same with the bf16 convolution widened to fp32, so it is the
  // activations' rounding, amplified by the normalisations' subtractions of means, and not the
  // convolution: the bounds are 2^-4 and 2^-8, eight times apart as the types' precisions are.)
  CHECK(e16 < 0x1p-4);
  CHECK(eh < 0x1p-8);
}

TEST_CASE("BatchNorm2d: the running statistics against the batch's, computed here", "[layers][image]") {
  // BatchNorm first, so its input is the batch itself; checkpointed, so its forward runs twice.
  constexpr std::size_t Ch = 2, P = 3;
  using N = Checkpointed<Seq<BatchNorm2d<Ch, 1, P>, Linear<Ch * P, 2>>>;
  model<N> m(seed{3});
  SGD opt(m, {.lr = 0.0});
  std::size_t const batch = 5;
  tensor<float> x(index_t(batch), index_t(Ch * P)), t(index_t(batch), 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 3.0f * wave(i, 0.7) + 1.0f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
  std::vector<double> mean(Ch, 0.0), var(Ch, 0.0);
  for (std::size_t c = 0; c < Ch; ++c) {
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t i = 0; i < P; ++i) mean[c] += x[n * Ch * P + c * P + i];
    mean[c] /= double(batch * P);
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t i = 0; i < P; ++i) var[c] += std::pow(x[n * Ch * P + c * P + i] - mean[c], 2);
    var[c] /= double(batch * P - 1);  // (unbiased, as PyTorch's running variance)
  }
  std::vector<double> rm(Ch, 0.0), rv(Ch, 1.0);
  for (int step = 0; step < 3; ++step) {
    m.train_step<MSE>(x, t, opt);
    for (std::size_t c = 0; c < Ch; ++c) {
      rm[c] = 0.9 * rm[c] + 0.1 * mean[c];
      rv[c] = 0.9 * rv[c] + 0.1 * var[c];
    }
    auto const b = tensor_to_host(m.buffers());
    for (std::size_t c = 0; c < Ch; ++c) {
      CHECK(b[c] == Approx(rm[c]).epsilon(1e-5));
      CHECK(b[Ch + c] == Approx(rv[c]).epsilon(1e-5));
    }
  }
  CHECK(m.last_pass().recomputed == 1);
  // A loss without a backward (training_loss) and inference read them without updating.
  auto const before = tensor_to_host(m.buffers());
  (void)m.training_loss<MSE>(x, t);
  (void)m.forward(x);
  CHECK(tensor_to_host(m.buffers()) == before);
  // Inference normalises by them: set them and compare the layer's output with the formula.
  using Alone = Seq<BatchNorm2d<Ch, 1, P>>;
  model<Alone> bn(seed{1});
  std::vector<float> const stats{0.5f, -1.0f, 4.0f, 0.25f};  // means, then variances
  tensor_from_host(bn.buffers(), std::span<float const>(stats));
  auto const y = tensor_to_host(bn.forward(x).view());
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < Ch; ++c)
      for (std::size_t i = 0; i < P; ++i) {
        std::size_t const k = n * Ch * P + c * P + i;
        CHECK(y[k] == Approx((x[k] - stats[c]) / std::sqrt(stats[Ch + c] + 1e-5)).epsilon(1e-5));
      }
}

TEST_CASE("BatchNorm2d: the running state is saved and loaded with PyTorch's names", "[layers][image][io]") {
  using N = Net<Repeat<2, Block>>;
  memory::caching_allocator<host> a;
  model<N> m(seed{5}, a);
  SGD opt(m, {.lr = 0.01});
  tensor<float> x(4, index_t(H * H)), t(4, 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = wave(i, 0.2);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.1f;
  m.train_step<MSE>(x, t, opt);
  auto const table = model<N>::buffer_table();
  REQUIRE(table.size() == 2 * (1 + 2 * 2));
  CHECK(table[0].name == "1.running_mean");
  CHECK(table[1].name == "1.running_var");
  CHECK(table[2].name == "3.0.1.running_mean");
  CHECK(table.back().name == "3.1.4.running_var");
  std::string const path = "test_image_bn.safetensors";
  save(m, path);
  model<N> other(seed{9}, a);
  load(other, path);
  CHECK(tensor_to_host(other.parameters()) == tensor_to_host(m.parameters()));
  CHECK(tensor_to_host(other.buffers()) == tensor_to_host(m.buffers()));
  CHECK(tensor_to_host(other.forward(x).view()) == tensor_to_host(m.forward(x).view()));
  // A file without the running statistics (a model without BatchNorm) is refused, nothing changed.
  using Plain = Seq<Conv2d<1, C, 3, H, H, 1, 1>, ReLU, AvgPool2d<C, H, H>, Linear<C * H * H / 4, 3>>;
  model<Plain> plain(seed{1}, a);
  save(plain, path);
  model<N> third(seed{4}, a);
  auto const params = tensor_to_host(third.parameters());
  auto const buffers = tensor_to_host(third.buffers());
  CHECK_THROWS_AS(load(third, path), io_error);
  CHECK(tensor_to_host(third.parameters()) == params);
  CHECK(tensor_to_host(third.buffers()) == buffers);
  std::remove(path.c_str());
}

TEST_CASE("image layers: bad input is refused and changes nothing", "[layers][image][errors]") {
  // One value per channel in training: PyTorch refuses it too (the variance is undefined).
  using One = Seq<Linear<3, 4>, BatchNorm2d<4, 1, 1>, Linear<4, 1>>;
  model<One> m(seed{1});
  AdamW opt(m, {.lr = 0.1});
  auto const params = tensor_to_host(m.parameters());
  auto const buffers = tensor_to_host(m.buffers());
  tensor<float> x(1, 3), t(1, 1);
  x[0] = 1;
  x[1] = 2;
  x[2] = 3;
  t[0] = 0;
  CHECK_THROWS_AS(m.train_step<MSE>(x, t, opt), argument_error);
  CHECK(tensor_to_host(m.parameters()) == params);
  CHECK(tensor_to_host(m.buffers()) == buffers);
  CHECK(tensor_to_host(m.gradients()) == std::vector<float>(m.parameter_count, 0.0f));
  // Inference of one sample reads the running statistics and works.
  CHECK(m.forward(x).rows() == 1);
  // Wrong spatial size, empty batch, NaN: refused before anything runs.
  using N = Net<Block>;
  model<N> n(seed{1});
  SGD sgd(n, {.lr = 0.1});
  auto const before = tensor_to_host(n.parameters());
  auto const bbefore = tensor_to_host(n.buffers());
  tensor<float> wrong(2, index_t(H * H - 1)), t3(2, 3);
  CHECK_THROWS_AS(n.train_step<MSE>(wrong, t3, sgd), shape_error);
  tensor<float> ok(2, index_t(H * H));
  for (std::size_t i = 0; i < ok.size(); ++i) ok[i] = 0.5f;
  CHECK_THROWS_AS(n.train_step<MSE>(ok.row_range(0, 0), t3.row_range(0, 0), sgd), argument_error);
  ok[5] = std::nanf("");
  CHECK_THROWS_AS(n.train_step<MSE>(ok, t3, sgd), argument_error);
  CHECK(tensor_to_host(n.parameters()) == before);
  CHECK(tensor_to_host(n.buffers()) == bbefore);
}
