// AdamW (decoupled weight decay, bias correction; torch.optim.AdamW's update), with optional
// gradient clipping by global norm: the update is one fused pass over the parameters, which also
// writes a mixed-precision model's compute copy.
#pragma once

#include "../plan/optimizer_state.hpp"
#include "optimizer_base.hpp"

#include <array>
#include <cmath>

namespace REMAT_NAMESPACE {

// AdamW's settings, PyTorch's names and defaults (torch.optim.AdamW).
struct adamw_options {
  double lr = 1e-3;            // the learning rate (set_lr changes it between steps)
  double beta1 = 0.9;          // the first moment's decay
  double beta2 = 0.999;        // the second moment's decay
  double eps = 1e-8;           // added to the second moment's root
  double weight_decay = 1e-2;  // decoupled: p -= lr * weight_decay * p, beside the Adam update
  double clip_norm = 0;        // the gradients' global norm is clipped to this; 0: no clipping

  // Its name, in messages and files.
  static constexpr char const* optimizer = "AdamW";
  // Throws argument_error, naming the setting, unless lr, eps, weight_decay and clip_norm are
  // finite and >= 0 and beta1 and beta2 in [0, 1) (torch.optim.AdamW's ranges).
  void check(char const* who = optimizer) const {
    detail::check_setting(who, "lr", lr);
    detail::check_setting(who, "beta1", beta1, true);
    detail::check_setting(who, "beta2", beta2, true);
    detail::check_setting(who, "eps", eps);
    detail::check_setting(who, "weight_decay", weight_decay);
    detail::check_setting(who, "clip_norm", clip_norm);
  }
};

namespace detail {
// What AdamW's update of step t (from 1) uses, with the gradients' multiplier `factor`.
inline kernels::adamw_scalars adamw_scalars_for(adamw_options const& o, double factor, double t) {
  return {factor,
          1.0 - o.lr * o.weight_decay,
          o.beta1,
          o.beta2,
          o.lr / (1.0 - std::pow(o.beta1, t)),
          std::sqrt(1.0 - std::pow(o.beta2, t)),
          o.eps};
}
}  // namespace detail


// AdamW (Loshchilov and Hutter; PyTorch's update, bias corrections included) over fp32 (or fp64)
// master weights T on device D; a mixed-precision model's compute copy C is written in the same
// pass. step() unscales, checks (a loss scale's overflow skips the step) and clips the gradients
// first. Build it from the model: AdamW opt(model, {.lr = 3e-4}).
template <class T, class D = host, class C = T>
class AdamW : public detail::model_optimizer<T, D, C, adamw_options> {
  using base = detail::model_optimizer<T, D, C, adamw_options>;

 public:
  using base::base;  // from a model (or a shard of it), or from two buffers of the same size

  // Returns false when the step was skipped (a gradient overflowed under a loss scale).
  bool step() {
    return this->run_step([&](double factor) {
      kernels::adamw_scalars const k = detail::adamw_scalars_for(this->o_, factor, double(this->t_ + 1));
      kernels::adamw_update(D{}, this->p_.size(), this->p_.data(), this->g_.data(), m_.data(), v_.data(), k, this->pc_);
    });
  }

  // The first moments ("exp_avg" in PyTorch's state dict), one per parameter it updates.
  tensor<T, D>& exp_avg() { return m_; }
  // The second moments ("exp_avg_sq" in PyTorch's state dict), one per parameter it updates.
  tensor<T, D>& exp_avg_sq() { return v_; }
  // The first moments, read-only.
  tensor<T, D> const& exp_avg() const { return m_; }
  // The second moments, read-only.
  tensor<T, D> const& exp_avg_sq() const { return v_; }
  // Its state for files: the two moments.
  std::array<detail::named_state<tensor<T, D>>, 2> state_tensors() { return {{{"exp_avg", &m_}, {"exp_avg_sq", &v_}}}; }

 private:
  tensor<T, D> m_ = this->state_tensor(true), v_ = this->state_tensor(true);
};

// AdamW keeps two: the first and second moments.
template <>
struct optimizer_state_buffers<AdamW> {
  static constexpr std::size_t count(step_options const&) { return 2; }  // exp_avg and exp_avg_sq
};

// AdamW opt(model): the model's master type, device and compute type.
template <class Model>
AdamW(Model&, adamw_options = {})
    -> AdamW<typename Model::value_type, typename Model::device, typename Model::compute_type>;

}  // namespace REMAT_NAMESPACE
