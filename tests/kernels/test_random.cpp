// kernels::transform_uniform, which makes each Philox block once for the four elements it serves,
// against the stream's definition one element at a time: element e of stream s under key k is word
// e % 4 of philox::generate(counter (e / 4, s), k) (the generator is checked against the published
// known-answer vectors in layers/test_layers.cpp), its top 24 bits times 2^-24. Offsets that start
// inside a block and past 2^34 (the counter's upper word), lengths that end inside a block and
// inside a host chunk, one thread and all of them. Then Dropout's masked pass (expr::apply_mask)
// against evaluate(out, x * mask) bit for bit in double, float, bfloat16 and half, in place too.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace remat;

namespace {

// Element e of the stream, by the definition (not through philox::uniform).
float defined_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t e) {
  std::uint64_t const q = e / 4;
  philox::block const r = philox::generate(
      {{std::uint32_t(q), std::uint32_t(q >> 32), std::uint32_t(stream), std::uint32_t(stream >> 32)}},
      std::uint32_t(seed), std::uint32_t(seed >> 32));
  return float(r.v[e % 4] >> 8) / 16777216.0f;
}

struct copy_uniform {
  REMAT_HOST_DEVICE float operator()(std::size_t, float u) const { return u; }
};

// Reads out[i] before writing it (the in-place use): out[i] + u.
struct add_uniform {
  float const* out;
  REMAT_HOST_DEVICE float operator()(std::size_t i, float u) const { return out[i] + u; }
};

// Elements where transform_uniform's numbers differ from the definition's.
long mismatches(std::uint64_t seed, std::uint64_t stream, std::uint64_t offset, std::size_t n) {
  std::vector<float> got(n, -1.0f);
  kernels::transform_uniform(host{}, n, got.data(), {seed, stream, offset}, copy_uniform{});
  long wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    wrong += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(defined_uniform(seed, stream, offset + i));
  return wrong;
}

}  // namespace

TEST_CASE("transform_uniform: each element's number is the stream's definition, however the pass starts, ends and splits",
          "[kernels][random]") {
  std::uint64_t const seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull;
  // offsets at and inside a block, and across the counter's upper word (block 2^32 at element 2^34)
  for (std::uint64_t offset : {0ull, 1ull, 2ull, 3ull, 4ull, 1021ull, (1ull << 34) - 4101ull}) {
    for (std::size_t n : {1u, 2u, 3u, 4u, 5u, 63u, 1023u, 1024u, 1025u, 4099u, 100003u}) {
      INFO("offset " << offset << ", " << n << " elements");
      CHECK(mismatches(seed, stream, offset, n) == 0);
    }
  }
  // the seed's and stream's two words each reach the numbers
  CHECK(mismatches(1, 2, 7, 1000) == 0);
  CHECK(mismatches(1ull << 32, 2ull << 32, 7, 1000) == 0);
  // philox::uniform (one element at a time, what the attention rows draw) is the same function
  for (std::uint64_t e : {0ull, 1ull, 2ull, 3ull, 5ull, 998ull, (1ull << 34) + 3ull})
    CHECK(std::bit_cast<std::uint32_t>(philox::uniform(seed, stream, e)) ==
          std::bit_cast<std::uint32_t>(defined_uniform(seed, stream, e)));
#if defined(_OPENMP)
  int const threads = omp_get_max_threads();
  omp_set_num_threads(1);
  CHECK(mismatches(seed, stream, 3, 100003) == 0);
  omp_set_num_threads(3);
  CHECK(mismatches(seed, stream, 3, 100003) == 0);
  omp_set_num_threads(threads);
#endif
  // in place: f reads out[i]
  std::size_t const n = 5001;
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(i);
  kernels::transform_uniform(host{}, n, v.data(), {seed, stream, 2}, add_uniform{v.data()});
  long wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += v[i] != float(i) + defined_uniform(seed, stream, 2 + i);
  CHECK(wrong == 0);
}

