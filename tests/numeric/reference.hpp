// Independent references for the 16-bit conversions: CUDA's own host conversions when the
// toolkit is here, and reference roundings computed a different way (GCC's _Float16, and
// nearest-of-two-candidates in double for bfloat16).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <string>
#include <vector>

#if REMAT_TEST_CUDA_REFERENCE
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace test {

inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bfloat16 by definition: of the two bf16 values around x, the nearer; on a tie the one with an
// even last bit. Overflow is rounding towards 2^128 (which stands for inf).
inline std::uint16_t bf16_nearest(float x) {
  std::uint32_t const u = bits(x);
  std::uint32_t const sign = u & 0x80000000u;
  std::uint32_t const mag = u & 0x7fffffffu;
  std::uint32_t const lo = mag >> 16;  // truncation: at or below |x|
  std::uint32_t const hi = lo + 1;
  double const ax = std::fabs(double(x));
  double const vlo = double(from_bits(lo << 16));
  double const vhi = hi == 0x7f80u ? std::ldexp(1.0, 128) : double(from_bits(hi << 16));
  double const dlo = ax - vlo, dhi = vhi - ax;
  std::uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1u) ? hi : lo);
  return std::uint16_t((sign >> 16) | r);
}

// Inputs around every rounding boundary of a 16-bit format, given its values in order: each
// midpoint between neighbours and the floats just below and above it, plus the neighbours.
template <class ToFloat>
std::vector<float> boundary_sweep(ToFloat to_float, std::uint16_t last_finite) {
  std::vector<float> xs;
  for (std::uint32_t h = 0; h < last_finite; ++h) {
    double const a = to_float(std::uint16_t(h)), b = to_float(std::uint16_t(h + 1));
    float const mid = float((a + b) / 2);  // exact: one more bit than the format has
    for (float x : {float(a), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  return xs;
}

// Specials: zeros, infinities, NaNs with payloads and signs, the largest floats, tiny values.
inline std::vector<float> special_floats() {
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 3.4028235e38f, -3.4028235e38f,
                           1.0e10f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1.0e-8f, 5.9604645e-8f,
                           2.9802322e-8f, 1.1754944e-38f, 1.0e-45f, 1.0f, -2.0f, 0.1f, 1.0f / 3.0f};
  for (std::uint32_t u : {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0xff800001u, 0xffc00000u, 0x7fa00000u,
                          0x33000000u, 0x33000001u, 0x32ffffffu, 0x477fe000u, 0x477fefffu, 0x477ff000u,
                          0x7f7f8000u, 0x7f7f7fffu, 0x7f7fffffu, 0x00000001u, 0x007fffffu, 0x00800000u})
    xs.push_back(from_bits(u));
  return xs;
}

// A strided walk over every float bit pattern (both signs, all exponents, subnormals included).
inline std::vector<float> strided_floats(std::uint32_t stride) {
  std::vector<float> xs;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += stride) xs.push_back(from_bits(std::uint32_t(u)));
  return xs;
}

}  // namespace test

// A check for sweeps of millions of cases: silent and cheap while it holds, a Catch failure
// naming the expression and the case when it does not.
#define MATCH_AT(at, ...)                                                                    \
  do {                                                                                       \
    if (!(__VA_ARGS__)) FAIL("mismatch: " #__VA_ARGS__ << " at case " << test::case_of(at)); \
  } while (0)

namespace test {
inline std::string case_of(std::uint32_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%x", b);
  return buf;
}
inline std::string case_of(float x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "float 0x%08x (%g)", bits(x), double(x));
  return buf;
}
}  // namespace test
