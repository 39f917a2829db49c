// Pooling and upsampling beside the convolution (kernels/conv.hpp): max and average pooling,
// nearest-neighbour upsampling, over NCHW planes (planes_count = images x channels).
//
// On the host a task per plane; on the GPU a thread per output (forward) or per input (backward:
// the windows that hold it, in the order the host adds them), so both devices give the same bits.
#pragma once

#include "../numeric/compute.hpp"
#include "rows.hpp"

#include <cstddef>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

namespace detail {
// NaN is the only value unequal to itself (std::isnan is not a device function).
template <class T>
REMAT_HOST_DEVICE bool is_nan(T v) {
  return !(v == v);
}

// The windows (oi, oj) of a pooling that hold input position (row, col): oi in [first, last] on
// each axis (empty where first > last), in the order the host adds them.
struct window_range {
  std::size_t first, last;
};
REMAT_HOST_DEVICE window_range windows_holding(std::size_t at, std::size_t kernel, std::size_t stride,
                                               std::size_t count) {
  std::size_t const first = at + 1 > kernel ? (at + 1 - kernel + stride - 1) / stride : 0;
  std::size_t const last = at / stride < count - 1 ? at / stride : count - 1;
  return {first, last};
}

// The largest value of the window at w0 (rows `width` apart; a NaN wins).
template <class T>
REMAT_HOST_DEVICE T window_max(T const* w0, std::size_t width, std::size_t kernel) {
  T best = w0[0];
  for (std::size_t a = 0; a < kernel; ++a)
    for (std::size_t b = 0; b < kernel; ++b) {
      T const v = w0[a * width + b];
      if (v > best || is_nan(v)) best = v;
      if (is_nan(best)) return best;
    }
  return best;
}
// The index in the plane xp of the first largest value of the window starting at w0.
template <class T>
REMAT_HOST_DEVICE std::size_t window_argmax(T const* xp, std::size_t w0, std::size_t width, std::size_t kernel) {
  std::size_t at = w0;
  for (std::size_t a = 0; a < kernel; ++a)
    for (std::size_t b = 0; b < kernel; ++b) {
      std::size_t const i = w0 + a * width + b;
      if (xp[i] > xp[at] || (is_nan(xp[i]) && !is_nan(xp[at]))) at = i;
    }
  return at;
}
// The sum of the window at w0, in the compute type V, in row-major order.
template <class V, class T>
REMAT_HOST_DEVICE V window_sum(T const* w0, std::size_t width, std::size_t kernel) {
  V sum = 0;
  for (std::size_t a = 0; a < kernel; ++a)
    for (std::size_t b = 0; b < kernel; ++b) sum += V(w0[a * width + b]);
  return sum;
}

}  // namespace detail

// The window geometry of a pooling layer: square kernel, stride, no padding.
struct pool_shape {
  std::size_t height;  // the input plane's height
  std::size_t width;   // the input plane's width
  std::size_t kernel;  // the square window's side
  std::size_t stride;  // the step between windows
  constexpr std::size_t out_height() const { return (height - kernel) / stride + 1; }  // the output plane's height
  constexpr std::size_t out_width() const { return (width - kernel) / stride + 1; }  // the output plane's width
};

// y[window] = f(the window's first element) for every window of every plane: on the host a task per
// plane, on the GPU a thread per window.
template <class T, class F, device_tag D>
void for_each_window(D, std::size_t planes_count, pool_shape const& s, T const* x, T* y, F const& f) {
  std::size_t const ho = s.out_height(), wo = s.out_width(), hw = s.height * s.width;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    std::size_t const n = planes_count * ho * wo;
    for_each_index(cuda{}, n, n, [=] REMAT_LAMBDA(std::size_t e) {
      std::size_t const k = e / (ho * wo), oi = e / wo % ho, oj = e % wo;
      y[e] = f(x + k * hw + oi * s.stride * s.width + oj * s.stride);
    });
    return;
  }
#endif
  for_each_index(host{}, planes_count, planes_count * hw, [=] REMAT_LAMBDA(std::size_t k) {
    for (std::size_t oi = 0; oi < ho; ++oi)
      for (std::size_t oj = 0; oj < wo; ++oj)
        y[k * ho * wo + oi * wo + oj] = f(x + k * hw + oi * s.stride * s.width + oj * s.stride);
  });
}

// y = the largest value of each window (a NaN wins, as in PyTorch).
template <class T, device_tag D>
void max_pool_forward(D, std::size_t planes_count, pool_shape const& s, T const* x, T* y) {
  std::size_t const width = s.width, kernel = s.kernel;
  for_each_window(D{}, planes_count, s, x, y,
                  [=] REMAT_LAMBDA(T const* w0) { return detail::window_max(w0, width, kernel); });
}

