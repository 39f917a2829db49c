#include <remat/numeric/small_float.hpp>

#include "numeric/reference.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

// remat::half, not CUDA's global `half` typedef from cuda_fp16.h.
using rhalf = remat::half;

TEST_CASE("half: hand-checked encodings", "[numeric][half]") {
  CHECK(rhalf(1.0f).bits() == 0x3c00);
  CHECK(rhalf(-2.0f).bits() == 0xc000);
  CHECK(rhalf(65504.0f).bits() == 0x7bff);
  CHECK(rhalf(65520.0f).bits() == 0x7c00);          // the tie above max rounds to inf
  CHECK(rhalf(65519.0f).bits() == 0x7bff);
  CHECK(rhalf(5.9604645e-8f).bits() == 0x0001);     // 2^-24, the smallest subnormal
  CHECK(rhalf(2.9802322e-8f).bits() == 0x0000);     // 2^-25: a tie, to even (zero)
  CHECK(rhalf(-1.0e-9f).bits() == 0x8000);          // negative underflow keeps the sign
  CHECK(rhalf(1.0f + 1.0f / 2048).bits() == 0x3c00); // tie between 1 and 1+2^-10: to even
  CHECK(rhalf(1.0f + 3.0f / 2048).bits() == 0x3c02); // tie between 1+2^-10 and 1+2^-9: to even
  CHECK(rhalf(INFINITY).bits() == 0x7c00);
  CHECK(rhalf(-INFINITY).bits() == 0xfc00);
  CHECK(remat::isnan(rhalf(NAN)));
  CHECK(static_cast<float>(rhalf::from_bits(0x3555)) == 0.333251953125f);
  CHECK(static_cast<float>(rhalf::from_bits(0x0001)) == std::ldexp(1.0f, -24));
}

TEST_CASE("half: every bit pattern converts to float like CUDA's __half2float", "[numeric][half]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    rhalf const h = rhalf::from_bits(std::uint16_t(b));
    float const f = static_cast<float>(h);
    _Float16 g;
    std::uint16_t const b16 = std::uint16_t(b);
    std::memcpy(&g, &b16, 2);
    if (std::isnan(float(g))) {
      MATCH_AT(b, std::isnan(f));
      MATCH_AT(b, remat::isnan(h));
    } else {
      MATCH_AT(b, test::bits(f) == test::bits(float(g)));  // GCC's _Float16: an independent conversion
      MATCH_AT(b, rhalf(f).bits() == b16);  // and back, exactly
    }
#if REMAT_TEST_CUDA_REFERENCE
    __half_raw raw;
    raw.x = b16;
    MATCH_AT(b, test::bits(f) == test::bits(__half2float(__half(raw))));  // NaN bits too
#endif
  }
}

static void check_float_to_half(std::vector<float> const& xs) {
  for (float x : xs) {
    std::uint16_t const got = rhalf(x).bits();
    if (std::isnan(x)) {
      MATCH_AT(x, remat::isnan(rhalf::from_bits(got)));
    } else {
      _Float16 const g = static_cast<_Float16>(x);
      std::uint16_t gb;
      std::memcpy(&gb, &g, 2);
      MATCH_AT(x, got == gb);
    }
#if REMAT_TEST_CUDA_REFERENCE
    MATCH_AT(x, got == __half_raw(__float2half(x)).x);  // NaN canonicalisation too
#endif
  }
}

TEST_CASE("half: float to half matches at every rounding boundary", "[numeric][half]") {
  check_float_to_half(test::boundary_sweep([](std::uint16_t b) { return double(float(rhalf::from_bits(b))); }, 0x7bff));
}

TEST_CASE("half: float to half matches on specials and a strided sweep of all floats", "[numeric][half]") {
  check_float_to_half(test::special_floats());
  check_float_to_half(test::strided_floats(4099));  // ~1M patterns over every exponent and sign
}

TEST_CASE("half: numeric_limits", "[numeric][half]") {
  using L = std::numeric_limits<rhalf>;
  CHECK(float(L::max()) == 65504.0f);
  CHECK(float(L::lowest()) == -65504.0f);
  CHECK(float(L::min()) == std::ldexp(1.0f, -14));
  CHECK(float(L::denorm_min()) == std::ldexp(1.0f, -24));
  CHECK(float(L::epsilon()) == std::ldexp(1.0f, -10));
  CHECK(float(L::round_error()) == 0.5f);
  CHECK(std::isinf(float(L::infinity())));
  CHECK(std::isnan(float(L::quiet_NaN())));
  CHECK(std::isnan(float(L::signaling_NaN())));
  CHECK(float(rhalf::from_bits(0x3c00 + 1)) - 1.0f == float(L::epsilon()));
  STATIC_REQUIRE(L::digits == 11);
  STATIC_REQUIRE(L::is_specialized);
}

TEST_CASE("half: arithmetic goes through float and rounds once", "[numeric][half]") {
  rhalf const a(0.1f), b(3.0f);
  CHECK((a * b).bits() == rhalf(float(a) * float(b)).bits());
  CHECK((a + b).bits() == rhalf(float(a) + float(b)).bits());
  CHECK((b / a).bits() == rhalf(float(b) / float(a)).bits());
  CHECK((a - b).bits() == rhalf(float(a) - float(b)).bits());
  CHECK(rhalf(1.0f) + rhalf(2.0f) == rhalf(3.0f));
  CHECK((-a).bits() == (a.bits() ^ 0x8000));
  CHECK(rhalf(0.0f) == rhalf(-0.0f));
  CHECK_FALSE(rhalf(NAN) == rhalf(NAN));
  CHECK(rhalf(1.0f) < rhalf(2.0f));
  rhalf c(65504.0f);
  c += c;
  CHECK(remat::isinf(c));
}
