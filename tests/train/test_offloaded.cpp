// OffloadedAdamW (the optimizer state in host memory) against AdamW: on the host, the same steps
// must give the same bits (weights, compute copy, moments, step count, loss scale), with clipping,
// skipped steps and weights written from outside between steps; the model's allocator must hold
// no optimizer state; and either optimizer must resume from the other's file.
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

using namespace remat;

namespace {

using Net = Seq<Linear<12, 24>, GELU, LayerNorm<24>, Linear<24, 24>, Tanh, Linear<24, 6>>;

tensor<float> inputs(std::size_t rows, std::size_t cols, double phase = 0.0) {
  tensor<float> x{index_t(rows), index_t(cols)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i) * 0.37 + phase));
  return x;
}

// The mixed precision the memory cases use, its model's parameter count, and the allocator's
// rounding of a block.
using Mixed = mixed<bfloat16, DynamicLossScale>;
constexpr std::size_t n_mixed = model<Net, host, Mixed>::parameter_count;
constexpr std::size_t rounded(std::size_t bytes) { return memory::caching_allocator<host>::rounded(bytes); }

// The bytes of a view, read without asking the model for a writable one.
template <class V>
std::vector<unsigned char> bytes_of(V const& v) {
  std::vector<unsigned char> out(v.size() * sizeof(typename V::value_type));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <class M>
std::vector<unsigned char> weights(M const& m) {
  return bytes_of(m.parameters());
}

template <class M>
std::vector<unsigned char> compute_weights(M& m) {
  return bytes_of(m.compute_parameters());
}

// The two optimizers' states, side by side, after `what`.
template <class M, class A, class O>
void require_same(M& ma, A const& a, M& mo, O const& o, std::string const& what) {
  INFO(what);
  REQUIRE(weights(mo) == weights(ma));
  REQUIRE(compute_weights(mo) == compute_weights(ma));
  REQUIRE(bytes_of(o.exp_avg().view()) == bytes_of(a.exp_avg().view()));
  REQUIRE(bytes_of(o.exp_avg_sq().view()) == bytes_of(a.exp_avg_sq().view()));
  REQUIRE(bytes_of(o.master_weights().view()) == weights(ma));
  REQUIRE(o.steps() == a.steps());
  REQUIRE(o.last_step_skipped() == a.last_step_skipped());
  REQUIRE(mo.scaler().scale() == ma.scaler().scale());
  REQUIRE(mo.scaler().skipped_steps() == ma.scaler().skipped_steps());
  if (std::isnan(a.last_grad_norm()))
    REQUIRE(std::isnan(o.last_grad_norm()));
  else
    REQUIRE(o.last_grad_norm() == a.last_grad_norm());
}

// Eight steps of each optimizer on two models built alike, compared after every step; the fifth
// step's targets are far enough to overflow a half model's scaled gradients (a skipped step), and
// after the third both models' weights are written from outside. The offloaded optimizer updates
// `chunk` parameters at a time (0: all at once), with the placement w. With `micro` above 1 each
// step sums the gradients of that many micro-batches (accumulate) before the optimizer's step.
template <class P, class NetT = Net>
void run_alike(adamw_options opts, std::size_t chunk = 0, offload_options w = {}, int micro = 1) {
  model<NetT, host, P> ma(seed{7}), mo(seed{7});
  AdamW a(ma, opts);
  OffloadedAdamW o(mo, opts, w);
  REQUIRE(o.chunk() == 0);  // (on the host: all at once)
  REQUIRE(mo.master_on_host() == w.master_weights);
  REQUIRE(o.offloads_master_weights() == w.master_weights);
  REQUIRE(o.offloads_gradients() == (w.gradients == gradient_place::host));
  o.set_chunk(chunk);
  INFO("chunk " << chunk << ", master weights on the host " << w.master_weights << ", gradients on the host "
                << (w.gradients == gradient_place::host) << ", micro-batches " << micro);
  tensor<float> const x = inputs(16, 12);
  tensor<float> const t = inputs(16, 6, 0.4);
  tensor<float> far(16, 6);
  for (std::size_t i = 0; i < far.size(); ++i) far[i] = 1e4f;
  for (int step = 0; step < 8; ++step) {
    tensor<float> const& target = step == 4 ? far : t;
    double la = 0, lo = 0;
    if (micro == 1) {
      la = ma.template train_step<MSE>(x, target, a);
      lo = mo.template train_step<MSE>(x, target, o);
    } else {
      ma.zero_grad();
      mo.zero_grad();
      for (int k = 0; k < micro; ++k) {
        tensor<float> const xk = inputs(16, 12, 0.1 * k);
        la += ma.template accumulate<MSE>(xk, target, 1.0 / micro);
        lo += mo.template accumulate<MSE>(xk, target, 1.0 / micro);
      }
      if (w.gradients == gradient_place::host) REQUIRE(bytes_of(o.gradients().view()) == bytes_of(ma.gradients()));
      a.step();
      o.step();
    }
    REQUIRE(lo == la);
    if (w.gradients == gradient_place::host) {  // (the sum the step read: the model's own bits; the model's buffer holds none)
      REQUIRE(bytes_of(o.gradients().view()) == bytes_of(ma.gradients()));
      REQUIRE(bytes_of(mo.gradients()) == std::vector<unsigned char>(mo.gradients().size() * 4, 0));
    }
    require_same(ma, a, mo, o, "after step " + std::to_string(step));
    if (step == 2) {
      // Written from outside: a writable view of each model's weights halves the first 40. The
      // offloaded optimizer must read them again (model::parameter_version moved).
      auto pa = ma.parameters();
      auto po = mo.parameters();
      for (std::size_t i = 0; i < 40; ++i) {
        pa[i] *= 0.5f;
        po[i] *= 0.5f;
      }
    }
  }
  CHECK(a.steps() >= 7);
}

}  // namespace

