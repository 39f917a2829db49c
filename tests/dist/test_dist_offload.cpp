// remat::dist with OffloadedAdamW (ZeRO-Offload): under mpirun (1, 2 or 3 ranks, in the same
// program as test_dist.cpp), the optimizer with its state, the master weights or the gradients on
// the host trains bit for bit as AdamW under the same wrapper, at every ZeRO level that takes it,
// and each rank's step measures its plan on the device and on the host.
#include "common.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace remat;
using namespace dist_test;

namespace {
// Three ZeRO-2 (or `level`) steps of three micro-batches each (every pass reduced), clipping on:
// the weights (ZeRO-3: gathered whole), the last norm and the losses; the wrapper's gradient pages
// in `pages`, its parameter pages in `params` and the master weights' pages given back in
// `master`. With built_on_host (mixed precision), the model is built with its master weights in
// host memory (host_master_weights).
template <class P, template <class> class Opt, class NetT = Net>
std::vector<float> zero2_run(dist::gradient_memory* pages = nullptr, int level = 2, bool built_on_host = false,
                             dist::gradient_memory* params = nullptr, given_back* master = nullptr) {
  using M = model<NetT, host, P>;
  memory::caching_allocator<host> host_side;  // (before the model: it outlives the model)
  std::optional<M> held;
  if constexpr (M::mixed_precision)
    if (built_on_host) held.emplace(seed{7}, memory::default_allocator<host>(), host_master_weights{host_side});
  if (!held) held.emplace(seed{7});
  M& m = *held;
  REQUIRE(m.master_on_host() == built_on_host);
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
  Opt<M> opt(m, {.lr = 1e-2, .weight_decay = 1e-2, .clip_norm = 0.5});
  std::vector<double> losses;
  three_accumulated_steps(dp, m, opt, losses);
  if (pages) *pages = dp.gradient_pages();
  if (params) *params = dp.parameter_pages();
  if (master) *master = master_pages_given_back(std::as_const(m), dp.shard());
  dp.gather_parameters();  // (ZeRO-3: the whole parameters, to compare; nothing otherwise)
  std::vector<float> p = params_of(m);
  p.push_back(float(opt.last_grad_norm()));
  for (double l : losses) p.push_back(float(l));
  return p;
}
}  // namespace

// Every storage policy in one model (each over a segment of its own), the budget policy at its
// leanest included: the full offload (the gradients on the host, and in mixed precision the master
// weights too) under every policy.
constexpr std::size_t leanest_budget = Budget<std::size_t(1) << 30, Batch, Repeat<2, Block>>::minimum<float>;
using EveryPolicyNet =
    NetWith<Seq<Checkpointed<Block>, Selective<Block>, CheckpointSequential<2, Repeat<3, Block>, last_run::stored>,
                Revolve<2, Repeat<3, Block>>, Offloaded<Block>, Budget<leanest_budget, Batch, Repeat<2, Block>>>>;
using EveryPolicyStored = NetWith<Seq<Block, Block, Repeat<3, Block>, Repeat<3, Block>, Block, Repeat<2, Block>>>;

