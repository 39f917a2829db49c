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
//
//   bench_attention --kernel [--seq 256] [--batch 16] [--steps 20]
//
// times the stored core's forward kernel alone (kernels::causal_attention_forward: the tiles' two
// products and their softmax rows) in bf16 on bench_policies' GPT shape, width 512 in 8 heads of
// 64, and prints its median and the rate of its products.
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

// The forward kernel of AttentionCore<512, 8> in bf16 on `batch` sequences of `seq` positions.
int run_kernel(std::size_t seq, std::size_t batch, int steps) {
  using T = bfloat16;
  constexpr std::size_t GW = 512, GH = 8, hw = GW / GH, tile = 64;
  std::size_t const count = batch * GH;
  std::vector<T> x(batch * seq * 3 * GW), y(batch * seq * GW), probs(count * seq * seq);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(float(philox::uniform(5, 0, i)) - 0.5f);
  std::vector<float> scores(kernels::attention_scores_rows(count, seq, tile) * seq);
  kernels::matrix_layout const qkv{index_t(seq), index_t(hw), index_t(3 * GW), {index_t(seq * 3 * GW), index_t(hw)}};
  kernels::matrix_layout const out{index_t(seq), index_t(hw), index_t(GW), {index_t(seq * GW), index_t(hw)}};
  T const* q = x.data();
  kernels::attention_blocks<T> const b{{count, GH}, index_t(tile), kernels::lhs(q, qkv), kernels::rhs(q + GW, qkv),
                                       kernels::rhs(q + 2 * GW, qkv), kernels::result(y.data(), out)};
  std::vector<double> times;
  for (int k = 0; k < steps + 2; ++k) {
    double const t0 = now();
    kernels::causal_attention_forward(host{}, b, scores.data(), probs.data(), 0.125f);
    if (k >= 2) times.push_back(now() - t0);
  }
  std::sort(times.begin(), times.end());
  double flop = 0;  // Q K^T and P V of each tile against the keys it sees
  for (std::size_t r0 = 0; r0 < seq; r0 += tile)
    flop += 4.0 * double(count) * double(std::min(tile, seq - r0)) * double(hw) * double(std::min(r0 + tile, seq));
  double const median = times[times.size() / 2];
  std::printf("{\"library\": \"remat\", \"kind\": \"attention_forward_kernel\", \"precision\": \"bf16\", \"seq\": %zu, "
              "\"batch\": %zu, \"width\": %zu, \"heads\": %zu, \"threads\": %s, \"steps\": %d, \"s\": %.6f, "
              "\"product_gflops\": %.1f}\n",
              seq, batch, GW, GH, std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "null", steps,
              median, flop / median / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t seq = 1024, batch = 1;
  int steps = 3, warmup = 1;
  bool kernel = false, seq_given = false, batch_given = false, steps_given = false;
  std::string core = "blocked";
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--seq") seq = std::stoul(next()), seq_given = true;
    else if (a == "--batch") batch = std::stoul(next()), batch_given = true;
    else if (a == "--steps") steps = std::stoi(next()), steps_given = true;
    else if (a == "--kernel") kernel = true;
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--core") core = next();
    else {
      std::fprintf(stderr,
                   "usage: %s --core stored|recompute|blocked --seq N [--batch 1] [--steps 3] [--warmup 1]\n"
                   "       %s --kernel [--seq 256] [--batch 16] [--steps 20]\n",
                   argv[0], argv[0]);
      return 2;
    }
  }
  if (batch == 0 || seq == 0 || steps <= 0) return 2;
  if (kernel) return run_kernel(seq_given ? seq : 256, batch_given ? batch : 16, steps_given ? steps : 20);
  if (core == "stored") return run<AttentionCore<W, H>>("stored", seq, batch, steps, warmup);
  if (core == "recompute") return run<Checkpointed<AttentionCore<W, H>>>("recompute", seq, batch, steps, warmup);
  if (core == "blocked") return run<BlockedAttentionCore<W, H>>("blocked", seq, batch, steps, warmup);
  std::fprintf(stderr, "unknown core %s (stored, recompute or blocked)\n", core.c_str());
  return 2;
}
