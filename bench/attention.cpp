// The attention benchmark's remat side (bench/compare_attention.py runs it beside PyTorch): one
// causal self-attention core on the projections of `batch` sequences, fp32, width 256 in 4 heads
// of 64 (a nanoGPT layer's shape), forward and backward with the input's gradient (an MSE against
// a fixed target). Cores: stored (AttentionCore: keeps the seq x seq probabilities), recompute
// (Checkpointed<AttentionCore>: RecomputeAttention's core) and blocked (BlockedAttentionCore).
//
//   bench_attention --core stored|recompute|blocked --seq 512|1024|2048|4096 [--batch 1] [--steps 3] [--warmup 1]
//
// Prints one JSON line: the median time of a forward + backward, the activations' measured peak and
// the plan's, and what the forward kept.
#include <remat/remat.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t W = 256, H = 4;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class Core>
int run(char const* name, std::size_t seq, std::size_t batch, int steps, int warmup) {
  memory::caching_allocator<host> alloc;
  model<Core> m(seed{1}, alloc);
  m.set_sequence_length(seq);
  std::size_t const rows = batch * seq;
  tensor<float> x{index_t(rows), index_t(3 * W)}, t{index_t(rows), index_t(W)}, dx{index_t(rows), index_t(3 * W)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 2.0f * float(philox::uniform(5, 0, i)) - 1.0f;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(philox::uniform(5, 1, i));
  std::vector<double> times;
  double loss = 0;
  std::size_t peak = 0;
  for (int k = 0; k < warmup + steps; ++k) {
    alloc.reset_peak();
    double const t0 = now();
    loss = m.template accumulate<MSE>(x, t, 1.0, &dx);
    double const t1 = now();
    if (k >= warmup) times.push_back(t1 - t0);
    peak = alloc.stats()[memory::tag::activations].peak;
  }
  std::sort(times.begin(), times.end());
  auto const plan = sequence_plan<Core>(batch, seq);
  std::printf(
      "{\"library\": \"remat\", \"core\": \"%s\", \"seq\": %zu, \"batch\": %zu, \"width\": %zu, \"heads\": %zu, "
      "\"threads\": %s, \"steps\": %d, \"step_s\": %.6f, \"peak_activation_bytes\": %zu, \"planned_peak_bytes\": %zu, "
      "\"saved_activation_bytes\": %zu, \"planned_saved_bytes\": %zu, \"loss\": %.6f}\n",
      name, seq, batch, W, H, std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "null", steps,
      times[times.size() / 2], peak, plan.peak_bytes, m.last_pass().saved_bytes, plan.saved_bytes, loss);
  return peak == plan.peak_bytes ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t seq = 1024, batch = 1;
  int steps = 3, warmup = 1;
  std::string core = "blocked";
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--seq") seq = std::stoul(next());
    else if (a == "--batch") batch = std::stoul(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--core") core = next();
    else {
      std::fprintf(stderr, "usage: %s --core stored|recompute|blocked --seq N [--batch 1] [--steps 3] [--warmup 1]\n",
                   argv[0]);
      return 2;
    }
  }
  if (batch == 0 || seq == 0 || steps <= 0) return 2;
  if (core == "stored") return run<AttentionCore<W, H>>("stored", seq, batch, steps, warmup);
  if (core == "recompute") return run<Checkpointed<AttentionCore<W, H>>>("recompute", seq, batch, steps, warmup);
  if (core == "blocked") return run<BlockedAttentionCore<W, H>>("blocked", seq, batch, steps, warmup);
  std::fprintf(stderr, "unknown core %s (stored, recompute or blocked)\n", core.c_str());
  return 2;
}
