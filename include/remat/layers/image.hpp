// The layers of a convolutional network beside Conv2d: BatchNorm2d, GroupNorm, MaxPool2d,
// AvgPool2d and Upsample2d (nearest). Like Conv2d each fixes its image (channels, height, width)
// in the type, so its widths are channels x height x width, a Seq checks them against its
// neighbours, and the plan knows every activation; rows are NCHW images (kernels/conv.hpp).
//
// BatchNorm2d holds running statistics, the model's first buffers: running state beside the
// parameters, not trained, saved and loaded with them under PyTorch's names ("1.running_mean",
// "1.running_var"). A training pass updates them exactly once, in the first forward of the layer:
// a storage policy's recomputation (s.recomputing()) normalises by the same batch statistics,
// recomputed bit for bit, and leaves them alone (PyTorch's torch.utils.checkpoint updates them a
// second time in its recomputation). The update goes to a copy the model keeps, which becomes its
// state only when the pass succeeds, so a pass that fails changes nothing.
//
// fp32, double and 16-bit activations (mixed<bfloat16>, mixed<half>: statistics, sums and the
// running state in fp32, outputs rounded once), on the host and on the GPU (as Conv2d).
#pragma once

#include "../kernels/image.hpp"
#include "../kernels/pooling.hpp"
#include "conv.hpp"
#include "layer.hpp"
#include "norm_affine.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {

// PyTorch's nn.BatchNorm2d(Channels) (eps 1e-5, momentum 0.1, affine, running statistics): each
// channel normalised over the batch and the plane in training, by the running statistics in
// inference.
template <std::size_t Channels, std::size_t Height, std::size_t Width>
struct BatchNorm2d : detail::norm_affine<Channels, true> {  // (weight and bias, one per channel each; eps 1e-5)
  static_assert(Channels > 0 && Height > 0 && Width > 0, "remat::BatchNorm2d: the image must not be empty");
  // The image in: Channels x Height x Width.
  static constexpr image_shape in_image{Channels, Height, Width};
  // The image out: the same.
  static constexpr image_shape out_image = in_image;
  // Values per row in: the image's.
  static constexpr std::size_t in_width = in_image.size();
  // Values per row out: the same.
  static constexpr std::size_t out_width = in_width;
  using detail::norm_affine<Channels, true>::eps;
  // running_mean and running_var, one per channel each.
  static constexpr std::size_t buffer_count = 2 * Channels;
  // The running statistics' update: r = (1 - momentum) r + momentum * batch's (PyTorch's
  // default; the variance unbiased).
  static constexpr double momentum = 0.1;

  // "running_mean" and "running_var", PyTorch's names and shapes.
  static std::vector<param_desc> buffers() {
    return {{"running_mean", 0, {Channels}}, {"running_var", Channels, {Channels}}};
  }
  // running_mean 0, running_var 1 (PyTorch's).
  template <class T>
  static void init_buffers(T* b) {
    init::fill(b, Channels, 0.0);
    init::fill(b + Channels, Channels, 1.0);
  }

  // A batch of `rows` images as the kernels see it: rows x Channels planes of Height x Width.
  static constexpr kernels::planes planes(std::size_t rows) { return {rows, Channels, Height * Width}; }

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    using A = typename S::act_type;
    using T = typename S::value_type;
    std::size_t const rows = x->rows();
    // This layer's running statistics: taken in the layer's first forward of the pass, not in a
    // recomputation (which does not update them).
    typename S::buffer_ptr running{};
    if (!s.recomputing()) running = s.buffers(buffer_count);
    A y = s.make(rows, out_width);
    if (!s.training()) {
      if constexpr (S::computes) {
        if (!running)
          detail::raise<error>("remat::BatchNorm2d: inference reads the model's running statistics; this pass has none");
        kernels::batch_norm_forward_inference(typename S::device{}, planes(rows), x->data(), p, p + Channels, running, running + Channels,
                                              eps, y->data());
      }
      s.save(std::move(x));
      return y;
    }
    // mean, rstd (kept for backward) and the biased variance (for the running update).
    A stats = s.make(1, stat_columns<T>(3 * Channels));
    if constexpr (S::computes) {
      if (rows * Height * Width < 2)
        detail::raise<argument_error>("remat::BatchNorm2d: training expects more than one value per channel, found ",
                                      rows * Height * Width, " (batch ", rows, " of ", Height, " x ", Width, ")");
      auto* st = stat_data(stats->data());
      kernels::batch_norm_forward_training(typename S::device{}, planes(rows), x->data(), p, p + Channels, eps, y->data(), st,
                                           st + Channels, st + 2 * Channels);
      if (running && s.updates_buffers())
        kernels::batch_norm_update_running(typename S::device{}, Channels, rows * Height * Width, momentum, st, st + 2 * Channels, running,
                                           running + Channels);
    }
    s.save(std::move(x));
    s.save(std::move(stats));
    return y;
  }

  // The gradients of x, weight and bias from the saved input and statistics.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    using A = typename S::act_type;
    A stats = s.restore(), x = s.restore();
    A dx = s.gradient_for(x, dy, in_width);
    if constexpr (S::computes) {
      auto const* st = stat_data(stats->data());
      kernels::batch_norm_backward(typename S::device{}, planes(dy->rows()), x->data(), p, st, st + Channels,
                                   dy->data(), S::is_hollow(dx) ? nullptr : dx->data(), g, g + Channels);
    }
    return dx;
  }
};

