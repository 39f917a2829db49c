// remat's own float exp, erf and tanh for the host: branch-free polynomials (both sides of every
// range are computed and one is selected), so a loop of them vectorises, and a vector lane and the
// scalar tail give the same bits. A fused expression, its op-by-op evaluation and a recomputation
// therefore agree bit for bit whatever the thread count or the alignment. Errors, measured over
// all 2^32 floats against double-precision libm (tests/expr/test_float_math.cpp): exp < 1 ulp,
// erf < 1.5 ulp, tanh < 1.5 ulp; NaN, infinities, signed zeros, overflow and subnormal results
// as IEEE expects. Coefficients: near-minimax fits (scripts/fit_float_math.py, mpmath) rounded to
// float. Needs -ffp-contract=off (remat's targets set it), like the rest of remat's arithmetic.
// Why not fused multiply-adds (tried 2026-11-28, Zen 4): with them erf is 1.45x faster and more
// accurate (1.13 ulp), but a build without the AVX2/AVX-512 clones (clang, REMAT_NO_CLONES) on
// baseline x86-64 would call libm's fmaf per term, about 10x slower than these polynomials.
#pragma once

#include "../config.hpp"

#include <bit>
#include <cstdint>

namespace REMAT_NAMESPACE {
namespace float_math {

REMAT_HOST_DEVICE float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }  // the float with these bits
REMAT_HOST_DEVICE std::uint32_t to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }  // the bits of a float
// a where c, else b, as bits: a select the compiler keeps branch-free (under -ftrapping-math, GCC's
// default, it leaves a floating-point `c ? a : b` as a branch, which stops vectorisation).
REMAT_HOST_DEVICE float select(bool c, float a, float b) {
  std::uint32_t const m = 0u - std::uint32_t(c);
  return from_bits((to_bits(a) & m) | (to_bits(b) & ~m));
}
// |mag| with the sign of `sign`.
REMAT_HOST_DEVICE float with_sign_of(float mag, float sign) {
  return from_bits((to_bits(mag) & 0x7fffffffu) | (to_bits(sign) & 0x80000000u));
}

// e^r, |r| <= ln 2 / 2, by a degree-6 polynomial, and t = x / ln 2 + 1.5 * 2^23, whose low bits
// hold k = round(x / ln 2): exp's reduction and polynomial, shared with exp_normal.
struct exp_reduced {
  float p;  // e^r
  float t;  // the rounding of x / ln 2, k in its low bits
};
REMAT_HOST_DEVICE exp_reduced exp_reduce(float xc) {
  constexpr float shifter = 0x1.8p23f;  // adding it rounds to an integer, kept in the low bits
  float const t = xc * 0x1.715476p+0f + shifter;
  float const k = t - shifter;
  float const r = (xc - k * 0x1.62e4p-1f) - k * 0x1.7f7d1cp-20f;
  float const p =
      1.0f + (r + r * r * (0x1.fffffcp-2f +
                           r * (0x1.555492p-3f + r * (0x1.5558f2p-5f + r * (0x1.123a0cp-7f + r * 0x1.6a23e2p-10f)))));
  return {p, t};
}
// k of an exp_reduced.
REMAT_HOST_DEVICE std::int32_t exp_k(exp_reduced e) { return std::int32_t(to_bits(e.t) - to_bits(0x1.8p23f)); }

// e^x = 2^k e^r with k = round(x / ln 2) and |r| <= ln 2 / 2 (Cody and Waite's two-part ln 2, so
// k * ln2_hi is exact); e^r by a degree-6 polynomial; 2^k as two exact powers of two, so a
// subnormal result is rounded once. x is clamped to [-104, 89], beyond which e^x rounds to 0 or
// overflows to inf anyway.
REMAT_HOST_DEVICE float exp(float x) {
  float const xc = select(x < -104.0f, -104.0f, select(x > 89.0f, 89.0f, x));
  exp_reduced const e = exp_reduce(xc);
  std::int32_t const ki = exp_k(e);
  std::int32_t const k1 = ki >> 1, k2 = ki - k1;
  float const y = e.p * from_bits(std::uint32_t(k1 + 127) << 23) * from_bits(std::uint32_t(k2 + 127) << 23);
  return select(x != x, x, y);
}

// exp(x) for x in [-87, 88] (a finite, normal result), with the same bits: there 2^k is one
// normal power of two, so multiplying by it once rounds as exp's two exact steps do, and neither
// the clamp nor the NaN check is needed. erf and tanh call it on arguments they have bounded.
REMAT_HOST_DEVICE float exp_normal(float x) {
  exp_reduced const e = exp_reduce(x);
  return e.p * from_bits(std::uint32_t(exp_k(e) + 127) << 23);
}

// erf(x) = x + x Q(x^2) for |x| < 0.921875; above, 1 - e^L(|x|) with L a degree-7 polynomial of
// log erfc (fitted for the absolute error of erf), |x| clamped to 4 where erf rounds to 1.
REMAT_HOST_DEVICE float erf(float x) {
  float const a = with_sign_of(x, 1.0f);
  float const s = x * x;
  float const small =
      x + x * (0x1.06eba6p-3f +
               s * (-0x1.8126e6p-2f +
                    s * (0x1.ce1a6ap-4f + s * (-0x1.b68b52p-6f + s * (0x1.473ba0p-8f + s * -0x1.3a17bep-11f)))));
  float const ac = select(a < 0.921875f, 0.921875f, select(a > 4.0f, 4.0f, a));
  float const t = ac - 1.0f;
  float const l =
      -0x1.d97fc0p+0f +
      t * (-0x1.51c9b0p+1f +
           t * (-0x1.afabc2p-1f +
                t * (-0x1.547a48p-5f +
                     t * (0x1.491826p-7f + t * (-0x1.072e1ep-9f + t * (0x1.2d23c6p-12f + t * -0x1.636ad2p-16f))))));
  float const large = with_sign_of(1.0f - exp_normal(l), x);  // l in [-18.1, -1.7]
  return select(x != x, x, select(a < 0.921875f, small, large));
}

// tanh(x) = x + x^3 P(x^2) for |x| < 0.625; above, 1 - 2 / (e^(2|x|) + 1), |x| clamped to 10.
REMAT_HOST_DEVICE float tanh(float x) {
  float const a = with_sign_of(x, 1.0f);
  float const s = x * x;
  float const small =
      x + x * s *
              (-0x1.555532p-2f + s * (0x1.110726p-3f + s * (-0x1.b83c54p-5f + s * (0x1.522678p-6f + s * -0x1.75e13ap-8f))));
  float const ac = select(a > 10.0f, 10.0f, a);  // tanh rounds to 1 above 9.02
  float const large = 1.0f - 2.0f / (exp_normal(ac + ac) + 1.0f);
  return select(x != x, x, with_sign_of(select(a < 0.625f, small, large), x));  // (-0 stays -0)
}

}  // namespace float_math
}  // namespace REMAT_NAMESPACE
