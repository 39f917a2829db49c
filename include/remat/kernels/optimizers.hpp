// Fused optimizer updates: one pass over parameters, gradients and state, in the order of
// operations PyTorch's single-tensor implementations use, so results agree to rounding. The
// gradient factor unscales (loss scale) and clips in the same multiply; a mixed-precision model's
// compute copy of the weights (pc, 16-bit) is written in the same pass. grad_check is the one
// reduction before it: the sum of squares in double, which is finite exactly when every gradient
// is, and gives the norm for clipping.
#pragma once

#include "../numeric/math.hpp"
#include "../numeric/compute.hpp"
#include "rows.hpp"

#include "reduce.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {

// What one AdamW update of step t uses, worked out once on the host (remat::AdamW fills it).
struct adamw_scalars {
  double grad_scale;   // gradient clipping times 1 / loss scale
  double decay;        // 1 - lr * weight_decay
  double beta1;        // the first moment's decay
  double beta2;        // the second moment's decay
  double step_size;    // lr / (1 - beta1^t)
  double bc2_sqrt;     // sqrt(1 - beta2^t)
  double eps;          // added to the denominator
};

// g[i]^2 in double, for the gradient norm (a functor: it travels into GPU kernels).
struct square_as_double {
  // The squares of the values at g.
  template <class T>
  struct fn {
    T const* g;  // the gradients
    // g[i]^2, computed in double from g[i]'s compute type.
    REMAT_HOST_DEVICE double operator()(std::size_t i) const {
      double const x = double(to_compute<compute_type_t<T>>(g[i]));
      return x * x;
    }
  };
};

// The sum of the squares of n gradients at g, in double: the norm for clipping, and inf or NaN
// when any gradient is (a loss scale's overflow check).
template <class T, device_tag D>
double grad_check(D, std::size_t n, T const* g) {
  profile::timed<D> const timing(profile::work::reduction);
  return transform_reduce(D{}, n, square_as_double::fn<T>{g}, 0.0, plus_op{});
}

namespace detail {
// run_update's loop bodies, functors rather than lambdas: in a source nvcc compiles, a
// __host__ __device__ lambda reaches host code through a wrapper that calls it indirectly, which
// stops the host loop from inlining and vectorising it (nvcc-built, OffloadedAdamW's host update
// took 3.4 ns a parameter on a 2-core Zen 4 against 0.54 with functors; GCC alone: 0.42).
template <class C, class Step>
struct update_and_copy {
  C* pc;      // the compute copy
  Step step;  // the update of one element, returning the new weight
  REMAT_HOST_DEVICE void operator()(std::size_t i) const { pc[i] = from_compute<C>(step(i)); }
};
template <class Step>
struct update_only {
  Step step;  // the update of one element
  REMAT_HOST_DEVICE void operator()(std::size_t i) const { (void)step(i); }
};

// AdamW's update of element i (in the order of operations of PyTorch's single-tensor AdamW).
template <class T>
struct adamw_step {
  using V = compute_type_t<T>;
  T* p;
  T const* g;
  T* m;
  T* v;
  V gs, decay, b1, b2, c2, neg_step, bc2, eps;
  REMAT_HOST_DEVICE V operator()(std::size_t i) const {
    V const gi = to_compute<V>(g[i]) * gs;
    V pi = to_compute<V>(p[i]) * decay;
    V mi = to_compute<V>(m[i]);
    mi = mi + b1 * (gi - mi);
    V const vi = to_compute<V>(v[i]) * b2 + c2 * gi * gi;
    V const denom = math::sqrt(vi) / bc2 + eps;
    pi = pi + neg_step * mi / denom;
    p[i] = from_compute<T>(pi);
    m[i] = from_compute<T>(mi);
    v[i] = from_compute<T>(vi);
    return pi;
  }
};
}  // namespace detail

// Runs step(i) (which writes the fp32 state and returns the new weight) for every element, and
// casts the new weight into the compute copy pc when there is one.
template <class D, class C, class Step>
void run_update(D, std::size_t n, C* pc, Step const& step) {
  profile::timed<D> const timing(profile::work::pointwise);
  if (pc)
    for_each_index(D{}, n, n, detail::update_and_copy<C, Step>{pc, step});
  else
    for_each_index(D{}, n, n, detail::update_only<Step>{step});
}

// One AdamW update of n parameters p with gradients g and moments m, v (all in T), in one pass;
// the new weights are also written, rounded, to the compute copy pc when there is one.
template <class T, class C = T, device_tag D>
void adamw_update(D, std::size_t n, T* p, T const* g, T* m, T* v, adamw_scalars k, C* pc = nullptr) {
  using V = compute_type_t<T>;
  detail::adamw_step<T> const step{p,         g,           m,       v,       V(k.grad_scale),
                                   V(k.decay), V(1.0 - k.beta1), V(k.beta2), V(1.0 - k.beta2),
                                   V(-k.step_size), V(k.bc2_sqrt), V(k.eps)};
  run_update(D{}, n, pc, step);
}

// What one SGD update uses (remat::SGD fills it).
struct sgd_scalars {
  double grad_scale;    // gradient clipping times 1 / loss scale
  double lr;            // the learning rate
  double momentum;      // 0: plain SGD, no buffer
  double weight_decay;  // added to the gradient as weight_decay * p (PyTorch's SGD)
  bool nesterov;        // Nesterov momentum
  bool first_step;      // the momentum buffer is set to the gradient, not decayed into
};

namespace detail {
// The flags are template arguments, so each variant's loop has no branch (and vectorises).
template <bool Momentum, bool Nesterov, bool First, class T, class C, class D>
void sgd_update_as(D, std::size_t n, T* p, T const* g, T* buf, sgd_scalars k, C* pc) {
  using V = compute_type_t<T>;
  V const gs = V(k.grad_scale), neg_lr = V(-k.lr), mom = V(k.momentum), wd = V(k.weight_decay);
  auto step = [=] REMAT_LAMBDA(std::size_t i) {
    (void)buf;  // (captured here: nvcc's extended lambdas may not first-capture inside if constexpr)
    (void)mom;
    V const pi = to_compute<V>(p[i]);
    V d = to_compute<V>(g[i]) * gs + wd * pi;
    if constexpr (Momentum) {
      V b = d;
      if constexpr (!First) b = to_compute<V>(buf[i]) * mom + d;
      buf[i] = from_compute<T>(b);
      if constexpr (Nesterov)
        d = d + mom * b;
      else
        d = b;
    }
    V const out = pi + neg_lr * d;
    p[i] = from_compute<T>(out);
    return out;
  };
  run_update(D{}, n, pc, step);
}
}  // namespace detail

// One SGD update of n parameters p with gradients g and momentum buffer buf; the new weights are
// also written, rounded, to the compute copy pc when there is one.
template <class T, class C = T, device_tag D>
void sgd_update(D, std::size_t n, T* p, T const* g, T* buf, sgd_scalars k, C* pc = nullptr) {
  if (k.momentum == 0.0)
    detail::sgd_update_as<false, false, false>(D{}, n, p, g, buf, k, pc);
  else if (k.nesterov)
    k.first_step ? detail::sgd_update_as<true, true, true>(D{}, n, p, g, buf, k, pc)
                 : detail::sgd_update_as<true, true, false>(D{}, n, p, g, buf, k, pc);
  else
    k.first_step ? detail::sgd_update_as<true, false, true>(D{}, n, p, g, buf, k, pc)
                 : detail::sgd_update_as<true, false, false>(D{}, n, p, g, buf, k, pc);
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
