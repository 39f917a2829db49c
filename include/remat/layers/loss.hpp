// Losses: the value of the loss and its gradient with respect to the model's output in one call,
// accumulated in the compute type (fp32 or better). Both use PyTorch's 'mean' reduction.
//
// A loss has forward_backward(y, target, scale, dy) returning the loss as a double. It may also
// have forward_backward_pending, returning a kernels::pending_scalar: a training step then reads
// the loss only after issuing its backward and the optimizer's update (on the GPU, the step does
// not wait between forward and backward). Both built-in losses have it.
//
// A loss that allocates workspace during a step (tagged memory::tag::workspace) declares how much
// in workspace_bytes<C>(rows, cols), for outputs of type C: the whole-step plan
// (plan/step.hpp) counts it at the point of the step where the loss runs.
#pragma once

#include "../kernels/evaluate.hpp"
#include "../kernels/reduce.hpp"
#include "../kernels/softmax.hpp"
#include "common.hpp"

#include <cmath>
#include <cstdint>

namespace REMAT_NAMESPACE {

// Mean squared error against a target of the output's shape: mean((y - t)^2).
struct MSE {
  // A target: values of the output's shape, in the model's master type T.
  template <class T, class D>
  using target_type = tensor_view<T const, D>;

  // Throws, before anything changes, unless t is rows x cols of finite values in D's memory.
  template <class T, class D>
  static void validate(std::size_t rows, std::size_t cols, tensor_view<T const, D> t) {
    if (t.rows() != rows || t.cols() != cols)
      detail::raise<shape_error>("MSE target: expected ", rows, " x ", cols, " to match the output, found ", t.rows(),
                                 " x ", t.cols());
    require_device_memory<D>(t.data(), "MSE target");
    if (!std::isfinite(double(sum(to_expr(t) * 0.0))))
      detail::raise<argument_error>("MSE target: expected finite values, found NaN or inf");
  }

  // Returns the loss; writes scale * dloss/dy into dy (if given).
  // y may be in the compute type (16-bit) and t in the master type; the sums are fp32 or better.
  template <class T, class U, class D>
  static kernels::pending_scalar<D> forward_backward_pending(tensor<T, D> const& y, tensor_view<U const, D> t,
                                                             double scale, tensor<T, D>* dy) {
    double const n = double(y.size());
    kernels::pending_scalar<D> loss = sum_squares_pending(y - t);
    loss.divide_by(n);
    if (dy) evaluate(*dy, (y - t) * (2.0 * scale / n));
    return loss;
  }
  // The workspace it allocates (none: one fused reduction).
  template <class C>
  static constexpr std::size_t workspace_bytes(std::size_t, std::size_t) {
    return 0;  // one fused reduction; nothing allocated
  }
  // forward_backward_pending, read at once.
  template <class T, class U, class D>
  static double forward_backward(tensor<T, D> const& y, tensor_view<U const, D> t, double scale, tensor<T, D>* dy) {
    return forward_backward_pending(y, t, scale, dy).get();
  }
};

// Softmax cross-entropy with integer class labels (one per output row; for a language model, one
// per position): mean over rows of
// -log softmax(y)[label], computed stably.
struct SoftmaxCrossEntropy {
  // A target: int32 class labels, one per output row (rows x 1, or batch x seq).
  template <class T, class D>
  using target_type = tensor_view<std::int32_t const, D>;

  template <class T, class D>
  static void validate(std::size_t rows, std::size_t cols, tensor_view<std::int32_t const, D> labels) {
    // One label per output row: rows x 1, or batch x seq for a sequence model's batch * seq rows.
    if (labels.size() != rows)
      detail::raise<shape_error>("SoftmaxCrossEntropy labels: expected ", rows,
                                 " labels (one per output row: rows x 1, or batch x seq), found ", labels.rows(),
                                 " x ", labels.cols());
    require_device_memory<D>(labels.data(), "SoftmaxCrossEntropy labels");
    std::size_t const r = kernels::first_out_of_range(D{}, labels.data(), rows, 0, std::int64_t(cols));
    if (r < rows)
      detail::raise<argument_error>("SoftmaxCrossEntropy labels: expected classes in [0, ", cols, "), found ",
                                    kernels::read_element(D{}, labels.data() + r), " at label ", r);
  }

  template <class T, class D>
  static kernels::pending_scalar<D> forward_backward_pending(tensor<T, D> const& y,
                                                             tensor_view<std::int32_t const, D> labels, double scale,
                                                             tensor<T, D>* dy) {
    std::size_t const rows = y.rows(), classes = y.cols();
    tensor<compute_type_t<T>, D> row_loss(index_t(rows), 1, memory::tag::workspace, *y.allocator());
    kernels::softmax_cross_entropy(D{}, y.data(), labels.data(), rows, classes, scale / double(rows),
                                   row_loss.data(), dy ? dy->data() : static_cast<T*>(nullptr));
    kernels::pending_scalar<D> loss = sum_pending(row_loss);  // (row_loss may go: the sum is issued after it)
    loss.divide_by(double(rows));
    return loss;
  }
  // The per-row losses above.
  template <class C>
  static constexpr std::size_t workspace_bytes(std::size_t rows, std::size_t) {
    return memory::caching_allocator<host>::rounded(rows * sizeof(compute_type_t<C>));
  }
  // forward_backward_pending, read at once.
  template <class T, class D>
  static double forward_backward(tensor<T, D> const& y, tensor_view<std::int32_t const, D> labels, double scale,
                                 tensor<T, D>* dy) {
    return forward_backward_pending(y, labels, scale, dy).get();
  }
};

}  // namespace REMAT_NAMESPACE
