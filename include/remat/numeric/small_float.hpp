// remat::half and remat::bfloat16: 16-bit floats held in a uint16_t, converted with exact
// round-to-nearest-even on the host and the hardware instructions on the device. Bit-compatible
// with CUDA's __half / __nv_bfloat16 (including how NaN converts); arithmetic goes through float.
#pragma once

#include "../config.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if REMAT_HAS_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace REMAT_NAMESPACE {
namespace detail {

REMAT_HOST_DEVICE std::uint32_t float_as_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

REMAT_HOST_DEVICE float bits_as_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits.
struct binary16_format {
  static constexpr char const* name = "half";

  REMAT_HOST_DEVICE static std::uint16_t from_float(float f) {
#if REMAT_DEVICE_CODE
    return __half_as_ushort(__float2half_rn(f));
#else
    std::uint32_t const x = float_as_bits(f);
    std::uint32_t const sign = (x >> 16) & 0x8000u;
    std::uint32_t const u = x & 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7fffu;                       // NaN: canonical, sign dropped
    if (u >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520 (and inf) -> inf
    if (u >= 0x38800000u) {                                    // a normal half: >= 2^-14
      // Round the 23-bit mantissa to 10 bits, ties to even; a carry bumps the exponent.
      std::uint32_t const rounded = u + 0xfffu + ((u >> 13) & 1u);
      return std::uint16_t(sign | ((rounded - 0x38000000u) >> 13));
    }
    if (u <= 0x33000000u) return std::uint16_t(sign);  // <= 2^-25: rounds to (signed) zero
    // A subnormal half counts units of 2^-24: value = m * 2^(e-150) = (m >> (126-e)) units.
    std::uint32_t const e = u >> 23;
    std::uint32_t const m = (u & 0x7fffffu) | 0x800000u;
    std::uint32_t const shift = 126u - e;
    std::uint32_t h = m >> shift;
    std::uint32_t const rest = m & ((1u << shift) - 1u);
    std::uint32_t const halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
    return std::uint16_t(sign | h);
#endif
  }

  REMAT_HOST_DEVICE static float to_float(std::uint16_t h) {
#if REMAT_DEVICE_CODE
    return __half2float(__ushort_as_half(h));
#else
    std::uint32_t const sign = std::uint32_t(h & 0x8000u) << 16;
    std::uint32_t const exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu)  // inf keeps its sign; NaN becomes the canonical float NaN
      return bits_as_float(mantissa ? 0x7fffffffu : (sign | 0x7f800000u));
    if (exponent == 0u) {
      if (mantissa == 0u) return bits_as_float(sign);
      std::uint32_t e = 113u;  // normalise a subnormal: value = mantissa * 2^-24
      while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        --e;
      }
      return bits_as_float(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
    }
    return bits_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#endif
  }
};

// bfloat16: the top half of an IEEE binary32.
struct bfloat16_format {
  static constexpr char const* name = "bfloat16";

  REMAT_HOST_DEVICE static std::uint16_t from_float(float f) {
#if REMAT_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    std::uint32_t const x = float_as_bits(f);
    // Round the low 16 bits away, ties to even; overflow carries into inf as it should. NaN
    // becomes the canonical 0x7fff (sign dropped). Written as an integer select, so a loop of
    // conversions vectorises.
    std::uint32_t const rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return std::uint16_t((x & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : rounded);
#endif
  }

  REMAT_HOST_DEVICE static float to_float(std::uint16_t b) {
    return bits_as_float(std::uint32_t(b) << 16);
  }
};

}  // namespace detail

// A 16-bit float of the given format. Conversions are explicit both ways.
template <class Format>
class small_float {
 public:
  // The bit layout and its conversions (binary16 or bfloat16).
  using format = Format;

