// Built against an installed remat: a fused expression, its derivative, a GEMM and the allocator.
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>

int main() {
  remat::tensor<float, remat::host, 3> x(2), y(2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i) - 2.5f;
  auto X = remat::leaf<0>(x);
  remat::evaluate(y, remat::grad(X * X * X, X));  // 3 x^2
  remat::tensor<float> c(2, 2);
  remat::kernels::gemm(x.view(), remat::kernels::trans::no, x.view(), remat::kernels::trans::yes, c.view());
  bool ok = std::fabs(y[0] - 18.75f) < 1e-5f && std::fabs(c(0, 0) - (6.25f + 2.25f + 0.25f)) < 1e-5f;
  std::printf("consumer: 3x^2 at -2.5 = %g, (x x^T)_00 = %g, %zu bytes of activations in use: %s\n", double(y[0]),
              double(c(0, 0)), remat::memory::default_allocator<remat::host>().stats(remat::memory::tag::activations).in_use,
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