TEST_CASE("OffloadedAdamW: fp32, bit for bit AdamW's, with clipping and weights written between steps",
          "[train][optim][offload]") {
  run_alike<fp32>({.lr = 1e-2, .clip_norm = 0.5});
  run_alike<fp32>({.lr = 3e-3, .weight_decay = 0.1});
  // A chunk at a time (7 and 64 divide none of the layers; 10,000 is more than the model has).
  for (std::size_t chunk : {std::size_t(7), std::size_t(64), std::size_t(10000)})
    run_alike<fp32>({.lr = 1e-2, .clip_norm = 0.5}, chunk);
}

TEST_CASE("OffloadedAdamW: mixed bfloat16 and half with a dynamic scale, bit for bit AdamW's, skipped steps included",
          "[train][optim][offload][mixed]") {
  run_alike<mixed<bfloat16, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0});
  run_alike<mixed<half, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0});
  run_alike<mixed<bfloat16, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0}, 13);  // (the compute copy by chunks)
  // (the half run skips the far step: its scaled gradient overflows; checked by hand here)
  model<Net, host, mixed<half, DynamicLossScale>> m(seed{7});
  OffloadedAdamW o(m, {.lr = 1e-2});
  tensor<float> const x = inputs(16, 12);
  tensor<float> far(16, 6);
  for (std::size_t i = 0; i < far.size(); ++i) far[i] = 1e4f;
  m.train_step<MSE>(x, inputs(16, 6, 0.4), o);
  REQUIRE_FALSE(o.last_step_skipped());
  auto const before = weights(m);
  auto const copy_before = compute_weights(m);
  m.train_step<MSE>(x, far, o);
  CHECK(o.last_step_skipped());
  CHECK(o.steps() == 1);
  CHECK(weights(m) == before);
  CHECK(compute_weights(m) == copy_before);
  CHECK(m.scaler().skipped_steps() == 1);
}

