// remat::dist on the GPU: a cuda model in data_parallel, its gradients and parameters through
// NCCL. Each rank takes device rank % devices. Under mpirun -np P it checks, against one model
// trained on the whole batch on one GPU:
//   - P ranks each training on 1/P of the batch (3 AdamW steps, with and without a sharded
//     optimizer) end with the same parameters as the single model: bit for bit with one rank
//     (a sum over one rank is the identity), to rounding with more;
//   - every rank holds the same parameters, bit for bit;
//   - the optimizer's state saved by dist::save and dist::save_shards loads back bit for bit;
//   - labels out of range on the last rank make every rank throw, and change nothing;
//   - ZeRO-2 (shard_gradients: the gradient buffer in granules of virtual memory, mapped as
//     backward is about to write them and given back once reduced) trains as ZeRO-1, and ZeRO-3
//     (shard_parameters, and keeping what a pass gathers) as ZeRO-2, bit for bit, in fp32 and
//     bf16; a rank then holds its shard's granules only, the most a step held is the plan's, and
//     the model's gradients read back whole (the rest zero) once the wrapper is gone;
//   - the master weights on the host (OffloadedAdamW) under ZeRO-0, 1 and 2 train as alone, and
//     under ZeRO-3 (each rank keeping its shard of them on the host) as under ZeRO-2.
// Without a GPU it exits with 77 (skipped). Built by nvcc in CI; run on a GPU by `ctest -L cuda`.
#include <remat/parallel/mpi.hpp>
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace remat;
using gpu = remat::cuda;

