// kernels::gemm against a naive product in double, on odd shapes, every transpose combination and
// several alpha/beta; the tolerance is the textbook bound for a k-term dot product in fp32.
#include <remat/kernels/gemm.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

using namespace remat;
using kernels::trans;

namespace {

template <class T>
void check_gemm(index_t m, index_t n, index_t k, trans ta, trans tb, T alpha, T beta, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  // Stored shapes (row-major): A is m x k or k x m, B is k x n or n x k.
  index_t const ar = ta == trans::no ? m : k, ac = ta == trans::no ? k : m;
  index_t const br = tb == trans::no ? k : n, bc = tb == trans::no ? n : k;
  tensor<T> a(ar, ac), b(br, bc), c(m, n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(d(rng));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(d(rng));
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = T(d(rng));
  auto const c0 = c.to_vector();
  kernels::gemm(a.view(), ta, b.view(), tb, c.view(), alpha, beta);
  double const eps = std::is_same_v<T, float> ? FLT_EPSILON : DBL_EPSILON;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (index_t p = 0; p < k; ++p) {
        double const x = ta == trans::no ? double(a(i, p)) : double(a(p, i));
        double const y = tb == trans::no ? double(b(p, j)) : double(b(j, p));
        ref += x * y;
        mag += std::fabs(x * y);
      }
      double const c_old = double(c0[std::size_t(i * n + j)]);
      double const want = double(alpha) * ref + double(beta) * c_old;
      double const tol = double(k + 2) * eps * (std::fabs(double(alpha)) * mag + std::fabs(double(beta) * c_old));
      INFO("m n k = " << m << " " << n << " " << k << ", transposes " << int(ta) << int(tb) << ", alpha " << alpha
                      << ", beta " << beta << ", at (" << i << ", " << j << ")");
      REQUIRE(std::fabs(double(c(i, j)) - want) <= tol);
    }
}

}  // namespace

TEMPLATE_TEST_CASE("gemm: odd shapes, all transposes, alpha and beta, against double", "[kernels][gemm]", float,
                   double) {
  struct shape {
    index_t m, n, k;
  };
  unsigned seed = 1;
  for (shape s : {shape{1, 1, 1}, shape{3, 5, 7}, shape{17, 13, 11}, shape{64, 1, 33}, shape{1, 65, 2},
                  shape{127, 129, 31}, shape{5, 3, 300}})
    for (trans ta : {trans::no, trans::yes})
      for (trans tb : {trans::no, trans::yes})
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.5, 2.0}, std::pair{-1.25, -0.5}})
          check_gemm<TestType>(s.m, s.n, s.k, ta, tb, TestType(alpha), TestType(beta), seed++);
}

TEST_CASE("gemm: fp32 on each host path (OpenBLAS, oneDNN) against double", "[kernels][gemm]") {
  struct restore {
    ~restore() { kernels::set_gemm32_path(kernels::gemm32_path::automatic); }
  } guard;
  std::vector<kernels::gemm32_path> paths{kernels::gemm32_path::openblas};
  if (kernels::has_onednn) paths.push_back(kernels::gemm32_path::onednn);
  else
    CHECK_THROWS_AS(kernels::set_gemm32_path(kernels::gemm32_path::onednn), argument_error);
  unsigned seed = 100;
  for (auto path : paths) {
    kernels::set_gemm32_path(path);
    REQUIRE(kernels::gemm32_path_now() == path);
    for (trans ta : {trans::no, trans::yes})
      for (trans tb : {trans::no, trans::yes}) {
        check_gemm<float>(37, 29, 41, ta, tb, 1.0f, 0.0f, seed++);
        check_gemm<float>(8, 33, 5, ta, tb, -0.75f, 1.5f, seed++);
      }
  }
  if (kernels::has_onednn) {  // automatic takes oneDNN when remat has it, OpenBLAS for the smallest
    using kernels::gemm32_path;
    kernels::set_gemm32_path(gemm32_path::automatic);
    CHECK(kernels::gemm32_path_now() == gemm32_path::onednn);
    CHECK(kernels::gemm32_path_for(1, 256, 256, trans::no, trans::yes) == gemm32_path::openblas);
    CHECK(kernels::gemm32_path_for(64, 64, 64, trans::no, trans::yes) == gemm32_path::openblas);  // 2^18 multiply-adds
    CHECK(kernels::gemm32_path_for(65, 64, 64, trans::no, trans::yes) == gemm32_path::onednn);
    // ... and OpenBLAS for fewer than 512 rows with neither operand transposed (dy W) where oneDNN
    // has no AVX-512 code (its bf16 matmul is the probe: it has one exactly where it has AVX-512)
    bool const avx512 = kernels::has_onednn_bf16();
    gemm32_path const plain_small = avx512 ? gemm32_path::onednn : gemm32_path::openblas;
    CHECK(kernels::gemm32_path_for(256, 1024, 1024, trans::no, trans::no) == plain_small);
    CHECK(kernels::gemm32_path_for(511, 64, 64, trans::no, trans::no) == plain_small);
    CHECK(kernels::gemm32_path_for(512, 64, 64, trans::no, trans::no) == gemm32_path::onednn);
    for (trans ta : {trans::no, trans::yes})
      for (trans tb : {trans::no, trans::yes})
        if (ta == trans::yes || tb == trans::yes)
          CHECK(kernels::gemm32_path_for(256, 1024, 1024, ta, tb) == gemm32_path::onednn);
    kernels::set_gemm32_path(gemm32_path::onednn);  // a path asked for holds for every size and layout
    CHECK(kernels::gemm32_path_for(1, 256, 256, trans::no, trans::yes) == gemm32_path::onednn);
    CHECK(kernels::gemm32_path_for(256, 1024, 1024, trans::no, trans::no) == gemm32_path::onednn);
  }
}

