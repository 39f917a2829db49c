// Scalar maths for the two compute types, callable on host and device. One definition per
// function so that fused and op-by-op evaluation call exactly the same code. On the host, float
// exp, erf and tanh are remat's own (float_math.hpp: vectorisable, bit-identical in every lane);
// on the GPU, CUDA's. GELU is one function (Phi and its density share an exp).
#pragma once

#include "../config.hpp"
#include "float_math.hpp"

#include <cmath>

namespace REMAT_NAMESPACE {
namespace math {

// e^x in float (on the host, remat's own float_math::exp).
REMAT_HOST_DEVICE float exp(float x) {
#if REMAT_DEVICE_CODE
  return ::expf(x);
#else
  return float_math::exp(x);
#endif
}
REMAT_HOST_DEVICE double exp(double x) { return ::exp(x); }  // e^x in double
REMAT_HOST_DEVICE float log(float x) { return ::logf(x); }  // the natural logarithm in float
REMAT_HOST_DEVICE double log(double x) { return ::log(x); }  // the natural logarithm in double
REMAT_HOST_DEVICE float sqrt(float x) { return ::sqrtf(x); }  // the square root in float
REMAT_HOST_DEVICE double sqrt(double x) { return ::sqrt(x); }  // the square root in double
// The hyperbolic tangent in float (on the host, float_math::tanh).
REMAT_HOST_DEVICE float tanh(float x) {
#if REMAT_DEVICE_CODE
  return ::tanhf(x);
#else
  return float_math::tanh(x);
#endif
}
REMAT_HOST_DEVICE double tanh(double x) { return ::tanh(x); }  // the hyperbolic tangent in double
// The error function in float (on the host, float_math::erf).
REMAT_HOST_DEVICE float erf(float x) {
#if REMAT_DEVICE_CODE
  return ::erff(x);
#else
  return float_math::erf(x);
#endif
}
REMAT_HOST_DEVICE double erf(double x) { return ::erf(x); }  // the error function in double
// GELU, x Phi(x), in float (on the host, float_math::gelu; on the GPU, CUDA's normcdff).
REMAT_HOST_DEVICE float gelu(float x) {
#if REMAT_DEVICE_CODE
  return x * ::normcdff(x);
#else
  return float_math::gelu(x);
#endif
}
REMAT_HOST_DEVICE double gelu(double x) { return 0.5 * x * ::erfc(-x * 0.70710678118654752440); }  // x Phi(x) in double
// GELU's derivative, Phi(x) + x phi(x), in float (on the host, float_math::gelu_grad).
REMAT_HOST_DEVICE float gelu_grad(float x) {
#if REMAT_DEVICE_CODE
  return ::normcdff(x) + x * (::expf(-0.5f * x * x) * 0.398942280f);
#else
  return float_math::gelu_grad(x);
#endif
}
// GELU's derivative in double.
REMAT_HOST_DEVICE double gelu_grad(double x) {
  return 0.5 * ::erfc(-x * 0.70710678118654752440) + x * ::exp(-0.5 * x * x) * 0.39894228040143267794;
}
// The standard normal density in float (on the host, float_math::normal_pdf).
REMAT_HOST_DEVICE float normal_pdf(float x) {
#if REMAT_DEVICE_CODE
  return ::expf(-0.5f * x * x) * 0.398942280f;
#else
  return float_math::normal_pdf(x);
#endif
}
REMAT_HOST_DEVICE double normal_pdf(double x) { return ::exp(-0.5 * x * x) * 0.39894228040143267794; }  // in double
REMAT_HOST_DEVICE float abs(float x) { return ::fabsf(x); }  // |x| in float
REMAT_HOST_DEVICE double abs(double x) { return ::fabs(x); }  // |x| in double
REMAT_HOST_DEVICE float pow(float x, float p) { return ::powf(x, p); }  // x^p in float
REMAT_HOST_DEVICE double pow(double x, double p) { return ::pow(x, p); }  // x^p in double
// 1 / sqrt(x) in float.
REMAT_HOST_DEVICE float rsqrt(float x) {
#if REMAT_DEVICE_CODE
  return ::rsqrtf(x);
#else
  return 1.0f / ::sqrtf(x);
#endif
}
// 1 / sqrt(x) in double.
REMAT_HOST_DEVICE double rsqrt(double x) {
#if REMAT_DEVICE_CODE
  return ::rsqrt(x);
#else
  return 1.0 / ::sqrt(x);
#endif
}

}  // namespace math
}  // namespace REMAT_NAMESPACE
