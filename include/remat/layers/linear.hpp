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
  static constexpr bool handles_hollow = true;  // it needs its input, and says so itself

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

  // Under a selective policy the forward captures the product's output (the pre-activation when
  // fused) and the recomputing forward takes it back instead of multiplying again.
  template <class F = void, class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    using A = typename S::act_type;
    std::size_t const rows = x->rows();
    A y, product;  // `product`: what a selective policy captures
    bool replayed = false;
    if (s.replay) {  // a selective recomputation: the product is already known, or not needed
      A kept = std::move((*s.replay)[s.replay_next++]);
      if (!kept) {  // only a plain product's output can be unneeded (a fused one's is saved)
        s.save(std::move(x));
        return s.hollow(rows, Out);
      }
      y = std::move(kept);
      replayed = true;
    } else {
      y = s.make(rows, Out);
      if constexpr (S::computes)
        kernels::gemm(typename S::device{}, kernels::trans::no, kernels::trans::yes, index_t(rows), index_t(Out),
                      index_t(In), 1, x->data(), index_t(In), p, index_t(In), 0, y->data(), index_t(Out));
    }
    if constexpr (std::is_void_v<F>) {
      if constexpr (Bias && S::computes)
        if (!replayed) evaluate(*y, *y + broadcast_rows(bias(s, p), rows));
      if (s.capture) product = y;
    } else {
      // The following point-wise layer, fused: y = F(x W^T + b); keep the pre-activation (without
      // the bias, which the backward adds back in the same pass).
      A z = y;
      if (s.training) y = s.make(rows, Out);  // inference keeps nothing: apply F in place
      if constexpr (S::computes) {
        if constexpr (Bias)
          evaluate(*y, F::apply(to_expr(*z) + broadcast_rows(bias(s, p), rows)));
        else
          evaluate(*y, F::apply(to_expr(*z)));
      }
      if (s.capture) product = z;
      s.save(std::move(z));
    }
    s.save(std::move(x));  // (before capturing: it marks earlier captures needed, not this one)
    // A fused product is the pre-activation this layer's backward needs; a plain one is needed
    // only if a later layer needs its input.
    if (s.capture) s.capture->push_back({std::move(product), !std::is_void_v<F>});
    return y;
  }

  template <class F = void, class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    using A = typename S::act_type;
    A x = s.restore();
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
    A dx = s.make(rows, In);
    if constexpr (S::computes) {
      // dW += dy^T x, db += column sums of dy, dx = dy W.
      using D = typename S::device;
      kernels::gemm(D{}, kernels::trans::yes, kernels::trans::no, index_t(Out), index_t(In), index_t(rows), 1,
                    dy->data(), index_t(Out), x->data(), index_t(In), 1, g, index_t(In));
      if constexpr (Bias) kernels::column_sums(D{}, dy->data(), rows, Out, g + In * Out, true);
      kernels::gemm(D{}, kernels::trans::no, kernels::trans::no, index_t(rows), index_t(In), index_t(Out), 1,
                    dy->data(), index_t(Out), p, index_t(In), 0, dx->data(), index_t(In));
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
