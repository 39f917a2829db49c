# remat_add_model_library: a shared library with a C interface for one remat model type
# (include/remat/capi/export.hpp), for C and Fortran programs (docs/c-and-fortran.md).
#
#   remat_add_model_library(<name>
#     HEADER <file>                 a C++ header that defines the layer graph (relative: to the
#                                   current source directory)
#     NET <type>                    the layer graph, as the header names it
#     [DEVICE host|cuda]            where the model runs (default host; cuda compiles with nvcc)
#     [PRECISION <type>]            remat::fp32 (default), remat::fp64, remat::mixed<remat::bfloat16>
#     [OPTIMIZER AdamW|SGD]         (default AdamW)
#     [LOSS MSE]                    (the only one exported for now)
#     [VERSION <major.minor.patch>] the library's version (default 1.0.0; soname lib<name>.so.<major>))
#     [MPI]                         also <name>_create_distributed(&model, options, comm): data
#                                   parallelism over an MPI communicator (links remat::dist, or
#                                   remat::dist_cuda on the GPU)
#     [FORTRAN]                     also the Fortran module <name> (iso_c_binding; the project must
#                                   enable Fortran): target <name>_fortran, a static library holding
#                                   it and remat's module remat_c (target remat_c_fortran, made once)
#
# Makes target <name> (lib<name>.so) whose functions <name>_create, <name>_train_step, ... are
# declared in the generated header <name>.h (on the target's public include path, with remat's
# <remat/capi/remat_c.h>), and nothing else of remat exported. remat_install_model_library(<name>)
# installs it with a CMake package (find_package(<name> CONFIG), target <name>::<name>).

# (arg_<key> of remat_add_model_library: `default` when not given, and it must match `pattern`, or
# configuring stops with what it may be. A macro: it sets the caller's variables, CMAKE_MATCH_1 too.)
macro(_remat_model_option key default pattern what)
  if(NOT arg_${key})
    set(arg_${key} "${default}")
  endif()
  if(NOT arg_${key} MATCHES "${pattern}")
    message(FATAL_ERROR "remat_add_model_library(${name}): ${key} is ${what}, found '${arg_${key}}'")
  endif()
endmacro()