  small_float() = default;
  // f rounded to nearest, ties to even (NaN stays NaN).
  REMAT_HOST_DEVICE explicit small_float(float f) : bits_(Format::from_float(f)) {}
  // d through float, then rounded as a float is.
  REMAT_HOST_DEVICE explicit small_float(double d) : small_float(static_cast<float>(d)) {}
  // i through float, then rounded as a float is.
  REMAT_HOST_DEVICE explicit small_float(int i) : small_float(static_cast<float>(i)) {}
  // The value, exactly (every value is a float).
  REMAT_HOST_DEVICE explicit operator float() const { return Format::to_float(bits_); }
  // The value, exactly.
  REMAT_HOST_DEVICE explicit operator double() const { return Format::to_float(bits_); }

  // The value whose 16 bits are `bits`.
  REMAT_HOST_DEVICE static constexpr small_float from_bits(std::uint16_t bits) {
    small_float r;
    r.bits_ = bits;
    return r;
  }
  // Its 16 bits.
  REMAT_HOST_DEVICE constexpr std::uint16_t bits() const { return bits_; }

  // The value as a float, exactly.
  REMAT_HOST_DEVICE float to_float() const { return Format::to_float(bits_); }

  // The sign flipped (exact, NaN included).
  REMAT_HOST_DEVICE small_float operator-() const { return from_bits(std::uint16_t(bits_ ^ 0x8000u)); }
  // Itself.
  REMAT_HOST_DEVICE small_float operator+() const { return *this; }

  // *this = *this + o (in float, rounded once).
  REMAT_HOST_DEVICE small_float& operator+=(small_float o) { return *this = *this + o; }
  // *this = *this - o (in float, rounded once).
  REMAT_HOST_DEVICE small_float& operator-=(small_float o) { return *this = *this - o; }
  // *this = *this * o (in float, rounded once).
  REMAT_HOST_DEVICE small_float& operator*=(small_float o) { return *this = *this * o; }
  // *this = *this / o (in float, rounded once).
  REMAT_HOST_DEVICE small_float& operator/=(small_float o) { return *this = *this / o; }

  // a + b in float, rounded once.
  REMAT_HOST_DEVICE friend small_float operator+(small_float a, small_float b) {
    return small_float(a.to_float() + b.to_float());
  }
  // a - b in float, rounded once.
  REMAT_HOST_DEVICE friend small_float operator-(small_float a, small_float b) {
    return small_float(a.to_float() - b.to_float());
  }
  // a * b in float, rounded once.
  REMAT_HOST_DEVICE friend small_float operator*(small_float a, small_float b) {
    return small_float(a.to_float() * b.to_float());
  }
  // a / b in float, rounded once.
  REMAT_HOST_DEVICE friend small_float operator/(small_float a, small_float b) {
    return small_float(a.to_float() / b.to_float());
  }
  // Comparisons follow IEEE (NaN compares unequal to everything, +0 == -0).
  REMAT_HOST_DEVICE friend bool operator==(small_float a, small_float b) { return a.to_float() == b.to_float(); }
  // Not equal (true when either is NaN).
  REMAT_HOST_DEVICE friend bool operator!=(small_float a, small_float b) { return a.to_float() != b.to_float(); }
  // Less than.
  REMAT_HOST_DEVICE friend bool operator<(small_float a, small_float b) { return a.to_float() < b.to_float(); }
  // Less than or equal.
  REMAT_HOST_DEVICE friend bool operator<=(small_float a, small_float b) { return a.to_float() <= b.to_float(); }
  // Greater than.
  REMAT_HOST_DEVICE friend bool operator>(small_float a, small_float b) { return a.to_float() > b.to_float(); }
  // Greater than or equal.
  REMAT_HOST_DEVICE friend bool operator>=(small_float a, small_float b) { return a.to_float() >= b.to_float(); }

#if REMAT_HAS_CUDA
  // Bit-for-bit interchange with CUDA's own types.
  template <class F = Format, std::enable_if_t<std::is_same_v<F, detail::binary16_format>, int> = 0>
  REMAT_HOST_DEVICE explicit small_float(__half h) : bits_(__half_raw(h).x) {}
  template <class F = Format, std::enable_if_t<std::is_same_v<F, detail::bfloat16_format>, int> = 0>
  REMAT_HOST_DEVICE explicit small_float(__nv_bfloat16 h) : bits_(__nv_bfloat16_raw(h).x) {}
#endif

