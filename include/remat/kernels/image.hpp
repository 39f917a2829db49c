// Image kernels beside the convolution (kernels/conv.hpp): batch and group normalisation (pooling
// and upsampling: kernels/pooling.hpp). NCHW rows as there: image n is row n, its planes channel by
// channel.
//
// Memory-bound passes over planes, written once for both devices as loops over an index
// (for_each_index: OpenMP threads on the host, one GPU thread per index on CUDA): oneDNN's and
// cuDNN's own versions would want their own layouts to pay off, and these are a few lines each
// whose sums run in a fixed order (per channel or per group, over the batch in order), so the
// results do not depend on the thread count and every storage policy stays bit for bit.
// Statistics accumulate in the compute type (fp32 for fp32, fp64 for double).
// On the GPU the statistics and parameter gradients take a thread block per channel (batch
// normalisation) or per image and group (group normalisation), sums in an order fixed by the shape
// (detail/cuda_rows.hpp: reproducible, the host's to rounding), and every other pass a thread per
// element, each element computed by the host's formula in the host's order (the same bits). One
// thread per plane or per channel, as on the host, left a 64 x 64 surrogate's batch normalisation
// at 300 us a call on an H100 (bench/conv_algos_cuda.cu, 2026-11-26).
#pragma once

#include "../numeric/math.hpp"
#include "../numeric/compute.hpp"
#include "detail/cuda_rows.hpp"
#include "rows.hpp"

#include <cstddef>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

// The planes of one batch: `batch` images of `channels` planes of `plane` (height x width) values.
struct planes {
  std::size_t batch;     // images
  std::size_t channels;  // planes per image
  std::size_t plane;     // values per plane (height x width)
  constexpr std::size_t image() const { return channels * plane; }  // values per image
  constexpr std::size_t size() const { return batch * image(); }  // values in all
};

namespace detail {
// The sum of f(i) over the `count` values of channel c in every image, images in order (each
// image's plane summed in 16 lanes: row_sum).
template <class V, class F>
REMAT_HOST_DEVICE V channel_sum(planes const& p, std::size_t c, F&& f) {
  V s = 0;
  for (std::size_t n = 0; n < p.batch; ++n) {
    std::size_t const base = n * p.image() + c * p.plane;
    s += row_sum<V>(p.plane, [&](std::size_t i) { return f(base + i); });
  }
  return s;
}
}  // namespace detail

