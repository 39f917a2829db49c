// remat::dist under mpirun (1, 2 or 3 ranks; every rank runs every case). The truth is one process
// training on the whole batch: each rank computes it locally, with no communication, and the
// data-parallel run on each rank's rows must reach the same parameters to fp32 rounding. Between
// data-parallel runs the design promises bit-for-bit equality (storage policies, sharded against
// whole optimizer state with two ranks, one rank against a model alone). OffloadedAdamW's cases
// are in test_dist_offload.cpp (the same program).
#include <remat/parallel/mpi.hpp>
#include <remat/remat.hpp>

#include "../train/trainer.hpp"
#include "common.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

using namespace remat;
using namespace dist_test;

TEST_CASE("data parallel on parts of the batch trains like one process on the whole batch", "[dist]") {
  std::vector<double> ref_losses;
  std::vector<float> const ref = reference<Net>(5, opts, &ref_losses);
  for (bool shard : {false, true})
    for (std::size_t bucket : {std::size_t(256), std::size_t(4) << 20}) {
      INFO("shard_optimizer " << shard << ", bucket_bytes " << bucket << ", " << world_size() << " ranks");
      std::vector<double> losses;
      dist::traffic tr;
      std::vector<float> const got =
          data_parallel_run<Net>(5, opts, {.bucket_bytes = bucket, .shard_optimizer = shard}, &losses, &tr);
      CHECK(same_on_every_rank(got));
      CHECK(max_abs_diff(got, ref) < 2e-5);
      for (std::size_t t = 0; t < losses.size(); ++t) CHECK(losses[t] == Approx(ref_losses[t]).epsilon(1e-6));
      // What crossed the communicator: every gradient once, per step; and with small buckets the
      // first ones started while backward was still running.
      CHECK(tr.reduced == n_params * sizeof(float));
      CHECK(tr.buckets == (bucket == 256 ? (n_params * 4 + 255) / 256 : 1));
      if (bucket == 256) CHECK(tr.overlapped > 0);
      if (shard && world_size() > 1) CHECK(tr.gathered > 0);
      if (!shard) CHECK(tr.gathered == 0);
    }
}

TEST_CASE("one rank is a model alone, and two ranks shard the optimizer bit for bit", "[dist]") {
  std::vector<float> const whole = data_parallel_run<Net>(4, opts, {.bucket_bytes = 512});
  std::vector<float> const sharded = data_parallel_run<Net>(4, opts, {.bucket_bytes = 512, .shard_optimizer = true});
  if (world_size() <= 2) {
    // Two ranks: both orders of one addition agree, so reducing to the owner and all-reducing
    // give the same gradients.
    CHECK(std::memcmp(whole.data(), sharded.data(), whole.size() * sizeof(float)) == 0);
  } else {
    CHECK(max_abs_diff(whole, sharded) < 1e-5);
  }
  if (world_size() == 1) {
    std::vector<float> const alone = reference<Net>(4, opts);
    CHECK(std::memcmp(whole.data(), alone.data(), whole.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("messages past MPI's int counts go in parts (a gather, owner by owner), training as before", "[dist]") {
  // (a model of over 2^30 parameters, where that starts, is too large for a test: the limit is
  // lowered to 37 elements instead, below every bucket, shard and layer of Net)
  // The ZeRO-1 runs save their optimizer (its shards gathered to rank 0) and the files are read back.
  using B = mixed<bfloat16, DynamicLossScale>;
  std::string const dir = REMAT_TEST_BINARY_DIR, tag = std::to_string(world_size());
  std::string const file[2] = {dir + "/dist_limit_a_" + tag + ".safetensors",
                               dir + "/dist_limit_b_" + tag + ".safetensors"};
  auto runs = [&](std::string const& save_to) {
    std::vector<std::vector<float>> out;
    for (int level : {0, 1, 2, 3})
      out.push_back(data_parallel_run<Net>(3, opts, sharding(level), nullptr, nullptr, level == 1 ? save_to : ""));
    out.push_back(data_parallel_run<Net, B>(3, opts, sharding(3)));
    return out;
  };
  std::vector<std::vector<float>> const before = runs(file[0]);
  std::size_t& limit = dist::detail::mpi_message_limit();
  std::size_t const saved = std::exchange(limit, 37);
  std::vector<std::vector<float>> parts;
  try {
    parts = runs(file[1]);
  } catch (...) {
    limit = saved;
    throw;
  }
  limit = saved;
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<float> state[2][2];
  for (int f = 0; f < 2; ++f) {
    model<Net> m;
    AdamW opt(m, opts);
    load(opt, file[f]);
    state[f][0] = tensor_to_host(opt.exp_avg().view());
    state[f][1] = tensor_to_host(opt.exp_avg_sq().view());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (int k = 0; k < 2; ++k) {
    REQUIRE(state[0][k].size() == n_params);
    if (world_size() <= 2)
      CHECK(state[1][k] == state[0][k]);
    else
      CHECK(max_abs_diff(state[1][k], state[0][k]) < 1e-5);
  }
  for (std::size_t k = 0; k < before.size(); ++k) {
    INFO("run " << k << " (ZeRO-0, 1, 2, 3; ZeRO-3 in bf16), " << world_size() << " ranks");
    // Moved values are the same bits; sums over three ranks may be added in another order when
    // MPI picks its algorithm by the message's size.
    if (world_size() <= 2)
      CHECK(std::memcmp(before[k].data(), parts[k].data(), before[k].size() * sizeof(float)) == 0);
    else
      CHECK(max_abs_diff(before[k], parts[k]) < 1e-5);
    CHECK(same_on_every_rank(parts[k]));
  }
}

TEST_CASE("storage policies train the same under data parallelism, bit for bit", "[dist]") {
  std::vector<float> const stored = data_parallel_run<Net>(3, opts, {.bucket_bytes = 1024});
  std::vector<float> const checkpointed = data_parallel_run<CheckpointedNet>(3, opts, {.bucket_bytes = 1024});
  CHECK(std::memcmp(stored.data(), checkpointed.data(), stored.size() * sizeof(float)) == 0);
  std::vector<float> const sharded = data_parallel_run<CheckpointedNet>(3, opts, {.bucket_bytes = 1024, .shard_optimizer = true});
  CHECK(max_abs_diff(stored, sharded) < 1e-6);
}

TEST_CASE("under a sharded optimizer every storage policy trains bit for bit as storing everything", "[dist]") {
  // The same buckets and the same reductions whatever the forward kept: Checkpointed, Revolve
  // (which recomputes from its own checkpoints), Selective (which keeps the products' outputs
  // only) and Offloaded reach the stored model's parameters exactly, with the moments sharded,
  // on every number of ranks; and the stored model's own run, to rounding, one process's.
  dist::options const d{.bucket_bytes = 512, .shard_optimizer = true};
  std::vector<float> const stored = data_parallel_run<Net>(3, opts, d);
  CHECK(max_abs_diff(stored, reference<Net>(3, opts)) < 2e-5);
  auto const check = [&]<class NetT>(NetT*, char const* name) {
    INFO(name << ", " << world_size() << " ranks");
    std::vector<float> const got = data_parallel_run<NetT>(3, opts, d);
    CHECK(same_on_every_rank(got));
    CHECK(std::memcmp(got.data(), stored.data(), stored.size() * sizeof(float)) == 0);
  };
  check(static_cast<CheckpointedNet*>(nullptr), "Checkpointed");
  check(static_cast<NetWith<Revolve<2, Repeat<3, Block>>>*>(nullptr), "Revolve<2>");
  check(static_cast<NetWith<Repeat<3, Selective<Block>>>*>(nullptr), "Selective");
  check(static_cast<NetWith<Selective<Repeat<3, Block>>>*>(nullptr), "Selective over the chain");
  check(static_cast<NetWith<Repeat<3, Offloaded<Block>>>*>(nullptr), "Offloaded");
  // Mixed precision with a dynamic scale: the policies agree there too.
  using P = mixed<bfloat16, DynamicLossScale>;
  std::vector<float> const mixed_stored = data_parallel_run<Net, P>(3, opts, d);
  CHECK(std::memcmp(data_parallel_run<NetWith<Revolve<2, Repeat<3, Block>>>, P>(3, opts, d).data(), mixed_stored.data(),
                    stored.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(data_parallel_run<NetWith<Repeat<3, Selective<Block>>>, P>(3, opts, d).data(), mixed_stored.data(),
                    stored.size() * sizeof(float)) == 0);
}

TEST_CASE("each rank draws its own dropout masks", "[dist]") {
  model<DropNet> m(seed{3});
  dist::data_parallel dp(m, MPI_COMM_WORLD);
  CHECK(m.link().replica() == std::uint64_t(dp.rank()));
  // The same rows on every rank: the losses differ across ranks only through their masks.
  batch b = whole_batch(0);
  double const l = m.training_loss<SoftmaxCrossEntropy>(b.x.view(), b.y.view());
  std::vector<double> all(std::size_t(dp.size()));
  MPI_Allgather(&l, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  for (int q = 1; q < dp.size(); ++q) CHECK(all[std::size_t(q)] != all[0]);
  // Replica 0 draws what a model alone draws.
  if (dp.rank() == 0) {
    model<DropNet> alone(seed{3});
    CHECK(alone.training_loss<SoftmaxCrossEntropy>(b.x.view(), b.y.view()) == l);
  }
}

TEST_CASE("gradient accumulation reduces once per optimizer step (every micro-batch under ZeRO-2)", "[dist]") {
  std::vector<float> const ref = reference<Net>(3, opts);
  for (int level : {0, 1, 2})
    for (bool deferred_to_step : {false, true}) {
      INFO("ZeRO level " << level << ", reduced at the step " << deferred_to_step);
      model<Net> m(seed{7});
      dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
      AdamW opt(m, opts);
      param_range const r = my_rows(dp.rank(), dp.size());
      static_assert(In * W + W == 112);
      for (int t = 0; t < 3; ++t) {
        batch b = whole_batch(t);
        m.zero_grad();
        // Two micro-batches per rank: the first stays local, the second reduces (or the step
        // does). Under ZeRO-2 reduce::later is taken as now: each micro-batch is reduced into the
        // owners' shards, and the next adds to them.
        std::size_t const half = r.size() / 2;
        param_range const a{r.begin, r.begin + half}, c{r.begin + half, r.end};
        dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, a), rows(b.y, a), double(a.size()) / double(r.size()),
                                           dist::reduce::later);
        dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, c), rows(b.y, c), double(c.size()) / double(r.size()),
                                           deferred_to_step ? dist::reduce::later : dist::reduce::now);
        opt.step();
        std::size_t const passes_reduced = level == 2 ? 2 : 1;
        CHECK(dp.last_step_traffic().reduced == passes_reduced * n_params * sizeof(float));
        // Buckets of 128 parameters from the end; those above the first layer's 112 parameters are
        // complete before backward reaches it.
        std::size_t above_first_layer = 0;
        for (std::size_t e = n_params; e > 0; e = e > 128 ? e - 128 : 0) above_first_layer += (e > 128 ? e - 128 : 0) >= 112;
        std::size_t const overlapped_passes = level == 2 ? 2 : deferred_to_step ? 0 : 1;
        CHECK(dp.last_step_traffic().overlapped == overlapped_passes * above_first_layer);
      }
      CHECK(max_abs_diff(params_of(m), ref) < 2e-5);
      CHECK(same_on_every_rank(params_of(m)));
      // A pass after the optimizer's step, before zero_grad, is refused.
      batch b = whole_batch(0);
      CHECK_THROWS_AS(dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r)), argument_error);
    }
}

TEST_CASE("chains under CheckpointSequential and Revolve start their buckets block by block, as Repeat does",
          "[dist]") {
  // Blocks that are single layers: only the chain's own loop can report them final. Buckets of 64
  // parameters, a block 272: each block's report starts the buckets it completes.
  using B = Residual<Linear<W, W>>;
  auto run = []<class NetT>(NetT*) {
    dist::traffic tr;
    std::vector<float> const p = data_parallel_run<NetT>(2, opts, {.bucket_bytes = 256}, nullptr, &tr);
    return std::make_pair(p, tr);
  };
  auto const [repeat, tr] = run(static_cast<NetWith<Repeat<6, B>>*>(nullptr));
  // Reports in backward: the last Linear, the LayerNorm, then each block's start (offset 0, the
  // first Linear's, ends backward). A report that completes a bucket not yet started is a launch.
  constexpr std::size_t n = model<NetWith<Repeat<6, B>>>::parameter_count, first = In * W + W, block = W * W + W;
  std::vector<std::size_t> reports{n - (W * Out + Out), n - (W * Out + Out) - 2 * W};
  for (std::size_t k = 6; k-- > 0;) reports.push_back(first + k * block);
  std::size_t launches = 0, next_begin = n;  // buckets of 64 parameters from the end
  for (std::size_t r : reports) {
    bool started = false;
    while (next_begin > 0 && (next_begin > 64 ? next_begin - 64 : 0) >= r) {
      next_begin = next_begin > 64 ? next_begin - 64 : 0;
      started = true;
    }
    launches += started;
  }
  REQUIRE(launches >= 6);
  CHECK(tr.launches == launches);
  for (auto const& [params, t] : {run(static_cast<NetWith<CheckpointSequential<2, Repeat<6, B>>>*>(nullptr)),
                                  run(static_cast<NetWith<CheckpointSequential<6, Repeat<6, B>>>*>(nullptr)),
                                  run(static_cast<NetWith<Revolve<2, Repeat<6, B>>>*>(nullptr)),
                                  run(static_cast<NetWith<Revolve<3, Repeat<6, Checkpointed<B>>>>*>(nullptr))}) {
    CHECK(t.launches == tr.launches);
    CHECK(t.overlapped == tr.overlapped);
    CHECK(t.buckets == tr.buckets);
    CHECK(std::memcmp(params.data(), repeat.data(), repeat.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("a pass after the step's reduction is refused on every rank", "[dist][errors]") {
  model<Net> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, {.bucket_bytes = 512});
  AdamW opt(m, opts);
  param_range const r = my_rows(dp.rank(), dp.size());
  batch b = whole_batch(0);
  dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r));  // reduces while backward runs
  // Adding to gradients that are (being) reduced would count this rank's part P times.
  for (dist::reduce when : {dist::reduce::now, dist::reduce::later})
    CHECK_THROWS_AS(dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), 1.0, when), argument_error);
  CHECK(m.passes() == 1);
  opt.step();
  std::vector<float> const reduced = tensor_to_host(m.gradients());
  CHECK_THROWS_AS(dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r)), argument_error);
  CHECK(tensor_to_host(m.gradients()) == reduced);
  // A model in a wrapper refuses a pass that does not go through it, and changes nothing.
  CHECK_THROWS_AS(m.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt), argument_error);
  CHECK(tensor_to_host(m.gradients()) == reduced);
  m.zero_grad();
  CHECK_THROWS_AS(m.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r)), argument_error);
  CHECK(m.passes() == 1);
  // After zero_grad a step starts afresh.
  CHECK(std::isfinite(dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt)));
  CHECK(same_on_every_rank(params_of(m)));
}

