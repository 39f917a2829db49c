#include <remat/expr/expr.hpp>
#include <remat/kernels/evaluate.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

using namespace remat;

TEST_CASE("expression errors: operands of different sizes name both shapes", "[expr][errors]") {
  tensor<float> x(2, 3), y(4, 2);
  CHECK_THROWS_AS(x + y, shape_error);
  CHECK_THROWS_WITH(x * exp(y), Catch::Contains("to be 2 x 3") && Catch::Contains("found 4 x 2"));
  CHECK_THROWS_AS(gelu(x) - y, error);  // a shape_error is a remat::error
}

TEST_CASE("expression errors: operands of the same size but different shapes are refused", "[expr][errors]") {
  tensor<float> a(4, 3), b(3, 4), c(12, 1), d(4, 3);
  CHECK_THROWS_WITH(a + b, Catch::Contains("to be 4 x 3") && Catch::Contains("found 3 x 4"));
  CHECK_THROWS_AS(a * c, shape_error);
  CHECK_THROWS_AS(exp(a) - b * 2.0, shape_error);  // through nodes, not only at terminals
  CHECK_NOTHROW(a + d);
  CHECK_NOTHROW(2.0 * a + exp(d));  // constants take any shape
  // A view of the same memory with another shape is a different shape too.
  tensor_view<float const, host> const d_as_3x4(d.data(), 3, 4);
  CHECK_THROWS_AS(a + d_as_3x4, shape_error);
}

TEST_CASE("expression errors: a bias row broadcast over a matrix of another width is refused", "[expr][errors]") {
  // 4 rows of width 3 hold 12 elements, as 3 rows of width 4 do: the count alone cannot tell.
  tensor<float> x(3, 4), b3(1, 3), b4(1, 4), out(3, 4);
  for (std::size_t i = 0; i < 12; ++i) x[i] = float(i), out[i] = -1.0f;
  for (std::size_t i = 0; i < 3; ++i) b3[i] = 100.0f;
  for (std::size_t i = 0; i < 4; ++i) b4[i] = float(10 * i);
  CHECK_THROWS_WITH(x + broadcast_rows(b3, 4), Catch::Contains("to be 3 x 4") && Catch::Contains("found 4 x 3"));
  CHECK_THROWS_AS(evaluate(out, broadcast_rows(b3, 4) * 2.0), shape_error);  // the destination is 3 x 4
  for (std::size_t i = 0; i < 12; ++i) CHECK(out[i] == -1.0f);
  evaluate(out, x + broadcast_rows(b4, 3));
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 4; ++c) CHECK(out[r * 4 + c] == float(r * 4 + c) + float(10 * c));
}

TEST_CASE("expression errors: a destination of the wrong size is refused before anything is written",
          "[expr][errors]") {
  tensor<float> x(2, 3), out(3, 3);
  for (std::size_t i = 0; i < 9; ++i) out[i] = 5.0f;
  for (std::size_t i = 0; i < 6; ++i) x[i] = 1.0f;
  CHECK_THROWS_WITH(evaluate(out, x * 2.0), Catch::Contains("expected an expression of 3 x 3") &&
                                                Catch::Contains("found 2 x 3"));
  for (std::size_t i = 0; i < 9; ++i) CHECK(out[i] == 5.0f);
  // The same count in another shape: a 9 x 1 into the 3 x 3.
  tensor<float> column(9, 1);
  CHECK_THROWS_WITH(evaluate(out, column + 1.0), Catch::Contains("found 9 x 1"));
  for (std::size_t i = 0; i < 9; ++i) CHECK(out[i] == 5.0f);
}

TEST_CASE("expression: a constant fills a tensor of any size", "[expr]") {
  tensor<double> out(2, 5);
  evaluate(out, expr::to_expr(0.25));
  for (std::size_t i = 0; i < 10; ++i) CHECK(out[i] == 0.25);
}
