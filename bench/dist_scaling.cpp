// Data-parallel scaling of the residual-MLP training step (the policies benchmark's model,
// d = 1024) over MPI ranks, at a fixed global batch split across the ranks:
//
//   mpirun -np P bench_dist [--blocks 8] [--batch 256] [--policy stored|checkpoint] [--shard]
//                           [--shard-gradients] [--shard-parameters] [--bucket-mib 4] [--steps 7]
//                           [--warmup 2] [--alone] [--offload] [--precision fp32|bf16]
//                           [--no-prefetch] [--keep] [--shard-master]
//
// --alone trains the model without remat::dist (one process, no communicator): the baseline.
// --shard shards the optimizer state (ZeRO-1); --shard-gradients the gradients too (ZeRO-2);
// --shard-parameters the parameters too (ZeRO-3), each layer's gathered while the one before it
// runs (--no-prefetch: as it starts); --keep keeps them, once gathered, until the pass ends
// (options::keep_parameters_for_backward: gathered once a step, the whole at the pass's peak).
// --precision bf16 trains mixed<bfloat16> (fp32 master weights and a bf16 compute copy, which
// ZeRO-3 shards too).
// --offload steps with OffloadedAdamW instead of AdamW (the state in its own host allocator; on
// the host its copies are memcpy: what the offload's bookkeeping and copies cost); with
// --precision bf16, its offload_options::master_weights too (the fp32 master weights in its
// host allocator; ZeRO-1 and 2 gather them and the compute copy after each step).
// --shard-master (with --precision bf16, under ZeRO-1 or 2): options::shard_master_weights, each
// rank keeps its shard of the fp32 master weights only and the ranks gather the bf16 compute copy
// after each step (with --offload the model is built with its master weights on the host).
// Rank 0 prints one JSON line: ranks, OpenMP threads per rank, the median step time, samples per
// second, the bytes each rank sent into reductions per step against the model's gradient bytes,
// the bytes all-gathered (sharded), the buckets and how many started while backward was running,
// and rank 0's memory: parameters and gradients held at rest and at the pass's peak (pages the
// process holds, measured; and the plan's peak) and optimizer state. bench/dist_scaling.sh runs the configurations and writes
// the table.
#include <remat/parallel/mpi.hpp>
#include <remat/remat.hpp>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

using namespace remat;

