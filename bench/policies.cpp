// The storage-policy benchmark, two workloads:
//   mlp  a pre-norm residual MLP, block y = x + Linear(d, d)(GELU(Linear(d, d)(LayerNorm(x)))),
//        d = 1024, MSE against a fixed random target;
//   gpt  GPT-2's pre-norm block (GPTBlock<512, 8>, its attention core BlockedAttentionCore),
//        sequences of 256 tokens, vocabulary 256, cross-entropy on the next token;
// trained with AdamW in fp32 or mixed<bfloat16>, one configuration per call:
//
//   bench_policies [--workload mlp|gpt] --batch 256 --blocks 16 --policy checkpoint [--precision fp32|bf16]
//                  [--steps 5] [--warmup 2]
//     policies: stored, checkpoint, checkpoint_sequential (round(sqrt N) runs, the last stored, as
//     PyTorch's), checkpoint_sequential_all (every run checkpointed: CheckpointSequential's
//     default), revolve, selective, offload (Offloaded<Block> per block), and for gpt
//     stored_attention, checkpoint_sequential_stored_attention and selective_stored_attention (stored,
//     checkpoint_sequential and selective with AttentionCore, StoredAttention<...>: the core that
//     keeps the seq x seq probabilities, and so multiplies Q K^T once fewer in backward; on the GPU
//     stored_attention only) and recompute_attention (that core checkpointed, Megatron-LM's
//     selective recompute: RecomputeAttention<StoredAttention<...>>), and on the host
//     stored_dropout and checkpoint_dropout (the GPT with dropout 0.1, GPT-2's: after the
//     embeddings, on the attention probabilities and on each residual branch; stored and
//     checkpointed per block, whose recomputed forward draws the same masks again)
//   --gemm32 openblas|onednn picks the host's fp32 product (default: oneDNN when remat has it).
//   --profile: then as many steps again with remat::profile on, and where a step's time goes (per
//   phase: products, point-wise passes, row passes, reductions, the rest) on stderr and one JSON line.
//   bench_policies --gemm-peak [--precision fp32|bf16]
//                   (a plain 1024^3 product through the same path: the BLAS for fp32; for bf16
//                    every host path remat has, oneDNN and conversion to fp32, one line each)
//   bench_policies --list             (the configurations it was built with)
//
// Prints one JSON line: median step time after warm-up, the model's FLOP per step and the rate
// reached, measured activation peak and saved bytes against the activation plan, and the block
// forwards recomputed. bench/compare_torch.py runs it interleaved with PyTorch on the same model.
//
// Compiled by nvcc with REMAT_BENCH_CUDA (target bench_policies_cuda), the same program trains on
// the GPU: the mlp workload at d = 4096, 16 or 32 blocks, and the gpt workload at 8 blocks; --gemm-peak times a cuBLASLt product of
// the model's shape (batch x d times d x d); --optimizer-bandwidth times the fused
// unscale/check/clip/AdamW pass against a device-to-device copy; --offload-optimizer times
// OffloadedAdamW's step (by chunk size) and its parts beside AdamW's on the GPU, and whole training
// steps at --batch rows with each.
#include <remat/remat.hpp>

#include "profile_table.hpp"

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

#if defined(REMAT_BENCH_CUDA)
using Dev = remat::cuda;
constexpr std::size_t D = 4096;
constexpr bool on_gpu = true;
#else
using Dev = host;
constexpr std::size_t D = 1024;
constexpr bool on_gpu = false;
#endif

// Waits for the device: a step's time includes its last kernel.
void wait_for_device() {
#if defined(REMAT_BENCH_CUDA)
  REMAT_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}
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
  using checkpoint_sequential = CheckpointSequential<root(N), Repeat<N, Block>, last_run::stored>;
  using checkpoint_sequential_all = CheckpointSequential<root(N), Repeat<N, Block>>;
  using revolve = Revolve<root(N), Repeat<N, Block>>;
  using selective = Repeat<N, Selective<Block>>;
  using offload = Repeat<N, Offloaded<Block>>;
};

