// surrogate: a convolutional network learns one time step of a simulation, beside the solver that
// made its data. No download: the example solves the PDE itself.
//
// The simulation: Gray–Scott reaction–diffusion of two species u and v on a G x G grid
// (gray_scott.hpp: spots that grow and split, in a reservoir of fresh feed u = 1, v = 0). Runs
// start from u = 1, v = 0 with random squares of u = 0.5, v = 0.25, and are sampled every 40 steps
// after a burn-in. (examples/online trains the same network while the solver runs.)
//
// The task: from the state at time t, the state `Steps` solver steps later (4 by default). The
// network reads (u - 1, v) scaled, so its first convolution's zero padding is the reservoir
// exactly, and predicts the increment, scaled by the training set's RMS increment; the prediction
// is the current state plus it.
// The baseline is persistence (next state = current state): its error is the increment itself.
//
// The model: a residual convolutional network at full resolution,
//   Conv3x3(2 -> 16) GELU, Blocks x [x + Conv3x3(GELU(BN(Conv3x3(x))))], Conv3x3(16 -> 2),
// BatchNorm2d's running statistics used for validation (inference). AdamW, warm-up + cosine.
// Prints a progress bar, the validation error against the solver and against persistence, the
// activation plans stored and checkpointed, and then shows a budget that only checkpointing fits:
// the same model on a 128² grid at batch 32, under an allocator limit between the two plans.
//
//   surrogate [--steps 400] [--batch 16] [--runs 12] [--ahead 4] [--checkpoint] [--bf16] [--seed 1] [--quick]
//
// --bf16 trains in mixed<bfloat16>: activations and the weights' compute copy in bfloat16
// (oneDNN's bf16 convolutions where the processor has them), master weights, gradients, AdamW's
// state and BatchNorm's running statistics in fp32.
//
// Exits non-zero unless the validation error is at most half of persistence's (relative RMSE of
// the next state <= 0.5), or the budget demonstration fails. On an Intel Xeon with 2 cores the
// default run (400 steps, 29 s stored, 40 s checkpointed) reaches 0.225 either way (checkpointing
// changes no value), --quick (150 steps) 0.30.
#include "gray_scott.hpp"
#include "network.hpp"

#include <remat/remat.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t Width = 16;  // channels of the hidden layers

template <std::size_t G>
using nets = gray_scott_surrogate<G, Width, 3>;  // (network.hpp)

// ---- the solver (gray_scott.hpp), in vectors

struct gray_scott_run {
  std::size_t g;
  std::vector<double> u, v, nu, nv;
  gray_scott_run(std::size_t grid, std::uint64_t seed, std::uint64_t run)
      : g(grid), u(grid * grid), v(grid * grid), nu(grid * grid), nv(grid * grid) {
    gray_scott::start(u.data(), v.data(), g, seed, run);
  }
  void step() {
    gray_scott::step(u.data(), v.data(), nu.data(), nv.data(), g);
    u.swap(nu);
    v.swap(nv);
  }
};

// Input scale (the network sees O(1) numbers; 0 is the reservoir's state).
constexpr double in_scale = 3.0;

struct dataset {
  std::size_t g = 0, count = 0;
  double du_scale = 1;  // the increments are multiplied by this: 1 / their RMS over the training set
  std::vector<float> x, y;  // count x (2 G²): scaled (u - 1, v); count x (2 G²): scaled increments
  std::vector<double> now, next;  // the states themselves (for the errors)
};

