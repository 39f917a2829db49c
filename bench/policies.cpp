// The storage-policy benchmark: a pre-norm residual MLP, block
//   y = x + Linear(d, d)(GELU(Linear(d, d)(LayerNorm(x)))),  d = 1024,
// trained with MSE against a fixed random target and AdamW, in fp32 or mixed<bfloat16>, one
// configuration per call:
//
//   bench_policies --batch 256 --blocks 16 --policy checkpoint [--precision fp32|bf16] [--steps 5] [--warmup 2]
//   bench_policies --gemm-peak [--precision fp32|bf16]
//                   (a plain 1024^3 product through the same path: the BLAS for fp32; for bf16
//                    every host path remat has, oneDNN and conversion to fp32, one line each)
//   bench_policies --list             (the configurations it was built with)
//
// Prints one JSON line: median step time after warm-up, the model's FLOP per step and the rate
// reached, measured activation peak and saved bytes against the activation plan, and the block
// forwards recomputed. bench/compare_torch.py runs it interleaved with PyTorch on the same model.
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

constexpr std::size_t D = 1024;
using Block = Residual<Seq<LayerNorm<D>, Linear<D, D>, GELU, Linear<D, D>>>;

// round(sqrt(N)): PyTorch's usual checkpoint_sequential segment count, and revolve's slots here.
constexpr std::size_t root(std::size_t n) {
  std::size_t r = 1;
  while ((r + 1) * (r + 1) <= n) ++r;
  return (n - r * r > r) ? r + 1 : r;  // n - r^2 > r  <=>  sqrt(n) > r + 1/2 (for integers)
}

template <std::size_t N>
struct nets {
  using stored = Repeat<N, Block>;
  using checkpoint = Repeat<N, Checkpointed<Block>>;
  using checkpoint_sequential = CheckpointSequential<root(N), Repeat<N, Block>>;
  using revolve = Revolve<root(N), Repeat<N, Block>>;
  using selective = Repeat<N, Selective<Block>>;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class Net, class P>
int run(char const* policy, std::size_t n_blocks, std::size_t batch, int steps, int warmup) {
  memory::caching_allocator<host> alloc;
  model<Net, host, P> m(seed{1}, alloc);
  AdamW opt(m, {.lr = 1e-4});
  tensor<float> x(index_t(batch), index_t(D), memory::tag::workspace, alloc),
      t(index_t(batch), index_t(D), memory::tag::workspace, alloc);
  {
    std::vector<float> hx(x.size()), ht(t.size());
    for (std::size_t i = 0; i < hx.size(); ++i) {
      hx[i] = float(2.0 * philox::uniform(3, 0, i) - 1.0);
      ht[i] = float(2.0 * philox::uniform(3, 1, i) - 1.0);
    }
    x.copy_from(hx);
    t.copy_from(ht);
  }
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
  auto const plan = activation_plan<Net, P>(batch);
  auto const plan32 = activation_plan<Net, fp32>(batch);  // what the same model keeps in fp32
  // 3 products of 2*batch*d*d FLOP per Linear (forward, input and weight gradients), 2 Linears a
  // block, plus the forwards the policy runs again.
  double const gemm = 2.0 * double(batch) * double(D) * double(D);
  double const flop = double(n_blocks) * 2 * 3 * gemm;
  double const flop_done = flop + double(m.last_pass().recomputed) * 2 * gemm *
                                       (std::strcmp(policy, "selective") == 0 ? 0.0 : 1.0);
  double const step = median(times);
  std::printf(
      "{\"library\": \"remat\", \"policy\": \"%s\", \"blocks\": %zu, \"batch\": %zu, \"width\": %zu, "
      "\"precision\": \"%s\", \"threads\": %s, \"steps\": %d, \"step_s\": %.6f, \"model_gflop\": %.3f, "
      "\"model_gflops\": %.2f, \"executed_gflops\": %.2f, \"peak_activation_bytes\": %zu, "
      "\"planned_peak_bytes\": %zu, \"saved_activation_bytes\": %zu, \"planned_saved_bytes\": %zu, "
      "\"fp32_planned_saved_bytes\": %zu, \"recomputed_block_forwards\": %llu, \"loss\": %.6f}\n",
      policy, n_blocks, batch, D, std::is_same_v<P, fp32> ? "fp32" : "bf16", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "null", steps,
      step, flop * 1e-9, flop / step * 1e-9, flop_done / step * 1e-9, peak, plan.peak_bytes, m.last_pass().saved_bytes,
      plan.saved_bytes, plan32.saved_bytes, static_cast<unsigned long long>(m.last_pass().recomputed), loss);
  return peak == plan.peak_bytes ? 0 : 3;
}

template <std::size_t N, class P>
int dispatch(std::string const& policy, std::size_t batch, int steps, int warmup) {
  using n = nets<N>;
  if (policy == "stored") return run<typename n::stored, P>("stored", N, batch, steps, warmup);
  if (policy == "checkpoint") return run<typename n::checkpoint, P>("checkpoint", N, batch, steps, warmup);
  if (policy == "checkpoint_sequential")
    return run<typename n::checkpoint_sequential, P>("checkpoint_sequential", N, batch, steps, warmup);
  if (policy == "revolve") return run<typename n::revolve, P>("revolve", N, batch, steps, warmup);
  if (policy == "selective") return run<typename n::selective, P>("selective", N, batch, steps, warmup);
  std::fprintf(stderr, "unknown policy %s\n", policy.c_str());
  return 2;
}

template <class T>
void gemm_peak_of(int reps, char const* precision, char const* path) {
  std::size_t const n = 1024;
  std::vector<T> a(n * n), b(n * n), c(n * n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = T(float(philox::uniform(5, 0, i)));
    b[i] = T(float(philox::uniform(5, 1, i)));
  }
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    double const t0 = now();
    kernels::gemm(host{}, kernels::trans::no, kernels::trans::yes, index_t(n), index_t(n), index_t(n), 1.0f, a.data(),
                  index_t(n), b.data(), index_t(n), 0.0f, c.data(), index_t(n));
    double const t1 = now();
    if (r >= 2) times.push_back(t1 - t0);
  }
  double const t = median(times);
  std::printf("{\"library\": \"remat\", \"kind\": \"gemm_peak\", \"precision\": \"%s\", \"path\": \"%s\", "
              "\"m\": 1024, \"n\": 1024, \"k\": 1024, \"s\": %.6f, \"gflops\": %.2f}\n",
              precision, path, t, 2.0 * double(n * n * n) / t * 1e-9);
}