namespace {

constexpr std::size_t D = 1024;
using Block = Residual<Seq<LayerNorm<D>, Linear<D, D>, GELU, Linear<D, D>>>;
constexpr std::size_t N = 8;
using Stored = Seq<Repeat<N, Block>, LayerNorm<D>>;
using Checkpoint = Seq<Repeat<N, Checkpointed<Block>>, LayerNorm<D>>;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// AdamW for a model (a template of the model, as OffloadedAdamW is).
template <class M>
using adamw_for = AdamW<typename M::value_type, typename M::device, typename M::compute_type>;

// OffloadedAdamW with the master weights in its host memory (offload_options::master_weights).
template <class M>
struct offloaded_master : OffloadedAdamW<M> {
  offloaded_master(M& m, adamw_options o) : OffloadedAdamW<M>(m, o, {.master_weights = true}) {}
};

struct config {
  std::size_t batch = 256;
  std::string policy = "stored";
  bool shard = false, shard_gradients = false, shard_parameters = false, alone = false, offload = false;
  bool prefetch = true;  // ZeRO-3: the next layer's parameters gathered while one runs
  bool keep = false;     // ZeRO-3: a pass's gathered parameters kept until it ends
  bool shard_master = false;  // options::shard_master_weights
  std::string precision = "fp32";
  double bucket_mib = 4;
  int steps = 7, warmup = 2;
};

template <class Net, template <class> class Opt, class P>
int run(config const& c) {
  using M = model<Net, host, P>;
  memory::caching_allocator<host> alloc, master_alloc;
  std::optional<M> held;
  // (--shard-master --offload: the master weights built where the optimizer keeps them)
  if constexpr (M::mixed_precision && !std::is_same_v<Opt<M>, adamw_for<M>>)
    if (c.shard_master) held.emplace(seed{1}, alloc, host_master_weights{master_alloc});
  if (!held) held.emplace(seed{1}, alloc);
  M& m = *held;
  int rank = 0, ranks = 1;
  std::optional<dist::data_parallel<M>> dp;
  if (!c.alone) {
    dp.emplace(m, MPI_COMM_WORLD,
               dist::options{.bucket_bytes = std::size_t(c.bucket_mib * 1048576.0),
                             .shard_optimizer = c.shard || c.shard_gradients || c.shard_parameters,
                             .shard_gradients = c.shard_gradients || c.shard_parameters,
                             .shard_master_weights = c.shard_master,
                             .shard_parameters = c.shard_parameters,
                             .prefetch_parameters = c.prefetch,
                             .keep_parameters_for_backward = c.keep});
    rank = dp->rank();
    ranks = dp->size();
  }
  Opt<M> opt(m, {.lr = 1e-4});
  std::size_t const lo = c.batch * std::size_t(rank) / std::size_t(ranks);
  std::size_t const hi = c.batch * std::size_t(rank + 1) / std::size_t(ranks);
  tensor<float> x(index_t(hi - lo), index_t(D)), y(index_t(hi - lo), index_t(D));
  for (std::size_t i = 0; i < x.size(); ++i) {
    x.data()[i] = float(std::sin(0.001 * double(i + lo * D)));
    y.data()[i] = float(std::cos(0.002 * double(i + lo * D)));
  }
  std::vector<double> times;
  double loss = 0;
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    if (dp) MPI_Barrier(MPI_COMM_WORLD);
    double const t0 = now();
    loss = dp ? dp->template train_step<MSE>(x.view(), y.view(), opt) : m.template train_step<MSE>(x.view(), y.view(), opt);
    double const t = now() - t0;
    if (s >= c.warmup) times.push_back(t);
  }
  // Every rank's median; the slowest sets the pace.
  double step = median(times);
  if (dp) MPI_Allreduce(MPI_IN_PLACE, &step, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank != 0) return 0;
  dist::traffic const tr = dp ? dp->last_step_traffic() : dist::traffic{};
  std::size_t const grad_bytes = M::parameter_count * sizeof(float);
  // (the weights: the fp32 master and, in mixed precision, the 16-bit compute copy)
  std::size_t const weight_bytes = M::parameter_count * (sizeof(float) + (M::mixed_precision ? sizeof(typename M::compute_type) : 0));
  double const flop = 3.0 * 2.0 * double(c.batch) * double(N) * 2.0 * double(D) * double(D);
  std::size_t host_state = 0;  // (OffloadedAdamW: its host allocator's bytes)
  if constexpr (requires { opt.host_allocator(); }) host_state = opt.host_allocator().stats().total.in_use;
  // The gradients held: with a wrapper, the pages of its buffer (measured); alone, the whole buffer.
  dist::gradient_memory const g =
      dp ? dp->gradient_pages() : dist::gradient_memory{grad_bytes, grad_bytes, grad_bytes, grad_bytes};
  // The parameters held, likewise (ZeRO-3 gives back the pages of those the rank does not own).
  dist::gradient_memory const p =
      dp ? dp->parameter_pages() : dist::gradient_memory{weight_bytes, weight_bytes, weight_bytes, weight_bytes};
  int const zero = c.shard_parameters ? 3 : c.shard_gradients ? 2 : c.shard ? 1 : 0;
  std::printf(
      "{\"bench\": \"dist\", \"mode\": \"%s\", \"ranks\": %d, \"threads\": %d, \"policy\": \"%s\", \"shard\": %s, "
      "\"batch\": %zu, \"blocks\": %zu, \"width\": %zu, \"step_s\": %.6f, \"samples_per_s\": %.1f, "
      "\"gflop_per_s\": %.2f, \"model_grad_bytes\": %zu, \"reduced_bytes\": %zu, \"gathered_bytes\": %zu, "
      "\"buckets\": %zu, \"overlapped_buckets\": %zu, \"optimizer_state_bytes\": %zu, \"offload\": %s, "
      "\"offloaded_host_bytes\": %zu, \"zero\": %d, \"param_bytes\": %zu, \"grad_held_bytes\": %zu, "
      "\"grad_peak_bytes\": %zu, \"grad_planned_peak_bytes\": %zu, \"grad_pages_bytes\": %zu, "
      "\"param_held_bytes\": %zu, \"param_peak_bytes\": %zu, \"param_planned_peak_bytes\": %zu, "
      "\"param_pages_bytes\": %zu, \"precision\": \"%s\", \"prefetch\": %s, \"prefetched_bytes\": %zu, "
      "\"keep\": %s, \"shard_master\": %s, "
      "\"loss\": %.6f}\n",
      c.alone ? "alone" : "dist", ranks, omp_get_max_threads(), c.policy.c_str(), c.shard ? "true" : "false", c.batch,
      N, D, step, double(c.batch) / step, flop / step * 1e-9, grad_bytes, tr.reduced, tr.gathered, tr.buckets,
      tr.overlapped, alloc.stats()[memory::tag::optimizer_state].in_use, c.offload ? "true" : "false", host_state, zero,
      alloc.stats()[memory::tag::parameters].in_use, g.now, zero >= 2 ? g.last_peak : g.whole, g.planned_peak, g.whole,
      p.now, zero == 3 || c.shard_master ? p.last_peak : p.whole, p.planned_peak, p.whole, c.precision.c_str(),
      zero == 3 && c.prefetch ? "true" : "false", tr.prefetched, zero == 3 && c.keep ? "true" : "false",
      c.shard_master ? "true" : "false", loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    bool const v = i + 1 < argc;
    if (v && !std::strcmp(argv[i], "--batch")) c.batch = std::size_t(std::atol(argv[++i]));
    else if (v && !std::strcmp(argv[i], "--policy")) c.policy = argv[++i];
    else if (v && !std::strcmp(argv[i], "--steps")) c.steps = std::atoi(argv[++i]);
    else if (v && !std::strcmp(argv[i], "--warmup")) c.warmup = std::atoi(argv[++i]);
    else if (v && !std::strcmp(argv[i], "--bucket-mib")) c.bucket_mib = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--shard")) c.shard = true;
    else if (!std::strcmp(argv[i], "--shard-gradients")) c.shard_gradients = true;
    else if (!std::strcmp(argv[i], "--shard-parameters")) c.shard_parameters = true;
    else if (!std::strcmp(argv[i], "--no-prefetch")) c.prefetch = false;
    else if (!std::strcmp(argv[i], "--keep")) c.keep = true;
    else if (!std::strcmp(argv[i], "--shard-master")) c.shard_master = true;
    else if (!std::strcmp(argv[i], "--alone")) c.alone = true;
    else if (!std::strcmp(argv[i], "--offload")) c.offload = true;
    else if (v && !std::strcmp(argv[i], "--precision")) c.precision = argv[++i];
    else {
      std::fprintf(stderr, "bench_dist: unknown or incomplete option '%s'\n", argv[i]);
      return 1;
    }
  }
  if (c.policy != "stored" && c.policy != "checkpoint") {
    std::fprintf(stderr, "bench_dist: --policy must be stored or checkpoint, found '%s'\n", c.policy.c_str());
    return 1;
  }
  if (c.precision != "fp32" && c.precision != "bf16") {
    std::fprintf(stderr, "bench_dist: --precision must be fp32 or bf16, found '%s'\n", c.precision.c_str());
    return 1;
  }
  auto go = [&] {
    if (c.precision == "bf16" && c.offload)
      return c.policy == "stored" ? run<Stored, offloaded_master, mixed<bfloat16>>(c)
                                  : run<Checkpoint, offloaded_master, mixed<bfloat16>>(c);
    if (c.precision == "bf16")
      return c.policy == "stored" ? run<Stored, adamw_for, mixed<bfloat16>>(c) : run<Checkpoint, adamw_for, mixed<bfloat16>>(c);
    if (c.offload)
      return c.policy == "stored" ? run<Stored, OffloadedAdamW, fp32>(c) : run<Checkpoint, OffloadedAdamW, fp32>(c);
    return c.policy == "stored" ? run<Stored, adamw_for, fp32>(c) : run<Checkpoint, adamw_for, fp32>(c);
  };
  if (c.alone) return go();
  dist::environment env(argc, argv);
  return go();
}
