// remat's own float exp, erf, tanh and GELU for the host: branch-free polynomials (both sides of every
// range are computed and one is selected), so a loop of them vectorises, and a vector lane and the
// scalar tail give the same bits. A fused expression, its op-by-op evaluation and a recomputation
// therefore agree bit for bit whatever the thread count or the alignment. Errors, measured over
// all 2^32 floats against double-precision libm (tests/expr/test_float_math.cpp): exp < 1 ulp,
// erf < 1.5 ulp, tanh < 1.5 ulp, GELU < 9 ulp (8.28, in the far negative tail; 4.3 where |x| < 1)
// and its derivative within 2^-22; NaN, infinities, signed zeros, overflow and subnormal results
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

// e^r for |r| <= ln 2 / 2 (a little more where the caller adds a low part), by a degree-6
// polynomial.
REMAT_HOST_DEVICE float exp_poly(float r) {
  return 1.0f +
         (r + r * r * (0x1.fffffcp-2f +
                       r * (0x1.555492p-3f + r * (0x1.5558f2p-5f + r * (0x1.123a0cp-7f + r * 0x1.6a23e2p-10f)))));
}

// e^r, |r| <= ln 2 / 2, and t = x / ln 2 + 1.5 * 2^23, whose low bits hold k = round(x / ln 2):
// exp's reduction and polynomial, shared with exp_normal.
struct exp_reduced {
  float p;  // e^r
  float t;  // the rounding of x / ln 2, k in its low bits
};
constexpr float exp_shifter = 0x1.8p23f;  // adding it rounds to an integer, kept in the low bits
constexpr float log2e = 0x1.715476p+0f;   // 1 / ln 2
constexpr float ln2_hi = 0x1.62e4p-1f;    // ln 2's leading 16 bits: k ln2_hi is exact
constexpr float ln2_lo = 0x1.7f7d1cp-20f;  // ln 2 - ln2_hi
// e^xc reduced: k = round(xc / ln 2), r = (xc - k ln2_hi) - k ln2_lo, e^r by exp_poly.
REMAT_HOST_DEVICE exp_reduced exp_reduce(float xc) {
  float const t = xc * log2e + exp_shifter;
  float const k = t - exp_shifter;
  float const r = (xc - k * ln2_hi) - k * ln2_lo;
  return {exp_poly(r), t};
}
// The same for e^(hi + lo), lo small beside hi: r = ((hi - k ln2_hi) + lo) - k ln2_lo, so that lo's
// bits below hi's last place still count.
REMAT_HOST_DEVICE exp_reduced exp_reduce(float hi, float lo) {
  float const t = (hi + lo) * log2e + exp_shifter;
  float const k = t - exp_shifter;
  float const r = ((hi - k * ln2_hi) + lo) - k * ln2_lo;
  return {exp_poly(r), t};
}
// k of an exp_reduced.
REMAT_HOST_DEVICE std::int32_t exp_k(exp_reduced e) { return std::int32_t(to_bits(e.t) - to_bits(exp_shifter)); }

// 2^k e^r of an exp_reduced, as two exact powers of two, so that a subnormal result is rounded once.
REMAT_HOST_DEVICE float exp_scale(exp_reduced e) {
  std::int32_t const ki = exp_k(e);
  std::int32_t const k1 = ki >> 1, k2 = ki - k1;
  return e.p * from_bits(std::uint32_t(k1 + 127) << 23) * from_bits(std::uint32_t(k2 + 127) << 23);
}