TEST_CASE("each rank's offloaded step measures its plan on the device and on the host", "[dist][memory][plan][offload]") {
  // (master: the master weights on the host too, all of them on every rank, under ZeRO-3 by a
  // model built so (host_master_weights); gradients: the gradients too, the sum of the rank's
  // shard, under ZeRO-2, or ZeRO-3 with zero3: the parameters' pages are the wrapper's, as the
  // gradients' are)
  auto check = [](auto tag_model, auto precision, bool shard, bool master = false, bool gradients = false,
                  bool zero3 = false) {
    using NetT = decltype(tag_model);
    using P = decltype(precision);
    using M = model<NetT, host, P>;
    INFO(P::name << ", shard_optimizer " << shard << ", master weights on the host " << master
                 << ", gradients on the host " << gradients << ", ZeRO-3 " << zero3 << ", rank " << world_rank()
                 << " of " << world_size());
    memory::caching_allocator<host> device, on_the_host;
    std::optional<M> held;
    if constexpr (M::mixed_precision)
      if (master && zero3) held.emplace(seed{7}, device, host_master_weights{on_the_host});
    if (!held) held.emplace(seed{7}, device);
    M& m = *held;
    dist::data_parallel dp(m, MPI_COMM_WORLD,
                           {.bucket_bytes = 512, .shard_optimizer = shard, .shard_gradients = gradients,
                            .shard_parameters = zero3});
    OffloadedAdamW opt(m, opts, dp.shard(), &on_the_host,
                       {.master_weights = master, .gradients = gradients ? gradient_place::host : gradient_place::device});
    param_range const r = my_rows(dp.rank(), dp.size());
    auto const plan = memory_plan<NetT, P, OffloadedAdamW, SoftmaxCrossEntropy>(
        r.size(), {.ranks = std::size_t(dp.size()), .rank = std::size_t(dp.rank()), .shard_optimizer = shard,
                   .offload_master_weights = master, .offload_gradients = gradients});
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      device.reset_peak();
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      auto const d = device.stats(), h = on_the_host.stats();
      for (memory::tag g : memory::all_tags) {
        INFO(memory::name(g));
        CHECK(d[g].peak == plan[g]);
        CHECK(h[g].peak == plan.host_pageable[g]);
      }
      CHECK(d.total.peak == plan.peak);
      CHECK(h.total.reserved == plan.host_pageable.total());
    }
  };
  for (bool shard : {false, true}) {
    check(Net{}, fp32{}, shard);
    check(CheckpointedNet{}, mixed<bfloat16, DynamicLossScale>{}, shard);
    check(CheckpointedNet{}, mixed<bfloat16, DynamicLossScale>{}, shard, true);
    check(Net{}, mixed<half, DynamicLossScale>{}, shard, true);
  }
  check(Net{}, fp32{}, true, false, true);
  check(CheckpointedNet{}, mixed<bfloat16, DynamicLossScale>{}, true, true, true);
  check(Net{}, fp32{}, true, false, true, true);
  check(CheckpointedNet{}, mixed<bfloat16, DynamicLossScale>{}, true, false, true, true);
  check(CheckpointedNet{}, mixed<bfloat16, DynamicLossScale>{}, true, true, false, true);
  check(CheckpointedNet{}, mixed<bfloat16, DynamicLossScale>{}, true, true, true, true);
  check(EveryPolicyNet{}, fp32{}, true, false, true);
  check(EveryPolicyNet{}, mixed<bfloat16, DynamicLossScale>{}, true, true, true);
  check(EveryPolicyNet{}, mixed<bfloat16, DynamicLossScale>{}, true, true, true, true);
}

TEST_CASE("the gradients on the host are refused under a wrapper without ZeRO-2, and a wrapper built after them",
          "[dist][offload][errors]") {
  model<Net> m(seed{7});
  {
    dist::data_parallel dp(m, MPI_COMM_WORLD);
    CHECK_THROWS_WITH(OffloadedAdamW(m, opts, dp.shard(), nullptr, {.gradients = gradient_place::host}),
                      Catch::Contains("expects a model trained alone"));
    CHECK(m.link().gradient_sync() != nullptr);  // (the wrapper's, still)
  }
  OffloadedAdamW opt(m, opts, {.gradients = gradient_place::host});
  CHECK_THROWS_WITH(dist::data_parallel(m, MPI_COMM_WORLD, sharding(2)), Catch::Contains("build the data_parallel first"));
  CHECK(opt.offloads_gradients());
}

TEST_CASE("with the master weights on the host, an offloaded optimizer trains bit for bit as AdamW does",
          "[dist][offload][master]") {
  using P = mixed<bfloat16, DynamicLossScale>;
  for (int level : {0, 1, 2}) {
    INFO("ZeRO-" << level << ", " << world_size() << " ranks");
    std::vector<double> la, lo;
    std::vector<float> const a = data_parallel_run<Net, P, AdamW_of>(3, opts, sharding(level), &la);
    std::vector<float> const o = data_parallel_run<Net, P, OffloadedMaster>(3, opts, sharding(level), &lo);
    CHECK(std::memcmp(a.data(), o.data(), a.size() * sizeof(float)) == 0);
    CHECK(la == lo);
    CHECK(same_on_every_rank(o));
  }
}

