// The whole-step plan: constexpr, and equal per tag and in total to what the model's allocator
// measures over training steps, across models, policies, precisions, optimizers and losses.
// Every tensor the step does not own (the caller's input and targets) lives in another allocator.
#include <remat/remat.hpp>

#include "support/plan_models.hpp"

#include <catch2/catch.hpp>

#include <cmath>

using namespace remat;

namespace {

using plan_models::Block;
using plan_models::Net;
using plan_models::W;
using Gpt = GPT<11, 16, 16, 2, 2, 0.1>;
template <class B>
using CheckpointedRepeat = Checkpointed<B>;
using GptCheckpointed = GPT<11, 16, 16, 2, 2, 0.1, CheckpointedRepeat>;
template <class B>
using EachBlockCheckpointed = CheckpointSequential<32, B>;  // (32 blocks: each its own run)

template <class P>
constexpr bool scaled = !std::is_same_v<typename P::loss_scale, StaticLossScale<>>;

template <class NetT, class P, template <class, class, class> class Opt, class Loss>
void require_step_plan(std::size_t batch, std::size_t sequence, step_options o = {}) {
  o.sequence = sequence;
  INFO("batch " << batch << " x " << sequence << ", " << P::name);
  using M = model<NetT, host, P>;
  memory::caching_allocator<host> alloc;
  M m(seed{3}, alloc);
  auto opt = [&] {
    if constexpr (std::is_same_v<Opt<float, host, float>, SGD<float, host, float>>)
      return SGD(m, {.lr = 1e-3, .momentum = o.momentum ? 0.9 : 0.0});
    else
      return AdamW(m, {.lr = 1e-3});
  }();
  auto const plan = memory_plan<NetT, P, Opt, Loss>(batch, o);
  // The same numbers from the compiler (for a batch known at compile time).
  constexpr auto fixed = memory_plan<NetT, P, Opt, Loss>(7, {.sequence = M::sequence_model ? 3 : 1});
  static_assert(fixed.peak > fixed.persistent);
  if (batch == 7 && sequence == (M::sequence_model ? 3 : 1) && o.momentum) CHECK(fixed.peak == plan.peak);

  std::size_t const rows = batch * sequence;
  using In = typename M::input_element;
  tensor<In> x(index_t(M::reads_ids ? batch : rows), index_t(M::reads_ids ? sequence : NetT::in_width));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if constexpr (M::reads_ids)
      x[i] = std::int32_t(i * 7 % 11);
    else
      x[i] = float(std::sin(0.37 * double(i)));
  }
  for (int step = 0; step < 3; ++step) {  // the first from the system, the rest from the cache
    alloc.reset_peak();
    if constexpr (std::is_same_v<Loss, MSE>) {
      tensor<float> t{index_t(rows), index_t(NetT::out_width)};
      for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.1f * float(i % 3);
      m.template train_step<MSE>(x, t, opt);
    } else {
      tensor<std::int32_t> labels(index_t(M::reads_ids ? batch : rows), index_t(M::reads_ids ? sequence : 1));
      for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int32_t(i % NetT::out_width);
      m.template train_step<Loss>(x, labels, opt);
    }
    auto const s = alloc.stats();
    for (memory::tag t : memory::all_tags) {
      INFO("step " << step << ", " << memory::name(t));
      CHECK(s[t].peak == plan[t]);
    }
    CHECK(s[memory::tag::parameters].in_use == plan.parameters());
    CHECK(s.total.peak == plan.peak);
    CHECK(s.total.in_use == plan.persistent);  // activations and workspace all given back
    // Reserved: the persistent buffers and the arena, to the byte; the arena is the lower bound
    // (the most activation and workspace bytes in use at once), and every activation lay in it.
    CHECK(m.last_pass().planned);
    CHECK(m.last_pass().unplanned == 0);
    CHECK(s.arena == plan.arena);
    CHECK(s[memory::tag::activations].reserved == plan.arena);
    CHECK(s[memory::tag::workspace].reserved == 0);
    CHECK(s.total.reserved == plan.reserved);
    CHECK(plan.arena == plan.peak - plan.persistent);
    // Nothing else came from the system: weights (and their compute copy), gradients, the
    // optimizer's buffers and the arena, once each.
    constexpr bool adamw = std::is_same_v<Opt<float, host, float>, AdamW<float, host, float>>;
    std::size_t const buffers = adamw ? 2 : (o.momentum ? 1 : 0);
    CHECK(s.system_allocations == 2 + (M::mixed_precision ? 1 : 0) + buffers + 1);
  }
}

template <class NetT, class P, template <class, class, class> class Opt, class Loss = MSE>
void require_step_plans(step_options o = {}) {
  constexpr std::size_t seq = model<NetT>::sequence_model ? 3 : 1;
  require_step_plan<NetT, P, Opt, Loss>(7, seq, o);
  require_step_plan<NetT, P, Opt, Loss>(64, seq, o);
  require_step_plan<NetT, P, Opt, Loss>(129, seq, o);
}

}  // namespace