 private:
  std::uint16_t bits_;
};

// IEEE binary16: 1 sign, 5 exponent, 10 fraction bits (CUDA's __half, PyTorch's float16).
using half = small_float<detail::binary16_format>;
// bfloat16: 1 sign, 8 exponent, 7 fraction bits, float's range (CUDA's __nv_bfloat16).
using bfloat16 = small_float<detail::bfloat16_format>;

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat16>);

// Whether h is NaN.
REMAT_HOST_DEVICE bool isnan(half h) { return (h.bits() & 0x7fffu) > 0x7c00u; }
// Whether h is an infinity.
REMAT_HOST_DEVICE bool isinf(half h) { return (h.bits() & 0x7fffu) == 0x7c00u; }
// Whether h is neither NaN nor an infinity.
REMAT_HOST_DEVICE bool isfinite(half h) { return (h.bits() & 0x7c00u) != 0x7c00u; }
// Whether b is NaN.
REMAT_HOST_DEVICE bool isnan(bfloat16 b) { return (b.bits() & 0x7fffu) > 0x7f80u; }
// Whether b is an infinity.
REMAT_HOST_DEVICE bool isinf(bfloat16 b) { return (b.bits() & 0x7fffu) == 0x7f80u; }
// Whether b is neither NaN nor an infinity.
REMAT_HOST_DEVICE bool isfinite(bfloat16 b) { return (b.bits() & 0x7f80u) != 0x7f80u; }

}  // namespace REMAT_NAMESPACE

namespace REMAT_NAMESPACE {
namespace detail {

// std::numeric_limits for a 16-bit float, from its format's constants and special bit patterns.
template <class T, int Digits, int Digits10, int MaxDigits10, int MinExp, int MinExp10, int MaxExp, int MaxExp10,
          bool Iec559, std::uint16_t Min, std::uint16_t Max, std::uint16_t Epsilon, std::uint16_t Half,
          std::uint16_t Infinity, std::uint16_t QuietNaN, std::uint16_t SignalingNaN>
struct small_float_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = Iec559;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = Digits;
  static constexpr int digits10 = Digits10;
  static constexpr int max_digits10 = MaxDigits10;
  static constexpr int radix = 2;
  static constexpr int min_exponent = MinExp;
  static constexpr int min_exponent10 = MinExp10;
  static constexpr int max_exponent = MaxExp;
  static constexpr int max_exponent10 = MaxExp10;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
  static constexpr T min() noexcept { return T::from_bits(Min); }
  static constexpr T lowest() noexcept { return T::from_bits(std::uint16_t(Max | 0x8000u)); }
  static constexpr T max() noexcept { return T::from_bits(Max); }
  static constexpr T epsilon() noexcept { return T::from_bits(Epsilon); }
  static constexpr T round_error() noexcept { return T::from_bits(Half); }
  static constexpr T infinity() noexcept { return T::from_bits(Infinity); }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(QuietNaN); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(SignalingNaN); }
  static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }
};

}  // namespace detail
}  // namespace REMAT_NAMESPACE

namespace std {

template <>
class numeric_limits<REMAT_NAMESPACE::half>
    : public REMAT_NAMESPACE::detail::small_float_limits<REMAT_NAMESPACE::half, 11, 3, 5, -13, -4, 16, 4, true, 0x0400,
                                                         0x7bff, 0x1400, 0x3800, 0x7c00, 0x7e00, 0x7d00> {};

template <>
class numeric_limits<REMAT_NAMESPACE::bfloat16>
    : public REMAT_NAMESPACE::detail::small_float_limits<REMAT_NAMESPACE::bfloat16, 8, 2, 4, -125, -37, 128, 38, false,
                                                         0x0080, 0x7f7f, 0x3c00, 0x3f00, 0x7f80, 0x7fc0, 0x7fa0> {};

}  // namespace std