// dx = each window's dy at the window's first largest value (in row-major order), summed where
// windows overlap.
template <class T, device_tag D>
void max_pool_backward(D, std::size_t planes_count, pool_shape const& s, T const* x, T const* dy, T* dx) {
  std::size_t const ho = s.out_height(), wo = s.out_width(), hw = s.height * s.width;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {  // a thread per input: its windows in the host's order
    for_each_index(cuda{}, planes_count * hw, planes_count * hw, [=] REMAT_LAMBDA(std::size_t e) {
      std::size_t const k = e / hw, i = e % hw;
      T const* xp = x + k * hw;
      auto const rows = detail::windows_holding(i / s.width, s.kernel, s.stride, ho);
      auto const cols = detail::windows_holding(i % s.width, s.kernel, s.stride, wo);
      T acc = T(0);
      for (std::size_t oi = rows.first; oi <= rows.last; ++oi)
        for (std::size_t oj = cols.first; oj <= cols.last; ++oj)
          if (detail::window_argmax(xp, oi * s.stride * s.width + oj * s.stride, s.width, s.kernel) == i)
            acc += dy[k * ho * wo + oi * wo + oj];
      dx[e] = acc;
    });
    return;
  }
#endif
  for_each_index(host{}, planes_count, planes_count * hw, [=] REMAT_LAMBDA(std::size_t k) {
    T const* xp = x + k * hw;
    T* dxp = dx + k * hw;
    for (std::size_t i = 0; i < hw; ++i) dxp[i] = T(0);
    for (std::size_t oi = 0; oi < ho; ++oi)
      for (std::size_t oj = 0; oj < wo; ++oj)
        dxp[detail::window_argmax(xp, oi * s.stride * s.width + oj * s.stride, s.width, s.kernel)] +=
            dy[k * ho * wo + oi * wo + oj];
  });
}

// y = the mean of each window.
template <class T, device_tag D>
void avg_pool_forward(D, std::size_t planes_count, pool_shape const& s, T const* x, T* y) {
  using V = compute_type_t<T>;
  V const inv = V(1) / V(s.kernel * s.kernel);
  std::size_t const width = s.width, kernel = s.kernel;
  for_each_window(D{}, planes_count, s, x, y,
                  [=] REMAT_LAMBDA(T const* w0) { return T(detail::window_sum<V>(w0, width, kernel) * inv); });
}

// dx = dy / kernel² spread over each window, summed where windows overlap.
template <class T, device_tag D>
void avg_pool_backward(D, std::size_t planes_count, pool_shape const& s, T const* dy, T* dx) {
  using V = compute_type_t<T>;
  std::size_t const ho = s.out_height(), wo = s.out_width(), hw = s.height * s.width;
  V const inv = V(1) / V(s.kernel * s.kernel);
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {  // a thread per input: its windows in the host's order
    for_each_index(cuda{}, planes_count * hw, planes_count * hw, [=] REMAT_LAMBDA(std::size_t e) {
      std::size_t const k = e / hw, i = e % hw;
      auto const rows = detail::windows_holding(i / s.width, s.kernel, s.stride, ho);
      auto const cols = detail::windows_holding(i % s.width, s.kernel, s.stride, wo);
      T acc = T(0);
      for (std::size_t oi = rows.first; oi <= rows.last; ++oi)
        for (std::size_t oj = cols.first; oj <= cols.last; ++oj) acc += T(V(dy[k * ho * wo + oi * wo + oj]) * inv);
      dx[e] = acc;
    });
    return;
  }
#endif
  for_each_index(host{}, planes_count, planes_count * hw, [=] REMAT_LAMBDA(std::size_t k) {
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
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {  // a thread per output
    std::size_t const n = planes_count * ho * wo;
    for_each_index(cuda{}, n, n, [=] REMAT_LAMBDA(std::size_t e) {
      std::size_t const k = e / (ho * wo), i = e / wo % ho, j = e % wo;
      y[e] = x[k * height * width + (i / factor) * width + j / factor];
    });
    return;
  }
#endif
  for_each_index(host{}, planes_count, planes_count * ho * wo, [=] REMAT_LAMBDA(std::size_t k) {
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
  // The sum over each factor x factor window of dy: a window pooling of stride factor.
  std::size_t const wo = width * factor;
  for_each_window(D{}, planes_count, pool_shape{height * factor, wo, factor, factor}, dy, dx,
                  [=] REMAT_LAMBDA(T const* w0) { return T(detail::window_sum<V>(w0, wo, factor)); });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