int gemm_peak(int reps, std::string const& precision) {
  if (precision == "fp32") {
    gemm_peak_of<float>(reps, "fp32", "blas");
    return 0;
  }
  if (kernels::has_onednn) {
    kernels::set_gemm16_path(kernels::gemm16_path::onednn);
    gemm_peak_of<bfloat16>(reps, "bf16", "onednn");
  }
  kernels::set_gemm16_path(kernels::gemm16_path::convert);
  gemm_peak_of<bfloat16>(reps, "bf16", "convert");
  kernels::set_gemm16_path(kernels::gemm16_path::automatic);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t batch = 256, blocks = 8;
  int steps = 5, warmup = 2;
  std::string policy = "stored", precision = "fp32";
  bool peak = false;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--batch") batch = std::stoul(next());
    else if (a == "--blocks") blocks = std::stoul(next());
    else if (a == "--policy") policy = next();
    else if (a == "--precision") precision = next();
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--gemm-peak") peak = true;
    else if (a == "--list") {
      std::printf("blocks: 4 8 16 32 64\npolicies: stored checkpoint checkpoint_sequential revolve selective\n"
                  "precisions: fp32 bf16\n");
      return 0;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--batch B] [--blocks N] [--policy P] [--precision fp32|bf16] [--steps S] [--warmup W]"
                   " | --gemm-peak [--precision fp32|bf16]\n",
                   argv[0]);
      return 2;
    }
  }
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "precision must be fp32 or bf16\n");
    return 2;
  }
  if (peak) return gemm_peak(steps * 4, precision);
  bool const bf = precision == "bf16";
  using B = mixed<bfloat16>;
  switch (blocks) {
    case 4: return bf ? dispatch<4, B>(policy, batch, steps, warmup) : dispatch<4, fp32>(policy, batch, steps, warmup);
    case 8: return bf ? dispatch<8, B>(policy, batch, steps, warmup) : dispatch<8, fp32>(policy, batch, steps, warmup);
    case 16: return bf ? dispatch<16, B>(policy, batch, steps, warmup) : dispatch<16, fp32>(policy, batch, steps, warmup);
    case 32: return bf ? dispatch<32, B>(policy, batch, steps, warmup) : dispatch<32, fp32>(policy, batch, steps, warmup);
    case 64: return bf ? dispatch<64, B>(policy, batch, steps, warmup) : dispatch<64, fp32>(policy, batch, steps, warmup);
    default: std::fprintf(stderr, "blocks must be one of 4 8 16 32 64\n"); return 2;
  }
}