TEST_CASE("memory_plan: hand-computed parts of a step", "[plan]") {
  // Linear<4, 8>: 40 parameters. fp32 AdamW: weights, gradients and two moments of 160 B, each
  // rounded to 256 B. Batch 2: output, its gradient (64 B each, 256 rounded); no input gradient.
  constexpr auto a = memory_plan<Seq<Linear<4, 8>>, fp32, AdamW>(2);
  static_assert(a.master_weights == 256 && a.compute_copy == 0 && a.gradients == 256 && a.optimizer_state == 512);
  static_assert(a.activations.peak_bytes == 512 && a.workspace == 0);
  static_assert(a.persistent == 1024 && a.peak == 1536);
  // The arena: the output and its gradient, alive together: 512 B, the peak.
  static_assert(a.arena == 512 && a.reserved == 1536);
  // mixed<bfloat16>: a 16-bit copy (80 B -> 256); activations in bf16 (32 B -> 256 each), and the
  // caller's fp32 input converted (16 B -> 256).
  constexpr auto b = memory_plan<Seq<Linear<4, 8>>, mixed<bfloat16>, AdamW>(2);
  static_assert(b.compute_copy == 256 && b.parameters() == 512 && b.activations.peak_bytes == 768);
  // SGD: one momentum buffer, or none.
  static_assert(memory_plan<Seq<Linear<4, 8>>, fp32, SGD>(2).optimizer_state == 256);
  static_assert(memory_plan<Seq<Linear<4, 8>>, fp32, SGD>(2, {.momentum = false}).optimizer_state == 0);
  // SoftmaxCrossEntropy: one fp32 loss per row while the loss runs (300 rows: 1200 B -> 1280),
  // beside the output and its gradient (300 x 8 x 4 = 9600 B each): at that point 2 x 9728
  // activation bytes and 1280 workspace are in use, more than any later point of the step.
  constexpr auto c = memory_plan<Seq<Linear<4, 8>>, fp32, AdamW, SoftmaxCrossEntropy>(300);
  static_assert(c.workspace == 1280 && c.activations.peak_bytes == 2 * 9728);
  static_assert(c.peak == c.persistent + 2 * 9728 + 1280);
  static_assert(c.arena == 2 * 9728 + 1280);
  CHECK(a.describe() == "weights 256 B, gradients 256 B, optimizer state 512 B, activations 512 B, workspace 0 B; "
                        "peak 1.50 KiB, reserved 1.50 KiB");
  // ZeRO-1 over 3 ranks: 40 parameters shard as 13, 13, 14.
  static_assert(memory_plan<Seq<Linear<4, 8>>, fp32, AdamW>(2, {.ranks = 3, .rank = 2, .shard_optimizer = true})
                    .optimizer_state == 2 * 256);
  constexpr auto big =
      memory_plan<Seq<Linear<64, 64>>, fp32, AdamW>(1, {.ranks = 3, .rank = 0, .shard_optimizer = true});
  static_assert(big.optimizer_state == 2 * ((4160 / 3 * 4 + 255) / 256 * 256));
}

