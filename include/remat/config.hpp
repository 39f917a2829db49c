// remat's configuration: version, the host/device function macro, and the top namespace.
// Embedding code may rename the namespace by defining REMAT_NAMESPACE before any remat header.
#pragma once

// The major version: raised when a change breaks code written for an earlier one (semantic
// versioning; CHANGELOG.md lists the changes).
#define REMAT_VERSION_MAJOR 0
// The minor version: raised when something is added that breaks nothing.
#define REMAT_VERSION_MINOR 1
// The patch version: raised for fixes alone.
#define REMAT_VERSION_PATCH 0
// The version as "major.minor.patch", what the package config and remat.pc say.
#define REMAT_VERSION_STRING "0.1.0"

#ifndef REMAT_NAMESPACE
#define REMAT_NAMESPACE remat
#endif

#if defined(__CUDACC__)
// 1 when nvcc compiles this translation unit (the cuda device tag's kernels are available), else 0.
#define REMAT_HAS_CUDA 1
#else
// 1 when nvcc compiles this translation unit (the cuda device tag's kernels are available), else 0.
#define REMAT_HAS_CUDA 0
#endif

// Marks a function that kernels call on either device (a point-wise operation, a conversion, a
// row's sum): forced inline wherever called, on the host as on the GPU. On the host a function
// left out of line is compiled for the baseline, not for the AVX2/AVX-512 version of the loop
// that calls it (REMAT_HOST_CLONES), and called per element, which keeps that loop scalar (GCC's
// heuristics left remat's erf out of line in some programs' GELU passes, found 2026-11-29;
// scripts/check_clones.py finds such calls in a build).
#if defined(__CUDACC__)
#define REMAT_HOST_DEVICE __forceinline__ __host__ __device__
#elif defined(__GNUC__)
#define REMAT_HOST_DEVICE inline __attribute__((always_inline))
#else
#define REMAT_HOST_DEVICE inline
#endif

// A lambda that kernels run on either device: `[=] REMAT_LAMBDA(std::size_t i) { ... }` (nvcc
// needs --extended-lambda, which remat::remat's CUDA compile options carry).
#if defined(__CUDACC__)
#define REMAT_LAMBDA __host__ __device__
#elif defined(__GNUC__) && !defined(__clang__)
// (inlined into the AVX2/AVX-512 version of the loop that runs it: see REMAT_HOST_DEVICE)
#define REMAT_LAMBDA __attribute__((always_inline))
#else
#define REMAT_LAMBDA
#endif

// A lambda that only the host runs, in a loop of REMAT_HOST_CLONES (a row's work between the
// products of attention's tiles): inlined into each version of the loop, as REMAT_LAMBDA's.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define REMAT_HOST_LAMBDA __attribute__((always_inline))
#else
#define REMAT_HOST_LAMBDA
#endif

// A host loop compiled also for AVX2 and AVX-512 (x86-64-v3, v4), the version run chosen when the
// program starts: the point-wise passes use the widest vectors the processor has whatever the
// compiler flags. Every version does the same IEEE operations per element (remat compiles without
// FMA contraction), so all give the same bits. GCC on x86-64 ELF only (the host side of an nvcc
// source too); define REMAT_NO_CLONES to turn it off.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__) && defined(__ELF__) && \
    !defined(REMAT_NO_CLONES)
#define REMAT_HOST_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define REMAT_HOST_CLONES
#endif

#if defined(__CUDA_ARCH__)
// 1 in nvcc's pass that compiles for the GPU (inside a kernel's body), 0 on the host.
#define REMAT_DEVICE_CODE 1
#else
// 1 in nvcc's pass that compiles for the GPU (inside a kernel's body), 0 on the host.
#define REMAT_DEVICE_CODE 0
#endif

#include <cstddef>
#include <cstdint>

namespace REMAT_NAMESPACE {

// A version of remat, as numbers (semantic versioning).
struct version_info {
  int major;  // raised by a change that breaks code written for an earlier version
  int minor;  // raised by an addition that breaks nothing
  int patch;  // raised by fixes alone
};
// The version of the headers compiled in (REMAT_VERSION_MAJOR, _MINOR, _PATCH).
inline constexpr version_info version{REMAT_VERSION_MAJOR, REMAT_VERSION_MINOR, REMAT_VERSION_PATCH};

// Signed sizes at the API boundary so that a negative size is reported, not wrapped around.
using index_t = std::int64_t;

}  // namespace REMAT_NAMESPACE
