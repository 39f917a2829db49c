// glibc's libmvec as GCC uses it: the loops below compiled with -ffast-math (which declares the
// vector variants) for this machine's vectors. Part of bench/float_math.cpp.
#include <cmath>
#include <cstddef>

void libmvec_exp(float* __restrict y, float const* __restrict x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = expf(x[i]);
}
void libmvec_erf(float* __restrict y, float const* __restrict x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = erff(x[i]);
}
void libmvec_tanh(float* __restrict y, float const* __restrict x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = tanhf(x[i]);
}
