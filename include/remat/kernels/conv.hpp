// 2D convolution on the host: forward, backward data and backward weights (PyTorch's
// cross-correlation, square kernel, equal stride and padding on both axes).
//
// Layout NCHW, row-major: row n of an activation is sample n, its C x H x W values channel by
// channel. It is what every remat activation already is (rows x features), what PyTorch's tensors
// and remat's safetensors files hold, and what oneDNN reads without a reorder on the caller's side.
// Weights are [Cout, Cin, K, K] (PyTorch's), the bias [Cout].
//
// On the GPU (remat::cuda with cuDNN, REMAT_HAS_CUDNN: the CMake target links it when the toolkit
// has it), fp32 goes to cuDNN's convolutions in NCHW (its legacy API, still in cuDNN 9;
// detail/cudnn_conv.hpp): the
// algorithms its heuristics rank first for the shape, chosen once per shape, FMA math (no TF32, so
// the GPU's results follow the host's to fp32 rounding), workspace from remat's device allocator,
// on the model's stream; the weights' and bias' gradients accumulate in place (beta = 1). 16-bit
// activations (mixed<bfloat16>, mixed<half>) are widened to fp32 into scratch for the same calls
// and the results rounded back once: correct, not tuned (cuDNN's own 16-bit convolutions are next).
//
// On the host, fp32 goes to oneDNN's convolution primitives (detail/onednn_conv.hpp: made once per
// shape and cached; their scratchpad from remat's allocator, tagged workspace as the matrix
// products' is). Each primitive picks its
// own layouts (blocked formats such as nChw16c, whose kernels vectorise over channels: bench_conv's
// step went from 1.84 s to 1.00 s with 2 blocks at 64 channels, 64 x 64, batch 32, Intel Xeon, 2
// cores); the arguments are reordered into them and the outputs back, per call (dy once for both
// backward primitives), through buffers of the same allocator. bfloat16 goes to oneDNN's bf16 primitives (AVX-512 BF16 and AMX where the
// processor has them: bf16 inputs, fp32 accumulation, bf16 outputs, the weights' and bias' gradients
// in fp32, the master gradients' type); where oneDNN has no bf16 convolution for the processor, and
// for half, the inputs are widened to fp32 into scratch and the fp32 path runs. double, and fp32
// when remat was built without oneDNN, go to im2col + GEMM: the test oracle (tests check oneDNN's
// results against it, and it against central differences).
#pragma once

#include "../device.hpp"
#include "../error.hpp"
#include "../memory/allocator.hpp"
#include "detail/conv_shape.hpp"
#include "detail/cudnn_conv.hpp"
#include "gemm.hpp"
#if defined(REMAT_GEMM_ONEDNN)
#include "detail/onednn_conv.hpp"
#endif

#include <cstddef>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

