// remat::dist with options::shard_master_weights: under mpirun (1, 2 or 3 ranks, in the same
// program as test_dist.cpp), a mixed-precision model under ZeRO-1 or 2 whose ranks keep their shard
// of the fp32 master weights only trains bit for bit as with them whole (AdamW, and OffloadedAdamW
// with the master weights and gradients on the host), gives back the pages of the rest as planned,
// holds a compute copy equal to the cast of the whole master weights, and saves and takes writes
// from outside when made whole.
#include "common.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace remat;
using namespace dist_test;

namespace {

using B = mixed<bfloat16, DynamicLossScale>;
using H = mixed<half, DynamicLossScale>;

dist::options with_master_shard(int level) {
  dist::options o = sharding(level);
  o.shard_master_weights = true;
  return o;
}

// What a run leaves to compare: the whole master weights (gathered), the last norm and the
// losses; and what it measured before gathering them.
struct run_result {
  std::vector<float> values;
  std::size_t wrong_casts = 0;  // compute-copy values that are not the cast of the master weight
  bool whole_before = true;     // parameters_whole() before the gather
  given_back master{};
  dist::gradient_memory pages{};
  dist::traffic traffic{};
  std::size_t others = 0;  // the parameters outside this rank's shard
};

// Three steps of three micro-batches each (every pass reduced under ZeRO-2), clipping on, under
// options d; with built_on_host, the model's master weights are in host memory from its
// construction (host_master_weights).
template <class P, template <class> class Opt, class NetT = Net>
run_result run(dist::options d, bool built_on_host = false) {
  using M = model<NetT, host, P>;
  memory::caching_allocator<host> host_side;  // (before the model: it outlives the model)
  std::optional<M> held;
  if (built_on_host)
    held.emplace(seed{7}, memory::default_allocator<host>(), host_master_weights{host_side});
  else
    held.emplace(seed{7});
  M& m = *held;
  dist::data_parallel dp(m, MPI_COMM_WORLD, d);
  Opt<M> opt(m, {.lr = 1e-2, .weight_decay = 1e-2, .clip_norm = 0.5});
  std::vector<double> losses;
  three_accumulated_steps(dp, m, opt, losses, true);
  run_result out;
  out.whole_before = m.parameters_whole();
  out.master = master_pages_given_back(std::as_const(m), dp.shard());
  out.pages = dp.parameter_pages();
  out.traffic = dp.last_step_traffic();
  out.others = M::parameter_count - dp.shard().size();
  dp.gather_parameters();
  out.values = params_of(m);
  auto const copy = m.compute_parameters();
  REQUIRE(copy.size() == out.values.size());
  using C = typename M::compute_type;
  for (std::size_t i = 0; i < out.values.size(); ++i) out.wrong_casts += C(out.values[i]).bits() != copy.data()[i].bits();
  out.values.push_back(float(opt.last_grad_norm()));
  for (double l : losses) out.values.push_back(float(l));
  return out;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("shard_master_weights: ZeRO-1 and 2 keep each rank's shard of the master weights, and train bit for bit "
          "as with them whole",
          "[dist][master_shard]") {
  // AdamW, and OffloadedAdamW over master weights built in host memory (ZeRO-2: the gradients
  // there too), each against AdamW under the same ZeRO level with the master weights whole; bf16
  // and half under a dynamic loss scale, accumulation over three micro-batches, clipping.
  bool const many = world_size() > 1;
  for (int level : {1, 2}) {
    INFO("ZeRO-" << level << ", " << world_size() << " ranks");
    run_result const whole = run<B, AdamW_of>(sharding(level));
    run_result const shard = run<B, AdamW_of>(with_master_shard(level));
    run_result const offloaded = run<B, OffloadedAdamW>(with_master_shard(level), true);
    CHECK(same_bits(whole.values, shard.values));
    CHECK(same_bits(whole.values, offloaded.values));
    CHECK(same_on_every_rank(std::vector<float>(shard.values.begin(), shard.values.begin() + std::ptrdiff_t(n_params))));
    if (level == 2) {
      run_result const all = run<B, OffloadedGrads>(with_master_shard(level), true);
      CHECK(same_bits(whole.values, all.values));
    }
    run_result const whole_h = run<H, AdamW_of>(sharding(level));
    run_result const shard_h = run<H, AdamW_of>(with_master_shard(level));
    CHECK(same_bits(whole_h.values, shard_h.values));
    for (run_result const* s : {&shard, &offloaded, &shard_h}) {
      // The compute copy: the cast of the whole master weights, every value (the rest of it was
      // gathered after each step, not cast from master weights this rank no longer holds).
      CHECK(s->wrong_casts == 0);
      CHECK(s->whole_before == !many);
      // The pages outside the shard are given back; what is held is what was planned.
      CHECK(s->master.found == s->master.expected);
      CHECK(s->pages.now == s->pages.planned_peak);
      CHECK(s->pages.last_peak == s->pages.planned_peak);
      // After a step the ranks gather the 16-bit copy only (2 bytes a parameter, not 4 + 2).
      CHECK(s->traffic.gathered == s->others * 2);
    }
    // (with the master weights whole: they are gathered, 4 bytes a parameter, and every page held)
    CHECK(whole.traffic.gathered == whole.others * 4);
    CHECK(whole.pages.planned_peak == whole.pages.whole);
    CHECK(whole.pages.now == whole.pages.whole);
  }
  // A model of 70 KiB spans two pages a rank and more up to 8 ranks, so some rank gives back a
  // whole page of its master weights, wherever the allocator puts them; its plan holds less than
  // the whole buffer.
  using Mid = Seq<Linear<In, 64>, Repeat<2, Residual<Seq<LayerNorm<64>, Linear<64, 64>, GELU, Linear<64, 64>>>>,
                  LayerNorm<64>, Linear<64, Out>>;
  run_result const mid_whole = run<B, AdamW_of, Mid>(sharding(2));
  run_result const mid = run<B, AdamW_of, Mid>(with_master_shard(2));
  CHECK(same_bits(mid_whole.values, mid.values));
  CHECK(mid.master.found == mid.master.expected);
  CHECK(mid.pages.now == mid.pages.planned_peak);
  unsigned long mine = mid.master.expected, ranks = 0;
  MPI_Allreduce(&mine, &ranks, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (many) {
    CHECK(ranks > 0);
    if (mid.master.expected > 0) CHECK(mid.pages.planned_peak < mid.pages.whole);
  }
}

TEST_CASE("shard_master_weights: weights written while whole reach every rank's compute copy; the files hold them "
          "whole",
          "[dist][master_shard]") {
  using M = model<Net, host, B>;
  std::string const dir = REMAT_TEST_BINARY_DIR;
  std::string const file = dir + "/dist_master_shard_" + std::to_string(world_size()) + ".safetensors";
  // Two steps, then every rank halves the whole master weights (made whole first), then two more:
  // the same bits with the master weights sharded as whole (the rest of the compute copy is cast
  // while they are whole, before the next pass gives their pages back).
  auto train = [&](dist::options d, bool save) {
    M m(seed{7});
    dist::data_parallel dp(m, MPI_COMM_WORLD, d);
    AdamW opt(m, opts);
    param_range const r = my_rows(dp.rank(), dp.size());
    std::vector<float> losses;
    for (int t = 0; t < 4; ++t) {
      if (t == 2) {
        dp.gather_parameters();
        CHECK(m.parameters_whole());
        tensor_view<float, host> const p = m.parameters();
        for (std::size_t i = 0; i < p.size(); ++i) p.data()[i] *= 0.5f;
      }
      batch b = whole_batch(t);
      losses.push_back(float(dp.train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt)));
    }
    if (save) {
      dist::save(dp, file);
      CHECK(m.parameters_whole() == (world_size() == 1));  // (let go again after)
      if (world_size() > 1) CHECK_THROWS_AS(remat::save(m, dir + "/dist_master_shard_partial.safetensors"), error);
    }
    dp.gather_parameters();
    std::vector<float> out = params_of(m);
    out.insert(out.end(), losses.begin(), losses.end());
    return out;
  };
  std::vector<float> const whole = train(sharding(1), false);
  std::vector<float> const shard = train(with_master_shard(1), true);
  CHECK(same_bits(whole, shard));
  // The file holds the whole master weights, read back into a model trained alone.
  MPI_Barrier(MPI_COMM_WORLD);
  M alone(seed{99});
  load(alone, file);
  std::vector<float> const read = params_of(alone);
  CHECK(same_bits(read, std::vector<float>(whole.begin(), whole.begin() + std::ptrdiff_t(n_params))));
  // And dist::load puts them into a sharded wrapper's model: whole once gathered, every rank.
  M again(seed{99});
  dist::data_parallel dp(again, MPI_COMM_WORLD, with_master_shard(2));
  dist::load(dp, file);
  dp.gather_parameters();
  CHECK(same_bits(params_of(again), read));
}

TEST_CASE("shard_master_weights is refused for an fp32 model and for master weights moved once the wrapper holds them",
          "[dist][master_shard][errors]") {
  {
    model<Net> m(seed{7});
    std::vector<float> const before = params_of(m);
    CHECK_THROWS_WITH(dist::data_parallel(m, MPI_COMM_WORLD, with_master_shard(1)),
                      Catch::Contains("expects a mixed-precision model"));
    CHECK(m.link().gradient_sync() == nullptr);
    CHECK(same_bits(params_of(m), before));
  }
  // OffloadedAdamW moving the master weights once the wrapper holds their pages (one rank too):
  // refused, the model unchanged; built there (host_master_weights), they are taken.
  model<Net, host, B> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, with_master_shard(1));
  CHECK_THROWS_WITH(OffloadedAdamW(m, opts, {.master_weights = true}), Catch::Contains("host_master_weights"));
  CHECK_FALSE(m.master_on_host());
  // Ranks that disagree on it: every rank throws dist_error naming the option.
  if (world_size() > 1) {
    dist::options o = sharding(1);
    o.shard_master_weights = world_rank() % 2 == 1;
    model<Net, host, B> other(seed{7});
    try {
      dist::data_parallel bad(other, MPI_COMM_WORLD, o);
      FAIL("expected dist_error");
    } catch (dist_error const& e) {
      CHECK(std::string(e.what()).find("shard_master_weights true") != std::string::npos);
    }
  }
}
