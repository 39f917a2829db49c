// SGD with optional (Nesterov) momentum, weight decay and gradient clipping by global norm
// (torch.optim.SGD's update, without dampening): one fused pass over the parameters.
#pragma once

#include "../plan/optimizer_state.hpp"
#include "optimizer_base.hpp"

#include <array>

namespace REMAT_NAMESPACE {

// SGD's settings, PyTorch's names and meaning (torch.optim.SGD, without dampening).
struct sgd_options {
  double lr = 1e-2;          // the learning rate (set_lr changes it between steps)
  double momentum = 0;       // 0: plain SGD, no buffer kept
  bool nesterov = false;     // Nesterov momentum (needs momentum > 0)
  double weight_decay = 0;   // L2: weight_decay * p added to the gradient
  double clip_norm = 0;      // the gradients' global norm is clipped to this; 0: no clipping

  // Its name, in messages and files.
  static constexpr char const* optimizer = "SGD";
  // Throws argument_error, naming the setting, unless lr, momentum, weight_decay and clip_norm
  // are finite and >= 0 (torch.optim.SGD's ranges), and for Nesterov momentum > 0.
  void check() const {
    detail::check_setting(optimizer, "lr", lr);
    detail::check_setting(optimizer, "momentum", momentum);
    detail::check_setting(optimizer, "weight_decay", weight_decay);
    detail::check_setting(optimizer, "clip_norm", clip_norm);
    if (nesterov && momentum <= 0) detail::raise<argument_error>("SGD: Nesterov momentum needs a momentum > 0, found ", momentum);
  }
};

// Stochastic gradient descent with optional (Nesterov) momentum and weight decay, PyTorch's
// update, over master weights T on device D (a mixed-precision model's compute copy C written in
// the same pass); unscaling, the overflow check and clipping as AdamW's.
template <class T, class D = host, class C = T>
class SGD : public detail::model_optimizer<T, D, C, sgd_options> {
  using base = detail::model_optimizer<T, D, C, sgd_options>;

 public:
  using base::base;  // from a model (or a shard of it), or from two buffers of the same size

  // Returns false when the step was skipped (a gradient overflowed under a loss scale).
  bool step() {
    return this->run_step([&](double factor) {
      sgd_options const& o = this->o_;
      kernels::sgd_scalars k{factor, o.lr, o.momentum, o.weight_decay, o.nesterov, this->t_ == 0};
      kernels::sgd_update(D{}, this->p_.size(), this->p_.data(), this->g_.data(), buf_.empty() ? nullptr : buf_.data(),
                          k, this->pc_);
    });
  }
  // (set_steps: the first step fills the momentum buffer, later ones blend into it.)

  // The momentum buffer ("momentum_buffer" in PyTorch's state dict); empty without momentum.
  tensor<T, D>& momentum_buffer() { return buf_; }
  // (Read-only.)
  tensor<T, D> const& momentum_buffer() const { return buf_; }
  // Its state for files: the momentum buffer, when it has momentum.
  std::array<detail::named_state<tensor<T, D>>, 1> state_tensors() {
    return {{{"momentum_buffer", buf_.empty() ? nullptr : &buf_, "momentum"}}};
  }

 private:
  tensor<T, D> buf_ = this->o_.momentum != 0 ? this->state_tensor(false) : tensor<T, D>{};
};

// SGD keeps its momentum buffer, if it has momentum.
template <>
struct optimizer_state_buffers<SGD> {
  static constexpr std::size_t count(step_options const& o) { return o.momentum ? 1 : 0; }  // the momentum buffer
};

// SGD opt(model): the model's master type, device and compute type.
template <class Model>
SGD(Model&, sgd_options = {})
    -> SGD<typename Model::value_type, typename Model::device, typename Model::compute_type>;

}  // namespace REMAT_NAMESPACE