TEST_CASE("bad input on one rank fails every rank with a clear error and changes nothing", "[dist][errors]") {
  int const level = GENERATE(1, 2, 3);
  INFO("ZeRO level " << level);
  model<Net> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level, std::size_t(4) << 20));
  AdamW opt(m, opts);
  param_range const r = my_rows(dp.rank(), dp.size());
  batch b = whole_batch(0);
  dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
  std::vector<float> const params = params_of(m), grads = tensor_to_host(m.gradients());
  std::vector<float> const moments = tensor_to_host(opt.exp_avg().view());
  std::uint64_t const passes = m.passes();
  int const bad = dp.size() - 1;
  batch wrong = whole_batch(1);
  wrong.y.data()[r.begin] = std::int32_t(Out);  // a label out of range on the last rank only
  try {
    dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), dp.rank() == bad ? rows(wrong.y, r) : rows(b.y, r), opt);
    FAIL("expected every rank to throw");
  } catch (dist_error const& e) {
    CHECK(dp.rank() != bad);
    std::string const what = e.what();
    INFO(what);
    CHECK(what.find("rank " + std::to_string(bad) + " of " + std::to_string(dp.size()) + " failed") != std::string::npos);
    CHECK(what.find("label") != std::string::npos);
  } catch (argument_error const& e) {
    CHECK(dp.rank() == bad);  // its own error, as alone
  }
  CHECK(params_of(m) == params);
  CHECK(tensor_to_host(m.gradients()) == grads);
  CHECK(tensor_to_host(opt.exp_avg().view()) == moments);
  CHECK(m.passes() == passes);
  // Every rank is still in step: training goes on.
  batch next = whole_batch(1);
  double const l = dp.train_step<SoftmaxCrossEntropy>(rows(next.x, r), rows(next.y, r), opt);
  CHECK(std::isfinite(l));
  dp.gather_parameters();  // (ZeRO-3: the whole parameters, to compare; nothing otherwise)
  CHECK(same_on_every_rank(params_of(m)));
}

namespace {

using remat_test::bytes_of;  // (the fault and bad-input tests' snapshot helper)

// One rank's side of a data-parallel run with its own allocator (what fail_request counts): a
// step is one train_step, or two micro-batches of which the second adds to the first's gradients.
template <class NetT, class P, template <class> class Opt = AdamW_of>
struct dp_trainer {
  using M = model<NetT, host, P>;
  using T = typename M::value_type;
  memory::caching_allocator<host> alloc;
  M m{seed{7}, alloc};
  dist::data_parallel<M> dp;
  Opt<M> opt;
  bool accumulated;
  param_range r, first, second;

  dp_trainer(int level, bool accumulate)
      : dp(m, MPI_COMM_WORLD, sharding(level)),
        opt(m, opts),
        accumulated(accumulate) {
    if (m.scaler().dynamic()) m.scaler().configure({.init_scale = 256.0, .growth_interval = 2});
    r = my_rows(dp.rank(), dp.size());
    first = {r.begin, r.begin + r.size() / 2};
    second = {first.end, r.end};
  }
  // What the injected failure hits: the whole train_step, or the second micro-batch.
  void target(batch& b) {
    if (!accumulated) {
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      return;
    }
    dp.template accumulate<SoftmaxCrossEntropy>(rows(b.x, second), rows(b.y, second),
                                                double(second.size()) / double(r.size()));
  }
  // Up to the target: the first micro-batch (its gradients stay local), or nothing but clearing
  // the gradients (train_step's first act, so that a failed step's zero gradients are as before).
  void before(batch& b) {
    m.zero_grad();
    if (accumulated)
      dp.template accumulate<SoftmaxCrossEntropy>(rows(b.x, first), rows(b.y, first),
                                                  double(first.size()) / double(r.size()), dist::reduce::later);
  }
  void after() {
    if (accumulated) opt.step();
  }
  void step(int t) {
    batch b = whole_batch(t);
    before(b);
    target(b);
    after();
  }

