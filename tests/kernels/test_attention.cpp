// kernels::causal_attention_forward and _backward, which make causal attention's products and
// softmax tile by tile (on the host a sequence-head at a time, in a tile of scores of its own),
// against the passes they replace: batched products over every tile around causal_softmax (or
// causal_softmax_backward) over whole seq x seq matrices. They promise the same bits, in fp32,
// bf16 and half, with and without a dropout mask, on one thread and on several; and the scores
// they write stay inside attention_scores_rows.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include "support/values.hpp"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t sequences = 2, heads = 3, hw = 8, W = heads * hw, seq = 150, tile = 64;  // tiles 64, 64, 22
constexpr std::size_t count = sequences * heads;

// Dropout's factors by element of the count * seq x seq matrices: 0 for every seventh, else 1.25.
struct every_seventh {
  float operator()(std::size_t i) const { return i % 7 == 3 ? 0.0f : 1.25f; }
};

// The per-head blocks of a (sequences * seq) x 3W input (q | k | v) and of a (sequences * seq) x W
// output.
constexpr kernels::matrix_layout qkv_blocks{index_t(seq), index_t(hw), index_t(3 * W),
                                            {index_t(seq * 3 * W), index_t(hw)}};
constexpr kernels::matrix_layout out_blocks{index_t(seq), index_t(hw), index_t(W), {index_t(seq * W), index_t(hw)}};
constexpr kernels::matrix_layout squares{index_t(seq), index_t(seq), index_t(seq),
                                         {index_t(heads * seq * seq), index_t(seq * seq)}};

template <class T>
kernels::attention_blocks<T> blocks(T const* q, kernels::matrix_layout qb, T const* x, T* y,
                                    kernels::matrix_layout yb) {
  return {{count, heads}, index_t(tile),         kernels::lhs(q, qb), kernels::rhs(x + W, qkv_blocks),
          kernels::rhs(x + 2 * W, qkv_blocks), kernels::result(y, yb)};
}

// f(r0, rb) for each tile of the sequence.
template <class F>
void tiles(F const& f) {
  for (std::size_t r0 = 0; r0 < seq; r0 += tile) f(index_t(r0), index_t(seq - r0 < tile ? seq - r0 : tile));
}

