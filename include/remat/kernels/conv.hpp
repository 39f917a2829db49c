// 2D convolution on the host: forward, backward data and backward weights (PyTorch's
// cross-correlation, square kernel, equal stride and padding on both axes).
//
// Layout NCHW, row-major: row n of an activation is sample n, its C x H x W values channel by
// channel. It is what every remat activation already is (rows x features), what PyTorch's tensors
// and remat's safetensors files hold, and what oneDNN reads without a reorder on the caller's side.
// Weights are [Cout, Cin, K, K] (PyTorch's), the bias [Cout].
//
// On the GPU (remat::cuda with cuDNN, REMAT_HAS_CUDNN: the CMake target links it when the toolkit
// has it), fp32 goes to cuDNN's convolutions in NCHW (its legacy API, still in cuDNN 9): the
// algorithms its heuristics rank first for the shape, chosen once per shape, FMA math (no TF32, so
// the GPU's results follow the host's to fp32 rounding), workspace from remat's device allocator,
// on the model's stream; the weights' and bias' gradients accumulate in place (beta = 1). 16-bit
// activations (mixed<bfloat16>, mixed<half>) are widened to fp32 into scratch for the same calls
// and the results rounded back once: correct, not tuned (cuDNN's own 16-bit convolutions are next).
//
// On the host, fp32 goes to oneDNN's convolution primitives (made once per shape and cached; their scratchpad
// from remat's allocator, tagged workspace as the matrix products' is). Each primitive picks its
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
#include "gemm.hpp"

#if REMAT_HAS_CUDA && defined(REMAT_HAS_CUDNN)
#include <cudnn.h>
#endif

#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <unordered_map>
#include <vector>

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

// What a cached convolution is made for: the shape, and whether it has a bias.
struct onednn_conv_key_t {
  std::size_t n, ci, h, w, co, k, s, p;
  bool bias;
  bool bf16 = false;  // bf16 activations and weights (fp32 gradients of the weights)
  auto tie() const { return std::tie(n, ci, h, w, co, k, s, p, bias, bf16); }
  bool operator<(onednn_conv_key_t const& o) const { return tie() < o.tie(); }
};

