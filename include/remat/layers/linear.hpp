// Linear<In, Out, Bias>: y = x W^T + b with W stored [Out, In] as in PyTorch. The product goes to
// the BLAS; the bias (and a following point-wise layer, when the graph has one) is one fused pass.
#pragma once

#include "../expr/expr.hpp"
#include "../kernels/gemm.hpp"
#include "../kernels/rows.hpp"
#include "common.hpp"

#include <cmath>

namespace REMAT_NAMESPACE {

template <std::size_t In, std::size_t Out, bool Bias = true>
struct Linear {
  static_assert(In > 0 && Out > 0, "remat::Linear<In, Out>: widths must be positive");
  static constexpr std::size_t in_width = In;
  static constexpr std::size_t out_width = Out;
  static constexpr std::size_t param_count = In * Out + (Bias ? Out : 0);
  // The forward keeps its input for the weight gradient.
  static constexpr std::size_t saved_per_sample = In;

  static std::vector<param_desc> params() {
    std::vector<param_desc> p{{"weight", 0, {Out, In}}};
    if constexpr (Bias) p.push_back({"bias", In * Out, {Out}});
    return p;
  }

  // PyTorch's nn.Linear: kaiming_uniform(a = sqrt 5) for W, i.e. U(-1/sqrt(In), 1/sqrt(In)), and
  // the same bound for b.
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    double const bound = 1.0 / std::sqrt(double(In));
    init::uniform(p, param_count, global_offset, seed, bound);
  }

  template <class T, class D, class F = void>
  static act<T, D> forward(pass_state<T, D>& s, T const* p, act<T, D> x) {
    act<T, D> y = s.make(x->rows(), Out);
    std::size_t const rows = x->rows();
    kernels::gemm(D{}, kernels::trans::no, kernels::trans::yes, index_t(rows), index_t(Out), index_t(In), T(1),
                  x->data(), index_t(In), p, index_t(In), T(0), y->data(), index_t(Out));
    tensor_view<T const, D> const b(p + In * Out, 1, Out);
    if constexpr (std::is_void_v<F>) {
      if constexpr (Bias) evaluate(*y, *y + broadcast_rows(b, rows));
    } else {
      // The following point-wise layer, fused: y = F(x W^T + b); keep the pre-activation (without
      // the bias, which the backward adds back in the same pass).
      act<T, D> z = y;
      if (s.training) y = s.make(rows, Out);  // inference keeps nothing: apply F in place
      if constexpr (Bias)
        evaluate(*y, F::apply(to_expr(*z) + broadcast_rows(b, rows)));
      else
        evaluate(*y, F::apply(to_expr(*z)));
      s.save(std::move(z));
    }
    s.save(std::move(x));
    return y;
  }

  template <class T, class D, class F = void>
  static act<T, D> backward(pass_state<T, D>& s, T const* p, T* g, act<T, D> dy) {
    act<T, D> x = s.restore();
    std::size_t const rows = dy->rows();
    if constexpr (!std::is_void_v<F>) {
      act<T, D> z = s.restore();
      act<T, D> dz = s.reuse_or_make(dy, Out);
      auto Z = leaf<0>(*z);
      tensor_view<T const, D> const b(p + In * Out, 1, Out);
      if constexpr (Bias)
        evaluate(*dz, grad(F::apply(Z + broadcast_rows(b, rows)), Z, *dy));
      else
        evaluate(*dz, grad(F::apply(Z), Z, *dy));
      dy = std::move(dz);
    }
    // dW += dy^T x, db += column sums of dy, dx = dy W.
    kernels::gemm(D{}, kernels::trans::yes, kernels::trans::no, index_t(Out), index_t(In), index_t(rows), T(1),
                  dy->data(), index_t(Out), x->data(), index_t(In), T(1), g, index_t(In));
    if constexpr (Bias) kernels::column_sums(D{}, dy->data(), rows, Out, g + In * Out, true);
    act<T, D> dx = s.make(rows, In);
    kernels::gemm(D{}, kernels::trans::no, kernels::trans::no, index_t(rows), index_t(In), index_t(Out), T(1),
                  dy->data(), index_t(Out), p, index_t(In), T(0), dx->data(), index_t(In));
    return dx;
  }
};

}  // namespace REMAT_NAMESPACE