TEST_CASE("OffloadedAdamW with the master weights on the host: bit for bit AdamW's",
          "[train][optim][offload][mixed][master]") {
  offload_options const master{.master_weights = true};
  // Clipping, skipped steps under a dynamic scale (the half run's far step), weights written from
  // outside through parameters() (host memory now: the compute copy is cast again), by chunks.
  run_alike<mixed<bfloat16, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0}, 0, master);
  run_alike<mixed<half, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0}, 0, master);
  run_alike<mixed<bfloat16>>({.lr = 3e-3, .weight_decay = 0.1}, 13, master);
  // Gradient accumulation over three micro-batches, with and without the placement.
  run_alike<mixed<bfloat16, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 0.5}, 0, master, 3);
  run_alike<mixed<half, DynamicLossScale>>({.lr = 1e-2}, 0, {}, 3);
}

TEST_CASE("OffloadedAdamW with the gradients on the host: bit for bit AdamW's, accumulation included",
          "[train][optim][offload][gradients]") {
  offload_options const grads{.gradients = gradient_place::host};
  offload_options const both{.master_weights = true, .gradients = gradient_place::host};
  run_alike<fp32>({.lr = 1e-2, .clip_norm = 0.5}, 0, grads);
  run_alike<fp32>({.lr = 3e-3, .weight_decay = 0.1}, 0, grads, 3);
  run_alike<mixed<bfloat16, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0}, 0, grads);
  run_alike<mixed<half, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0}, 13, grads);
  run_alike<mixed<bfloat16, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 1.0}, 0, both);
  run_alike<mixed<half, DynamicLossScale>>({.lr = 1e-2, .clip_norm = 0.5}, 0, both, 3);
  run_alike<mixed<bfloat16>>({.lr = 3e-3, .weight_decay = 0.1}, 13, both, 2);
}

namespace {
// Every storage policy, each over a segment of its own (the budget policy at its leanest), between
// Net's first and last layers.
using Blk = Residual<Seq<LayerNorm<24>, Linear<24, 32>, GELU, Linear<32, 24>>>;
constexpr std::size_t leanest = Budget<std::size_t(1) << 30, 16, Repeat<2, Blk>>::minimum<float>;
using EveryPolicy = Seq<Linear<12, 24>, Checkpointed<Blk>, Selective<Blk>,
                        CheckpointSequential<2, Repeat<3, Blk>, last_run::stored>, Revolve<2, Repeat<3, Blk>>,
                        Offloaded<Blk>, Budget<leanest, 16, Repeat<2, Blk>>, LayerNorm<24>, Linear<24, 6>>;
}  // namespace

TEST_CASE("OffloadedAdamW in full (the gradients and the master weights on the host) under every storage policy: "
          "bit for bit AdamW's",
          "[train][optim][offload][gradients][master][policies]") {
  offload_options const grads{.gradients = gradient_place::host};
  offload_options const both{.master_weights = true, .gradients = gradient_place::host};
  run_alike<fp32, EveryPolicy>({.lr = 1e-2, .clip_norm = 0.5}, 0, grads, 3);
  run_alike<mixed<bfloat16, DynamicLossScale>, EveryPolicy>({.lr = 1e-2, .clip_norm = 0.5}, 0, both, 3);
  run_alike<mixed<half, DynamicLossScale>, EveryPolicy>({.lr = 1e-2, .clip_norm = 1.0}, 0, both);
}

namespace {
// A model of some 340 pages of gradients, 65 of them per layer but the first and last.
using Wide = Seq<Linear<64, 256>, GELU, LayerNorm<256>, Linear<256, 256>, Tanh, Linear<256, 256>, GELU,
                 Linear<256, 256>, Tanh, Linear<256, 256>, GELU, Linear<256, 256>, Tanh, Linear<256, 8>>;

// Its gradients' sum, on the host (o.gradients()) or in a model's buffer, as bytes.
template <class V>
std::vector<unsigned char> sum_of(V const& v) {
  return bytes_of(v);
}
}  // namespace

