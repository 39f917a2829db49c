// Data parallelism for a model library's C interface: REMAT_EXPORT_C_MODEL_MPI(name, ...) is
// REMAT_EXPORT_C_MODEL (export.hpp) plus
//   int name_create_distributed(name_model** out, remat_options const* options, int32_t comm);
// a model whose passes run through remat::dist::data_parallel over the communicator `comm`, given
// as a Fortran handle (MPI_Comm_c2f(comm) in C; a Fortran program's communicator as it is): each
// rank trains on its own rows, the gradients are averaged over the ranks, every rank holds the same
// weights, and a failure on one rank is an error on every rank (REMAT_ERROR_DISTRIBUTED on the
// others). Gradient accumulation (zero_grad, accumulate per micro-batch, step) reduces once, in the
// step; accumulate returns the rank's own loss. The program initialises MPI itself. remat_add_model_library(... MPI) compiles it
// against remat::dist (remat::dist_cuda on the GPU).
#pragma once

#include "../parallel/mpi.hpp"
#include "export.hpp"

#include <mpi.h>

#include <optional>

namespace REMAT_NAMESPACE {
namespace capi {

// Passes through a data_parallel when the model was made with a communicator, alone otherwise.
template <class Model>
struct mpi_parallel {
  std::optional<dist::data_parallel<Model>> dp;  // the wrapper, when made with a communicator

  explicit mpi_parallel(Model&) {}                                // alone
  mpi_parallel(Model& m, MPI_Comm comm) { dp.emplace(m, comm); }  // data-parallel over comm

  // A training step, through the wrapper when there is one.
  template <class Loss, class X, class Target, class Optimizer>
  double train_step(Model& m, X x, Target t, Optimizer& opt) {
    return dp ? dp->template train_step<Loss>(x, t, opt) : m.template train_step<Loss>(x, t, opt);
  }
  // (Each micro-batch's gradients stay on the rank, reduce::later; the optimizer's step reduces
  // their sum, so any number of micro-batches may come before it. The loss is this rank's.)
  template <class Loss, class X, class Target>
  double accumulate(Model& m, X x, Target t, double weight) {
    return dp ? dp->template accumulate<Loss>(x, t, weight, dist::reduce::later)
              : m.template accumulate<Loss>(x, t, weight);
  }
};

}  // namespace capi
}  // namespace REMAT_NAMESPACE

// REMAT_EXPORT_C_MODEL with name_create_distributed (above).
#define REMAT_EXPORT_C_MODEL_MPI(name, Net, Device, Precision, Optimizer, Loss)                                 \
  REMAT_EXPORT_C_MODEL_WITH(name, Net, Device, Precision, Optimizer, Loss, ::REMAT_NAMESPACE::capi::mpi_parallel) \
  extern "C" REMAT_C_EXPORT int name##_create_distributed(name##_model** out, remat_options const* options,        \
                                                          int32_t comm) {                                          \
    return ::REMAT_NAMESPACE::capi::guarded([&] {                                                                  \
      if (!out)                                                                                                    \
        ::REMAT_NAMESPACE::detail::raise<::REMAT_NAMESPACE::argument_error>(                                      \
            #name "_create_distributed: expected a pointer to a handle, found NULL");                              \
      *out = nullptr;                                                                                              \
      remat_options const o = options ? *options : name##_default_options();                                       \
      *out = new name##_model{::REMAT_NAMESPACE::capi::exported<Net, Device, Precision, Optimizer, Loss,           \
                                                                ::REMAT_NAMESPACE::capi::mpi_parallel>(            \
          o, MPI_Comm_f2c(MPI_Fint(comm)))};                                                                       \
    });                                                                                                            \
  }
