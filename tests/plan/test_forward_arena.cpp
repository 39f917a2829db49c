// Passes outside training in the planned arena (plan/forward.hpp): a program that trains,
// validates and infers at several batches reserves for activations exactly the largest plan of
// the passes it ran, under every storage policy, with the same bits as without the arena; the
// inference call into the caller's tensor allocates nothing after reserve_inference, over 1,000
// calls at batches up to the maximum, refuses a larger batch with nothing written, and runs on
// several threads.
#include <remat/remat.hpp>

#include "support/plan_models.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

using namespace remat;

namespace {

using plan_models::Block;
using plan_models::Net;

// A convolutional model with batch normalisation: its running statistics in eval mode.
constexpr std::size_t C = 4, H = 8;
using ConvBlock = plan_models::ConvBlock<C, H>;
template <class Middle>
using ConvNet = Seq<Conv2d<1, C, 3, H, H, 1, 1>, BatchNorm2d<C, H, H>, ReLU, Middle, AvgPool2d<C, H, H>,
                    Linear<C * H * H / 4, 5>>;

template <class Sz>
std::size_t bits_differ(std::vector<Sz> const& a, std::vector<Sz> const& b) {
  if (a.size() != b.size()) return std::size_t(-1);
  return std::size_t(std::memcmp(a.data(), b.data(), a.size() * sizeof(Sz)) != 0);
}

tensor<float> input(std::size_t rows, std::size_t cols, double k) {
  tensor<float> x{index_t(rows), index_t(cols)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(k * double(i)) + 0.3 * std::cos(0.7 * double(i)));
  return x;
}

std::vector<float> values(tensor<float> const& t) { return std::vector<float>(t.data(), t.data() + t.size()); }

// What a program sees of one model: losses and outputs of each pass.
struct seen {
  std::vector<double> losses;
  std::vector<std::vector<float>> outputs;
};

// Trains at batch 8, validates (loss) at 13, measures training_loss at 5, infers at 21 and (into
// a tensor of the caller's) at 3, then trains again at 8 and infers at 2: every pass in the arena
// when it is on, each with nothing outside it, and the arena the largest of their plans.
template <class N, class P>
seen run(bool arena, memory::caching_allocator<host>& alloc) {
  model<N, host, P> m(seed{4}, alloc);
  m.use_planned_arena(arena);
  AdamW opt(m, {.lr = 1e-2});
  seen out;
  std::size_t largest = 0;
  auto const planned = [&](pass_report const& r, std::size_t layout) {
    CHECK(r.planned == arena);
    CHECK(r.unplanned == 0);
    largest = std::max(largest, layout);
    if (arena) {
      CHECK(m.arena_bytes() == largest);
      CHECK(alloc.stats()[memory::tag::activations].reserved == largest);
      CHECK(alloc.stats()[memory::tag::workspace].reserved == 0);
    }
  };
  auto const train = [&](std::size_t batch) {
    tensor<float> x = input(batch, N::in_width, 0.37), t = input(batch, 5, 0.11);
    out.losses.push_back(m.template train_step<MSE>(x, t, opt));
    planned(m.last_pass(), arena_plan<N, P>(batch).bytes);
  };
  train(8);
  {
    tensor<float> x = input(13, N::in_width, 0.5), t = input(13, 5, 0.2);
    out.losses.push_back(m.template loss<MSE>(x, t));
    planned(m.last_forward(), forward_plan<N, P>(forward_kind::loss, 13).bytes);
  }
  {
    tensor<float> x = input(5, N::in_width, 0.9), t = input(5, 5, 0.3);
    out.losses.push_back(m.template training_loss<MSE>(x, t));
    planned(m.last_forward(), forward_plan<N, P>(forward_kind::training_loss, 5).bytes);
  }
  {
    tensor<float> y = m.forward(input(21, N::in_width, 0.2));
    out.outputs.push_back(values(y));
    // The activation peak of the pass, its output (still held) included, is the plan's.
    if (arena) CHECK(m.last_forward().activation_peak == forward_plan<N, P>(forward_kind::inference, 21).lower_bound);
  }
  planned(m.last_forward(), forward_plan<N, P>(forward_kind::inference, 21).bytes);
  {
    tensor<float> y(3, 5);
    m.forward(input(3, N::in_width, 0.4), y);
    out.outputs.push_back(values(y));
    planned(m.last_forward(), inference_plan<N, P>(3).bytes);
  }
  train(8);
  {
    tensor<float> y = m.forward(input(2, N::in_width, 0.6));
    out.outputs.push_back(values(y));
  }
  planned(m.last_forward(), forward_plan<N, P>(forward_kind::inference, 2).bytes);
  // Parameters, gradients, optimizer state and the arena: nothing else is held.
  auto const s = alloc.stats();
  if (arena)
    CHECK(s.total.reserved == s[memory::tag::parameters].reserved + s[memory::tag::gradients].reserved +
                                  s[memory::tag::optimizer_state].reserved + largest);
  out.outputs.push_back(tensor_to_host(m.parameters()));
  return out;
}

template <class N, class P = fp32>
void require_planned_like_unplanned() {
  memory::caching_allocator<host> with, without;
  seen const a = run<N, P>(true, with), b = run<N, P>(false, without);
  CHECK(bits_differ(a.losses, b.losses) == 0);
  REQUIRE(a.outputs.size() == b.outputs.size());
  for (std::size_t i = 0; i < a.outputs.size(); ++i) CHECK(bits_differ(a.outputs[i], b.outputs[i]) == 0);
}

template <class B>
using Checkpointed_ = Checkpointed<B>;

}  // namespace

