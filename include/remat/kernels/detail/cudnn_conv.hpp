// The GPU's fp32 convolutions through cuDNN (kernels/conv.hpp calls them): a handle per host
// thread on the current stream, and per shape the descriptors and the algorithms cuDNN's
// heuristics rank first, made once and cached per thread.
#pragma once

#include "../../config.hpp"

#if REMAT_HAS_CUDA && defined(REMAT_HAS_CUDNN)
#include "../../cuda/runtime.hpp"
#include "../../error.hpp"
#include "conv_shape.hpp"

#include <cudnn.h>

#include <cstddef>
#include <map>
#include <memory>
#include <utility>

namespace REMAT_NAMESPACE {
namespace kernels {
namespace detail {

inline void cudnn_check(cudnnStatus_t status, char const* call) {
  if (status != CUDNN_STATUS_SUCCESS)
    REMAT_NAMESPACE::detail::raise<cuda_error>(call, " failed: ", cudnnGetErrorString(status));
}
#define REMAT_CUDNN_CHECK(call) ::REMAT_NAMESPACE::kernels::detail::cudnn_check((call), #call)

// One cuDNN handle per host thread, bound to the thread's current stream at each call.
struct cudnn_handle {
  cudnnHandle_t h = nullptr;
  cudnn_handle() { REMAT_CUDNN_CHECK(cudnnCreate(&h)); }
  ~cudnn_handle() {
    if (h) (void)cudnnDestroy(h);
  }
  cudnn_handle(cudnn_handle const&) = delete;
  cudnn_handle& operator=(cudnn_handle const&) = delete;
  static cudnnHandle_t on_current_stream() {
    thread_local cudnn_handle handle;
    REMAT_CUDNN_CHECK(cudnnSetStream(handle.h, current_cuda_stream()));
    return handle.h;
  }
};

// The descriptors and algorithms of one shape.
struct cudnn_conv {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t forward{};
  cudnnConvolutionBwdDataAlgo_t backward_data{};
  cudnnConvolutionBwdFilterAlgo_t backward_filter{};
  std::size_t forward_bytes = 0, data_bytes = 0, filter_bytes = 0;
  cudnn_conv() = default;
  cudnn_conv(cudnn_conv const&) = delete;
  cudnn_conv& operator=(cudnn_conv const&) = delete;
  ~cudnn_conv() {
    if (x) (void)cudnnDestroyTensorDescriptor(x);
    if (y) (void)cudnnDestroyTensorDescriptor(y);
    if (b) (void)cudnnDestroyTensorDescriptor(b);
    if (w) (void)cudnnDestroyFilterDescriptor(w);
    if (conv) (void)cudnnDestroyConvolutionDescriptor(conv);
  }
};

// The first algorithm of cuDNN's ranking that it says works for the shape and is deterministic
// (the heuristic ranks backward algorithms that add with atomics first for some shapes: on an H100
// the data gradient of a 2 -> 16 and the filter gradient of every 16-channel 3 x 3 convolution of
// 64 x 64 images at batch 16; they would make a step's bits vary run to run).
template <class Perf>
Perf first_working(Perf const* perf, int count, char const* what) {
  for (int i = 0; i < count; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC) return perf[i];
  REMAT_NAMESPACE::detail::raise<cuda_error>("conv2d: cuDNN has no deterministic ", what, " algorithm for this shape");
}

inline cudnn_conv const& cudnn_conv_for(conv_shape const& c) {
  thread_local std::map<conv_key, std::unique_ptr<cudnn_conv>> cache;
  conv_key const key{c.batch, c.in_channels, c.height, c.width, c.out_channels, c.kernel, c.stride,
                              c.padding, false};
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto p = std::make_unique<cudnn_conv>();
  auto i = [](std::size_t v) { return int(v); };
  REMAT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  REMAT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  REMAT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->b));
  REMAT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
  REMAT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
  REMAT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(c.batch),
                                               i(c.in_channels), i(c.height), i(c.width)));
  REMAT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(c.batch),
                                               i(c.out_channels), i(c.out_height()), i(c.out_width())));
  REMAT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, i(c.out_channels), 1, 1));
  REMAT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, i(c.out_channels),
                                               i(c.in_channels), i(c.kernel), i(c.kernel)));
  REMAT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p->conv, i(c.padding), i(c.padding), i(c.stride), i(c.stride), 1,
                                                    1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  REMAT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, CUDNN_FMA_MATH));
  int n = 0, ch = 0, h = 0, w = 0;
  REMAT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &ch, &h, &w));
  if (std::size_t(h) != c.out_height() || std::size_t(w) != c.out_width())
    REMAT_NAMESPACE::detail::raise<cuda_error>("conv2d: cuDNN's output is ", h, " x ", w, ", expected ",
                                               c.out_height(), " x ", c.out_width());
  cudnnHandle_t const handle = cudnn_handle::on_current_stream();
  constexpr int ask = 8;
  int got = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[ask];
  REMAT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, p->x, p->w, p->conv, p->y, ask, &got, fwd));
  auto const f = first_working(fwd, got, "forward");
  p->forward = f.algo;
  p->forward_bytes = f.memory;
  cudnnConvolutionBwdDataAlgoPerf_t data[ask];
  REMAT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, p->w, p->y, p->conv, p->x, ask, &got, data));
  auto const d = first_working(data, got, "backward data");
  p->backward_data = d.algo;
  p->data_bytes = d.memory;
  cudnnConvolutionBwdFilterAlgoPerf_t filter[ask];
  REMAT_CUDNN_CHECK(
      cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p->x, p->y, p->conv, p->w, ask, &got, filter));
  auto const g = first_working(filter, got, "backward filter");
  p->backward_filter = g.algo;
  p->filter_bytes = g.memory;
  return *cache.emplace(key, std::move(p)).first->second;
}

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
#endif
