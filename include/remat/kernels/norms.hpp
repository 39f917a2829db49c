// LayerNorm and RMSNorm over the last dimension, forward and backward: one row per task on the
// host (a chunk of rows in the backward, which reads x and dy once for dx and the parameter
// gradients both), one thread block per row on the GPU (parameter gradients in row chunks
// there). Sums accumulate in the compute type (fp32 for fp32 and 16-bit data, fp64 for double),
// and the saved statistics are kept in it; parameter gradients G may be wider than the data (fp32
// master gradients of 16-bit activations).
#pragma once

#include "../numeric/math.hpp"
#include "detail/cuda_rows.hpp"
#include "rows.hpp"

#include <cstddef>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

namespace detail {
// v, or v + add[i] rounded to T when there is an add (a Residual's shortcut gradient, added in the
// norm's dx pass as the separate add would: to the rounded dx).
template <class T, class V>
REMAT_HOST_DEVICE T plus_rounded(T v, T const* add, std::size_t i) {
  return add ? from_compute<T>(to_compute<V>(v) + to_compute<V>(add[i])) : v;
}

// A norm's backward on the host in one pass over x and dy: a task takes norm_chunk rows and runs
// row(r, pg, pb) for each, which writes the row's dx (when wanted) and adds the row's terms of
// the parameter gradients to its chunk's column sums pg (and pb: null for RMSNorm), so the
// row's x and dy are read from memory once. Then the chunks' sums are added onto dgamma (and
// dbeta) column by column, chunk after chunk: the same order for every thread count. The
// chunks' sums are kernel scratch (not the model's: memory::scratch_buffer).
inline constexpr std::size_t norm_chunk = 32;
template <class V, class G, class Row>
void norm_backward_host(std::size_t rows, std::size_t w, G* dgamma, G* dbeta, Row const& row) {
  std::size_t const chunks = (rows + norm_chunk - 1) / norm_chunk, sums = dbeta ? 2 : 1;
  if (chunks == 0 || w == 0) return;
  memory::scratch_buffer<host> scratch(chunks * sums * w * sizeof(V));
  V* const part = static_cast<V*>(scratch.get());
  for_each_index(host{}, chunks, rows * w, [=] REMAT_LAMBDA(std::size_t k) {
    V* const pg = part + k * sums * w;
    V* const pb = dbeta ? pg + w : nullptr;
    for (std::size_t c = 0; c < sums * w; ++c) pg[c] = V(0);
    std::size_t const r1 = std::min(rows, (k + 1) * norm_chunk);
    for (std::size_t r = k * norm_chunk; r < r1; ++r) row(r, pg, pb);
  });
  // (a block of columns at a time, the chunks in order for each: every column's additions in the
  // same order as one column at a time, and the loop over the block's columns vectorises, where a
  // column's walk down the chunks, 2 w apart, did not)
  constexpr std::size_t block = column_block<host>;
  for_each_index(host{}, (w + block - 1) / block, chunks * sums * w, [=] REMAT_LAMBDA(std::size_t b) {
    std::size_t const c0 = b * block, n = std::min(w, c0 + block) - c0;
    for (std::size_t j = 0; j < sums; ++j) {
      G* const out = j == 0 ? dgamma : dbeta;
      V acc[block];
      for (std::size_t c = 0; c < n; ++c) acc[c] = to_compute<V>(out[c0 + c]);
      for (std::size_t k = 0; k < chunks; ++k) {
        V const* const pk = part + k * sums * w + j * w + c0;
        for (std::size_t c = 0; c < n; ++c) acc[c] += pk[c];
      }
      for (std::size_t c = 0; c < n; ++c) out[c0 + c] = from_compute<G>(acc[c]);
    }
  });
}
}  // namespace detail

