// Built against an installed remat::dist and run under mpirun: two ranks, each on half of a batch,
// train a small model data-parallel; they must end with the same parameters and a lower loss.
#include <remat/parallel/mpi.hpp>
#include <remat/remat.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

using namespace remat;
using Net = Seq<Linear<4, 16>, GELU, Linear<16, 3>>;

int main(int argc, char** argv) {
  dist::environment env(argc, argv);
  model<Net> m(seed{dist::environment::world_rank() + 1u});  // different seeds: the broadcast fixes that
  dist::data_parallel dp(m, MPI_COMM_WORLD, {.shard_optimizer = true});
  AdamW opt(m, {.lr = 1e-2});
  std::size_t const rows = 8;
  tensor<float> x(index_t(rows), 4);
  tensor<std::int32_t> y(index_t(rows), 1);
  for (std::size_t i = 0; i < rows; ++i) {
    std::size_t const g = i + rows * std::size_t(dp.rank());
    for (std::size_t j = 0; j < 4; ++j) x(i, j) = float(std::sin(double(g * 4 + j)));
    y[i] = std::int32_t(g % 3);
  }
  double first = 0, last = 0;
  for (int t = 0; t < 50; ++t) {
    last = dp.train_step<SoftmaxCrossEntropy>(x.view(), y.view(), opt);
    if (t == 0) first = last;
  }
  std::vector<float> p = tensor_to_host(m.parameters()), p0 = p;
  MPI_Bcast(p0.data(), int(p0.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  bool const ok = std::memcmp(p.data(), p0.data(), p.size() * sizeof(float)) == 0 && last < first;
  std::printf("consumer_dist: rank %d of %d, loss %.4f -> %.4f, parameters %s rank 0's: %s\n", dp.rank(), dp.size(),
              first, last, ok ? "equal to" : "DIFFERENT from", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