TEST_CASE("OffloadedAdamW with the gradients on the host: the device holds the pages of one span, as planned",
          "[train][optim][offload][gradients][memory]") {
  auto measure = [](auto precision) {
    using P = decltype(precision);
    using M = model<Wide, host, P>;
    constexpr std::size_t n = M::parameter_count;
    INFO(P::name);
    memory::caching_allocator<host> device, host_side;
    M m(seed{3}, device);
    OffloadedAdamW o(m, {.lr = 1e-3}, {0, n}, &host_side, {.gradients = gradient_place::host});
    // The model's gradient buffer left its allocator; the host holds their sum.
    CHECK(device.stats()[memory::tag::gradients].in_use == 0);
    CHECK(host_side.stats()[memory::tag::gradients].in_use == rounded(n * 4));
    std::size_t const page = o.gradient_pages().page;
    REQUIRE(page >= 4096);
    auto const plan = memory_plan<Wide, P, OffloadedAdamW>(16, {.offload_gradients = true, .gradient_page = page});
    CHECK(plan.gradients == 0);
    CHECK(plan.host_pageable.gradients == rounded(n * 4));
    CHECK(o.gradient_pages().planned_peak == plan.gradient_pages);
    // Two layers' gradients at most (the span coming down and the one backward writes, 65,792
    // each, 257 KiB) and the pages their edges share: below half the buffer's 1.33 MiB.
    CHECK(plan.gradient_pages < rounded(n * 4) / 2);
    CHECK(plan.gradient_pages >= 2 * 65792 * 4);
    tensor<float> const x = inputs(16, 64), t = inputs(16, 8, 0.4);
    for (int step = 0; step < 2; ++step) {
      device.reset_peak();
      host_side.reset_peak();
      m.template train_step<MSE>(x, t, o);
      auto const d = device.stats(), h = host_side.stats();
      for (memory::tag g : memory::all_tags) {
        INFO("step " << step << ", " << memory::name(g));
        CHECK(d[g].peak == plan[g]);
        CHECK(h[g].peak == plan.host_pageable[g]);
      }
      CHECK(d.total.peak == plan.peak);
      CHECK(d.total.reserved == plan.reserved);
      auto const pages = o.gradient_pages();
      CHECK(pages.last_peak == plan.gradient_pages);  // (measured at every report: mincore)
      CHECK(pages.resident <= page);  // (after the pass: the buffer's last page, which it fills in part)
    }
    // Accumulation with the model's failure backup on: a second copy of the sum on the host.
    auto const backed = memory_plan<Wide, P, OffloadedAdamW>(16, {.offload_gradients = true, .offload_gradients_backup = true});
    m.zero_grad();
    m.template accumulate<MSE>(x, t, 0.5);
    m.template accumulate<MSE>(inputs(16, 64, 0.2), t, 0.5);
    CHECK(host_side.stats()[memory::tag::gradients].peak == backed.host_pageable.gradients);
    CHECK(backed.host_pageable.gradients == 2 * rounded(n * 4));
    CHECK(o.gradient_pages().last_peak == plan.gradient_pages);
  };
  measure(fp32{});
  measure(mixed<bfloat16, DynamicLossScale>{});
}