// The GPT workload: GPT-2's pre-norm block at width 512, 8 heads, sequences of 256 tokens over a
// vocabulary of 256, cross-entropy on the next token.
constexpr std::size_t GW = 512, GH = 8, GV = 256, GT = 256;
using GBlock = GPTBlock<GW, GH>;
template <class Blocks>
using GNet = Seq<Embedding<GV, GW>, PositionEmbedding<GT, GW>, Blocks, LayerNorm<GW>, Linear<GW, GV>>;
// With GPT-2's dropout (GPT<..., 0.1>'s layers).
using GDropBlock = GPTBlock<GW, GH, 0.1>;
template <class Blocks>
using GDropNet =
    Seq<Embedding<GV, GW>, PositionEmbedding<GT, GW>, Dropout<0.1>, Blocks, LayerNorm<GW>, Linear<GW, GV>>;

template <std::size_t N>
struct gpt_nets {
  using stored = GNet<Repeat<N, GBlock>>;
  using checkpoint = GNet<Repeat<N, Checkpointed<GBlock>>>;
  using checkpoint_sequential = GNet<CheckpointSequential<root(N), Repeat<N, GBlock>, last_run::stored>>;
  using checkpoint_sequential_all = GNet<CheckpointSequential<root(N), Repeat<N, GBlock>>>;
  using revolve = GNet<Revolve<root(N), Repeat<N, GBlock>>>;
  using selective = GNet<Repeat<N, Selective<GBlock>>>;
  using offload = GNet<Repeat<N, Offloaded<GBlock>>>;
  using recompute_attention = GNet<RecomputeAttention<StoredAttention<Repeat<N, GBlock>>>>;
  using stored_attention = GNet<StoredAttention<Repeat<N, GBlock>>>;
#if !defined(REMAT_BENCH_CUDA)  // (on the GPU, stored_attention only: nvcc's time)
  using checkpoint_sequential_stored_attention =
      GNet<CheckpointSequential<root(N), StoredAttention<Repeat<N, GBlock>>, last_run::stored>>;
  using selective_stored_attention = GNet<StoredAttention<Repeat<N, Selective<GBlock>>>>;
  using stored_dropout = GDropNet<Repeat<N, GDropBlock>>;
  using checkpoint_dropout = GDropNet<Repeat<N, Checkpointed<GDropBlock>>>;
#endif
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// --input-gradient: each step also writes the gradient with respect to the input (what every
// step computed before the layer that takes the input learnt to skip it).
bool want_input_gradient = false;

// --profile: after the timed steps, as many again with remat::profile on; prints where a step's
// time goes (per phase: products, point-wise passes, row passes, reductions, the rest) as a
// table on stderr and a JSON line ("kind": "profile") before the step's line.
bool want_profile = false;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One workload's data, loss and FLOP count.
struct mlp_workload {
  static constexpr char const* name = "mlp";
  static constexpr std::size_t width = D;
  using Loss = MSE;
  tensor<float, Dev> x, t, dx;
  mlp_workload(std::size_t batch, memory::caching_allocator<Dev>& alloc)
      : x(index_t(batch), index_t(D), memory::tag::workspace, alloc),
        t(index_t(batch), index_t(D), memory::tag::workspace, alloc),
        dx(index_t(batch), index_t(D), memory::tag::workspace, alloc) {
    std::vector<float> hx(x.size()), ht(t.size());
    for (std::size_t i = 0; i < hx.size(); ++i) {
      hx[i] = float(2.0 * philox::uniform(3, 0, i) - 1.0);
      ht[i] = float(2.0 * philox::uniform(3, 1, i) - 1.0);
    }
    x.copy_from(hx);
    t.copy_from(ht);
  }
  template <class Net, class P>
  static activation_plan_result plan(std::size_t batch) {
    return activation_plan<Net, P>(batch, D, 1, want_input_gradient ? input_gradient::wanted : input_gradient::none);
  }
  // 3 products of 2*batch*d*d FLOP per Linear (forward, input and weight gradients), 2 Linears a
  // block; a recomputed block forward is 2 of them, of which a checkpointed segment skips its last
  // (its output only feeds the residual add).
  static double flop_per_block(std::size_t batch) { return 2 * 3 * 2.0 * double(batch) * double(D) * double(D); }
  static double forward_flop_per_block(std::size_t batch) { return 2 * 2.0 * double(batch) * double(D) * double(D); }
  static double other_flop(std::size_t) { return 0; }
  static double skipped_flop_per_segment(std::size_t batch) { return 2.0 * double(batch) * double(D) * double(D); }
  // What Selective runs again: only point-wise work (no products).
  static double selective_forward_flop_per_block(std::size_t) { return 0; }
};

struct gpt_workload {
  static constexpr char const* name = "gpt";
  static constexpr std::size_t width = GW;
  using Loss = SoftmaxCrossEntropy;
  tensor<std::int32_t, Dev> x, t;
  gpt_workload(std::size_t batch, memory::caching_allocator<Dev>& alloc)
      : x(index_t(batch), index_t(GT), memory::tag::workspace, alloc),
        t(index_t(batch), index_t(GT), memory::tag::workspace, alloc) {
    std::vector<std::int32_t> hx(x.size()), ht(t.size());
    for (std::size_t i = 0; i < hx.size(); ++i) {
      hx[i] = std::int32_t(philox::uniform(3, 0, i) * float(GV)) % std::int32_t(GV);
      ht[i] = std::int32_t(philox::uniform(3, 1, i) * float(GV)) % std::int32_t(GV);
    }
    x.copy_from(hx);
    t.copy_from(ht);
  }
  template <class Net, class P>
  static activation_plan_result plan(std::size_t batch) {
    return sequence_plan<Net, P>(batch, GT);
  }
  // Per token and block, forward: 2 * 12 W^2 for the four projections, 2 * 2 * T * W for the two
  // (full, unmasked) attention products; training is 3 times that.
  static double forward_flop_per_block(std::size_t batch) {
    return double(batch * GT) * (24.0 * GW * GW + 4.0 * double(GT) * GW);
  }
  static double flop_per_block(std::size_t batch) { return 3 * forward_flop_per_block(batch); }
  static double other_flop(std::size_t batch) { return 3 * 2.0 * double(batch * GT) * GW * GV; }  // the head
  // A checkpointed segment's recomputation skips its last product (the MLP's W -> 4W -> W second).
  static double skipped_flop_per_segment(std::size_t batch) { return 2.0 * double(batch * GT) * 4.0 * GW * GW; }
  // What Selective runs again: the attention core's two products.
  static double selective_forward_flop_per_block(std::size_t batch) {
    return double(batch * GT) * 4.0 * double(GT) * GW;
  }
  // What BlockedAttentionCore's backward runs again per block: the scores' product Q K^T.
  static double blocked_flop_per_block(std::size_t batch) { return double(batch * GT) * 2.0 * double(GT) * GW; }
};

template <class Net, class P, class Work>
int run(char const* policy, std::size_t n_blocks, std::size_t batch, int steps, int warmup) {
  memory::caching_allocator<Dev> alloc;
  offload_allocator_t<Dev> offloaded;
  model<Net, Dev, P> m(seed{1}, alloc, offloaded);
  AdamW opt(m, {.lr = 1e-4});
  Work data(batch, alloc);
  wait_for_device();
  std::vector<double> times;
  double loss = 0;
  std::size_t peak = 0;
  for (int k = 0; k < warmup + steps; ++k) {
    alloc.reset_peak();
    offloaded.reset_peak();
    double const t0 = now();
    if constexpr (requires { data.dx; }) {
      if (want_input_gradient) {
        m.zero_grad();
        loss = m.template accumulate<typename Work::Loss>(data.x, data.t, 1.0, &data.dx);
        opt.step();
      } else {
        loss = m.template train_step<typename Work::Loss>(data.x, data.t, opt);
      }
    } else {
      loss = m.template train_step<typename Work::Loss>(data.x, data.t, opt);
    }
    wait_for_device();
    double const t1 = now();
    if (k >= warmup) times.push_back(t1 - t0);
    peak = alloc.stats()[memory::tag::activations].peak;
  }
  if (want_profile) {  // more steps, profiled (so the timed ones above carry no profiling cost)
    profile::enable();
    for (int k = 0; k < steps; ++k) {
      (void)m.template train_step<typename Work::Loss>(data.x, data.t, opt);
      wait_for_device();
    }
    bench_profile::print(profile::read(), steps, policy, n_blocks, batch, Work::name);
    profile::enable(false);
  }
  auto const plan = Work::template plan<Net, P>(batch);
  auto const plan32 = Work::template plan<Net, fp32>(batch);  // what the same model keeps in fp32
  double const flop = double(n_blocks) * Work::flop_per_block(batch) + Work::other_flop(batch);
  std::string const name = policy;
  // (the GPT's policies named *stored_attention, and recompute_attention, have AttentionCore; the
  // others its blocked core)
  bool const kept = name.ends_with("stored_attention"), blocked = !kept && name != "recompute_attention";
  // (the policy without its core's or dropout's suffix: what it recomputes)
  std::string const base = name == "stored_attention"  ? "stored"
                           : kept                       ? name.substr(0, name.size() - 17)
                           : name.ends_with("_dropout") ? name.substr(0, name.size() - 8)
                                                        : name;
  bool const selective = base == "selective";
  bool const core = base == "recompute_attention";
  double const again = selective || core ? Work::selective_forward_flop_per_block(batch)
                                         : Work::forward_flop_per_block(batch);
  // Checkpointed segments: one per block (checkpoint) or per run of blocks (checkpoint_sequential:
  // every run but the last, which it stores).
  double const segments = base == "checkpoint"                  ? double(n_blocks)
                          : base == "checkpoint_sequential"     ? double(root(n_blocks) - 1)
                          : base == "checkpoint_sequential_all" ? double(root(n_blocks))
                                                                : 0.0;
  double extra = 0;  // (the blocked core's backward multiplies Q K^T again in every block)
  if constexpr (requires { Work::blocked_flop_per_block(batch); })
    if (blocked) extra = double(n_blocks) * Work::blocked_flop_per_block(batch);
  double const flop_done =
      flop + extra + double(m.last_pass().recomputed) * again - segments * Work::skipped_flop_per_segment(batch);
  double const step = median(times);
  std::printf(
      "{\"library\": \"remat\", \"workload\": \"%s\", \"policy\": \"%s\", \"blocks\": %zu, \"batch\": %zu, "
      "\"seq\": %zu, \"width\": %zu, "
      "\"precision\": \"%s\", \"threads\": %s, \"steps\": %d, \"step_s\": %.6f, \"model_gflop\": %.3f, "
      "\"model_gflops\": %.2f, \"executed_gflops\": %.2f, \"peak_activation_bytes\": %zu, "
      "\"planned_peak_bytes\": %zu, \"saved_activation_bytes\": %zu, \"planned_saved_bytes\": %zu, "
      "\"fp32_planned_saved_bytes\": %zu, \"recomputed_block_forwards\": %llu, \"loss\": %.6f, "
      "\"offloaded_bytes\": %zu, \"planned_offloaded_bytes\": %zu, \"input_gradient\": %s, \"device\": \"%s\"}\n",
      Work::name, policy, n_blocks, batch, std::is_same_v<Work, gpt_workload> ? GT : std::size_t(1), Work::width,
      std::is_same_v<P, fp32> ? "fp32" : "bf16", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "null", steps,
      step, flop * 1e-9, flop / step * 1e-9, flop_done / step * 1e-9, peak, plan.peak_bytes, m.last_pass().saved_bytes,
      plan.saved_bytes, plan32.saved_bytes, static_cast<unsigned long long>(m.last_pass().recomputed), loss,
      offloaded.stats()[memory::tag::activations].peak, plan.offloaded_bytes,
      want_input_gradient && requires { data.dx; } ? "true" : "false", Dev::name);
  return peak == plan.peak_bytes && offloaded.stats()[memory::tag::activations].peak == plan.offloaded_bytes ? 0 : 3;
}

template <class n, class Work, std::size_t N, class P>
int dispatch_on(std::string const& policy, std::size_t batch, int steps, int warmup) {
  if (policy == "stored") return run<typename n::stored, P, Work>("stored", N, batch, steps, warmup);
  if (policy == "checkpoint") return run<typename n::checkpoint, P, Work>("checkpoint", N, batch, steps, warmup);
  if (policy == "checkpoint_sequential")
    return run<typename n::checkpoint_sequential, P, Work>("checkpoint_sequential", N, batch, steps, warmup);
  if (policy == "checkpoint_sequential_all")
    return run<typename n::checkpoint_sequential_all, P, Work>("checkpoint_sequential_all", N, batch, steps, warmup);
  if (policy == "revolve") return run<typename n::revolve, P, Work>("revolve", N, batch, steps, warmup);
  if (policy == "selective") return run<typename n::selective, P, Work>("selective", N, batch, steps, warmup);
  if (policy == "offload") return run<typename n::offload, P, Work>("offload", N, batch, steps, warmup);
  if constexpr (requires { typename n::recompute_attention; })
    if (policy == "recompute_attention")
      return run<typename n::recompute_attention, P, Work>("recompute_attention", N, batch, steps, warmup);
  if constexpr (requires { typename n::stored_attention; })
    if (policy == "stored_attention")
      return run<typename n::stored_attention, P, Work>("stored_attention", N, batch, steps, warmup);
  if constexpr (requires { typename n::selective_stored_attention; }) {
    if (policy == "checkpoint_sequential_stored_attention")
      return run<typename n::checkpoint_sequential_stored_attention, P, Work>("checkpoint_sequential_stored_attention",
                                                                              N, batch, steps, warmup);
    if (policy == "selective_stored_attention")
      return run<typename n::selective_stored_attention, P, Work>("selective_stored_attention", N, batch, steps,
                                                                  warmup);
  }
  if constexpr (requires { typename n::stored_dropout; }) {
    if (policy == "stored_dropout")
      return run<typename n::stored_dropout, P, Work>("stored_dropout", N, batch, steps, warmup);
    if (policy == "checkpoint_dropout")
      return run<typename n::checkpoint_dropout, P, Work>("checkpoint_dropout", N, batch, steps, warmup);
  }
  std::fprintf(stderr, "unknown policy %s\n", policy.c_str());
  return 2;
}

template <std::size_t N, class P>
int dispatch(std::string const& workload, std::string const& policy, std::size_t batch, int steps, int warmup) {
  if (workload == "gpt") {
    if constexpr (on_gpu ? N == 8 : N <= 16) return dispatch_on<gpt_nets<N>, gpt_workload, N, P>(policy, batch, steps, warmup);
    std::fprintf(stderr, on_gpu ? "the gpt workload has 8 blocks on the GPU\n" : "the gpt workload has 4, 8 or 16 blocks\n");
    return 2;
  }
  if constexpr (on_gpu && N != 16 && N != 32) {
    std::fprintf(stderr, "the mlp workload has 16 or 32 blocks on the GPU\n");
    return 2;
  } else {
    return dispatch_on<nets<N>, mlp_workload, N, P>(policy, batch, steps, warmup);
  }
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
    kernels::gemm(host{}, kernels::lhs(a.data(), index_t(n), index_t(n)),
                  kernels::rhs(b.data(), index_t(n), index_t(n)).transposed(),
                  kernels::result(c.data(), index_t(n), index_t(n)));
    double const t1 = now();
    if (r >= 2) times.push_back(t1 - t0);
  }
  double const t = median(times);
  std::printf("{\"library\": \"remat\", \"kind\": \"gemm_peak\", \"precision\": \"%s\", \"path\": \"%s\", "
              "\"m\": 1024, \"n\": 1024, \"k\": 1024, \"s\": %.6f, \"gflops\": %.2f}\n",
              precision, path, t, 2.0 * double(n * n * n) / t * 1e-9);
}

