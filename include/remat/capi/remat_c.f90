! What every remat model library's Fortran module shares (remat_c.h's types and status codes, by
! iso_c_binding): a program that uses several model libraries shares this one module. Compiled once
! per project by remat_add_model_library(... FORTRAN) (target remat_c_fortran). docs/c-and-fortran.md.
module remat_c
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_double, c_char, c_ptr, c_null_char, c_associated, &
                                          c_f_pointer
  implicit none
  private
  public :: remat_options, remat_memory_plan, remat_string
  public :: REMAT_OK, REMAT_ERROR_ARGUMENT, REMAT_ERROR_SHAPE, REMAT_ERROR_MEMORY, REMAT_ERROR_IO, &
            REMAT_ERROR_DEVICE, REMAT_ERROR_DISTRIBUTED, REMAT_ERROR_OTHER

  ! remat_status
  integer(c_int), parameter :: REMAT_OK = 0
  integer(c_int), parameter :: REMAT_ERROR_ARGUMENT = 1
  integer(c_int), parameter :: REMAT_ERROR_SHAPE = 2
  integer(c_int), parameter :: REMAT_ERROR_MEMORY = 3
  integer(c_int), parameter :: REMAT_ERROR_IO = 4
  integer(c_int), parameter :: REMAT_ERROR_DEVICE = 5
  integer(c_int), parameter :: REMAT_ERROR_DISTRIBUTED = 6
  integer(c_int), parameter :: REMAT_ERROR_OTHER = 7

  ! remat_options (seed: C's uint64_t, the same 64 bits)
  type, bind(C) :: remat_options
    integer(c_int64_t) :: seed
    real(c_double) :: learning_rate
    real(c_double) :: beta1
    real(c_double) :: beta2
    real(c_double) :: eps
    real(c_double) :: weight_decay
    real(c_double) :: momentum
  end type remat_options

  ! remat_memory_plan, in bytes
  type, bind(C) :: remat_memory_plan
    integer(c_int64_t) :: parameters
    integer(c_int64_t) :: gradients
    integer(c_int64_t) :: optimizer_state
    integer(c_int64_t) :: activations
    integer(c_int64_t) :: workspace
    integer(c_int64_t) :: step_peak
    integer(c_int64_t) :: step_reserved
    integer(c_int64_t) :: inference_arena
  end type remat_memory_plan

contains

  ! A C string (NUL-terminated) as a Fortran string.
  function remat_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: n, i
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    call c_f_pointer(p, chars, [huge(0)])
    n = 0
    do while (chars(n + 1) /= c_null_char)
      n = n + 1
    end do
    allocate(character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function remat_string

end module remat_c
