// Built against remat the way a user's project builds it (find_package from an install,
// add_subdirectory of a checkout, FetchContent, or a Makefile through pkg-config): a fused
// expression and its derivative, a GEMM, and a few training steps of a checkpointed model with
// dropout whose measured activation peak equals the compile-time plan.
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>

using namespace remat;

using Block = Residual<Seq<LayerNorm<16>, Linear<16, 32>, GELU, Dropout<0.1>, Linear<32, 16>>>;
using Net = Seq<Linear<4, 16>, Repeat<3, Checkpointed<Block>>, Linear<16, 2>>;

int main() {
  tensor<float, host, 3> x(2), y(2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i) - 2.5f;
  auto X = leaf<0>(x);
  evaluate(y, grad(X * X * X, X));  // 3 x^2
  tensor<float> c(2, 2);
  kernels::gemm(x.view(), kernels::trans::no, x.view(), kernels::trans::yes, c.view());
  bool ok = std::fabs(y[0] - 18.75f) < 1e-5f && std::fabs(c(0, 0) - (6.25f + 2.25f + 0.25f)) < 1e-5f;

  model<Net> m{seed{1}};
  AdamW opt(m, {.lr = 1e-2});
  tensor<float> in(32, 4), target(32, 2);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t r = 0; r < 32; ++r) {
    target(r, 0) = in(r, 0) * in(r, 1);
    target(r, 1) = in(r, 2) - in(r, 3);
  }
  constexpr auto plan = activation_plan<Net, fp32>(32);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    last = m.train_step<MSE>(in, target, opt);
    if (step == 0) first = last;
    ok = ok && m.last_pass().activation_peak == plan.peak_bytes;
  }
  ok = ok && last < 0.5 * first;
  std::printf("consumer: 3x^2 at -2.5 = %g, (x x^T)_00 = %g; loss %.4f -> %.4f in 30 steps, activation peak %zu bytes "
              "(planned %zu): %s\n",
              double(y[0]), double(c(0, 0)), first, last, m.last_pass().activation_peak, plan.peak_bytes,
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