#if defined(REMAT_BENCH_CUDA)
// A plain cuBLASLt product of the model's shape, batch x d times (d x d)^T, on device buffers.
template <class T>
void gpu_gemm_peak_of(int reps, std::size_t batch, char const* precision) {
  std::size_t const m = batch, n = D, k = D;
  tensor<T, Dev> a(index_t(m), index_t(k), memory::tag::workspace), b(index_t(n), index_t(k), memory::tag::workspace),
      c(index_t(m), index_t(n), memory::tag::workspace);
  evaluate(a, expr::to_expr(0.5));
  evaluate(b, expr::to_expr(0.25));
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    wait_for_device();
    double const t0 = now();
    kernels::gemm(Dev{}, kernels::lhs(a.data(), index_t(m), index_t(k)),
                  kernels::rhs(b.data(), index_t(n), index_t(k)).transposed(),
                  kernels::result(c.data(), index_t(m), index_t(n)));
    wait_for_device();
    double const t1 = now();
    if (r >= 2) times.push_back(t1 - t0);
  }
  double const t = median(times);
  std::printf("{\"library\": \"remat\", \"kind\": \"gemm_peak\", \"precision\": \"%s\", \"path\": \"cublaslt\", "
              "\"m\": %zu, \"n\": %zu, \"k\": %zu, \"s\": %.6f, \"gflops\": %.2f, \"device\": \"cuda\"}\n",
              precision, m, n, k, t, 2.0 * double(m) * double(n) * double(k) / t * 1e-9);
}

