// 2D convolution on the host: forward, backward data and backward weights (PyTorch's
// cross-correlation, square kernel, equal stride and padding on both axes).
//
// Layout NCHW, row-major: row n of an activation is sample n, its C x H x W values channel by
// channel. It is what every remat activation already is (rows x features), what PyTorch's tensors
// and remat's safetensors files hold, and what oneDNN reads without a reorder on the caller's side.
// Weights are [Cout, Cin, K, K] (PyTorch's), the bias [Cout].
//
// fp32 goes to oneDNN's convolution primitives (made once per shape and cached; their scratchpad
// from remat's allocator, tagged workspace as the matrix products' is). Each primitive picks its
// own layouts (blocked formats such as nChw16c, whose kernels vectorise over channels: bench_conv's
// step went from 1.84 s to 1.00 s with 2 blocks at 64 channels, 64 x 64, batch 32, Intel Xeon, 2
// cores); the arguments are reordered into them and the outputs back, per call, through buffers
// of the same allocator. double, and fp32 when remat
// was built without oneDNN, go to im2col + GEMM: the test oracle (tests check oneDNN's results
// against it, and it against central differences).
#pragma once

#include "../device.hpp"
#include "../error.hpp"
#include "../memory/allocator.hpp"
#include "gemm.hpp"

#if defined(REMAT_GEMM_ONEDNN)
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#endif

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace REMAT_NAMESPACE {
namespace kernels {

// The shape of one convolution over a batch.
struct conv_shape {
  std::size_t batch, in_channels, height, width, out_channels, kernel, stride, padding;
  constexpr std::size_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }
  constexpr std::size_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }
  constexpr std::size_t in_features() const { return in_channels * height * width; }
  constexpr std::size_t out_features() const { return out_channels * out_height() * out_width(); }
  constexpr std::size_t weight_count() const { return out_channels * in_channels * kernel * kernel; }
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

#if defined(REMAT_GEMM_ONEDNN)
struct onednn_conv_key {
  std::size_t n, ci, h, w, co, k, s, p;
  bool bias;
  auto tie() const { return std::tie(n, ci, h, w, co, k, s, p, bias); }
  bool operator<(onednn_conv_key const& o) const { return tie() < o.tie(); }
};

// The three primitives of one shape, the layouts each chose (oneDNN's blocked formats, faster
// than plain NCHW for its vectorised kernels), and their scratchpads' bytes.
struct onednn_conv {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  std::size_t forward_pad, data_pad, weights_pad;
  dnnl::memory::desc src, weights, bias, dst;           // the caller's: NCHW, OIHW, X
  dnnl::memory::desc f_src, f_weights, f_dst;           // forward's
  dnnl::memory::desc d_src, d_weights, d_dst;           // backward data's (diff_src, weights, diff_dst)
  dnnl::memory::desc w_src, w_weights, w_dst, w_bias;   // backward weights' (src, diff_weights, diff_dst)
};

inline onednn_conv const& onednn_conv_for(conv_shape const& c, bool bias) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  using dnnl::memory;
  static std::mutex mutex;
  static std::map<onednn_conv_key, onednn_conv> cache;
  onednn_conv_key const key{c.batch, c.in_channels, c.height, c.width, c.out_channels, c.kernel, c.stride,
                            c.padding, bias};
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  dnnl::engine const& eng = onednn_context::get().eng;
  auto d = [](std::size_t v) { return memory::dim(v); };
  memory::dims const src_dims{d(c.batch), d(c.in_channels), d(c.height), d(c.width)},
      wei_dims{d(c.out_channels), d(c.in_channels), d(c.kernel), d(c.kernel)},
      dst_dims{d(c.batch), d(c.out_channels), d(c.out_height()), d(c.out_width())};
  memory::desc const src(src_dims, dt::f32, tag::nchw), wei(wei_dims, dt::f32, tag::oihw),
      dst(dst_dims, dt::f32, tag::nchw);
  memory::desc const any_src(src_dims, dt::f32, tag::any), any_wei(wei_dims, dt::f32, tag::any),
      any_dst(dst_dims, dt::f32, tag::any);
  memory::desc const bia = bias ? memory::desc({d(c.out_channels)}, dt::f32, tag::x) : memory::desc();
  memory::dims const strides{d(c.stride), d(c.stride)}, left{d(c.padding), d(c.padding)};
  // (the right padding that makes oneDNN's output size PyTorch's floor division)
  memory::dims const right{d((c.out_height() - 1) * c.stride + c.kernel) - d(c.height) - d(c.padding),
                           d((c.out_width() - 1) * c.stride + c.kernel) - d(c.width) - d(c.padding)};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto const alg = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any_src, any_wei, bia, any_dst, strides,
                                      left, right),
      attr, eng);
  dnnl::convolution_backward_data::primitive_desc bwd_data(
      dnnl::convolution_backward_data::desc(alg, any_src, any_wei, any_dst, strides, left, right), attr, eng, fwd);
  dnnl::convolution_backward_weights::primitive_desc bwd_weights(
      dnnl::convolution_backward_weights::desc(alg, any_src, any_wei, bia, any_dst, strides, left, right), attr, eng,
      fwd);
  it = cache
           .emplace(key, onednn_conv{dnnl::convolution_forward(fwd), dnnl::convolution_backward_data(bwd_data),
                                     dnnl::convolution_backward_weights(bwd_weights),
                                     fwd.scratchpad_desc().get_size(), bwd_data.scratchpad_desc().get_size(),
                                     bwd_weights.scratchpad_desc().get_size(), src, wei, bia, dst, fwd.src_desc(),
                                     fwd.weights_desc(), fwd.dst_desc(), bwd_data.diff_src_desc(),
                                     bwd_data.weights_desc(), bwd_data.diff_dst_desc(), bwd_weights.src_desc(),
                                     bwd_weights.diff_weights_desc(), bwd_weights.diff_dst_desc(),
                                     bias ? bwd_weights.diff_bias_desc() : memory::desc()})
           .first;
  return it->second;
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
  thread_local dnnl::stream stream{onednn_context::get().eng};
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
#endif

}  // namespace detail

