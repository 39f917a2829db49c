// LayerNorm<W> and RMSNorm<W> over the feature dimension, with learned scale (and shift), eps as
// in PyTorch (1e-5 for LayerNorm; RMSNorm uses the same). Statistics accumulate in fp32 or better.
#pragma once

#include "../kernels/norms.hpp"
#include "common.hpp"

namespace REMAT_NAMESPACE {

template <std::size_t W>
struct LayerNorm {
  static_assert(W > 0, "remat::LayerNorm<W>: the width must be positive");
  static constexpr std::size_t in_width = W;
  static constexpr std::size_t out_width = W;
  static constexpr std::size_t param_count = 2 * W;
  static constexpr double eps = 1e-5;
  // Keeps its input and two numbers per sample (mean, 1/std).
  static constexpr std::size_t saved_per_sample = W + 2;

  static std::vector<param_desc> params() { return {{"weight", 0, {W}}, {"bias", W, {W}}}; }
  template <class T>
  static void init(T* p, std::size_t, std::uint64_t) {
    init::fill(p, W, 1.0);
    init::fill(p + W, W, 0.0);
  }

  template <class T, class D>
  static act<T, D> forward(pass_state<T, D>& s, T const* p, act<T, D> x) {
    std::size_t const rows = x->rows();
    act<T, D> y = s.make(rows, W);
    if (s.training) {
      act<T, D> mean = s.make(rows, 1), rstd = s.make(rows, 1);
      kernels::layer_norm_forward(D{}, x->data(), p, p + W, rows, W, eps, y->data(), mean->data(), rstd->data());
      s.save(std::move(x));
      s.save(std::move(mean));
      s.save(std::move(rstd));
    } else {
      kernels::layer_norm_forward<T>(D{}, x->data(), p, p + W, rows, W, eps, y->data(), nullptr, nullptr);
    }
    return y;
  }

  template <class T, class D>
  static act<T, D> backward(pass_state<T, D>& s, T const* p, T* g, act<T, D> dy) {
    act<T, D> rstd = s.restore(), mean = s.restore(), x = s.restore();
    act<T, D> dx = s.reuse_or_make(dy, W);
    kernels::layer_norm_backward(D{}, x->data(), p, mean->data(), rstd->data(), dy->data(), dy->rows(), W,
                                 dx->data(), g, g + W);
    return dx;
  }
};

template <std::size_t W>
struct RMSNorm {
  static_assert(W > 0, "remat::RMSNorm<W>: the width must be positive");
  static constexpr std::size_t in_width = W;
  static constexpr std::size_t out_width = W;
  static constexpr std::size_t param_count = W;
  static constexpr double eps = 1e-5;
  static constexpr std::size_t saved_per_sample = W + 1;

  static std::vector<param_desc> params() { return {{"weight", 0, {W}}}; }
  template <class T>
  static void init(T* p, std::size_t, std::uint64_t) {
    init::fill(p, W, 1.0);
  }

  template <class T, class D>
  static act<T, D> forward(pass_state<T, D>& s, T const* p, act<T, D> x) {
    std::size_t const rows = x->rows();
    act<T, D> y = s.make(rows, W);
    if (s.training) {
      act<T, D> rstd = s.make(rows, 1);
      kernels::rms_norm_forward(D{}, x->data(), p, rows, W, eps, y->data(), rstd->data());
      s.save(std::move(x));
      s.save(std::move(rstd));
    } else {
      kernels::rms_norm_forward<T>(D{}, x->data(), p, rows, W, eps, y->data(), nullptr);
    }
    return y;
  }

  template <class T, class D>
  static act<T, D> backward(pass_state<T, D>& s, T const* p, T* g, act<T, D> dy) {
    act<T, D> rstd = s.restore(), x = s.restore();
    act<T, D> dx = s.reuse_or_make(dy, W);
    kernels::rms_norm_backward(D{}, x->data(), p, rstd->data(), dy->data(), dy->rows(), W, dx->data(), g);
    return dx;
  }
};

}  // namespace REMAT_NAMESPACE
