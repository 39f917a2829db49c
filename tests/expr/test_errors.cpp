#include <remat/expr/expr.hpp>
#include <remat/kernels/evaluate.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

using namespace remat;

TEST_CASE("expression errors: operands of different sizes name both sizes", "[expr][errors]") {
  tensor<float> x(2, 3), y(4, 2);
  CHECK_THROWS_AS(x + y, shape_error);
  CHECK_THROWS_WITH(x * exp(y), Catch::Contains("6 elements") && Catch::Contains("found 8"));
  CHECK_THROWS_AS(gelu(x) - y, error);  // a shape_error is a remat::error
}

TEST_CASE("expression errors: a destination of the wrong size is refused before anything is written",
          "[expr][errors]") {
  tensor<float> x(2, 3), out(3, 3);
  for (std::size_t i = 0; i < 9; ++i) out[i] = 5.0f;
  for (std::size_t i = 0; i < 6; ++i) x[i] = 1.0f;
  CHECK_THROWS_WITH(evaluate(out, x * 2.0), Catch::Contains("expected an expression of 9 elements") &&
                                                Catch::Contains("found 6"));
  for (std::size_t i = 0; i < 9; ++i) CHECK(out[i] == 5.0f);
}

TEST_CASE("expression: a constant fills a tensor of any size", "[expr]") {
  tensor<double> out(2, 5);
  evaluate(out, expr::to_expr(0.25));
  for (std::size_t i = 0; i < 10; ++i) CHECK(out[i] == 0.25);
}