TEST_CASE("memory_plan: a sharded data-parallel rank's pages, hand-computed", "[plan][dist]") {
  // The rules (plan/rank_pages.hpp). 10,000 floats from a page's start, pages of 4 KiB: 40,000
  // bytes touch 10 pages, the last in part. A rank keeping [2500, 5000) (bytes [10,000, 20,000))
  // holds pages 2, 3 and 4, and the last page (shared with whatever follows): 4 pages.
  constexpr auto span = detail::page_span::aligned(10000, 4, 4096);
  static_assert(span.whole == 10 * 4096 && span.count() == 10);
  static_assert(detail::held_pages(span, 2500, 5000) == 4 * 4096);
  static_assert(detail::held_pages(span, 0, 0) == 4096);  // (nothing of its own: the last page only)
  // At any start, 10,000 bytes touch at most 4 pages (3 filled, one more where they straddle).
  static_assert(detail::page_bound(10000, 4096) == 4 * 4096 && detail::page_bound(8192, 4096) == 3 * 4096);
  // Buckets of at most 4 from the end of 10.
  static_assert(detail::gradient_bucket_ranges(10, 4) ==
                std::vector<param_range>{{6, 10}, {2, 6}, {0, 2}});
  // The replay of backward's reports 8, 4, 0 and the model's own 0 over those buckets: the bucket
  // [6, 10) starts at report 4 and is given back at the next, where [2, 6) and [0, 2) start.
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  std::size_t const peak = detail::sharded_gradient_peak(
      {8, 4, 0, 0}, detail::gradient_bucket_ranges(10, 4), 10, [&](std::size_t touched, std::size_t released) {
        seen.emplace_back(touched, released);
        return touched == 0 ? std::size_t(7) : std::size_t(3);
      });
  CHECK(seen == std::vector<std::pair<std::size_t, std::size_t>>{{8, 10}, {4, 10}, {0, 10}, {0, 6}});
  CHECK(peak == 7);

  // shard_master_weights over 2 ranks, Linear<1024, 1024> in bf16: 1,049,600 master weights,
  // 4,198,400 bytes; rank 1's shard is bytes [2,099,200, 4,198,400). On the GPU (granules of 2
  // MiB from a granule's start) it holds granules 1 and 2 (the last, in part): 4 MiB, rank 0
  // granules 0 to 2. On the host (4 KiB pages, the start unknown) at most 2,099,200 bytes' 513
  // pages and one more, and the two end pages: 516.
  using L = Seq<Linear<1024, 1024>>;
  constexpr step_options rank1{.ranks = 2, .rank = 1, .shard_master_weights = true};
  constexpr auto gpu = memory_plan<L, mixed<bfloat16>, AdamW, MSE, cuda>(2, rank1);
  static_assert(gpu.master_pages == std::size_t(4) << 20 && !gpu.master_pages_on_host);
  static_assert(gpu.device_paged == gpu.master_weights && gpu.master_weights == 4198400);
  static_assert(gpu.device_bytes() == gpu.reserved - 4198400 + (std::size_t(4) << 20));
  static_assert(gpu.optimizer_state == 2 * 2099200);  // (it implies shard_optimizer)
  constexpr auto gpu0 = memory_plan<L, mixed<bfloat16>, AdamW, MSE, cuda>(2, {.ranks = 2, .rank = 0,
                                                                              .shard_master_weights = true});
  static_assert(gpu0.master_pages == std::size_t(6) << 20);
  constexpr auto cpu = memory_plan<L, mixed<bfloat16>, AdamW>(2, rank1);
  static_assert(cpu.master_pages == 516 * 4096);
  static_assert(cpu.device_bytes() == cpu.reserved - 4198400 + 516 * 4096);
  // On one rank the wrapper keeps them whole: every page 4,198,400 bytes can touch (1,025 + 1).
  static_assert(memory_plan<L, mixed<bfloat16>, AdamW>(2, {.shard_master_weights = true}).master_pages ==
                1026 * 4096);
  // With OffloadedAdamW's master weights on the host, the host's side counts the pages instead.
  constexpr auto off = memory_plan<L, mixed<bfloat16>, OffloadedAdamW, MSE, cuda>(
      2, {.ranks = 2, .rank = 1, .offload_master_weights = true, .shard_master_weights = true});
  static_assert(off.master_pages_on_host && off.master_pages == 516 * 4096);
  static_assert(off.host_paged == off.host_pageable.parameters && off.host_pageable.parameters == 4198400);
  static_assert(off.device_bytes() == off.reserved);
  // ZeRO-3 over 2 ranks on the GPU: rank 1 holds the same master granules, and of the compute
  // copy (2,099,200 bytes: 2 granules, the last in part) both: its shard's bytes [1,049,600,
  // 2,099,200) lie in granule 0 and the last granule is never given back. The gather buffers
  // hold the largest frame, the Linear's 2,099,200 bytes: 2 granules each, two of them with
  // prefetch_parameters, one without, none when a pass keeps what it gathers (whose compute copy
  // then holds every frame's). The gradients: one layer reports only when backward is done, so
  // the pass holds all 3 granules of them before any is reduced.
  constexpr step_options zero3{.ranks = 2, .rank = 1, .shard_parameters = true};
  constexpr auto z3 = memory_plan<L, mixed<bfloat16>, AdamW, MSE, cuda>(2, zero3);
  static_assert(z3.master_pages == std::size_t(4) << 20 && z3.compute_pages == std::size_t(4) << 20);
  static_assert(z3.gather_pages == std::size_t(8) << 20 && z3.gradient_pages == std::size_t(6) << 20);
  static_assert(z3.device_paged == 4198400 + 2099200 + 4198400);
  static_assert(z3.device_bytes() == z3.reserved - z3.device_paged + (std::size_t(22) << 20));
  static_assert(memory_plan<L, mixed<bfloat16>, AdamW, MSE, cuda>(
                    2, {.ranks = 2, .rank = 1, .shard_parameters = true, .prefetch_parameters = false})
                    .gather_pages == std::size_t(4) << 20);
  static_assert(memory_plan<L, mixed<bfloat16>, AdamW, MSE, cuda>(
                    2, {.ranks = 2, .rank = 1, .shard_parameters = true, .keep_parameters_for_backward = true})
                    .gather_pages == 0);
  // ZeRO-3 with ZeRO-Offload's placement (OffloadedAdamW with the master weights and the
  // gradients on the host): the master weights' shard is the host's, 516 pages as above; the
  // device keeps the compute copy's 2 granules, the two gather buffers' 4 and the gradients' 3
  // (all written before the one report), in place of the allocators' gradient block (4,198,400)
  // and compute copy (2,099,200): 9 granules, 18 MiB.
  constexpr auto z3off = memory_plan<L, mixed<bfloat16>, OffloadedAdamW, MSE, cuda>(
      2, {.ranks = 2, .rank = 1, .offload_master_weights = true, .offload_gradients = true, .shard_parameters = true});
  static_assert(z3off.master_pages_on_host && z3off.master_pages == 516 * 4096);
  static_assert(z3off.compute_pages == std::size_t(4) << 20 && z3off.gather_pages == std::size_t(8) << 20 &&
                z3off.gradient_pages == std::size_t(6) << 20);
  static_assert(z3off.device_paged == 4198400 + 2099200 && z3off.host_paged == 4198400);
  static_assert(z3off.master_weights == 0 && z3off.host_pageable.parameters == 4198400);
  static_assert(z3off.device_bytes() == z3off.peak - 6297600 + (std::size_t(18) << 20));
  static_assert(z3off.host_bytes() ==
                z3off.host_pageable.total() + z3off.host_page_locked.total() - 4198400 + 516 * 4096);
  // fp32 under ZeRO-3: the master weights are what is gathered (4,198,400 bytes: 3 granules a
  // buffer; of the master weights' 3 rank 1 holds granules 1 and 2).
  constexpr auto z3f = memory_plan<L, fp32, AdamW, MSE, cuda>(2, zero3);
  static_assert(z3f.master_pages == std::size_t(4) << 20 && z3f.compute_pages == 0);
  static_assert(z3f.gather_pages == 2 * (std::size_t(6) << 20));
  // Without sharding nothing changes.
  constexpr auto plain = memory_plan<L, mixed<bfloat16>, AdamW, MSE, cuda>(2);
  static_assert(plain.master_pages == 0 && plain.device_paged == 0 && plain.device_bytes() == plain.reserved);
}

