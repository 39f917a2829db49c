// SGD (momentum, Nesterov, weight decay) and AdamW (decoupled weight decay, bias correction),
// each with optional gradient clipping by global norm; an update is one fused pass over the
// parameters. Both follow PyTorch's definitions (torch.optim.SGD, torch.optim.AdamW).
#pragma once

#include "../expr/expr.hpp"
#include "../kernels/optimizers.hpp"
#include "../memory/allocator.hpp"
#include "../tensor/tensor.hpp"

#include <cmath>
#include <limits>

namespace REMAT_NAMESPACE {

namespace detail {

// clip_grad_norm_: scale gradients by max_norm / (norm + 1e-6) when that is below 1. Without
// clipping the norm is not computed (a pass over every gradient): it reads as NaN.
template <class T, class D>
double clip_factor(tensor_view<T const, D> g, double max_norm, double& norm_out) {
  if (max_norm <= 0) {
    norm_out = std::numeric_limits<double>::quiet_NaN();
    return 1.0;
  }
  norm_out = std::sqrt(double(sum_squares(g)));
  double const c = max_norm / (norm_out + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace detail

struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  double clip_norm = 0;  // 0: no clipping
};

template <class T, class D = host>
class AdamW {
 public:
  template <class Model>
  explicit AdamW(Model& m, adamw_options o = {}) : AdamW(m.parameters(), m.gradients(), o, m.allocator()) {}

  // Over any parameter and gradient buffers of the same size.
  AdamW(tensor_view<T, D> params, tensor_view<T, D> grads, adamw_options o = {},
        memory::caching_allocator<D>& alloc = memory::default_allocator<D>())
      : p_(params),
        g_(grads),
        m_(index_t(p_.size()), 1, memory::tag::optimizer_state, alloc),
        v_(index_t(p_.size()), 1, memory::tag::optimizer_state, alloc),
        o_(o) {
    if (grads.size() != params.size())
      detail::raise<shape_error>("AdamW: expected as many gradients as parameters (", params.size(), "), found ",
                                 grads.size());
    evaluate(m_, expr::to_expr(0.0));
    evaluate(v_, expr::to_expr(0.0));
  }

  void step() {
    ++t_;
    double const scale = detail::clip_factor(tensor_view<T const, D>(g_), o_.clip_norm, last_norm_);
    kernels::adamw_scalars k{scale,
                             1.0 - o_.lr * o_.weight_decay,
                             o_.beta1,
                             o_.beta2,
                             o_.lr / (1.0 - std::pow(o_.beta1, double(t_))),
                             std::sqrt(1.0 - std::pow(o_.beta2, double(t_))),
                             o_.eps};
    kernels::adamw_update(D{}, p_.size(), p_.data(), g_.data(), m_.data(), v_.data(), k);
  }

  void set_lr(double lr) { o_.lr = lr; }
  double lr() const { return o_.lr; }
  std::uint64_t steps() const { return t_; }
  void set_steps(std::uint64_t t) { t_ = t; }
  // The global gradient norm seen by the last step (before clipping); NaN without clipping.
  double last_grad_norm() const { return last_norm_; }
  adamw_options const& options() const { return o_; }
  tensor<T, D>& exp_avg() { return m_; }
  tensor<T, D>& exp_avg_sq() { return v_; }

 private:
  tensor_view<T, D> p_, g_;
  tensor<T, D> m_, v_;
  adamw_options o_;
  std::uint64_t t_ = 0;
  double last_norm_ = 0;
};

template <class Model>
AdamW(Model&, adamw_options = {}) -> AdamW<typename Model::value_type, typename Model::device>;

struct sgd_options {
  double lr = 1e-2;
  double momentum = 0;
  bool nesterov = false;
  double weight_decay = 0;
  double clip_norm = 0;
};

template <class T, class D = host>
class SGD {
 public:
  template <class Model>
  explicit SGD(Model& m, sgd_options o = {}) : SGD(m.parameters(), m.gradients(), o, m.allocator()) {}

  SGD(tensor_view<T, D> params, tensor_view<T, D> grads, sgd_options o = {},
      memory::caching_allocator<D>& alloc = memory::default_allocator<D>())
      : p_(params), g_(grads), o_(o) {
    if (grads.size() != params.size())
      detail::raise<shape_error>("SGD: expected as many gradients as parameters (", params.size(), "), found ",
                                 grads.size());
    if (o_.nesterov && o_.momentum <= 0)
      detail::raise<argument_error>("SGD: Nesterov momentum needs a momentum > 0, found ", o_.momentum);
    if (o_.momentum != 0) buf_ = tensor<T, D>(index_t(p_.size()), 1, memory::tag::optimizer_state, alloc);
  }

  void step() {
    double const scale = detail::clip_factor(tensor_view<T const, D>(g_), o_.clip_norm, last_norm_);
    kernels::sgd_scalars k{scale, o_.lr, o_.momentum, o_.weight_decay, o_.nesterov, t_ == 0};
    kernels::sgd_update(D{}, p_.size(), p_.data(), g_.data(), buf_.empty() ? nullptr : buf_.data(), k);
    ++t_;
  }

  void set_lr(double lr) { o_.lr = lr; }
  double lr() const { return o_.lr; }
  std::uint64_t steps() const { return t_; }
  double last_grad_norm() const { return last_norm_; }

 private:
  tensor_view<T, D> p_, g_;
  tensor<T, D> buf_;
  sgd_options o_;
  std::uint64_t t_ = 0;
  double last_norm_ = 0;
};

template <class Model>
SGD(Model&, sgd_options = {}) -> SGD<typename Model::value_type, typename Model::device>;

// Linear warm-up from 0 to base_lr over `warmup` steps, then cosine decay to min_lr at `total`.
struct warmup_cosine {
  double base_lr;
  std::size_t warmup;
  std::size_t total;
  double min_lr = 0;

  double operator()(std::size_t step) const {
    constexpr double pi = 3.14159265358979323846;
    if (step < warmup) return base_lr * double(step + 1) / double(warmup);
    if (step >= total) return min_lr;
    double const progress = double(step - warmup) / double(total > warmup ? total - warmup : 1);
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(pi * progress));
  }
};

}  // namespace REMAT_NAMESPACE