TEST_CASE("master weights in host memory: rank 0's are broadcast, and after a sharded step every rank holds them and "
          "their compute copy, the copy as cast",
          "[dist][offload][master]") {
  // (They go through an MPI transport of their own, and the compute copy, which each rank's
  // optimizer wrote for its shard, is gathered, not cast again: a GPU model's path.)
  using P = mixed<bfloat16, DynamicLossScale>;
  using M = model<Net, host, P>;
  std::vector<float> const first = params_of(M(seed{7}));
  for (int level : {0, 1, 2}) {
    INFO("ZeRO-" << level << ", " << world_size() << " ranks");
    memory::caching_allocator<host> host_side;  // (outlives the model)
    M m(seed{7 + 13 * std::uint64_t(world_rank())}, memory::default_allocator<host>(), host_master_weights{host_side});
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
    std::vector<float> const broadcast = params_of(m);
    CHECK(std::memcmp(broadcast.data(), first.data(), first.size() * sizeof(float)) == 0);
    OffloadedAdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    }
    std::vector<float> const p = params_of(m);
    CHECK(max_abs_diff(p, broadcast) > 0);  // (trained)
    CHECK(same_on_every_rank(p));
    tensor_view<bfloat16, host> const copy = m.compute_parameters();
    REQUIRE(copy.size() == p.size());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < p.size(); ++i) wrong += bfloat16(p[i]).bits() != copy.data()[i].bits();
    CHECK(wrong == 0);
    CHECK(dp.last_step_traffic().gathered ==
          (level ? (n_params - dp.shard().size()) * (sizeof(float) + sizeof(bfloat16)) : 0));
  }
}

TEST_CASE("ZeRO-3 with the master weights built on the host: each rank keeps its shard of them, and an offloaded "
          "optimizer trains bit for bit as AdamW does",
          "[dist][offload][master][zero3]") {
  // The model built with host_master_weights, then the wrapper: it keeps the pages of the rank's
  // shard of the host's master weights (and of the device's compute copy), as it does of a model's
  // own. The same bits as AdamW over a model built as usual under the same wrapper: bf16 and half
  // with a dynamic scale, clipping, three micro-batches a step; the gradients on the device or on
  // the host too (ZeRO-Offload's whole placement, each rank offloading its shard).
  using B = mixed<bfloat16, DynamicLossScale>;
  using H = mixed<half, DynamicLossScale>;
  for (int level : {3, 4}) {
    INFO("ZeRO-3" << (level == 4 ? ", kept for backward" : "") << ", " << world_size() << " ranks");
    dist::gradient_memory built{}, all{};
    given_back in_model{}, on_host{}, all_on_host{};
    std::vector<float> const a = zero2_run<B, AdamW_of>(nullptr, level, false, nullptr, &in_model);
    std::vector<float> const o = zero2_run<B, OffloadedAdamW>(nullptr, level, true, &built, &on_host);
    std::vector<float> const g = zero2_run<B, OffloadedGrads>(nullptr, level, true, &all, &all_on_host);
    CHECK(std::memcmp(a.data(), o.data(), a.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.data(), g.data(), a.size() * sizeof(float)) == 0);
    CHECK(same_on_every_rank(std::vector<float>(o.begin(), o.begin() + std::ptrdiff_t(n_params))));
    std::vector<float> const ah = zero2_run<H, AdamW_of>(nullptr, level);
    std::vector<float> const gh = zero2_run<H, OffloadedGrads>(nullptr, level, true);
    CHECK(std::memcmp(ah.data(), gh.data(), ah.size() * sizeof(float)) == 0);
    // The parameter pages (the master weights' on the host among them): a pass's peak as planned;
    // after the steps the host's master weights hold the pages of the rank's shard only, as the
    // model's own do (kept for backward, until the next pass: the same).
    for (dist::gradient_memory const& p : {built, all}) CHECK(p.last_peak == p.planned_peak);
    for (given_back const& m : {in_model, on_host, all_on_host}) CHECK(m.found == m.expected);
    // A rank's shard may touch every page of so small a model's buffer (where the allocator puts it
    // decides, as CI found once on 2 ranks). A model of 70 KiB spans two pages a rank and more up
    // to 8 ranks, so there some rank must give back a whole page, whatever the alignment.
    using Mid = Seq<Linear<In, 64>, Repeat<2, Residual<Seq<LayerNorm<64>, Linear<64, 64>, GELU, Linear<64, 64>>>>,
                    LayerNorm<64>, Linear<64, Out>>;
    given_back mid_in_model{}, mid_on_host{};
    std::vector<float> const ma = zero2_run<B, AdamW_of, Mid>(nullptr, level, false, nullptr, &mid_in_model);
    std::vector<float> const mo = zero2_run<B, OffloadedAdamW, Mid>(nullptr, level, true, nullptr, &mid_on_host);
    CHECK(std::memcmp(ma.data(), mo.data(), ma.size() * sizeof(float)) == 0);
    for (given_back const& m : {mid_in_model, mid_on_host}) {
      REQUIRE(m.two_pages_a_rank);
      CHECK(m.found == m.expected);
      unsigned long mine = m.expected, ranks = 0;
      MPI_Allreduce(&mine, &ranks, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
      if (world_size() > 1) CHECK(ranks > 0);
    }
  }
  // Moving the master weights once a ZeRO-3 wrapper holds their pages (one rank too): refused,
  // the model unchanged.
  model<Net, host, B> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(3));
  CHECK_THROWS_WITH(OffloadedAdamW(m, opts, {.master_weights = true}), Catch::Contains("host_master_weights"));
  CHECK_FALSE(m.master_on_host());
}

