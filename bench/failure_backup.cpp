// What accumulate's failure backup costs: gradient accumulation over k micro-batches, where every
// micro-batch after the first copies the gradients (the model's parameter count, fp32) to the
// offload allocator before its pass so that a pass that fails restores them bit for bit
// (model::set_failure_backup). The residual MLP of bench/policies.cpp (d = 1024), checkpointed,
// AdamW; interleaved rounds with the backup on and off in one run, median step times and their
// ratio (these machines are shared; ratios, not absolute times, carry over).
//
//   bench_failure_backup [--blocks 8] [--batch 64] [--micro 4] [--rounds 5]
//
// Prints a markdown table and `json: ` lines.
#include <remat/remat.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t D = 1024, Out = 16;
using Block = Residual<Seq<LayerNorm<D>, Linear<D, D>, GELU, Linear<D, D>>>;

template <std::size_t N>
int run(std::size_t batch, int micro, int rounds) {
  using Net = Seq<Repeat<N, Checkpointed<Block>>, Linear<D, Out>>;
  model<Net> m(seed{1});
  AdamW opt(m, {.lr = 1e-4});
  tensor<float> x{index_t(batch), index_t(D)}, t{index_t(batch), index_t(Out)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.01 * double(i)));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(std::cos(0.03 * double(i)));
  auto step = [&] {
    m.zero_grad();
    for (int k = 0; k < micro; ++k) m.template accumulate<MSE>(x, t, 1.0 / micro);
    opt.step();
  };
  using clock = std::chrono::steady_clock;
  auto timed = [&](bool backup) {
    m.set_failure_backup(backup);
    auto const a = clock::now();
    step();
    return std::chrono::duration<double>(clock::now() - a).count();
  };
  step();  // (warm-up: the arena, the caches)
  std::vector<double> on, off;
  for (int r = 0; r < rounds; ++r) {
    off.push_back(timed(false));
    on.push_back(timed(true));
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double const mib = double(model<Net>::parameter_count) * 4.0 / 1048576.0;
  std::printf("Gradient accumulation, %zu checkpointed blocks of d = %zu, %d micro-batches of %zu, AdamW "
              "(%.1f MiB of gradients; %d copies per step with the backup on):\n\n",
              N, D, micro, batch, mib, micro - 1);
  std::printf("| failure backup | step time (median of %d) | relative |\n|---|---:|---:|\n", rounds);
  std::printf("| off | %.3f s | 1.000x |\n", med(off));
  std::printf("| on (the default) | %.3f s | %.3fx |\n", med(on), med(on) / med(off));
  std::printf("json: {\"bench\": \"failure_backup\", \"blocks\": %zu, \"batch\": %zu, \"micro\": %d, "
              "\"gradient_mib\": %.2f, \"off_s\": %.6f, \"on_s\": %.6f, \"ratio\": %.4f}\n",
              N, batch, micro, mib, med(off), med(on), med(on) / med(off));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t blocks = 8, batch = 64;
  int micro = 4, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const a = argv[i];
    long const v = std::atol(argv[i + 1]);
    if (v <= 0) {
      std::fprintf(stderr, "bench_failure_backup: %s expects a positive number\n", a.c_str());
      return 2;
    }
    if (a == "--blocks") blocks = std::size_t(v);
    else if (a == "--batch") batch = std::size_t(v);
    else if (a == "--micro") micro = int(v);
    else if (a == "--rounds") rounds = int(v);
    else {
      std::fprintf(stderr, "bench_failure_backup: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  switch (blocks) {
    case 2: return run<2>(batch, micro, rounds);
    case 8: return run<8>(batch, micro, rounds);
    case 16: return run<16>(batch, micro, rounds);
    default: std::fprintf(stderr, "bench_failure_backup: --blocks is 2, 8 or 16\n"); return 2;
  }
}
