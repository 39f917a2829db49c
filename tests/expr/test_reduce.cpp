#include <remat/expr/expr.hpp>
#include <remat/kernels/evaluate.hpp>
#include <remat/kernels/rows.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace remat;

TEST_CASE("reductions: sums of 1..n against the closed forms", "[expr][reduce]") {
  for (index_t n : {index_t(1), index_t(7), index_t(1000), index_t(200001)}) {
    tensor<double> x(n, 1);
    for (index_t i = 0; i < n; ++i) x[std::size_t(i)] = double(i + 1);
    double const nn = double(n);
    CHECK(sum(x) == nn * (nn + 1) / 2);  // exact in double for these n
    CHECK(sum_squares(x) == nn * (nn + 1) * (2 * nn + 1) / 6);
    CHECK(mean(x) == (nn + 1) / 2);
    CHECK(max_of(x) == nn);
    CHECK(sum(x * 2.0 - 1.0) == nn * nn);  // reduces a fused expression, nothing written
    CHECK(max_of(-x) == -1.0);
  }
}

TEST_CASE("reductions: fp32 accumulates in fp32 and stays close to the exact sum", "[expr][reduce]") {
  index_t const n = 300000;
  tensor<float> x(n, 1);
  double exact = 0;
  for (index_t i = 0; i < n; ++i) {
    float const v = float((i * 7919) % 1000) / 1000.0f;
    x[std::size_t(i)] = v;
    exact += v;
  }
  auto s = sum(x);
  STATIC_REQUIRE(std::is_same_v<decltype(s), float>);
  CHECK(double(s) == Approx(exact).epsilon(1e-5));
  CHECK(double(mean(x)) == Approx(exact / double(n)).epsilon(1e-5));
}

TEST_CASE("reductions: the maximum is NaN if any element is NaN", "[expr][reduce]") {
  tensor<float> x(5, 1);
  for (std::size_t i = 0; i < 5; ++i) x[i] = float(i);
  CHECK(max_of(x) == 4.0f);
  x[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(max_of(x)));
  x[2] = std::numeric_limits<float>::infinity();
  CHECK(std::isinf(sum(x)));
}

TEST_CASE("reductions: an empty expression is an argument error", "[expr][reduce][errors]") {
  tensor<float, host, 4> x(3);
  auto none = x.view().row_range(1, 0);
  CHECK_THROWS_AS(sum(none), argument_error);
  CHECK_THROWS_WITH(mean(none), Catch::Contains("at least one element") && Catch::Contains("empty"));
  CHECK_THROWS_AS(max_of(none * 2.0), argument_error);
  CHECK_THROWS_AS(sum_squares(none), argument_error);
}

#if defined(_OPENMP)
#include <omp.h>
TEST_CASE("reductions: the result is bitwise the same on any number of threads", "[expr][reduce]") {
  index_t const n = 1000003;
  tensor<float> x(n, 1);
  for (index_t i = 0; i < n; ++i) x[std::size_t(i)] = std::sin(float(i)) * 1e3f;
  int const saved = omp_get_max_threads();
  omp_set_num_threads(1);
  float const one = sum(x * x + 1.0), one_max = max_of(x);
  omp_set_num_threads(3);
  float const three = sum(x * x + 1.0), three_max = max_of(x);
  omp_set_num_threads(saved);
  CHECK(std::memcmp(&one, &three, sizeof one) == 0);
  CHECK(one_max == three_max);
}
#endif

TEST_CASE("row maxima: a NaN is skipped unless it comes first, and a tie keeps the earlier lane's value",
          "[expr][reduce][kernels]") {
  // row_max's lanes (c % 16 over whole groups of 16, then the tail from lane 0) each keep their
  // value unless a later one is larger, and the lanes are folded from lane 0 up the same way. The
  // host's vector form of the lanes must choose as that does, in ties (-0 against +0) and NaNs.
  float const nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto const max_of = [](std::vector<float> const& v) {
    return kernels::detail::row_max<float>(v.size(), [&v](std::size_t c) { return v[c]; });
  };
  std::vector<float> v(40, -1.0f);
  v[5] = nan, v[21] = nan, v[35] = nan;  // in both whole groups and in the tail
  v[9] = 2.0f;
  CHECK(max_of(v) == 2.0f);
  v[0] = nan;  // the first value: every lane starts from it, and nothing is larger than a NaN
  CHECK(std::isnan(max_of(v)));
  std::vector<float> zeros(40, -1.0f);
  zeros[1] = -0.0f, zeros[17] = 0.0f;  // lane 1: -0 first, and +0 is not larger
  CHECK(std::signbit(max_of(zeros)));
  zeros[1] = 0.0f, zeros[17] = -0.0f;
  CHECK(!std::signbit(max_of(zeros)));
  zeros[1] = -0.0f, zeros[17] = -1.0f, zeros[2] = 0.0f, zeros[33] = 0.0f;  // lanes 1 and 2; the fold keeps lane 1's
  CHECK(std::signbit(max_of(zeros)));
  zeros[31] = inf;
  CHECK(max_of(zeros) == inf);
  std::vector<float> falling(33);
  for (std::size_t c = 0; c < falling.size(); ++c) falling[c] = -float(c);
  falling[32] = -inf;
  CHECK(max_of(falling) == 0.0f);
}

TEST_CASE("row sums and maxima: exact where they can be, close to the exact sum, alignment-independent",
          "[expr][reduce][kernels]") {
  // Within one row of a row kernel (softmax, the norms): 16 lanes whose order depends on the
  // length alone, so a row gives the same bits wherever it sits in memory.
  std::vector<float> buf(600 + 16);
  for (std::size_t n : {std::size_t(1), std::size_t(5), std::size_t(16), std::size_t(17), std::size_t(255),
                        std::size_t(256), std::size_t(600)}) {
    INFO("n = " << n);
    // Integers: every partial sum is exact in float, so the sum is the closed form.
    auto const ints = kernels::detail::row_sum<float>(n, [](std::size_t c) { return float(c + 1); });
    CHECK(double(ints) == double(n) * double(n + 1) / 2);
    auto const top = kernels::detail::row_max<float>(n, [n](std::size_t c) { return float((c * 7919) % n) - 3.5f; });
    CHECK(double(top) == double(n) - 1 - 3.5);
    // Values with rounding: within n float roundings of the exact sum, and the same bits from
    // every offset in memory.
    std::vector<float> bits;
    for (std::size_t offset = 0; offset < 16; ++offset) {
      float* row = buf.data() + offset;
      double exact = 0;
      for (std::size_t c = 0; c < n; ++c) {
        row[c] = float(std::sin(0.7 * double(c)) * 1e3);
        exact += double(row[c]);
      }
      float const s = kernels::detail::row_sum<float>(n, [row](std::size_t c) { return row[c]; });
      double absolute = 0;
      for (std::size_t c = 0; c < n; ++c) absolute += std::fabs(double(row[c]));
      CHECK(std::fabs(double(s) - exact) <= double(n) * 0x1p-24 * absolute);
      bits.push_back(s);
    }
    for (float b : bits) CHECK(std::memcmp(&b, &bits[0], sizeof b) == 0);
  }
}