// The optimizer step of a 16-block model (clipping on; in bf16 also unscaling and the inf/NaN
// check of DynamicLossScale) against a device-to-device copy of as many bytes as the step moves.
template <class P>
int optimizer_bandwidth(int reps, char const* precision) {
  using Net = nets<16>::stored;
  model<Net, Dev, P> m(seed{1});
  AdamW opt(m, {.lr = 1e-4, .clip_norm = 1.0});
  evaluate(m.gradients(), expr::to_expr(1e-3));
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    wait_for_device();
    double const t0 = now();
    opt.step();
    wait_for_device();
    double const t1 = now();
    if (r >= 2) times.push_back(t1 - t0);
  }
  double const step = median(times);
  std::size_t const n = m.parameters().size();
  // Reads: the gradients twice (check, update), weights, two moments; writes: weights, two
  // moments, and the bf16 compute copy in mixed precision.
  double const bytes = double(n) * (4.0 * 2 + 4 * 3 + 4 * 3 + (is_mixed_v<P> ? 2.0 : 0.0));
  std::size_t const copy_bytes = std::size_t(bytes / 2);  // a copy reads and writes each byte once
  void *src = nullptr, *dst = nullptr;
  REMAT_CUDA_CHECK(cudaMalloc(&src, copy_bytes));
  REMAT_CUDA_CHECK(cudaMalloc(&dst, copy_bytes));
  std::vector<double> copies;
  for (int r = 0; r < reps + 2; ++r) {
    wait_for_device();
    double const t0 = now();
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, nullptr));
    wait_for_device();
    double const t1 = now();
    if (r >= 2) copies.push_back(t1 - t0);
  }
  REMAT_CUDA_CHECK(cudaFree(src));
  REMAT_CUDA_CHECK(cudaFree(dst));
  double const copy = median(copies);
  double const step_bw = bytes / step, copy_bw = 2.0 * double(copy_bytes) / copy;
  std::printf("{\"library\": \"remat\", \"kind\": \"optimizer_bandwidth\", \"precision\": \"%s\", "
              "\"parameters\": %zu, \"step_s\": %.6f, \"step_gbps\": %.1f, \"copy_gbps\": %.1f, "
              "\"fraction_of_copy\": %.3f, \"device\": \"cuda\"}\n",
              precision, n, step, step_bw * 1e-9, copy_bw * 1e-9, step_bw / copy_bw);
  return 0;
}