// A plan never describes a step the model would refuse: each argument the model's training pass
// refuses (batch 0, a width other than the graph's, a sequence past the positional table, more
// rows than a Budget was planned for, an input gradient of token ids) is refused by the plan too,
// as are a rank outside [0, ranks) and a count that would wrap around (2^48 rows, 4 EiB).
TEST_CASE("memory_plan: refuses what the model's training pass would refuse", "[plan]") {
  using L = Seq<Linear<8, 16>, GELU, Linear<16, 4>>;
  using Gpt = GPT<11, 16, 16, 2, 2, 0.1>;  // (a positional table of 16)
  using Budgeted = Seq<Budget<1 << 20, 4, Repeat<2, Seq<Linear<8, 8>, GELU>>>>;  // (planned for 4 rows)
  auto const refused = [](auto plan, char const* found) {
    CHECK_THROWS_AS(plan(), argument_error);
    CHECK_THROWS_WITH(plan(), Catch::Contains(found));
  };
  refused([] { return memory_plan<L>(0); }, "expected a batch of at least one, found 0");
  refused([] { return memory_plan<L, mixed<bfloat16>, OffloadedAdamW>(0); }, "found 0");
  refused([] { return memory_plan<L>(2, {.sequence = 0}); }, "at least one position, found 0");
  refused([] { return memory_plan<L>(2, {.features = 9}); }, "the graph's input width of 8 features, found 9");
  refused([] { return memory_plan<Seq<GELU>>(2); }, "(the graph's input width is not fixed), found none");
  refused([] { return memory_plan<L>(2, {.ranks = 2, .rank = 2}); }, "found rank 2 of 2");
  refused([] { return memory_plan<L>(2, {.ranks = 0}); }, "found rank 0 of 0");
  refused([] { return memory_plan<Gpt, fp32, AdamW, SoftmaxCrossEntropy>(2, {.sequence = 17}); },
          "at most 16 positions (the model's positional table), found 17");
  refused([] { return memory_plan<Budgeted>(5); }, "at most 4 x 1 rows");
  refused(
      [] {
        return memory_plan<Gpt, fp32, AdamW, SoftmaxCrossEntropy>(2, {.sequence = 4, .dx = input_gradient::wanted});
      },
      "expected no input gradient for a model reading token ids");
  // A batch that was a negative number converted to std::size_t planned 4 KiB (its bytes wrapped
  // around); past 2^48 rows, or 4 EiB of tensors, a plan is refused.
  refused([] { return memory_plan<L>(std::size_t(-1)); }, "expected at most 2^48 rows (batch x sequence)");
  refused([] { return memory_plan<Gpt, fp32, AdamW, SoftmaxCrossEntropy>(std::size_t(1) << 45, {.sequence = 16}); },
          "found 35184372088832 x 16");
  refused([] { return memory_plan<Seq<GELU>>(2, {.features = std::size_t(1) << 61}); }, "at most 4 EiB of tensors");
  // At 2^48 rows the count is exact: the peak is at the last Linear's backward, with the first's
  // output, GELU's, the loss gradient and the gradient it makes alive (16 + 16 + 4 + 16 floats a row).
  static_assert(memory_plan<L>(std::size_t(1) << 48).activations.peak_bytes ==
                (std::size_t(1) << 48) * 4 * (16 + 16 + 4 + 16));
  // The other plans refuse the same: the activations', the arena's, inference's (any batch: no
  // Budget check).
  refused([] { return activation_plan<L>(0); }, "remat::activation_plan: expected a batch of at least one");
  refused([] { return activation_plan<Seq<GELU>>(2); }, "remat::activation_plan: expected the number of features");
  refused([] { return arena_plan<L>(2, 9); }, "remat::arena_plan: expected the graph's input width of 8 features");
  refused([] { return sequence_plan<Gpt>(2, 17); }, "found 17");
  refused([] { return inference_plan<Gpt>(1, Gpt::in_width, 17); },
          "remat::inference_plan: expected a sequence of at most 16");
  refused([] { return activation_plan<Budgeted>(5); }, "at most 4 x 1 rows");
  static_assert(inference_plan<Budgeted>(5).bytes > 0);
  // What is accepted: the graph's own width named, an open graph's width given, the last rank, the
  // whole table, the Budget's rows.
  static_assert(memory_plan<L>(2, {.features = 8}).peak == memory_plan<L>(2).peak);
  static_assert(memory_plan<Seq<GELU>>(2, {.features = 5}).activations.peak_bytes > 0);
  static_assert(memory_plan<L>(2, {.ranks = 2, .rank = 1, .shard_optimizer = true}).optimizer_state > 0);
  static_assert(memory_plan<Gpt, fp32, AdamW, SoftmaxCrossEntropy>(2, {.sequence = 16}).peak > 0);
  static_assert(memory_plan<Budgeted>(4).peak > 0);

  // The model refuses the same passes.
  memory::caching_allocator<host> alloc;
  model<L> m(seed{1}, alloc);
  AdamW opt(m, {.lr = 1e-3});
  tensor<float> x9(2, 9), t(2, 4);
  for (std::size_t i = 0; i < x9.size(); ++i) x9[i] = 0.5f;  // (finite: the width is what is wrong)
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f;
  CHECK_THROWS_WITH(m.train_step<MSE>(x9, t, opt), Catch::Contains("expected 8 features per row, found 9"));
  model<Gpt> g(seed{1}, alloc);
  tensor<std::int32_t> ids(2, 17);
  CHECK_THROWS_WITH(g.forward(ids), Catch::Contains("expected sequences of at most 16 tokens"));
  model<Budgeted> b(seed{1}, alloc);
  AdamW bopt(b, {.lr = 1e-3});
  tensor<float> x5(5, 8), t5(5, 8);
  for (std::size_t i = 0; i < x5.size(); ++i) x5[i] = t5[i] = 0.5f;  // (finite: the rows are what is wrong)
  CHECK_THROWS_WITH(b.train_step<MSE>(x5, t5, bopt), Catch::Contains("at most 4 x 1 rows"));
}