TEST_CASE("OffloadedAdamW with the gradients on the host: a GPT, stored and checkpointed, with dropout and "
          "accumulation, bit for bit AdamW's",
          "[train][optim][offload][gradients][transformer]") {
  // A language model's backward reports in residual branches, attention and embeddings (several
  // reports at one offset, spans of one LayerNorm); three micro-batches a step, so every span but
  // the first pass's finds its sum on the device first.
  auto run = [](auto tag) {
    using G = decltype(tag);
    using P = mixed<bfloat16, DynamicLossScale>;
    model<G, host, P> ma(seed{5}), mo(seed{5});
    AdamW a(ma, {.lr = 3e-3, .clip_norm = 1.0});
    OffloadedAdamW o(mo, {.lr = 3e-3, .clip_norm = 1.0}, {.master_weights = true, .gradients = gradient_place::host});
    auto tokens = [](std::size_t salt) {
      tensor<std::int32_t> ids{3, 10};
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t((i * 7 + salt * 3 + i / 5) % 11);
      return ids;
    };
    for (int step = 0; step < 3; ++step) {
      ma.zero_grad();
      mo.zero_grad();
      for (std::size_t k = 0; k < 3; ++k) {
        double const la = ma.template accumulate<SoftmaxCrossEntropy>(tokens(k), tokens(k + 1), 1.0 / 3);
        double const lo = mo.template accumulate<SoftmaxCrossEntropy>(tokens(k), tokens(k + 1), 1.0 / 3);
        REQUIRE(lo == la);
        REQUIRE(sum_of(o.gradients().view()) == sum_of(ma.gradients()));
      }
      REQUIRE(o.step() == a.step());
      REQUIRE(weights(mo) == weights(ma));
      REQUIRE(compute_weights(mo) == compute_weights(ma));
      REQUIRE(o.gradient_pages().last_peak == o.gradient_pages().planned_peak);
    }
  };
  run(GPT<11, 16, 16, 2, 2, 0.1>{});
  run(GPT<11, 16, 16, 2, 2, 0.1, Checkpointed>{});
}

TEST_CASE("OffloadedAdamW with the gradients on the host: a failed pass leaves their sum as it was",
          "[train][optim][offload][gradients][faults]") {
  // Every request of the second micro-batch's pass fails in turn (the arena off, so that each
  // activation is a request): the host's sum is the first micro-batch's, bit for bit, and the
  // pass repeated ends where the model's own gradients end.
  using P = mixed<bfloat16, DynamicLossScale>;
  using M = model<Wide, host, P>;
  memory::caching_allocator<host> device;
  M ma(seed{5}), mo(seed{5}, device);
  mo.use_planned_arena(false);
  OffloadedAdamW o(mo, {}, {.gradients = gradient_place::host});
  tensor<float> const x0 = inputs(8, 64), x1 = inputs(8, 64, 0.3), t = inputs(8, 8, 0.4);
  ma.zero_grad();
  ma.accumulate<MSE>(x0, t, 0.5);
  auto const first = sum_of(ma.gradients());
  ma.accumulate<MSE>(x1, t, 0.5);
  auto const both = sum_of(ma.gradients());
  std::size_t requests = 0;
  {  // (counted once, on a pass that succeeds)
    mo.zero_grad();
    mo.accumulate<MSE>(x0, t, 0.5);
    std::size_t const before = device.stats().requests;
    mo.accumulate<MSE>(x1, t, 0.5);
    requests = device.stats().requests - before;
    REQUIRE(sum_of(o.gradients().view()) == both);
  }
  REQUIRE(requests > 4);
  for (std::size_t k = 1; k <= requests; ++k) {
    INFO("request " << k << " of " << requests);
    mo.zero_grad();
    mo.accumulate<MSE>(x0, t, 0.5);
    REQUIRE(sum_of(o.gradients().view()) == first);
    device.fail_request(k);
    CHECK_THROWS_AS(mo.accumulate<MSE>(x1, t, 0.5), out_of_memory);
    device.fail_request(0);
    CHECK(sum_of(o.gradients().view()) == first);
    mo.accumulate<MSE>(x1, t, 0.5);
    CHECK(sum_of(o.gradients().view()) == both);
    // A failure in a pass after zero_grad leaves zero.
    mo.zero_grad();
    device.fail_request(k);
    CHECK_THROWS_AS(mo.accumulate<MSE>(x1, t, 0.5), out_of_memory);
    device.fail_request(0);
    CHECK(sum_of(o.gradients().view()) == std::vector<unsigned char>(first.size(), 0));
  }
}

