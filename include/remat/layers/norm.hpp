// LayerNorm<W> and RMSNorm<W> over the feature dimension, with learned scale (and shift), eps as
// in PyTorch (1e-5 for LayerNorm; RMSNorm uses the same). Statistics accumulate in fp32 or better.
#pragma once

#include "../kernels/norms.hpp"
#include "layer.hpp"
#include "norm_affine.hpp"

namespace REMAT_NAMESPACE {

namespace detail {
// What LayerNorm and RMSNorm share: W features in and out, the weight (and bias) of
// norm_affine, and backward, plain and with a Residual's shortcut gradient r added in the dx
// pass (when the norm is the first layer of its branch), both by Norm::backward_adding.
template <std::size_t W, bool Bias, class Norm>
struct row_norm : norm_affine<W, Bias> {
  static constexpr std::size_t in_width = W;   // features per row in
  static constexpr std::size_t out_width = W;  // features per row out (the same)
  static constexpr bool adds_residual_gradient = true;  // backward_onto: a Residual's dx add in its pass

  // The input's gradient from dy; adds the weight's (and the bias's) gradients into g.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    return Norm::backward_adding(s, p, g, std::move(dy), nullptr);
  }
  // backward with r added in the dx pass.
  template <class S>
  static constexpr typename S::act_type backward_onto(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                      typename S::act_type dy, typename S::act_type const& r) {
    return Norm::backward_adding(s, p, g, std::move(dy), &r);
  }
};
}  // namespace detail

// LayerNorm<W>: y = (x - mean) / sqrt(var + eps) * weight + bias over each row of W features
// (torch.nn.LayerNorm(W)); keeps x and each row's mean and 1/std for backward.
template <std::size_t W>
struct LayerNorm : detail::row_norm<W, true, LayerNorm<W>> {  // (weight and bias, W each; eps 1e-5)
  static_assert(W > 0, "remat::LayerNorm<W>: the width must be positive");
  using detail::norm_affine<W, true>::eps;

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    using A = typename S::act_type;
    std::size_t const rows = x->rows();
    A y = s.make(rows, W);
    if (s.keeps()) {
      using T = typename S::value_type;
      A mean = s.make(rows, stat_columns<T>(1)), rstd = s.make(rows, stat_columns<T>(1));
      if constexpr (S::computes)
        kernels::layer_norm_forward(typename S::device{}, x->data(), p, p + W, rows, W, eps, y->data(),
                                    stat_data(mean->data()), stat_data(rstd->data()));
      s.save(std::move(x));
      s.save(std::move(mean));
      s.save(std::move(rstd));
    } else {
      if constexpr (S::computes)
        kernels::layer_norm_forward<typename S::value_type>(typename S::device{}, x->data(), p, p + W, rows, W, eps,
                                                            y->data(), nullptr, nullptr);
      s.save(std::move(x));  // keeps nothing; tells a selective policy that x is needed
    }
    return y;
  }

 private:
  friend detail::row_norm<W, true, LayerNorm>;
  template <class S>
  static constexpr typename S::act_type backward_adding(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                        typename S::act_type dy, typename S::act_type const* r) {
    using A = typename S::act_type;
    A rstd = s.restore(), mean = s.restore(), x = s.restore();
    // (the pass's input when nobody wants its gradient: parameter gradients only, dx hollow)
    A dx = s.gradient_for(x, dy, W);
    if constexpr (S::computes)
      kernels::layer_norm_backward(typename S::device{}, x->data(), p, stat_data(mean->data()),
                                   stat_data(rstd->data()), dy->data(), dy->rows(), W, dx->data(), g, g + W,
                                   r && !S::is_hollow(dx) ? (*r)->data() : nullptr);
    return dx;
  }
};

// RMSNorm<W>: y = x / sqrt(mean(x^2) + eps) * weight over each row of W features
// (torch.nn.RMSNorm(W, eps=1e-5)); keeps x and each row's 1/rms for backward.
template <std::size_t W>
struct RMSNorm : detail::row_norm<W, false, RMSNorm<W>> {  // (a weight of W; eps 1e-5, added to the mean square)
  static_assert(W > 0, "remat::RMSNorm<W>: the width must be positive");
  using detail::norm_affine<W, false>::eps;

  // Normalises each row (see above); keeps what backward reads when the pass keeps.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    using A = typename S::act_type;
    std::size_t const rows = x->rows();
    A y = s.make(rows, W);
    if (s.keeps()) {
      A rstd = s.make(rows, stat_columns<typename S::value_type>(1));
      if constexpr (S::computes)
        kernels::rms_norm_forward(typename S::device{}, x->data(), p, rows, W, eps, y->data(),
                                  stat_data(rstd->data()));
      s.save(std::move(x));
      s.save(std::move(rstd));
    } else {
      if constexpr (S::computes)
        kernels::rms_norm_forward<typename S::value_type>(typename S::device{}, x->data(), p, rows, W, eps, y->data(),
                                                          nullptr);
      s.save(std::move(x));
    }
    return y;
  }

 private:
  friend detail::row_norm<W, false, RMSNorm>;
  template <class S>
  static constexpr typename S::act_type backward_adding(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                        typename S::act_type dy, typename S::act_type const* r) {
    using A = typename S::act_type;
    A rstd = s.restore(), x = s.restore();
    // (the pass's input when nobody wants its gradient: parameter gradients only, dx hollow)
    A dx = s.gradient_for(x, dy, W);
    if constexpr (S::computes)
      kernels::rms_norm_backward(typename S::device{}, x->data(), p, stat_data(rstd->data()), dy->data(),
                                 dy->rows(), W, dx->data(), g, r && !S::is_hollow(dx) ? (*r)->data() : nullptr);
    return dx;
  }
};

}  // namespace REMAT_NAMESPACE