TEST_CASE("memory_plan: equals the allocator per tag and in total", "[plan]") {
  SECTION("stored") {
    require_step_plans<Net<Repeat<3, Block>>, fp32, AdamW>();
  }
  SECTION("checkpointed") {
    require_step_plans<Net<Repeat<3, Checkpointed<Block>>>, fp32, AdamW>();
  }
  SECTION("revolve") {
    require_step_plans<Net<Revolve<2, Repeat<5, Block>>>, fp32, SGD>();
  }
  SECTION("selective") {
    require_step_plans<Net<Repeat<3, Selective<Block>>>, fp32, SGD>({.momentum = false});
  }
  SECTION("bfloat16") {
    require_step_plans<Net<CheckpointSequential<2, Repeat<4, Block>>>, mixed<bfloat16>, AdamW>();
  }
  SECTION("half with a dynamic scale") {
    require_step_plans<Net<Repeat<3, Checkpointed<Block>>>, mixed<half, DynamicLossScale>, AdamW>();
  }
  SECTION("cross-entropy") {
    require_step_plans<Net<Repeat<2, Block>>, fp32, AdamW, SoftmaxCrossEntropy>();
  }
  SECTION("GPT") {
    require_step_plans<Gpt, fp32, AdamW, SoftmaxCrossEntropy>();
    require_step_plans<StoredAttention<Gpt>, fp32, AdamW, SoftmaxCrossEntropy>();  // (the probabilities kept)
  }
  SECTION("GPT checkpointed, bfloat16") {
    require_step_plans<GptCheckpointed, mixed<bfloat16>, SGD, SoftmaxCrossEntropy>();
  }
}

