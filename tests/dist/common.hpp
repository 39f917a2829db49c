// What the remat::dist test files share (tests/dist/test_*.cpp, one program under mpirun): the
// models, each step's batch and a rank's rows of it, the runs that the cases compare, and the
// sharding levels.
#pragma once

#include <remat/parallel/mpi.hpp>
#include <remat/remat.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace dist_test {

using namespace remat;

constexpr std::size_t W = 16, In = 6, Out = 5, Batch = 12;
using Block = Residual<Seq<LayerNorm<W>, Linear<W, 32>, GELU, Linear<32, W>>>;
template <class Middle>
using NetWith = Seq<Linear<In, W>, Middle, LayerNorm<W>, Linear<W, Out>>;
using Net = NetWith<Repeat<3, Block>>;
using CheckpointedNet = NetWith<Repeat<3, Checkpointed<Block>>>;
using DropNet = NetWith<Repeat<3, Residual<Seq<LayerNorm<W>, Linear<W, 32>, GELU, Dropout<0.25>, Linear<32, W>>>>>;

inline int world_rank() { return dist::environment::world_rank(); }
inline int world_size() { return dist::environment::world_size(); }

// The whole batch of step t (every rank makes the same), and this rank's rows of it.
struct batch {
  tensor<float> x{index_t(Batch), index_t(In)};
  tensor<std::int32_t> y{index_t(Batch), 1};
};
inline batch whole_batch(int t) {
  batch b;
  for (std::size_t i = 0; i < Batch * In; ++i) b.x.data()[i] = float(std::sin(0.37 * double(i) + 1.3 * t));
  for (std::size_t i = 0; i < Batch; ++i) b.y.data()[i] = std::int32_t((i * 7 + std::size_t(t)) % Out);
  return b;
}
inline param_range my_rows(int rank, int size) {
  return {Batch * std::size_t(rank) / std::size_t(size), Batch * std::size_t(rank + 1) / std::size_t(size)};
}
template <class T>
auto rows(tensor<T>& t, param_range r) {
  return t.view().row_range(r.begin, r.size());
}

template <class M>
std::vector<float> params_of(M const& m) {
  return tensor_to_host(m.parameters());
}

inline double max_abs_diff(std::vector<float> const& a, std::vector<float> const& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
  return d;
}

// AdamW for a model, as a template of the model (what OffloadedAdamW is).
template <class M>
using AdamW_of = AdamW<typename M::value_type, typename M::device, typename M::compute_type>;

// OffloadedAdamW with the model's master weights moved to the host (offload_options::master_weights).
template <class M>
struct OffloadedMaster : OffloadedAdamW<M> {
  OffloadedMaster(M& m, adamw_options o) : OffloadedAdamW<M>(m, o, {.master_weights = true}) {}
};

// OffloadedAdamW with the gradients on the host (offload_options::gradients; a ZeRO-2 wrapper
// sends each rank's shard down), and with the master weights there too.
template <class M>
struct OffloadedGrads : OffloadedAdamW<M> {
  OffloadedGrads(M& m, adamw_options o) : OffloadedAdamW<M>(m, o, {.gradients = gradient_place::host}) {}
};
template <class M>
struct OffloadedAll : OffloadedAdamW<M> {
  OffloadedAll(M& m, adamw_options o) : OffloadedAdamW<M>(m, o, {.master_weights = true, .gradients = gradient_place::host}) {}
};

// One process on the whole batch: `steps` AdamW steps.
template <class NetT, class P = fp32>
std::vector<float> reference(int steps, adamw_options o, std::vector<double>* losses = nullptr) {
  model<NetT, host, P> m(seed{7});
  AdamW opt(m, o);
  for (int t = 0; t < steps; ++t) {
    batch b = whole_batch(t);
    double const l = m.template train_step<SoftmaxCrossEntropy>(b.x.view(), b.y.view(), opt);
    if (losses) losses->push_back(l);
  }
  return params_of(m);
}