  struct snapshot {
    std::vector<unsigned char> params, grads, buffers, m1, m2;
    std::uint64_t steps, passes, tracker, skipped;
    double scale;
    std::size_t in_use;
    bool operator==(snapshot const&) const = default;
  };
  snapshot state() const {
    M const& c = m;
    // (ZeRO-3: the rank's shard of the parameters; the rest is given back between passes)
    param_range const kept = dp.config().shard_parameters ? dp.shard() : param_range{0, M::parameter_count};
    // (the gradients on the host: their sum there, the model's buffer holding none)
    std::vector<unsigned char> grads = bytes_of<T>(c.gradients());
    if constexpr (requires { opt.offloads_gradients(); })
      if (opt.offloads_gradients()) grads = bytes_of<T>(opt.gradients().view());
    return {bytes_of<T>(c.parameters().row_range(kept.begin, kept.size())),        grads,         bytes_of<T>(c.buffers()),
            bytes_of<T>(opt.exp_avg().view()),  bytes_of<T>(opt.exp_avg_sq().view()), opt.steps(),
            c.passes(),                         c.scaler().growth_tracker(),        c.scaler().skipped_steps(),
            c.scaler().scale(),                 alloc.stats().total.in_use};
  }
};

int max_over_ranks(int v) {
  int all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

// Fails request k of one rank's first (cold) step in a fresh run, for every k the step makes, and
// checks that every rank throws, the failing one out_of_memory and the others dist_error quoting
// it; that every rank's state and in-use bytes are as before; and that the run, the step repeated,
// ends where a run that never failed ends, bit for bit. Without the planned arena, activations are
// allocated one by one in forward and backward, while the gradient buckets are being reduced.
// Returns the number of failures thrown.
template <class NetT, class P, template <class> class Opt = AdamW_of>
int fail_every_request(int level, bool accumulate, bool arena) {
  using trainer = dp_trainer<NetT, P, Opt>;
  int const bad = world_size() - 1;
  auto run = [&](std::size_t k, int* requests, int* thrown) {
    trainer tr(level, accumulate);
    tr.m.use_planned_arena(arena);
    batch b = whole_batch(0);
    tr.before(b);
    auto const snap = tr.state();
    // (ZeRO-3: the pages of the shard and the gather buffers, none kept from the failed pass; the
    // buffers' end pages, shared with other memory, make this a figure of one run only)
    std::size_t const pages = tr.dp.parameter_pages().now;
    std::size_t const r0 = tr.alloc.stats().requests;
    if (k && world_rank() == bad) tr.alloc.fail_request(k);
    bool threw = false;
    try {
      tr.target(b);
    } catch (out_of_memory const& e) {
      threw = true;
      std::string const what = e.what();
      INFO(what);
      CHECK(world_rank() == bad);
      CHECK(what.find("injected") != std::string::npos);
      CHECK(what.find("bytes requested") != std::string::npos);
    } catch (dist_error const& e) {
      threw = true;
      std::string const what = e.what();
      INFO(what);
      CHECK(world_rank() != bad);
      CHECK(what.find("rank " + std::to_string(bad) + " of " + std::to_string(world_size()) + " failed") !=
            std::string::npos);
      CHECK(what.find("injected") != std::string::npos);  // (the failing rank's message, quoted)
    }
    tr.alloc.fail_request(0);
    if (requests) *requests = int(tr.alloc.stats().requests - r0);
    // Every rank threw, or none did (the failing rank's arena request: its pass goes on block by block).
    CHECK(max_over_ranks(threw) == -max_over_ranks(-int(threw)));
    if (threw) {
      ++*thrown;
      CHECK(tr.state() == snap);
      CHECK(tr.dp.parameter_pages().now == pages);
      tr.target(b);
    }
    tr.after();
    tr.step(1);
    return tr.state();
  };
  int requests = 0;
  auto const reference = run(0, &requests, nullptr);
  MPI_Bcast(&requests, 1, MPI_INT, bad, MPI_COMM_WORLD);
  REQUIRE(requests > 0);
  int thrown = 0;
  for (int k = 1; k <= requests; ++k) {
    INFO("request " << k << " of " << requests << " fails on rank " << bad << " of " << world_size());
    CHECK(run(std::size_t(k), nullptr, &thrown) == reference);
  }
  return thrown;
}

}  // namespace

TEST_CASE("an allocation failure on one rank at any request of a step fails every rank and changes nothing",
          "[dist][errors][faults]") {
  for (bool accumulate : {false, true})
    for (bool arena : {true, false}) {
      INFO((accumulate ? "the second micro-batch of two" : "train_step") << (arena ? "" : ", no planned arena"));
      int const stored = fail_every_request<Net, fp32>(0, accumulate, arena);
      int const checkpointed = fail_every_request<CheckpointedNet, fp32>(1, accumulate, arena);
      int const bf16 = fail_every_request<CheckpointedNet, mixed<bfloat16, DynamicLossScale>>(0, accumulate, arena);
      int const zero2 = fail_every_request<Net, mixed<bfloat16, DynamicLossScale>>(2, accumulate, arena);
      // (the gradients on the host: each rank's sum restored from its copy)
      int const zero2_host =
          fail_every_request<Net, mixed<bfloat16, DynamicLossScale>, OffloadedGrads>(2, accumulate, arena);
      int const zero3 = fail_every_request<CheckpointedNet, fp32>(3, accumulate, arena);
      int const zero3_kept = fail_every_request<CheckpointedNet, fp32>(4, accumulate, arena);
      int const zero3_host = fail_every_request<CheckpointedNet, fp32, OffloadedGrads>(3, accumulate, arena);
      int const zero3_bf16 = fail_every_request<NetWith<Revolve<2, Repeat<3, Block>>>, mixed<bfloat16, DynamicLossScale>>(
          3, accumulate, arena);
      CHECK(stored > 0);
      CHECK(zero3 > 0);
      CHECK(zero3_kept > 0);
      CHECK(zero3_bf16 > 0);
      CHECK(checkpointed > 0);
      CHECK(bf16 > 0);
      CHECK(zero2 > 0);
      CHECK(zero2_host > 0);
      CHECK(zero3_host > 0);
      if (world_rank() == 0)
        std::printf("faults under data_parallel, rank %d of %d failing (%s%s): stored %d, Checkpointed and sharded "
                    "%d, Checkpointed bf16 %d, ZeRO-2 bf16 %d (gradients on the host %d), ZeRO-3 Checkpointed %d "
                    "(kept for backward %d, gradients on the host %d), ZeRO-3 Revolve bf16 %d\n",
                    world_size() - 1, world_size(), accumulate ? "second micro-batch" : "train_step",
                    arena ? "" : ", no arena", stored, checkpointed, bf16, zero2, zero2_host, zero3, zero3_kept,
                    zero3_host, zero3_bf16);
    }
}

namespace {

template <class M>
using SGD_of = SGD<typename M::value_type, typename M::device, typename M::compute_type>;

// An optimizer of kind Opt for m, with settings that make every step change every state tensor.
template <template <class> class Opt, class M>
Opt<M> optimizer_for(M& m) {
  if constexpr (std::is_same_v<Opt<M>, SGD_of<M>>) return Opt<M>(m, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2});
  else return Opt<M>(m, {.lr = 1e-2, .weight_decay = 1e-2, .clip_norm = 1.0});
}

// Three steps in which step 1 fails on rank `bad` inside the optimizer's step (fail_next_step;
// -1: on none). Every rank must throw, the failing one its own error and the others dist_error
// quoting it; no rank's parameters, optimizer state, step count or loss scale may change; then
// every rank takes the step again (opt.step(): the gradients are still the reduced ones). Returns
// this rank's parameters (ZeRO-3: its shard) and optimizer state at the end, as bytes.
template <class NetT, class P, template <class> class Opt>
std::vector<unsigned char> fail_one_step(int level, int bad) {
  using M = model<NetT, host, P>;
  using T = typename M::value_type;
  M m(seed{7});
  if (m.scaler().dynamic()) m.scaler().configure({.init_scale = 256.0, .growth_interval = 2});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
  Opt<M> opt = optimizer_for<Opt>(m);
  param_range const r = my_rows(dp.rank(), dp.size());
  param_range const kept = level >= 3 ? dp.shard() : param_range{0, M::parameter_count};
  auto state = [&] {
    std::vector<unsigned char> bytes = remat_test::bytes_of<T>(m.parameters().row_range(kept.begin, kept.size()));
    for (auto const& s : opt.state_tensors()) {
      std::vector<unsigned char> const b = remat_test::bytes_of<T>(s.tensor->view());
      bytes.insert(bytes.end(), b.begin(), b.end());
    }
    double const scale = m.scaler().scale();
    std::uint64_t const counts[] = {opt.steps(), m.scaler().growth_tracker(), m.scaler().skipped_steps()};
    bytes.insert(bytes.end(), reinterpret_cast<unsigned char const*>(&scale),
                 reinterpret_cast<unsigned char const*>(&scale) + sizeof scale);
    bytes.insert(bytes.end(), reinterpret_cast<unsigned char const*>(counts),
                 reinterpret_cast<unsigned char const*>(counts) + sizeof counts);
    return bytes;
  };
  for (int t = 0; t < 3; ++t) {
    batch b = whole_batch(t);
    if (t != 1 || bad < 0) {
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      continue;
    }
    auto const before = state();
    if (dp.rank() == bad) opt.fail_next_step();
    bool threw = false;
    try {
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    } catch (dist_error const& e) {
      threw = true;
      std::string const what = e.what();
      INFO(what);
      CHECK(dp.rank() != bad);
      CHECK(what.find("an optimizer's step: rank " + std::to_string(bad) + " of " + std::to_string(dp.size()) +
                      " failed") != std::string::npos);
      CHECK(what.find("injected") != std::string::npos);  // (the failing rank's message, quoted)
    } catch (error const& e) {
      threw = true;
      CHECK(dp.rank() == bad);
      CHECK(std::string(e.what()).find("a failure injected by fail_next_step") != std::string::npos);
    }
    CHECK(threw);
    CHECK(state() == before);
    opt.step();  // (every rank: the step taken again)
  }
  dp.gather_parameters();
  std::vector<unsigned char> out = state();
  dp.release_parameters();
  return out;
}

template <class NetT, class P, template <class> class Opt>
void fail_each_rank(std::initializer_list<int> levels) {
  for (int level : levels) {
    std::vector<unsigned char> const clean = fail_one_step<NetT, P, Opt>(level, -1);
    for (int bad = 0; bad < world_size(); ++bad) {
      INFO("ZeRO level " << level << ", the step fails on rank " << bad << " of " << world_size());
      CHECK(fail_one_step<NetT, P, Opt>(level, bad) == clean);
    }
  }
}

}  // namespace

TEST_CASE("a failure inside an optimizer's step on one rank fails every rank and changes nothing", "[dist][errors]") {
  using B = mixed<bfloat16, DynamicLossScale>;
  fail_each_rank<Net, fp32, AdamW_of>({0, 1, 2, 3});
  fail_each_rank<CheckpointedNet, B, AdamW_of>({0, 1, 3});
  fail_each_rank<Net, fp32, SGD_of>({0, 1, 2, 3});
  fail_each_rank<Net, B, SGD_of>({1});
  fail_each_rank<Net, fp32, OffloadedAdamW>({0, 1});
  fail_each_rank<CheckpointedNet, B, OffloadedAdamW>({0, 1});
  fail_each_rank<Net, fp32, OffloadedGrads>({2, 3});
  fail_each_rank<CheckpointedNet, B, OffloadedAll>({2});
}

