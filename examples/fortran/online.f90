! online.f90: examples/online's time loop in a Fortran program. The Gray-Scott solver is Fortran's,
! the surrogate network (examples/surrogate/network.hpp, on a 32 x 32 grid) is a remat model
! library made by remat_add_model_library(gray_scott_model ... FORTRAN), called through its module.
! Every 8 solver steps (after a run's first 100) the state goes into a replay buffer, its future 4
! steps later beside it; every 8 steps the model trains on 8 samples drawn from the buffer. At the
! end the surrogate replaces the solver for 40 steps of a run it never saw.
!
! online_twin.cpp is the same program in C++ (remat directly, the solver of gray_scott.hpp): both
! write every loss and the rollout's last state as their bits, and the test compares the files.
! Fortran's arrays are column-major: u(j, i) is row i, column j, C's u[i * g + j]; a batch is an
! array of shape (features, batch), remat's row-major (batch, features), passed without a copy.
!   online_fortran <file for the run's bits>
program online_fortran
  use, intrinsic :: iso_c_binding
  use remat_c
  use gray_scott_model
  implicit none
  integer, parameter :: dp = c_double, g = 32, cells = 2 * g * g
  integer, parameter :: steps = 2400, run_length = 800, burn_in = 100, sample_every = 8, ahead = 4
  integer, parameter :: train_every = 8, batch = 8, capacity = 96, rollout = 40, held_out_run = 1000
  real(dp), parameter :: in_scale = 3, Du = 0.16_dp, Dv = 0.08_dp, F = 0.035_dp, K = 0.065_dp
  real(dp) :: u(g, g), v(g, g), start_state(cells), du_scale, loss, err, base, truth
  real(c_float) :: states(cells, capacity), increments(cells, capacity)
  real(c_float) :: x(cells, batch), t(cells, batch), pending(cells, 1), guess(cells, 1)
  type(gray_scott_model_model) :: model
  type(remat_options) :: options
  type(remat_memory_plan) :: plan, measured
  integer(c_int64_t) :: draws
  integer :: step, stored, next, due, r, i, s, updates, done, out
  character(len=4096) :: path

  call get_command_argument(1, path)
  if (gray_scott_model_in_features() /= cells) error stop 'the model does not read a 32 x 32 grid of two species'
  options = gray_scott_model_default_options()
  options%seed = 7
  options%learning_rate = 2e-3_dp
  call check(gray_scott_model_memory_plan(options, batch, plan), 'memory_plan')
  print '(a, i0, a, i0, a)', 'the model''s training step will reserve ', plan%step_reserved, &
    ' bytes, its inference arena ', plan%inference_arena, ' (planned before it exists)'
  call check(gray_scott_model_create(model, options), 'create')
  call check(gray_scott_model_reserve_inference(model, 1), 'reserve_inference')

  call start(0)
  states = 0
  increments = 0
  stored = 0
  next = 1
  due = 0
  draws = 0
  updates = 0
  du_scale = 0
  open(newunit=out, file=trim(path), status='replace', action='write')
  do step = 1, steps  ! the solver's time loop
    call solver_step()
    if (due == step) then  ! the pending sample's future: the pair into the buffer
      states(:, next) = pending(:, 1)
      do i = 1, cells
        increments(i, next) = real(value(i) - unscaled(pending(i, 1), i), c_float)
      end do
      next = mod(next, capacity) + 1
      stored = min(stored + 1, capacity)
      due = 0
    end if
    if (mod(step, run_length) == 0) call start(step / run_length)  ! the campaign's next run
    if (mod(step, run_length) >= burn_in .and. mod(step, run_length) + ahead < run_length .and. &
        mod(step, sample_every) == 0 .and. due == 0) then
      call state_into(pending(:, 1))
      due = step + ahead
    end if
    if (mod(step, train_every) == 0 .and. stored >= batch) then
      if (du_scale == 0) du_scale = scale_of_increments()
      do r = 1, batch
        s = int(mod(draws * 2654435761_c_int64_t, int(stored, c_int64_t))) + 1
        draws = draws + 1
        x(:, r) = states(:, s)
        t(:, r) = real(real(increments(:, s), dp) * du_scale, c_float)
      end do
      call check(gray_scott_model_train_step(model, x, t, loss), 'train_step')
      write(out, '(z16.16)') transfer(loss, 0_c_int64_t)
      updates = updates + 1
      if (mod(updates, 50) == 0) print '(a, i5, a, i4, a, f8.4)', 'step ', step, '  updates ', updates, '  loss ', loss
    end if
  end do

  ! The surrogate replaces the solver on a run it never saw.
  call start(held_out_run)
  do i = 1, 2 * burn_in
    call solver_step()
  end do
  call state_into(pending(:, 1))
  do i = 1, cells
    start_state(i) = value(i)
  end do
  do done = ahead, rollout, ahead
    call check(gray_scott_model_forward(model, pending, guess), 'forward')
    pending(:, 1) = real(real(pending(:, 1), dp) + (in_scale * real(guess(:, 1), dp)) / du_scale, c_float)
    do i = 1, ahead
      call solver_step()
    end do
  end do
  err = 0
  base = 0
  do i = 1, cells
    truth = value(i)
    err = err + (unscaled(pending(i, 1), i) - truth) * (unscaled(pending(i, 1), i) - truth)
    base = base + (start_state(i) - truth) * (start_state(i) - truth)
  end do
  err = sqrt(err / base)
  write(out, '(z16.16)') transfer(err, 0_c_int64_t)
  do i = 1, cells
    write(out, '(z8.8)') transfer(pending(i, 1), 0_c_int32_t)
  end do
  close(out)

  call check(gray_scott_model_memory_measured(model, measured), 'memory_measured')
  if (measured%step_reserved /= plan%step_reserved .or. measured%step_peak /= plan%step_peak) &
    error stop 'the model''s measured memory differs from its plan'
  call gray_scott_model_destroy(model)
  print '(a, i0, a, f6.3, a)', 'rollout of ', rollout, ' solver steps: error ', err, ' of persistence''s'
  if (err >= 0.5_dp) error stop 'the surrogate is not twice as good as persistence'

contains

  ! A run's first state: feed everywhere, then squares at places an integer formula gives.
  subroutine start(run)
    integer, intent(in) :: run
    integer :: q, side, i0, j0
    u = 1
    v = 0
    do q = 0, 3 + mod(run * 7 + 3, 5)
      side = 4 + mod(q * 5 + run * 3, 9)
      i0 = mod(q * 13 + run * 17, g - side)
      j0 = mod(q * 29 + run * 11, g - side)
      u(j0 + 1:j0 + side, i0 + 1:i0 + side) = 0.5_dp
      v(j0 + 1:j0 + side, i0 + 1:i0 + side) = 0.25_dp
    end do
  end subroutine

  ! One explicit Euler step: gray_scott.hpp's arithmetic, in its order (the parentheses keep it).
  subroutine solver_step()
    real(dp) :: nu(g, g), nv(g, g), uc, vc, lu, lv, react
    integer :: i, j
    do i = 1, g
      do j = 1, g
        uc = u(j, i)
        vc = v(j, i)
        lu = (((at(u, i - 1, j, 1.0_dp) + at(u, i + 1, j, 1.0_dp)) + at(u, i, j - 1, 1.0_dp)) + &
              at(u, i, j + 1, 1.0_dp)) - 4 * uc
        lv = (((at(v, i - 1, j, 0.0_dp) + at(v, i + 1, j, 0.0_dp)) + at(v, i, j - 1, 0.0_dp)) + &
              at(v, i, j + 1, 0.0_dp)) - 4 * vc
        react = (uc * vc) * vc
        nu(j, i) = ((uc + Du * lu) - react) + F * (1 - uc)
        nv(j, i) = ((vc + Dv * lv) + react) - (F + K) * vc
      end do
    end do
    u = nu
    v = nv
  end subroutine

  ! a(row i, column j), or the reservoir's value outside the grid.
  real(dp) function at(a, i, j, outside)
    real(dp), intent(in) :: a(g, g), outside
    integer, intent(in) :: i, j
    if (i < 1 .or. j < 1 .or. i > g .or. j > g) then
      at = outside
    else
      at = a(j, i)
    end if
  end function

  ! Value i of the state as the network sees its cells: u's grid, then v's.
  real(dp) function value(i)
    integer, intent(in) :: i
    if (i <= g * g) then
      value = u(mod(i - 1, g) + 1, (i - 1) / g + 1)
    else
      value = v(mod(i - 1 - g * g, g) + 1, (i - 1 - g * g) / g + 1)
    end if
  end function

  ! The network's input: (u - 1, v) times in_scale.
  subroutine state_into(into)
    real(c_float), intent(out) :: into(cells)
    integer :: i
    do i = 1, cells
      if (i <= g * g) then
        into(i) = real((value(i) - 1) * in_scale, c_float)
      else
        into(i) = real(value(i) * in_scale, c_float)
      end if
    end do
  end subroutine

  ! An input value scaled back to the state's.
  real(dp) function unscaled(xi, i)
    real(c_float), intent(in) :: xi
    integer, intent(in) :: i
    unscaled = real(xi, dp) / in_scale
    if (i <= g * g) unscaled = unscaled + 1
  end function

  ! 1 / the RMS increment of the samples the buffer holds (the targets' scale, fixed once).
  real(dp) function scale_of_increments()
    real(dp) :: sq
    integer :: i, s
    sq = 0
    do s = 1, stored
      do i = 1, cells
        sq = sq + real(increments(i, s), dp) * real(increments(i, s), dp)
      end do
    end do
    scale_of_increments = 1 / sqrt(sq / real(stored * cells, dp))
  end function

  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status /= REMAT_OK) then
      print '(a, ": ", a)', what, gray_scott_model_last_error()
      error stop 1
    end if
  end subroutine

end program online_fortran
