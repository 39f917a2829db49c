// Scalar maths for the two compute types, callable on host and device. One definition per
// function so that fused and op-by-op evaluation call exactly the same code. On the host, float
// exp, erf and tanh are remat's own (float_math.hpp: vectorisable, bit-identical in every lane);
// on the GPU, CUDA's.
#pragma once

#include "../config.hpp"
#include "float_math.hpp"

#include <cmath>

namespace REMAT_NAMESPACE {
namespace expr {
namespace math {

REMAT_HOST_DEVICE float exp(float x) {
#if REMAT_DEVICE_CODE
  return ::expf(x);
#else
  return float_math::exp(x);
#endif
}
REMAT_HOST_DEVICE double exp(double x) { return ::exp(x); }
REMAT_HOST_DEVICE float log(float x) { return ::logf(x); }
REMAT_HOST_DEVICE double log(double x) { return ::log(x); }
REMAT_HOST_DEVICE float sqrt(float x) { return ::sqrtf(x); }
REMAT_HOST_DEVICE double sqrt(double x) { return ::sqrt(x); }
REMAT_HOST_DEVICE float tanh(float x) {
#if REMAT_DEVICE_CODE
  return ::tanhf(x);
#else
  return float_math::tanh(x);
#endif
}
REMAT_HOST_DEVICE double tanh(double x) { return ::tanh(x); }
REMAT_HOST_DEVICE float erf(float x) {
#if REMAT_DEVICE_CODE
  return ::erff(x);
#else
  return float_math::erf(x);
#endif
}
REMAT_HOST_DEVICE double erf(double x) { return ::erf(x); }
REMAT_HOST_DEVICE float abs(float x) { return ::fabsf(x); }
REMAT_HOST_DEVICE double abs(double x) { return ::fabs(x); }
REMAT_HOST_DEVICE float pow(float x, float p) { return ::powf(x, p); }
REMAT_HOST_DEVICE double pow(double x, double p) { return ::pow(x, p); }
REMAT_HOST_DEVICE float rsqrt(float x) {
#if REMAT_DEVICE_CODE
  return ::rsqrtf(x);
#else
  return 1.0f / ::sqrtf(x);
#endif
}
REMAT_HOST_DEVICE double rsqrt(double x) {
#if REMAT_DEVICE_CODE
  return ::rsqrt(x);
#else
  return 1.0 / ::sqrt(x);
#endif
}

}  // namespace math
}  // namespace expr
}  // namespace REMAT_NAMESPACE
