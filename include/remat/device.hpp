// Device tags. A tensor, an allocator and every kernel are parameterised by one of these; the
// same model type runs on either.
#pragma once

#include "config.hpp"

#include <type_traits>

namespace REMAT_NAMESPACE {

// The CPU: Thrust's OpenMP system (serial CPP system without OpenMP) and a CBLAS.
struct host {
  static constexpr char const* name = "host";
};

// An NVIDIA GPU: Thrust's CUDA system, CUB, cuBLASLt. Compiled by nvcc only.
struct cuda {
  static constexpr char const* name = "cuda";
};

template <class D>
inline constexpr bool is_device_v = std::is_same_v<D, host> || std::is_same_v<D, cuda>;

}  // namespace REMAT_NAMESPACE