namespace {

constexpr std::size_t W = 32, In = 12, Classes = 5;
constexpr index_t batch = 48;  // divisible by 1, 2, 3, 4, 6 and 8 ranks
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 64>, GELU, Linear<64, W>>>;
using Net = Seq<Linear<In, W>, Checkpointed<Block>, Block, Linear<W, Classes>>;
using Model = model<Net, gpu>;

int failures = 0;
int rank = 0, ranks = 1;

void check(bool ok, char const* what) {
  if (ok) return;
  ++failures;
  std::printf("rank %d: FAILED: %s\n", rank, what);
}

std::vector<float> inputs() {
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<float> v(std::size_t(batch) * In);
  for (auto& x : v) x = float(d(rng));
  return v;
}
std::vector<std::int32_t> labels() {
  std::vector<std::int32_t> l(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < l.size(); ++i) l[i] = std::int32_t((i * 7 + 3) % Classes);
  return l;
}

template <class T>
tensor<T, gpu> on_gpu(std::vector<T> const& v, std::size_t first_row, std::size_t rows, std::size_t cols) {
  tensor<T, gpu> t{index_t(rows), index_t(cols)};
  t.copy_from(std::vector<T>(v.begin() + std::ptrdiff_t(first_row * cols),
                             v.begin() + std::ptrdiff_t((first_row + rows) * cols)));
  return t;
}

// The single model on the whole batch.
std::vector<float> reference(int steps) {
  Model m(seed{5});
  AdamW opt(m, {.lr = 1e-2});
  auto x = on_gpu(inputs(), 0, batch, In);
  auto y = on_gpu(labels(), 0, batch, 1);
  for (int s = 0; s < steps; ++s) m.train_step<SoftmaxCrossEntropy>(x, y, opt);
  return tensor_to_host(m.parameters());
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The options of a sharding level: 0 whole; 1 ZeRO-1 (shard_optimizer); 2 ZeRO-2
// (shard_gradients too); 3 ZeRO-3 (shard_parameters too); 4 ZeRO-3 keeping what a pass gathers.
dist::options sharding(int level, std::size_t bucket_bytes) {
  return {.bucket_bytes = bucket_bytes,
          .shard_optimizer = level > 0,
          .shard_gradients = level > 1,
          .shard_parameters = level > 2,
          .keep_parameters_for_backward = level > 3};
}

// Every parameter, on every rank (ZeRO-3: gathered first).
template <class DP>
std::vector<float> parameters_of(DP& dp) {
  dp.gather_parameters();
  return tensor_to_host(std::as_const(dp.model()).parameters());
}

// Trains at a sharding level (see sharding) and returns the parameters after the steps.
std::vector<float> check_parallel(int level, std::vector<float> const& want, int steps) {
  bool const shard = level > 0;
  std::size_t const rows = std::size_t(batch) / std::size_t(ranks), first = rows * std::size_t(rank);
  Model m(seed{5});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level, 4096));
  AdamW opt(m, {.lr = 1e-2});
  auto x = on_gpu(inputs(), first, rows, In);
  auto y = on_gpu(labels(), first, rows, 1);
  for (int s = 0; s < steps; ++s) dp.train_step<SoftmaxCrossEntropy>(x, y, opt);
  check(dp.last_step_traffic().buckets > 1, "the gradients went in more than one bucket");
  std::vector<float> got = parameters_of(dp);
  if (ranks == 1) {
    check(same_bits(got, want), shard ? "sharded, one rank: the single model's parameters, bit for bit"
                                      : "one rank: the single model's parameters, bit for bit");
  } else {
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])) / (1e-3 + std::fabs(double(want[i]))));
    if (rank == 0) std::printf("%s: largest relative difference from the single model %.3g\n",
                               level == 4 ? "ZeRO-3, kept" : level == 3 ? "ZeRO-3" : level == 2 ? "ZeRO-2" : shard ? "sharded" : "whole", worst);
    check(worst < 1e-3, "P ranks: the single model's parameters, to rounding");
  }
  std::vector<float> first_rank = got;
  MPI_Bcast(first_rank.data(), int(first_rank.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  check(same_bits(got, first_rank), "every rank holds rank 0's parameters, bit for bit");

  // The optimizer's state gathered to rank 0 (dist::save) and per rank (dist::save_shards), each
  // loaded back into a new optimizer on every rank.
  std::string const file = std::string("dist_cuda_adamw_") + (shard ? "sharded_" : "whole_") +
                           std::to_string(level) + "_" + std::to_string(ranks) +
                           ".safetensors";
  dist::save(dp, opt, file);
  dist::save_shards(dp, opt, file);
  AdamW gathered(m, {.lr = 1e-2}), per_rank(m, {.lr = 1e-2});
  dist::load(dp, gathered, file);
  dist::load_shards(dp, per_rank, file);
  for (AdamW<float, gpu>* loaded : {&gathered, &per_rank})
    check(loaded->steps() == opt.steps() &&
              same_bits(tensor_to_host(loaded->exp_avg().view()), tensor_to_host(opt.exp_avg().view())) &&
              same_bits(tensor_to_host(loaded->exp_avg_sq().view()), tensor_to_host(opt.exp_avg_sq().view())),
          "dist::load and dist::load_shards restore this rank's moments and step count, bit for bit");
  MPI_Barrier(MPI_COMM_WORLD);
  std::remove(dist::shard_file(file, rank, ranks).c_str());
  if (rank == 0) std::remove(file.c_str());

  // Bad labels on the last rank: every rank throws, nothing changes.
  auto bad = labels();
  if (rank == ranks - 1) bad[first] = std::int32_t(Classes);
  auto yb = on_gpu(bad, first, rows, 1);
  bool threw = false;
  try {
    dp.train_step<SoftmaxCrossEntropy>(x, yb, opt);
  } catch (error const& e) {
    threw = true;
    if (rank != ranks - 1) check(std::strstr(e.what(), "rank") != nullptr, "the other ranks name the failing rank");
  }
  check(threw, "labels out of range on one rank: every rank throws");
  check(same_bits(parameters_of(dp), got), "and the parameters are unchanged");
  return got;
}

// ZeRO-2's and ZeRO-3's memory on a model of 12 granules of fp32 values (2 MiB each): what a rank
// holds after a step and the most it held during one, against the plan; training as at level 2,
// bit for bit; the gradients and parameters once the wrapper is gone.
template <class Precision>
std::vector<float> check_granules(int level, std::vector<float> const* zero2) {
  using Wide = Seq<Linear<In, 1024>, Repeat<6, Checkpointed<Residual<Linear<1024, 1024>>>>, Linear<1024, Classes>>;
  using M = model<Wide, gpu, Precision>;
  std::size_t const rows = std::size_t(batch) / std::size_t(ranks), first = rows * std::size_t(rank);
  M m(seed{9});
  auto x = on_gpu(inputs(), first, rows, In);
  auto y = on_gpu(labels(), first, rows, 1);
  std::vector<float> reduced_shard, trained;
  param_range s{};
  {
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level, std::size_t(4) << 20));
    AdamW opt(m, {.lr = 1e-3});
    s = dp.shard();
    std::size_t const granule = 2u << 20, shard_bytes = s.size() * sizeof(float);
    // The plan made before the wrapper (memory_plan with the wrapper's options): the granules
    // start on a granule, so it is the wrapper's, granule for granule; the allocator's block the
    // gradients left went back to the device (not into its cache).
    auto const plan = memory_plan<Wide, Precision, AdamW, SoftmaxCrossEntropy, gpu>(
        rows, {.ranks = std::size_t(ranks), .rank = std::size_t(rank), .shard_gradients = true,
               .shard_parameters = level > 2, .keep_parameters_for_backward = level > 3,
               .bucket_bytes = std::size_t(4) << 20});
    check(plan.gradient_pages == dp.gradient_pages().planned_peak,
          "memory_plan's gradient granules of a ZeRO-2 rank are the wrapper's plan");
    if (level > 2)
      check(plan.master_pages + plan.compute_pages + plan.gather_pages == dp.parameter_pages().planned_peak,
            "memory_plan's parameter granules and gather buffers of a ZeRO-3 rank are the wrapper's plan");
    check(m.allocator().stats()[memory::tag::gradients].reserved == 0,
          "the gradients' block goes back to the device as they move into granules");
    for (int step = 0; step < 3; ++step) {
      m.zero_grad();
      dp.template accumulate<SoftmaxCrossEntropy>(x, y);
      dist::gradient_memory const g = dp.gradient_pages(), p = dp.parameter_pages();
      if (rank == 0 && step == 0)
        std::printf("level %d on the GPU, %d ranks: gradient granules %zu of %zu bytes held, at most %zu (plan %zu); "
                    "parameters %zu of %zu, at most %zu (plan %zu)\n",
                    level, ranks, g.now, g.whole, g.last_peak, g.planned_peak, p.now, p.whole, p.last_peak,
                    p.planned_peak);
      check(g.last_peak == g.planned_peak, "the most a pass held of the gradients is the plan's, granule for granule");
      check(g.now <= shard_bytes + 2 * granule, "a rank holds the gradient granules of its shard only");
      if (ranks > 1) check(g.now < g.whole, "some gradient granules are given back");
      if (level > 2 && ranks > 1) {
        check(p.last_peak == p.planned_peak, "ZeRO-3: the most a pass held of the parameters is the plan's");
        check(p.now < p.whole, "ZeRO-3: some parameter granules are given back");
      }
      {
        [[maybe_unused]] auto const on_stream = m.stream_scope();
        opt.step();
      }
    }
    trained = parameters_of(dp);
    m.zero_grad();
    dp.template accumulate<SoftmaxCrossEntropy>(x, y);
    dp.finish();
    reduced_shard = tensor_to_host(std::as_const(m).gradients().row_range(s.begin, s.size()));
  }
  if (zero2) check(same_bits(trained, *zero2), "ZeRO-3 trains as ZeRO-2, bit for bit");
  // The wrapper is gone: the gradients are the model's own memory again, its shard as reduced;
  // the parameters are whole after parameters_of (ZeRO-3's gather).
  std::vector<float> const after = tensor_to_host(std::as_const(m).gradients());
  bool zero_elsewhere = true;
  for (std::size_t i = 0; i < after.size(); ++i)
    if ((i < s.begin || i >= s.end) && after[i] != 0.0f) zero_elsewhere = false;
  check(zero_elsewhere, "after the wrapper: the gradients outside the shard read zero");
  check(same_bits(std::vector<float>(after.begin() + std::ptrdiff_t(s.begin), after.begin() + std::ptrdiff_t(s.end)),
                  reduced_shard),
        "after the wrapper: the shard's gradients are as reduced, bit for bit");
  if (level > 2 && ranks > 1)
    check(m.link().partial_parameters(), "after a ZeRO-3 wrapper whose last pass let the parameters go: partial");
  return trained;
}