dataset simulate(std::size_t g, std::size_t runs, std::uint64_t seed, std::uint64_t first_run, std::size_t steps_ahead,
                 std::size_t per_run) {
  dataset d;
  d.g = g;
  std::size_t const n = g * g;
  for (std::size_t r = 0; r < runs; ++r) {
    gray_scott_run s(g, seed, first_run + r);
    for (std::size_t t = 0; t < 200; ++t) s.step();  // burn-in
    for (std::size_t k = 0; k < per_run; ++k) {
      for (std::size_t t = 0; t < 40; ++t) s.step();
      std::vector<double> const u0 = s.u, v0 = s.v;
      gray_scott_run ahead = s;
      for (std::size_t t = 0; t < steps_ahead; ++t) ahead.step();
      for (std::size_t i = 0; i < n; ++i) {
        d.x.push_back(float((u0[i] - 1) * in_scale));
        d.now.push_back(u0[i]);
        d.next.push_back(ahead.u[i]);
        d.y.push_back(float(ahead.u[i] - u0[i]));
      }
      for (std::size_t i = 0; i < n; ++i) {
        d.x.push_back(float(v0[i] * in_scale));
        d.now.push_back(v0[i]);
        d.next.push_back(ahead.v[i]);
        d.y.push_back(float(ahead.v[i] - v0[i]));
      }
      ++d.count;
    }
  }
  double sq = 0;
  for (float y : d.y) sq += double(y) * double(y);
  d.du_scale = 1.0 / std::sqrt(sq / double(d.y.size()));
  for (float& y : d.y) y = float(double(y) * d.du_scale);
  return d;
}

// Relative RMSE of the model's next state against the solver's, and persistence's (which is 1 by
// this measure's definition: its error is the increment). Inference: BatchNorm's running statistics.
template <class Net, class P>
double validation_error(model<Net, host, P> const& m, dataset const& d, double du_scale) {
  std::size_t const w = 2 * d.g * d.g, chunk = 16;
  double err = 0, base = 0;
  for (std::size_t first = 0; first < d.count; first += chunk) {
    std::size_t const rows = std::min(chunk, d.count - first);
    tensor<float> x{index_t(rows), index_t(w)};
    std::memcpy(x.data(), d.x.data() + first * w, rows * w * sizeof(float));
    auto const y = m.forward(x);  // (16-bit under mixed precision)
    for (std::size_t i = 0; i < rows * w; ++i) {
      std::size_t const k = first * w + i;
      double const predicted = d.now[k] + double(float(y.data()[i])) / du_scale;  // (the training set's scale)
      err += (predicted - d.next[k]) * (predicted - d.next[k]);
      base += (d.now[k] - d.next[k]) * (d.now[k] - d.next[k]);
    }
  }
  return std::sqrt(err / base);
}

struct options {
  std::size_t steps = 400, batch = 16, runs = 12, ahead = 4;
  std::uint64_t seed = 1;
  bool checkpoint = false, quick = false, bf16 = false;
};

