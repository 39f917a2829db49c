// Linear<In, Out, Bias>: y = x W^T + b with W stored [Out, In] as in PyTorch. The product goes to
// the BLAS; the bias (and a following point-wise layer, when the graph has one, or the add of a
// Residual whose branch it ends) is one fused pass.
#pragma once

#include "../kernels/epilogue.hpp"
#include "../kernels/evaluate.hpp"
#include "../kernels/gemm.hpp"
#include "../kernels/rows.hpp"
#include "layer.hpp"

#include <cmath>

namespace REMAT_NAMESPACE {

template <std::size_t In, std::size_t Out, bool Bias = true>
struct Linear {
  static_assert(In > 0 && Out > 0, "remat::Linear<In, Out>: widths must be positive");
  static constexpr std::size_t in_width = In;    // features per row in
  static constexpr std::size_t out_width = Out;  // features per row out
  static constexpr std::size_t param_count = In * Out + (Bias ? Out : 0);  // weight (Out x In), bias (Out)
  static constexpr bool handles_hollow = true;  // it needs its input, and says so itself
  static constexpr bool fuses_epilogue = true;  // forward<F>: a following point-wise F in the same pass
  static constexpr bool adds_residual = true;   // forward_onto: a Residual's add in the bias pass
  static constexpr bool overwrites_gradients = true;  // dW and db written over zeroed gradients

  // "weight" (Out x In) and "bias" (Out), PyTorch's names, shapes and layout.
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

  // The product goes through s.product, so a selective policy keeps it (the pre-activation when
  // fused) and its recomputation takes it back instead of multiplying again.
  template <class F = void, class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    using A = typename S::act_type;
    std::size_t const rows = x->rows();
    s.save(x);  // (first: it marks the products before this one needed, not this one)
    // A plain product's output includes the bias; a fused one's is the pre-activation without it
    // (the backward adds it back in the same pass).
    A z = s.product(rows, Out, In, [&](auto& out) {
      if constexpr (S::computes) {
        kernels::gemm(typename S::device{}, kernels::lhs(x->data(), index_t(rows), In),
                      kernels::rhs(p, Out, In).transposed(), kernels::result(out.data(), index_t(rows), Out));
        if constexpr (Bias && std::is_void_v<F>) evaluate(out, out + broadcast_rows(bias(s, p), rows));
      }
    });
    if constexpr (std::is_void_v<F>) {
      return z;
    } else {
      // The following point-wise layer, fused: y = F(x W^T + b).
      s.save(z);
      if (S::is_hollow(z)) return z;
      A y = z;
      if (s.training()) y = s.make(rows, Out);  // inference keeps nothing: apply F in place
      if constexpr (S::computes) {
        if constexpr (Bias)
          evaluate(*y, F::apply(to_expr(*z) + broadcast_rows(bias(s, p), rows)));
        else
          evaluate(*y, F::apply(to_expr(*z)));
      }
      return y;
    }
  }

  // y = (x W^T + b) + r: the last product of a Residual's branch, its add in the bias pass (one
  // pass where there were two, the same bits). Selective keeps the product without the bias.
  template <class S>
  static constexpr typename S::act_type forward_onto(S& s, typename S::param_ptr p, typename S::act_type x,
                                                     typename S::act_type const& r) {
    using A = typename S::act_type;
    std::size_t const rows = x->rows();
    s.save(x);
    A z = s.product(rows, Out, In, [&](auto& out) {
      if constexpr (S::computes)
        kernels::gemm(typename S::device{}, kernels::lhs(x->data(), index_t(rows), In),
                      kernels::rhs(p, Out, In).transposed(), kernels::result(out.data(), index_t(rows), Out));
    });
    if (S::is_hollow(z)) return z;  // a selective recomputation that needs no values past here
    A y;  // (not `?:`: GCC 12 miscounts that at compile time)
    if (z.use_count() > 1)
      y = s.make(rows, Out);  // the product is kept (Selective): the sum apart
    else
      y = z;
    if constexpr (S::computes)
      kernels::bias_residual(typename S::device{}, rows, Out, z->data(), Bias ? p + In * Out : nullptr, r->data(),
                             y->data());
    return y;
  }

  template <class F = void, class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    using A = typename S::act_type;
    std::size_t const rows = dy->rows();
    if constexpr (!std::is_void_v<F>) {
      A z = s.restore();
      A dz = s.reuse_or_make(dy, Out);
      if constexpr (S::computes) {
        auto Z = leaf<0>(*z);
        if constexpr (Bias)
          evaluate(*dz, grad(F::apply(Z + broadcast_rows(bias(s, p), rows)), Z, *dy));
        else
          evaluate(*dz, grad(F::apply(Z), Z, *dy));
      }
      dy = std::move(dz);
    }
    A x = s.restore();
    // The pass's input when nobody wants its gradient: no dx (one product of three saved).
    bool const wanted = s.needs_gradient(x);
    A dx;  // (not `wanted ? make : hollow`: GCC 12 miscounts that at compile time)
    if (wanted)
      dx = s.make(rows, In);
    else
      dx = s.hollow(rows, In);
    if constexpr (S::computes) {
      // dW += dy^T x, db += column sums of dy (written over zeroed gradients), dx = dy W.
      using D = typename S::device;
      index_t const n = index_t(rows);
      bool const add = !s.gradients_zero();
      kernels::gemm(D{}, kernels::lhs(dy->data(), n, Out).transposed(), kernels::rhs(x->data(), n, In),
                    kernels::result(g, Out, In), {.beta = add ? 1.0 : 0.0});
      if constexpr (Bias) kernels::column_sums(D{}, dy->data(), rows, Out, g + In * Out, add);
      if (wanted)
        kernels::gemm(D{}, kernels::lhs(dy->data(), n, Out), kernels::rhs(p, Out, In),
                      kernels::result(dx->data(), n, In));
    }
    return dx;
  }

 private:
  template <class S>
  static tensor_view<typename S::value_type const, typename S::device> bias(S&, typename S::param_ptr p) {
    return {p + In * Out, 1, Out};
  }
};

}  // namespace REMAT_NAMESPACE