// PyTorch's nn.GroupNorm(Groups, Channels) (eps 1e-5, affine): each image's channels in Groups
// groups, each group normalised over its channels and the plane. No running state; the same in
// training and inference, and independent of the batch.
template <std::size_t Groups, std::size_t Channels, std::size_t Height, std::size_t Width>
struct GroupNorm : detail::norm_affine<Channels, true> {  // (weight and bias, one per channel each; eps 1e-5)
  static_assert(Groups > 0 && Channels % Groups == 0,
                "remat::GroupNorm<Groups, Channels, H, W>: the channels must divide into the groups");
  static_assert(Height > 0 && Width > 0, "remat::GroupNorm: the image must not be empty");
  // The image in: Channels x Height x Width.
  static constexpr image_shape in_image{Channels, Height, Width};
  // The image out: the same.
  static constexpr image_shape out_image = in_image;
  // Values per row in: the image's.
  static constexpr std::size_t in_width = in_image.size();
  // Values per row out: the same.
  static constexpr std::size_t out_width = in_width;
  using detail::norm_affine<Channels, true>::eps;

  // A batch of `rows` images as the kernels see it: rows x Channels planes of Height x Width.
  static constexpr kernels::planes planes(std::size_t rows) { return {rows, Channels, Height * Width}; }

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    using A = typename S::act_type;
    using T = typename S::value_type;
    std::size_t const rows = x->rows();
    A y = s.make(rows, out_width);
    if (s.keeps()) {
      A stats = s.make(rows, stat_columns<T>(2 * Groups));  // mean of every (image, group), then rstd
      if constexpr (S::computes) {
        auto* st = stat_data(stats->data());
        kernels::group_norm_forward(typename S::device{}, planes(rows), Groups, x->data(), p, p + Channels, eps, y->data(), st,
                                    st + rows * Groups);
      }
      s.save(std::move(x));
      s.save(std::move(stats));
    } else {
      if constexpr (S::computes)
        kernels::group_norm_forward<T>(typename S::device{}, planes(rows), Groups, x->data(), p, p + Channels, eps, y->data(), nullptr,
                                       nullptr);
      s.save(std::move(x));
    }
    return y;
  }

  // The gradients of x, weight and bias from the saved input and statistics.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    using A = typename S::act_type;
    A stats = s.restore(), x = s.restore();
    std::size_t const rows = dy->rows();
    A dx = s.gradient_for(x, dy, in_width);
    if constexpr (S::computes) {
      auto const* st = stat_data(stats->data());
      kernels::group_norm_backward(typename S::device{}, planes(rows), Groups, x->data(), p, st, st + rows * Groups,
                                   dy->data(), S::is_hollow(dx) ? nullptr : dx->data(), g, g + Channels);
    }
    return dx;
  }
};

namespace detail {
// What the pooling layers share: the image in and out, no parameters.
template <std::size_t Channels, std::size_t Height, std::size_t Width, std::size_t Kernel, std::size_t Stride>
struct pool_geometry : no_parameters {
  static_assert(Channels > 0 && Kernel > 0 && Stride > 0, "remat: pooling needs channels, a kernel and a stride");
  static_assert(Height >= Kernel && Width >= Kernel, "remat: the pooling window is larger than the image");
  static constexpr kernels::pool_shape shape{Height, Width, Kernel, Stride};
  static constexpr image_shape in_image{Channels, Height, Width};
  static constexpr image_shape out_image{Channels, shape.out_height(), shape.out_width()};
  static constexpr std::size_t in_width = in_image.size();
  static constexpr std::size_t out_width = out_image.size();
};
}  // namespace detail