// --offload-optimizer: OffloadedAdamW's step on a 16-block model (537 M parameters) by chunk size
// (0: update everything, then copy everything up), beside AdamW on the GPU and the step's parts
// alone (the gradients' copy down, the host update, the weights' copy up, from and to page-locked
// memory); then whole training steps at `batch` rows with each optimizer.
template <class P>
int offload_optimizer(int reps, char const* precision, std::size_t batch) {
  using Net = nets<16>::stored;
  using T = typename P::master;
  model<Net, Dev, P> m(seed{1});
  std::size_t const n = m.parameters().size();
  auto line = [&](char const* what, std::size_t chunk, double s) {
    std::printf("{\"library\": \"remat\", \"kind\": \"offload_optimizer\", \"precision\": \"%s\", "
                "\"parameters\": %zu, \"what\": \"%s\", \"chunk\": %zu, \"batch\": %zu, \"s\": %.6f, "
                "\"device\": \"cuda\"}\n",
                precision, n, what, chunk, batch, s);
    std::fflush(stdout);
  };
  auto timed = [&](auto&& f) {
    std::vector<double> times;
    for (int r = 0; r < reps + 2; ++r) {
      wait_for_device();
      double const t0 = now();
      f();
      wait_for_device();
      if (r >= 2) times.push_back(now() - t0);
    }
    return median(times);
  };
  evaluate(m.gradients(), expr::to_expr(1e-3));
  {
    AdamW opt(m, {.lr = 1e-4, .clip_norm = 1.0});
    line("adamw_gpu_step", 0, timed([&] { opt.step(); }));
  }
  for (std::size_t chunk : {std::size_t(0), std::size_t(2) << 20, std::size_t(8) << 20, std::size_t(32) << 20}) {
    OffloadedAdamW opt(m, {.lr = 1e-4, .clip_norm = 1.0});
    opt.set_chunk(chunk);
    line("offloaded_step", chunk, timed([&] { opt.step(); }));
  }
  {  // the parts alone
    T *pinned = nullptr, *g = nullptr, *mo = nullptr, *v = nullptr;
    REMAT_CUDA_CHECK(cudaMallocHost(&pinned, n * sizeof(T)));
    std::vector<T> hg(n, T(1e-3f)), hm(n, T(0)), hv(n, T(0));
    g = hg.data(), mo = hm.data(), v = hv.data();
    std::memset(static_cast<void*>(pinned), 0, n * sizeof(T));
    T* const dev = m.gradients().data();
    line("copy_down", 0, timed([&] {
           REMAT_CUDA_CHECK(cudaMemcpyAsync(pinned, dev, n * sizeof(T), cudaMemcpyDeviceToHost, nullptr));
         }));
    line("copy_up", 0, timed([&] {
           REMAT_CUDA_CHECK(cudaMemcpyAsync(dev, pinned, n * sizeof(T), cudaMemcpyHostToDevice, nullptr));
         }));
    kernels::adamw_scalars const k{1.0, 1e-4, 0.9, 0.999, 1e-8, 1.0, 1.0};
    line("host_update", 0, timed([&] { kernels::adamw_update(host{}, n, pinned, g, mo, v, k); }));
    REMAT_CUDA_CHECK(cudaFreeHost(pinned));
  }
  // Whole training steps (the model's weights now hold the parts' garbage: start again).
  mlp_workload w(batch, memory::default_allocator<Dev>());
  auto const& x = w.x;
  auto const& t = w.t;
  model<Net, Dev, P> fresh(seed{1});
  {
    AdamW opt(fresh, {.lr = 1e-4, .clip_norm = 1.0});
    line("adamw_gpu_train_step", 0, timed([&] { fresh.template train_step<MSE>(x, t, opt); }));
  }
  for (std::size_t chunk : {std::size_t(0), std::size_t(8) << 20}) {
    OffloadedAdamW opt(fresh, {.lr = 1e-4, .clip_norm = 1.0});
    opt.set_chunk(chunk);
    line("offloaded_train_step", chunk, timed([&] { fresh.template train_step<MSE>(x, t, opt); }));
  }
  return 0;
}
#endif