TEST_CASE("ranks with different models or options fail at the start on every rank", "[dist][errors]") {
  if (world_size() == 1) return;
  bool const odd = world_rank() == world_size() - 1;
  auto expect_dist_error = [](auto make, char const* words) {
    try {
      make();
      FAIL("expected dist_error");
    } catch (dist_error const& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
  };
  // Another width: another parameter count.
  expect_dist_error(
      [&] {
        if (odd) {
          model<NetWith<Repeat<2, Block>>> m;
          dist::data_parallel dp(m, MPI_COMM_WORLD);
        } else {
          model<Net> m;
          dist::data_parallel dp(m, MPI_COMM_WORLD);
        }
      },
      "expected the same model on every rank");
  // The same parameters, another activation.
  using TanhBlock = Residual<Seq<LayerNorm<W>, Linear<W, 32>, Tanh, Linear<32, W>>>;
  expect_dist_error(
      [&] {
        if (odd) {
          model<NetWith<Repeat<3, TanhBlock>>> m;
          dist::data_parallel dp(m, MPI_COMM_WORLD);
        } else {
          model<Net> m;
          dist::data_parallel dp(m, MPI_COMM_WORLD);
        }
      },
      "the layer types differ");
  expect_dist_error(
      [&] {
        model<Net> m;
        dist::data_parallel dp(m, MPI_COMM_WORLD, {.shard_optimizer = odd});
      },
      "expected the same options on every rank");
  expect_dist_error(
      [&] {
        model<Net> m;
        dist::data_parallel dp(m, MPI_COMM_WORLD, {.shard_optimizer = true, .shard_gradients = odd});
      },
      "shard_gradients true");
  // (ranks that gather at different points would wait for each other's messages forever)
  expect_dist_error(
      [&] {
        model<Net> m;
        dist::data_parallel dp(m, MPI_COMM_WORLD, {.shard_parameters = true, .prefetch_parameters = odd});
      },
      "prefetch_parameters true");
  expect_dist_error(
      [&] {
        model<Net> m;
        dist::data_parallel dp(m, MPI_COMM_WORLD, {.shard_parameters = true, .keep_parameters_for_backward = odd});
      },
      "keep_parameters_for_backward true");
  // The model is left without a wrapper, and can be wrapped again.
  model<Net> m;
  dist::data_parallel dp(m, MPI_COMM_WORLD);
  CHECK(m.link().gradient_sync() != nullptr);  // (the wrapper's hooks: parallel/hooks.hpp)
}

TEST_CASE("an optimizer built before a sharded wrapper is refused", "[dist][errors]") {
  if (world_size() == 1) return;
  model<Net> m(seed{7});
  AdamW early(m, opts);
  dist::data_parallel dp(m, MPI_COMM_WORLD, {.shard_optimizer = true});
  param_range const r = my_rows(dp.rank(), dp.size());
  batch b = whole_batch(0);
  std::vector<float> const params = params_of(m);
  try {
    dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), early);
    FAIL("expected argument_error");
  } catch (argument_error const& e) {
    CHECK(std::string(e.what()).find("build the optimizer after") != std::string::npos);
  }
  CHECK(params_of(m) == params);
  CHECK(m.passes() == 0);  // refused before the pass
}

TEST_CASE("sharding divides the optimizer state by the number of ranks", "[dist][memory]") {
  for (bool shard : {false, true}) {
    memory::caching_allocator<host> alloc;
    model<Net> m(seed{7}, alloc);
    dist::data_parallel dp(m, MPI_COMM_WORLD, {.shard_optimizer = shard});
    AdamW opt(m, opts);
    std::size_t const mine = dp.shard().size();
    CHECK(mine == (shard ? n_params * std::size_t(dp.rank() + 1) / std::size_t(dp.size()) -
                               n_params * std::size_t(dp.rank()) / std::size_t(dp.size())
                         : n_params));
    std::size_t const want = 2 * memory::caching_allocator<host>::rounded(mine * sizeof(float));
    CHECK(alloc.stats()[memory::tag::optimizer_state].in_use == want);
    // The shards cover the parameters exactly once.
    std::size_t total = 0;
    for (int q = 0; q < dp.size(); ++q) total += dp.shard_of(q).size();
    CHECK(total == (shard ? n_params : n_params * std::size_t(dp.size())));
  }
}

TEST_CASE("each rank's step measures its whole-step plan, per tag and in total", "[dist][memory][plan]") {
  auto check = [](auto tag_model, auto precision, bool shard) {
    using NetT = decltype(tag_model);
    using P = decltype(precision);
    INFO(P::name << ", shard_optimizer " << shard << ", rank " << world_rank() << " of " << world_size());
    memory::caching_allocator<host> alloc;
    model<NetT, host, P> m(seed{7}, alloc);
    dist::data_parallel dp(m, MPI_COMM_WORLD, {.bucket_bytes = 512, .shard_optimizer = shard});
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    auto const plan = memory_plan<NetT, P, AdamW, SoftmaxCrossEntropy>(
        r.size(), {.ranks = std::size_t(dp.size()), .rank = std::size_t(dp.rank()), .shard_optimizer = shard});
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      alloc.reset_peak();
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      auto const s = alloc.stats();
      for (memory::tag g : memory::all_tags) {
        INFO(memory::name(g));
        CHECK(s[g].peak == plan[g]);
      }
      CHECK(s.total.peak == plan.peak);
      CHECK(s.total.in_use == plan.persistent);
    }
  };
  for (bool shard : {false, true}) {
    check(Net{}, fp32{}, shard);
    check(CheckpointedNet{}, mixed<bfloat16, DynamicLossScale>{}, shard);
  }
}

TEST_CASE("a loss scale's overflow skips the step on every rank together", "[dist][precision]") {
  using P = mixed<bfloat16, DynamicLossScale>;
  for (int level : {0, 1, 2, 3}) {
    INFO("ZeRO level " << level);
    model<Net, host, P> m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    batch b = whole_batch(0);
    // (ZeRO-3: the parameters made whole to read them, until the next pass)
    auto const whole_params = [&] {
      dp.gather_parameters();
      return params_of(m);
    };
    dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    std::vector<float> const params = whole_params();
    double const scale = m.scaler().scale();
    m.zero_grad();
    dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), 1.0, dist::reduce::later);
    // An overflow on the last rank only, in the last parameter (which the last rank's shard owns):
    // the other ranks' own gradients are finite.
    if (dp.rank() == dp.size() - 1) m.gradients().data()[n_params - 1] = std::numeric_limits<float>::infinity();
    CHECK_FALSE(opt.step());
    CHECK(opt.last_step_skipped());
    CHECK(m.scaler().scale() == scale / 2);
    CHECK(m.scaler().skipped_steps() == 1);
    CHECK(whole_params() == params);
    CHECK(same_on_every_rank(params));
    // And the next step goes on together.
    CHECK(std::isfinite(dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt)));
    std::vector<float> const next = whole_params();
    CHECK(same_on_every_rank(next));
    CHECK(next != params);
  }
}

TEST_CASE("mixed precision data parallel follows one process on the whole batch", "[dist][precision]") {
  using P = mixed<bfloat16, DynamicLossScale>;
  std::vector<float> const ref = reference<Net, P>(3, opts);
  for (bool shard : {false, true}) {
    std::vector<float> const got = data_parallel_run<Net, P>(3, opts, {.bucket_bytes = 512, .shard_optimizer = shard});
    CHECK(same_on_every_rank(got));
    // bf16 activations: the halves' sums round differently from the whole batch's.
    CHECK(max_abs_diff(got, ref) < 2e-3);
  }
}

TEST_CASE("rank 0 saves; a sharded optimizer's file is the whole state", "[dist][io]") {
  std::string const dir = REMAT_TEST_BINARY_DIR;
  std::string const tag = std::to_string(world_size());
  std::vector<float> full_m, sharded_m;
  for (bool shard : {false, true}) {
    model<Net> m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, {.bucket_bytes = 512, .shard_optimizer = shard});
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    }
    std::string const mp = dir + "/dist_model_" + tag + ".safetensors", op = dir + "/dist_adamw_" + tag + ".safetensors";
    if (dp.rank() == 0) {
      std::remove(mp.c_str());
      std::remove(op.c_str());
    }
    dist::save(dp, mp);
    dist::save(dp, opt, op);
    MPI_Barrier(MPI_COMM_WORLD);
    // Anyone can read them back as a model alone would.
    model<Net> copy;
    load(copy, mp);
    CHECK(params_of(copy) == params_of(m));
    AdamW whole(copy, opts);
    load(whole, op);
    CHECK(whole.steps() == 2);
    (shard ? sharded_m : full_m) = tensor_to_host(whole.exp_avg().view());
    CHECK((shard ? sharded_m : full_m).size() == n_params);
    // And back into the sharded (or whole) optimizer: each rank takes its part.
    std::vector<float> const mine = tensor_to_host(opt.exp_avg().view());
    evaluate(opt.exp_avg(), expr::to_expr(0.0));
    dist::load(dp, opt, op);
    CHECK(tensor_to_host(opt.exp_avg().view()) == mine);
    // A file that is not there: every rank throws, nothing changes.
    CHECK_THROWS_AS(dist::load(dp, opt, dir + "/no_such_file.safetensors"), error);
    CHECK(tensor_to_host(opt.exp_avg().view()) == mine);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (world_size() <= 2) CHECK(full_m == sharded_m);
}

TEST_CASE("a wait for a rank that does not come times out with dist_error", "[dist][errors]") {
  if (world_size() == 1) return;
  model<Net> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, {.timeout_seconds = 0.5});
  if (dp.rank() == 0) {
    try {
      dp.sum(1.0);  // the others arrive 3 s late
      FAIL("expected dist_error");
    } catch (dist_error const& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("waited") != std::string::npos);
    }
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  // The late ranks complete the abandoned sum; the ranks are in step again for the next one.
  if (dp.rank() != 0) dp.sum(1.0);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("the reduced gradients are the whole batch's, and SGD follows one process", "[dist]") {
  batch b = whole_batch(0);
  model<Net> alone(seed{7});
  alone.accumulate<SoftmaxCrossEntropy>(b.x.view(), b.y.view());
  std::vector<float> const want = tensor_to_host(alone.gradients());
  for (bool shard : {false, true}) {
    INFO("shard_optimizer " << shard);
    model<Net> m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, {.bucket_bytes = 512, .shard_optimizer = shard});
    SGD opt(m, {.lr = 0.1, .momentum = 0.9});
    param_range const r = my_rows(dp.rank(), dp.size());
    dp.accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r));
    dp.finish();
    // Averaged over the ranks, not summed: the gradient of the whole batch's mean loss. A sharded
    // rank holds the reduced values of its own shard.
    std::vector<float> const got = tensor_to_host(m.gradients());
    param_range const mine = dp.shard();
    double worst = 0, biggest = 0;
    for (std::size_t i = mine.begin; i < mine.end; ++i) {
      worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
      biggest = std::max(biggest, std::abs(double(want[i])));
    }
    CHECK(biggest > 1e-2);
    CHECK(worst < 1e-6 * biggest * 10);
    opt.step();
    for (int t = 1; t < 3; ++t) {
      batch bt = whole_batch(t);
      dp.train_step<SoftmaxCrossEntropy>(rows(bt.x, r), rows(bt.y, r), opt);
    }
    model<Net> ref(seed{7});
    SGD ref_opt(ref, {.lr = 0.1, .momentum = 0.9});
    for (int t = 0; t < 3; ++t) {
      batch bt = whole_batch(t);
      ref.train_step<SoftmaxCrossEntropy>(bt.x.view(), bt.y.view(), ref_opt);
    }
    CHECK(max_abs_diff(params_of(m), params_of(ref)) < 1e-5);
    CHECK(same_on_every_rank(params_of(m)));
  }
}

