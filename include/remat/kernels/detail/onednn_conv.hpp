// The host's convolutions through oneDNN (kernels/conv.hpp decides which come here): the three
// primitives of a shape (forward, backward data, backward weights), made once and cached, each in
// the layouts it chose; the caller's NCHW arguments reordered into them and the outputs back per
// call, through buffers of remat's allocator (dy once for both backward primitives). Host C++
// only, as detail/onednn.hpp.
#pragma once

#include "../../config.hpp"

#if defined(REMAT_HAS_ONEDNN) && !defined(__CUDACC__)
#include "../../error.hpp"
#include "../../memory/allocator.hpp"
#include "conv_shape.hpp"
#include "onednn.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace REMAT_NAMESPACE {
namespace kernels {
namespace detail {

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
  static std::map<conv_key, std::unique_ptr<onednn_conv>> cache;  // (null: not supported)
  conv_key const key{c.batch,  c.in_channels, c.height, c.width, c.out_channels,
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
#if DNNL_VERSION_MAJOR >= 3
    dnnl::convolution_forward::primitive_desc fwd(eng, dnnl::prop_kind::forward_training, alg, any_src, any_wei, bia,
                                                  any_dst, strides, left, right, attr);
    dnnl::convolution_backward_data::primitive_desc bwd_data(eng, alg, any_src, any_wei, any_dst, strides, left, right,
                                                             fwd, attr);
    dnnl::convolution_backward_weights::primitive_desc bwd_weights(eng, alg, any_src, any_dwei, dbia, any_dst, strides,
                                                                   left, right, fwd, attr);
#else
    dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any_src, any_wei, bia, any_dst,
                                        strides, left, right),
        attr, eng);
    dnnl::convolution_backward_data::primitive_desc bwd_data(
        dnnl::convolution_backward_data::desc(alg, any_src, any_wei, any_dst, strides, left, right), attr, eng, fwd);
    dnnl::convolution_backward_weights::primitive_desc bwd_weights(
        dnnl::convolution_backward_weights::desc(alg, any_src, any_dwei, dbia, any_dst, strides, left, right), attr,
        eng, fwd);
#endif
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
  memory::scratch_buffer<host> pad(onednn_pad_bytes(pad_bytes));
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

}  // namespace detail
}  // namespace kernels
}  // namespace REMAT_NAMESPACE
#endif