TEST_CASE("OffloadedAdamW with the gradients on the host: the model's gradients come back with the optimizer gone, "
          "and other optimizers are refused",
          "[train][optim][offload][gradients][errors]") {
  using M = model<Wide>;
  M m(seed{2});
  tensor<float> const x = inputs(8, 64), t = inputs(8, 8, 0.4);
  std::vector<unsigned char> sum;
  {
    OffloadedAdamW o(m, {}, {.gradients = gradient_place::host});
    CHECK_THROWS_WITH(AdamW(m), Catch::Contains("gradients live in host memory"));
    CHECK_THROWS_WITH(SGD(m), Catch::Contains("gradients live in host memory"));
    CHECK_THROWS_WITH(OffloadedAdamW(m, {}, {.gradients = gradient_place::host}),
                      Catch::Contains("found its gradients on the host already"));
    m.zero_grad();
    m.accumulate<MSE>(x, t);
    sum = sum_of(o.gradients().view());
    CHECK(sum_of(m.gradients()) == std::vector<unsigned char>(sum.size(), 0));
  }
  CHECK(sum_of(m.gradients()) == sum);
  CHECK(m.link().gradient_sync() == nullptr);
  AdamW a(m);  // (the model is its own again)
  m.train_step<MSE>(x, t, a);
  CHECK_THROWS_WITH(OffloadedAdamW(m, {}, {0, 10}, nullptr, {.gradients = gradient_place::host}),
                    Catch::Contains("expects the model's whole range"));
  OffloadedAdamW without(m);
  CHECK_THROWS_AS(without.gradients(), argument_error);
  CHECK(without.gradient_pages().planned_peak == 0);
}

TEST_CASE("OffloadedAdamW with the master weights on the host: the device keeps the compute copy only",
          "[train][optim][offload][memory][master]") {
  using P = Mixed;
  constexpr std::size_t n = n_mixed;
  memory::caching_allocator<host> device, host_side;
  model<Net, host, P> m(seed{1}, device);
  REQUIRE(device.stats()[memory::tag::parameters].in_use == rounded(n * 4) + rounded(n * 2));
  auto const before = weights(m);
  {
    OffloadedAdamW o(m, {}, {0, n}, &host_side, {.master_weights = true});
    // The device's fp32 weights are given back (not kept in its cache); the host holds them and
    // the moments, no second fp32 copy (a host model's gradients and compute copy are read and
    // written in place).
    CHECK(device.stats()[memory::tag::parameters].in_use == rounded(n * 2));
    CHECK(device.stats()[memory::tag::parameters].reserved == rounded(n * 2));
    CHECK(host_side.stats()[memory::tag::parameters].in_use == rounded(n * 4));
    CHECK(host_side.stats()[memory::tag::optimizer_state].in_use == 2 * rounded(n * 4));
    CHECK(host_side.stats()[memory::tag::gradients].in_use == 0);
    CHECK(weights(m) == before);
    CHECK(o.master_weights().data() == m.parameters().data());
    m.train_step<MSE>(inputs(16, 12), inputs(16, 6, 0.4), o);
    CHECK(weights(m) != before);
  }
  // The placement is the model's for its life: it trains on with a second offloaded optimizer.
  CHECK(m.master_on_host());
  CHECK(host_side.stats()[memory::tag::parameters].in_use == rounded(n * 4));
  CHECK(host_side.stats()[memory::tag::optimizer_state].in_use == 0);
  OffloadedAdamW again(m, {}, {.master_weights = true});
  auto const kept = weights(m);
  m.train_step<MSE>(inputs(16, 12), inputs(16, 6, 0.4), again);
  CHECK(weights(m) != kept);
}