TEST_CASE("ZeRO-3 with the master weights and the gradients on the host resumes from the run's files bit for bit",
          "[dist][offload][master][zero3][io]") {
  // 4 steps straight through, against 2 steps, the files written (dist::save gathers the master
  // weights' shards from each rank's host memory into rank 0's file and lets them go again; the
  // optimizer's state gathered, or per rank) and 2 more in a new model, wrapper and optimizer
  // loaded from them (dist::load writes the weights on rank 0 and broadcasts them; each rank
  // keeps its shard). bf16 with a dynamic scale, clipping and weight decay.
  using P = mixed<bfloat16, DynamicLossScale>;
  using M = model<Net, host, P>;
  std::string const base = std::string(REMAT_TEST_BINARY_DIR) + "/dist_zero3_master_" + std::to_string(world_size());
  adamw_options const o{.lr = 1e-2, .weight_decay = 1e-2, .clip_norm = 0.5};
  auto& device = memory::default_allocator<host>();
  for (int level : {3, 4})
    for (bool per_rank : {false, true}) {
      INFO("ZeRO-3" << (level == 4 ? ", kept for backward" : "") << (per_rank ? ", per-rank optimizer files" : "")
                    << ", " << world_size() << " ranks");
      // (the host allocators outlive the models whose master weights they hold)
      memory::caching_allocator<host> straight_side, first_side, second_side;
      M straight(seed{7}, device, host_master_weights{straight_side});
      dist::data_parallel dps(straight, MPI_COMM_WORLD, sharding(level));
      OffloadedAdamW os(straight, o, dps.shard(), nullptr, {.gradients = gradient_place::host});
      train_steps(dps, os, 0, 4);
      std::string const mp = base + "_model.safetensors", op = base + "_adamw.safetensors";
      {
        M first(seed{7}, device, host_master_weights{first_side});
        dist::data_parallel dp(first, MPI_COMM_WORLD, sharding(level));
        OffloadedAdamW opt(first, o, dp.shard(), nullptr, {.gradients = gradient_place::host});
        train_steps(dp, opt, 0, 2);
        dist::save(dp, mp);
        if (per_rank)
          dist::save_shards(dp, opt, op);
        else
          dist::save(dp, opt, op);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      M second(seed{99}, device, host_master_weights{second_side});
      dist::data_parallel dp(second, MPI_COMM_WORLD, sharding(level));
      OffloadedAdamW opt(second, o, dp.shard(), nullptr, {.gradients = gradient_place::host});
      dist::load(dp, mp);
      if (per_rank)
        dist::load_shards(dp, opt, op);
      else
        dist::load(dp, opt, op);
      CHECK(opt.steps() == 2);
      train_steps(dp, opt, 2, 4);
      CHECK(second.scaler().scale() == straight.scaler().scale());
      CHECK(tensor_to_host(opt.exp_avg().view()) == tensor_to_host(os.exp_avg().view()));
      CHECK(tensor_to_host(opt.exp_avg_sq().view()) == tensor_to_host(os.exp_avg_sq().view()));
      // The compute copy's shard, written by the last step, is the cast of the master weights'.
      param_range const own = dp.shard();
      std::vector<bfloat16> const copy = tensor_to_host(second.compute_parameters());
      dp.gather_parameters();
      dps.gather_parameters();
      std::vector<float> const got = params_of(second);
      CHECK(got == params_of(straight));
      std::size_t wrong = 0;
      for (std::size_t i = own.begin; i < own.end; ++i) wrong += bfloat16(got[i]).bits() != copy[i].bits();
      CHECK(wrong == 0);
      MPI_Barrier(MPI_COMM_WORLD);
    }
}

TEST_CASE("with the gradients on the host under ZeRO-2, an offloaded optimizer trains bit for bit as AdamW does",
          "[dist][offload][gradients]") {
  // Each rank's shard comes down as its buckets' reductions end, and its pages go as the others'
  // do; each later micro-batch finds the shard's sum on the device before it adds onto it.
  dist::gradient_memory kept{}, sent{};
  std::vector<float> const a = zero2_run<fp32, AdamW_of>(&kept);
  std::vector<float> const o = zero2_run<fp32, OffloadedGrads>(&sent);
  CHECK(std::memcmp(a.data(), o.data(), a.size() * sizeof(float)) == 0);
  CHECK(same_on_every_rank(std::vector<float>(o.begin(), o.begin() + std::ptrdiff_t(n_params))));  // (the weights)
  // The pages: as planned, and no more than a rank keeps with its shard on the device.
  CHECK(sent.last_peak == sent.planned_peak);
  CHECK(kept.last_peak == kept.planned_peak);
  CHECK(sent.planned_peak <= kept.planned_peak);
  // A wider model (2 MiB of gradients, 520 pages): a rank's shard is a third of them or more, what
  // comes down in flight is a few layers' (buckets of 512 bytes).
  using Wide = Seq<Linear<In, 256>, Repeat<4, Residual<Seq<LayerNorm<256>, Linear<256, 256>, GELU, Linear<256, 256>>>>,
                   LayerNorm<256>, Linear<256, Out>>;
  std::vector<float> const wa = zero2_run<fp32, AdamW_of, Wide>(&kept);
  std::vector<float> const wo = zero2_run<fp32, OffloadedGrads, Wide>(&sent);
  CHECK(std::memcmp(wa.data(), wo.data(), wa.size() * sizeof(float)) == 0);
  CHECK(sent.last_peak == sent.planned_peak);
  CHECK(sent.planned_peak * 2 < kept.planned_peak);
  WARN("ZeRO-2 over " << world_size() << " ranks, a rank's gradient pages at most: " << kept.planned_peak
                      << " bytes with its shard on the device, " << sent.planned_peak << " with it on the host");
  using B = mixed<bfloat16, DynamicLossScale>;
  std::vector<float> const ab = zero2_run<B, AdamW_of>();
  std::vector<float> const ob = zero2_run<B, OffloadedGrads>();
  std::vector<float> const all = zero2_run<B, OffloadedAll>();
  CHECK(std::memcmp(ab.data(), ob.data(), ab.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(ab.data(), all.data(), ab.size() * sizeof(float)) == 0);
  // Under ZeRO-3 (which shards the gradients as ZeRO-2 does, and the parameters): the same.
  std::vector<float> const a3 = zero2_run<fp32, AdamW_of>(&kept, 3);
  std::vector<float> const o3 = zero2_run<fp32, OffloadedGrads>(&sent, 3);
  CHECK(std::memcmp(a3.data(), o3.data(), a3.size() * sizeof(float)) == 0);
  CHECK(sent.last_peak == sent.planned_peak);
  CHECK(sent.planned_peak <= kept.planned_peak);
  std::vector<float> const ab3 = zero2_run<B, AdamW_of>(nullptr, 3);
  std::vector<float> const ob3 = zero2_run<B, OffloadedGrads>(nullptr, 3);
  CHECK(std::memcmp(ab3.data(), ob3.data(), ab3.size() * sizeof(float)) == 0);
  {  // The optimizer gone before the wrapper: the rank's shard of the model's gradients holds the sum.
    model<Net> m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(2));
    param_range const r = my_rows(dp.rank(), dp.size()), s = dp.shard();
    std::vector<float> sum;
    {
      OffloadedGrads<model<Net>> opt(m, opts);
      batch b = whole_batch(0);
      m.zero_grad();
      dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r));
      sum = tensor_to_host(opt.gradients().view());
      CHECK_FALSE(m.link().gradient_sync()->kept_gradients(n_params) == s);
    }
    std::vector<float> const g = tensor_to_host(m.gradients());
    CHECK(std::vector<float>(g.begin() + std::ptrdiff_t(s.begin), g.begin() + std::ptrdiff_t(s.end)) == sum);
    CHECK(m.link().gradient_sync()->kept_gradients(n_params) == s);  // (the wrapper keeps the shard again)
  }
  // Without ZeRO-2: refused, the model unchanged.
  model<Net> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(1));
  CHECK_THROWS_WITH(OffloadedAdamW(m, opts, dp.shard(), nullptr, {.gradients = gradient_place::host}),
                    Catch::Contains("shard_gradients"));
  CHECK_FALSE(m.link().gradient_sync()->gradients_elsewhere());
}