TEST_CASE("memory_plan: OffloadedAdamW's step, on the device and on the host apart", "[plan][offload]") {
  // Linear<4, 8> (40 parameters) in fp32: AdamW's 512 B of moments leave the device's plan; the
  // host holds them (pageable, 2 x 256 B) and the weights' copy (256 B, optimizer state),
  // page-locked for a GPU model, in the host allocator for a host model. A GPU model's gradients
  // and compute copy cross through page-locked slots (one of 40 values here, 256 B each); a host
  // model's are read and written in place.
  using L = Seq<Linear<4, 8>>;
  constexpr auto adamw = memory_plan<L, fp32, AdamW>(2);
  constexpr auto on_host = memory_plan<L, fp32, OffloadedAdamW>(2);
  static_assert(on_host.optimizer_state == 0 && on_host.parameters() == adamw.parameters());
  static_assert(on_host.peak == adamw.peak - 512 && on_host.reserved == adamw.reserved - 512);
  static_assert(on_host.host_pageable.optimizer_state == 512 + 256 && on_host.host_pageable.gradients == 0);
  static_assert(on_host.host_page_locked.total() == 0);
  constexpr auto on_gpu = memory_plan<L, mixed<bfloat16>, OffloadedAdamW, MSE, cuda>(2);
  static_assert(on_gpu.host_pageable.total() == 512 && on_gpu.host_pageable.gradients == 0);
  // (bf16: the compute copy's slot, 80 B -> 256, beside the fp32 weights' copy)
  static_assert(on_gpu.host_page_locked.optimizer_state == 256 + 256 && on_gpu.host_page_locked.gradients == 256);
  // By chunks of 16 values: two slots of each kind (64 B and 32 B, one block each).
  constexpr auto chunked = memory_plan<L, mixed<bfloat16>, OffloadedAdamW, MSE, cuda>(2, {.offload_chunk = 16});
  static_assert(chunked.host_page_locked.gradients == 2 * 256 && chunked.host_page_locked.optimizer_state == 256 + 2 * 256);
  // ZeRO-1 over 3 ranks, the last rank's shard: 14 parameters, each buffer one 256-byte block.
  constexpr auto sharded = memory_plan<L, fp32, OffloadedAdamW, MSE, cuda>(2, {.ranks = 3, .rank = 2, .shard_optimizer = true});
  static_assert(sharded.host_pageable.total() == 512 && sharded.host_page_locked.total() == 512);
  // What a program asks before it allocates: a device of N bytes and a host of M.
  static_assert(on_gpu.fits(on_gpu.reserved, 1280) && !on_gpu.fits(on_gpu.reserved - 1, 1280) &&
                !on_gpu.fits(on_gpu.reserved, 1279));
  static_assert(memory_plan<L, fp32, AdamW>(2).host_pageable.total() == 0);
  // The master weights on the host too (offload_options::master_weights): their 160 B (one block)
  // leave the device for the host's pageable memory, tag parameters, and the optimizer keeps no
  // copy of its own: page-locked are the slots of the bf16 copy and of the gradients.
  constexpr auto master = memory_plan<L, mixed<bfloat16>, OffloadedAdamW, MSE, cuda>(2, {.offload_master_weights = true});
  static_assert(master.master_weights == 0 && master.compute_copy == on_gpu.compute_copy);
  static_assert(master.peak == on_gpu.peak - 256 && master.reserved == on_gpu.reserved - 256);
  static_assert(master.host_pageable.parameters == 256 && master.host_pageable.optimizer_state == 512);
  static_assert(master.host_page_locked.optimizer_state == 256 && master.host_page_locked.gradients == 256);
  static_assert(master.host_pageable[memory::tag::parameters] == 256 && master.host_bytes() == on_gpu.host_bytes());
  // Under ZeRO-1 every rank keeps all the master weights (the wrapper gathers the others' parts).
  constexpr auto master_sharded =
      memory_plan<L, mixed<bfloat16>, OffloadedAdamW>(2, {.ranks = 3, .rank = 2, .shard_optimizer = true,
                                                          .offload_master_weights = true});
  static_assert(master_sharded.host_pageable.parameters == 256 && master_sharded.master_weights == 0);
  // The gradients on the host too (offload_options::gradients): tag gradients leaves the device,
  // the host holds their sum (160 B, one block; two with the failure backup of accumulation), and
  // the device the pages of the span backward writes: here the buffer's one page, in part.
  constexpr auto grads = memory_plan<L, mixed<bfloat16>, OffloadedAdamW, MSE, cuda>(2, {.offload_gradients = true});
  static_assert(grads.gradients == 0 && grads.reserved == on_gpu.reserved - 256);
  static_assert(grads.host_pageable.gradients == 256 && grads.gradient_pages == (std::size_t(2) << 20));
  static_assert(grads.device_bytes() == grads.reserved + grads.gradient_pages);
  static_assert(!grads.fits(grads.reserved, grads.host_bytes()) && grads.fits(grads.device_bytes(), grads.host_bytes()));
  static_assert(memory_plan<L, fp32, OffloadedAdamW>(2, {.offload_gradients = true, .offload_gradients_backup = true})
                    .host_pageable.gradients == 512);
  // Pages of a span: Net<Repeat<3, Block>> in fp32, 13,349 parameters (52 KiB), reports after each
  // layer with parameters, from the last to the first. A span's copy down is waited for at the next
  // report, so two spans are held at once: with pages of 1 KiB the first block's two Linears
  // (gradients [480, 4672): 4,192 of them, 16.4 KiB from byte 1,920) touch 18 pages, and the
  // buffer's last page, which it fills in part, is never given back: 19 pages.
  using R = Net<Repeat<3, Block>>;
  static_assert(R::param_count == 12 * W + W + 3 * (2 * W + W * 64 + 64 + 64 * W + W) + W * 5 + 5);
  constexpr auto spans = memory_plan<R, fp32, OffloadedAdamW>(16, {.offload_gradients = true, .gradient_page = 1024});
  static_assert(spans.gradient_pages == 19 * 1024);
  static_assert(spans.host_pageable.gradients == memory::caching_allocator<host>::rounded(R::param_count * 4));
  // Under data parallelism, a rank of a ZeRO-2 wrapper: the sum of its shard on the host (the last
  // of 3 ranks: 14 parameters, one block); on the device the buffer's pages in place of its block
  // (shard_gradients, implied): the 160 bytes touch at most 2 pages of 4 KiB. Without the sharded
  // optimizer, refused.
  constexpr auto rank2 = memory_plan<L, fp32, OffloadedAdamW>(
      2, {.ranks = 3, .rank = 2, .shard_optimizer = true, .offload_gradients = true});
  static_assert(rank2.host_pageable.gradients == 256 && rank2.gradients == 256);
  static_assert(rank2.gradient_pages == 2 * 4096 && rank2.device_paged == 256);
  static_assert(rank2.device_bytes() == rank2.reserved - 256 + 2 * 4096);
  CHECK_THROWS_AS((memory_plan<L, fp32, OffloadedAdamW>(2, {.ranks = 2, .offload_gradients = true})), argument_error);
  // Offloaded<S>'s activations count on the host too.
  constexpr auto offloaded = memory_plan<Net<Repeat<3, Offloaded<Block>>>, fp32, OffloadedAdamW>(16);
  static_assert(offloaded.activations.offloaded_bytes > 0);
  static_assert(offloaded.host_bytes() == offloaded.host_pageable.total() + offloaded.activations.offloaded_bytes);
  static_assert(!offloaded.fits(offloaded.reserved, offloaded.host_bytes() - 1));

  // Measured: the model's allocator holds the device's part, the optimizer's host allocator the
  // host's (a host model: the buffers that cross live there too), per tag and in total.
  auto measure = [](auto precision, bool master_on_host) {
    using P = decltype(precision);
    using NetT = Net<Repeat<3, Checkpointed<Block>>>;
    INFO("master weights on the host: " << master_on_host);
    memory::caching_allocator<host> device, on_the_host;
    model<NetT, host, P> m(seed{3}, device);
    OffloadedAdamW opt(m, {.lr = 1e-3}, {0, model<NetT, host, P>::parameter_count}, &on_the_host,
                       {.master_weights = master_on_host});
    auto const plan = memory_plan<NetT, P, OffloadedAdamW>(16, {.offload_master_weights = master_on_host});
    tensor<float> x(16, index_t(NetT::in_width)), t(16, index_t(NetT::out_width));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.1f * float(i % 3);
    for (int step = 0; step < 2; ++step) {
      device.reset_peak();
      m.template train_step<MSE>(x, t, opt);
      auto const d = device.stats(), h = on_the_host.stats();
      for (memory::tag g : memory::all_tags) {
        INFO(P::name << ", step " << step << ", " << memory::name(g));
        CHECK(d[g].peak == plan[g]);
        CHECK(h[g].reserved == plan.host_pageable[g]);
        CHECK(h[g].peak == plan.host_pageable[g]);
      }
      CHECK(d.total.peak == plan.peak);
      CHECK(d.total.reserved == plan.reserved);
      CHECK(h.total.reserved == plan.host_pageable.total());
    }
  };
  measure(fp32{}, false);
  measure(mixed<bfloat16, DynamicLossScale>{}, false);
  measure(mixed<bfloat16, DynamicLossScale>{}, true);
  measure(mixed<half, DynamicLossScale>{}, true);
}

