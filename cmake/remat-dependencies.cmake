# Finds what a program that uses remat needs and defines the imported targets
# remat::cccl (Thrust/CUB headers), remat::blas (a CBLAS) and, empty where what they stand for is
# absent, remat::openmp, remat::onednn, remat::mpi, remat::cudart and remat::nccl; REMAT_HAS_OPENMP
# and REMAT_HAS_MPI say which were found.
# Shared by the build tree and the installed package config, so both detect the same way.
include_guard(GLOBAL)
include(CMakeFindDependencyMacro OPTIONAL)

# --- CCCL (Thrust, CUB, libcu++): the CUDA toolkit's copy when there is one, else Debian's.
if(NOT TARGET remat::cccl)
  set(_remat_cccl_hints)
  if(DEFINED CUDAToolkit_ROOT)
    list(APPEND _remat_cccl_hints "${CUDAToolkit_ROOT}/include/cccl" "${CUDAToolkit_ROOT}/include")
  endif()
  if(DEFINED ENV{CUDAToolkit_ROOT})
    list(APPEND _remat_cccl_hints "$ENV{CUDAToolkit_ROOT}/include/cccl" "$ENV{CUDAToolkit_ROOT}/include")
  endif()
  list(APPEND _remat_cccl_hints /usr/local/cuda/include/cccl /usr/local/cuda/include)
  find_path(REMAT_CCCL_INCLUDE_DIR thrust/version.h
            HINTS ${_remat_cccl_hints}
            PATHS /usr/include
            DOC "Directory holding thrust/, cub/ (and cuda/ for CCCL 2+)")
  if(NOT REMAT_CCCL_INCLUDE_DIR)
    message(FATAL_ERROR
      "remat: Thrust/CUB headers not found. Install the CUDA toolkit (set CUDAToolkit_ROOT) "
      "or Debian's libthrust-dev and libcub-dev, or set REMAT_CCCL_INCLUDE_DIR.")
  endif()
  add_library(remat::cccl INTERFACE IMPORTED)
  # SYSTEM: Thrust's own warnings are not ours to fix.
  set_target_properties(remat::cccl PROPERTIES
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${REMAT_CCCL_INCLUDE_DIR}"
    INTERFACE_INCLUDE_DIRECTORIES "${REMAT_CCCL_INCLUDE_DIR}")
  file(STRINGS "${REMAT_CCCL_INCLUDE_DIR}/thrust/version.h" _remat_thrust_ver
       REGEX "^#define THRUST_VERSION [0-9]+")
  string(REGEX REPLACE "^#define THRUST_VERSION ([0-9]+).*" "\\1" REMAT_THRUST_VERSION "${_remat_thrust_ver}")
  if(NOT remat_FIND_QUIETLY)
    message(STATUS "remat: Thrust ${REMAT_THRUST_VERSION} from ${REMAT_CCCL_INCLUDE_DIR}")
  endif()
endif()

# Records whether an optional dependency was found (as a global property, which the parents of an
# add_subdirectory can read too) and says so in one status line.
function(remat_optional property found said)
  set_property(GLOBAL PROPERTY ${property} ${found})
  if(NOT remat_FIND_QUIETLY)
    message(STATUS "remat: ${said}")
  endif()
endfunction()