namespace detail {

// col[(c, ki, kj), (oi, oj)] = x[c, oi * s + ki - p, oj * s + kj - p] (0 outside the image).
template <class T>
void im2col(conv_shape const& c, T const* x, T* col) {
  std::size_t const ho = c.out_height(), wo = c.out_width(), k = c.kernel;
  for (std::size_t ch = 0; ch < c.in_channels; ++ch)
    for (std::size_t ki = 0; ki < k; ++ki)
      for (std::size_t kj = 0; kj < k; ++kj) {
        T* out = col + ((ch * k + ki) * k + kj) * ho * wo;
        for (std::size_t oi = 0; oi < ho; ++oi) {
          std::ptrdiff_t const i = std::ptrdiff_t(oi * c.stride + ki) - std::ptrdiff_t(c.padding);
          for (std::size_t oj = 0; oj < wo; ++oj) {
            std::ptrdiff_t const j = std::ptrdiff_t(oj * c.stride + kj) - std::ptrdiff_t(c.padding);
            bool const inside = i >= 0 && j >= 0 && i < std::ptrdiff_t(c.height) && j < std::ptrdiff_t(c.width);
            out[oi * wo + oj] = inside ? x[(ch * c.height + std::size_t(i)) * c.width + std::size_t(j)] : T(0);
          }
        }
      }
}

// The adjoint of im2col: dx[c, i, j] += every col entry that read it.
template <class T>
void col2im(conv_shape const& c, T const* col, T* dx) {
  std::size_t const ho = c.out_height(), wo = c.out_width(), k = c.kernel;
  for (std::size_t ch = 0; ch < c.in_channels; ++ch)
    for (std::size_t ki = 0; ki < k; ++ki)
      for (std::size_t kj = 0; kj < k; ++kj) {
        T const* in = col + ((ch * k + ki) * k + kj) * ho * wo;
        for (std::size_t oi = 0; oi < ho; ++oi) {
          std::ptrdiff_t const i = std::ptrdiff_t(oi * c.stride + ki) - std::ptrdiff_t(c.padding);
          if (i < 0 || i >= std::ptrdiff_t(c.height)) continue;
          for (std::size_t oj = 0; oj < wo; ++oj) {
            std::ptrdiff_t const j = std::ptrdiff_t(oj * c.stride + kj) - std::ptrdiff_t(c.padding);
            if (j < 0 || j >= std::ptrdiff_t(c.width)) continue;
            dx[(ch * c.height + std::size_t(i)) * c.width + std::size_t(j)] += in[oi * wo + oj];
          }
        }
      }
}

// The oracle: per sample, y = W col + b; dW += dy colᵀ, db += row sums of dy; dx = col2im(Wᵀ dy).
template <class T>
void im2col_forward(conv_shape const& c, T const* x, T const* w, T const* b, T* y) {
  std::size_t const hw = c.out_height() * c.out_width(), depth = c.in_channels * c.kernel * c.kernel;
  std::vector<T> col(depth * hw);
  for (std::size_t n = 0; n < c.batch; ++n) {
    im2col(c, x + n * c.in_features(), col.data());
    T* yn = y + n * c.out_features();
    gemm(host{}, lhs(w, index_t(c.out_channels), index_t(depth)), rhs(col.data(), index_t(depth), index_t(hw)),
         result(yn, index_t(c.out_channels), index_t(hw)));
    if (b)
      for (std::size_t o = 0; o < c.out_channels; ++o)
        for (std::size_t i = 0; i < hw; ++i) yn[o * hw + i] += b[o];
  }
}

template <class T>
void im2col_backward(conv_shape const& c, T const* x, T const* w, T const* dy, T* dx, T* dw, T* db) {
  std::size_t const hw = c.out_height() * c.out_width(), depth = c.in_channels * c.kernel * c.kernel;
  std::vector<T> col(depth * hw);
  for (std::size_t n = 0; n < c.batch; ++n) {
    T const* dyn = dy + n * c.out_features();
    if (dw) {
      im2col(c, x + n * c.in_features(), col.data());
      gemm(host{}, lhs(dyn, index_t(c.out_channels), index_t(hw)),
           rhs(col.data(), index_t(depth), index_t(hw)).transposed(),
           result(dw, index_t(c.out_channels), index_t(depth)), {.beta = 1});
    }
    if (db)
      for (std::size_t o = 0; o < c.out_channels; ++o)
        for (std::size_t i = 0; i < hw; ++i) db[o] += dyn[o * hw + i];
    if (dx) {
      gemm(host{}, lhs(w, index_t(c.out_channels), index_t(depth)).transposed(),
           rhs(dyn, index_t(c.out_channels), index_t(hw)), result(col.data(), index_t(depth), index_t(hw)));
      T* dxn = dx + n * c.in_features();
      std::fill(dxn, dxn + c.in_features(), T(0));
      col2im(c, col.data(), dxn);
    }
  }
}

// out[i] = float(in[i]) and back, on either device (the 16-bit paths that go through fp32).
template <class T, device_tag D>
void widen_to_float(D, T const* in, float* out, std::size_t n) {
  for_each_index(D{}, n, n, [=] REMAT_LAMBDA(std::size_t i) { out[i] = float(in[i]); });
}
template <class T, device_tag D>
void narrow_from_float(D, float const* in, T* out, std::size_t n) {
  for_each_index(D{}, n, n, [=] REMAT_LAMBDA(std::size_t i) { out[i] = T(in[i]); });
}

// 16-bit activations through the fp32 convolution of the device: the inputs widened into scratch,
// the outputs rounded back once; the weights' and bias' gradients (fp32) accumulate directly.
template <class T, device_tag D>
void conv2d_forward_widened(D, conv_shape const& c, T const* x, T const* w, T const* b, T* y) {
  std::size_t const nx = c.batch * c.in_features(), nw = c.weight_count(), nb = b ? c.out_channels : 0,
                    ny = c.batch * c.out_features();
  memory::scratch_buffer<D> buf((nx + nw + nb + ny) * sizeof(float));
  float* const xf = buf.template as<float>();
  float* const wf = xf + nx;
  float* const bf = wf + nw;
  float* const yf = bf + nb;
  widen_to_float(D{}, x, xf, nx);
  widen_to_float(D{}, w, wf, nw);
  if (b) widen_to_float(D{}, b, bf, nb);
  conv2d_forward(D{}, c, static_cast<float const*>(xf), static_cast<float const*>(wf),
                 b ? static_cast<float const*>(bf) : nullptr, yf);
  narrow_from_float(D{}, static_cast<float const*>(yf), y, ny);
}

template <class T, device_tag D>
void conv2d_backward_widened(D, conv_shape const& c, T const* x, T const* w, T const* dy, T* dx, float* dw,
                             float* db) {
  std::size_t const nx = c.batch * c.in_features(), nw = c.weight_count(), ny = c.batch * c.out_features();
  memory::scratch_buffer<D> buf((nx + nw + ny + (dx ? nx : 0)) * sizeof(float));
  float* const xf = buf.template as<float>();
  float* const wf = xf + nx;
  float* const dyf = wf + nw;
  float* const dxf = dyf + ny;
  widen_to_float(D{}, x, xf, nx);
  widen_to_float(D{}, w, wf, nw);
  widen_to_float(D{}, dy, dyf, ny);
  conv2d_backward(D{}, c, static_cast<float const*>(xf), static_cast<float const*>(wf),
                  static_cast<float const*>(dyf), dx ? dxf : nullptr, dw, db);
  if (dx) narrow_from_float(D{}, static_cast<float const*>(dxf), dx, nx);
}
}  // namespace detail