template <class Net, class P>
double train(options const& o, dataset const& train_set, dataset const& val) {
  memory::caching_allocator<host> alloc;
  model<Net, host, P> m(seed{o.seed}, alloc);
  AdamW opt(m, {.lr = 1e-2, .weight_decay = 1e-4});
  warmup_cosine schedule{.base_lr = 1e-2, .warmup = o.steps / 20 + 1, .total = o.steps, .min_lr = 1e-5};
  std::size_t const w = 2 * train_set.g * train_set.g;
  tensor<float> x(index_t(o.batch), index_t(w)), t(index_t(o.batch), index_t(w));
  bool const tty = isatty(fileno(stdout));
  std::printf("validation error at start %.3f (persistence 1.000)\n", validation_error(m, val, train_set.du_scale));
  auto const t0 = std::chrono::steady_clock::now();
  double smooth = 0;
  std::size_t const every = std::max<std::size_t>(1, o.steps / 5);
  for (std::size_t s = 0; s < o.steps; ++s) {
    for (std::size_t r = 0; r < o.batch; ++r) {
      std::size_t const k = std::size_t(philox::uniform(o.seed, 7, s * o.batch + r) * double(train_set.count));
      std::memcpy(x.data() + r * w, train_set.x.data() + k * w, w * sizeof(float));
      std::memcpy(t.data() + r * w, train_set.y.data() + k * w, w * sizeof(float));
    }
    opt.set_lr(schedule(opt.steps()));
    double const l = m.template train_step<MSE>(x, t, opt);
    smooth = s == 0 ? l : 0.95 * smooth + 0.05 * l;
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int const done = int(30 * (s + 1) / o.steps);
    if (tty) {
      std::printf("\rstep %4zu/%zu [%.*s%.*s] loss %.4f  %5.1f samples/s", s + 1, o.steps, done,
                  "##############################", 30 - done, "------------------------------", smooth,
                  double((s + 1) * o.batch) / seconds);
      std::fflush(stdout);
    }
    if ((s + 1) % every == 0 || s + 1 == o.steps)
      std::printf("%sstep %4zu/%zu  train loss %.4f  validation error %.3f  %.1f samples/s  peak %s\n",
                  tty ? "\r" : "", s + 1, o.steps, smooth, validation_error(m, val, train_set.du_scale),
                  double((s + 1) * o.batch) / seconds, memory::format_bytes(alloc.stats().total.peak).c_str());
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double const e = validation_error(m, val, train_set.du_scale);
  std::printf("\nvalidation error %.3f of persistence's (relative RMSE of the next state) after %zu steps, %.0f s\n",
              e, o.steps, seconds);
  auto const plan = memory_plan<Net, P, AdamW>(o.batch);
  std::printf("this run's step (%s): activations %s measured, %s planned (%s)\n", P::name,
              memory::format_bytes(alloc.stats()[memory::tag::activations].peak).c_str(),
              memory::format_bytes(plan.activations.peak_bytes).c_str(), o.checkpoint ? "checkpointed" : "stored");
  // The validation passes (forwards of up to 16 states) run in the step's arena: the program's plan
  // is the step's with the arena as large as the largest layout.
  std::size_t const chunk = std::min<std::size_t>(16, val.count), last = val.count % 16;
  std::size_t const arena = std::max({plan.arena, forward_plan<Net, P>(forward_kind::inference, chunk).bytes,
                                      last ? forward_plan<Net, P>(forward_kind::inference, last).bytes : 0});
  std::size_t const planned = plan.reserved - plan.arena + arena;
  auto const st = alloc.stats();
  std::printf("reserved as planned: activations %s of %s, in all %s of %s\n",
              memory::format_bytes(st[memory::tag::activations].reserved).c_str(), memory::format_bytes(arena).c_str(),
              memory::format_bytes(st.total.reserved).c_str(), memory::format_bytes(planned).c_str());
  if (st[memory::tag::activations].reserved != arena || st.total.reserved != planned) {
    std::fprintf(stderr, "surrogate: the memory reserved differs from the plan\n");
    return 1e9;  // (the caller's bar fails)
  }
  return e;
}

// The budget: at 128² and batch 32 the stored model's step needs more than the limit, the
// checkpointed one less; both are tried under it.
int budget_demo() {
  using n = nets<128>;
  constexpr std::size_t batch = 32, g = 128;
  constexpr auto stored = memory_plan<n::stored, fp32, AdamW>(batch);
  constexpr auto ckpt = memory_plan<n::checkpointed, fp32, AdamW>(batch);
  static_assert(ckpt.reserved < stored.reserved, "checkpointing must lower the 128² step's plan");
  std::size_t const limit = (stored.reserved + ckpt.reserved) / 2;
  std::printf("\na budget only checkpointing fits: grid %zu², batch %zu, allocator limit %s\n", g, batch,
              memory::format_bytes(limit).c_str());
  std::printf("  plan, stored:       %s\n  plan, checkpointed: %s\n", stored.describe().c_str(),
              ckpt.describe().c_str());
  tensor<float> x(index_t(batch), index_t(2 * g * g)), t(index_t(batch), index_t(2 * g * g));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(philox::uniform(3, 0, i)) - 0.5f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0;
  bool stored_failed = false;
  {
    memory::caching_allocator<host> alloc(limit);
    model<n::stored> m(seed{1}, alloc);
    AdamW opt(m, {.lr = 1e-3});
    try {
      m.train_step<MSE>(x, t, opt);
    } catch (out_of_memory const& e) {
      stored_failed = true;
      std::string const what = e.what();
      std::printf("  stored:       out of memory, as planned: %s\n", what.substr(0, what.find('\n')).c_str());
    }
  }
  memory::caching_allocator<host> alloc(limit);
  model<n::checkpointed> m(seed{1}, alloc);
  AdamW opt(m, {.lr = 1e-3});
  m.train_step<MSE>(x, t, opt);
  std::printf("  checkpointed: trains; reserved %s of %s (plan %s)\n",
              memory::format_bytes(alloc.stats().total.reserved).c_str(), memory::format_bytes(limit).c_str(),
              memory::format_bytes(ckpt.reserved).c_str());
  return stored_failed && alloc.stats().total.reserved == ckpt.reserved ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--steps") o.steps = std::stoul(next());
    else if (a == "--batch") o.batch = std::stoul(next());
    else if (a == "--runs") o.runs = std::stoul(next());
    else if (a == "--seed") o.seed = std::stoull(next());
    else if (a == "--ahead") o.ahead = std::stoul(next());
    else if (a == "--checkpoint") o.checkpoint = true;
    else if (a == "--quick") o.quick = true;
    else if (a == "--bf16") o.bf16 = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--steps 400] [--batch 16] [--runs 12] [--ahead 4] [--checkpoint] [--bf16] [--seed 1] "
                   "[--quick]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.quick) {
    o.steps = 150;
    o.runs = 6;
  }
  if (o.batch == 0 || o.steps == 0 || o.runs == 0 || o.ahead == 0) {
    std::fprintf(stderr, "surrogate: steps, batch, runs and ahead must be positive\n");
    return 2;
  }
  constexpr std::size_t g = 64;
  std::size_t const ahead = o.ahead;
  using n = nets<g>;
  std::printf("Gray-Scott on a %zu² grid, %zu solver steps ahead; %zu training runs, 3 validation runs\n", g, ahead,
              o.runs);
  dataset const train_set = simulate(g, o.runs, o.seed, 0, ahead, 12);
  dataset const val = simulate(g, 3, o.seed, 1000, ahead, 8);
  std::printf("%zu training samples, %zu validation samples\n", train_set.count, val.count);
  std::printf("model: %zu residual blocks of %zu channels, %zu parameters; %s; %s\n", n::blocks, Width,
              std::size_t(model<n::stored>::parameter_count),
              o.checkpoint ? "every block checkpointed" : "activations stored",
              o.bf16 ? "mixed<bfloat16> (bf16 activations, fp32 master weights)" : "fp32");
  using B = mixed<bfloat16>;
  double const e = o.bf16 ? (o.checkpoint ? train<n::checkpointed, B>(o, train_set, val)
                                          : train<n::stored, B>(o, train_set, val))
                          : (o.checkpoint ? train<n::checkpointed, fp32>(o, train_set, val)
                                          : train<n::stored, fp32>(o, train_set, val));

  constexpr auto stored = activation_plan<n::stored>(16), ckpt = activation_plan<n::checkpointed>(16);
  constexpr auto stored16 = activation_plan<n::stored, mixed<bfloat16>>(16),
                 ckpt16 = activation_plan<n::checkpointed, mixed<bfloat16>>(16);
  std::printf("\nactivation plans at %zu², batch 16: stored %s, checkpointed %s (%.1fx less); in bf16 %s and %s\n",
              g, memory::format_bytes(stored.peak_bytes).c_str(), memory::format_bytes(ckpt.peak_bytes).c_str(),
              double(stored.peak_bytes) / double(ckpt.peak_bytes), memory::format_bytes(stored16.peak_bytes).c_str(),
              memory::format_bytes(ckpt16.peak_bytes).c_str());
  int const budget = budget_demo();
  constexpr double bar = 0.5;
  if (e > bar) {
    std::printf("FAILED: validation error %.3f above %.2f of persistence's\n", e, bar);
    return 1;
  }
  std::printf("\nthe surrogate's error is %.3f of persistence's (bar: %.2f)\n", e, bar);
  return budget;
}