# --- OpenMP (optional): Thrust's OpenMP system runs host kernels on every core; without it they run
# serially. remat::openmp always exists (empty without OpenMP), so a remat installed where OpenMP
# was found still configures for a compiler whose OpenMP runtime is absent (Debian's clang-N
# without libomp-N-dev): found or not is decided where remat is consumed. nvcc-compiled sources get
# the flag for their host code too (OffloadedAdamW's update, host references: without it they ran
# on one thread; the step took 5 s on an H100's host for 537 M parameters, PyTorch's 0.44 s).
if(NOT TARGET remat::openmp)
  add_library(remat::openmp INTERFACE IMPORTED)
  if(NOT OpenMP_CXX_FOUND)
    find_package(OpenMP QUIET COMPONENTS CXX)
  endif()
  if(OpenMP_CXX_FOUND AND TARGET OpenMP::OpenMP_CXX)
    set_target_properties(remat::openmp PROPERTIES INTERFACE_LINK_LIBRARIES OpenMP::OpenMP_CXX)
    if(NOT MSVC)
      set_target_properties(remat::openmp PROPERTIES
        INTERFACE_COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${OpenMP_CXX_FLAGS}>")
    endif()
    remat_optional(REMAT_HAS_OPENMP TRUE "OpenMP ${OpenMP_CXX_VERSION} runs host kernels on every core")
  else()
    set(_remat_omp_hint "")
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      string(REGEX MATCH "^[0-9]+" _remat_cxx_major "${CMAKE_CXX_COMPILER_VERSION}")
      set(_remat_omp_hint " (Debian: apt-get install libomp-${_remat_cxx_major}-dev)")
    endif()
    remat_optional(REMAT_HAS_OPENMP FALSE "no OpenMP for ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}; \
host kernels run on one thread${_remat_omp_hint}")
  endif()
endif()
get_property(REMAT_HAS_OPENMP GLOBAL PROPERTY REMAT_HAS_OPENMP)

# --- BLAS with the CBLAS interface (OpenBLAS preferred).
if(NOT TARGET remat::blas)
  find_path(REMAT_CBLAS_INCLUDE_DIR cblas.h
            PATH_SUFFIXES openblas openblas-pthread x86_64-linux-gnu/openblas-pthread
                          x86_64-linux-gnu/openblas-openmp aarch64-linux-gnu/openblas-pthread)
  # OpenBLAS built on OpenMP shares one pool of threads with remat's point-wise kernels; the
  # pthread build's threads and OpenMP's compete for the cores (on 2 cores a step takes twice as
  # long). Debian's libopenblas0-openmp ships it beside the system's default build, which is left
  # as it is.
  find_file(REMAT_BLAS_LIBRARY NAMES libopenblas.so.0 libopenblas.so
            PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
            NO_DEFAULT_PATH)
  find_library(REMAT_BLAS_LIBRARY NAMES openblaso openblas openblasp)
  if(NOT REMAT_BLAS_LIBRARY)
    set(BLA_VENDOR OpenBLAS)
    find_package(BLAS QUIET)
    if(BLAS_FOUND)
      set(REMAT_BLAS_LIBRARY "${BLAS_LIBRARIES}")
    endif()
  endif()
  if(NOT REMAT_BLAS_LIBRARY OR NOT REMAT_CBLAS_INCLUDE_DIR)
    message(FATAL_ERROR "remat: OpenBLAS (libopenblas-dev) with cblas.h not found "
                        "(library: '${REMAT_BLAS_LIBRARY}', header dir: '${REMAT_CBLAS_INCLUDE_DIR}')")
  endif()
  add_library(remat::blas INTERFACE IMPORTED)
  set_target_properties(remat::blas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${REMAT_CBLAS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${REMAT_BLAS_LIBRARY}")
  if(NOT remat_FIND_QUIETLY)
    message(STATUS "remat: BLAS ${REMAT_BLAS_LIBRARY}, cblas.h in ${REMAT_CBLAS_INCLUDE_DIR}")
  endif()
endif()

# --- oneDNN (optional): bf16 matrix products on the CPU (AMX / AVX-512 BF16 through its matmul
# primitive). Without it, bf16 products convert to fp32 and go to the BLAS. remat::onednn always
# exists (empty when oneDNN is absent), so the exported target links the same way everywhere.
if(NOT TARGET remat::onednn)
  add_library(remat::onednn INTERFACE IMPORTED)
  find_path(REMAT_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(REMAT_ONEDNN_LIBRARY NAMES dnnl)
  option(REMAT_USE_ONEDNN "Use oneDNN for bf16 matrix products on the CPU when it is found" ON)
  if(REMAT_USE_ONEDNN AND REMAT_ONEDNN_INCLUDE_DIR AND REMAT_ONEDNN_LIBRARY)
    set_target_properties(remat::onednn PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${REMAT_ONEDNN_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${REMAT_ONEDNN_LIBRARY}"
      INTERFACE_COMPILE_DEFINITIONS "REMAT_HAS_ONEDNN=1")
    if(NOT remat_FIND_QUIETLY)
      # (remat builds with 2.x and 3.x: kernels/detail/onednn.hpp; the version is only reported)
      file(STRINGS "${REMAT_ONEDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _remat_onednn_version
           REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
      string(REGEX REPLACE "[^0-9;]" "" _remat_onednn_version "${_remat_onednn_version}")
      string(REPLACE ";" "." _remat_onednn_version "${_remat_onednn_version}")
      message(STATUS "remat: oneDNN ${_remat_onednn_version} (${REMAT_ONEDNN_LIBRARY}) for bf16 matrix products")
    endif()
  elseif(NOT remat_FIND_QUIETLY)
    message(STATUS "remat: no oneDNN (libdnnl-dev); bf16 matrix products convert to fp32")
  endif()
endif()

# --- MPI (optional): remat::dist, data-parallel training over an MPI communicator. remat::mpi
# always exists (empty without MPI, and then <remat/parallel/mpi.hpp> says what to install), so the
# exported remat::dist target links the same way everywhere. Whether an MPI was found is
# REMAT_HAS_MPI (a variable here, a global property for add_subdirectory's parents); never
# `TARGET MPI::MPI_CXX`, which CMake 3.25's FindMPI creates, empty, even when it finds no MPI.
if(NOT TARGET remat::mpi)
  add_library(remat::mpi INTERFACE IMPORTED)
  if(NOT MPI_CXX_FOUND)
    # MPI's C interface from C++ (remat uses no C++ bindings; a CXX-only project has no C to find).
    set(MPI_CXX_SKIP_MPICXX ON)
    find_package(MPI QUIET COMPONENTS CXX)
  endif()
  if(MPI_CXX_FOUND AND TARGET MPI::MPI_CXX)
    set_target_properties(remat::mpi PROPERTIES INTERFACE_LINK_LIBRARIES MPI::MPI_CXX)
    remat_optional(REMAT_HAS_MPI TRUE "MPI ${MPI_CXX_VERSION} for remat::dist (${MPIEXEC_EXECUTABLE})")
  else()
    remat_optional(REMAT_HAS_MPI FALSE "no MPI: remat::dist, digits --mpi and the data-parallel tests are \
left out (Debian: apt-get install libopenmpi-dev openmpi-bin)")
  endif()
endif()
get_property(REMAT_HAS_MPI GLOBAL PROPERTY REMAT_HAS_MPI)

# find_package(CUDAToolkit ARGS...), working around CMake before 3.30 with CUDA 12.9 and later:
# those toolkits ship no nvToolsExt library, and older FindCUDAToolkit modules (Debian 12's CMake
# 3.25 among them) then fail with "set_property could not find TARGET CUDA::nvToolsExt" in any
# project that requires CMake 3.25 or later, since they mark that target deprecated without
# checking that it exists. The search runs with the requirement seen as 3.24, which only skips
# the deprecation mark; the caller's value is restored after it.
macro(remat_find_cuda_toolkit)
  set(_remat_required "${CMAKE_MINIMUM_REQUIRED_VERSION}")
  if(CMAKE_VERSION VERSION_LESS 3.30 AND CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)
    set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
  endif()
  find_package(CUDAToolkit ${ARGN})
  set(CMAKE_MINIMUM_REQUIRED_VERSION "${_remat_required}")
  unset(_remat_required)
endmacro()

# --- CUDA (optional): the CUDA runtime and cuBLASLt for remat::cuda, the GPU backend. remat::cudart
# always exists (empty without the toolkit), so the exported remat::cuda target links the same way
# everywhere; sources that use the GPU are compiled by nvcc.
if(NOT TARGET remat::cudart)
  add_library(remat::cudart INTERFACE IMPORTED)
  if(NOT TARGET CUDA::cudart)
    if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    remat_find_cuda_toolkit(QUIET)
  endif()
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart AND TARGET CUDA::cublasLt)
    set_target_properties(remat::cudart PROPERTIES INTERFACE_LINK_LIBRARIES "CUDA::cudart;CUDA::cublasLt")
    if(NOT remat_FIND_QUIETLY)
      message(STATUS "remat: CUDA ${CUDAToolkit_VERSION} runtime and cuBLASLt for remat::cuda")
    endif()
    # cuDNN (optional): Conv2d on the GPU. The CUDA 13 toolkit here ships it beside cuBLAS.
    find_library(REMAT_CUDNN_LIBRARY cudnn HINTS "${CUDAToolkit_LIBRARY_DIR}" "${CUDAToolkit_LIBRARY_ROOT}/lib")
    find_path(REMAT_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(REMAT_CUDNN_LIBRARY AND REMAT_CUDNN_INCLUDE_DIR)
      set_property(TARGET remat::cudart APPEND PROPERTY INTERFACE_LINK_LIBRARIES "${REMAT_CUDNN_LIBRARY}")
      set_property(TARGET remat::cudart APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${REMAT_CUDNN_INCLUDE_DIR}")
      set_property(TARGET remat::cudart APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS "REMAT_HAS_CUDNN=1")
      if(NOT remat_FIND_QUIETLY)
        message(STATUS "remat: cuDNN for Conv2d on the GPU (${REMAT_CUDNN_LIBRARY})")
      endif()
    elseif(NOT remat_FIND_QUIETLY)
      message(STATUS "remat: no cuDNN; Conv2d runs on the host only")
    endif()
  elseif(NOT remat_FIND_QUIETLY)
    message(STATUS "remat: no CUDA toolkit; remat::cuda is not usable")
  endif()
endif()

# --- NCCL (optional, with the CUDA toolkit): remat::dist_cuda, data parallelism for models on the
# GPU (gradients through NCCL, the rest through MPI). remat::nccl always exists (empty without
# NCCL, and then a cuda model in remat::dist::data_parallel says what is missing).
if(NOT TARGET remat::nccl)
  add_library(remat::nccl INTERFACE IMPORTED)
  if(TARGET CUDA::cudart)
    find_library(REMAT_NCCL_LIBRARY nccl HINTS "${CUDAToolkit_LIBRARY_DIR}")
    find_path(REMAT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  if(REMAT_NCCL_LIBRARY AND REMAT_NCCL_INCLUDE_DIR)
    set_target_properties(remat::nccl PROPERTIES INTERFACE_LINK_LIBRARIES "${REMAT_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${REMAT_NCCL_INCLUDE_DIR}" INTERFACE_COMPILE_DEFINITIONS "REMAT_HAS_NCCL=1")
    if(NOT remat_FIND_QUIETLY)
      message(STATUS "remat: NCCL for remat::dist_cuda (${REMAT_NCCL_LIBRARY})")
    endif()
  elseif(NOT remat_FIND_QUIETLY)
    message(STATUS "remat: no NCCL; remat::dist_cuda serves host models only")
  endif()
endif()