// y = conv(x, w) + b (b may be null). T: float, double, bfloat16 or half.
template <class T>
void conv2d_forward(host, conv_shape const& c, T const* x, T const* w, T const* b, T* y) {
  profile::timed<host> const timing(profile::work::product);
#if defined(REMAT_GEMM_ONEDNN)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
    if (auto const* p = detail::onednn_conv_for(c, b != nullptr, std::is_same_v<T, bfloat16>)) {
      detail::onednn_conv_forward(*p, x, w, b, y);
      return;
    }
  }
#endif
  if constexpr (is_small_float_v<T>)
    detail::conv2d_forward_widened(host{}, c, x, w, b, y);
  else
    detail::im2col_forward(c, x, w, b, y);
}

// dx = the gradient with respect to x (dx may be null: not wanted); dw += and db += the
// gradients with respect to w and b (db may be null: no bias), in G: T for float and double, fp32
// for 16-bit T (the master gradients).
template <class T, class G>
void conv2d_backward(host, conv_shape const& c, T const* x, T const* w, T const* dy, T* dx, G* dw, G* db) {
  profile::timed<host> const timing(profile::work::product);
  static_assert(std::is_same_v<G, compute_type_t<T>>,
                "conv2d_backward: the weights' gradients are in the activations' compute type (fp32 for 16-bit)");
#if defined(REMAT_GEMM_ONEDNN)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
    if (auto const* p = detail::onednn_conv_for(c, db != nullptr, std::is_same_v<T, bfloat16>)) {
      detail::onednn_conv_backward(c, *p, x, w, dy, dx, dw, db);
      return;
    }
  }
#endif
  if constexpr (is_small_float_v<T>)
    detail::conv2d_backward_widened(host{}, c, x, w, dy, dx, dw, db);
  else
    detail::im2col_backward(c, x, w, dy, dx, dw, db);
}

#if REMAT_HAS_CUDA && defined(REMAT_HAS_CUDNN)
// The GPU's y = conv(x, w) + b (b may be null), fp32, on the current stream.
inline void conv2d_forward(cuda, conv_shape const& c, float const* x, float const* w, float const* b, float* y) {
  auto const& p = detail::cudnn_conv_for(c);
  cudnnHandle_t const h = detail::cudnn_handle::on_current_stream();
  memory::scratch_buffer<cuda> workspace(p.forward_bytes);
  float const one = 1, zero = 0;
  REMAT_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, x, p.w, w, p.conv, p.forward, workspace.get(),
                                            p.forward_bytes, &zero, p.y, y));
  if (b) REMAT_CUDNN_CHECK(cudnnAddTensor(h, &one, p.b, b, &one, p.y, y));
}

// The GPU's backward: dx (null: not wanted) written; dw += and db += (db null: no bias).
inline void conv2d_backward(cuda, conv_shape const& c, float const* x, float const* w, float const* dy, float* dx,
                            float* dw, float* db) {
  auto const& p = detail::cudnn_conv_for(c);
  cudnnHandle_t const h = detail::cudnn_handle::on_current_stream();
  float const one = 1, zero = 0;
  if (dx) {
    memory::scratch_buffer<cuda> workspace(p.data_bytes);
    REMAT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p.w, w, p.y, dy, p.conv, p.backward_data,
                                                   workspace.get(), p.data_bytes, &zero, p.x, dx));
  }
  memory::scratch_buffer<cuda> workspace(p.filter_bytes);
  REMAT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p.x, x, p.y, dy, p.conv, p.backward_filter,
                                                   workspace.get(), p.filter_bytes, &one, p.w, dw));
  if (db) REMAT_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, p.y, dy, &one, p.b, db));
}

// 16-bit activations on the GPU: widened to fp32 for cuDNN, the outputs rounded back once.
template <class T>
  requires is_small_float_v<T>
void conv2d_forward(cuda, conv_shape const& c, T const* x, T const* w, T const* b, T* y) {
  detail::conv2d_forward_widened(cuda{}, c, x, w, b, y);
}
template <class T>
  requires is_small_float_v<T>
void conv2d_backward(cuda, conv_shape const& c, T const* x, T const* w, T const* dy, T* dx, float* dw, float* db) {
  detail::conv2d_backward_widened(cuda{}, c, x, w, dy, dx, dw, db);
}
#endif

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