template <class NetT, class P = fp32, template <class> class Opt = AdamW_of>
std::vector<float> data_parallel_run(int steps, adamw_options o, dist::options d, std::vector<double>* losses = nullptr,
                                     dist::traffic* traffic = nullptr, std::string const& save_to = "") {
  model<NetT, host, P> m(seed{7});
  dist::data_parallel dp(m, MPI_COMM_WORLD, d);
  Opt<model<NetT, host, P>> opt(m, o);
  param_range const r = my_rows(dp.rank(), dp.size());
  for (int t = 0; t < steps; ++t) {
    batch b = whole_batch(t);
    double const l = dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
    if (losses) losses->push_back(l);
  }
  if (traffic) *traffic = dp.last_step_traffic();
  if (!save_to.empty()) dist::save(dp, opt, save_to);
  dp.gather_parameters();  // (ZeRO-3: the whole parameters, to compare; nothing otherwise)
  return params_of(m);
}

// Every rank holds the same vector (compared against rank 0's, bit for bit).
inline bool same_on_every_rank(std::vector<float> const& v) {
  std::vector<float> zero = v;
  MPI_Bcast(zero.data(), int(zero.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::memcmp(zero.data(), v.data(), v.size() * sizeof(float)) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

constexpr adamw_options opts{.lr = 1e-2, .weight_decay = 1e-2};

// What each rank keeps of the optimizer state, the gradients and the parameters: 0 everything,
// 1 ZeRO-1 (the optimizer state sharded), 2 ZeRO-2 (the gradients too), 3 ZeRO-3 (the parameters
// too); 4 is ZeRO-3 with each layer's gathered parameters kept until the training pass ends
// (options::keep_parameters_for_backward).
inline dist::options sharding(int level, std::size_t bucket_bytes = 512) {
  return {.bucket_bytes = bucket_bytes, .shard_optimizer = level >= 1, .shard_gradients = level >= 2,
          .shard_parameters = level >= 3, .keep_parameters_for_backward = level >= 4, .timeout_seconds = 60};
}
constexpr std::size_t n_params = model<Net>::parameter_count;

// The pages of a model's master weights that a rank keeping its shard of them gives back (ZeRO-3,
// shard_master_weights: those wholly inside the buffer and wholly outside the rank's shard), from their addresses, and those the kernel's page
// tables (mincore) find not held.
struct given_back {
  std::size_t expected = 0, found = 0;
  bool two_pages_a_rank = false;  // the buffer spans 2 pages a rank: some rank gives back a whole page
};
template <class M>
given_back master_pages_given_back(M const& m, param_range s) {
  auto const page = std::size_t(sysconf(_SC_PAGESIZE));
  auto const begin = reinterpret_cast<std::uintptr_t>(m.parameters().data());
  auto const end = begin + M::parameter_count * sizeof(float);
  auto const first = begin / page * page, last = (end + page - 1) / page * page;
  std::vector<unsigned char> in((last - first) / page);
  REQUIRE(mincore(reinterpret_cast<void*>(first), last - first, in.data()) == 0);
  given_back g;
  g.two_pages_a_rank = end - begin >= 2 * page * std::size_t(world_size());
  for (std::size_t k = 0; k < in.size(); ++k) {
    std::uintptr_t const p = first + k * page;
    bool const inside = p >= begin && p + page <= end;
    bool const outside_shard = p + page <= begin + s.begin * sizeof(float) || p >= begin + s.end * sizeof(float);
    g.expected += inside && outside_shard ? 1 : 0;
    g.found += (in[k] & 1) ? 0 : 1;
  }
  return g;
}

// Steps [from, to) of train_step on this rank's rows of each step's whole batch.
template <class DP, class Opt>
void train_steps(DP& dp, Opt& opt, int from, int to) {
  param_range const r = my_rows(dp.rank(), dp.size());
  for (int t = from; t < to; ++t) {
    batch b = whole_batch(t);
    dp.template train_step<SoftmaxCrossEntropy>(rows(b.x, r), rows(b.y, r), opt);
  }
}

// Three steps of three micro-batches each (this rank's rows, weight 1/3 each; with `later`, the
// first two reduce::later, which ZeRO-2 takes as reduce::now), each rank's losses appended.
template <class DP, class M, class Opt>
void three_accumulated_steps(DP& dp, M& m, Opt& opt, std::vector<double>& losses, bool later = false) {
  param_range const r = my_rows(dp.rank(), dp.size());
  for (int t = 0; t < 3; ++t) {
    batch b = whole_batch(t);
    m.zero_grad();
    for (int k = 0; k < 3; ++k)
      losses.push_back(dp.template accumulate<SoftmaxCrossEntropy>(
          rows(b.x, r), rows(b.y, r), 1.0 / 3, later && k < 2 ? dist::reduce::later : dist::reduce::now));
    opt.step();
  }
}

}  // namespace dist_test