TEST_CASE("memory_plan: a GPT of Llama-7B's size trains on one 80 GB GPU with 120 GiB of host memory",
          "[plan][offload][master]") {
  // 32 blocks of width 4096 (32 heads), a vocabulary of 32,000, sequences of 2048, batch 1,
  // each block checkpointed, bf16 with fp32 master weights, OffloadedAdamW with the master weights on
  // the host. Planned at run time (a constant evaluation of this size is past the compilers'
  // limits), before anything is allocated, as a program does.
  using Llama7B = GPT<32000, 2048, 4096, 32, 32, 0.0, EachBlockCheckpointed>;
  using P = mixed<bfloat16, DynamicLossScale>;
  // Hand-counted: the embeddings (32000 + 2048 rows of 4096), per block two LayerNorms (2 x 8192),
  // the attention's products (4096 x 12288 + 12288, 4096 x 4096 + 4096) and the MLP's (4096 x 16384
  // + 16384, 16384 x 4096 + 4096), the final LayerNorm and the head (4096 x 32000 + 32000).
  constexpr std::size_t block = 2 * 8192 + (4096 * 12288 + 12288) + (4096 * 4096 + 4096) +
                                (4096 * 16384 + 16384) + (16384 * 4096 + 4096);
  constexpr std::size_t n = (32000 + 2048) * 4096 + 32 * block + 8192 + (4096 * 32000 + 32000);
  static_assert(Llama7B::param_count == n);
  static_assert(n > 6'700'000'000 && n < 6'800'000'000);
  step_options const o{.sequence = 2048, .offload_master_weights = true};
  auto const plan = memory_plan<Llama7B, P, OffloadedAdamW, SoftmaxCrossEntropy, cuda>(1, o);
  auto const rounded = [](std::size_t bytes) { return memory::caching_allocator<host>::rounded(bytes); };
  // The device: the bf16 weights (2 bytes a parameter) and the fp32 gradients (4), no master
  // weights and no optimizer state, and the step's activations laid out in their arena.
  CHECK(plan.master_weights == 0);
  CHECK(plan.compute_copy == rounded(n * 2));
  CHECK(plan.gradients == rounded(n * 4));
  CHECK(plan.optimizer_state == 0);
  CHECK(plan.reserved == plan.compute_copy + plan.gradients + plan.arena);
  // The host: the master weights and the two moments pageable (12 bytes a parameter); page-locked
  // only the slots the gradients and the bf16 copy cross through, two of 8 Mi values each.
  CHECK(plan.host_pageable.total() == rounded(n * 4) * 3);
  CHECK(plan.host_page_locked.total() == 2 * (std::size_t(8) << 20) * (4 + 2));
  constexpr std::size_t GB = 1'000'000'000, GiB = std::size_t(1) << 30;
  CHECK(plan.fits(80 * GB, 120 * GiB));
  // Without the placement the device holds the fp32 master weights as well: 4 bytes a parameter
  // more, and the host the same.
  auto const today = memory_plan<Llama7B, P, OffloadedAdamW, SoftmaxCrossEntropy, cuda>(1, {.sequence = 2048});
  CHECK(today.reserved == plan.reserved + rounded(n * 4));
  CHECK(today.host_bytes() == plan.host_bytes());
  // The gradients on the host too (offload_options::gradients): the device keeps the pages of the
  // span backward writes and of the one coming down (the widest two: the head's 131 M gradients,
  // 500 MiB, and the final LayerNorm's or a block's MLP's 67 M; granules of 2 MiB), the host 16
  // bytes a parameter.
  step_options full = o;
  full.offload_gradients = true;
  auto const all = memory_plan<Llama7B, P, OffloadedAdamW, SoftmaxCrossEntropy, cuda>(1, full);
  CHECK(all.gradients == 0);
  CHECK(all.reserved == plan.reserved - rounded(n * 4));
  CHECK(all.gradient_pages >= std::size_t(32000) * 4096 * 4);
  CHECK(all.gradient_pages <= (std::size_t(32000) * 4096 + 32000 + 4096 * 16384 + 4096) * 4 + 3 * (std::size_t(2) << 20));
  CHECK(all.host_pageable.total() == rounded(n * 4) * 4);
  CHECK(all.fits(80 * GB, 120 * GiB));
  // AdamW on the device: 16 bytes a parameter before any activation, past 80 GB.
  auto const adamw = memory_plan<Llama7B, P, AdamW, SoftmaxCrossEntropy>(1, {.sequence = 2048});
  CHECK_FALSE(adamw.fits(80 * GB, 120 * GiB));
  WARN("7B GPT, batch 1 x 2048: device " << memory::format_bytes(plan.reserved) << " (arena "
                                         << memory::format_bytes(plan.arena) << "), host "
                                         << memory::format_bytes(plan.host_bytes()) << "; without the placement "
                                         << memory::format_bytes(today.reserved) << "; the gradients on the host too: device "
                                         << memory::format_bytes(all.device_bytes()) << ", host "
                                         << memory::format_bytes(all.host_bytes()) << "; AdamW "
                                         << memory::format_bytes(adamw.reserved));
}

