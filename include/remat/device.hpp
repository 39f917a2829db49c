// Device tags. A tensor, an allocator and every kernel are parameterised by one of these; the
// same model type runs on either.
#pragma once

#include "config.hpp"

#include <type_traits>

namespace REMAT_NAMESPACE {

// The CPU: Thrust's OpenMP system (serial CPP system without OpenMP) and a CBLAS.
struct host {
  // The tag's name in messages and benchmark lines.
  static constexpr char const* name = "host";
};

// An NVIDIA GPU: Thrust's CUDA system, CUB, cuBLASLt. Compiled by nvcc only.
struct cuda {
  // The tag's name in messages and benchmark lines.
  static constexpr char const* name = "cuda";
};

// Whether D is one of remat's device tags (host or cuda): what a tensor's or kernel's device
// parameter must be.
template <class D>
inline constexpr bool is_device_v = std::is_same_v<D, host> || std::is_same_v<D, cuda>;

}  // namespace REMAT_NAMESPACE
