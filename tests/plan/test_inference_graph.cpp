// inference_graph on the host, where a replay runs the forward again in the reserved arena: the
// staging, the shape checks, run() of fewer rows than captured, the recapture when what the
// forward reads moves (the arena grown by a training pass, a new reservation, BatchNorm's running
// state swapped, a bf16 model's compute weights recast), and no allocation over 1,000 calls. The
// same test runs captured on the GPU (tests/cuda/test_cuda.cu).
#include <remat/remat.hpp>

#include "support/plan_models.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

using namespace remat;

namespace {

using Surrogate = Seq<Linear<5, 64>, GELU, Linear<64, 64>, GELU, Linear<64, 5>>;
constexpr std::size_t C = 4, H = 8;
using ConvNet = Seq<Conv2d<1, C, 3, H, H, 1, 1>, BatchNorm2d<C, H, H>, ReLU, plan_models::ConvBlock<C, H>,
                    AvgPool2d<C, H, H>, Linear<C * H * H / 4, 5>>;

template <class T = float>
tensor<T> input(std::size_t rows, std::size_t cols, double k) {
  tensor<T> x{index_t(rows), index_t(cols)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(std::sin(k * double(i)) + 0.3 * std::cos(0.7 * double(i)));
  return x;
}

template <class T>
std::vector<T> values(tensor_view<T const> v) {
  return std::vector<T>(v.data(), v.data() + v.size());
}
template <class T>
std::vector<T> values(tensor<T> const& t) {
  return values(t.view());
}

// A model that trains between inference calls: run() and replay() equal forward(x) bit for bit,
// before and after training steps (which grow the arena, and for BatchNorm swap the running
// state), each move captured again.
template <class N, class P>
void require_graph_follows_forward(std::size_t train_batch, bool swaps_running_state) {
  memory::caching_allocator<host> alloc;
  model<N, host, P> m(seed{6}, alloc);
  AdamW opt(m, {.lr = 1e-2});
  std::size_t const rows = 16;
  m.reserve_inference(rows);
  inference_graph g(m, rows);
  CHECK(g.captures() == 1);
  CHECK(g.rows() == rows);
  CHECK(g.cols() == N::in_width);
  tensor<float> x = input(rows, N::in_width, 0.31), y(index_t(rows), 5);
  std::size_t const reserved = m.arena_bytes();
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    std::vector<float> const want = values(m.forward(x));
    g.run(x, y);
    CHECK(values(y) == want);
    // Fewer rows than captured: the first rows of the output.
    tensor<float> y3(3, 5);
    g.run(x.view().row_range(0, 3), y3);
    CHECK(values(y3) == std::vector<float>(want.begin(), want.begin() + 15));
    // Zero copy: the staging tensors themselves.
    std::memcpy(g.input().data(), x.data(), x.bytes());
    g.replay();
    CHECK(values(g.output()) == want);
    // Training between replays (a larger batch: the arena grows, the graph captures again).
    tensor<float> xt = input(train_batch, N::in_width, 0.13 + round), t = input(train_batch, 5, 0.29);
    m.template train_step<MSE>(xt, t, opt);
  }
  g.run(x, y);
  CHECK(values(y) == values(m.forward(x)));
  // Captured again when the training pass's larger arena replaced the reserved one (the first
  // step), and after every step that swapped the running state.
  std::size_t const recaptures = swaps_running_state ? 3 : std::size_t(m.arena_bytes() != reserved);
  CHECK(g.captures() == 1 + recaptures);
}

}  // namespace

TEST_CASE("inference graph: replays follow forward(x) bit for bit, recaptured when the model's memory moves",
          "[plan][arena][inference][graph]") {
  // Training at 64 rows grows the arena (the first step): one recapture.
  require_graph_follows_forward<Surrogate, fp32>(64, false);
  // The compute copy is recast after each step, in place (before the replay, not in it).
  require_graph_follows_forward<Surrogate, mixed<bfloat16>>(2, false);
  // BatchNorm's running state is swapped by every training pass: a recapture each round.
  require_graph_follows_forward<ConvNet, fp32>(4, true);
}

TEST_CASE("inference graph: 1,000 replays allocate nothing; bad shapes refused, nothing written",
          "[plan][arena][inference][graph]") {
  memory::caching_allocator<host> alloc;
  model<Surrogate> m(seed{2}, alloc);
  // No reservation: refused.
  CHECK_THROWS_AS(inference_graph(m, 8), argument_error);
  m.reserve_inference(32);
  CHECK_THROWS_AS(inference_graph(m, 33), shape_error);
  CHECK_THROWS_AS(inference_graph(m, 0), argument_error);
  inference_graph g(m, 32);
  // Its own memory: the staging input and output (32 x 5 floats each, rounded to 256 bytes).
  CHECK(g.bytes() == 2 * 768);
  tensor<float> x = input(32, 5, 0.9), y(32, 5);
  g.run(x, y);
  std::size_t const asked = alloc.stats().system_allocations +
                            memory::default_allocator<host>().stats().system_allocations;
  std::size_t wrong = 0;
  std::vector<float> const want = values(m.forward(x));
  for (int i = 0; i < 1000; ++i) {
    std::size_t const rows = 1 + std::size_t(i * 7) % 32;
    tensor_view<float> out = y.view().row_range(0, rows);
    g.run(x.view().row_range(0, rows), out);
    wrong += !std::equal(out.data(), out.data() + out.size(), want.begin());
  }
  CHECK(wrong == 0);
  CHECK(alloc.stats().system_allocations + memory::default_allocator<host>().stats().system_allocations == asked);
  CHECK(g.captures() == 1);
  // Too many rows, a wrong width, a wrong output: shape_error, the output untouched.
  std::fill(y.data(), y.data() + y.size(), 7.0f);
  tensor<float> big = input(33, 5, 0.1), big_y(33, 5), narrow = input(4, 4, 0.1);
  CHECK_THROWS_AS(g.run(big, big_y), shape_error);
  CHECK_THROWS_AS(g.run(narrow, y.view().row_range(0, 4)), shape_error);
  CHECK_THROWS_AS(g.run(x.view().row_range(0, 4), y.view().row_range(0, 5)), shape_error);
  // A bad value: refused as forward refuses it.
  tensor<float> bad = input(4, 5, 0.1);
  bad[3] = std::nanf("");
  CHECK_THROWS_AS(g.run(bad, y.view().row_range(0, 4)), argument_error);
  CHECK(std::all_of(y.data(), y.data() + y.size(), [](float v) { return v == 7.0f; }));
  // The arena turned off: the graph cannot replay any more.
  m.use_planned_arena(false);
  CHECK(m.inference_batch() == 0);
  CHECK_THROWS_AS(g.replay(), argument_error);
}