TEST_CASE("memory_plan: the budget policy stores every block of the 7B GPT on 80 GB, fully offloaded",
          "[plan][offload][budget]") {
  // bench_offload_gpt --train 7b: Budget around the whole GPT, its bytes what 80 GB leaves to the
  // activations beside the bf16 weights and the fp32 gradients (about 37 GiB).
  using Stored = GPT<32000, 2048, 4096, 32, 32, 0.0>;
  using P = mixed<bfloat16, DynamicLossScale>;
  constexpr std::size_t GB = 1'000'000'000, GiB = std::size_t(1) << 30;
  using Roomy = Budget<60 * GiB, 1, Stored, 2048>;
  constexpr budget_choice roomy = Roomy::chosen<bfloat16>;
  static_assert(roomy.kind == budget_choice::blocks && roomy.checkpointed == 0 && roomy.selective == 0 &&
                roomy.recomputed == 0);
  step_options const o{.sequence = 2048, .offload_master_weights = true, .offload_gradients = true};
  auto const stored = memory_plan<Stored, P, OffloadedAdamW, SoftmaxCrossEntropy, cuda>(1, o);
  auto const plan = memory_plan<Roomy, P, OffloadedAdamW, SoftmaxCrossEntropy, cuda>(1, o);
  // Every block stored: the plain GPT's plan, activation for activation.
  CHECK(plan.activations.peak_bytes == roomy.peak);
  CHECK(plan.activations.peak_bytes == stored.activations.peak_bytes);
  CHECK(plan.device_bytes() == stored.device_bytes());
  CHECK(plan.fits(80 * GB, 120 * GiB));
  // Every block stored keeps 8.3 GiB of activations (GPTBlock's attention core keeps no seq x seq
  // probabilities; with StoredAttention, 16.3 GiB), so the whole step fits a device of 24 GB too.
  CHECK(plan.fits(24 * GB, 120 * GiB));
  // A device of 20 GB (18.6 GiB) leaves about 5.5 GiB to the activations: under a budget of 4 GiB
  // the policy recomputes, and the step fits.
  using Tight = Budget<4 * GiB, 1, Stored, 2048>;
  constexpr budget_choice tight = Tight::chosen<bfloat16>;
  static_assert(tight.recomputed > 0 && tight.peak <= 4 * GiB);
  auto const tight_plan = memory_plan<Tight, P, OffloadedAdamW, SoftmaxCrossEntropy, cuda>(1, o);
  CHECK(tight_plan.activations.peak_bytes == tight.peak);
  CHECK(tight_plan.peak == plan.peak - roomy.peak + tight.peak);
  // (The arena's layout search may stop above a step's peak, the layout being NP-hard in general,
  // plan/arena.hpp: within 0.1% for the tight step; the roomy one meets its peak.)
  CHECK(plan.reserved == plan.peak);
  CHECK(tight_plan.reserved >= tight_plan.peak);
  CHECK(tight_plan.reserved - tight_plan.peak < tight_plan.peak / 1000);
  CHECK(tight_plan.fits(20 * GB, 120 * GiB));
  CHECK_FALSE(plan.fits(20 * GB, 120 * GiB));
  WARN("7B GPT under Budget: every block stored " << memory::format_bytes(plan.peak) << " (reserved "
                                                  << memory::format_bytes(plan.reserved) << ", activations "
                                                  << memory::format_bytes(roomy.peak) << "); under 4 GiB "
                                                  << memory::format_bytes(tight_plan.peak) << " (reserved "
                                                  << memory::format_bytes(tight_plan.reserved) << ", "
                                                  << tight.recomputed << " block forwards again)");
}