TEST_CASE("A model built with its master weights in host memory: never on the device, trained as AdamW trains",
          "[train][optim][offload][memory][master]") {
  using P = Mixed;
  constexpr std::size_t n = n_mixed;
  memory::caching_allocator<host> device, host_side;
  model<Net, host, P> ma(seed{7});
  model<Net, host, P> mo(seed{7}, device, host_master_weights{host_side});
  CHECK(mo.master_on_host());
  CHECK(weights(mo) == weights(ma));  // (initialised in place, to the same values)
  CHECK(device.stats()[memory::tag::parameters].peak == rounded(n * 2));
  CHECK(host_side.stats()[memory::tag::parameters].in_use == rounded(n * 4));
  AdamW a(ma, {.lr = 1e-2, .clip_norm = 1.0});
  OffloadedAdamW o(mo, {.lr = 1e-2, .clip_norm = 1.0}, {0, n}, &host_side);  // (it updates them there)
  CHECK(o.offloads_master_weights());
  tensor<float> const x = inputs(16, 12);
  tensor<float> const t = inputs(16, 6, 0.4);
  for (int step = 0; step < 5; ++step) {
    CHECK(mo.train_step<MSE>(x, t, o) == ma.train_step<MSE>(x, t, a));
    require_same(ma, a, mo, o, "after step " + std::to_string(step));
  }
  // The device never held the fp32 master weights.
  CHECK(device.stats()[memory::tag::parameters].peak == rounded(n * 2));
}

TEST_CASE("OffloadedAdamW refuses to move an fp32 model's master weights, and changes nothing",
          "[train][optim][offload][errors][master]") {
  memory::caching_allocator<host> device;
  model<Net> m(seed{1}, device);
  auto const before = weights(m);
  auto const held = device.stats().total;
  CHECK_THROWS_WITH(OffloadedAdamW(m, {}, {.master_weights = true}),
                    Catch::Contains("master_weights expects a mixed-precision model"));
  CHECK_FALSE(m.master_on_host());
  CHECK(weights(m) == before);
  CHECK(device.stats().total.in_use == held.in_use);
  step_options const master{.offload_master_weights = true};
  CHECK_THROWS_AS((memory_plan<Net, fp32, OffloadedAdamW>(16, master)), argument_error);
}

TEST_CASE("OffloadedAdamW keeps no optimizer state on the model's allocator", "[train][optim][offload][memory]") {
  using P = Mixed;
  constexpr std::size_t n = n_mixed;
  memory::caching_allocator<host> with_adamw, with_offloaded, host_side;
  model<Net, host, P> ma(seed{1}, with_adamw), mo(seed{1}, with_offloaded);
  AdamW a(ma);
  OffloadedAdamW o(mo, {}, {0, n}, &host_side);
  tensor<float> const x = inputs(16, 12);
  tensor<float> const t = inputs(16, 6, 0.4);
  ma.train_step<MSE>(x, t, a);
  mo.train_step<MSE>(x, t, o);
  // AdamW: two moments of n fp32 values beside the model. Offloaded: none; its host allocator holds
  // the moments and the weights' copy (a host model's gradients and compute copy are read and
  // written in place: nothing is staged for them).
  CHECK(with_adamw.stats()[memory::tag::optimizer_state].in_use == 2 * rounded(n * 4));
  CHECK(with_offloaded.stats()[memory::tag::optimizer_state].in_use == 0);
  CHECK(with_offloaded.stats()[memory::tag::parameters].in_use == with_adamw.stats()[memory::tag::parameters].in_use);
  CHECK(host_side.stats()[memory::tag::optimizer_state].in_use == 3 * rounded(n * 4));
  CHECK(host_side.stats()[memory::tag::gradients].in_use == 0);
  CHECK(&o.host_allocator() == &host_side);
  // On the host what crosses to the device is staged in the host allocator itself.
  CHECK(&o.staging_allocator() == &host_side);
}

