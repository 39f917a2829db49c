// Image kernels beside the convolution (kernels/conv.hpp): batch and group normalisation, max and
// average pooling, nearest-neighbour upsampling. NCHW rows as there: image n is row n, its planes
// channel by channel.
//
// Memory-bound passes over planes, written once for both devices as loops over an index
// (for_each_index: OpenMP threads on the host, one GPU thread per index on CUDA): oneDNN's and
// cuDNN's own versions would want their own layouts to pay off, and these are a few lines each
// whose sums run in a fixed order (per channel or per group, over the batch in order), so the
// results do not depend on the thread count and every storage policy stays bit for bit.
// Statistics accumulate in the compute type (fp32 for fp32, fp64 for double). On the GPU the
// per-channel passes (batch normalisation's statistics and gradients) are one thread per channel:
// correct, not tuned (a block per channel is the next step).
#pragma once

#include "../numeric/math.hpp"
#include "../numeric/compute.hpp"
#include "rows.hpp"

#include <cstddef>

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
REMAT_INLINE_HOST_DEVICE V channel_sum(planes const& p, std::size_t c, F&& f) {
  V s = 0;
  for (std::size_t n = 0; n < p.batch; ++n) {
    std::size_t const base = n * p.image() + c * p.plane;
    s += row_sum<V>(p.plane, [&](std::size_t i) { return f(base + i); });
  }
  return s;
}
// NaN is the only value unequal to itself (std::isnan is not a device function).
template <class T>
REMAT_INLINE_HOST_DEVICE bool is_nan(T v) {
  return !(v == v);
}
}  // namespace detail

// ---- batch normalisation (per channel, over the batch and the plane)