TEST_CASE("per-rank optimizer files: each rank saves and reloads its shard, resuming bit for bit; another rank "
          "count, rank or model is refused on every rank and changes nothing",
          "[dist][shards]") {
  std::string const dir = REMAT_TEST_BINARY_DIR;
  int const P = world_size();
  std::string const base = dir + "/dist_shards_" + std::to_string(P);
  using P16 = mixed<bfloat16, DynamicLossScale>;
  auto const check_resume = [&](auto precision, auto make_opt, char const* what) {
    using M = model<Net, host, decltype(precision)>;
    INFO(what << ", " << P << " ranks");
    // 4 steps straight through ...
    M straight(seed{7});
    dist::data_parallel dps(straight, MPI_COMM_WORLD, {.bucket_bytes = 512, .shard_optimizer = true});
    auto os = make_opt(straight);
    train_steps(dps, os, 0, 4);
    // ... against 2 steps, the model (gathered) and the optimizer (per rank) saved, and 2 more in
    // a new model and optimizer loaded from them.
    std::string const mp = base + "_model.safetensors", op = base + "_" + what;
    {
      M first(seed{7});
      dist::data_parallel dp(first, MPI_COMM_WORLD, {.bucket_bytes = 512, .shard_optimizer = true});
      auto o = make_opt(first);
      train_steps(dp, o, 0, 2);
      dist::save(dp, mp);
      dist::save_shards(dp, o, op);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    M second(seed{99});
    dist::data_parallel dp(second, MPI_COMM_WORLD, {.bucket_bytes = 512, .shard_optimizer = true});
    auto o = make_opt(second);
    dist::load(dp, mp);
    dist::load_shards(dp, o, op);
    CHECK(o.steps() == 2);
    train_steps(dp, o, 2, 4);
    CHECK(params_of(second) == params_of(straight));
    CHECK(tensor_to_host(o.exp_avg().view()) == tensor_to_host(os.exp_avg().view()));
    CHECK(tensor_to_host(o.exp_avg_sq().view()) == tensor_to_host(os.exp_avg_sq().view()));
    CHECK(second.scaler().scale() == straight.scaler().scale());
  };
  check_resume(fp32{}, [](auto& m) { return AdamW(m, opts); }, "adamw");
  check_resume(P16{}, [](auto& m) { return AdamW(m, opts); }, "adamw_bf16");
  check_resume(fp32{}, [](auto& m) { return OffloadedAdamW(m, opts); }, "offloaded");

  // Refusals: each leaves every rank's optimizer as it was.
  model<Net> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, {.bucket_bytes = 512, .shard_optimizer = true});
  AdamW opt(m, opts);
  train_steps(dp, opt, 0, 1);
  std::string const op = base + "_refused";
  dist::save_shards(dp, opt, op);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<float> const m0 = tensor_to_host(opt.exp_avg().view());
  train_steps(dp, opt, 1, 2);  // (the state moves on: a load would be seen)
  std::vector<float> const m1 = tensor_to_host(opt.exp_avg().view()), p1 = params_of(m);
  REQUIRE(m1 != m0);
  auto const refused = [&](std::string const& path, std::string const& words) {
    INFO("load_shards '" << path << "': expected every rank to throw, this rank's message or dist_error saying: "
                         << words);
    bool threw = false;
    try {
      dist::load_shards(dp, opt, path);
    } catch (error const& e) {
      threw = true;
      INFO(e.what());
      CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
    CHECK(threw);
    CHECK(tensor_to_host(opt.exp_avg().view()) == m1);
    CHECK(opt.steps() == 2);
    CHECK(params_of(m) == p1);
    MPI_Barrier(MPI_COMM_WORLD);
  };
  // Files of another number of ranks: this run's are renamed as a run of P + 1 would name them.
  std::string const other = base + "_other";
  std::rename(dist::shard_file(op, dp.rank(), P).c_str(), dist::shard_file(other, dp.rank(), P + 1).c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  refused(other, "another number of ranks");
  refused(other, "-of-" + std::to_string(P + 1));
  // The right name, the wrong content: rank r's file holds rank (r + 1) % P's shard (with one
  // rank, a shard file of a run of 2 ranks).
  std::rename(dist::shard_file(other, dp.rank(), P + 1).c_str(), dist::shard_file(op, dp.rank(), P).c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  {
    std::string const swapped = base + "_swapped";
    if (P == 1) {
      // remat.shard.ranks says 2: made by hand from the real one.
      safetensors::file f = safetensors::read(dist::shard_file(op, 0, 1));
      f.metadata["remat.shard.ranks"] = "2";
      std::vector<safetensors::entry> entries;
      for (auto const& [name, t] : f.tensors)
        entries.push_back({name, t.dtype, t.shape, f.data.data() + t.begin, t.end - t.begin});
      safetensors::write(dist::shard_file(swapped, 0, 1), entries, f.metadata);
      MPI_Barrier(MPI_COMM_WORLD);
      refused(swapped, "a shard saved by a run of 1");
    } else {
      std::filesystem::copy_file(dist::shard_file(op, (dp.rank() + 1) % P, P), dist::shard_file(swapped, dp.rank(), P),
                                 std::filesystem::copy_options::overwrite_existing);
      MPI_Barrier(MPI_COMM_WORLD);
      refused(swapped, "");  // (each rank: "expected the shard of rank r", or dist_error quoting one)
    }
  }
  // A missing file on one rank only (the last): every rank throws, none changes.
  if (dp.rank() == P - 1) std::remove(dist::shard_file(op, dp.rank(), P).c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  refused(op, "rank " + std::to_string(P - 1));
  // And the real files, where all are there, load.
  dist::save_shards(dp, opt, op);
  MPI_Barrier(MPI_COMM_WORLD);
  evaluate(opt.exp_avg(), expr::to_expr(0.0));
  dist::load_shards(dp, opt, op);
  CHECK(tensor_to_host(opt.exp_avg().view()) == m1);
}

TEST_CASE("ZeRO-2: with the gradients sharded, training is ZeRO-1's, bit for bit", "[dist][zero2]") {
  // Every bucket is reduced to the ranks that own its parts exactly as under ZeRO-1; a rank then
  // gives back the rest. So the parameters, losses and traffic are ZeRO-1's, and one process's to
  // rounding, whatever the buckets and the storage policy.
  std::vector<float> const ref = reference<Net>(4, opts);
  for (std::size_t bucket : {std::size_t(256), std::size_t(4) << 20}) {
    INFO("bucket_bytes " << bucket << ", " << world_size() << " ranks");
    std::vector<double> l1, l2;
    dist::traffic t1, t2;
    std::vector<float> const zero1 = data_parallel_run<Net>(4, opts, sharding(1, bucket), &l1, &t1);
    std::vector<float> const zero2 = data_parallel_run<Net>(4, opts, sharding(2, bucket), &l2, &t2);
    CHECK(std::memcmp(zero1.data(), zero2.data(), zero1.size() * sizeof(float)) == 0);
    CHECK(l1 == l2);
    CHECK(t2.reduced == t1.reduced);
    CHECK(t2.buckets == t1.buckets);
    CHECK(t2.overlapped == t1.overlapped);
    CHECK(t2.gathered == t1.gathered);
    CHECK(same_on_every_rank(zero2));
    CHECK(max_abs_diff(zero2, ref) < 2e-5);
  }
  std::vector<float> const stored = data_parallel_run<Net>(3, opts, sharding(2));
  auto const check = [&]<class NetT>(NetT*, char const* name) {
    INFO(name << ", " << world_size() << " ranks");
    std::vector<float> const got = data_parallel_run<NetT>(3, opts, sharding(2));
    CHECK(std::memcmp(got.data(), stored.data(), stored.size() * sizeof(float)) == 0);
  };
  check(static_cast<CheckpointedNet*>(nullptr), "Checkpointed");
  check(static_cast<NetWith<Revolve<2, Repeat<3, Block>>>*>(nullptr), "Revolve<2>");
  check(static_cast<NetWith<Repeat<3, Selective<Block>>>*>(nullptr), "Selective");
  check(static_cast<NetWith<Repeat<3, Offloaded<Block>>>*>(nullptr), "Offloaded");
  using P = mixed<bfloat16, DynamicLossScale>;
  std::vector<float> const mixed1 = data_parallel_run<CheckpointedNet, P>(3, opts, sharding(1));
  std::vector<float> const mixed2 = data_parallel_run<CheckpointedNet, P>(3, opts, sharding(2));
  CHECK(std::memcmp(mixed1.data(), mixed2.data(), mixed1.size() * sizeof(float)) == 0);
}

TEST_CASE("ZeRO-2: a rank keeps the pages of its shard of the gradients, and a pass's peak is the plan's",
          "[dist][zero2][memory][plan]") {
  // Wide enough that the gradients span hundreds of pages. What a rank holds is read from the
  // kernel's page tables (mincore); the plan replays the model's plan walk (where backward reports
  // gradients final) through the wrapper's rules. Independently here: at rest a rank holds every
  // page of the buffer but those wholly inside it and wholly outside its shard.
  constexpr std::size_t D = 128;
  using Wide = Residual<Seq<LayerNorm<D>, Linear<D, 256>, GELU, Linear<256, D>>>;
  auto const page = std::size_t(sysconf(_SC_PAGESIZE));
  auto const check = [&]<class NetT>(NetT*, char const* name, int level, std::size_t bucket) {
    INFO(name << ", ZeRO level " << level << ", bucket_bytes " << bucket << ", " << world_size() << " ranks");
    model<NetT> m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level, bucket));
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    constexpr std::size_t n = model<NetT>::parameter_count;
    auto const begin = reinterpret_cast<std::uintptr_t>(std::as_const(m).gradients().data());
    auto const end = begin + n * sizeof(float);
    auto const first = begin / page * page, last = (end + page - 1) / page * page;
    param_range const s = dp.shard();
    std::size_t at_rest = 0;
    for (std::uintptr_t p = first; p < last; p += page) {
      bool const inside = p >= begin && p + page <= end;
      bool const outside_shard = p + page <= begin + s.begin * sizeof(float) || p >= begin + s.end * sizeof(float);
      at_rest += !(inside && outside_shard) ? page : 0;
    }
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      dist::gradient_memory const g = dp.gradient_pages();
      CHECK(g.whole == last - first);
      if (level < 2) {
        CHECK(g.now == g.whole);
        CHECK(g.planned_peak == g.whole);
        continue;
      }
      CHECK(g.last_peak == g.planned_peak);
      CHECK(g.now == (world_size() == 1 ? g.whole : at_rest));
      CHECK(g.now <= n * sizeof(float) / std::size_t(world_size()) + 4 * page);
      // One bucket for the whole model starts only when backward ends, so the pass holds every
      // page at its end; small buckets are given back as backward goes on.
      if (bucket >= n * sizeof(float)) CHECK(g.planned_peak == g.whole);
      if (world_size() > 1 && 4 * bucket <= n * sizeof(float)) CHECK(g.planned_peak < g.whole);
      if (t == 1 && world_rank() == 0)
        std::printf("ZeRO-2, %s, %d ranks, buckets of %zu bytes: rank 0 holds %zu of %zu gradient bytes at rest, "
                    "%zu at the pass's peak (planned %zu)\n",
                    name, world_size(), bucket, g.now, g.whole, g.last_peak, g.planned_peak);
    }
    if (level < 2) return;
    // Accumulation: every micro-batch is a pass reduced into the shards, with the same peak (the
    // second one's failure backup copies the shard only, which is held anyway).
    batch b = whole_batch(2);
    m.zero_grad();
    for (dist::reduce when : {dist::reduce::later, dist::reduce::now}) {
      dp.template accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), 0.5, when);
      dist::gradient_memory const g = dp.gradient_pages();
      CHECK(g.last_peak == g.planned_peak);
      CHECK(g.now == (world_size() == 1 ? g.whole : at_rest));
    }
    opt.step();
  };
  using Stored = Seq<Linear<In, D>, Repeat<6, Wide>, LayerNorm<D>, Linear<D, Out>>;
  using Ckpt = Seq<Linear<In, D>, Repeat<6, Checkpointed<Wide>>, LayerNorm<D>, Linear<D, Out>>;
  using Rev = Seq<Linear<In, D>, Revolve<2, Repeat<6, Wide>>, LayerNorm<D>, Linear<D, Out>>;
  check(static_cast<Stored*>(nullptr), "stored", 1, std::size_t(64) << 10);
  check(static_cast<Stored*>(nullptr), "stored", 2, std::size_t(64) << 10);
  check(static_cast<Stored*>(nullptr), "stored", 2, std::size_t(4) << 20);
  check(static_cast<Ckpt*>(nullptr), "Checkpointed", 2, std::size_t(16) << 10);
  check(static_cast<Rev*>(nullptr), "Revolve<2>", 2, std::size_t(64) << 10);
}

