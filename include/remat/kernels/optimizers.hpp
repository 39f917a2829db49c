// Fused optimizer updates: one pass over parameters, gradients and state, in the order of
// operations PyTorch's single-tensor implementations use, so results agree to rounding.
#pragma once

#include "../expr/math.hpp"
#include "../numeric/compute.hpp"
#include "rows.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {

struct adamw_scalars {
  double grad_scale;   // gradient clipping (and, later, loss-scale) factor
  double decay;        // 1 - lr * weight_decay
  double beta1, beta2;
  double step_size;    // lr / (1 - beta1^t)
  double bc2_sqrt;     // sqrt(1 - beta2^t)
  double eps;
};

template <class T>
void adamw_update(host, std::size_t n, T* p, T const* g, T* m, T* v, adamw_scalars k) {
  using V = compute_type_t<T>;
  V const gs = V(k.grad_scale), decay = V(k.decay), b1 = V(1.0 - k.beta1), b2 = V(k.beta2), c2 = V(1.0 - k.beta2),
          neg_step = V(-k.step_size), bc2 = V(k.bc2_sqrt), eps = V(k.eps);
  for_each_index(host{}, n, n, [=](std::size_t i) {
    V const gi = to_compute<V>(g[i]) * gs;
    V pi = to_compute<V>(p[i]) * decay;
    V mi = to_compute<V>(m[i]);
    mi = mi + b1 * (gi - mi);
    V const vi = to_compute<V>(v[i]) * b2 + c2 * gi * gi;
    V const denom = expr::math::sqrt(vi) / bc2 + eps;
    pi = pi + neg_step * mi / denom;
    p[i] = from_compute<T>(pi);
    m[i] = from_compute<T>(mi);
    v[i] = from_compute<T>(vi);
  });
}

struct sgd_scalars {
  double grad_scale, lr, momentum, weight_decay;
  bool nesterov, first_step;
};

template <class T>
void sgd_update(host, std::size_t n, T* p, T const* g, T* buf, sgd_scalars k) {
  using V = compute_type_t<T>;
  V const gs = V(k.grad_scale), neg_lr = V(-k.lr), mom = V(k.momentum), wd = V(k.weight_decay);
  bool const use_momentum = k.momentum != 0.0, nesterov = k.nesterov, first = k.first_step;
  for_each_index(host{}, n, n, [=](std::size_t i) {
    V const pi = to_compute<V>(p[i]);
    V d = to_compute<V>(g[i]) * gs + wd * pi;
    if (use_momentum) {
      V const b = first ? d : to_compute<V>(buf[i]) * mom + d;
      buf[i] = from_compute<T>(b);
      d = nesterov ? d + mom * b : b;
    }
    p[i] = from_compute<T>(pi + neg_lr * d);
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
