// memory_plan for a rank of a sharded data-parallel run, under mpirun (1, 2 or 3 ranks, in the
// same program as test_dist.cpp): with step_options::shard_gradients (ZeRO-2),
// shard_master_weights and shard_parameters (ZeRO-3) the plan, made before any buffer exists,
// counts at least the pages the wrapper plans from the buffers' addresses (which its other tests
// measure, page by page) and at most the few more that an unknown start within a page can cost:
// 5 pages of the gradients, 3 of the master weights and 3 of the compute copy; and the step's
// device and host bytes count those pages in place of the blocks they come from.
#include "common.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>

using namespace remat;
using namespace dist_test;

namespace {

constexpr std::size_t D = 128;  // (wide enough that the gradients span hundreds of pages)
using Wide = Residual<Seq<LayerNorm<D>, Linear<D, 256>, GELU, Linear<256, D>>>;
using Stored = Seq<Linear<In, D>, Repeat<6, Wide>, LayerNorm<D>, Linear<D, Out>>;
using Ckpt = Seq<Linear<In, D>, Repeat<6, Checkpointed<Wide>>, LayerNorm<D>, Linear<D, Out>>;
using B = mixed<bfloat16, DynamicLossScale>;

std::size_t page_size() { return std::size_t(sysconf(_SC_PAGESIZE)); }

// The pages that `count` elements of U at `data` touch, in bytes.
template <class U>
std::size_t pages_touched(U const* data, std::size_t count) {
  std::size_t const page = page_size();
  auto const begin = reinterpret_cast<std::uintptr_t>(data);
  return (begin + count * sizeof(U) + page - 1) / page * page - begin / page * page;
}

// The plan's count of pages against the wrapper's: at least as many, at most `slack` pages more.
void check_bound(std::size_t planned, std::size_t wrapper, std::size_t slack) {
  INFO("memory_plan " << planned << " bytes, the wrapper's plan " << wrapper);
  CHECK(planned >= wrapper);
  CHECK(planned <= wrapper + slack * page_size());
}

}  // namespace

TEST_CASE("memory_plan of a ZeRO-2 rank: the gradient pages it holds at most, before the wrapper exists",
          "[dist][zero2][plan]") {
  auto const check = [&]<class NetT, class P>(NetT*, P, char const* name, std::size_t bucket) {
    INFO(name << ", " << P::name << ", bucket_bytes " << bucket << ", rank " << world_rank() << " of "
              << world_size());
    auto const rank = std::size_t(world_rank()), ranks = std::size_t(world_size());
    param_range const r = my_rows(world_rank(), world_size());
    auto const plan = memory_plan<NetT, P, AdamW, SoftmaxCrossEntropy>(
        r.size(), {.ranks = ranks, .rank = rank, .shard_gradients = true, .bucket_bytes = bucket});
    // (shard_gradients implies shard_optimizer: the same plan of the optimizer's state)
    auto const zero1 = memory_plan<NetT, P, AdamW, SoftmaxCrossEntropy>(
        r.size(), {.ranks = ranks, .rank = rank, .shard_optimizer = true});
    CHECK(plan.optimizer_state == zero1.optimizer_state);
    CHECK(plan.gradients == zero1.gradients);
    CHECK(plan.device_paged == plan.gradients);
    CHECK(plan.device_bytes() == zero1.device_bytes() - plan.gradients + plan.gradient_pages);
    CHECK(plan.host_bytes() == zero1.host_bytes());

    model<NetT, host, P> m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(2, bucket));
    AdamW opt(m, opts);
    dist::gradient_memory const before = dp.gradient_pages();
    check_bound(plan.gradient_pages, before.planned_peak, 5);
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      dist::gradient_memory const g = dp.gradient_pages();
      CHECK(g.last_peak == g.planned_peak);
      CHECK(g.last_peak <= plan.gradient_pages);
    }
    // Fewer than the whole buffer's pages where there are several ranks and small buckets.
    if (world_size() > 1 && 4 * bucket <= model<NetT>::parameter_count * sizeof(float))
      CHECK(plan.gradient_pages < plan.gradients);
  };
  check(static_cast<Stored*>(nullptr), fp32{}, "stored", std::size_t(64) << 10);
  check(static_cast<Stored*>(nullptr), fp32{}, "stored", std::size_t(4) << 20);
  check(static_cast<Ckpt*>(nullptr), fp32{}, "Checkpointed", std::size_t(16) << 10);
  check(static_cast<Stored*>(nullptr), B{}, "stored", std::size_t(32) << 10);
}

