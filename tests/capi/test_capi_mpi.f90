! Data parallelism from Fortran (capi_surrogate_mpi_create_distributed on MPI_COMM_WORLD, under
! mpirun): each rank trains on its own columns; every rank gets the same averaged loss and ends with
! the same weights (the outputs on the same columns equal rank 0's bit for bit), which ranks
! training apart would not.
program test_capi_mpi_fortran
  use, intrinsic :: iso_c_binding
  use mpi
  use remat_c
  use capi_surrogate_mpi
  implicit none
  integer, parameter :: features = 5, batch = 8
  type(capi_surrogate_mpi_model) :: model
  type(remat_options) :: options
  real(c_float) :: x(features, batch), t(features, batch), y(features, batch), y0(features, batch)
  real(c_double) :: loss, lowest, highest
  integer :: ierr, rank, step, b, f, k, bad, total

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  options = capi_surrogate_mpi_default_options()
  options%seed = 5
  options%learning_rate = 3e-3_c_double
  if (capi_surrogate_mpi_create_distributed(model, MPI_COMM_WORLD, options) /= REMAT_OK) &
    error stop 'create_distributed'
  do step = 0, 9
    call fill(step, rank)
    if (capi_surrogate_mpi_train_step(model, x, t, loss) /= REMAT_OK) error stop 'train_step'
  end do
  bad = 0
  call MPI_Allreduce(loss, lowest, 1, MPI_DOUBLE_PRECISION, MPI_MIN, MPI_COMM_WORLD, ierr)
  call MPI_Allreduce(loss, highest, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (lowest /= highest) bad = bad + 1
  call fill(0, 0)
  if (capi_surrogate_mpi_forward(model, x, y) /= REMAT_OK) error stop 'forward'
  y0 = y
  call MPI_Bcast(y0, features * batch, MPI_REAL, 0, MPI_COMM_WORLD, ierr)
  if (any(transfer(y, 0_c_int32_t, features * batch) /= transfer(y0, 0_c_int32_t, features * batch))) bad = bad + 1
  call capi_surrogate_mpi_destroy(model)
  call MPI_Allreduce(bad, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0 .and. total == 0) print '(a)', 'data parallelism from Fortran: every rank holds the same weights'
  call MPI_Finalize(ierr)
  if (total /= 0) error stop 'the ranks differ'

contains

  ! Rank r's columns of step `step`'s batch (tests/capi/data.h's values).
  subroutine fill(step, r)
    integer, intent(in) :: step, r
    do b = 1, batch
      do f = 1, features
        k = (r * batch + b - 1) * features + (f - 1)
        x(f, b) = real(mod(k * 37 + step * 11, 101) - 50, c_float) / 50.0_c_float
        t(f, b) = 0.5_c_float * x(f, b)
      end do
    end do
  end subroutine

end program test_capi_mpi_fortran