#if REMAT_HAS_CUDA && defined(REMAT_HAS_CUDNN)
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
  thread_local std::map<onednn_conv_key_t, std::unique_ptr<cudnn_conv>> cache;
  onednn_conv_key_t const key{c.batch, c.in_channels, c.height, c.width, c.out_channels, c.kernel, c.stride,
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
#endif

#if defined(REMAT_GEMM_ONEDNN)
using onednn_conv_key = onednn_conv_key_t;

// The three primitives of one shape, the layouts each chose (oneDNN's blocked formats, faster
// than plain NCHW for its vectorised kernels), and their scratchpads' bytes.
struct onednn_conv {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  std::size_t forward_pad, data_pad, weights_pad;
  dnnl::memory::desc src, weights, bias, dst;           // the caller's: NCHW, OIHW, X
  dnnl::memory::desc diff_weights, diff_bias;           // the caller's gradients (fp32 for bf16)
  dnnl::memory::desc f_src, f_weights, f_dst;           // forward's
  dnnl::memory::desc d_src, d_weights, d_dst;           // backward data's (diff_src, weights, diff_dst)
  dnnl::memory::desc w_src, w_weights, w_dst, w_bias;   // backward weights' (src, diff_weights, diff_dst)
};

// The primitives of a shape in fp32, or in bf16 (null where oneDNN has no bf16 convolution for
// this processor: the caller widens to fp32 instead).
inline onednn_conv const* onednn_conv_for(conv_shape const& c, bool bias, bool bf16 = false) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  using dnnl::memory;
  static std::mutex mutex;
  static std::map<onednn_conv_key, std::unique_ptr<onednn_conv>> cache;  // (null: not supported)
  onednn_conv_key const key{c.batch,  c.in_channels, c.height, c.width, c.out_channels,
                            c.kernel, c.stride,      c.padding, bias,   bf16};
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  dnnl::engine const& eng = onednn_context::get().eng;
  auto d = [](std::size_t v) { return memory::dim(v); };
  dt const act = bf16 ? dt::bf16 : dt::f32;
  memory::dims const src_dims{d(c.batch), d(c.in_channels), d(c.height), d(c.width)},
      wei_dims{d(c.out_channels), d(c.in_channels), d(c.kernel), d(c.kernel)},
      dst_dims{d(c.batch), d(c.out_channels), d(c.out_height()), d(c.out_width())};
  memory::desc const src(src_dims, act, tag::nchw), wei(wei_dims, act, tag::oihw), dst(dst_dims, act, tag::nchw),
      dwei(wei_dims, dt::f32, tag::oihw);
  memory::desc const any_src(src_dims, act, tag::any), any_wei(wei_dims, act, tag::any),
      any_dst(dst_dims, act, tag::any), any_dwei(wei_dims, dt::f32, tag::any);
  memory::desc const bia = bias ? memory::desc({d(c.out_channels)}, act, tag::x) : memory::desc();
  memory::desc const dbia = bias ? memory::desc({d(c.out_channels)}, dt::f32, tag::x) : memory::desc();
  memory::dims const strides{d(c.stride), d(c.stride)}, left{d(c.padding), d(c.padding)};
  // (the right padding that makes oneDNN's output size PyTorch's floor division)
  memory::dims const right{d((c.out_height() - 1) * c.stride + c.kernel) - d(c.height) - d(c.padding),
                           d((c.out_width() - 1) * c.stride + c.kernel) - d(c.width) - d(c.padding)};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto const alg = dnnl::algorithm::convolution_direct;
  try {
    dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any_src, any_wei, bia, any_dst,
                                        strides, left, right),
        attr, eng);
    dnnl::convolution_backward_data::primitive_desc bwd_data(
        dnnl::convolution_backward_data::desc(alg, any_src, any_wei, any_dst, strides, left, right), attr, eng, fwd);
    dnnl::convolution_backward_weights::primitive_desc bwd_weights(
        dnnl::convolution_backward_weights::desc(alg, any_src, any_dwei, dbia, any_dst, strides, left, right), attr,
        eng, fwd);
    auto p = std::unique_ptr<onednn_conv>(new onednn_conv{
        dnnl::convolution_forward(fwd), dnnl::convolution_backward_data(bwd_data),
        dnnl::convolution_backward_weights(bwd_weights), fwd.scratchpad_desc().get_size(),
        bwd_data.scratchpad_desc().get_size(), bwd_weights.scratchpad_desc().get_size(), src, wei, bia, dst, dwei,
        dbia, fwd.src_desc(), fwd.weights_desc(), fwd.dst_desc(), bwd_data.diff_src_desc(), bwd_data.weights_desc(),
        bwd_data.diff_dst_desc(), bwd_weights.src_desc(), bwd_weights.diff_weights_desc(),
        bwd_weights.diff_dst_desc(), bias ? bwd_weights.diff_bias_desc() : memory::desc()});
    return cache.emplace(key, std::move(p)).first->second.get();
  } catch (dnnl::error const& e) {
    // bf16 on a processor without the instructions oneDNN wants for it: not an error, the
    // caller widens. fp32 always has a primitive; a failure there is one.
    if (!bf16 || e.status != dnnl_unimplemented)
      REMAT_NAMESPACE::detail::raise<error>("conv2d: oneDNN could not make the convolution: ", e.what());
    return cache.emplace(key, nullptr).first->second.get();
  }
}

// One argument of a primitive: the caller's memory in its layout, and the layout the primitive
// chose. Where they differ the argument goes through a buffer of remat's allocator: an input is
// reordered into it before, an output out of it after.
struct onednn_arg {
  int id;
  dnnl::memory::desc const* user;
  dnnl::memory::desc const* chosen;
  void* data;
  bool output;
};

template <class Prim>
void onednn_run(Prim const& prim, std::size_t pad_bytes, std::initializer_list<onednn_arg> list) {
  dnnl::engine const& eng = onednn_context::get().eng;
  dnnl::stream& stream = onednn_context::stream();
  memory::scratch_buffer<host> pad(pad_bytes);
  std::unordered_map<int, dnnl::memory> args;
  args.emplace(DNNL_ARG_SCRATCHPAD,
               dnnl::memory(dnnl::memory::desc({dnnl::memory::dim(pad_bytes)}, dnnl::memory::data_type::u8,
                                               dnnl::memory::dims{1}),
                            eng, pad.get()));
  std::vector<std::unique_ptr<memory::scratch_buffer<host>>> held;
  std::vector<std::pair<dnnl::memory, dnnl::memory>> outputs;  // (the primitive's, the caller's)
  try {
    for (onednn_arg const& a : list) {
      dnnl::memory user(*a.user, eng, a.data);
      if (*a.user == *a.chosen) {
        args.emplace(a.id, user);
        continue;
      }
      held.push_back(std::make_unique<memory::scratch_buffer<host>>(a.chosen->get_size()));
      dnnl::memory mine(*a.chosen, eng, held.back()->get());
      if (a.output)
        outputs.emplace_back(mine, user);
      else
        dnnl::reorder(user, mine).execute(stream, user, mine);
      args.emplace(a.id, mine);
    }
    prim.execute(stream, args);
    for (auto& [mine, user] : outputs) dnnl::reorder(mine, user).execute(stream, mine, user);
    stream.wait();
  } catch (dnnl::error const& e) {
    REMAT_NAMESPACE::detail::raise<error>("conv2d: oneDNN failed: ", e.what());
  }
}

