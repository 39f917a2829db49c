// A model library's C interface with data parallelism (remat_add_model_library(... MPI)), under
// mpirun: a model made by capi_surrogate_mpi_create_distributed on MPI_COMM_WORLD trains each
// rank's rows with the same losses, bit for bit, as remat::dist::data_parallel over the same
// model type in C++ in the same process, gradient accumulation included; every rank ends with the
// same outputs; a NaN in one
// rank's target fails the step on every rank (that rank REMAT_ERROR_ARGUMENT, the others
// REMAT_ERROR_DISTRIBUTED) and changes nothing.
#include "capi_surrogate_mpi.h"
#include "data.h"
#include "surrogate_mlp.hpp"

#include <remat/parallel/mpi.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {
int failures = 0;
int rank = 0;
void check(bool ok, char const* what) {
  if (!ok) std::fprintf(stderr, "rank %d: FAILED: %s (%s)\n", rank, what, capi_surrogate_mpi_last_error()), ++failures;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  remat_options o = capi_surrogate_mpi_default_options();
  o.seed = 5;
  o.learning_rate = 3e-3;
  capi_surrogate_mpi_model* h = nullptr;
  check(capi_surrogate_mpi_create_distributed(&h, &o, MPI_Comm_c2f(MPI_COMM_WORLD)) == REMAT_OK, "create_distributed");
  {
    remat::model<capi_surrogate_net> m(remat::seed{5});
    remat::dist::data_parallel dp(m, MPI_COMM_WORLD);
    remat::AdamW opt(m, {.lr = 3e-3});
    std::size_t const rows = 8;  // per rank; rank r holds rows [8 r, 8 r + 8) of each step's batch
    std::vector<float> x(rows * 5), t(rows * 5), yc(rows * 5);
    std::int64_t const first = std::int64_t(rank) * std::int64_t(rows * 5);
    auto fill = [&](int step) {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = capi_input(step, first + std::int64_t(i));
      for (std::size_t i = 0; i < t.size(); ++i) t[i] = capi_target(step, first + std::int64_t(i));
    };
    auto view = [&](std::vector<float> const& v) { return remat::tensor_view<float const, remat::host>(v.data(), rows, 5); };
    for (int step = 0; step < 15; ++step) {
      fill(step);
      double lc = 0;
      check(capi_surrogate_mpi_train_step(h, x.data(), t.data(), std::int64_t(rows), &lc) == REMAT_OK, "train_step");
      double const lp = dp.train_step<remat::MSE>(view(x), view(t), opt);
      check(lc == lp, "the C interface's loss is data_parallel's, bit for bit");
    }
    // Gradient accumulation, two micro-batches a step: reduced once, in the step, as data_parallel
    // does with reduce::later.
    for (int step = 15; step < 18; ++step) {
      check(capi_surrogate_mpi_zero_grad(h) == REMAT_OK, "zero_grad");
      m.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        fill(step * 2 + micro);
        double lc = 0;
        check(capi_surrogate_mpi_accumulate(h, x.data(), t.data(), std::int64_t(rows), 0.5, &lc) == REMAT_OK,
              "accumulate");
        double const lp = dp.accumulate<remat::MSE>(view(x), view(t), 0.5, remat::dist::reduce::later);
        check(lc == lp, "a micro-batch's loss is data_parallel's, bit for bit");
      }
      check(capi_surrogate_mpi_step(h) == REMAT_OK, "step");
      opt.step();
    }
    check(capi_surrogate_mpi_forward(h, x.data(), std::int64_t(rows), yc.data()) == REMAT_OK, "forward");
    std::vector<float> const yp = m.forward(view(x)).to_vector();
    check(std::memcmp(yc.data(), yp.data(), yc.size() * sizeof(float)) == 0, "outputs equal C++'s");
    // Every rank's weights are the same: rank 0's outputs on its rows, computed on every rank.
    fill(0);
    std::vector<float> mine(rows * 5), zeros(rows * 5);
    if (rank != 0) {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = capi_input(0, std::int64_t(i));
    }
    check(capi_surrogate_mpi_forward(h, x.data(), std::int64_t(rows), mine.data()) == REMAT_OK, "forward");
    std::vector<float> ranks0 = mine;
    MPI_Bcast(ranks0.data(), int(ranks0.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    check(std::memcmp(ranks0.data(), mine.data(), mine.size() * sizeof(float)) == 0, "every rank holds rank 0's weights");
    // A NaN in the last rank's target: every rank fails, nothing changes.
    fill(3);
    if (rank == size - 1) t[4] = std::nanf("");
    double l = 0;
    int const status = capi_surrogate_mpi_train_step(h, x.data(), t.data(), std::int64_t(rows), &l);
    if (size == 1 || rank == size - 1)
      check(status == REMAT_ERROR_ARGUMENT, "the failing rank's status is its own error");
    else
      check(status == REMAT_ERROR_DISTRIBUTED, "the other ranks' status is a distributed error");
    std::vector<float> after(rows * 5);
    fill(0);
    if (rank != 0)
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = capi_input(0, std::int64_t(i));
    check(capi_surrogate_mpi_forward(h, x.data(), std::int64_t(rows), after.data()) == REMAT_OK, "forward after");
    check(std::memcmp(after.data(), mine.data(), mine.size() * sizeof(float)) == 0, "unchanged after the failure");
    capi_surrogate_mpi_destroy(h);
  }
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && all == 0)
    std::printf("the C interface under data parallelism on %d ranks equals data_parallel in C++ bit for bit\n", size);
  MPI_Finalize();
  return all ? 1 : 0;
}