TEST_CASE("ZeRO-3: with the parameters sharded too, training is ZeRO-2's, bit for bit", "[dist][zero3]") {
  // Each layer's parameters are gathered from their owners just before it runs: the same values
  // as ZeRO-2 holds whole, so the same arithmetic. Gradients are reduced exactly as under ZeRO-2.
  std::vector<float> const ref = reference<Net>(4, opts);
  for (std::size_t bucket : {std::size_t(256), std::size_t(4) << 20}) {
    INFO("bucket_bytes " << bucket << ", " << world_size() << " ranks");
    std::vector<double> l2, l3;
    dist::traffic t2, t3;
    std::vector<float> const zero2 = data_parallel_run<Net>(4, opts, sharding(2, bucket), &l2, &t2);
    std::vector<float> const zero3 = data_parallel_run<Net>(4, opts, sharding(3, bucket), &l3, &t3);
    CHECK(std::memcmp(zero2.data(), zero3.data(), zero2.size() * sizeof(float)) == 0);
    CHECK(l2 == l3);
    CHECK(t3.reduced == t2.reduced);
    CHECK(t3.buckets == t2.buckets);
    CHECK(t3.overlapped == t2.overlapped);
    CHECK(same_on_every_rank(zero3));
    CHECK(max_abs_diff(zero3, ref) < 2e-5);
    // Gathered: each layer's parameters twice (forward and backward) but this rank's own; no
    // all-gather after the step.
    if (world_size() == 1) CHECK(t3.gathered == 0);
    if (world_size() > 1) CHECK(t3.gathered > 0);
    // Without prefetching: the same values; every gather made as its frame starts, none ahead, and
    // no fewer (a second buffer can only keep a frame's parameters longer).
    std::vector<double> lw;
    dist::traffic tw;
    dist::options waiting = sharding(3, bucket);
    waiting.prefetch_parameters = false;
    std::vector<float> const zero3w = data_parallel_run<Net>(4, opts, waiting, &lw, &tw);
    CHECK(std::memcmp(zero3w.data(), zero3.data(), zero3.size() * sizeof(float)) == 0);
    CHECK(lw == l3);
    CHECK(tw.prefetched == 0);
    CHECK(t3.gathered <= tw.gathered);
    if (world_size() > 1) CHECK(t3.prefetched > 0);
    // Kept for backward: the same values, and each parameter this rank does not own gathered once
    // a step (every parameter is in exactly one layer's frame).
    std::vector<double> lk;
    dist::traffic tk;
    std::vector<float> const zero3k = data_parallel_run<Net>(4, opts, sharding(4, bucket), &lk, &tk);
    CHECK(std::memcmp(zero3k.data(), zero3.data(), zero3.size() * sizeof(float)) == 0);
    CHECK(lk == l3);
    std::size_t const mine = n_params * std::size_t(world_rank() + 1) / std::size_t(world_size()) -
                             n_params * std::size_t(world_rank()) / std::size_t(world_size());
    CHECK(tk.gathered == (world_size() == 1 ? 0 : (n_params - mine) * sizeof(float)));
    if (world_size() > 1) CHECK(tk.prefetched > 0);
    if (world_size() > 1 && world_rank() == 0 && bucket == 256)
      std::printf("ZeRO-3, %d ranks: %zu bytes gathered in a step, %zu of them ahead of their frame; %zu without "
                  "prefetching; %zu keeping them for backward\n",
                  world_size(), t3.gathered, t3.prefetched, tw.gathered, tk.gathered);
  }
  std::vector<float> const stored = data_parallel_run<Net>(3, opts, sharding(2));
  auto const check = [&]<class NetT>(NetT*, char const* name) {
    INFO(name << ", " << world_size() << " ranks");
    std::vector<float> const zero2 = data_parallel_run<NetT>(3, opts, sharding(2));
    std::vector<float> const zero3 = data_parallel_run<NetT>(3, opts, sharding(3));
    CHECK(std::memcmp(zero2.data(), zero3.data(), zero2.size() * sizeof(float)) == 0);
    dist::options waiting = sharding(3);
    waiting.prefetch_parameters = false;
    std::vector<float> const zero3w = data_parallel_run<NetT>(3, opts, waiting);
    CHECK(std::memcmp(zero3w.data(), zero3.data(), zero3.size() * sizeof(float)) == 0);
    std::vector<float> const zero3k = data_parallel_run<NetT>(3, opts, sharding(4));
    CHECK(std::memcmp(zero3k.data(), zero3.data(), zero3.size() * sizeof(float)) == 0);
    return zero3;
  };
  // The storage policies recompute under the same gathers: each layer gathers again as it runs
  // again.
  auto const same_as_stored = [&](std::vector<float> const& got) {
    CHECK(std::memcmp(got.data(), stored.data(), stored.size() * sizeof(float)) == 0);
  };
  same_as_stored(check(static_cast<CheckpointedNet*>(nullptr), "Checkpointed"));
  same_as_stored(check(static_cast<NetWith<Revolve<2, Repeat<3, Block>>>*>(nullptr), "Revolve<2>"));
  same_as_stored(check(static_cast<NetWith<Repeat<3, Selective<Block>>>*>(nullptr), "Selective"));
  same_as_stored(check(static_cast<NetWith<Repeat<3, Offloaded<Block>>>*>(nullptr), "Offloaded"));
  same_as_stored(check(static_cast<NetWith<CheckpointSequential<2, Repeat<3, Block>>>*>(nullptr),
                       "CheckpointSequential<2>"));
  same_as_stored(check(static_cast<NetWith<Checkpointed<Repeat<3, Block>>>*>(nullptr), "Checkpointed<Repeat>"));
  // The budget policy at its leanest for the most rows a rank gets (its blocks run in frames of
  // its own).
  constexpr std::size_t leanest = Budget<std::size_t(1) << 30, Batch, Repeat<3, Block>>::minimum<float>;
  same_as_stored(
      check(static_cast<NetWith<Budget<leanest, Batch, Repeat<3, Block>>>*>(nullptr), "Budget at its minimum"));
  // Layers reached outside a Seq or a chain's frames: a block that is one Residual layer, a
  // checkpointed layer, and a model that is one layer.
  check(static_cast<NetWith<Repeat<3, Residual<Linear<W, W>>>>*>(nullptr), "Repeat<3, Residual<Linear>>");
  check(static_cast<NetWith<Repeat<2, Checkpointed<Linear<W, W>>>>*>(nullptr), "Repeat<2, Checkpointed<Linear>>");
  check(static_cast<Linear<In, Out>*>(nullptr), "a model that is one Linear");
  check(static_cast<Checkpointed<Seq<Linear<In, W>, GELU, Linear<W, Out>>>*>(nullptr), "Checkpointed<Seq>");
}

