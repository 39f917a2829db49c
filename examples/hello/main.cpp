// remat's first example: fit y = sin(3x) with a one-hidden-layer network written directly with
// remat's pieces: tensors from the tagged allocator, GEMMs, fused point-wise expressions whose
// backward comes from remat::grad, and the memory summary at the end. (The layer types, models and
// optimizers of the next milestone replace the hand-written steps below.)
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>
#include <random>

using namespace remat;
using kernels::trans;
using memory::tag;

int main() {
  constexpr index_t batch = 256;
  constexpr std::size_t hidden = 64;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1, 1);

  // Parameters and their gradients (1 -> hidden -> 1), PyTorch's default uniform init.
  tensor<float, host, hidden> w1(1, tag::parameters), b1(1, tag::parameters), w2t(1, tag::parameters);
  tensor<float, host, 1> b2(1, tag::parameters);
  tensor<float, host, hidden> gw1(1, tag::gradients), gb1(1, tag::gradients), gw2t(1, tag::gradients);
  tensor<float, host, 1> gb2(1, tag::gradients);
  float const bound2 = 1.0f / std::sqrt(float(hidden));
  for (std::size_t j = 0; j < hidden; ++j) {
    w1[j] = u(rng);
    b1[j] = u(rng);
    w2t[j] = bound2 * u(rng);
  }
  b2[0] = bound2 * u(rng);

  // Activations: input, pre-activation, hidden, output, and a ones vector for column sums.
  tensor<float, host, 1> x(batch), y(batch), out(batch), dout(batch), ones(batch);
  tensor<float, host, hidden> pre(batch), h(batch), dh(batch);
  evaluate(ones, expr::to_expr(1.0));

  float const lr = 0.05f;
  for (int step = 0; step <= 3000; ++step) {
    for (std::size_t i = 0; i < std::size_t(batch); ++i) {
      x[i] = u(rng);
      y[i] = std::sin(3.0f * x[i]);
    }

    // Forward: pre = x w1 + b1 (GEMM, then the bias and GELU fused into one pass), out = h w2 + b2.
    kernels::gemm(x.view(), trans::no, w1.view(), trans::no, pre.view());
    auto P = leaf<0>(pre);
    evaluate(h, gelu(P + broadcast_rows(b1, batch)));
    kernels::gemm(h.view(), trans::no, w2t.view(), trans::yes, out.view());
    evaluate(out, out + broadcast_rows(b2, batch));
    float const loss = sum_squares(out - y) / float(batch);

    // Backward: dL/dout, then through the GEMMs; GELU's backward is remat::grad of its forward.
    evaluate(dout, (out - y) * (2.0 / double(batch)));
    kernels::gemm(dout.view(), trans::yes, h.view(), trans::no, gw2t.view());
    kernels::gemm(ones.view(), trans::yes, dout.view(), trans::no, gb2.view());
    kernels::gemm(dout.view(), trans::no, w2t.view(), trans::no, dh.view());
    evaluate(dh, grad(gelu(P + broadcast_rows(b1, batch)), P, dh));  // in place: element i only
    kernels::gemm(x.view(), trans::yes, dh.view(), trans::no, gw1.view());
    kernels::gemm(ones.view(), trans::yes, dh.view(), trans::no, gb1.view());

    // SGD, each update one fused pass.
    for (auto [p, g] : {std::pair{w1.view(), gw1.view()}, std::pair{b1.view(), gb1.view()},
                        std::pair{w2t.view(), gw2t.view()}})
      evaluate(p, p - g * lr);
    evaluate(b2, b2 - gb2 * lr);

    if (step % 500 == 0) std::printf("step %4d  loss %.5f\n", step, double(loss));
  }
  std::printf("\n%s", memory::default_allocator<host>().summary().c_str());
  return 0;
}