TEST_CASE("forward arena: train, validate, infer at several batches reserve the largest plan, every policy",
          "[plan][arena][inference]") {
  require_planned_like_unplanned<Net<Repeat<3, Block>>>();
  require_planned_like_unplanned<Net<Repeat<3, Checkpointed<Block>>>>();
  require_planned_like_unplanned<Net<CheckpointSequential<2, Repeat<4, Block>>>>();
  require_planned_like_unplanned<Net<Revolve<2, Repeat<5, Block>>>>();
  require_planned_like_unplanned<Net<Repeat<3, Selective<Block>>>>();
  require_planned_like_unplanned<Net<Repeat<2, Offloaded<Block>>>>();
  require_planned_like_unplanned<Net<Selective<Checkpointed<Repeat<2, Block>>>>>();
  require_planned_like_unplanned<Net<Repeat<3, Block>>, mixed<bfloat16>>();
  require_planned_like_unplanned<Net<Repeat<3, Checkpointed<Block>>>, mixed<bfloat16>>();
  require_planned_like_unplanned<Net<Repeat<2, Block>>, mixed<half, StaticLossScale<256>>>();
}

TEST_CASE("forward arena: batch normalisation in eval mode, every policy", "[plan][arena][inference]") {
  require_planned_like_unplanned<ConvNet<Repeat<2, ConvBlock>>>();
  require_planned_like_unplanned<ConvNet<Repeat<2, Checkpointed<ConvBlock>>>>();
  require_planned_like_unplanned<ConvNet<Repeat<2, Selective<ConvBlock>>>>();
}

namespace {
using ForwardGpt = GPT<23, 12, 16, 4, 2, 0.1>;       // (its attention core the blocked one)
using ForwardGptKept = StoredAttention<ForwardGpt>;  // (the core that keeps its probabilities)
}  // namespace