int gemm_peak(int reps, std::string const& precision, [[maybe_unused]] std::size_t batch) {
#if defined(REMAT_BENCH_CUDA)
  if (precision == "fp32")
    gpu_gemm_peak_of<float>(reps, batch, "fp32");
  else
    gpu_gemm_peak_of<bfloat16>(reps, batch, "bf16");
  return 0;
#else
  if (precision == "fp32") {  // every fp32 host path: the peak is the faster
    kernels::gemm32_path const chosen = kernels::gemm32_path_now();
    kernels::set_gemm32_path(kernels::gemm32_path::openblas);
    gemm_peak_of<float>(reps, "fp32", "openblas");
    if (kernels::has_onednn) {
      kernels::set_gemm32_path(kernels::gemm32_path::onednn);
      gemm_peak_of<float>(reps, "fp32", "onednn");
    }
    kernels::set_gemm32_path(chosen);
    return 0;
  }
  if (kernels::has_onednn_bf16()) {
    kernels::set_gemm16_path(kernels::gemm16_path::onednn);
    gemm_peak_of<bfloat16>(reps, "bf16", "onednn");
  }
  kernels::set_gemm16_path(kernels::gemm16_path::convert);
  gemm_peak_of<bfloat16>(reps, "bf16", "convert");
  kernels::set_gemm16_path(kernels::gemm16_path::automatic);
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t batch = 256, blocks = 8;
  int steps = 5, warmup = 2;
  std::string policy = "stored", precision = "fp32", workload = "mlp";
  bool peak = false, optimizer = false, offload_opt = false;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--batch") batch = std::stoul(next());
    else if (a == "--blocks") blocks = std::stoul(next());
    else if (a == "--policy") policy = next();
    else if (a == "--precision") precision = next();
    else if (a == "--workload") workload = next();
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--gemm-peak") peak = true;
    else if (a == "--input-gradient") want_input_gradient = true;
    else if (a == "--profile") want_profile = true;
    else if (a == "--optimizer-bandwidth") optimizer = true;
    else if (a == "--offload-optimizer") offload_opt = true;
#if defined(REMAT_BENCH_CUDA)
    else if (a == "--strided-batches") kernels::set_pointer_array_batches(false);  // attention's products per head
#else
    else if (a == "--gemm32") {  // the fp32 host product: openblas or onednn (default: remat's choice)
      std::string const p = next();
      if (p != "openblas" && p != "onednn") {
        std::fprintf(stderr, "--gemm32 takes openblas or onednn\n");
        return 2;
      }
      kernels::set_gemm32_path(p == "onednn" ? kernels::gemm32_path::onednn : kernels::gemm32_path::openblas);
    }
#endif
    else if (a == "--list") {
      std::printf(on_gpu ? "workloads: mlp (blocks 16 32), d = 4096, gpt (blocks 8), on the GPU\n"
                         : "workloads: mlp (blocks 4 8 16 32 64) gpt (blocks 4 8 16)\n");
      std::printf(
                  "policies: stored checkpoint checkpoint_sequential checkpoint_sequential_all revolve selective recompute_attention (gpt)"
                  " stored_attention checkpoint_sequential_stored_attention selective_stored_attention (gpt)%s\n"
                  "precisions: fp32 bf16\n",
                  on_gpu ? "" : " stored_dropout checkpoint_dropout (gpt)");
      return 0;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--workload mlp|gpt] [--batch B] [--blocks N] [--policy P] [--precision fp32|bf16] [--steps S]"
                   " [--warmup W] [--gemm32 openblas|onednn (host)] [--strided-batches (GPU)] [--input-gradient] [--profile]"
                   " | --gemm-peak [--precision fp32|bf16] [--batch B] | --optimizer-bandwidth [--precision fp32|bf16]"
                   " | --offload-optimizer [--precision fp32|bf16] [--batch B]\n",
                   argv[0]);
      return 2;
    }
  }
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "precision must be fp32 or bf16\n");
    return 2;
  }
  if (peak) return gemm_peak(steps * 4, precision, batch);
  bool const bf = precision == "bf16";
  using B = mixed<bfloat16>;
  if (offload_opt) {
#if defined(REMAT_BENCH_CUDA)
    return bf ? offload_optimizer<mixed<bfloat16, DynamicLossScale>>(steps, "bf16", batch)
              : offload_optimizer<fp32>(steps, "fp32", batch);
#else
    std::fprintf(stderr, "--offload-optimizer is measured on the GPU (bench_policies_cuda)\n");
    return 2;
#endif
  }
  if (optimizer) {
#if defined(REMAT_BENCH_CUDA)
    return bf ? optimizer_bandwidth<mixed<bfloat16, DynamicLossScale>>(steps * 4, "bf16")
              : optimizer_bandwidth<fp32>(steps * 4, "fp32");
#else
    std::fprintf(stderr, "--optimizer-bandwidth is measured on the GPU (bench_policies_cuda)\n");
    return 2;
#endif
  }
