// Residual<S>: y = x + S(x). S must keep the width (a compile error names S and both widths).
#pragma once

#include "../kernels/evaluate.hpp"
#include "walk.hpp"

#include <cstddef>
#include <string>

namespace REMAT_NAMESPACE {

// Fails to compile with the segment and its two widths in the instantiation the compiler prints:
// a Residual<S> whose S changes the width.
template <class Block, std::size_t In, std::size_t Out>
struct residual_width_mismatch {
  static_assert(In == Out, "remat::Residual<S>: S must keep the width (in residual_width_mismatch<S, in, out>)");
  static constexpr bool ok = In == Out;  // whether the widths agree (when it compiles, they do)
};

template <class S>
struct Residual : detail::parameters_of<S> {
  static_assert(layer_contract<S>::ok, "remat::Residual<S>: S must be a layer (see layer_contract above)");
  // Its segment.
  using children = type_list<S>;
  // The same shortcut around another segment.
  template <class C>
  using rebuild = Residual<C>;
  // (The segment's layers ask for their input themselves.)
  static constexpr bool handles_hollow = true;
  // Whether the segment keeps the width (y = x + S(x) needs it).
  static constexpr bool widths_ok = residual_width_mismatch<S, S::in_width, S::out_width>::ok;
  static_assert(widths_ok, "remat::Residual: see residual_width_mismatch above");
  // The segment's input width.
  static constexpr std::size_t in_width = S::in_width;
  // The same: the sum keeps it.
  static constexpr std::size_t out_width = S::in_width;

  // Whether S's last layer adds the shortcut in its own output pass (a chain ending in a Linear),
  // and whether S's first layer adds the shortcut's gradient in its dx pass (a chain starting with
  // a norm): the add is then no pass of its own, and every bit is as it was.
  static constexpr bool fused_add = [] {
    if constexpr (requires { S::residual_in_last(); })
      return S::residual_in_last();
    else
      return false;
  }();
  // Whether S's first layer adds the shortcut's gradient in its dx pass (see fused_add).
  static constexpr bool fused_add_gradient = [] {
    if constexpr (requires { S::residual_gradient_in_first(); })
      return S::residual_gradient_in_first();
    else
      return false;
  }();

  // y = x + S(x).
  template <class St>
  static constexpr typename St::act_type forward(St& s, typename St::param_ptr p, typename St::act_type x) {
    static_assert(layer_pass_contract<S, St>::ok);
    if constexpr (fused_add) {
      typename St::act_type const r = x;
      return S::forward_onto(s, p, std::move(x), r);
    }
    typename St::act_type y = S::forward(s, p, x);
    if (St::is_hollow(y)) return y;  // a selective recomputation that needs no values past here
    if (y == x || y.use_count() > 1) {  // S was the identity, or its output is kept: add out of place
      typename St::act_type sum = s.make(x->rows(), x->cols());
      if constexpr (St::computes) evaluate(*sum, *y + *x);
      return sum;
    }
    if constexpr (St::computes) evaluate(*y, *y + *x);
    return y;
  }

  template <class St>
  static constexpr typename St::act_type backward(St& s, typename St::param_ptr p, typename St::grad_ptr g,
                                                  typename St::act_type dy) {
    if constexpr (fused_add_gradient) return S::backward_onto(s, p, g, dy, dy);  // (dy shared: S keeps it)
    typename St::act_type dx = S::backward(s, p, g, dy);  // dy stays shared here, so S does not overwrite it
    if (St::is_hollow(dx)) return dx;  // x is the pass's input, whose gradient nobody wants
    if (dx == dy) {
      dx = s.make(dy->rows(), dy->cols());
      if constexpr (St::computes) evaluate(*dx, *dy + *dy);
    } else {
      if constexpr (St::computes) evaluate(*dx, *dx + *dy);
    }
    return dx;
  }
};

}  // namespace REMAT_NAMESPACE
