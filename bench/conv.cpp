// The convolutional benchmark's remat side (bench/compare_conv.py runs it beside PyTorch): a
// ResNet stack of basic blocks at 64 channels on 64 x 64 images,
//   block(x) = ReLU(x + BN(Conv3x3(ReLU(BN(Conv3x3(x)))))),
// after a 3 -> 64 stem (Conv3x3, BN, ReLU) and before a head (global average pool, Linear 64 -> 10),
// MSE against a fixed target, AdamW, fp32. Policies: stored, checkpoint (every block checkpointed).
//
//   bench_conv --blocks 8|16 --policy stored|checkpoint [--batch 32] [--steps 3] [--warmup 1] [--size 64]
//              [--profile]
//
// --profile: after the timed steps, as many again with remat::profile on, and where a step's time
// goes per phase (bench/profile_table.hpp; the convolutions count as products).
//
// Prints one JSON line: the median step time, the activations' measured peak and the plan's, and
// what the forward kept (saved activation bytes).
#include <remat/remat.hpp>

#include "profile_table.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t C = 64;

template <std::size_t S>
struct nets {
  using Block = Seq<Residual<Seq<Conv2d<C, C, 3, S, S, 1, 1, false>, BatchNorm2d<C, S, S>, ReLU,
                                 Conv2d<C, C, 3, S, S, 1, 1, false>, BatchNorm2d<C, S, S>>>,
                    ReLU>;
  template <class Middle>
  using Net = Seq<Conv2d<3, C, 3, S, S, 1, 1, false>, BatchNorm2d<C, S, S>, ReLU, Middle, AvgPool2d<C, S, S, S>,
                  Linear<C, 10>>;
};

bool want_profile = false;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class Net, std::size_t S>
int run(char const* policy, std::size_t blocks, std::size_t batch, int steps, int warmup) {
  memory::caching_allocator<host> alloc;
  model<Net> m(seed{1}, alloc);
  AdamW opt(m, {.lr = 1e-3});
  tensor<float> x(index_t(batch), index_t(3 * S * S)), t(index_t(batch), 10);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 2.0f * float(philox::uniform(5, 0, i)) - 1.0f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(philox::uniform(5, 1, i));
  std::vector<double> times;
  double loss = 0;
  std::size_t peak = 0;
  for (int k = 0; k < warmup + steps; ++k) {
    alloc.reset_peak();
    double const t0 = now();
    loss = m.template train_step<MSE>(x, t, opt);
    double const t1 = now();
    if (k >= warmup) times.push_back(t1 - t0);
    peak = alloc.stats()[memory::tag::activations].peak;
  }
  if (want_profile) {  // more steps, profiled (so the timed ones above carry no profiling cost)
    profile::enable();
    for (int k = 0; k < steps; ++k) (void)m.template train_step<MSE>(x, t, opt);
    bench_profile::print(profile::read(), steps, policy, blocks, batch, "resnet");
    profile::enable(false);
  }
  std::sort(times.begin(), times.end());
  double const step = times[times.size() / 2];
  auto const plan = activation_plan<Net>(batch);
  // Multiply-adds of the convolutions: 2 per block and the stem, forward; training ~3x.
  double const conv_flop = 2.0 * double(batch) * S * S * 9 * C * (2.0 * C * double(blocks) + 3.0);
  std::printf(
      "{\"library\": \"remat\", \"policy\": \"%s\", \"blocks\": %zu, \"batch\": %zu, \"size\": %zu, "
      "\"channels\": %zu, \"threads\": %s, \"steps\": %d, \"step_s\": %.6f, \"conv_gflops\": %.2f, "
      "\"peak_activation_bytes\": %zu, \"planned_peak_bytes\": %zu, \"saved_activation_bytes\": %zu, "
      "\"planned_saved_bytes\": %zu, \"recomputed_block_forwards\": %llu, \"loss\": %.6f}\n",
      policy, blocks, batch, S, C, std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "null", steps,
      step, 3 * conv_flop / step * 1e-9, peak, plan.peak_bytes, m.last_pass().saved_bytes, plan.saved_bytes,
      static_cast<unsigned long long>(m.last_pass().recomputed), loss);
  return peak == plan.peak_bytes ? 0 : 3;
}

template <std::size_t S, std::size_t N>
int dispatch(std::string const& policy, std::size_t batch, int steps, int warmup) {
  using n = nets<S>;
  if (policy == "stored")
    return run<typename n::template Net<Repeat<N, typename n::Block>>, S>("stored", N, batch, steps, warmup);
  if (policy == "checkpoint")
    return run<typename n::template Net<Repeat<N, Checkpointed<typename n::Block>>>, S>("checkpoint", N, batch,
                                                                                         steps, warmup);
  std::fprintf(stderr, "unknown policy %s (stored or checkpoint)\n", policy.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t blocks = 8, batch = 32, size = 64;
  int steps = 3, warmup = 1;
  std::string policy = "stored";
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--blocks") blocks = std::stoul(next());
    else if (a == "--batch") batch = std::stoul(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--size") size = std::stoul(next());
    else if (a == "--policy") policy = next();
    else if (a == "--profile") want_profile = true;
    else {
      std::fprintf(stderr, "usage: %s --blocks 2|8|16 --policy stored|checkpoint [--batch 32] [--size 64|32] "
                           "[--steps 3] [--warmup 1] [--profile]\n", argv[0]);
      return 2;
    }
  }
  if (batch == 0 || steps <= 0) return 2;
  auto by_blocks = [&]<std::size_t S>() {
    switch (blocks) {
      case 2: return dispatch<S, 2>(policy, batch, steps, warmup);
      case 8: return dispatch<S, 8>(policy, batch, steps, warmup);
      case 16: return dispatch<S, 16>(policy, batch, steps, warmup);
      default: std::fprintf(stderr, "blocks must be 2, 8 or 16\n"); return 2;
    }
  };
  if (size == 64) return by_blocks.template operator()<64>();
  if (size == 32) return by_blocks.template operator()<32>();
  std::fprintf(stderr, "size must be 64 or 32\n");
  return 2;
}
