// remat::dist: data-parallel training across processes (target remat::dist; remat::dist_cuda for
// models on the GPU). Include this header: it brings
//
//   dist::environment, dist::communicator    the MPI side (parallel/communicator.hpp)
//   dist::data_parallel<Model, Transport>     the wrapper (parallel/data_parallel.hpp, and the
//                                             parts it puts together beside it)
//   dist::mpi_transport, dist::nccl_transport  how gradients and parameters travel: MPI for host
//                                             models, NCCL for cuda models (with remat::dist_cuda)
//   dist::save, dist::load                    files from and to rank 0 (parallel/checkpoint.hpp)
#pragma once

#include "checkpoint.hpp"
#include "data_parallel.hpp"