// e^x = 2^k e^r with k = round(x / ln 2) and |r| <= ln 2 / 2 (Cody and Waite's two-part ln 2, so
// k * ln2_hi is exact); e^r by a degree-6 polynomial; 2^k as two exact powers of two, so a
// subnormal result is rounded once. x is clamped to [-104, 89], beyond which e^x rounds to 0 or
// overflows to inf anyway.
REMAT_HOST_DEVICE float exp(float x) {
  float const xc = select(x < -104.0f, -104.0f, select(x > 89.0f, 89.0f, x));
  exp_reduced const e = exp_reduce(xc);
  return select(x != x, x, exp_scale(e));
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

// The standard normal distribution at x, what GELU (x Phi(x)) and its derivative (Phi(x) + x phi(x))
// are made of, with one exp for both. For a = |x| <= 14.5, Phi(-a) = e^(-a^2/2) R(a), R(a) =
// N(a) / D(a) a rational function fitted for its relative error (6e-9; positive coefficients, so
// Horner's rule is stable; scripts/fit_float_math.py normal_tail 4 14.5), and a^2 / 2 = h + l with
// h exact (the square of a's 12 leading bits), so that e^(-a^2/2) keeps its relative accuracy in
// the tail where a^2 / 2 is large. Phi(x) is 1 - Phi(-a) for x >= 0. Beyond 14.5, Phi(-a) (below
// 7e-48) and phi are 0.
struct normal_parts {
  float lower;  // Phi(-|x|)
  float e;      // e^(-x^2 / 2)
  float q;      // R(|x|) = Phi(-|x|) / e^(-x^2 / 2)
};
// Whether |x| > 14.5, where normal takes Phi(-|x|) and e as 0.
REMAT_HOST_DEVICE bool normal_far(float x) { return with_sign_of(x, 1.0f) > 14.5f; }
REMAT_HOST_DEVICE normal_parts normal(float x) {
  bool const far = normal_far(x);
  float const ac = select(far, 14.5f, with_sign_of(x, 1.0f));  // (NaN stays NaN: the callers select x for it)
  float const num = 0.5f + ac * (0x1.c0d2b8p-2f + ac * (0x1.774702p-3f + ac * (0x1.4ce19cp-5f + ac * 0x1.0dc726p-8f)));
  float const den =
      1.0f + ac * (0x1.acab8cp+0f +
                   ac * (0x1.33d8eep+0f + ac * (0x1.e0c0d6p-2f + ac * (0x1.a13b32p-4f + ac * 0x1.521cd2p-7f))));
  float const q = num / den;
  float const ah = from_bits(to_bits(ac) & 0xfffff000u);
  float const h = 0.5f * (ah * ah);                 // exact
  float const l = 0.5f * ((ac - ah) * (ac + ah));  // the rest of a^2 / 2, below a^2 2^-12
  // e^-(h + l), -h - k ln2_hi exact; subnormal from a ~ 13.2
  float const e = select(far, 0.0f, exp_scale(exp_reduce(-h, -l)));
  return {q * e, e, q};
}

// GELU, x Phi(x) (PyTorch's approximate='none'): within 9 ulp for every float, 4.3 where |x| < 1
// and 1.8 above 1 (x < 0 as (x q) e, rounded once where the result is subnormal). The composite
// 0.5 x (1 + erf(x / sqrt 2)) loses Phi(x) to cancellation below x = -1 (up to 105 ulp in
// [-3, -1), all of it below -5.4, where 1 + erf rounds to 0). NaN: NaN; inf: inf; -inf: -0, its
// limit (the composite gives NaN).
REMAT_HOST_DEVICE float gelu(float x) {
  normal_parts const n = normal(x);
  float const y = select(x < 0.0f, select(normal_far(x), -0.0f, (x * n.q) * n.e), x * (1.0f - n.lower));
  return select(x != x, x, y);
}

// GELU's derivative, Phi(x) + x phi(x), phi(x) = e^(-x^2/2) / sqrt(2 pi): within 2^-22 of it (its
// values lie in [-0.17, 1.13]). NaN: NaN; +-inf: 1 and 0.
REMAT_HOST_DEVICE float gelu_grad(float x) {
  normal_parts const n = normal(x);
  float const phi = select(x < 0.0f, n.lower, 1.0f - n.lower);
  float const y = phi + select(normal_far(x), 0.0f, x * (n.e * 0x1.988454p-2f));
  return select(x != x, x, y);
}

// The standard normal density e^(-x^2/2) / sqrt(2 pi), within 3 ulp where it is a normal float.
REMAT_HOST_DEVICE float normal_pdf(float x) {
  float const y = normal(x).e * 0x1.988454p-2f;
  return select(x != x, x, y);
}

}  // namespace float_math
}  // namespace REMAT_NAMESPACE
