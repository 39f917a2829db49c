#include <remat/numeric/small_float.hpp>

#include "numeric/reference.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

using bf16 = remat::bfloat16;

TEST_CASE("bfloat16: hand-checked encodings", "[numeric][bfloat16]") {
  CHECK(bf16(1.0f).bits() == 0x3f80);
  CHECK(bf16(-2.0f).bits() == 0xc000);
  CHECK(bf16(test::from_bits(0x3f808000)).bits() == 0x3f80);  // tie: to even
  CHECK(bf16(test::from_bits(0x3f818000)).bits() == 0x3f82);  // tie: to even (up)
  CHECK(bf16(test::from_bits(0x3f808001)).bits() == 0x3f81);  // just above a tie: up
  CHECK(bf16(test::from_bits(0x7f7fffff)).bits() == 0x7f80);  // FLT_MAX overflows to inf
  CHECK(bf16(test::from_bits(0x00000001)).bits() == 0x0000);  // smallest subnormal float
  CHECK(bf16(test::from_bits(0x00008000)).bits() == 0x0000);  // subnormal tie: to even
  CHECK(bf16(test::from_bits(0x00018000)).bits() == 0x0002);
  CHECK(bf16(NAN).bits() == 0x7fff);
  CHECK(bf16(-INFINITY).bits() == 0xff80);
  CHECK(float(bf16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("bfloat16: every bit pattern converts to float like CUDA's __bfloat162float", "[numeric][bfloat16]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    bf16 const h = bf16::from_bits(std::uint16_t(b));
    float const f = static_cast<float>(h);
    // By definition bfloat16 is the top half of a float.
    MATCH_AT(b, test::bits(f) == b << 16);
    if (!std::isnan(f)) MATCH_AT(b, bf16(f).bits() == b);
#if REMAT_TEST_CUDA_REFERENCE
    __nv_bfloat16_raw raw;
    raw.x = std::uint16_t(b);
    MATCH_AT(b, test::bits(f) == test::bits(__bfloat162float(__nv_bfloat16(raw))));
#endif
  }
}

static void check_float_to_bf16(std::vector<float> const& xs) {
  for (float x : xs) {
    std::uint16_t const got = bf16(x).bits();
    if (std::isnan(x))
      MATCH_AT(x, remat::isnan(bf16::from_bits(got)));
    else
      MATCH_AT(x, got == test::bf16_nearest(x));
#if REMAT_TEST_CUDA_REFERENCE
    MATCH_AT(x, got == __nv_bfloat16_raw(__float2bfloat16(x)).x);
#endif
  }
}

TEST_CASE("bfloat16: float to bfloat16 matches at every rounding boundary", "[numeric][bfloat16]") {
  check_float_to_bf16(
      test::boundary_sweep([](std::uint16_t b) { return double(float(bf16::from_bits(b))); }, 0x7f7f));
}

TEST_CASE("bfloat16: float to bfloat16 matches on specials and a strided sweep of all floats", "[numeric][bfloat16]") {
  check_float_to_bf16(test::special_floats());
  check_float_to_bf16(test::strided_floats(4099));
}

TEST_CASE("bfloat16: numeric_limits", "[numeric][bfloat16]") {
  using L = std::numeric_limits<bf16>;
  CHECK(float(L::max()) == std::ldexp(255.0f, 120));  // (2 - 2^-7) * 2^127
  CHECK(float(L::lowest()) == -float(L::max()));
  CHECK(float(L::min()) == std::numeric_limits<float>::min());
  CHECK(float(L::denorm_min()) == std::ldexp(1.0f, -133));
  CHECK(float(L::epsilon()) == std::ldexp(1.0f, -7));
  CHECK(float(L::round_error()) == 0.5f);
  CHECK(std::isinf(float(L::infinity())));
  CHECK(std::isnan(float(L::quiet_NaN())));
  CHECK(std::isnan(float(L::signaling_NaN())));
  CHECK(float(bf16::from_bits(0x3f80 + 1)) - 1.0f == float(L::epsilon()));
  STATIC_REQUIRE(L::digits == 8);
}

TEST_CASE("bfloat16: arithmetic goes through float and rounds once", "[numeric][bfloat16]") {
  bf16 const a(0.1f), b(3.0f);
  CHECK((a * b).bits() == bf16(float(a) * float(b)).bits());
  CHECK((a + b).bits() == bf16(float(a) + float(b)).bits());
  CHECK((a / b).bits() == bf16(float(a) / float(b)).bits());
  CHECK(bf16(1.0f) + bf16(2.0f) == bf16(3.0f));
  CHECK(remat::isfinite(a));
  CHECK(remat::isinf(bf16(3.0e38f) * bf16(2.0f)));
}