// ZeRO-2 (or `level`) with the gradients on the host (OffloadedAdamW's
// offload_options::gradients): each rank's shard comes down as its reductions end and its granules
// go as the others' do. Trains as OffloadedAdamW with them on the device, bit for bit (no
// clipping: neither computes a norm), and a pass holds its plan's granules, fewer than with the
// shard kept.
template <class Precision>
void check_offloaded_gradients(int level = 2) {
  using Wide = Seq<Linear<In, 1024>, Repeat<6, Checkpointed<Residual<Linear<1024, 1024>>>>, Linear<1024, Classes>>;
  using M = model<Wide, gpu, Precision>;
  std::size_t const rows = std::size_t(batch) / std::size_t(ranks), first = rows * std::size_t(rank);
  auto run = [&](bool on_host, dist::gradient_memory& g) {
    M m(seed{9});
    auto x = on_gpu(inputs(), first, rows, In);
    auto y = on_gpu(labels(), first, rows, 1);
    dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level, std::size_t(4) << 20));
    OffloadedAdamW opt(m, {.lr = 1e-3}, {.gradients = on_host ? gradient_place::host : gradient_place::device});
    for (int step = 0; step < 3; ++step) {
      m.zero_grad();
      for (int k = 0; k < 2; ++k) dp.template accumulate<SoftmaxCrossEntropy>(x, y, 0.5);
      [[maybe_unused]] auto const on_stream = m.stream_scope();
      opt.step();
    }
    g = dp.gradient_pages();
    return parameters_of(dp);
  };
  dist::gradient_memory kept{}, sent{};
  std::vector<float> const on_device = run(false, kept), on_host = run(true, sent);
  if (rank == 0)
    std::printf("ZeRO-%d on the GPU, %d ranks, %s: gradient granules at most %zu bytes with the shard kept, %zu with "
                "it on the host (plan %zu)\n",
                level, ranks, Precision::name, kept.last_peak, sent.last_peak, sent.planned_peak);
  check(same_bits(on_host, on_device), "ZeRO-2/3 with the gradients on the host trains as with them on the device, bit for bit");
  check(sent.last_peak == sent.planned_peak, "the gradients on the host: the most a pass held is the plan's");
  check(sent.planned_peak < kept.planned_peak, "the gradients on the host: fewer granules than with the shard kept");
}