TEST_CASE("ZeRO-3: accumulation, inference and saving are collective and give ZeRO-2's values", "[dist][zero3]") {
  auto const run = [&]<class P>(P, int level, std::vector<float>& y, double& loss, std::vector<float>& micro) {
    model<DropNet, host, P> m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    for (int t = 0; t < 2; ++t) {  // accumulation: two micro-batches a step
      batch b = whole_batch(t), c = whole_batch(t + 5);
      m.zero_grad();
      dp.template accumulate<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), 0.5, dist::reduce::later);
      dp.template accumulate<SoftmaxCrossEntropy>(rows(c.x, r), rows(c.y, r), 0.5, dist::reduce::now);
      opt.step();
    }
    // Inference on every rank (each its own rows), a loss and a training-mode loss.
    batch b = whole_batch(9);
    y = tensor_to_host(m.forward(rows(b.x, r)).view());
    loss = m.template loss<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r)) +
           m.template training_loss<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r));
    std::string const path = "/tmp/remat-zero3-" + std::to_string(level) + ".safetensors";
    std::size_t const at_rest = dp.parameter_pages().now;
    dist::save(dp, path);
    model<DropNet, host, P> alone(seed{1});
    load(alone, path);
    micro = params_of(alone);
    CHECK(dp.parameter_pages().now == at_rest);  // (ZeRO-3: the save let the gathered parameters go again)
    // Loading broadcasts rank 0's file and keeps this rank's shard.
    dist::load(dp, path);
    dp.gather_parameters();
    CHECK(params_of(m) == micro);
  };
  auto const compare = [&](auto precision, char const* name) {
    INFO(name << ", " << world_size() << " ranks");
    std::vector<float> y2, y3, p2, p3;
    double l2 = 0, l3 = 0;
    run(precision, 2, y2, l2, p2);
    for (int level : {3, 4}) {  // (4: the gathered parameters kept for backward)
      INFO("level " << level);
      run(precision, level, y3, l3, p3);
      CHECK(y2 == y3);
      CHECK(l2 == l3);
      CHECK(p2 == p3);
      CHECK(same_on_every_rank(p3));
    }
  };
  compare(fp32{}, "fp32");
  compare(mixed<bfloat16, DynamicLossScale>{}, "mixed<bfloat16>");
}

TEST_CASE("ZeRO-3: a rank keeps the pages of its shard of the parameters, and a pass's peak is the plan's",
          "[dist][zero3][memory][plan]") {
  // What a rank holds is read from the kernel's page tables (mincore); the plan takes the largest
  // frame of the model's plan walk. Independently here: a rank holds every page of the model's
  // buffer but those wholly inside it and wholly outside its shard, and, from the wrapper's
  // construction, the gather buffers: two (one without prefetching), each the largest layer's
  // parameters, rounded up to pages.
  constexpr std::size_t D = 128;
  using Wide = Residual<Seq<LayerNorm<D>, Linear<D, 256>, GELU, Linear<256, D>>>;
  auto const page = std::size_t(sysconf(_SC_PAGESIZE));
  auto const check = [&]<class NetT, class P>(NetT*, P, char const* name, bool prefetch = true, bool keep = false) {
    INFO(name << (prefetch ? "" : ", without prefetching") << (keep ? ", kept for backward" : "") << ", "
              << world_size() << " ranks");
    using M = model<NetT, host, P>;
    using C = typename M::compute_type;
    M m(seed{7});
    dist::options o = sharding(keep ? 4 : 3, std::size_t(64) << 10);
    o.prefetch_parameters = prefetch;
    dist::data_parallel dp(m, MPI_COMM_WORLD, o);
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    constexpr std::size_t n = M::parameter_count;
    // The pages a rank keeps of a buffer of n elements of `element` bytes, and all it touches.
    auto const at_rest = [&](void const* data, std::size_t element) {
      auto const begin = reinterpret_cast<std::uintptr_t>(data);
      auto const end = begin + n * element;
      auto const first = begin / page * page, last = (end + page - 1) / page * page;
      param_range const s = dp.shard();
      std::size_t held = 0;
      for (std::uintptr_t p = first; p < last; p += page) {
        bool const inside = p >= begin && p + page <= end;
        bool const outside_shard = p + page <= begin + s.begin * element || p >= begin + s.end * element;
        held += !(inside && outside_shard) ? page : 0;
      }
      return std::pair{held, std::size_t(last - first)};
    };
    auto [params_at_rest, params_whole] = at_rest(std::as_const(m).parameters().data(), sizeof(float));
    auto const [grads_at_rest, grads_whole] = at_rest(std::as_const(m).gradients().data(), sizeof(float));
    // Kept for backward, a pass ends holding every page of the copy layers read (every parameter
    // is some layer's): the master weights in fp32, the compute copy in mixed precision.
    std::size_t kept_peak = params_whole;
    if constexpr (M::mixed_precision) {  // (the compute copy's pages: a rank keeps its shard of them too)
      auto const [compute_at_rest, compute_whole] = at_rest(m.compute_parameters().data(), sizeof(C));
      kept_peak = params_at_rest + compute_whole;
      params_at_rest += compute_at_rest;
      params_whole += compute_whole;
    }
    // A gather buffer: the largest layer's parameters, in the type layers read, rounded up to
    // pages; one rank gathers nothing.
    std::size_t const largest = (Linear<D, 256>::param_count * sizeof(C) + page - 1) / page * page;
    // (kept for backward, passes gather into the model's own pages: no buffer)
    std::size_t const gather_buffers = world_size() == 1 || keep ? 0 : (prefetch ? 2 : 1) * largest;
    CHECK(dp.parameter_pages().now == params_at_rest + gather_buffers);
    for (int t = 0; t < 2; ++t) {
      batch b = whole_batch(t);
      dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      dist::gradient_memory const p = dp.parameter_pages(), g = dp.gradient_pages();
      CHECK(p.whole == params_whole);
      CHECK(p.last_peak == p.planned_peak);
      CHECK(g.now == grads_at_rest);
      CHECK(g.last_peak == g.planned_peak);
      CHECK(p.now == params_at_rest + gather_buffers);
      CHECK(p.planned_peak == (keep ? kept_peak : params_at_rest) + gather_buffers);
      if (world_size() == 1) CHECK(p.now == p.whole);
      if (world_size() > 1 && !keep) CHECK(p.planned_peak < p.whole);
      // Parameters (and their compute copy), gradients and the optimizer's two moments: 1/P of
      // one process's each, to pages, and the gather buffer.
      std::size_t const per_rank = p.now + g.now + 2 * opt.exp_avg().size() * sizeof(float);
      std::size_t const alone = 4 * n * sizeof(float) + (M::mixed_precision ? n * sizeof(C) : 0);
      // (each buffer: its shard rounded out to pages, and the two pages it shares at its ends)
      CHECK(per_rank <= alone / std::size_t(world_size()) + 10 * page + gather_buffers);
      if (t == 1 && world_rank() == 0)
        std::printf("ZeRO-3, %s, %d ranks: rank 0 holds %zu of %zu parameter bytes at rest, %zu at the pass's "
                    "peak (planned %zu); parameters + gradients + moments %zu bytes, one process %zu\n",
                    name, world_size(), p.now, p.whole, p.last_peak, p.planned_peak, per_rank, alone);
    }
  };
  using Stored = Seq<Linear<In, D>, Repeat<6, Wide>, LayerNorm<D>, Linear<D, Out>>;
  using Ckpt = Seq<Linear<In, D>, Repeat<6, Checkpointed<Wide>>, LayerNorm<D>, Linear<D, Out>>;
  using Rev = Seq<Linear<In, D>, Revolve<2, Repeat<6, Wide>>, LayerNorm<D>, Linear<D, Out>>;
  check(static_cast<Stored*>(nullptr), fp32{}, "stored");
  check(static_cast<Ckpt*>(nullptr), fp32{}, "Checkpointed");
  check(static_cast<Rev*>(nullptr), fp32{}, "Revolve<2>");
  check(static_cast<Ckpt*>(nullptr), fp32{}, "Checkpointed", false);
  check(static_cast<Ckpt*>(nullptr), fp32{}, "Checkpointed", true, true);
  check(static_cast<Stored*>(nullptr), fp32{}, "stored", false, true);
  using P = mixed<bfloat16, DynamicLossScale>;
  check(static_cast<Stored*>(nullptr), P{}, "stored, mixed<bfloat16>");
  check(static_cast<Rev*>(nullptr), P{}, "Revolve<2>, mixed<bfloat16>");
  check(static_cast<Rev*>(nullptr), P{}, "Revolve<2>, mixed<bfloat16>", true, true);
}

TEST_CASE("ZeRO-3: a model left with its shard of the parameters refuses to run alone", "[dist][zero3][errors]") {
  model<Net> m(seed{7});
  batch b = whole_batch(0);
  param_range const r = my_rows(world_rank(), world_size());
  std::vector<float> whole;
  {
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(3));
    AdamW opt(m, opts);
    dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    dp.gather_parameters();
    whole = params_of(m);
    dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);  // (the gathered copy is let go)
  }
  std::string const path = "/tmp/remat-zero3-partial-" + std::to_string(world_rank()) + ".safetensors";
  if (world_size() == 1) {  // (one rank holds every parameter)
    CHECK(m.parameters_whole());
    CHECK_NOTHROW(m.forward(b.x.view()));
    return;
  }
  CHECK_FALSE(m.parameters_whole());
  CHECK_THROWS_WITH(m.forward(b.x.view()), Catch::Contains("found one rank's shard of them only"));
  // (a file of the shard would read as the whole model, the rest zero: refused, nothing written)
  std::remove(path.c_str());
  CHECK_THROWS_AS(save(m, path), argument_error);
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_THROWS_WITH(m.accumulate<SoftmaxCrossEntropy>(b.x.view(), b.y.view()),
                    Catch::Contains("call dp.gather_parameters() on every rank"));
  CHECK_THROWS_WITH(dist::data_parallel(m, MPI_COMM_WORLD, sharding(3)), Catch::Contains("shard of them only"));
  // Gathered before the wrapper goes, the model is whole and runs alone.
  {
    model<Net> n(seed{7});
    {
      dist::data_parallel dp(n, MPI_COMM_WORLD, sharding(3));
      AdamW opt(n, opts);
      dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
      dp.gather_parameters();
    }
    CHECK(params_of(n) == whole);
    CHECK_NOTHROW(n.forward(b.x.view()));
  }
  // A file loaded into it makes it whole again.
  {
    model<Net> n(seed{3});
    save(n, path);
  }
  load(m, path);
  CHECK(m.parameters_whole());
  CHECK_NOTHROW(m.forward(b.x.view()));
  std::remove(path.c_str());
}

