// Every public header through nvcc, with the CUDA device's kernels instantiated.
#include <remat/remat.hpp>

#include <cstdio>

int main() {
  using namespace remat;  // (remat::cuda must stay qualified: libcu++ owns the namespace ::cuda)
  tensor<float, remat::cuda, 8> x(4), y(4);
  tensor<remat::bfloat16, remat::cuda, 8> xb(4);
  evaluate(x, expr::to_expr(0.5));
  evaluate(xb, gelu(x) * 2.0 + x);
  auto X = leaf<0>(x);
  evaluate(y, grad(silu(X) + gelu_tanh(X) * xb, X, y));
  float const s = sum(y) + max_of(y) + sum_squares(x) + mean(xb);
  // The host device compiles in the same translation unit.
  tensor<float, host> h(2, 2);
  evaluate(h, exp(h) - 1.0);
  std::printf("%g %s\n", double(s), memory::default_allocator<remat::cuda>().summary().c_str());
  return 0;
}