#if defined(REMAT_BENCH_CUDA)
  struct report_pointer_products {  // (on stderr at exit: whether cuBLASLt took them here)
    ~report_pointer_products() {
      std::fprintf(stderr, "pointer-array products run: %llu\n",
                   static_cast<unsigned long long>(kernels::detail::lt_pointer_products().load()));
    }
  } const report;
  switch (blocks) {  // (the GPU build carries the sizes the GPU benchmark runs: compile time)
    case 8: return bf ? dispatch<8, B>(workload, policy, batch, steps, warmup) : dispatch<8, fp32>(workload, policy, batch, steps, warmup);
    case 16: return bf ? dispatch<16, B>(workload, policy, batch, steps, warmup) : dispatch<16, fp32>(workload, policy, batch, steps, warmup);
    case 32: return bf ? dispatch<32, B>(workload, policy, batch, steps, warmup) : dispatch<32, fp32>(workload, policy, batch, steps, warmup);
    default: std::fprintf(stderr, "blocks must be 8 (gpt), 16 or 32 (mlp) on the GPU\n"); return 2;
  }
#else
  switch (blocks) {
    case 4: return bf ? dispatch<4, B>(workload, policy, batch, steps, warmup) : dispatch<4, fp32>(workload, policy, batch, steps, warmup);
    case 8: return bf ? dispatch<8, B>(workload, policy, batch, steps, warmup) : dispatch<8, fp32>(workload, policy, batch, steps, warmup);
    case 16: return bf ? dispatch<16, B>(workload, policy, batch, steps, warmup) : dispatch<16, fp32>(workload, policy, batch, steps, warmup);
    case 32: return bf ? dispatch<32, B>(workload, policy, batch, steps, warmup) : dispatch<32, fp32>(workload, policy, batch, steps, warmup);
    case 64: return bf ? dispatch<64, B>(workload, policy, batch, steps, warmup) : dispatch<64, fp32>(workload, policy, batch, steps, warmup);
    default: std::fprintf(stderr, "blocks must be one of 4 8 16 32 64\n"); return 2;
  }
#endif
}