// y = conv(x, w) + b (b may be null).
template <class T>
void conv2d_forward(host, conv_shape const& c, T const* x, T const* w, T const* b, T* y) {
#if defined(REMAT_GEMM_ONEDNN)
  if constexpr (std::is_same_v<T, float>) {
    auto const& p = detail::onednn_conv_for(c, b != nullptr);
    auto* const xv = const_cast<T*>(x);
    auto* const wv = const_cast<T*>(w);
    if (b)
      detail::onednn_run(p.forward, p.forward_pad,
                         {{DNNL_ARG_SRC, &p.src, &p.f_src, xv, false},
                          {DNNL_ARG_WEIGHTS, &p.weights, &p.f_weights, wv, false},
                          {DNNL_ARG_BIAS, &p.bias, &p.bias, const_cast<T*>(b), false},
                          {DNNL_ARG_DST, &p.dst, &p.f_dst, y, true}});
    else
      detail::onednn_run(p.forward, p.forward_pad,
                         {{DNNL_ARG_SRC, &p.src, &p.f_src, xv, false},
                          {DNNL_ARG_WEIGHTS, &p.weights, &p.f_weights, wv, false},
                          {DNNL_ARG_DST, &p.dst, &p.f_dst, y, true}});
    return;
  }
#endif
  detail::im2col_forward(c, x, w, b, y);
}

// dx = the gradient with respect to x (dx may be null: not wanted); dw += and db += the
// gradients with respect to w and b (db may be null: no bias).
template <class T>
void conv2d_backward(host, conv_shape const& c, T const* x, T const* w, T const* dy, T* dx, T* dw, T* db) {
#if defined(REMAT_GEMM_ONEDNN)
  if constexpr (std::is_same_v<T, float>) {
    auto const& p = detail::onednn_conv_for(c, db != nullptr);
    auto* const xv = const_cast<T*>(x);
    auto* const wv = const_cast<T*>(w);
    auto* const dyv = const_cast<T*>(dy);
    if (dx)
      detail::onednn_run(p.backward_data, p.data_pad,
                         {{DNNL_ARG_DIFF_DST, &p.dst, &p.d_dst, dyv, false},
                          {DNNL_ARG_WEIGHTS, &p.weights, &p.d_weights, wv, false},
                          {DNNL_ARG_DIFF_SRC, &p.src, &p.d_src, dx, true}});
    // oneDNN writes the weights' gradient; the model's gradients accumulate, so it goes through
    // a scratch copy.
    std::size_t const nw = c.weight_count(), nb = db ? c.out_channels : 0;
    memory::scratch_buffer<host> tmp((nw + nb) * sizeof(float));
    float* const tw = tmp.as<float>();
    if (db)
      detail::onednn_run(p.backward_weights, p.weights_pad,
                         {{DNNL_ARG_SRC, &p.src, &p.w_src, xv, false},
                          {DNNL_ARG_DIFF_DST, &p.dst, &p.w_dst, dyv, false},
                          {DNNL_ARG_DIFF_WEIGHTS, &p.weights, &p.w_weights, tw, true},
                          {DNNL_ARG_DIFF_BIAS, &p.bias, &p.w_bias, tw + nw, true}});
    else
      detail::onednn_run(p.backward_weights, p.weights_pad,
                         {{DNNL_ARG_SRC, &p.src, &p.w_src, xv, false},
                          {DNNL_ARG_DIFF_DST, &p.dst, &p.w_dst, dyv, false},
                          {DNNL_ARG_DIFF_WEIGHTS, &p.weights, &p.w_weights, tw, true}});
    for (std::size_t i = 0; i < nw; ++i) dw[i] += tw[i];
    for (std::size_t i = 0; i < nb; ++i) db[i] += tw[nw + i];
    return;
  }
#endif
  detail::im2col_backward(c, x, w, dy, dx, dw, db);
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