#if REMAT_HAS_CUDA
// The GPU's per-channel and per-group passes: a block per channel (or per image and group), the
// host's formulas.
namespace detail {

// f(i) for every index i of channel c's values (images in order), the block's threads striding
// each plane; block_channel_sum: the sum of f(i) over them, returned to every thread.
template <class F>
__device__ void for_block_channel(planes const& p, std::size_t c, F const& f) {
  for (std::size_t n = 0; n < p.batch; ++n) {
    std::size_t const base = n * p.image() + c * p.plane;
    for_block_row(p.plane, [&](std::size_t i) { f(base + i); });
  }
}
template <class V, class F>
__device__ V block_channel_sum(planes const& p, std::size_t c, F const& f) {
  V s = 0;
  for_block_channel(p, c, [&](std::size_t i) { s += f(i); });
  return block_sum(s);
}

template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    batch_norm_forward_channels(planes p, T const* x, T const* gamma, T const* beta, V eps, T* y, V* mean, V* rstd,
                                V* var) {
  V const count = V(p.batch * p.plane);
  for_block_rows(p.channels, [&](std::size_t c) {
    V const m = block_channel_sum<V>(p, c, [&](std::size_t i) { return V(x[i]); }) / count;
    V const q = block_channel_sum<V>(p, c, [&](std::size_t i) {
      V const d = V(x[i]) - m;
      return d * d;
    });
    V const v = q / count;
    V const r = V(1) / math::sqrt(v + eps);
    V const a = r * V(gamma[c]), b = V(beta[c]) - m * a;
    for_block_channel(p, c, [&](std::size_t i) { y[i] = T(V(x[i]) * a + b); });
    if (threadIdx.x == 0) {
      mean[c] = m;
      rstd[c] = r;
      var[c] = v;
    }
  });
}

// (dx may alias dy: a block reads its channel's dy for both sums, which end synchronised, before
// any of its threads writes dx, and each thread writes only what it reads.)
template <class T, class V, class G>
__global__ void __launch_bounds__(row_threads)
    batch_norm_backward_channels(planes p, T const* x, T const* gamma, V const* mean, V const* rstd, T const* dy,
                                 T* dx, G* dgamma, G* dbeta) {
  V const count = V(p.batch * p.plane);
  for_block_rows(p.channels, [&](std::size_t c) {
    V const m = mean[c], r = rstd[c];
    V const sd = block_channel_sum<V>(p, c, [&](std::size_t i) { return V(dy[i]); });
    V const sdx = block_channel_sum<V>(p, c, [&](std::size_t i) { return V(dy[i]) * ((V(x[i]) - m) * r); });
    if (threadIdx.x == 0) {
      dgamma[c] = G(V(dgamma[c]) + sdx);
      dbeta[c] = G(V(dbeta[c]) + sd);
    }
    if (!dx) return;
    V const k = V(gamma[c]) * r, md = sd / count, mdx = sdx / count;
    for_block_channel(p, c, [&](std::size_t i) {
      V const xh = (V(x[i]) - m) * r;
      dx[i] = T(k * (V(dy[i]) - md - xh * mdx));
    });
  });
}

template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    group_norm_forward_groups(planes p, std::size_t groups, T const* x, T const* gamma, T const* beta, V eps, T* y,
                              V* mean, V* rstd) {
  std::size_t const per = p.channels / groups, span = per * p.plane;
  for_block_rows(p.batch * groups, [&](std::size_t k) {
    std::size_t const n = k / groups, g = k % groups;
    T const* xg = x + n * p.image() + g * span;
    V const m = block_row_sum<V>(span, [&](std::size_t i) { return V(xg[i]); }) / V(span);
    V const q = block_row_sum<V>(span, [&](std::size_t i) {
      V const d = V(xg[i]) - m;
      return d * d;
    });
    V const r = V(1) / math::sqrt(q / V(span) + eps);
    T* yg = y + n * p.image() + g * span;
    for_block_row(span, [&](std::size_t i) {
      std::size_t const c = g * per + i / p.plane;
      V const a = r * V(gamma[c]), b = V(beta[c]) - m * a;
      yg[i] = T(V(xg[i]) * a + b);
    });
    if (threadIdx.x == 0) {
      if (mean) mean[k] = m;
      if (rstd) rstd[k] = r;
    }
  });
}

template <class T, class V, class G>
__global__ void __launch_bounds__(row_threads)
    group_norm_parameter_gradients(planes p, std::size_t groups, T const* x, V const* mean, V const* rstd,
                                   T const* dy, G* dgamma, G* dbeta) {
  std::size_t const per = p.channels / groups;
  for_block_rows(p.channels, [&](std::size_t c) {
    std::size_t const g = c / per;
    V sdx = 0, sd = 0;
    for (std::size_t n = 0; n < p.batch; ++n) {
      V const m = mean[n * groups + g], r = rstd[n * groups + g];
      std::size_t const base = n * p.image() + c * p.plane;
      for_block_row(p.plane, [&](std::size_t i) {
        sdx += V(dy[base + i]) * ((V(x[base + i]) - m) * r);
        sd += V(dy[base + i]);
      });
    }
    sdx = block_sum(sdx);
    sd = block_sum(sd);
    if (threadIdx.x == 0) {
      dgamma[c] = G(V(dgamma[c]) + sdx);
      dbeta[c] = G(V(dbeta[c]) + sd);
    }
  });
}

// (dx may alias dy, as in batch_norm_backward_channels.)
template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    group_norm_input_gradient(planes p, std::size_t groups, T const* x, T const* gamma, V const* mean,
                              V const* rstd, T const* dy, T* dx) {
  std::size_t const per = p.channels / groups, span = per * p.plane;
  for_block_rows(p.batch * groups, [&](std::size_t k) {
    std::size_t const n = k / groups, g = k % groups;
    std::size_t const base = n * p.image() + g * span;
    V const m = mean[k], r = rstd[k];
    auto h = [&](std::size_t i) { return V(dy[base + i]) * V(gamma[g * per + i / p.plane]); };
    V const mh = block_row_sum<V>(span, h) / V(span);
    V const mhx = block_row_sum<V>(span, [&](std::size_t i) { return h(i) * ((V(x[base + i]) - m) * r); }) / V(span);
    for_block_row(span, [&](std::size_t i) {
      V const xh = (V(x[base + i]) - m) * r;
      dx[base + i] = T(r * (h(i) - mh - xh * mhx));
    });
  });
}

}  // namespace detail
#endif

// ---- batch normalisation (per channel, over the batch and the plane)

// Training: the batch's mean and rstd = 1 / sqrt(biased variance + eps) per channel into
// mean/rstd (and the biased variance into var), y = (x - mean) * rstd * gamma + beta.
template <class T, device_tag D>
void batch_norm_forward_training(D, planes const& p, T const* x, T const* gamma, T const* beta, double eps, T* y,
                                 compute_type_t<T>* mean, compute_type_t<T>* rstd, compute_type_t<T>* var) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_rows(detail::batch_norm_forward_channels<T, V>, p.channels, p, x, gamma, beta, V(eps), y, mean,
                        rstd, var);
    return;
  }