#if REMAT_HAS_CUDA
// The GPU's row passes: one block per row (detail/cuda_rows.hpp), the same formulas as the host's.
namespace detail {

template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    layer_norm_forward_rows(T const* x, T const* gamma, T const* beta, std::size_t rows, std::size_t w, V eps, T* y,
                            V* mean_out, V* rstd_out) {
  for_block_rows(rows, [&](std::size_t r) {
    T const* xr = x + r * w;
    V const mean = block_row_sum<V>(w, [&](std::size_t i) { return to_compute<V>(xr[i]); }) / V(w);
    V const q = block_row_sum<V>(w, [&](std::size_t i) {
      V const d = to_compute<V>(xr[i]) - mean;
      return d * d;
    });
    V const rstd = V(1) / math::sqrt(q / V(w) + eps);
    T* yr = y + r * w;
    for_block_row(w, [&](std::size_t i) {
      yr[i] = from_compute<T>((to_compute<V>(xr[i]) - mean) * rstd * to_compute<V>(gamma[i]) + to_compute<V>(beta[i]));
    });
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[r] = mean;
      if (rstd_out) rstd_out[r] = rstd;
    }
  });
}

template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    layer_norm_backward_rows(T const* x, T const* gamma, V const* mean, V const* rstd, T const* dy, std::size_t rows,
                             std::size_t w, T* dx, T const* add) {
  for_block_rows(rows, [&](std::size_t r) {
    T const* xr = x + r * w;
    T const* dyr = dy + r * w;
    V const m = mean[r], s = rstd[r];
    auto const g = [&](std::size_t i) { return to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]); };
    V const mg = block_row_sum<V>(w, g) / V(w);
    V const mgx = block_row_sum<V>(w, [&](std::size_t i) { return g(i) * ((to_compute<V>(xr[i]) - m) * s); }) / V(w);
    T* dxr = dx + r * w;
    T const* ar = add ? add + r * w : nullptr;
    for_block_row(w, [&](std::size_t i) {
      dxr[i] = plus_rounded<T, V>(from_compute<T>(s * (g(i) - mg - (to_compute<V>(xr[i]) - m) * s * mgx)), ar, i);
    });
  });
}

template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    rms_norm_forward_rows(T const* x, T const* gamma, std::size_t rows, std::size_t w, V eps, T* y, V* rstd_out) {
  for_block_rows(rows, [&](std::size_t r) {
    T const* xr = x + r * w;
    V const q = block_row_sum<V>(w, [&](std::size_t i) {
      V const v = to_compute<V>(xr[i]);
      return v * v;
    });
    V const rstd = V(1) / math::sqrt(q / V(w) + eps);
    T* yr = y + r * w;
    for_block_row(w, [&](std::size_t i) { yr[i] = from_compute<T>(to_compute<V>(xr[i]) * rstd * to_compute<V>(gamma[i])); });
    if (threadIdx.x == 0 && rstd_out) rstd_out[r] = rstd;
  });
}

template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    rms_norm_backward_rows(T const* x, T const* gamma, V const* rstd, T const* dy, std::size_t rows, std::size_t w,
                           T* dx, T const* add) {
  for_block_rows(rows, [&](std::size_t r) {
    T const* xr = x + r * w;
    T const* dyr = dy + r * w;
    V const sgx = block_row_sum<V>(w, [&](std::size_t i) {
      return to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]) * to_compute<V>(xr[i]);
    });
    V const s = rstd[r], k = s * s * s * sgx / V(w);
    T* dxr = dx + r * w;
    T const* ar = add ? add + r * w : nullptr;
    for_block_row(w, [&](std::size_t i) {
      dxr[i] = plus_rounded<T, V>(
          from_compute<T>(s * to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]) - to_compute<V>(xr[i]) * k), ar, i);
    });
  });
}

}  // namespace detail
#endif

