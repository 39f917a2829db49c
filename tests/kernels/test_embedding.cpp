// The embedding kernels on the host (kernels/embedding.hpp), which go row by row and a block of
// columns at a time: the lookup, the scatter-add of the output gradient into the rows the ids
// picked, the position table's add and its gradient. Checked against plain loops written here, in
// the order of sums the kernels promise (each element's terms in batch order, from its old value),
// so equal bit for bit; widths that end inside a block of columns, repeated ids, bf16 data with
// fp32 gradients, and values whose sum depends on the order.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

using namespace remat;

namespace {

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Values whose running sums round differently in another order: 1, then terms of a few ulps of 1
// and of 2^-30 (dropped next to 1, kept next to each other), alternating in sign.
float term(std::size_t k) {
  float const small[] = {0x1p-30f, 0x1p-23f, -0x1p-30f, 0x1.8p-23f, 0x1p-24f, -0x1p-22f, 3.0f, -0x1p-30f};
  return small[k % 8] * (k % 3 == 0 ? 1.0f : -1.0f);
}

template <class T>
void scatter_case(std::size_t rows, std::size_t w, std::size_t vocab) {
  std::vector<std::int32_t> ids(rows);
  for (std::size_t r = 0; r < rows; ++r) ids[r] = std::int32_t((r * 7 + r / 3) % vocab);  // repeats
  std::vector<T> dy(rows * w);
  for (std::size_t k = 0; k < dy.size(); ++k) dy[k] = T(term(k * 5 + 1));
  std::vector<float> g(vocab * w), expected;
  for (std::size_t k = 0; k < g.size(); ++k) g[k] = k % 2 ? 1.0f : -0.5f;
  expected = g;
  for (std::size_t r = 0; r < rows; ++r)  // batch order, from the old value, in fp32
    for (std::size_t i = 0; i < w; ++i) {
      float& e = expected[std::size_t(ids[r]) * w + i];
      e = e + to_compute<float>(dy[r * w + i]);
    }
  kernels::scatter_add_rows(host{}, ids.data(), rows, w, vocab, dy.data(), g.data());
  CHECK(same_bits(g, expected));

  std::vector<T> table(vocab * w), out(rows * w), want(rows * w);
  for (std::size_t k = 0; k < table.size(); ++k) table[k] = T(float(k % 251) - 125.0f);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < w; ++i) want[r * w + i] = table[std::size_t(ids[r]) * w + i];
  kernels::gather_rows(host{}, table.data(), ids.data(), rows, w, out.data());
  CHECK(same_bits(out, want));
}

template <class T>
void positions_case(std::size_t seq, std::size_t batch, std::size_t w) {
  std::size_t const rows = seq * batch;
  std::vector<T> x(rows * w), table(seq * w), out(rows * w), want(rows * w);
  for (std::size_t k = 0; k < x.size(); ++k) x[k] = T(term(k));
  for (std::size_t k = 0; k < table.size(); ++k) table[k] = T(1.0f + float(k % 13) * 0x1p-7f);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < w; ++i)
      want[r * w + i] = from_compute<T>(to_compute<float>(x[r * w + i]) + to_compute<float>(table[r % seq * w + i]));
  kernels::add_positions(host{}, x.data(), table.data(), rows, seq, w, out.data());
  CHECK(same_bits(out, want));

  std::vector<float> g(seq * w), expected;
  for (std::size_t k = 0; k < g.size(); ++k) g[k] = k % 3 ? 1.0f : 2.0f;
  expected = g;
  for (std::size_t t = 0; t < seq; ++t)  // each position's terms in sequence order
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t i = 0; i < w; ++i) expected[t * w + i] += to_compute<float>(x[(b * seq + t) * w + i]);
  kernels::add_positions_backward(host{}, x.data(), rows, seq, w, g.data());
  CHECK(same_bits(g, expected));
}

}  // namespace

TEST_CASE("embedding kernels: the lookup and its scatter-add, row by row, in batch order", "[kernels]") {
  for (std::size_t w : {1, 5, 64, 70, 200}) {
    CAPTURE(w);
    scatter_case<float>(37, w, 6);
    scatter_case<bfloat16>(37, w, 6);
    scatter_case<float>(300, w, 256);
  }
}

TEST_CASE("embedding kernels: the position table's add and its gradient, in sequence order", "[kernels]") {
  for (std::size_t w : {1, 5, 64, 70, 200}) {
    CAPTURE(w);
    positions_case<float>(9, 4, w);
    positions_case<bfloat16>(9, 4, w);
    positions_case<float>(3, 11, w);
  }
}