// The master weights on the host (OffloadedAdamW's offload_options::master_weights, ZeRO-Offload's
// placement) under ZeRO-0, 1 and 2: each rank updates its shard on the host and writes its part of
// the device's compute copy; a sharded wrapper gathers the master weights through MPI (host memory)
// and the compute copy through NCCL. Trains as the same optimizer alone on the whole batch: bit for
// bit on one rank, to rounding on more; every rank holds the same master weights and compute copy,
// bit for bit. Built with host_master_weights (a seed of each rank's own), the wrapper broadcasts
// rank 0's through MPI; with shard_master_weights each rank keeps the pages of its shard of them
// only, and the ranks gather the compute copy alone. Returns the master weights after the steps.
std::vector<float> check_master_on_host(int level, bool gradients_on_host, bool built_on_host,
                                        bool shard_master = false) {
  using P = mixed<bfloat16, DynamicLossScale>;
  using M = model<Net, gpu, P>;
  auto const gradients = gradients_on_host ? gradient_place::host : gradient_place::device;
  auto x = on_gpu(inputs(), 0, batch, In);
  auto y = on_gpu(labels(), 0, batch, 1);
  std::vector<float> want;
  std::vector<bfloat16> want_copy;
  {
    M m(seed{5});
    OffloadedAdamW opt(m, {.lr = 1e-2}, {.master_weights = true});
    for (int s = 0; s < 3; ++s) m.train_step<SoftmaxCrossEntropy>(x, y, opt);
    want = tensor_to_host(std::as_const(m).parameters());
    want_copy = tensor_to_host(m.compute_parameters());
  }
  std::size_t const rows = std::size_t(batch) / std::size_t(ranks), first = rows * std::size_t(rank);
  auto xs = on_gpu(inputs(), first, rows, In);
  auto ys = on_gpu(labels(), first, rows, 1);
  memory::caching_allocator<host> host_side;  // (outlives the model)
  std::optional<M> held;
  if (built_on_host)
    held.emplace(seed{5 + 11 * std::uint64_t(rank)}, memory::default_allocator<gpu>(), host_master_weights{host_side});
  else
    held.emplace(seed{5});
  M& m = *held;
  dist::options o = sharding(level, 4096);
  o.shard_master_weights = shard_master;
  dist::data_parallel dp(m, MPI_COMM_WORLD, o);
  OffloadedAdamW opt(m, {.lr = 1e-2}, {.master_weights = true, .gradients = gradients});
  for (int s = 0; s < 3; ++s) dp.train_step<SoftmaxCrossEntropy>(xs, ys, opt);
  check(m.master_on_host() && opt.offloads_master_weights(), "the master weights live on the host");
  if (shard_master) {
    dist::gradient_memory const p = dp.parameter_pages();
    check(p.now == p.planned_peak, "shard_master_weights on the host: the pages held are the plan's");
    if (ranks > 1) check(p.now < p.whole, "shard_master_weights on the host: some pages are given back");
    check(dp.last_step_traffic().gathered == (std::size_t(m.parameter_count) - dp.shard().size()) * sizeof(bfloat16),
          "shard_master_weights on the host: a step gathers the compute copy alone");
    dp.gather_parameters();
  }
  std::vector<float> const got = tensor_to_host(std::as_const(m).parameters());
  std::vector<bfloat16> const copy = tensor_to_host(m.compute_parameters());
  if (ranks == 1) {
    check(same_bits(got, want), "the master weights on the host, one rank: as trained alone, bit for bit");
    check(std::memcmp(copy.data(), want_copy.data(), copy.size() * sizeof(bfloat16)) == 0,
          "the master weights on the host, one rank: the compute copy as trained alone, bit for bit");
  } else {
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])) / (1e-3 + std::fabs(double(want[i]))));
    check(worst < 1e-2, "the master weights on the host, P ranks: as trained alone, to rounding");
  }
  std::vector<float> first_rank = got;
  MPI_Bcast(first_rank.data(), int(first_rank.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  check(same_bits(got, first_rank), "the master weights on the host: every rank holds rank 0's, bit for bit");
  std::vector<bfloat16> first_copy = copy;
  MPI_Bcast(first_copy.data(), int(first_copy.size() * sizeof(bfloat16)), MPI_BYTE, 0, MPI_COMM_WORLD);
  check(std::memcmp(copy.data(), first_copy.data(), copy.size() * sizeof(bfloat16)) == 0,
        "the master weights on the host: every rank holds rank 0's compute copy, bit for bit");
  if (rank == 0)
    std::printf("the master weights on the host under ZeRO-%d (gradients on the %s%s%s), %d ranks: checked\n", level,
                gradients_on_host ? "host" : "device", built_on_host ? ", built there" : "",
                shard_master ? ", each rank its shard" : "", ranks);
  return got;
}

// dist::options::shard_master_weights on the GPU (ZeRO-1 and 2, bf16 with a dynamic scale): the
// master weights move into granules of the wrapper's and a rank keeps its shard's; the compute
// copy stays whole, gathered through NCCL after each step. Trains as with the master weights
// whole, bit for bit; the compute copy is the cast of the gathered master weights, every value;
// what a rank holds is the plan's, and on more than one rank less than the whole.
void check_master_shard(int level) {
  using Wide = Seq<Linear<In, 1024>, Repeat<6, Checkpointed<Residual<Linear<1024, 1024>>>>, Linear<1024, Classes>>;
  using M = model<Wide, gpu, mixed<bfloat16, DynamicLossScale>>;
  std::size_t const rows = std::size_t(batch) / std::size_t(ranks), first = rows * std::size_t(rank);
  auto x = on_gpu(inputs(), first, rows, In);
  auto y = on_gpu(labels(), first, rows, 1);
  auto run = [&](bool shard_master, dist::gradient_memory& p, std::size_t& wrong) {
    M m(seed{9});
    dist::options o = sharding(level, std::size_t(4) << 20);
    o.shard_master_weights = shard_master;
    dist::data_parallel dp(m, MPI_COMM_WORLD, o);
    if (shard_master) {  // (the plan made before the wrapper: its granules, exactly)
      auto const plan = memory_plan<Wide, mixed<bfloat16, DynamicLossScale>, AdamW, SoftmaxCrossEntropy, gpu>(
          rows, {.ranks = std::size_t(ranks), .rank = std::size_t(rank), .shard_gradients = level >= 2,
                 .shard_master_weights = true, .bucket_bytes = std::size_t(4) << 20});
      check(plan.master_pages == dp.parameter_pages().planned_peak,
            "memory_plan's master-weight granules under shard_master_weights are the wrapper's plan");
    }
    AdamW opt(m, {.lr = 1e-3, .clip_norm = 1.0});
    for (int step = 0; step < 3; ++step) dp.template train_step<SoftmaxCrossEntropy>(x, y, opt);
    p = dp.parameter_pages();
    std::vector<float> const w = parameters_of(dp);
    std::vector<bfloat16> const copy = tensor_to_host(m.compute_parameters());
    wrong = 0;
    for (std::size_t i = 0; i < w.size(); ++i) wrong += bfloat16(w[i]).bits() != copy[i].bits();
    return w;
  };
  dist::gradient_memory whole_pages{}, shard_pages{};
  std::size_t wrong_whole = 0, wrong_shard = 0;
  std::vector<float> const whole = run(false, whole_pages, wrong_whole);
  std::vector<float> const shard = run(true, shard_pages, wrong_shard);
  if (rank == 0)
    std::printf("shard_master_weights under ZeRO-%d on the GPU, %d ranks: master weights' granules %zu of %zu bytes "
                "held (plan %zu)\n",
                level, ranks, shard_pages.now, shard_pages.whole, shard_pages.planned_peak);
  check(same_bits(whole, shard), "shard_master_weights trains as with the master weights whole, bit for bit");
  check(wrong_shard == 0 && wrong_whole == 0, "shard_master_weights: the compute copy is the master weights' cast");
  check(shard_pages.now == shard_pages.planned_peak, "shard_master_weights: the granules held are the plan's");
  if (ranks > 1) check(shard_pages.now < shard_pages.whole, "shard_master_weights: some granules are given back");
}

// ZeRO-3 with ZeRO-Offload's placement (a model built with host_master_weights, OffloadedAdamW;
// the gradients on the device or on the host too): each rank keeps its shard of the master
// weights in host memory and of the compute copy in the wrapper's granules, updates its shard on
// the host and writes its part of the compute copy, which the next pass gathers layer by layer
// through NCCL. Trains as ZeRO-2 with the master weights on the host (`zero2`), bit for bit; the
// compute copy's shard is the cast of the master weights' (not cast again after a step); what a
// pass held is the wrapper's plan, and memory_plan's, made before the wrapper, is that plan on the
// device's granules and at most 3 host pages more for the master weights. Moving the master
// weights once a ZeRO-3 wrapper holds them on the device stays refused, the model unchanged.
void check_zero3_master_on_host(int level, bool gradients_on_host, std::vector<float> const& zero2) {
  using P = mixed<bfloat16, DynamicLossScale>;
  using M = model<Net, gpu, P>;
  std::size_t const rows = std::size_t(batch) / std::size_t(ranks), first = rows * std::size_t(rank);
  auto xs = on_gpu(inputs(), first, rows, In);
  auto ys = on_gpu(labels(), first, rows, 1);
  memory::caching_allocator<host> host_side;  // (outlives the model)
  M m(seed{5 + 11 * std::uint64_t(rank)}, memory::default_allocator<gpu>(), host_master_weights{host_side});
  auto const plan = memory_plan<Net, P, OffloadedAdamW, SoftmaxCrossEntropy, gpu>(
      rows, {.ranks = std::size_t(ranks), .rank = std::size_t(rank), .offload_master_weights = true,
             .offload_gradients = gradients_on_host, .shard_parameters = true,
             .keep_parameters_for_backward = level > 3, .bucket_bytes = 4096});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(level, 4096));
  auto const gradients = gradients_on_host ? gradient_place::host : gradient_place::device;
  OffloadedAdamW opt(m, {.lr = 1e-2}, {.master_weights = true, .gradients = gradients});
  for (int s = 0; s < 3; ++s) dp.train_step<SoftmaxCrossEntropy>(xs, ys, opt);
  check(m.master_on_host() && opt.offloads_master_weights(), "ZeRO-3, the master weights on the host: they live there");
  dist::gradient_memory const p = dp.parameter_pages();
  check(p.last_peak == p.planned_peak, "ZeRO-3, the master weights on the host: a pass held the wrapper's plan");
  std::size_t const planned = plan.master_pages + plan.compute_pages + plan.gather_pages;
  check(plan.master_pages_on_host && planned >= p.planned_peak && planned <= p.planned_peak + 3 * 4096,
        "ZeRO-3, the master weights on the host: memory_plan's pages are the wrapper's (the host's within 3 pages)");
  // The compute copy's shard, as the last step wrote it, against the cast of the master weights.
  param_range const own = dp.shard();
  std::vector<bfloat16> const copy = tensor_to_host(m.compute_parameters());
  std::vector<float> const got = parameters_of(dp);
  std::size_t wrong = 0;
  for (std::size_t i = own.begin; i < own.end; ++i) wrong += bfloat16(got[i]).bits() != copy[i].bits();
  check(wrong == 0, "ZeRO-3, the master weights on the host: the compute copy's shard is their cast");
  check(same_bits(got, zero2), "ZeRO-3 with the master weights on the host trains as ZeRO-2, bit for bit");
  if (rank == 0)
    std::printf("ZeRO-3%s with the master weights on the host (gradients on the %s), %d ranks: parameter pages "
                "%zu of %zu bytes held, plan %zu (memory_plan %zu)\n",
                level > 3 ? " (kept for backward)" : "", gradients_on_host ? "host" : "device", ranks, p.now, p.whole,
                p.planned_peak, planned);
}

