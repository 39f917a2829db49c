// Softmax cross-entropy over the last dimension with integer labels, in the compute type and
// numerically stable (the row maximum is subtracted before exp). Writes the per-row loss and the
// gradient of `scale * sum of row losses` with respect to the logits. A row per task on the host,
// a thread block per row on the GPU.
#pragma once

#include "../numeric/math.hpp"
#include "detail/cuda_rows.hpp"
#include "rows.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace REMAT_NAMESPACE {
namespace kernels {

#if REMAT_HAS_CUDA
namespace detail {

// The GPU's rows: one block per row (detail/cuda_rows.hpp), the host's formulas.
template <class T, class V>
__global__ void __launch_bounds__(row_threads)
    softmax_cross_entropy_rows(T const* logits, std::int32_t const* labels, std::size_t rows, std::size_t classes,
                               V scale, V* row_loss, T* dlogits) {
  for_block_rows(rows, [&](std::size_t r) {
    T const* z = logits + r * classes;
    auto const zc = [&](std::size_t c) { return to_compute<V>(z[c]); };
    V const m = block_row_max<V>(classes, zc(0), zc);
    V const s = block_row_sum<V>(classes, [&](std::size_t c) { return math::exp(zc(c) - m); });
    std::size_t const y = std::size_t(labels[r]);
    if (threadIdx.x == 0) row_loss[r] = math::log(s) - (zc(y) - m);
    if (dlogits) {
      T* d = dlogits + r * classes;
      for_block_row(classes, [&](std::size_t c) {
        V const p = math::exp(zc(c) - m) / s;
        d[c] = from_compute<T>((p - (c == y ? V(1) : V(0))) * scale);
      });
    }
  });
}

}  // namespace detail
#endif

// Softmax cross-entropy of `rows` rows of `classes` logits against their labels: each row's loss
// in row_loss (in the compute type), and, when dlogits is given, scale * (softmax - one_hot) there.
template <class T, device_tag D>
void softmax_cross_entropy(D, T const* logits, std::int32_t const* labels, std::size_t rows, std::size_t classes,
                           double scale, compute_type_t<T>* row_loss, T* dlogits) {
  using V = compute_type_t<T>;
#if REMAT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    detail::launch_rows(detail::softmax_cross_entropy_rows<T, V>, rows, logits, labels, rows, classes, V(scale),
                        row_loss, dlogits);
    return;
  }
#endif
  for_each_index(host{}, rows, rows * classes, [=] REMAT_LAMBDA(std::size_t r) {
    T const* z = logits + r * classes;
    V const m = detail::row_max<V>(classes, [&](std::size_t c) { return to_compute<V>(z[c]); });
    V const s = detail::row_sum<V>(classes, [&](std::size_t c) { return math::exp(to_compute<V>(z[c]) - m); });
    V const log_s = math::log(s);
    std::size_t const y = std::size_t(labels[r]);
    row_loss[r] = log_s - (to_compute<V>(z[y]) - m);
    if (dlogits) {
      T* d = dlogits + r * classes;
      for (std::size_t c = 0; c < classes; ++c) {
        V const p = math::exp(to_compute<V>(z[c]) - m) / s;
        d[c] = from_compute<T>((p - (c == y ? V(1) : V(0))) * V(scale));
      }
    }
  });
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