TEST_CASE("OffloadedAdamW and AdamW resume from each other's files", "[train][optim][offload][io]") {
  using P = mixed<bfloat16, DynamicLossScale>;
  std::string const dir = std::string(REMAT_TEST_BINARY_DIR) + "/";
  std::string const weights_file = dir + "offload_weights.safetensors";
  std::string const state_a = dir + "offload_adamw.safetensors";
  std::string const state_o = dir + "offload_offloaded.safetensors";
  std::string const other_file = dir + "offload_other.safetensors";
  tensor<float> const x = inputs(16, 12);
  tensor<float> const t = inputs(16, 6, 0.4);

  // A run of AdamW, saved after 3 steps, then 3 more.
  model<Net, host, P> ref(seed{9});
  AdamW a(ref, {.lr = 1e-2});
  for (int i = 0; i < 3; ++i) ref.train_step<MSE>(x, t, a);
  save(ref, weights_file);
  save(a, state_a);
  for (int i = 0; i < 3; ++i) ref.train_step<MSE>(x, t, a);

  // An offloaded optimizer built first, then the weights and its state loaded: the weights are
  // read again before its first step, and the last 3 steps are AdamW's, bit for bit. With the
  // master weights on the host, load writes them there and the compute copy is cast again; with
  // the gradients on the host, their sum starts from zero there.
  struct placement {
    bool master, gradients;
  };
  // (the last one without either: the way back rewrites the weights' file)
  for (auto const [on_host, gradients_on_host] :
       {placement{true, false}, placement{true, true}, placement{false, true}, placement{false, false}}) {
  INFO("master weights on the host: " << on_host << ", gradients on the host: " << gradients_on_host);
  model<Net, host, P> m(seed{2});
  OffloadedAdamW o(m, {.lr = 1e-2}, {.master_weights = on_host,
                                     .gradients = gradients_on_host ? gradient_place::host : gradient_place::device});
  load(m, weights_file);
  load(o, state_a);
  CHECK(o.steps() == 3);
  for (int i = 0; i < 3; ++i) m.train_step<MSE>(x, t, o);
  CHECK(weights(m) == weights(ref));
  CHECK(compute_weights(m) == compute_weights(ref));
  CHECK(bytes_of(o.exp_avg().view()) == bytes_of(a.exp_avg().view()));

  if (on_host || gradients_on_host) continue;  // (the way back reads the same files)
  // And back: the offloaded state loaded into an AdamW continues as the offloaded one does.
  save(o, state_o);
  model<Net, host, P> back(seed{3});
  save(m, weights_file);
  load(back, weights_file);
  AdamW b(back, {.lr = 1e-2});
  load(b, state_o);
  CHECK(back.scaler().scale() == m.scaler().scale());
  m.train_step<MSE>(x, t, o);
  back.train_step<MSE>(x, t, b);
  CHECK(weights(back) == weights(m));
  CHECK(bytes_of(b.exp_avg_sq().view()) == bytes_of(o.exp_avg_sq().view()));

  // A file for another model is refused and changes nothing.
  using Other = Seq<Linear<12, 6>>;
  model<Other> other(seed{1});
  AdamW oa(other);
  save(oa, other_file);
  auto const moments = bytes_of(o.exp_avg().view());
  CHECK_THROWS_AS(load(o, other_file), io_error);
  CHECK(bytes_of(o.exp_avg().view()) == moments);
  CHECK(o.steps() == 7);
  }
  for (auto const& f : {weights_file, state_a, state_o, other_file}) std::remove(f.c_str());
}

TEST_CASE("OffloadedAdamW refuses a range outside the model", "[train][optim][offload][errors]") {
  model<Net> m(seed{1});
  constexpr std::size_t n = model<Net>::parameter_count;
  CHECK_THROWS_WITH(OffloadedAdamW(m, {}, {0, n + 1}),
                    Catch::Contains("expected a range of the model's") && Catch::Contains(std::to_string(n + 1)));
  CHECK_THROWS_AS(OffloadedAdamW(m, {}, {5, 4}), argument_error);
}