TEST_CASE("gemm: hand-computed 2x3 by 3x2", "[kernels][gemm]") {
  tensor<float> a(2, 3), b(3, 2), c(2, 2);
  float const av[] = {1, 2, 3, 4, 5, 6}, bv[] = {7, 8, 9, 10, 11, 12};
  a.copy_from(av);
  b.copy_from(bv);
  kernels::gemm(a.view(), trans::no, b.view(), trans::no, c.view());
  CHECK(c(0, 0) == 58.0f);
  CHECK(c(0, 1) == 64.0f);
  CHECK(c(1, 0) == 139.0f);
  CHECK(c(1, 1) == 154.0f);
  kernels::gemm(a.view(), trans::no, a.view(), trans::yes, c.view());  // A A^T
  CHECK(c(0, 0) == 14.0f);
  CHECK(c(0, 1) == 32.0f);
  CHECK(c(1, 1) == 77.0f);
}

TEST_CASE("gemm: mismatched shapes are shape errors naming the shapes, and C is untouched", "[kernels][gemm][errors]") {
  tensor<float> a(2, 3), b(4, 2), c(2, 2);
  for (std::size_t i = 0; i < 4; ++i) c[i] = 9.0f;
  CHECK_THROWS_AS(kernels::gemm(a.view(), trans::no, b.view(), trans::no, c.view()), shape_error);
  CHECK_THROWS_WITH(kernels::gemm(a.view(), trans::no, b.view(), trans::no, c.view()),
                    Catch::Contains("op(A) is 2 x 3") && Catch::Contains("found 4 x 2"));
  tensor<float> b2(3, 5);
  CHECK_THROWS_WITH(kernels::gemm(a.view(), trans::no, b2.view(), trans::no, c.view()),
                    Catch::Contains("2 x 5") && Catch::Contains("C is 2 x 2"));
  for (std::size_t i = 0; i < 4; ++i) CHECK(c[i] == 9.0f);
}

TEST_CASE("gemm: negative sizes and short leading dimensions are argument errors", "[kernels][gemm][errors]") {
  float a[6] = {}, b[6] = {}, c[4] = {};
  using kernels::lhs, kernels::rhs, kernels::result;
  CHECK_THROWS_AS(kernels::gemm(host{}, lhs(a, -1, 3), rhs(b, 3, 2), result(c, -1, 2)), argument_error);
  CHECK_THROWS_WITH(kernels::gemm(host{}, lhs(a, 2, 3, 2), rhs(b, 3, 2), result(c, 2, 2)),
                    Catch::Contains("leading dimension of A must be at least 3, found 2"));
}

TEST_CASE("gemm: k = 0 (empty A and B views) leaves beta * C, every host type and transpose", "[kernels][gemm]") {
  // An m x 0 by 0 x n product sums nothing: C = beta * C exactly (0 when beta is 0), the empty
  // operands' leading dimension of 0 accepted (BLAS itself wants at least 1).
  auto const run = [](auto zero, auto out_zero) {
    using T = decltype(zero);
    using Out = decltype(out_zero);
    T unused[1] = {T(0.0f)};
    for (trans ta : {trans::no, trans::yes})
      for (trans tb : {trans::no, trans::yes})
        for (float beta : {0.0f, 0.5f}) {
          Out c[6];
          for (int i = 0; i < 6; ++i) c[i] = Out(float(i + 1));
          tensor_view<T, host> a(unused, ta == trans::no ? 2 : 0, ta == trans::no ? 0 : 2);
          tensor_view<T, host> b(unused, tb == trans::no ? 0 : 3, tb == trans::no ? 3 : 0);
          kernels::gemm(a, ta, b, tb, tensor_view<Out, host>(c, 2, 3), compute_type_t<T>(0.75f),
                        compute_type_t<T>(beta));
          for (int i = 0; i < 6; ++i) {
            INFO("transposes " << int(ta) << int(tb) << ", beta " << beta << ", at " << i);
            CHECK(double(to_compute<float>(c[i])) == double(beta) * double(i + 1));
          }
        }
  };
  run(0.0f, 0.0f);
  run(0.0, 0.0);
  run(bfloat16(0.0f), bfloat16(0.0f));
  run(bfloat16(0.0f), 0.0f);
  run(half(0.0f), half(0.0f));
  run(half(0.0f), 0.0f);
}