TEST_CASE("the full offload under every storage policy trains bit for bit as AdamW does, accumulation and clipping "
          "included, as planned on the device and on the host",
          "[dist][offload][gradients][master][policies]") {
  INFO(world_size() << " ranks");
  using B = mixed<bfloat16, DynamicLossScale>;
  constexpr std::ptrdiff_t n = model<EveryPolicyNet>::parameter_count;
  auto same = [](std::vector<float> const& a, std::vector<float> const& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  // (the policies change nothing of the arithmetic: AdamW's run is the stored model's, and it trains)
  std::vector<float> const stored = zero2_run<fp32, AdamW_of, EveryPolicyStored>();
  CHECK(same(stored, zero2_run<fp32, AdamW_of, EveryPolicyNet>()));
  CHECK(same(zero2_run<B, AdamW_of, EveryPolicyStored>(), zero2_run<B, AdamW_of, EveryPolicyNet>()));
  model<EveryPolicyStored> const initial(seed{7});
  CHECK(max_abs_diff(params_of(initial), std::vector<float>(stored.begin(), stored.begin() + n)) > 1e-3);
  for (int level : {2, 3}) {
    INFO("ZeRO-" << level);
    dist::gradient_memory kept{}, sent{};
    std::vector<float> const a = zero2_run<fp32, AdamW_of, EveryPolicyNet>(&kept, level);
    std::vector<float> const o = zero2_run<fp32, OffloadedGrads, EveryPolicyNet>(&sent, level);
    CHECK(same(a, o));
    CHECK(same_on_every_rank(std::vector<float>(o.begin(), o.begin() + n)));
    CHECK(sent.last_peak == sent.planned_peak);
    CHECK(kept.last_peak == kept.planned_peak);
    CHECK(sent.planned_peak <= kept.planned_peak);
    std::vector<float> const ab = zero2_run<B, AdamW_of, EveryPolicyNet>(nullptr, level);
    if (level == 2) {  // (the master weights moved to the host by the optimizer: ZeRO-3 takes them built there)
      CHECK(same(ab, zero2_run<B, OffloadedAll, EveryPolicyNet>(nullptr, level)));
    }
    // The model built with its master weights on the host (under ZeRO-3 the rank keeps its shard).
    CHECK(same(ab, zero2_run<B, OffloadedAll, EveryPolicyNet>(nullptr, level, true)));
  }
}

TEST_CASE("an offloaded optimizer, whole or sharded, trains bit for bit as AdamW does and saves the same state",
          "[dist][offload]") {
  std::string const dir = REMAT_TEST_BINARY_DIR;
  std::string const tag = std::to_string(world_size());
  for (bool shard : {false, true}) {
    INFO("shard_optimizer " << shard << ", " << world_size() << " ranks");
    dist::options const d{.bucket_bytes = 512, .shard_optimizer = shard};
    std::string const fa = dir + "/dist_offload_a_" + tag + ".safetensors";
    std::string const fo = dir + "/dist_offload_o_" + tag + ".safetensors";
    std::vector<double> la, lo;
    std::vector<float> const a = data_parallel_run<Net, fp32, AdamW_of>(4, opts, d, &la, nullptr, fa);
    std::vector<float> const o = data_parallel_run<Net, fp32, OffloadedAdamW>(4, opts, d, &lo, nullptr, fo);
    CHECK(std::memcmp(a.data(), o.data(), a.size() * sizeof(float)) == 0);
    CHECK(la == lo);
    CHECK(same_on_every_rank(o));
    using P = mixed<bfloat16, DynamicLossScale>;
    std::vector<float> const a16 = data_parallel_run<Net, P, AdamW_of>(3, opts, d);
    std::vector<float> const o16 = data_parallel_run<Net, P, OffloadedAdamW>(3, opts, d);
    CHECK(std::memcmp(a16.data(), o16.data(), a16.size() * sizeof(float)) == 0);
    // The files rank 0 wrote hold the same whole state.
    MPI_Barrier(MPI_COMM_WORLD);
    model<Net> ma, mo;
    AdamW ra(ma, opts), ro(mo, opts);
    load(ra, fa);
    load(ro, fo);
    CHECK(tensor_to_host(ro.exp_avg().view()) == tensor_to_host(ra.exp_avg().view()));
    CHECK(tensor_to_host(ro.exp_avg_sq().view()) == tensor_to_host(ra.exp_avg_sq().view()));
    CHECK(ro.steps() == 4);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
