// What runs in the pass right after a product: the bias and a residual added in one pass,
// y = round(round(z + b) + r) (each sum rounded to the element type, as the bias pass and then
// the residual add would round them one after the other), so fusing the two changes no bit.
#pragma once

#include "../numeric/compute.hpp"
#include "pointwise.hpp"

#include <cstddef>

namespace REMAT_NAMESPACE {
namespace kernels {

namespace detail {

// Element i (column c) of the fused bias and residual pass.
template <class T>
struct bias_residual_fn {
  T const* z;     // the product
  T const* bias;  // one per column, or null
  T const* r;     // the residual
  REMAT_HOST_DEVICE T operator()(std::size_t i, std::size_t c) const {
    using V = compute_type_t<T>;
    V zb = to_compute<V>(z[i]);
    if (bias) zb = to_compute<V>(from_compute<T>(zb + to_compute<V>(bias[c])));
    return from_compute<T>(zb + to_compute<V>(r[i]));
  }
};

}  // namespace detail

// y = (z + bias) + r over a row-major rows x cols matrix (bias: one value per column, or null for
// y = z + r), each sum rounded to T. y may be z or r.
template <class T, class D>
  requires is_device_v<D>
void bias_residual(D, std::size_t rows, std::size_t cols, T const* z, T const* bias, T const* r, T* y) {
  transform_rows(D{}, rows, cols, y, detail::bias_residual_fn<T>{z, bias, r});
}

}  // namespace kernels
}  // namespace REMAT_NAMESPACE
