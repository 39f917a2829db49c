// Conv2d<InChannels, OutChannels, Kernel, Height, Width, Stride, Padding, Bias>: PyTorch's
// nn.Conv2d (square kernel, the same stride and zero padding on both axes) over images of
// Height x Width, fixed in the type so that the plan knows every activation's size.
//
// An activation row is one image in NCHW order (kernels/conv.hpp says why), so the layer's widths
// are InChannels * Height * Width in and OutChannels * out_height * out_width out, and a Seq checks
// them against its neighbours at compile time as it checks every layer's. Weights are
// [OutChannels, InChannels, Kernel, Kernel] and the bias [OutChannels], as PyTorch stores them
// (a safetensors file reads into nn.Conv2d unchanged).
//
// The convolution goes through s.product, so Selective keeps its output and a recomputation takes
// it back. Host: oneDNN for fp32 and bfloat16 (im2col + GEMM for double, the gradient checker's
// precision). GPU: cuDNN in fp32. Under mixed precision the activations and the weights' compute
// copy are 16-bit and the weights' gradients fp32 (kernels/conv.hpp says which paths widen).
#pragma once

#include "../kernels/conv.hpp"
#include "layer.hpp"

#include <cmath>

namespace REMAT_NAMESPACE {

template <std::size_t InChannels, std::size_t OutChannels, std::size_t Kernel, std::size_t Height, std::size_t Width,
          std::size_t Stride = 1, std::size_t Padding = 0, bool Bias = true>
struct Conv2d {
  static_assert(InChannels > 0 && OutChannels > 0, "remat::Conv2d: channels must be positive");
  static_assert(Kernel > 0 && Stride > 0, "remat::Conv2d: the kernel and the stride must be positive");
  static_assert(Height + 2 * Padding >= Kernel && Width + 2 * Padding >= Kernel,
                "remat::Conv2d: the kernel is larger than the padded image");
  // The image in: InChannels x Height x Width.
  static constexpr image_shape in_image{InChannels, Height, Width};
  // The image out: OutChannels x ((Height + 2 Padding - Kernel) / Stride + 1) x (the same for Width).
  static constexpr image_shape out_image{OutChannels, (Height + 2 * Padding - Kernel) / Stride + 1,
                                         (Width + 2 * Padding - Kernel) / Stride + 1};
  // Values per row in: the image's.
  static constexpr std::size_t in_width = in_image.size();
  // Values per row out: the output image's.
  static constexpr std::size_t out_width = out_image.size();
  // The weights: OutChannels x InChannels x Kernel x Kernel.
  static constexpr std::size_t weight_count = OutChannels * InChannels * Kernel * Kernel;
  // The weights, and the bias (OutChannels) when Bias.
  static constexpr std::size_t param_count = weight_count + (Bias ? OutChannels : 0);
  static constexpr bool handles_hollow = true;  // it needs its input, and says so itself

  // "weight" (OutChannels x InChannels x Kernel x Kernel) and "bias" (OutChannels), PyTorch's
  // names, shapes and layout.
  static std::vector<param_desc> params() {
    std::vector<param_desc> p{{"weight", 0, {OutChannels, InChannels, Kernel, Kernel}}};
    if constexpr (Bias) p.push_back({"bias", weight_count, {OutChannels}});
    return p;
  }

  // PyTorch's nn.Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the weights and the bias, fan_in
  // = InChannels * Kernel².
  template <class T>
  static void init(T* p, std::size_t global_offset, std::uint64_t seed) {
    init::uniform(p, param_count, global_offset, seed, 1.0 / std::sqrt(double(InChannels * Kernel * Kernel)));
  }

  // The convolution of a batch of `batch` images, as the kernels take it.
  static constexpr kernels::conv_shape shape(std::size_t batch) {
    return {batch, InChannels, Height, Width, OutChannels, Kernel, Stride, Padding};
  }

  // Compile-time checks of the pass's device and types (cuDNN on the GPU, no fp64 there).
  template <class S>
  static constexpr void check_state() {
#if REMAT_HAS_CUDA
    if constexpr (S::computes && std::is_same_v<typename S::device, cuda>) {
#if defined(REMAT_HAS_CUDNN)
      static_assert(!std::is_same_v<typename S::value_type, double>,
                    "remat::Conv2d: on the GPU, fp32 and 16-bit activations (cuDNN in fp32); fp64 is host-only");
#else
      static_assert(sizeof(S*) == 0,
                    "remat::Conv2d: the GPU convolution needs cuDNN (remat::cuda links it when the CUDA toolkit "
                    "has it; REMAT_HAS_CUDNN is not defined)");
#endif
    }
#endif
    if constexpr (S::computes)
      static_assert(std::is_same_v<typename S::grad_type, compute_type_t<typename S::value_type>>,
                    "remat::Conv2d: the weights' gradients are in the activations' compute type");
  }

  template <class S>
  static constexpr typename S::act_type forward(S& s, typename S::param_ptr p, typename S::act_type x) {
    check_state<S>();
    std::size_t const rows = x->rows();
    s.save(x);  // (first: it marks the products before this one needed, not this one)
    return s.product(rows, out_width, InChannels * Kernel * Kernel, [&](auto& out) {
      if constexpr (S::computes)
        kernels::conv2d_forward(typename S::device{}, shape(rows), x->data(), p, Bias ? p + weight_count : nullptr,
                                out.data());
    });
  }

  // The gradients of the input (unless nobody needs it), the weights and the bias, from the
  // saved input.
  template <class S>
  static constexpr typename S::act_type backward(S& s, typename S::param_ptr p, typename S::grad_ptr g,
                                                 typename S::act_type dy) {
    check_state<S>();
    using A = typename S::act_type;
    std::size_t const rows = dy->rows();
    A x = s.restore();
    bool const wanted = s.needs_gradient(x);
    A dx;
    if (wanted)
      dx = s.make(rows, in_width);
    else
      dx = s.hollow(rows, in_width);
    if constexpr (S::computes) {
      kernels::conv2d_backward(typename S::device{}, shape(rows), x->data(), p, dy->data(), wanted ? dx->data() : nullptr, g,
                               Bias ? g + weight_count : nullptr);
    }
    return dx;
  }
};

}  // namespace REMAT_NAMESPACE