// y = (x - mean) * rstd * gamma + beta; saves mean and rstd per row.
template <class T, device_tag D>
void layer_norm_forward(D, T const* x, T const* gamma, T const* beta, std::size_t rows, std::size_t w, double eps,
                        T* y, compute_type_t<T>* mean_out, compute_type_t<T>* rstd_out) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_rows(detail::layer_norm_forward_rows<T, V>, rows, x, gamma, beta, rows, w, V(eps), y, mean_out,
                        rstd_out);
    return;
  }
#endif
  for_each_index(host{}, rows, rows * w, [=] REMAT_LAMBDA(std::size_t r) {
    T const* xr = x + r * w;
    V const mean = detail::row_sum<V>(w, [&](std::size_t i) { return to_compute<V>(xr[i]); }) / V(w);
    V const q = detail::row_sum<V>(w, [&](std::size_t i) {
      V const d = to_compute<V>(xr[i]) - mean;
      return d * d;
    });
    V const rstd = V(1) / math::sqrt(q / V(w) + V(eps));
    T* yr = y + r * w;
    for (std::size_t i = 0; i < w; ++i)
      yr[i] = from_compute<T>((to_compute<V>(xr[i]) - mean) * rstd * to_compute<V>(gamma[i]) + to_compute<V>(beta[i]));
    if (mean_out) mean_out[r] = mean;
    if (rstd_out) rstd_out[r] = rstd;
  });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma; dgamma += sum_r dy * xhat,
// dbeta += sum_r dy. dx may alias dy; a null dx computes the parameter gradients only. With `add`
// (rows x w), dx = round(dx) + add in the same pass: a Residual's shortcut gradient.
template <class T, class G, device_tag D>
void layer_norm_backward(D, T const* x, T const* gamma, compute_type_t<T> const* mean,
                         compute_type_t<T> const* rstd, T const* dy, std::size_t rows, std::size_t w, T* dx,
                         G* dgamma, G* dbeta, T const* add = nullptr) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {  // parameter gradients first: dx may overwrite dy
    auto xhat = [=] REMAT_LAMBDA(std::size_t r, std::size_t i) {
      return (to_compute<V>(x[r * w + i]) - mean[r]) * rstd[r];
    };
    column_sums_of(
        cuda{}, rows, w, [=] REMAT_LAMBDA(std::size_t r, std::size_t c) { return to_compute<V>(dy[r * w + c]) * xhat(r, c); },
        dgamma, true);
    column_sums_of(
        cuda{}, rows, w, [=] REMAT_LAMBDA(std::size_t r, std::size_t c) { return to_compute<V>(dy[r * w + c]); }, dbeta,
        true);
    if (dx)
      detail::launch_rows(detail::layer_norm_backward_rows<T, V>, rows, x, gamma, mean, rstd, dy, rows, w, dx, add);
    return;
  }
#endif
  // One pass (detail::norm_backward_host): each row's parameter terms are added to its chunk's
  // sums before its dx is written (dx may overwrite dy).
  // (the row's statistics in locals: the sums' stores could otherwise overwrite them as far as the
  // compiler knows, which keeps the loops from vectorising)
  detail::norm_backward_host<V>(rows, w, dgamma, dbeta, [=] REMAT_LAMBDA(std::size_t r, V* pg, V* pb) {
    T const* xr = x + r * w;
    T const* dyr = dy + r * w;
    V const mu = mean[r], s = rstd[r];
    for (std::size_t i = 0; i < w; ++i) {
      V const d = to_compute<V>(dyr[i]);
      pg[i] += d * ((to_compute<V>(xr[i]) - mu) * s);
      pb[i] += d;
    }
    if (!dx) return;
    // (both sums in one loop over the row, each as row_sum adds it)
    auto const [sg, sgx] = detail::row_sum_pair<V>(w, [&](std::size_t i) {
      V const g = to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]);
      return detail::value_pair<V>{g, g * ((to_compute<V>(xr[i]) - mu) * s)};
    });
    V const mg = sg / V(w), mgx = sgx / V(w);
    T* dxr = dx + r * w;
    if (add) {
      T const* ar = add + r * w;
      for (std::size_t i = 0; i < w; ++i) {
        V const g = to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]);
        dxr[i] =
            from_compute<T>(to_compute<V>(from_compute<T>(s * (g - mg - ((to_compute<V>(xr[i]) - mu) * s) * mgx))) +
                            to_compute<V>(ar[i]));
      }
    } else {
      for (std::size_t i = 0; i < w; ++i) {
        V const g = to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]);
        dxr[i] = from_compute<T>(s * (g - mg - ((to_compute<V>(xr[i]) - mu) * s) * mgx));
      }
    }
  });
}

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd per row.
template <class T, device_tag D>
void rms_norm_forward(D, T const* x, T const* gamma, std::size_t rows, std::size_t w, double eps, T* y,
                      compute_type_t<T>* rstd_out) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_rows(detail::rms_norm_forward_rows<T, V>, rows, x, gamma, rows, w, V(eps), y, rstd_out);
    return;
  }