TEMPLATE_TEST_CASE("forward arena: a GPT's loss and sampling forward", "[plan][arena][inference]", ForwardGpt,
                   ForwardGptKept) {
  using G = TestType;
  memory::caching_allocator<host> alloc;
  model<G> m(seed{3}, alloc), plain(seed{3});
  plain.use_planned_arena(false);
  tensor<std::int32_t> ids(3, 12), next(36, 1);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t((i * 7) % 23), next[i] = std::int32_t((i * 5) % 23);
  AdamW o1(m, {.lr = 1e-2}), o2(plain, {.lr = 1e-2});
  CHECK(m.template train_step<SoftmaxCrossEntropy>(ids, next, o1) ==
        plain.template train_step<SoftmaxCrossEntropy>(ids, next, o2));
  CHECK(m.template loss<SoftmaxCrossEntropy>(ids, next) == plain.template loss<SoftmaxCrossEntropy>(ids, next));
  CHECK(m.last_forward().planned);
  CHECK(m.last_forward().unplanned == 0);
  // Sampling: one sequence of 5 tokens at a time.
  tensor<std::int32_t> prompt(1, 5);
  for (std::size_t i = 0; i < 5; ++i) prompt[i] = std::int32_t(i + 1);
  CHECK(values(m.forward(prompt)) == values(plain.forward(prompt)));
  CHECK(m.last_forward().planned);
  CHECK(m.last_forward().unplanned == 0);
  CHECK(alloc.stats()[memory::tag::activations].reserved == m.arena_bytes());
  // Sampling into the caller's tensor after reserve_inference(1): prompts of 1 to 12 tokens, the
  // same bits as forward(x), no request of the system.
  m.reserve_inference(1);
  tensor<float> logits(12, 23);
  for (std::size_t len = 1; len <= 12; ++len) {
    tensor<std::int32_t> p(1, index_t(len));
    for (std::size_t i = 0; i < len; ++i) p[i] = std::int32_t((i * 3 + 1) % 23);
    std::size_t const asked = alloc.stats().system_allocations;
    m.forward(p, logits.view().row_range(0, len));
    CHECK(alloc.stats().system_allocations == asked);
    CHECK(values(plain.forward(p)) == std::vector<float>(logits.data(), logits.data() + len * 23));
  }
  tensor<std::int32_t> two(2, 12);
  tensor<float> out2(24, 23);
  CHECK_THROWS_AS(m.forward(two, out2), shape_error);
}

namespace {

// The surrogate of issue 50 in small: 5 -> 64 -> 64 -> 5 with GELU.
using Surrogate = Seq<Linear<5, 64>, GELU, Linear<64, 64>, GELU, Linear<64, 5>>;

template <class P>
void require_no_allocation(std::size_t max_batch) {
  memory::caching_allocator<host> alloc;
  model<Surrogate, host, P> m(seed{9}, alloc);
  m.reserve_inference(max_batch);
  CHECK(m.inference_batch() == max_batch);
  constexpr arena_size plan = inference_plan<Surrogate, P>(64);
  if (max_batch == 64) CHECK(m.arena_bytes() == plan.bytes);
  tensor<float> x = input(max_batch, 5, 0.3), y(index_t(max_batch), 5);
  // The first call, at the maximum batch, may allocate (a product's first use takes its scratch:
  // oneDNN's scratchpad); none after it, whatever the batch.
  m.forward(x, y);
  auto& scratch = memory::default_allocator<host>();
  std::size_t const model_calls = alloc.stats().system_allocations, scratch_calls = scratch.stats().system_allocations;
  std::size_t const arena = alloc.stats().arena;
  std::size_t unplanned = 0;
  std::vector<std::vector<float>> kept;  // some calls' outputs, checked below
  for (std::size_t i = 0; i < 1000; ++i) {
    std::size_t const rows = 1 + (i * 37) % max_batch;
    m.forward(x.view().row_range(0, rows), y.view().row_range(0, rows));
    unplanned += m.last_forward().unplanned + !m.last_forward().planned;
    if (i % 97 == 0) kept.emplace_back(y.data(), y.data() + rows * 5);
  }
  CHECK(unplanned == 0);
  CHECK(alloc.stats().arena == arena);
  CHECK(alloc.stats().system_allocations == model_calls);
  CHECK(scratch.stats().system_allocations == scratch_calls);
  // The same bits as forward(x) of a model without the arena.
  model<Surrogate, host, P> plain(seed{9});
  plain.use_planned_arena(false);
  for (std::size_t j = 0; j < kept.size(); ++j) {
    std::size_t const rows = 1 + (j * 97 * 37) % max_batch;
    CHECK(values(plain.forward(x.view().row_range(0, rows))) == kept[j]);
  }
  // A batch over the maximum: refused, nothing written.
  tensor<float> big = input(max_batch + 1, 5, 0.1), y_big(index_t(max_batch + 1), 5);
  for (std::size_t i = 0; i < y_big.size(); ++i) y_big[i] = 7.0f;
  CHECK_THROWS_AS(m.forward(big, y_big), shape_error);
  CHECK_THROWS_WITH(m.forward(big, y_big), Catch::Contains("expected at most") && Catch::Contains("found"));
  CHECK(std::all_of(y_big.data(), y_big.data() + y_big.size(), [](float v) { return v == 7.0f; }));
  // A wrong output shape: refused too.
  tensor<float> wrong(2, 4);
  CHECK_THROWS_AS(m.forward(x.view().row_range(0, 2), wrong), shape_error);
}

}  // namespace