template <class T>
void check_attention(int threads) {
  using V = compute_type_t<T>;
  constexpr bool in_place = std::is_same_v<T, V>;
  int const before = omp_get_max_threads();
  omp_set_num_threads(threads);
  V const scale = V(0.35f);
  std::vector<T> const x = random_values<T>(sequences * seq * 3 * W, 1), dy = random_values<T>(sequences * seq * W, 2);
  std::size_t const squares_n = count * seq * seq;

  // The passes: the scores of every tile, the softmax over the whole matrices, then y.
  std::vector<V> scores(squares_n);
  std::vector<T> probs_ref(squares_n), y_ref(sequences * seq * W);
  {
    V* z = in_place ? reinterpret_cast<V*>(probs_ref.data()) : scores.data();
    tiles([&](index_t r0, index_t rb) {
      kernels::gemm_batched(host{}, {count, heads}, kernels::lhs(x.data(), qkv_blocks).window(r0, 0, rb, index_t(hw)),
                            kernels::rhs(x.data() + W, qkv_blocks).window(0, 0, r0 + rb, index_t(hw)).transposed(),
                            kernels::result(z, squares).window(r0, 0, rb, r0 + rb));
    });
    kernels::causal_softmax(host{}, z, probs_ref.data(), count, seq, scale);
    tiles([&](index_t r0, index_t rb) {
      kernels::gemm_batched(host{}, {count, heads}, kernels::lhs(probs_ref.data(), squares).window(r0, 0, rb, r0 + rb),
                            kernels::rhs(x.data() + 2 * W, qkv_blocks).window(0, 0, r0 + rb, index_t(hw)),
                            kernels::result(y_ref.data(), out_blocks).window(r0, 0, rb, index_t(hw)));
    });
  }
  // Tile by tile, in exactly the scores the kernels ask for (in place in fp32: none).
  std::size_t const tile_n = in_place ? 0 : kernels::attention_scores_rows(count, seq, tile) * seq;
  REQUIRE(kernels::attention_scores_rows(count, seq, tile) == count * tile);
  std::vector<V> own(tile_n);
  std::vector<T> probs(squares_n), y(sequences * seq * W);
  kernels::causal_attention_forward(host{}, blocks(x.data(), qkv_blocks, x.data(), y.data(), out_blocks), own.data(),
                                    probs.data(), scale);
  CHECK(same_bits(probs, probs_ref));
  CHECK(same_bits(y, y_ref));
  bool sums_to_one = true;  // (a check that the reference itself is a causal softmax)
  for (std::size_t r = 0; r < count * seq; ++r) {
    double s = 0;
    for (std::size_t c = 0; c < seq; ++c) s += double(to_compute<V>(probs[r * seq + c])) * (c <= r % seq);
    for (std::size_t c = r % seq + 1; c < seq; ++c) sums_to_one &= to_compute<V>(probs[r * seq + c]) == V(0);
    sums_to_one &= std::abs(s - 1.0) < 0.02;
  }
  CHECK(sums_to_one);

  // Backward, with and without a dropout mask.
  for (bool masked : {false, true}) {
    std::vector<V> dpd(squares_n);
    std::vector<T> ds_ref(squares_n), dq_ref(sequences * seq * 3 * W);
    V* g = in_place ? reinterpret_cast<V*>(ds_ref.data()) : dpd.data();
    tiles([&](index_t r0, index_t rb) {
      kernels::gemm_batched(host{}, {count, heads}, kernels::lhs(dy.data(), out_blocks).window(r0, 0, rb, index_t(hw)),
                            kernels::rhs(x.data() + 2 * W, qkv_blocks).window(0, 0, r0 + rb, index_t(hw)).transposed(),
                            kernels::result(g, squares).window(r0, 0, rb, r0 + rb));
    });
    if (masked)
      kernels::causal_softmax_backward(host{}, probs_ref.data(), static_cast<V const*>(g), ds_ref.data(), count, seq,
                                       scale, every_seventh{});
    else
      kernels::causal_softmax_backward(host{}, probs_ref.data(), static_cast<V const*>(g), ds_ref.data(), count, seq,
                                       scale, kernels::no_mask<V>{});
    tiles([&](index_t r0, index_t rb) {
      kernels::gemm_batched(host{}, {count, heads}, kernels::lhs(ds_ref.data(), squares).window(r0, 0, rb, r0 + rb),
                            kernels::rhs(x.data() + W, qkv_blocks).window(0, 0, r0 + rb, index_t(hw)),
                            kernels::result(dq_ref.data(), qkv_blocks).window(r0, 0, rb, index_t(hw)));
    });
    std::vector<T> ds(squares_n), dq(sequences * seq * 3 * W);
    auto const b = blocks(dy.data(), out_blocks, x.data(), dq.data(), qkv_blocks);
    if (masked)
      kernels::causal_attention_backward(host{}, b, own.data(), probs.data(), ds.data(), scale, every_seventh{});
    else
      kernels::causal_attention_backward(host{}, b, own.data(), probs.data(), ds.data(), scale, kernels::no_mask<V>{});
    CHECK(same_bits(ds, ds_ref));
    CHECK(same_bits(dq, dq_ref));
  }
  omp_set_num_threads(before);
}

}  // namespace

TEST_CASE("causal attention tile by tile gives the passes' bits: fp32, bf16 and half, 1 and 2 threads",
          "[kernels][attention]") {
  for (int threads : {1, 2}) {
    check_attention<float>(threads);
    check_attention<bfloat16>(threads);
    check_attention<half>(threads);
  }
}
