// The shape of one convolution over a batch (kernels/conv.hpp), and the key its cached
// primitives are found by (oneDNN's on the host, cuDNN's descriptors on the GPU).
#pragma once

#include "../../config.hpp"

#include <cstddef>
#include <tuple>

namespace REMAT_NAMESPACE {
namespace kernels {

// The shape of one convolution over a batch.
struct conv_shape {
  std::size_t batch;         // images
  std::size_t in_channels;   // input planes per image
  std::size_t height;        // the input's height
  std::size_t width;         // the input's width
  std::size_t out_channels;  // output planes per image
  std::size_t kernel;        // the square kernel's side
  std::size_t stride;        // the step between windows
  std::size_t padding;       // zeros around the input, on every side
  constexpr std::size_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }  // the output's height
  constexpr std::size_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }  // the output's width
  constexpr std::size_t in_features() const { return in_channels * height * width; }  // values per input image
  constexpr std::size_t out_features() const { return out_channels * out_height() * out_width(); }  // values per output image
  constexpr std::size_t weight_count() const { return out_channels * in_channels * kernel * kernel; }  // the kernel's weights
};

namespace detail {

// What a cached convolution is made for: the shape, whether it has a bias, and its type.
struct conv_key {
  std::size_t n, ci, h, w, co, k, s, p;
  bool bias;
  bool bf16 = false;  // bf16 activations and weights (fp32 gradients of the weights)
  auto tie() const { return std::tie(n, ci, h, w, co, k, s, p, bias, bf16); }
  bool operator<(conv_key const& o) const { return tie() < o.tie(); }
};

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