void check_master_moved_refused_under_zero3() {
  using M = model<Net, gpu, mixed<bfloat16, DynamicLossScale>>;
  M m(seed{5});
  dist::data_parallel dp(m, MPI_COMM_WORLD, sharding(3, 4096));
  bool refused = false;
  try {
    OffloadedAdamW opt(m, {.lr = 1e-2}, {.master_weights = true});
  } catch (argument_error const& e) {
    refused = std::strstr(e.what(), "host_master_weights") != nullptr;
  }
  check(refused && !m.master_on_host(), "moving the master weights under ZeRO-3: refused, the model unchanged");
}

}  // namespace

int main(int argc, char** argv) {
  dist::environment env(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the NCCL data-parallel test is skipped\n");
    return 77;
  }
  if (std::size_t(batch) % std::size_t(ranks) != 0) {
    std::printf("expected a rank count dividing %ld, found %d\n", long(batch), ranks);
    return 1;
  }
  if (cudaSetDevice(rank % devices) != cudaSuccess) return 1;
  try {
    std::vector<float> const want = reference(3);
    check_parallel(0, want, 3);
    std::vector<float> const zero1 = check_parallel(1, want, 3);
    std::vector<float> const zero2 = check_parallel(2, want, 3);
    check(same_bits(zero1, zero2), "ZeRO-2 trains as ZeRO-1, bit for bit");
    for (int level : {3, 4})
      check(same_bits(check_parallel(level, want, 3), zero2), "ZeRO-3 trains as ZeRO-2, bit for bit");
    std::vector<float> const fp32_zero2 = check_granules<fp32>(2, nullptr);
    for (int level : {3, 4}) check_granules<fp32>(level, &fp32_zero2);
    using bf16 = mixed<bfloat16, DynamicLossScale>;
    std::vector<float> const bf16_zero2 = check_granules<bf16>(2, nullptr);
    for (int level : {3, 4}) check_granules<bf16>(level, &bf16_zero2);
    for (int level : {2, 3}) {
      check_offloaded_gradients<fp32>(level);
      check_offloaded_gradients<bf16>(level);
    }
    for (int level : {0, 1, 2}) check_master_on_host(level, false, false);
    check_master_on_host(1, false, true);
    check_master_on_host(2, true, false);
    check_master_on_host(1, false, true, true);
    check_master_on_host(2, true, true, true);
    for (bool gradients_on_host : {false, true}) {
      std::vector<float> const zero2 = check_master_on_host(2, gradients_on_host, true);
      for (int level : {3, 4}) check_zero3_master_on_host(level, gradients_on_host, zero2);
    }
    check_master_moved_refused_under_zero3();
    for (int level : {1, 2}) check_master_shard(level);
  } catch (std::exception const& e) {
    std::printf("rank %d: FAILED with an exception: %s\n", rank, e.what());
    ++failures;
  }
  int any = 0;
  MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf(any ? "the NCCL data-parallel test FAILED\n" : "the NCCL data-parallel test passed\n");
  return any ? 1 : 0;
}