TEST_CASE("memory_plan of a rank under shard_master_weights: the master weights' pages it holds, on the device or "
          "on the host",
          "[dist][master_shard][plan]") {
  using M = model<Stored, host, B>;
  constexpr std::size_t n = M::parameter_count;
  auto const rank = std::size_t(world_rank()), ranks = std::size_t(world_size());
  param_range const r = my_rows(world_rank(), world_size());
  for (int level : {1, 2}) {
    INFO("ZeRO-" << level << ", rank " << rank << " of " << ranks);
    dist::options d = sharding(level);
    d.shard_master_weights = true;
    // AdamW: the master weights in the model's allocator (the device's side of the plan).
    {
      auto const plan = memory_plan<Stored, B, AdamW, SoftmaxCrossEntropy>(
          r.size(), {.ranks = ranks, .rank = rank, .shard_gradients = level == 2, .shard_master_weights = true,
                     .bucket_bytes = d.bucket_bytes});
      CHECK_FALSE(plan.master_pages_on_host);
      CHECK(plan.device_paged == plan.master_weights + (level == 2 ? plan.gradients : 0));
      M m(seed{7});
      dist::data_parallel dp(m, MPI_COMM_WORLD, d);
      AdamW opt(m, opts);
      batch b = whole_batch(0);
      dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      // (a host model's wrapper counts the compute copy's pages too, all of them)
      std::size_t const compute = pages_touched(m.compute_parameters().data(), n);
      dist::gradient_memory const p = dp.parameter_pages();
      CHECK(p.last_peak == p.planned_peak);
      check_bound(plan.master_pages, p.planned_peak - compute, 3);
      if (world_size() == 1) CHECK(plan.master_pages >= pages_touched(std::as_const(m).parameters().data(), n));
      if (world_size() > 1) CHECK(plan.master_pages < plan.master_weights);
    }
    // OffloadedAdamW with the master weights in host memory (built there) and, under ZeRO-2, the
    // gradients too: the host's side of the plan.
    {
      auto const plan = memory_plan<Stored, B, OffloadedAdamW, SoftmaxCrossEntropy>(
          r.size(), {.ranks = ranks, .rank = rank, .shard_optimizer = true, .offload_master_weights = true,
                     .offload_gradients = level == 2, .shard_master_weights = true, .bucket_bytes = d.bucket_bytes});
      CHECK(plan.master_pages_on_host);
      CHECK(plan.master_weights == 0);
      CHECK(plan.host_paged == plan.host_pageable.parameters);
      CHECK(plan.host_bytes() == plan.host_pageable.total() + plan.host_page_locked.total() +
                                     plan.activations.offloaded_bytes - plan.host_pageable.parameters +
                                     plan.master_pages);
      memory::caching_allocator<host> host_side;
      std::optional<M> held;
      held.emplace(seed{7}, memory::default_allocator<host>(), host_master_weights{host_side});
      M& m = *held;
      dist::data_parallel dp(m, MPI_COMM_WORLD, d);
      std::optional<OffloadedAdamW<M>> opt;
      if (level == 2)
        opt.emplace(m, opts, offload_options{.gradients = gradient_place::host});
      else
        opt.emplace(m, opts);
      batch b = whole_batch(0);
      dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), *opt);
      std::size_t const compute = pages_touched(m.compute_parameters().data(), n);
      dist::gradient_memory const p = dp.parameter_pages();
      check_bound(plan.master_pages, p.planned_peak - compute, 3);
      if (level == 2) {
        dist::gradient_memory const g = dp.gradient_pages();
        CHECK(g.last_peak == g.planned_peak);
        check_bound(plan.gradient_pages, g.planned_peak, 5);
      }
    }
  }
  // Refused: an fp32 model (its layers read the master weights: ZeRO-3 shards them).
  CHECK_THROWS_AS((memory_plan<Stored, fp32, AdamW, SoftmaxCrossEntropy>(4, {.shard_master_weights = true})),
                  argument_error);
}

TEST_CASE("memory_plan of a ZeRO-3 rank: the parameters' pages and the gather buffers, before the wrapper exists",
          "[dist][zero3][plan]") {
  auto const check = [&]<class NetT, class P>(NetT*, P, char const* name, int level, bool prefetch) {
    INFO(name << ", " << P::name << ", level " << level << ", prefetch " << prefetch << ", rank " << world_rank()
              << " of " << world_size());
    using M = model<NetT, host, P>;
    param_range const r = my_rows(world_rank(), world_size());
    dist::options d = sharding(level, std::size_t(32) << 10);
    d.prefetch_parameters = prefetch;
    auto const plan = memory_plan<NetT, P, AdamW, SoftmaxCrossEntropy>(
        r.size(), {.ranks = std::size_t(world_size()), .rank = std::size_t(world_rank()), .shard_parameters = true,
                   .prefetch_parameters = prefetch, .keep_parameters_for_backward = level == 4,
                   .bucket_bytes = d.bucket_bytes});
    constexpr bool mixed = M::mixed_precision;
    CHECK(plan.device_paged == plan.gradients + plan.master_weights + plan.compute_copy);
    CHECK((plan.compute_pages > 0) == mixed);
    CHECK(plan.device_bytes() == plan.reserved - plan.device_paged + plan.gradient_pages + plan.master_pages +
                                     plan.compute_pages + plan.gather_pages);
    M m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, d);
    AdamW opt(m, opts);
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    }
    dist::gradient_memory const p = dp.parameter_pages(), g = dp.gradient_pages();
    CHECK(p.last_peak == p.planned_peak);
    check_bound(plan.master_pages + plan.compute_pages + plan.gather_pages, p.planned_peak, mixed ? 6 : 3);
    check_bound(plan.gradient_pages, g.planned_peak, 5);
    if (world_size() > 1 && level == 3)
      CHECK(plan.master_pages + plan.compute_pages < plan.master_weights + plan.compute_copy);
  };
  for (int level : {3, 4}) {
    check(static_cast<Stored*>(nullptr), fp32{}, "stored", level, true);
    check(static_cast<Ckpt*>(nullptr), B{}, "Checkpointed", level, true);
  }
  check(static_cast<Stored*>(nullptr), B{}, "stored", 3, false);
}
