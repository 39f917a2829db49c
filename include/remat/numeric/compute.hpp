// Which type point-wise maths runs in for a storage type, and the conversions to and from it:
// 16-bit floats load as float and round back on store; float stays float; double stays double.
#pragma once

#include "small_float.hpp"

#include <type_traits>

namespace REMAT_NAMESPACE {

// The type point-wise maths on values of T runs in: float (for float, half and bfloat16).
template <class T>
struct compute_type {
  using type = float;  // float
};
// double stays double.
template <>
struct compute_type<double> {
  using type = double;  // double
};
template <class T>
struct compute_type<T const> : compute_type<T> {};
// The type point-wise maths on T runs in (see compute_type).
template <class T>
using compute_type_t = typename compute_type<T>::type;

// Whether T is half or bfloat16 (const or not).
template <class T>
inline constexpr bool is_small_float_v = std::is_same_v<std::remove_cv_t<T>, half> ||
                                         std::is_same_v<std::remove_cv_t<T>, bfloat16>;

// Whether T is a type tensors of activations and parameters may hold: float, double, half, bfloat16.
template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, double> ||
    is_small_float_v<T>;

// x as V (a 16-bit float through float: exact).
template <class V, class T>
REMAT_HOST_DEVICE V to_compute(T const& x) {
  if constexpr (is_small_float_v<T>)
    return static_cast<V>(x.to_float());
  else
    return static_cast<V>(x);
}

// x stored as T (to a 16-bit float: through float, rounded once to nearest even).
template <class T, class V>
REMAT_HOST_DEVICE T from_compute(V x) {
  if constexpr (is_small_float_v<T>)
    return T(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

}  // namespace REMAT_NAMESPACE