// One array from one layout into another.
inline void onednn_reorder(dnnl::memory::desc const& from, void* in, dnnl::memory::desc const& to, void* out) {
  dnnl::engine const& eng = onednn_context::get().eng;
  dnnl::stream& stream = onednn_context::stream();
  try {
    dnnl::memory a(from, eng, in), b(to, eng, out);
    dnnl::reorder(a, b).execute(stream, a, b);
    stream.wait();
  } catch (dnnl::error const& e) {
    REMAT_NAMESPACE::detail::raise<error>("conv2d: oneDNN failed: ", e.what());
  }
}
#endif

}  // namespace detail

namespace detail {
#if defined(REMAT_GEMM_ONEDNN)
// The oneDNN paths of fp32 and bf16 (p: the shape's primitives in that type); the weights' and
// bias' gradients are fp32 in both.
template <class T>
void onednn_conv_forward(onednn_conv const& p, T const* x, T const* w, T const* b, T* y) {
  auto* const xv = const_cast<T*>(x);
  auto* const wv = const_cast<T*>(w);
  if (b)
    onednn_run(p.forward, p.forward_pad,
               {{DNNL_ARG_SRC, &p.src, &p.f_src, xv, false},
                {DNNL_ARG_WEIGHTS, &p.weights, &p.f_weights, wv, false},
                {DNNL_ARG_BIAS, &p.bias, &p.bias, const_cast<T*>(b), false},
                {DNNL_ARG_DST, &p.dst, &p.f_dst, y, true}});
  else
    onednn_run(p.forward, p.forward_pad,
               {{DNNL_ARG_SRC, &p.src, &p.f_src, xv, false},
                {DNNL_ARG_WEIGHTS, &p.weights, &p.f_weights, wv, false},
                {DNNL_ARG_DST, &p.dst, &p.f_dst, y, true}});
}

template <class T>
void onednn_conv_backward(conv_shape const& c, onednn_conv const& p, T const* x, T const* w, T const* dy, T* dx,
                          float* dw, float* db) {
  auto* const xv = const_cast<T*>(x);
  auto* const wv = const_cast<T*>(w);
  void* dyv = const_cast<T*>(dy);
  dnnl::memory::desc const* dy_desc = &p.dst;
  // Where both primitives want dy in the same layout, other than the caller's, it is reordered
  // once for both (a reorder of an activation is about a tenth of a convolution's time).
  std::unique_ptr<memory::scratch_buffer<host>> dy_blocked;
  if (dx && p.d_dst == p.w_dst && p.d_dst != p.dst) {
    dy_blocked = std::make_unique<memory::scratch_buffer<host>>(p.d_dst.get_size());
    onednn_reorder(p.dst, dyv, p.d_dst, dy_blocked->get());
    dyv = dy_blocked->get();
    dy_desc = &p.d_dst;
  }
  if (dx)
    onednn_run(p.backward_data, p.data_pad,
               {{DNNL_ARG_DIFF_DST, dy_desc, &p.d_dst, dyv, false},
                {DNNL_ARG_WEIGHTS, &p.weights, &p.d_weights, wv, false},
                {DNNL_ARG_DIFF_SRC, &p.src, &p.d_src, dx, true}});
  // oneDNN writes the weights' gradient; the model's gradients accumulate, so it goes through a
  // scratch copy.
  std::size_t const nw = c.weight_count(), nb = db ? c.out_channels : 0;
  memory::scratch_buffer<host> tmp((nw + nb) * sizeof(float));
  float* const tw = tmp.as<float>();
  if (db)
    onednn_run(p.backward_weights, p.weights_pad,
               {{DNNL_ARG_SRC, &p.src, &p.w_src, xv, false},
                {DNNL_ARG_DIFF_DST, dy_desc, &p.w_dst, dyv, false},
                {DNNL_ARG_DIFF_WEIGHTS, &p.diff_weights, &p.w_weights, tw, true},
                {DNNL_ARG_DIFF_BIAS, &p.diff_bias, &p.w_bias, tw + nw, true}});
  else
    onednn_run(p.backward_weights, p.weights_pad,
               {{DNNL_ARG_SRC, &p.src, &p.w_src, xv, false},
                {DNNL_ARG_DIFF_DST, dy_desc, &p.w_dst, dyv, false},
                {DNNL_ARG_DIFF_WEIGHTS, &p.diff_weights, &p.w_weights, tw, true}});
  for (std::size_t i = 0; i < nw; ++i) dw[i] += tw[i];
  for (std::size_t i = 0; i < nb; ++i) db[i] += tw[nw + i];
}
#endif

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