#endif
  for_each_index(host{}, rows, rows * w, [=] REMAT_LAMBDA(std::size_t r) {
    T const* xr = x + r * w;
    V const q = detail::row_sum<V>(w, [&](std::size_t i) {
      V const v = to_compute<V>(xr[i]);
      return v * v;
    });
    V const rstd = V(1) / math::sqrt(q / V(w) + V(eps));
    T* yr = y + r * w;
    for (std::size_t i = 0; i < w; ++i) yr[i] = from_compute<T>(to_compute<V>(xr[i]) * rstd * to_compute<V>(gamma[i]));
    if (rstd_out) rstd_out[r] = rstd;
  });
}

// dx = rstd * g - x * rstd^3 * mean(g * x) with g = dy * gamma; dgamma += sum_r dy * x * rstd.
// A null dx computes dgamma only; `add` as for layer_norm_backward.
template <class T, class G, device_tag D>
void rms_norm_backward(D, T const* x, T const* gamma, compute_type_t<T> const* rstd, T const* dy, std::size_t rows,
                       std::size_t w, T* dx, G* dgamma, T const* add = nullptr) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    column_sums_of(
        cuda{}, rows, w,
        [=] REMAT_LAMBDA(std::size_t r, std::size_t c) {
          return to_compute<V>(dy[r * w + c]) * to_compute<V>(x[r * w + c]) * rstd[r];
        },
        dgamma, true);
    if (dx) detail::launch_rows(detail::rms_norm_backward_rows<T, V>, rows, x, gamma, rstd, dy, rows, w, dx, add);
    return;
  }
#endif
  detail::norm_backward_host<V>(rows, w, dgamma, static_cast<G*>(nullptr), [=] REMAT_LAMBDA(std::size_t r, V* pg, V*) {
    T const* xr = x + r * w;
    T const* dyr = dy + r * w;
    V const s = rstd[r];
    for (std::size_t i = 0; i < w; ++i) pg[i] += to_compute<V>(dyr[i]) * to_compute<V>(xr[i]) * s;
    if (!dx) return;
    V const sgx = detail::row_sum<V>(
        w, [&](std::size_t i) { return to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]) * to_compute<V>(xr[i]); });
    V const k = s * s * s * sgx / V(w);
    T* dxr = dx + r * w;
    if (add) {
      T const* ar = add + r * w;
      for (std::size_t i = 0; i < w; ++i)
        dxr[i] = from_compute<T>(to_compute<V>(from_compute<T>(s * to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]) -
                                                               to_compute<V>(xr[i]) * k)) +
                                 to_compute<V>(ar[i]));
    } else {
      for (std::size_t i = 0; i < w; ++i)
        dxr[i] = from_compute<T>(s * to_compute<V>(dyr[i]) * to_compute<V>(gamma[i]) - to_compute<V>(xr[i]) * k);
    }
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