TEST_CASE("ZeRO-3: saving or loading the model itself while a rank holds its shard is refused, and changes nothing",
          "[dist][zero3][errors][io]") {
  // Under the wrapper, remat::save of the model would write this rank's shard with zeros for the
  // rest, and remat::load would make one rank's model whole from a file the others may not read:
  // both are refused with what to call instead, until the parameters are gathered.
  model<Net> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(3));
  AdamW opt(m, opts);
  param_range const r = my_rows(dp.rank(), dp.size());
  batch b = whole_batch(0);
  dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
  std::string const mine = "/tmp/remat-zero3-own-" + std::to_string(world_rank()) + ".safetensors";
  std::string const shared = "/tmp/remat-zero3-shared.safetensors";
  dist::save(dp, shared);
  std::remove(mine.c_str());
  std::size_t const held = dp.parameter_pages().now;
  if (world_size() == 1) {  // (one rank: the model holds every parameter, and is an ordinary model)
    CHECK(m.parameters_whole());
    CHECK_NOTHROW(save(m, mine));
    CHECK_NOTHROW(load(m, mine));
    std::remove(mine.c_str());
    return;
  }
  CHECK_FALSE(m.parameters_whole());
  CHECK_THROWS_WITH(save(m, mine), Catch::Contains("remat::dist::save(dp, path)"));
  CHECK_FALSE(std::filesystem::exists(mine));
  std::uint64_t const version = m.parameter_version();
  CHECK_THROWS_WITH(load(m, shared), Catch::Contains("remat::dist::load(dp, path)"));
  CHECK(m.parameter_version() == version);
  CHECK(dp.parameter_pages().now == held);  // (no page of another rank's shard came back)
  // Gathered, the model is whole until the next pass: saved by itself, it is dist::save's file.
  dp.gather_parameters();
  CHECK(m.parameters_whole());
  save(m, mine);
  model<Net> a(seed{1}), c(seed{2});
  load(a, mine);
  load(c, shared);
  CHECK(params_of(a) == params_of(c));
  dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
  CHECK_FALSE(m.parameters_whole());  // (the pass let the gathered copy go)
  std::remove(mine.c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(shared.c_str());
}

TEST_CASE("ZeRO-3: a pass outside training that fails on one rank fails on every rank, and none waits for it",
          "[dist][zero3][errors]") {
  // model.forward, loss and training_loss gather each layer's parameters, so every rank runs them
  // together. When one rank's fails (bad input found before anything runs, or an allocation
  // failing midway), that rank still takes its part in the gathers the others' forward makes,
  // then every rank throws: the failing one its own error, the others dist_error quoting it (a
  // rank left waiting would time out instead, with no quote). The next pass gives what a pass
  // that never failed gives.
  int const bad = world_size() - 1;
  auto const check = [&]<class NetT, class P>(NetT*, P, char const* name, int level = 3) {
    INFO(name << ", " << world_size() << " ranks, rank " << bad << " failing, level " << level);
    memory::caching_allocator<host> alloc;
    model<NetT, host, P> m(seed{7}, alloc);
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    batch b = whole_batch(0);
    dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    std::vector<float> const y0 = tensor_to_host(m.forward(rows(b.x, r)).view());
    double const l0 = m.template loss<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r));
    double const t0 = m.template training_loss<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r));
    // Runs f, which must throw on every rank as described; returns whether it did.
    auto const fails_everywhere = [&](auto&& f, char const* expect) {
      try {
        f();
      } catch (dist_error const& e) {
        std::string const what = e.what();
        INFO(what);
        CHECK(world_rank() != bad);
        CHECK(what.find("rank " + std::to_string(bad) + " of " + std::to_string(world_size()) + " failed") !=
              std::string::npos);
        CHECK(what.find(expect) != std::string::npos);  // (the failing rank's message, quoted)
        return true;
      } catch (error const& e) {
        std::string const what = e.what();
        INFO(what);
        CHECK(world_rank() == bad);
        CHECK(what.find(expect) != std::string::npos);
        return true;
      }
      return false;
    };
    auto const forward = [&] { return tensor_to_host(m.forward(rows(b.x, r)).view()); };
    auto const loss = [&] { return m.template loss<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r)); };
    auto const training_loss = [&] { return m.template training_loss<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r)); };
    // Bad input on one rank: a NaN among its features.
    tensor<float> x(index_t(r.size()), index_t(In));
    std::memcpy(x.data(), rows(b.x, r).data(), x.size() * sizeof(float));
    if (world_rank() == bad) x.data()[0] = std::numeric_limits<float>::quiet_NaN();
    CHECK(fails_everywhere([&] { m.forward(x.view()); }, "expected finite values"));
    CHECK(fails_everywhere([&] { m.template loss<SoftmaxCrossEntropy>(x.view(), rows(b.y, r)); }, "expected finite"));
    CHECK(fails_everywhere([&] { m.template training_loss<SoftmaxCrossEntropy>(x.view(), rows(b.y, r)); },
                           "expected finite"));
    CHECK(forward() == y0);
    // Every allocation request of a forward, a loss and a training-mode loss failing on one rank
    // (with the planned arena off: in it these passes ask the allocator for nothing).
    m.use_planned_arena(false);
    auto const each_request = [&](auto&& pass) {
      int requests = 0;
      std::size_t const r0 = alloc.stats().requests;
      pass();
      requests = int(alloc.stats().requests - r0);
      MPI_Bcast(&requests, 1, MPI_INT, bad, MPI_COMM_WORLD);
      REQUIRE(requests > 0);
      for (int k = 1; k <= requests; ++k) {
        INFO("request " << k << " of " << requests);
        if (world_rank() == bad) alloc.fail_request(std::size_t(k));
        CHECK(fails_everywhere(pass, "injected"));
        alloc.fail_request(0);
      }
      return requests;
    };
    std::size_t const pages = dp.parameter_pages().now;
    int const n = each_request(forward) + each_request(loss) + each_request(training_loss);
    CHECK(dp.parameter_pages().now == pages);  // (kept for backward: what the failed passes gathered, let go)
    CHECK(forward() == y0);
    CHECK(loss() == l0);
    CHECK(training_loss() == t0);
    // And training goes on together.
    CHECK(std::isfinite(dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt)));
    if (world_rank() == 0)
      std::printf("ZeRO-3 passes outside training, %s, %d ranks: %d failing requests agreed\n", name, world_size(), n);
  };
  using P = mixed<bfloat16, DynamicLossScale>;
  check(static_cast<Net*>(nullptr), fp32{}, "stored");
  check(static_cast<NetWith<Revolve<2, Repeat<3, Checkpointed<Block>>>>*>(nullptr), fp32{}, "Revolve<2, Checkpointed>");
  check(static_cast<NetWith<Revolve<2, Repeat<3, Checkpointed<Block>>>>*>(nullptr), fp32{},
        "Revolve<2, Checkpointed>, kept for backward", 4);
  check(static_cast<DropNet*>(nullptr), P{}, "with dropout, bf16, kept for backward", 4);
  check(static_cast<NetWith<Repeat<3, Selective<Block>>>*>(nullptr), P{}, "Selective, bf16");
  check(static_cast<DropNet*>(nullptr), P{}, "with dropout, bf16");
  check(static_cast<Linear<In, Out>*>(nullptr), fp32{}, "a model that is one Linear");
}

TEST_CASE("ZeRO-3 in mixed precision: each rank keeps a shard of the compute copy, and training is ZeRO-2's, bit "
          "for bit, skips included",
          "[dist][zero3][precision]") {
  // Each rank casts its shard of the fp32 master weights to bf16 and the layers gather the bf16
  // copy: the same values ZeRO-2's whole copy holds. A loss scale of 2^132 overflows the
  // gradients at first: those steps are skipped on every rank together (the scale halves), and
  // it grows again every 2 steps once they are finite.
  using P = mixed<bfloat16, DynamicLossScale>;
  struct outcome {
    std::vector<float> params;
    std::vector<double> losses;
    std::uint64_t skipped = 0;
    double scale = 0;
    dist::traffic traffic{};
  };
  auto const run = [&]<class NetT, class Precision>(NetT*, Precision, int level) {
    model<NetT, host, Precision> m(seed{7});
    if constexpr (is_mixed_v<Precision>) m.scaler().configure({.init_scale = 0x1p132, .growth_interval = 2});
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level));
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    outcome o;
    for (int t = 0; t < 12; ++t) {
      batch b = whole_batch(t);
      o.losses.push_back(dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt));
      // (the first step's: a layer gathered last is not gathered again while the parameters are
      // unchanged, which they are after a skipped step)
      if (t == 0) o.traffic = dp.last_step_traffic();
    }
    o.skipped = m.scaler().skipped_steps();
    o.scale = m.scaler().scale();
    dp.gather_parameters();
    o.params = params_of(m);
    return o;
  };
  auto const check = [&]<class NetT>(NetT* net, char const* name) {
    INFO(name << ", " << world_size() << " ranks");
    outcome const zero2 = run(net, P{}, 2), zero3 = run(net, P{}, 3);
    CHECK(std::memcmp(zero2.params.data(), zero3.params.data(), zero2.params.size() * sizeof(float)) == 0);
    CHECK(zero2.losses == zero3.losses);
    CHECK(zero3.skipped == zero2.skipped);
    CHECK(zero3.skipped > 0);
    CHECK(zero3.skipped < 12);
    CHECK(zero3.scale == zero2.scale);
    CHECK(same_on_every_rank(zero3.params));
    CHECK(zero3.traffic.reduced == zero2.traffic.reduced);
    // The same gathers as an fp32 model's first step, of 2-byte values instead of 4-byte ones.
    outcome const fp32_zero3 = run(net, fp32{}, 3);
    CHECK(zero3.traffic.gathered * 2 == fp32_zero3.traffic.gathered);
    if (world_size() > 1) CHECK(zero3.traffic.gathered > 0);
    // Kept for backward: the same training, each 16-bit parameter not this rank's gathered once.
    outcome const kept = run(net, P{}, 4);
    CHECK(std::memcmp(kept.params.data(), zero3.params.data(), zero3.params.size() * sizeof(float)) == 0);
    CHECK(kept.losses == zero3.losses);
    CHECK(kept.skipped == zero3.skipped);
    CHECK(kept.traffic.gathered <= zero3.traffic.gathered);
    if (world_rank() == 0)
      std::printf("ZeRO-3 bf16, %s, %d ranks: %llu of 12 steps skipped, final scale %g, %zu bytes gathered in the first\n",
                  name, world_size(), static_cast<unsigned long long>(zero3.skipped), zero3.scale,
                  zero3.traffic.gathered);
  };
  check(static_cast<Net*>(nullptr), "stored");
  check(static_cast<CheckpointedNet*>(nullptr), "Checkpointed");
  check(static_cast<NetWith<Revolve<2, Repeat<3, Block>>>*>(nullptr), "Revolve<2>");
  check(static_cast<NetWith<Repeat<3, Selective<Block>>>*>(nullptr), "Selective");
  check(static_cast<NetWith<Repeat<3, Residual<Linear<W, W>>>>*>(nullptr), "Repeat<3, Residual<Linear>>");
  // And one process on the whole batch, to bf16's rounding.
  std::vector<float> const ref = reference<Net, P>(3, opts);
  std::vector<float> const got = data_parallel_run<Net, P>(3, opts, sharding(3));
  CHECK(max_abs_diff(got, ref) < 2e-3);
}