#endif
  V const count = V(p.batch * p.plane);
  for_each_index(host{}, p.channels, p.size(), [=] REMAT_LAMBDA(std::size_t c) {
    V const m = detail::channel_sum<V>(p, c, [&](std::size_t i) { return V(x[i]); }) / count;
    V const q = detail::channel_sum<V>(p, c, [&](std::size_t i) {
      V const d = V(x[i]) - m;
      return d * d;
    });
    V const v = q / count;
    V const r = V(1) / math::sqrt(v + V(eps));
    V const a = r * V(gamma[c]), b = V(beta[c]) - m * a;
    for (std::size_t n = 0; n < p.batch; ++n) {
      std::size_t const base = n * p.image() + c * p.plane;
      for (std::size_t i = 0; i < p.plane; ++i) y[base + i] = T(V(x[base + i]) * a + b);
    }
    mean[c] = m;
    rstd[c] = r;
    var[c] = v;
  });
}

// Inference: y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta.
template <class T, class B, device_tag D>
void batch_norm_forward_inference(D, planes const& p, T const* x, T const* gamma, T const* beta, B const* running_mean,
                                  B const* running_var, double eps, T* y) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {  // a thread per element
    for_each_index(cuda{}, p.size(), p.size(), [=] REMAT_LAMBDA(std::size_t e) {
      std::size_t const c = e / p.plane % p.channels;
      V const a = V(gamma[c]) / math::sqrt(V(running_var[c]) + V(eps)), b = V(beta[c]) - V(running_mean[c]) * a;
      y[e] = T(V(x[e]) * a + b);
    });
    return;
  }
#endif
  for_each_index(host{}, p.batch * p.channels, p.size(), [=] REMAT_LAMBDA(std::size_t k) {
    std::size_t const c = k % p.channels;
    V const a = V(gamma[c]) / math::sqrt(V(running_var[c]) + V(eps)), b = V(beta[c]) - V(running_mean[c]) * a;
    T const* xr = x + k * p.plane;
    T* yr = y + k * p.plane;
    for (std::size_t i = 0; i < p.plane; ++i) yr[i] = T(V(xr[i]) * a + b);
  });
}

// running = (1 - momentum) running + momentum batch, the variance unbiased (PyTorch's update).
template <class B, class V, device_tag D>
void batch_norm_update_running(D, std::size_t channels, std::size_t count, double momentum, V const* mean, V const* var,
                               B* running_mean, B* running_var) {
  double const unbias = count > 1 ? double(count) / double(count - 1) : 1.0;
  for_each_index(D{}, channels, channels, [=] REMAT_LAMBDA(std::size_t c) {
    running_mean[c] = B((1 - momentum) * double(running_mean[c]) + momentum * double(mean[c]));
    running_var[c] = B((1 - momentum) * double(running_var[c]) + momentum * double(var[c]) * unbias);
  });
}

// With xhat = (x - mean) * rstd: dgamma += sum dy * xhat, dbeta += sum dy per channel, and
// dx = gamma * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)) (null dx: parameter gradients only).
// dx may alias dy.
template <class T, class G, device_tag D>
void batch_norm_backward(D, planes const& p, T const* x, T const* gamma, compute_type_t<T> const* mean,
                         compute_type_t<T> const* rstd, T const* dy, T* dx, G* dgamma, G* dbeta) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_rows(detail::batch_norm_backward_channels<T, V, G>, p.channels, p, x, gamma, mean, rstd, dy, dx,
                        dgamma, dbeta);
    return;
  }
#endif
  V const count = V(p.batch * p.plane);
  for_each_index(host{}, p.channels, 2 * p.size(), [=] REMAT_LAMBDA(std::size_t c) {
    V const m = mean[c], r = rstd[c];
    V const sd = detail::channel_sum<V>(p, c, [&](std::size_t i) { return V(dy[i]); });
    V const sdx = detail::channel_sum<V>(p, c, [&](std::size_t i) { return V(dy[i]) * ((V(x[i]) - m) * r); });
    dgamma[c] = G(V(dgamma[c]) + sdx);
    dbeta[c] = G(V(dbeta[c]) + sd);
    if (!dx) return;
    V const k = V(gamma[c]) * r, md = sd / count, mdx = sdx / count;
    for (std::size_t n = 0; n < p.batch; ++n) {
      std::size_t const base = n * p.image() + c * p.plane;
      for (std::size_t i = 0; i < p.plane; ++i) {
        V const xh = (V(x[base + i]) - m) * r;
        dx[base + i] = T(k * (V(dy[base + i]) - md - xh * mdx));
      }
    }
  });
}

