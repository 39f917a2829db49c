#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

using namespace remat;

TEST_CASE("tensor: a compile-time width and a run-time batch", "[tensor]") {
  memory::caching_allocator<host> a;
  tensor<float, host, 7> t(5, memory::tag::activations, a);
  STATIC_REQUIRE(decltype(t)::static_width == 7);
  CHECK(t.rows() == 5);
  CHECK(t.cols() == 7);
  CHECK(t.size() == 35);
  CHECK(t.bytes() == 140);
  CHECK(t.tag() == memory::tag::activations);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(i);
  CHECK(t(2, 3) == 17.0f);
  // A view of a static width costs a pointer and a row count.
  STATIC_REQUIRE(sizeof(tensor_view<float, host, 7>) == sizeof(float*) + sizeof(std::size_t));
}

TEST_CASE("tensor: a run-time width", "[tensor]") {
  tensor<double> t(3, 4);
  CHECK(t.rows() == 3);
  CHECK(t.cols() == 4);
  std::vector<double> v(12);
  std::iota(v.begin(), v.end(), 1.0);
  t.copy_from(v);
  CHECK(t.to_vector() == v);
  CHECK(t(1, 0) == 5.0);
}

TEST_CASE("tensor: negative or zero sizes are argument errors naming the size", "[tensor][errors]") {
  CHECK_THROWS_AS((tensor<float, host, 4>(0)), argument_error);
  CHECK_THROWS_WITH((tensor<float, host, 4>(-3)), Catch::Contains("expected a positive size, found -3"));
  CHECK_THROWS_AS((tensor<float>(2, 0)), argument_error);
  CHECK_THROWS_WITH((tensor<float>(-1, 5)), Catch::Contains("rows") && Catch::Contains("found -1"));
}

TEST_CASE("tensor: moves transfer the memory and free it once", "[tensor]") {
  memory::caching_allocator<host> a;
  {
    tensor<float, host, 64> x(2, memory::tag::gradients, a);
    float* p = x.data();
    tensor<float, host, 64> y(std::move(x));
    CHECK(y.data() == p);
    CHECK(x.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    CHECK(a.stats().total.in_use == 512);
    tensor<float, host, 64> z(1, memory::tag::gradients, a);
    z = std::move(y);
    CHECK(z.rows() == 2);
    CHECK(a.stats().total.in_use == 512);
  }
  CHECK(a.stats().total.in_use == 0);
}

TEST_CASE("tensor: views slice rows and convert to const and to a run-time width", "[tensor]") {
  tensor<int, host, 3> t(4);
  for (std::size_t i = 0; i < 12; ++i) t[i] = int(i);
  tensor_view<int, host, 3> v = t;
  auto mid = v.row_range(1, 2);
  CHECK(mid.rows() == 2);
  CHECK(mid(0, 0) == 3);
  CHECK(mid(1, 2) == 8);
  tensor_view<int const, host, 3> c = mid;
  tensor_view<int const, host> d = c;
  CHECK(d.cols() == 3);
  CHECK(d[5] == 8);
  CHECK(v.row_range(4, 0).empty());
  CHECK_THROWS_AS(v.row_range(3, 2), shape_error);
  CHECK_THROWS_WITH(v.row_range(3, 2), Catch::Contains("[0, 4)") && Catch::Contains("[3, 5)"));
  int raw[6] = {};
  CHECK_THROWS_AS((tensor_view<int, host, 3>(raw, 3, 2)), shape_error);
}

TEST_CASE("tensor: copying in the wrong number of values is a shape error", "[tensor][errors]") {
  tensor<float> t(2, 2);
  t[0] = 42.0f;
  std::vector<float> v(5, 1.0f);
  CHECK_THROWS_WITH(t.copy_from(v), Catch::Contains("expected 4 values") && Catch::Contains("found 5"));
  CHECK(t[0] == 42.0f);  // untouched
}