TEMPLATE_TEST_CASE("apply_mask: Dropout's pass gives evaluate(out, x * mask)'s bits", "[kernels][random]", double, float,
                   bfloat16, half) {
  using T = TestType;
  // 7 x 1001: an odd number of elements; mask from element 4099 of its stream (inside a block)
  tensor<T> x(7, 1001), want(7, 1001), got(7, 1001);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(float(std::sin(double(i)) * 100.0));
  x[5] = T(INFINITY);  // a dropped infinity is NaN both ways
  x[6] = T(-0.5f);     // a dropped negative is -0 both ways
  for (double p : {0.1, 0.5, 0.9}) {
    expr::dropout_mask const mask{{}, {17, 3, 4099}, float(p), float(1.0 / (1.0 - p))};
    evaluate(want, x * mask);
    expr::apply_mask(got, x, mask);
    CHECK(std::memcmp(want.data(), got.data(), x.size() * sizeof(T)) == 0);
    std::size_t zeros = 0;
    for (std::size_t i = 0; i < got.size(); ++i) zeros += to_compute<float>(got[i]) == 0.0f;
    CHECK(double(zeros) / double(got.size()) == Approx(p).margin(0.03));
    // in place, as Dropout's backward writes dx over dy
    tensor<T> inplace(7, 1001);
    std::memcpy(inplace.data(), x.data(), x.size() * sizeof(T));
    expr::apply_mask(inplace, inplace, mask);
    CHECK(std::memcmp(want.data(), inplace.data(), x.size() * sizeof(T)) == 0);
  }
  tensor<T> wrong(1001, 7);
  expr::dropout_mask const mask{{}, {17, 3, 0}, 0.5f, 2.0f};
  CHECK_THROWS_AS(expr::apply_mask(wrong, x, mask), shape_error);
}

namespace {

// The same mask without values(): causal_softmax_backward and the panels then draw it element by
// element, as before they drew a row at once.
struct per_element_mask {
  kernels::mask_values<float, expr::dropout_mask> m;
  float operator()(std::size_t i) const { return m(i); }
};

}  // namespace

TEST_CASE("mask_values: a row's mask drawn at once is the mask element by element, and so are the softmax backward's rows",
          "[kernels][random]") {
  expr::dropout_mask const dm{{}, {5, 6, 7}, 0.25f, float(1.0 / 0.75)};
  kernels::mask_values<float, expr::dropout_mask> const mask{dm};
  for (std::size_t first : {0u, 1u, 3u, 4097u})
    for (std::size_t n : {1u, 2u, 5u, 255u, 2048u, 3001u}) {
      std::vector<float> got(n);
      mask.values(first, n, got.data());
      long wrong = 0;
      for (std::size_t c = 0; c < n; ++c) wrong += std::bit_cast<std::uint32_t>(got[c]) != std::bit_cast<std::uint32_t>(mask(first + c));
      INFO("first " << first << ", " << n << " elements");
      CHECK(wrong == 0);
    }
  // The softmax's backward over 3 sequence-heads of 37 and of 2100 positions (rows longer than a
  // row's drawn mask: element by element there), the rows' masks drawn at once against element by
  // element: the same bits.
  for (std::size_t seq : {37u, 2100u}) {
    std::size_t const count = 3, rows = count * seq;
    std::vector<float> probs(rows * seq), dpd(rows * seq), a(rows * seq), b(rows * seq);
    for (std::size_t i = 0; i < probs.size(); ++i) {
      probs[i] = float(0.5 + 0.5 * std::sin(double(i)));
      dpd[i] = float(std::cos(double(i) * 0.7));
    }
    kernels::causal_softmax_backward(host{}, probs.data(), dpd.data(), a.data(), count, seq, 0.125f, mask);
    kernels::causal_softmax_backward(host{}, probs.data(), dpd.data(), b.data(), count, seq, 0.125f,
                                     per_element_mask{mask});
    INFO(seq << " positions");
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
}