// ---- group normalisation (per image and group of channels; affine per channel)

// mean and rstd per (image, group), `groups` per image, in mean/rstd[n * groups + g].
template <class T, device_tag D>
void group_norm_forward(D, planes const& p, std::size_t groups, T const* x, T const* gamma, T const* beta, double eps,
                        T* y, compute_type_t<T>* mean, compute_type_t<T>* rstd) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_rows(detail::group_norm_forward_groups<T, V>, p.batch * groups, p, groups, x, gamma, beta, V(eps),
                        y, mean, rstd);
    return;
  }
#endif
  std::size_t const per = p.channels / groups, span = per * p.plane;
  for_each_index(host{}, p.batch * groups, p.size(), [=] REMAT_LAMBDA(std::size_t k) {
    std::size_t const n = k / groups, g = k % groups;
    T const* xg = x + n * p.image() + g * span;
    V const m = detail::row_sum<V>(span, [&](std::size_t i) { return V(xg[i]); }) / V(span);
    V const q = detail::row_sum<V>(span, [&](std::size_t i) {
      V const d = V(xg[i]) - m;
      return d * d;
    });
    V const r = V(1) / math::sqrt(q / V(span) + V(eps));
    T* yg = y + n * p.image() + g * span;
    for (std::size_t j = 0; j < per; ++j) {
      std::size_t const c = g * per + j;
      V const a = r * V(gamma[c]), b = V(beta[c]) - m * a;
      for (std::size_t i = 0; i < p.plane; ++i) yg[j * p.plane + i] = T(V(xg[j * p.plane + i]) * a + b);
    }
    if (mean) mean[k] = m;
    if (rstd) rstd[k] = r;
  });
}

// dgamma += sum dy * xhat, dbeta += sum dy per channel (images in order); per (image, group) with
// h = dy * gamma: dx = rstd * (h - mean(h) - xhat * mean(h * xhat)). dx may alias dy (the
// parameter gradients are done first).
template <class T, class G, device_tag D>
void group_norm_backward(D, planes const& p, std::size_t groups, T const* x, T const* gamma,
                         compute_type_t<T> const* mean, compute_type_t<T> const* rstd, T const* dy, T* dx, G* dgamma,
                         G* dbeta) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {  // parameter gradients first: dx may overwrite dy
    detail::launch_rows(detail::group_norm_parameter_gradients<T, V, G>, p.channels, p, groups, x, mean, rstd, dy,
                        dgamma, dbeta);
    if (dx)
      detail::launch_rows(detail::group_norm_input_gradient<T, V>, p.batch * groups, p, groups, x, gamma, mean, rstd,
                          dy, dx);
    return;
  }
#endif
  std::size_t const per = p.channels / groups, span = per * p.plane;
  for_each_index(host{}, p.channels, p.size(), [=] REMAT_LAMBDA(std::size_t c) {
    std::size_t const g = c / per;
    V sdx = 0, sd = 0;
    for (std::size_t n = 0; n < p.batch; ++n) {
      V const m = mean[n * groups + g], r = rstd[n * groups + g];
      std::size_t const base = n * p.image() + c * p.plane;
      sdx += detail::row_sum<V>(p.plane, [&](std::size_t i) { return V(dy[base + i]) * ((V(x[base + i]) - m) * r); });
      sd += detail::row_sum<V>(p.plane, [&](std::size_t i) { return V(dy[base + i]); });
    }
    dgamma[c] = G(V(dgamma[c]) + sdx);
    dbeta[c] = G(V(dbeta[c]) + sd);
  });
  if (!dx) return;
  for_each_index(host{}, p.batch * groups, 2 * p.size(), [=] REMAT_LAMBDA(std::size_t k) {
    std::size_t const n = k / groups, g = k % groups;
    std::size_t const base = n * p.image() + g * span;
    V const m = mean[k], r = rstd[k];
    auto h = [&](std::size_t i) { return V(dy[base + i]) * V(gamma[g * per + i / p.plane]); };
    V const mh = detail::row_sum<V>(span, h) / V(span);
    V const mhx = detail::row_sum<V>(span, [&](std::size_t i) { return h(i) * ((V(x[base + i]) - m) * r); }) / V(span);
    for (std::size_t i = 0; i < span; ++i) {
      V const xh = (V(x[base + i]) - m) * r;
      dx[base + i] = T(r * (h(i) - mh - xh * mhx));
    }
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