TEST_CASE("inference: 1,000 calls at batches up to the maximum allocate nothing", "[plan][arena][inference]") {
  require_no_allocation<fp32>(64);
  require_no_allocation<fp32>(200);
  require_no_allocation<mixed<bfloat16>>(64);
  // (half's products convert to fp32 for the BLAS everywhere, and bf16's without AVX-512: their
  // copies' scratch is one size for every batch)
  require_no_allocation<mixed<half>>(64);
  {
    struct convert_guard {
      convert_guard() { kernels::set_gemm16_path(kernels::gemm16_path::convert); }
      ~convert_guard() { kernels::set_gemm16_path(kernels::gemm16_path::automatic); }
    } const convert;
    require_no_allocation<mixed<bfloat16>>(64);
  }
  // The plan is a constant expression, and reserve_inference holds that many bytes.
  static_assert(inference_plan<Surrogate>(64).bytes == inference_plan<Surrogate>(64).lower_bound);
  static_assert(inference_plan<Surrogate>(64).bytes < inference_plan<Surrogate>(128).bytes);
  memory::caching_allocator<host> alloc;
  model<Surrogate> m(seed{1}, alloc);
  CHECK_THROWS_AS(m.reserve_inference(0), argument_error);
  // A batch that was a negative number converted: the plan refuses to count past 4 EiB (it
  // wrapped around to a small arena before), and nothing is reserved.
  CHECK_THROWS_WITH(m.reserve_inference(std::size_t(-1)), Catch::Contains("at most 4 EiB"));
  CHECK(m.inference_batch() == 0);
  // A sequence past a GPT's positional table of 16: refused, as its forward would be.
  model<GPT<11, 16, 16, 2, 2, 0.1>> g(seed{1}, alloc);
  CHECK_THROWS_WITH(g.reserve_inference(2, 17),
                    Catch::Contains("at most 16 positions (the positional table), found 17"));
  CHECK(g.inference_batch() == 0);
  g.reserve_inference(2, 16);
  CHECK(g.inference_batch() == 2);
  m.use_planned_arena(false);
  CHECK_THROWS_AS(m.reserve_inference(8), argument_error);
  CHECK(m.inference_batch() == 0);
}

TEST_CASE("inference: separate models on separate threads, and one model from two", "[plan][arena][inference]") {
  memory::caching_allocator<host> alloc;
  model<Surrogate> a(seed{2}, alloc), b(seed{2}, alloc);
  a.reserve_inference(32);
  b.reserve_inference(32);
  tensor<float> x = input(32, 5, 0.7);
  std::vector<float> const want = values(a.forward(x));  // (the output let go: a's arena is free)
  auto const worker = [&](model<Surrogate>& m, std::size_t& wrong) {
    tensor<float> y(32, 5);
    for (int i = 0; i < 300; ++i) {
      m.forward(x, y);
      wrong += values(y) != want;
    }
  };
  std::size_t wrong_a = 0, wrong_b = 0, wrong_c = 0;
  {
    std::thread ta(worker, std::ref(a), std::ref(wrong_a)), tb(worker, std::ref(b), std::ref(wrong_b));
    ta.join();
    tb.join();
  }
  CHECK(wrong_a == 0);
  CHECK(wrong_b == 0);
  // One model from two threads: a call that finds the arena taken allocates around it.
  {
    std::thread t1(worker, std::ref(a), std::ref(wrong_a)), t2(worker, std::ref(a), std::ref(wrong_c));
    t1.join();
    t2.join();
  }
  CHECK(wrong_a == 0);
  CHECK(wrong_c == 0);
}
