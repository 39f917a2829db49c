// One training pass, written once for every pass state: model::accumulate runs it on a
// pass_state, and the activation plan on a planning::state, so the plan cannot drift from a step.
#pragma once

#include "../graph/walk.hpp"
#include "../numeric/precision.hpp"

#include <utility>

namespace REMAT_NAMESPACE {
namespace detail {

// The activation a pass starts from: none for a model that reads token ids (its first layer reads
// them from the pass state); in training, the caller's input read in place when it already has the
// compute type (every layer's training forward writes a new tensor); otherwise a copy in the
// compute type (inference runs point-wise layers in place; mixed precision converts).
template <class Net, class Precision, class S, class Input>
constexpr typename S::act_type input_activation(S& s, Input const& x, bool training) {
  if constexpr (reads_ids_v<Net>) {
    return {};
  } else {
    if constexpr (!is_mixed_v<Precision>)
      if (training) return s.borrow(x);
    return s.convert(x);
  }
}

// Forward keeping what backward needs, the loss's gradient with respect to the output
// (loss_grad(y, dy)), backward. Returns the gradient with respect to the input (null for a model
// that reads token ids; hollow, uncomputed, when the pass was told no input gradient is wanted).
template <class Net, class S, class LossGrad>
constexpr typename S::act_type training_pass(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                             typename S::act_type x, LossGrad&& loss_grad) {
  if (x) s.mark_pass_input(x);
  typename S::act_type y;
  {
    auto const gathered = gather_frame<Net>(s, p);  // (a model that is one layer)
    y = Net::forward(s, gathered.at(p), std::move(x));
  }
  s.forward_done(y);
  typename S::act_type dy = s.make(y->rows(), y->cols());
  loss_grad(y, dy);
  y.reset();
  auto const gathered = gather_frame<Net>(s, p);
  return Net::backward(s, gathered.at(p), g, std::move(dy));
}

}  // namespace detail
}  // namespace REMAT_NAMESPACE
