! A Fortran program using the module consumer_model (remat_add_model_library(... FORTRAN)).
program model_user
  use, intrinsic :: iso_c_binding
  use remat_c
  use consumer_model
  implicit none
  type(consumer_model_model) :: m
  real(c_float) :: x(3, 4), t(2, 4), y(2, 4)
  real(c_double) :: first, loss
  integer :: step
  x = reshape([1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1], [3, 4])
  t = reshape([1, 0, 0, 1, 1, 1, 0, 0], [2, 4])
  if (consumer_model_create(m) /= REMAT_OK) error stop 'create'
  do step = 1, 100
    if (consumer_model_train_step(m, x, t, loss) /= REMAT_OK) error stop 'train_step'
    if (step == 1) first = loss
  end do
  if (consumer_model_forward(m, x, y) /= REMAT_OK) error stop 'forward'
  call consumer_model_destroy(m)
  print '(a, f7.4, a, f7.4)', 'consumer_model from Fortran: loss ', first, ' -> ', loss
  if (.not. loss < first) error stop 'no progress'
end program model_user