// PyTorch's nn.MaxPool2d(Kernel, Stride) (no padding): the largest value of each window; the
// gradient goes to the window's first largest value. Keeps its input for backward.
template <std::size_t Channels, std::size_t Height, std::size_t Width, std::size_t Kernel = 2,
          std::size_t Stride = Kernel>
struct MaxPool2d : detail::pool_geometry<Channels, Height, Width, Kernel, Stride> {
  // The image in and out, no parameters.
  using geometry = detail::pool_geometry<Channels, Height, Width, Kernel, Stride>;
  using geometry::in_width;
  using geometry::out_width;
  using geometry::shape;

  // Each window's largest value.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    std::size_t const rows = x->rows();
    typename S::act_type y = s.make(rows, out_width);
    if constexpr (S::computes) kernels::max_pool_forward(typename S::device{}, rows * Channels, shape, x->data(), y->data());
    s.save(std::move(x));
    return y;
  }
  // The gradient to each window's first largest value (read from the saved input).
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    typename S::act_type x = s.restore();
    std::size_t const rows = dy->rows();
    typename S::act_type dx;
    if (!s.needs_gradient(x)) return s.hollow(rows, in_width);
    dx = s.make(rows, in_width);
    if constexpr (S::computes) kernels::max_pool_backward(typename S::device{}, rows * Channels, shape, x->data(), dy->data(), dx->data());
    return dx;
  }
};

// PyTorch's nn.AvgPool2d(Kernel, Stride) (no padding): the mean of each window. Keeps nothing.
template <std::size_t Channels, std::size_t Height, std::size_t Width, std::size_t Kernel = 2,
          std::size_t Stride = Kernel>
struct AvgPool2d : detail::pool_geometry<Channels, Height, Width, Kernel, Stride> {
  // The image in and out, no parameters.
  using geometry = detail::pool_geometry<Channels, Height, Width, Kernel, Stride>;
  using geometry::in_width;
  using geometry::out_width;
  using geometry::shape;

  // Each window's mean.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    typename S::act_type y = s.make(x->rows(), out_width);
    if constexpr (S::computes) kernels::avg_pool_forward(typename S::device{}, x->rows() * Channels, shape, x->data(), y->data());
    return y;
  }
  // The gradient spread evenly over each window.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    typename S::act_type dx = s.make(dy->rows(), in_width);
    if constexpr (S::computes) kernels::avg_pool_backward(typename S::device{}, dy->rows() * Channels, shape, dy->data(), dx->data());
    return dx;
  }
};

// PyTorch's nn.Upsample(scale_factor=Factor, mode="nearest"): each value repeated over a
// Factor x Factor block (a U-Net's way back up, before a convolution). Keeps nothing.
template <std::size_t Channels, std::size_t Height, std::size_t Width, std::size_t Factor = 2>
struct Upsample2d : detail::no_parameters {
  static_assert(Channels > 0 && Height > 0 && Width > 0 && Factor > 0, "remat::Upsample2d: empty image or factor 0");
  // The image in: Channels x Height x Width.
  static constexpr image_shape in_image{Channels, Height, Width};
  // The image out: Channels x (Height * Factor) x (Width * Factor).
  static constexpr image_shape out_image{Channels, Height * Factor, Width * Factor};
  // Values per row in: the image's.
  static constexpr std::size_t in_width = in_image.size();
  // Values per row out: the larger image's.
  static constexpr std::size_t out_width = out_image.size();

  // Each value repeated over a Factor x Factor block.
  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr, typename S::act_type x) {
    typename S::act_type y = s.make(x->rows(), out_width);
    if constexpr (S::computes)
      kernels::upsample_nearest_forward(typename S::device{}, x->rows() * Channels, Height, Width, Factor, x->data(), y->data());
    return y;
  }
  // Each block's gradients summed into its value's.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr, typename S::grad_ptr,
                                                 typename S::act_type dy) {
    typename S::act_type dx = s.make(dy->rows(), in_width);
    if constexpr (S::computes)
      kernels::upsample_nearest_backward(typename S::device{}, dy->rows() * Channels, Height, Width, Factor, dy->data(), dx->data());
    return dx;
  }
};

}  // namespace REMAT_NAMESPACE