# (The path of remat/capi/<file> in remat's source tree, or in an installed remat beside this file
# (<prefix>/lib[/<arch>]/cmake/remat), into `out`.)
function(_remat_capi_file file out)
  foreach(candidate "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../include" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../../../include"
                    "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../../../../include")
    if(EXISTS "${candidate}/remat/capi/${file}")
      get_filename_component(path "${candidate}/remat/capi/${file}" ABSOLUTE)
      set(${out} "${path}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "remat_add_model_library: remat/capi/${file} not found beside ${CMAKE_CURRENT_FUNCTION_LIST_DIR}")
endfunction()

function(remat_add_model_library name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "FORTRAN;MPI" "HEADER;NET;DEVICE;PRECISION;OPTIMIZER;LOSS;VERSION" "")
  if(NOT name MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    message(FATAL_ERROR "remat_add_model_library: the name must be a C identifier (the functions' prefix), found '${name}'")
  endif()
  foreach(required HEADER NET)
    if(NOT arg_${required})
      message(FATAL_ERROR "remat_add_model_library(${name}): ${required} is required")
    endif()
  endforeach()
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "remat_add_model_library(${name}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  _remat_model_option(DEVICE host "^(host|cuda)$" "host or cuda")
  _remat_model_option(PRECISION "remat::fp32" "." "a precision type")
  _remat_model_option(OPTIMIZER AdamW "^(AdamW|SGD)$" "AdamW or SGD")
  _remat_model_option(LOSS MSE "^MSE$" "MSE (the only loss exported for now)")
  _remat_model_option(VERSION 1.0.0 "^([0-9]+)\\.[0-9]+\\.[0-9]+$" "major.minor.patch")
  set(soversion "${CMAKE_MATCH_1}")
  get_filename_component(header "${arg_HEADER}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  if(NOT EXISTS "${header}")
    message(FATAL_ERROR "remat_add_model_library(${name}): no header ${header}")
  endif()

  set(dir "${CMAKE_CURRENT_BINARY_DIR}/remat_model_${name}")
  set(REMAT_C_NAME "${name}")
  string(TOUPPER "REMAT_MODEL_${name}_H" REMAT_C_GUARD)
  set(REMAT_C_NET "${arg_NET}")
  set(REMAT_C_DEVICE "${arg_DEVICE}")
  set(REMAT_C_PRECISION "${arg_PRECISION}")
  set(REMAT_C_OPTIMIZER "${arg_OPTIMIZER}")
  set(REMAT_C_LOSS "${arg_LOSS}")
  set(REMAT_C_MPI_DECLARATIONS "")
  set(export_header "remat/capi/export.hpp")
  set(export_macro REMAT_EXPORT_C_MODEL)
  if(arg_MPI)
    set(REMAT_C_MPI_DECLARATIONS "/* The same, its passes run data-parallel over the MPI communicator `comm` (a Fortran handle:
 * MPI_Comm_c2f(comm) in C): each rank trains on its own rows, the gradients are averaged, every
 * rank holds the same weights, and a failure on one rank fails the call on every rank. The
 * program initialises MPI; every rank calls each function of the model together. */
int ${name}_create_distributed(${name}_model** out, remat_options const* options, int32_t comm);")
    set(export_header "remat/capi/export_mpi.hpp")
    set(export_macro REMAT_EXPORT_C_MODEL_MPI)
  endif()
  configure_file("${CMAKE_CURRENT_FUNCTION_LIST_DIR}/remat_model_library.h.in" "${dir}/include/${name}.h" @ONLY)
  # The header includes <remat/capi/remat_c.h>: a copy beside it, so that a C program needs nothing
  # else of remat (remat's source tree, or an installed remat: <prefix>/lib/cmake/remat).
  _remat_capi_file(remat_c.h remat_c_header)
  configure_file("${remat_c_header}" "${dir}/include/remat/capi/remat_c.h" COPYONLY)
  set(source "${dir}/${name}_capi.cpp")
  set(remat_target remat::remat)
  set(dist_target remat::dist)
  if(arg_DEVICE STREQUAL "cuda")
    set(source "${dir}/${name}_capi.cu")
    set(remat_target remat::cuda)
    set(dist_target remat::dist_cuda)
  endif()
  if(arg_MPI)
    set(remat_target ${dist_target})
  endif()
  file(CONFIGURE OUTPUT "${source}" CONTENT "// Generated by remat_add_model_library(${name}).
#include \"${header}\"
#include <${export_header}>
#include \"${name}.h\"

${export_macro}(${name}, ${arg_NET}, remat::${arg_DEVICE}, ${arg_PRECISION}, remat::${arg_OPTIMIZER}, remat::${arg_LOSS})
" @ONLY)
  add_library(${name} SHARED "${source}")
  target_link_libraries(${name} PRIVATE ${remat_target})
  # (CMake 3.25 does not know nvcc 13's dialect flags: C++20 is asked for directly.)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  target_include_directories(${name} PUBLIC "$<BUILD_INTERFACE:${dir}/include>" "$<INSTALL_INTERFACE:include>")
  set_target_properties(${name} PROPERTIES
    VERSION "${arg_VERSION}" SOVERSION "${soversion}"
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    PUBLIC_HEADER "${dir}/include/${name}.h")

  if(arg_FORTRAN)
    if(NOT CMAKE_Fortran_COMPILER_LOADED)
      message(FATAL_ERROR "remat_add_model_library(${name} FORTRAN): enable Fortran first (project(... Fortran) "
                          "or enable_language(Fortran))")
    endif()
    if(NOT TARGET remat_c_fortran)
      _remat_capi_file(remat_c.f90 remat_c_source)
      add_library(remat_c_fortran STATIC "${remat_c_source}")
      set_target_properties(remat_c_fortran PROPERTIES
        Fortran_MODULE_DIRECTORY "${CMAKE_BINARY_DIR}/remat_c_fortran" POSITION_INDEPENDENT_CODE ON)
      target_include_directories(remat_c_fortran PUBLIC "$<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/remat_c_fortran>"
                                                        "$<INSTALL_INTERFACE:include/fortran>")
    endif()
    set(REMAT_F_MPI_PUBLIC "")
    set(REMAT_F_MPI_INTERFACE "")
    set(REMAT_F_MPI_PROCEDURE "")
    if(arg_MPI)
      set(REMAT_F_MPI_PUBLIC "  public :: ${name}_create_distributed")
      set(REMAT_F_MPI_INTERFACE "    function c_create_distributed(out, options, comm) bind(C, name=\"${name}_create_distributed\")
      import :: c_ptr, c_int, c_int32_t, remat_options
      type(c_ptr), intent(out) :: out
      type(remat_options), intent(in) :: options
      integer(c_int32_t), value :: comm
      integer(c_int) :: c_create_distributed
    end function")
      set(REMAT_F_MPI_PROCEDURE "  ! A new model whose passes run data-parallel over the MPI communicator comm (MPI_COMM_WORLD or
  ! another of module mpi; options absent: the defaults). Every rank calls it, and each function of
  ! the model after it, together.
  integer(c_int) function ${name}_create_distributed(model, comm, options) result(status)
    type(${name}_model), intent(out) :: model
    integer, intent(in) :: comm
    type(remat_options), intent(in), optional :: options
    call forget()
    if (present(options)) then
      status = c_create_distributed(model%handle, options, int(comm, c_int32_t))
    else
      status = c_create_distributed(model%handle, c_default_options(), int(comm, c_int32_t))
    end if
  end function
")
    endif()
    configure_file("${CMAKE_CURRENT_FUNCTION_LIST_DIR}/remat_model_library.f90.in" "${dir}/${name}.f90" @ONLY)
    add_library(${name}_fortran STATIC "${dir}/${name}.f90")
    set_target_properties(${name}_fortran PROPERTIES Fortran_MODULE_DIRECTORY "${dir}/fortran"
                                                     POSITION_INDEPENDENT_CODE ON)
    target_include_directories(${name}_fortran PUBLIC "$<BUILD_INTERFACE:${dir}/fortran>"
                                                      "$<INSTALL_INTERFACE:include/fortran>")
    target_link_libraries(${name}_fortran PUBLIC remat_c_fortran ${name})
  endif()
endfunction()

# Installs <name> (the library, its header, <remat/capi/remat_c.h>; with FORTRAN, the static
# library of its module and remat_c's, and their .mod files under include/fortran) with a CMake
# package: find_package(<name> CONFIG) gives target <name>::<name> (and <name>::<name>_fortran).
function(remat_install_model_library name)
  include(GNUInstallDirs)
  include(CMakePackageConfigHelpers)
  install(TARGETS ${name} EXPORT ${name}-targets
          LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
          PUBLIC_HEADER DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
  if(TARGET ${name}_fortran)
    install(TARGETS ${name}_fortran remat_c_fortran EXPORT ${name}-targets ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
    install(DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/remat_model_${name}/fortran/" "${CMAKE_BINARY_DIR}/remat_c_fortran/"
            DESTINATION "include/fortran" FILES_MATCHING PATTERN "*.mod")
  endif()
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/remat_model_${name}/include/remat/capi/remat_c.h"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/remat/capi")
  install(EXPORT ${name}-targets NAMESPACE ${name}:: DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/${name}")
  get_target_property(version ${name} VERSION)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/remat_model_${name}/${name}-config.cmake"
       "include(\"\${CMAKE_CURRENT_LIST_DIR}/${name}-targets.cmake\")\n")
  write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/remat_model_${name}/${name}-config-version.cmake"
    VERSION "${version}" COMPATIBILITY SameMajorVersion)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/remat_model_${name}/${name}-config.cmake"
                "${CMAKE_CURRENT_BINARY_DIR}/remat_model_${name}/${name}-config-version.cmake"
          DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/${name}")
endfunction()