// Training: the batch's mean and rstd = 1 / sqrt(biased variance + eps) per channel into
// mean/rstd (and the biased variance into var), y = (x - mean) * rstd * gamma + beta.
template <class T, device_tag D>
void batch_norm_forward_training(D, planes const& p, T const* x, T const* gamma, T const* beta, double eps, T* y,
                                 compute_type_t<T>* mean, compute_type_t<T>* rstd, compute_type_t<T>* var) {
  using V = compute_type_t<T>;
  V const count = V(p.batch * p.plane);
  for_each_index(D{}, p.channels, p.size(), [=] REMAT_LAMBDA(std::size_t c) {
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
  for_each_index(D{}, p.batch * p.channels, p.size(), [=] REMAT_LAMBDA(std::size_t k) {
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
  V const count = V(p.batch * p.plane);
  for_each_index(D{}, p.channels, 2 * p.size(), [=] REMAT_LAMBDA(std::size_t c) {
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
  std::size_t const per = p.channels / groups, span = per * p.plane;
  for_each_index(D{}, p.batch * groups, p.size(), [=] REMAT_LAMBDA(std::size_t k) {
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
  std::size_t const per = p.channels / groups, span = per * p.plane;
  for_each_index(D{}, p.channels, p.size(), [=] REMAT_LAMBDA(std::size_t c) {
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
  for_each_index(D{}, p.batch * groups, 2 * p.size(), [=] REMAT_LAMBDA(std::size_t k) {
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

// ---- pooling and upsampling (per plane)

// The window geometry of a pooling layer: square kernel, stride, no padding.
struct pool_shape {
  std::size_t height;  // the input plane's height
  std::size_t width;   // the input plane's width
  std::size_t kernel;  // the square window's side
  std::size_t stride;  // the step between windows
  constexpr std::size_t out_height() const { return (height - kernel) / stride + 1; }  // the output plane's height
  constexpr std::size_t out_width() const { return (width - kernel) / stride + 1; }  // the output plane's width
};

// y = the largest value of each window (a NaN wins, as in PyTorch).
template <class T, device_tag D>
void max_pool_forward(D, std::size_t planes_count, pool_shape const& s, T const* x, T* y) {
  std::size_t const ho = s.out_height(), wo = s.out_width();
  for_each_index(D{}, planes_count, planes_count * s.height * s.width, [=] REMAT_LAMBDA(std::size_t k) {
    T const* xp = x + k * s.height * s.width;
    T* yp = y + k * ho * wo;
    for (std::size_t oi = 0; oi < ho; ++oi)
      for (std::size_t oj = 0; oj < wo; ++oj) {
        T const* w0 = xp + oi * s.stride * s.width + oj * s.stride;
        T best = w0[0];
        for (std::size_t a = 0; a < s.kernel; ++a)
          for (std::size_t b = 0; b < s.kernel; ++b) {
            T const v = w0[a * s.width + b];
            if (v > best || detail::is_nan(v)) best = v;
            if (detail::is_nan(best)) break;
          }
        yp[oi * wo + oj] = best;
      }
  });
}

// dx = each window's dy at the window's first largest value (in row-major order), summed where
// windows overlap.
template <class T, device_tag D>
void max_pool_backward(D, std::size_t planes_count, pool_shape const& s, T const* x, T const* dy, T* dx) {
  std::size_t const ho = s.out_height(), wo = s.out_width(), hw = s.height * s.width;
  for_each_index(D{}, planes_count, planes_count * hw, [=] REMAT_LAMBDA(std::size_t k) {
    T const* xp = x + k * hw;
    T* dxp = dx + k * hw;
    for (std::size_t i = 0; i < hw; ++i) dxp[i] = T(0);
    for (std::size_t oi = 0; oi < ho; ++oi)
      for (std::size_t oj = 0; oj < wo; ++oj) {
        std::size_t const w0 = oi * s.stride * s.width + oj * s.stride;
        std::size_t at = w0;
        for (std::size_t a = 0; a < s.kernel; ++a)
          for (std::size_t b = 0; b < s.kernel; ++b) {
            std::size_t const i = w0 + a * s.width + b;
            if (xp[i] > xp[at] || (detail::is_nan(xp[i]) && !detail::is_nan(xp[at]))) at = i;
          }
        dxp[at] += dy[k * ho * wo + oi * wo + oj];
      }
  });
}

// y = the mean of each window.
template <class T, device_tag D>
void avg_pool_forward(D, std::size_t planes_count, pool_shape const& s, T const* x, T* y) {
  using V = compute_type_t<T>;
  std::size_t const ho = s.out_height(), wo = s.out_width();
  V const inv = V(1) / V(s.kernel * s.kernel);
  for_each_index(D{}, planes_count, planes_count * s.height * s.width, [=] REMAT_LAMBDA(std::size_t k) {
    T const* xp = x + k * s.height * s.width;
    T* yp = y + k * ho * wo;
    for (std::size_t oi = 0; oi < ho; ++oi)
      for (std::size_t oj = 0; oj < wo; ++oj) {
        T const* w0 = xp + oi * s.stride * s.width + oj * s.stride;
        V sum = 0;
        for (std::size_t a = 0; a < s.kernel; ++a)
          for (std::size_t b = 0; b < s.kernel; ++b) sum += V(w0[a * s.width + b]);
        yp[oi * wo + oj] = T(sum * inv);
      }
  });
}

// dx = dy / kernel² spread over each window, summed where windows overlap.
template <class T, device_tag D>
void avg_pool_backward(D, std::size_t planes_count, pool_shape const& s, T const* dy, T* dx) {
  using V = compute_type_t<T>;
  std::size_t const ho = s.out_height(), wo = s.out_width(), hw = s.height * s.width;
  V const inv = V(1) / V(s.kernel * s.kernel);
  for_each_index(D{}, planes_count, planes_count * hw, [=] REMAT_LAMBDA(std::size_t k) {
    T* dxp = dx + k * hw;
    for (std::size_t i = 0; i < hw; ++i) dxp[i] = T(0);
    for (std::size_t oi = 0; oi < ho; ++oi)
      for (std::size_t oj = 0; oj < wo; ++oj) {
        T const g = T(V(dy[k * ho * wo + oi * wo + oj]) * inv);
        T* w0 = dxp + oi * s.stride * s.width + oj * s.stride;
        for (std::size_t a = 0; a < s.kernel; ++a)
          for (std::size_t b = 0; b < s.kernel; ++b) w0[a * s.width + b] += g;
      }
  });
}

// Nearest-neighbour upsampling by `factor` on both axes: y[i, j] = x[i / factor, j / factor].
template <class T, device_tag D>
void upsample_nearest_forward(D, std::size_t planes_count, std::size_t height, std::size_t width, std::size_t factor,
                              T const* x, T* y) {
  std::size_t const wo = width * factor, ho = height * factor;
  for_each_index(D{}, planes_count, planes_count * ho * wo, [=] REMAT_LAMBDA(std::size_t k) {
    T const* xp = x + k * height * width;
    T* yp = y + k * ho * wo;
    for (std::size_t i = 0; i < ho; ++i)
      for (std::size_t j = 0; j < wo; ++j) yp[i * wo + j] = xp[(i / factor) * width + j / factor];
  });
}

// dx[i, j] = the sum of dy over the factor x factor block that copied x[i, j] (in row-major order).
template <class T, device_tag D>
void upsample_nearest_backward(D, std::size_t planes_count, std::size_t height, std::size_t width, std::size_t factor,
                               T const* dy, T* dx) {
  using V = compute_type_t<T>;
  std::size_t const wo = width * factor, ho = height * factor;
  for_each_index(D{}, planes_count, planes_count * ho * wo, [=] REMAT_LAMBDA(std::size_t k) {
    T const* dyp = dy + k * ho * wo;
    T* dxp = dx + k * height * width;
    for (std::size_t i = 0; i < height; ++i)
      for (std::size_t j = 0; j < width; ++j) {
        V s = 0;
        for (std::size_t a = 0; a < factor; ++a)
          for (std::size_t b = 0; b < factor; ++b) s += V(dyp[(i * factor + a) * wo + j * factor + b]);
        dxp[i * width + j] = T(s);
      }
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
